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

Imports: concurrent, math, numba, numpy, .cpu_blas, .cpu_numba, .formulas, .numba_math,
.register, ..autograd.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import prange

from ..autograd import Op
from . import cpu_blas, register
from .cpu_numba import PARALLEL_MIN, kernel_threads, numpy_array, threads_for
from .formulas import FM, probs_again, softmax_grad_in_place, softmax_in_place
from .numba_math import jit, rdot

F32 = np.float32
STRIP_BYTES = 4 << 20  # scores of one strip, all heads: a few MiB, reused by malloc


# One row's work (formulas.py's softmax, on the scores times the scale), then two drivers
# per op: parallel over rows (one call for all heads), and serial without the GIL (one call
# per thread when threads split the heads, see by_heads).


@jit(fastmath=FM)
def _row_probs(row, scale, lim):
    """row (scores) -> probabilities in place, keys >= lim masked; returns the logsumexp of
    row·scale (-inf for a row that sees no key: it becomes zeros)."""
    for j in range(lim):
        row[j] *= scale
    return softmax_in_place(row, lim)


@jit(fastmath=FM)
def _row_probs_again(row, scale, lim, lse):
    probs_again(row, scale, lim, lse)


@jit(fastmath=FM)
def _row_dscores(p, dp, d, scale):
    """dp <- p·(dp - d)·scale in place (d = rowsum(g·o) of this query): softmax's backward."""
    softmax_grad_in_place(dp, p, d, scale)


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


def _keys(i1: int, S: int, off: int, causal: bool) -> int:
    """Keys a strip ending at query i1 may see (under the causal mask, up to its last query)."""
    return min(S, i1 + off) if causal else S


def _t(a):
    return a.swapaxes(-1, -2)


def strip_forward(q, k, v, o, lse, kept, i0, i1, scale, off, causal, serial) -> None:
    """One query strip [i0, i1) of every head of q (..., L, E), k (..., S, E), v (..., S, Ev):
    o[..., i0:i1, :] = softmax(q·kᵀ·scale, masked)·v and lse (heads, L)[:, i0:i1] <- each
    query's logsumexp. ``kept``: where the probabilities are kept (one strip: (..., L, S)),
    else None. Any strides (the fused block passes head views of its qkv projection)."""
    r, n = i1 - i0, _keys(i1, k.shape[-2], off, causal)
    if n <= 0:
        o[..., i0:i1, :] = 0
        lse[:, i0:i1] = -np.inf
        return
    p = np.matmul(q[..., i0:i1, :], _t(k[..., :n, :]), out=kept)  # (..., r, n)
    PROBS[serial](p.reshape(-1, r, n), scale, i0, off, causal, lse[:, i0:i1])
    np.matmul(p, v[..., :n, :], out=o[..., i0:i1, :])


def strip_backward(q, k, v, g, gq, gk, gv, d, lse, kept, i0, i1, scale, off, causal, serial):
    """The gradients of strip_forward's strip: gq[..., i0:i1, :] = dS·k, gk += dSᵀ·q,
    gv += Pᵀ·g, with P recomputed from lse (or ``kept``) and dS = P·(g·vᵀ - D)·scale,
    D = d (heads, L)[:, i0:i1] = rowsum(g·o); where d is None (the probabilities kept, the
    output not), D = rowsum(P·(g·vᵀ)), the same number."""
    r, n = i1 - i0, _keys(i1, k.shape[-2], off, causal)
    if n <= 0:
        gq[..., i0:i1, :] = 0
        return
    qs, gs, ks, vs = q[..., i0:i1, :], g[..., i0:i1, :], k[..., :n, :], v[..., :n, :]
    if kept is not None:
        p = kept
    else:
        p = np.matmul(qs, _t(ks))
        PROBS_AGAIN[serial](p.reshape(-1, r, n), scale, i0, off, causal, lse[:, i0:i1])
    gv[..., :n, :] += np.matmul(_t(p), gs)
    dp = np.matmul(gs, _t(vs))
    p3, dp3 = p.reshape(-1, r, n), dp.reshape(-1, r, n)
    D = np.einsum("hij,hij->hi", p3, dp3) if d is None else d[:, i0:i1]
    DSCORES[serial](p3, dp3, D, scale)
    np.matmul(dp, ks, out=gq[..., i0:i1, :])
    gk[..., :n, :] += np.matmul(_t(dp), qs)


# ----------------------------------------------------------------------------- threads
# THREADS_OVER = "heads": the (batch, head) pairs are split over numba's thread count of
# Python threads, each running the serial drivers, with OpenBLAS held at one thread: one
# pool, nothing spinning against it. "rows": one call over all heads, OpenBLAS and numba's
# pool take turns on every strip (their idle threads spin while the other works). Where
# OpenBLAS's count cannot be set (cpu_blas.blas_threads() is None) "heads" falls back to
# "rows", as do sizes below PARALLEL_MIN. "heads" holds OpenBLAS at one thread on one
# head-thread too: OpenBLAS's AVX2 kernels give a product other bits on another count
# (cpu_blas.bits_follow_threads), and the kernels' count must not change what is computed.
THREADS_OVER = "heads"
_pool: ThreadPoolExecutor | None = None


def by_heads(body, BH: int, work: int) -> None:
    """body(h0, h1, serial) over heads [0, BH): on threads (serial=1) or in one call (0);
    ``work`` (scores computed) below PARALLEL_MIN: one call on one thread."""
    global _pool
    if THREADS_OVER != "heads" or work < PARALLEL_MIN or cpu_blas.blas_threads() is None:
        with threads_for(work):  # (whether this runs depends on the sizes alone)
            body(0, BH, 0)
        return
    n = min(numba.get_num_threads(), kernel_threads(), BH)
    with cpu_blas.held(1):
        if n <= 1:
            with threads_for(work):
                body(0, BH, 0)
            return
        if _pool is None or _pool._max_workers < n - 1:
            _pool = ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="tg-attention")
        bounds = [(BH * i // n, BH * (i + 1) // n) for i in range(n)]
        futures = [_pool.submit(body, h0, h1, 1) for h0, h1 in bounds[1:]]
        try:
            body(*bounds[0], 1)
        finally:  # (OpenBLAS's count back only once every thread is done)
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


@register(
    "attention",
    "cpu",
    name="cpu.numba.flash_attention",
    priority=20,
    takes="float32 q, k, v (any strides), S > Ev, no mask, no dropout",
    when=_attn_when,
)
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
            hk = None if kept is None else kept[h0:h1]  # (one strip: all keys)
            for i0, i1 in strips(BH, L, S):
                strip_forward(
                    *(q3[h0:h1], k3[h0:h1], v3[h0:h1], o[h0:h1], lse[h0:h1], hk),
                    *(i0, i1, sc, off, causal, serial),
                )

        by_heads(heads, BH, BH * L * S)
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
        d = None  # rowsum(g·o) per query; None: from the kept probabilities, strip by strip
        if kept is None:
            d = np.empty((BH, L), F32)
            with threads_for(g3.size):
                _rowdot(g3, o.reshape(BH, L, Ev), d)
        gq = np.empty_like(q3)
        gk, gv = np.zeros_like(k3), np.zeros_like(v3)

        def heads(h0, h1, serial):
            hk, hd = (None if a is None else a[h0:h1] for a in (kept, d))
            for i0, i1 in strips(BH, L, S):  # (as in forward: the same on any thread count)
                strip_backward(
                    *(q3[h0:h1], k3[h0:h1], v3[h0:h1], g3[h0:h1]),
                    *(gq[h0:h1], gk[h0:h1], gv[h0:h1], hd, None if lse is None else lse[h0:h1]),
                    *(hk, i0, i1, sc, off, causal, serial),
                )

        by_heads(heads, BH, BH * L * S)
        return gq.reshape(q.shape), gk.reshape(k.shape), gv.reshape(v.shape), None
