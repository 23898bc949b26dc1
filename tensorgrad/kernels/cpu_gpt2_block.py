"""The fused GPT-2 block on the CPU, forward and backward, as one graph node (llm.c's layout).

No model calls it: ``tensorgrad.compile`` emits it where the traced graph of a forward holds
the pre-LayerNorm GPT-2 block's ops, as ``gpt/model.py``'s ``Block`` computes them
(``compiler/patterns.py``: LayerNorm, the qkv projection, heads, causal attention, the
projection and residual, LayerNorm, the MLP with the tanh or the exact GELU, the residual),
for float32 NumPy inputs with every parameter present. Per block:

    forward:  h1 = LN1(x)                        numba, one pass (keeps mean, 1/std)
              qkv = h1·Waᵀ + ba                  BLAS GEMM, bias added in place
              y = attention(q, k, v)             q, k, v read as strided views of qkv
              x1 = x + y·Wpᵀ + bp; h2 = LN2(x1)  GEMM, then one numba pass
              f = h2·Wfᵀ + bf; a = GELU(f)       GEMM, then one numba pass (bias into f)
              out = x1 + a·Wmᵀ + bm              GEMM, then one numba pass
    backward: the same in reverse, each bias / LayerNorm-parameter gradient summed inside
              the numba pass that already reads its rows, residual gradients added there too.

The attention is the flash kernel's own strips (``cpu_numba_attention.strip_forward`` and
``strip_backward``: the probabilities kept by its rule or recomputed in backward from the
logsumexp; up to SHORT_T positions, numba loops per head instead, whose strips would be
GEMMs of a few rows, keeping the probabilities), on (B, nh, T, hs) views of the (B, T, 3C)
projection and of the (B, T, C) output: no head copies, the GEMMs read them with a leading
dimension. Its (batch, head) pairs are split over threads as the attention op's are
(``by_heads``: each thread's strips on one OpenBLAS thread; at baby's shape, B 8 T 256 6
heads of 64 on a Zen 3 VM, forward + backward per layer 42-55 ms before, 33 after). Its
LayerNorm, GELU and softmax are formulas.py's, as every CPU kernel's. Saves the inputs and,
as its own state, h1, qkv, y, x1, h2, f and the row statistics, as llm.c does, but not
GELU(f): the backward's GELU pass computes it again beside its derivative (the same exp), so
each block holds 4·C floats per row less until its backward (151 MB at gpt2-124M, T = 1024).
Under ``create_graph`` the compiled graph differentiates the traced ops instead
(``compiler/replay.py``), so this backward is only ever first order.
tests/test_kernels_block.py checks it against the ops one by one.

Imports: math, numpy, .cpu_numba, .cpu_numba_attention, .cpu_numba_block, .register,
..autograd, ..tensor.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import Op
from ..tensor import Tensor
from . import register
from .cpu_numba import numpy_array, threads_for
from .cpu_numba_attention import by_heads, keeps_probs, strip_backward, strip_forward, strips
from .cpu_numba_block import (
    bias_gelu_fwd,
    gelu_bwd_bias,
    ln_bwd_residual,
    ln_fwd,
    residual_bias_add,
    residual_ln_fwd,
    short_attention_bwd,
    short_attention_fwd,
)

F32 = np.float32
# Sequences up to SHORT_T run their attention head by head in numba (cpu_numba_block), longer
# ones in query strips of batched GEMMs. One numba thread (as the block runs below
# PARALLEL_MIN elements), family 25 model 17 (Zen 4), forward + backward per layer, µs: T = 6
# (gpt-nano, 192 heads of 16): 186 against 287; T = 8: 220 / 268; T = 12: 275 / 263; T = 16
# (128 heads of 16): 594 / 467.
SHORT_T = 8
PARTS = 16  # row blocks of the column sums (fixed: the same sums on any thread count)
# the inputs after x, in order: the block's parameters under gpt.model.Block's names
GPT2_BLOCK_PARAMS = (
    *("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias"),
    *("attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias"),
    *("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"),
)


def _when(x, *params, n_head, eps=1e-5, approximate="tanh"):
    xa = numpy_array(x)
    if xa is None or xa.dtype != F32 or xa.ndim != 3 or not xa.flags.c_contiguous:
        return False
    B, T, C = xa.shape
    if xa.size == 0 or approximate not in ("tanh", "none") or C % n_head:
        return False
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,)]
    shapes += [(4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    for p, shape in zip(params, shapes):
        pa = numpy_array(p)
        if pa is None or pa.dtype != F32 or pa.shape != shape or not pa.flags.c_contiguous:
            return False
    return len(params) == len(GPT2_BLOCK_PARAMS)


def _heads(a, B, T, nh, hs, parts: int):
    """(B, T, parts·C) rows -> ``parts`` (B, nh, T, hs) views (no copies)."""
    a5 = a.reshape(B, T, parts, nh, hs)
    return [a5[:, :, i].transpose(0, 2, 1, 3) for i in range(parts)]


def attention_stats(shape):
    """What the attention keeps for backward: the (B·nh, T·T) probabilities up to SHORT_T
    positions or where the flash kernel would keep them (``keeps_probs``: one strip, T <= 2
    × head size, as at char-small), else (B·nh, T) logsumexps, from which the backward
    recomputes them strip by strip."""
    B, T, nh, hs = shape
    keep = T <= SHORT_T or keeps_probs(B * nh, T, T, hs)
    return np.empty((B * nh, T * T if keep else T), F32)


def _pairs(p0: int, p1: int, nh: int):
    """The (batch, head) pairs [p0, p1) of nh heads a batch as indexes of (B, nh, ...) views,
    whole batches in one: ``(index, first pair, last pair + 1)``."""
    while p0 < p1:
        b, h = divmod(p0, nh)
        if h == 0 and p1 - p0 >= nh:
            b1 = b + (p1 - p0) // nh
            yield np.s_[b:b1], p0, b1 * nh
            p0 = b1 * nh
        else:
            h1 = min(nh, h + p1 - p0)
            yield np.s_[b, h:h1], p0, p0 + h1 - h
            p0 += h1 - h


def attention_fwd(qkv, y, stats, shape, scale):
    """y (B·T, C) = causal softmax(q·kᵀ·scale)·v with q, k, v read from qkv (B·T, 3C); stats
    (:func:`attention_stats`) <- the probabilities or the logsumexp per query."""
    B, T, nh, hs = shape
    if T <= SHORT_T:
        short_attention_fwd(qkv, y, stats, T, nh, hs, scale)
        return
    q, k, v = _heads(qkv, B, T, nh, hs, 3)
    (o,) = _heads(y, B, T, nh, hs, 1)
    BH = B * nh
    kept = stats.reshape(B, nh, T, T) if stats.shape[1] == T * T else None  # (one strip)
    lse = stats if kept is None else np.empty((BH, T), F32)

    def part(p0, p1, serial):  # (the strips of all BH heads: the same on any thread count)
        for at, r0, r1 in _pairs(p0, p1, nh):
            hk = None if kept is None else kept[at]
            for i0, i1 in strips(BH, T, T):
                strip_forward(
                    q[at], k[at], v[at], o[at], lse[r0:r1], hk, i0, i1, scale, 0, True, serial
                )

    by_heads(part, BH, BH * T * T)


def attention_bwd(qkv, y, dy, stats, shape, scale, dqkv):
    """dqkv (B·T, 3C, zeros on entry) <- the gradients of q, k, v given dy (B·T, C)."""
    B, T, nh, hs = shape
    if T <= SHORT_T:
        short_attention_bwd(qkv, y, dy, stats, T, nh, hs, scale, dqkv)
        return
    q, k, v = _heads(qkv, B, T, nh, hs, 3)
    gq, gk, gv = _heads(dqkv, B, T, nh, hs, 3)
    (g,) = _heads(dy, B, T, nh, hs, 1)
    BH = B * nh
    kept = stats.reshape(B, nh, T, T) if stats.shape[1] == T * T else None
    d = None  # rowsum(g·o) per query (None: from the kept probabilities)
    if kept is None:
        (o,) = _heads(y, B, T, nh, hs, 1)
        d = np.einsum("bhtd,bhtd->bht", g, o).reshape(BH, T)

    def part(p0, p1, serial):
        for at, r0, r1 in _pairs(p0, p1, nh):
            hk = None if kept is None else kept[at]
            hd = None if d is None else d[r0:r1]  # (d, stats: rows per (batch, head) pair)
            for i0, i1 in strips(BH, T, T):
                strip_backward(
                    *(q[at], k[at], v[at], g[at], gq[at], gk[at], gv[at], hd, stats[r0:r1], hk),
                    *(i0, i1, scale, 0, True, serial),
                )

    by_heads(part, BH, BH * T * T)


def _sums(parts):
    return parts.sum(axis=0)


@register(
    "gpt2_block",
    "cpu",
    name="cpu.numba.gpt2_block",
    priority=20,
    takes="float32 C-contiguous (B, T, C) x and the block's 12 parameters",
    when=_when,
)
class NumbaGPT2Block(Op):
    """The whole GPT-2 block for float32 on the CPU: inputs x and GPT2_BLOCK_PARAMS; the
    MLP's GELU is the tanh form (``approximate="tanh"``) or the exact one (``"none"``)."""

    def forward(self, x, *params, n_head, eps=1e-5, approximate="tanh"):
        with threads_for(x.size):
            return self.forward_block(x, *params, n_head=n_head, eps=eps, approximate=approximate)

    def forward_block(self, x, *params, n_head, eps, approximate):
        l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, mw, mb = params
        B, T, C = x.shape
        N, nh, e = B * T, n_head, F32(eps)
        shape, scale = (B, T, nh, C // nh), F32(1 / math.sqrt(C // nh))
        x2 = x.reshape(N, C)
        h1, m1, r1 = np.empty((N, C), F32), np.empty(N, F32), np.empty(N, F32)
        ln_fwd(x2, l1w, l1b, e, h1, m1, r1)
        qkv = np.matmul(h1, aw.T)  # (N, 3C)
        qkv += ab
        y, lse = np.empty((N, C), F32), attention_stats(shape)
        attention_fwd(qkv, y, lse, shape, scale)
        x1 = np.matmul(y, pw.T)  # (N, C): the projection, then the residual stream in place
        h2, m2, r2 = np.empty((N, C), F32), np.empty(N, F32), np.empty(N, F32)
        residual_ln_fwd(x2, x1, pb, l2w, l2b, e, h2, m2, r2)
        f = np.matmul(h2, fw.T)  # (N, 4C)
        a = np.empty_like(f)
        bias_gelu_fwd(f, fb, a, approximate == "none")
        out = np.matmul(a, mw.T)  # (N, C)
        residual_bias_add(out, x1, mb)
        self.kw = {"n_head": n_head, "eps": eps, "approximate": approximate}
        self.shape, self.scale = shape, scale
        self.save(x, *params)
        self.acts = (h1, m1, r1, qkv, y, lse, x1, h2, m2, r2, f)  # a: recomputed in backward
        return out.reshape(B, T, C)

    def backward(self, g):
        if isinstance(g, Tensor):
            raise RuntimeError(
                "the fused GPT-2 block has a first-order backward only; a compiled graph "
                "differentiates its traced ops under create_graph"
            )
        with threads_for(g.size):
            return self.backward_block(g)

    def backward_block(self, g):
        x, l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, mw, mb = self.saved
        h1, m1, r1, qkv, y, lse, x1, h2, m2, r2, f = self.acts
        erf = self.kw["approximate"] == "none"
        N, C = h1.shape
        g2 = np.ascontiguousarray(g).reshape(N, C)
        P = min(N, PARTS)
        # MLP: out = x1 + a·Wmᵀ + bm, a = GELU(f)
        df = np.matmul(g2, mw)  # (N, 4C): ∂a, then ∂f in place
        a, gfb = np.empty_like(f), np.zeros((P, 4 * C), F32)
        gelu_bwd_bias(f, df, a, gfb, erf)  # (and a, recomputed)
        gmb, gmw = g2.sum(axis=0), np.matmul(g2.T, a)
        del a
        gfw, dh2 = np.matmul(df.T, h2), np.matmul(df, fw)
        del df
        dx1, gl2w, gl2b = g2.copy(), np.zeros((P, C), F32), np.zeros((P, C), F32)
        ln_bwd_residual(dh2, x1, l2w, m2, r2, dx1, gl2w, gl2b)
        # attention: x1 = x + y·Wpᵀ + bp
        gpb, gpw, dy = dx1.sum(axis=0), np.matmul(dx1.T, y), np.matmul(dx1, pw)
        dqkv = np.zeros((N, 3 * C), F32)
        attention_bwd(qkv, y, dy, lse, self.shape, self.scale, dqkv)
        gab, gaw, dh1 = dqkv.sum(axis=0), np.matmul(dqkv.T, h1), np.matmul(dqkv, aw)
        gl1w, gl1b = np.zeros((P, C), F32), np.zeros((P, C), F32)
        ln_bwd_residual(dh1, x.reshape(N, C), l1w, m1, r1, dx1, gl1w, gl1b)
        return (
            dx1.reshape(x.shape),
            *(_sums(gl1w), _sums(gl1b), gaw, gab, gpw, gpb),
            *(_sums(gl2w), _sums(gl2b), gfw, _sums(gfb), gmw, gmb),
        )
