"""Flash-style causal / full attention on the CPU: query strips, the softmax in numba.

The reference keeps the (..., L, S) probabilities for backward: 576 MiB over gpt2-124M's 12
layers at T=1024. This kernel saves only q, k, v, the output and the logsumexp per query
(O(L) per head) and recomputes the probabilities strip by strip in backward, as
FlashAttention does. A strip is ``bq`` queries against every key they may see (under
``is_causal`` the keys up to the strip's last query: the masked upper triangle is mostly
skipped), for all the (batch, head) pairs of one thread at once, so that its scores stay a
few MiB. As a
strip holds whole rows, its softmax is exact in one pass (no running rescale needed). The
GEMMs are NumPy batched matmuls on the strips (OpenBLAS beats a numba GEMM); the masked
softmax and its backward run in numba. Threads split the (batch, head) pairs (see
THREADS_OVER).

Backward per strip (D = rowsum(g·o), P = e^(s·scale - lse)):
    gv += Pᵀ·g;  dP = g·vᵀ;  dS = P·(dP - D)·scale;  gq = dS·k;  gk += dSᵀ·q

Imports: concurrent, math, numba, numpy, .cpu_numba, .numba_math, .register, ..autograd.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import prange

from ..autograd import Op
from . import register
from .cpu_numba import FM, PARALLEL_MIN, kernel_threads, numpy_array, threads_for
from .numba_math import exp32, jit, rdot, rmax, rsum

F32 = np.float32
STRIP_BYTES = 4 << 20  # scores of one strip, all heads: a few MiB, reused by malloc


# One row's work, then two drivers per op: parallel over rows (one call for all heads), and
# serial without the GIL (one call per thread when threads split the heads, see _by_heads).


@jit(fastmath=FM)
def _row_probs(row, scale, lim):
    """row (scores) -> probabilities in place, keys >= lim masked; returns the logsumexp of
    row·scale (-inf for a row that sees no key: it becomes zeros)."""
    if lim == 0:  # (if/else, no `continue` or early return: see cpu_numba._ce_bwd)
        row[:] = 0
        lse = F32(-np.inf)
    else:
        for j in range(lim):
            row[j] *= scale
        m = rmax(row[:lim])
        for j in range(lim):
            row[j] = exp32(row[j] - m)
        tot = rsum(row[:lim])
        inv = F32(1) / tot
        for j in range(lim):
            row[j] *= inv
        row[lim:] = 0
        lse = m + F32(math.log(tot))
    return lse


@jit(fastmath=FM)
def _row_probs_again(row, scale, lim, lse):
    """row (scores) -> the forward's probabilities e^(row·scale - lse) in place."""
    for j in range(lim):
        row[j] = exp32(row[j] * scale - lse)
    row[lim:] = 0


@jit(fastmath=FM)
def _row_dscores(p, dp, d, scale):
    """dp <- p·(dp - d)·scale in place (d = rowsum(g·o) of this query)."""
    for j in range(dp.size):
        dp[j] = p[j] * (dp[j] - d) * scale


@jit(inline="always")
def _lim(i, i0, off, causal, n):
    """Keys query i0 + i may see: j <= i0 + i + off under the causal mask, else all n."""
    return min(n, max(0, i0 + i + off + 1)) if causal else n


@jit(parallel=True)
def _probs_par(s, scale, i0, off, causal, lse):
    """s (BH, r, n) scores -> probabilities in place; lse (BH, r) the logsumexp per row."""
    BH, r, n = s.shape
    for k in prange(BH * r):
        b, i = k // r, k % r
        lse[b, i] = _row_probs(s[b, i], scale, _lim(i, i0, off, causal, n))


@jit(nogil=True)
def _probs_ser(s, scale, i0, off, causal, lse):
    BH, r, n = s.shape
    for k in range(BH * r):
        b, i = k // r, k % r
        lse[b, i] = _row_probs(s[b, i], scale, _lim(i, i0, off, causal, n))


@jit(parallel=True)
def _probs_again_par(s, scale, i0, off, causal, lse):
    BH, r, n = s.shape
    for k in prange(BH * r):
        b, i = k // r, k % r
        _row_probs_again(s[b, i], scale, _lim(i, i0, off, causal, n), lse[b, i])


@jit(nogil=True)
def _probs_again_ser(s, scale, i0, off, causal, lse):
    BH, r, n = s.shape
    for k in range(BH * r):
        b, i = k // r, k % r
        _row_probs_again(s[b, i], scale, _lim(i, i0, off, causal, n), lse[b, i])


@jit(parallel=True)
def _dscores_par(p, dp, d, scale):
    BH, r, _ = p.shape
    for k in prange(BH * r):
        _row_dscores(p[k // r, k % r], dp[k // r, k % r], d[k // r, k % r], scale)


@jit(nogil=True)
def _dscores_ser(p, dp, d, scale):
    BH, r, _ = p.shape
    for k in range(BH * r):
        _row_dscores(p[k // r, k % r], dp[k // r, k % r], d[k // r, k % r], scale)


@jit(parallel=True, fastmath=FM)
def _rowdot(g, o, d):
    """d (BH, L) = rowsum(g·o)."""
    BH, L, _ = g.shape
    for k in prange(BH * L):
        d[k // L, k % L] = rdot(g[k // L, k % L], o[k // L, k % L])


# (parallel, serial) drivers
PROBS = (_probs_par, _probs_ser)
PROBS_AGAIN = (_probs_again_par, _probs_again_ser)
DSCORES = (_dscores_par, _dscores_ser)


def keeps_probs(BH: int, L: int, S: int, Ev: int) -> bool:
    """Whether the backward reads the forward's probabilities rather than recomputing them:
    where one query strip holds them all (every query sees every key) and they take at most
    twice the output (S <= 2·Ev). Both this kernel and the fused block ask it."""
    return S <= 2 * Ev and strips(BH, L, S) == [(0, L)]


def strips(BH: int, L: int, S: int):
    """Query strips [i0, i1) of at most STRIP_BYTES of scores each: a power of two of 16 to
    256 rows (more rows waste more of the causal triangle, fewer make thin GEMMs)."""
    rows = STRIP_BYTES // max(1, BH * S * 4)
    bq = min(256, max(16, 1 << max(0, rows.bit_length() - 1)))
    return [(i0, min(L, i0 + bq)) for i0 in range(0, L, bq)]


# ----------------------------------------------------------------------------- threads
# THREADS_OVER = "heads": the (batch, head) pairs are split over numba's thread count of
# Python threads, each running single-threaded OpenBLAS and the serial drivers: one pool,
# nothing spinning against it. "rows": one call over all heads, OpenBLAS and numba's
# pool take turns on every strip (their idle threads spin while the other works). Without
# threadpoolctl (to hold OpenBLAS at one thread) "heads" falls back to "rows".
THREADS_OVER = "heads"
_pool: ThreadPoolExecutor | None = None
_blas = None  # threadpoolctl.ThreadpoolController; False without threadpoolctl


def _head_threads(BH: int) -> int:
    global _blas
    n = min(numba.get_num_threads(), kernel_threads(), BH)
    if n <= 1 or THREADS_OVER != "heads":
        return 1
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController()
        except ImportError:
            _blas = False
    return n if _blas else 1


def _by_heads(body, BH: int, work: int) -> None:
    """body(h0, h1, serial) over heads [0, BH): on threads (serial=1) or in one call (0);
    ``work`` (scores computed) below PARALLEL_MIN: one call on one thread."""
    global _pool
    n = _head_threads(BH) if work >= PARALLEL_MIN else 1
    if n == 1:
        with threads_for(work):
            body(0, BH, 0)
        return
    if _pool is None or _pool._max_workers < n - 1:
        _pool = ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="tg-attention")
    bounds = [(BH * i // n, BH * (i + 1) // n) for i in range(n)]
    with _blas.limit(limits=1, user_api="blas"):
        futures = [_pool.submit(body, h0, h1, 1) for h0, h1 in bounds[1:]]
        body(*bounds[0], 1)
        for f in futures:
            f.result()  # re-raises a worker's exception


def _attn_when(q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
    if mask is not None or dropout_p != 0.0:
        return False
    q, k, v = numpy_array(q), numpy_array(k), numpy_array(v)
    # any strides (the model passes head views of the qkv projection): reshape copies if needed
    if any(a is None or a.dtype != np.float32 or a.size == 0 for a in (q, k, v)):
        return False
    # S > Ev: o and lse (L·(Ev + 1) floats) are then smaller than the reference's (L, S) probs
    return (
        q.ndim >= 2
        and q.ndim == k.ndim == v.ndim
        and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
        and k.shape[-1] == q.shape[-1]
        and v.shape[-2] == k.shape[-2]
        and k.shape[-2] > v.shape[-1]
    )


@register("attention", "cpu", name="cpu.numba.flash_attention", when=_attn_when)
class NumbaFlashAttention(Op):
    """softmax(q·kᵀ·scale [causal])·v for float32 q (..., L, E), k (..., S, E) and v
    (..., S, Ev) with S > Ev, without a mask or dropout; saves q, k, v, o and the logsumexp
    per query, or the probabilities where S <= 2·Ev and one strip holds them."""

    def forward(self, q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        lead = q.shape[:-2]
        BH = math.prod(lead)
        q3, k3, v3 = q.reshape(BH, L, E), k.reshape(BH, S, E), v.reshape(BH, S, Ev)
        sc = self.scale = F32(1 / math.sqrt(E) if scale is None else scale)
        causal, off = self.causal, self.off = bool(is_causal), S - L  # bottom-right aligned
        o = np.empty((BH, L, Ev), F32)
        lse = np.empty((BH, L), F32)
        # the probabilities where keeps_probs (the backward then skips q·kᵀ and the softmax
        # again), else the logsumexp, from which it recomputes them
        kept = np.empty((BH, L, S), F32) if keeps_probs(BH, L, S, Ev) else None

        def heads(h0, h1, serial):
            # strips of all BH heads' size, whatever share a thread takes: gk and gv sum over
            # the strips, so the same strips give the same bits on any thread count
            for i0, i1 in strips(BH, L, S):
                n = min(S, i1 + off) if causal else S  # keys this strip may see
                if n <= 0:
                    o[h0:h1, i0:i1] = 0
                    lse[h0:h1, i0:i1] = -np.inf
                    continue
                out = None if kept is None else kept[h0:h1]  # (one strip: n = S)
                p = np.matmul(q3[h0:h1, i0:i1], k3[h0:h1, :n].transpose(0, 2, 1), out=out)
                PROBS[serial](p, sc, i0, off, causal, lse[h0:h1, i0:i1])  # p: (h, r, n)
                np.matmul(p, v3[h0:h1, :n], out=o[h0:h1, i0:i1])

        _by_heads(heads, BH, BH * L * S)
        o = o.reshape(*lead, L, Ev)
        if kept is None:
            self.save(q, k, v, o, lse)
        else:  # (o is not kept: rowsum(g·o) = rowsum(p·(g·vᵀ)), from the backward's g·vᵀ)
            self.save(q, k, v, kept)
        return o

    def backward(self, g):
        if len(self.saved) == 4:  # the forward's probabilities (see forward)
            (q, k, v, kept), o, lse = self.saved, None, None
        else:
            (q, k, v, o, lse), kept = self.saved, None
        L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        BH = math.prod(q.shape[:-2])
        q3, k3, v3 = q.reshape(BH, L, E), k.reshape(BH, S, E), v.reshape(BH, S, Ev)
        g3 = np.ascontiguousarray(g).reshape(BH, L, Ev)
        sc, causal, off = self.scale, self.causal, self.off
        d = np.empty((BH, L), F32)  # rowsum(g·o) per query
        if kept is None:
            with threads_for(g3.size):
                _rowdot(g3, o.reshape(BH, L, Ev), d)
        gq = np.empty_like(q3)
        gk, gv = np.zeros_like(k3), np.zeros_like(v3)

        def heads(h0, h1, serial):
            for i0, i1 in strips(BH, L, S):  # (as in forward: the same on any thread count)
                n = min(S, i1 + off) if causal else S
                if n <= 0:
                    gq[h0:h1, i0:i1] = 0
                    continue
                qs, gs, ks, vs = q3[h0:h1, i0:i1], g3[h0:h1, i0:i1], k3[h0:h1, :n], v3[h0:h1, :n]
                if kept is not None:  # (one strip, every key)
                    p = kept[h0:h1]
                else:
                    p = np.matmul(qs, ks.transpose(0, 2, 1))
                    PROBS_AGAIN[serial](p, sc, i0, off, causal, lse[h0:h1, i0:i1])
                gv[h0:h1, :n] += np.matmul(p.transpose(0, 2, 1), gs)
                dp = np.matmul(gs, vs.transpose(0, 2, 1))
                if kept is not None:
                    np.einsum("hij,hij->hi", p, dp, out=d[h0:h1, i0:i1])
                DSCORES[serial](p, dp, d[h0:h1, i0:i1], sc)
                np.matmul(dp, ks, out=gq[h0:h1, i0:i1])
                gk[h0:h1, :n] += np.matmul(dp.transpose(0, 2, 1), qs)

        _by_heads(heads, BH, BH * L * S)
        return gq.reshape(q.shape), gk.reshape(k.shape), gv.reshape(v.shape), None
