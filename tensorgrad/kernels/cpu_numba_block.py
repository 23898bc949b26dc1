"""The compiled passes of the fused GPT-2 block (``cpu_gpt2_block``): one pass over the rows
for each of LayerNorm (optionally after the residual add and a bias), bias + GELU (tanh or
exact: the scalar forms of formulas.py, inlined), and their backwards with the bias / LayerNorm
parameter gradients summed on the way.

All take (N, C) float32 C-contiguous arrays (N = B·T rows). Column sums (bias and
LayerNorm-parameter gradients) go into ``parts`` (P, C) partial sums, one per block of
rows, summed by the caller: a fixed P, so the sums are the same on any thread count.

Imports: numba, numpy, .formulas, .numba_math.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .formulas import (
    FM,
    gelu_erf,
    gelu_erf_grad,
    gelu_tanh,
    gelu_tanh_grad,
    ln_row,
    ln_row_grad,
    max_shift,
    normalize,
    softmax_grad_in_place,
)
from .numba_math import exp32_in_place, jit, rdot

F32 = np.float32


@jit(parallel=True, fastmath=FM)
def ln_fwd(x, w, b, eps, y, mean, rstd):
    """y = LayerNorm(x) per row; keeps each row's mean and 1/std for backward."""
    for i in prange(x.shape[0]):
        mean[i], rstd[i] = ln_row(x[i], w, b, eps, y[i])


@jit(parallel=True, fastmath=FM)
def residual_ln_fwd(x, s, bias, w, b, eps, y, mean, rstd):
    """s += x + bias in place (s, a sublayer's output, becomes the residual stream after it),
    y = LayerNorm(s). (In place through one array: an out that may alias an input keeps the
    loop scalar, LLVM's overlap check failing at run time.)"""
    n, c = x.shape
    for i in prange(n):
        si, xi = s[i], x[i]
        for j in range(c):
            si[j] += xi[j] + bias[j]
        mean[i], rstd[i] = ln_row(si, w, b, eps, y[i])


@jit(parallel=True, fastmath=FM)
def residual_bias_add(out, x, bias):
    """out += x + bias (the block's output: residual stream plus the MLP's projection)."""
    n, c = out.shape
    for i in prange(n):
        for j in range(c):
            out[i, j] += x[i, j] + bias[j]


@jit(parallel=True, fastmath=FM)
def bias_gelu_fwd(f, bias, out, erf):
    """f += bias in place (f then holds GELU's input), out = GELU(f): the exact form where
    ``erf``, else the tanh form as x·σ(2u) (formulas.gelu_erf, gelu_tanh)."""
    n, c = f.shape
    for i in prange(n):
        fi, oi = f[i], out[i]
        if erf:  # (per row, outside the loops: each vectorises on its own)
            for j in range(c):
                v = fi[j] + bias[j]
                fi[j] = v
                oi[j] = gelu_erf(v)
        else:
            for j in range(c):
                v = fi[j] + bias[j]
                fi[j] = v
                oi[j] = gelu_tanh(v)


@jit(parallel=True, fastmath=FM)
def gelu_bwd_bias(f, d, a, parts, erf):
    """d <- d·GELU'(f) in place; a = GELU(f) again, as bias_gelu_fwd computed it
    (recomputed here, where the derivative needs the same exp, rather than kept from the
    forward: 4·C floats per row less held by every block until its backward); parts[p] +=
    the column sums of d (the bias gradient). ``erf``: the exact form, else the tanh one."""
    n, c = f.shape
    P = parts.shape[0]
    for p in prange(P):
        acc = parts[p]
        for i in range(p * n // P, (p + 1) * n // P):
            fi, di, ai = f[i], d[i], a[i]
            if erf:
                for j in range(c):
                    y, dy = gelu_erf_grad(fi[j])
                    ai[j] = y
                    v = di[j] * dy
                    di[j] = v
                    acc[j] += v
            else:
                for j in range(c):
                    y, dy = gelu_tanh_grad(fi[j])
                    ai[j] = y
                    v = di[j] * dy
                    di[j] = v
                    acc[j] += v


@jit(parallel=True, fastmath=FM)
def ln_bwd_residual(dy, x, w, mean, rstd, dx, gw_parts, gb_parts):
    """dx += ∂LayerNorm(x)/∂x · dy per row (dx holds the residual stream's gradient on entry:
    in place through one array, as residual_ln_fwd); gw_parts / gb_parts[p] += Σ dy·x̂ and
    Σ dy over block p's rows. (With a separate residual input that may alias dx the loop
    ran scalar: 24.6 against 10.0 µs on gpt-nano's rows.)"""
    n = x.shape[0]
    P = gw_parts.shape[0]
    for p in prange(P):
        for i in range(p * n // P, (p + 1) * n // P):
            ln_row_grad(dy[i], x[i], w, mean[i], rstd[i], dx[i], gw_parts[p], gb_parts[p], True)


# ----------------------------------------------------------------------------- short attention
# Causal attention head by head, for sequences too short for the query strips' GEMMs
# (cpu_gpt2_block.SHORT_T): there NumPy's batched matmul makes one BLAS call per (batch,
# head) matrix of a few rows, and its call costs more than the matrix. Each head's q, k, v
# are row slices of the (N, 3C) projection (k at column C + h·hs, v at 2C + h·hs), so every
# inner loop runs over hs contiguous floats and vectorises (a 2-D view per head would not:
# numba types it 'A' and leaves its loops scalar). The forward keeps each head's (T, T)
# probabilities (T <= 8: at most 64 floats a head, less than its q, k, v), so the backward
# neither recomputes scores nor exponentiates; and it exponentiates a whole block of heads'
# scores in one flat loop, masked entries at -inf, which vectorises where a row of a few
# keys would run exp32 one score at a time. gpt-nano (192 heads of 16, T = 6), one thread,
# family 26 model 2 (Zen 5), µs: forward 27 against 47 row by row, backward 47 against 95.

SHORT_HEAD_BLOCKS = 16  # blocks of heads in the forward (each exponentiated in one loop)


@jit(parallel=True, fastmath=FM)
def short_attention_fwd(qkv, y, probs, T, nh, hs, scale):
    """y (N, C) = causal softmax(q·kᵀ·scale)·v per head of qkv (N, 3C); probs (B·nh, T·T)
    <- each head's probabilities, row i's keys j > i zero."""
    C = nh * hs
    nbh = probs.shape[0]
    nblocks = min(nbh, SHORT_HEAD_BLOCKS)
    for c in prange(nblocks):
        b0, b1 = c * nbh // nblocks, (c + 1) * nbh // nblocks
        s = probs[b0:b1].reshape(-1)
        for bh in range(b0, b1):  # scores less their row's max; -inf above the diagonal
            h, r0, base = bh % nh, (bh // nh) * T, (bh - b0) * T * T
            qo, ko = h * hs, C + h * hs
            for i in range(T):
                qi, row = qkv[r0 + i, qo : qo + hs], s[base + i * T : base + (i + 1) * T]
                for j in range(i + 1):
                    row[j] = rdot(qi, qkv[r0 + j, ko : ko + hs]) * scale
                max_shift(row, i + 1)
                for j in range(i + 1, T):
                    row[j] = -np.inf
        exp32_in_place(s)  # (softmax's exp, over the whole block: see above)
        for bh in range(b0, b1):  # normalise each row, then y_i = Σ_j p_ij·v_j
            h, r0, base = bh % nh, (bh // nh) * T, (bh - b0) * T * T
            qo, vo = h * hs, 2 * C + h * hs
            for i in range(T):
                row = s[base + i * T : base + i * T + i + 1]
                normalize(row, i + 1)
                yi, v0 = y[r0 + i, qo : qo + hs], qkv[r0, vo : vo + hs]
                for d in range(hs):
                    yi[d] = row[0] * v0[d]
                for j in range(1, i + 1):
                    pj, vj = row[j], qkv[r0 + j, vo : vo + hs]
                    for d in range(hs):
                        yi[d] += pj * vj[d]


@jit(parallel=True, fastmath=FM)
def short_attention_bwd(qkv, y, g, probs, T, nh, hs, scale, dqkv):
    """dqkv (N, 3C, zeros on entry) <- the gradients of q, k, v given g = ∂y (N, C) and the
    forward's probabilities: gv_j += p_ij·g_i, ds_ij = p_ij·(g_i·v_j - g_i·y_i)·scale,
    gq_i += ds_ij·k_j, gk_j += ds_ij·q_i."""
    C = nh * hs
    for bh in prange(probs.shape[0]):
        h, r0, p = bh % nh, (bh // nh) * T, probs[bh]
        qo, ko, vo = h * hs, C + h * hs, 2 * C + h * hs
        ds = np.empty(T, probs.dtype)
        for i in range(T):
            r = r0 + i
            gi, qi, gq = g[r, qo : qo + hs], qkv[r, qo : qo + hs], dqkv[r, qo : qo + hs]
            pi = p[i * T : i * T + i + 1]
            for j in range(i + 1):  # ∂p_ij = g_i·v_j, then softmax's backward (scaled)
                ds[j] = rdot(gi, qkv[r0 + j, vo : vo + hs])
            softmax_grad_in_place(ds[: i + 1], pi, rdot(gi, y[r, qo : qo + hs]), scale)
            for j in range(i + 1):
                pij, dsj = pi[j], ds[j]
                kj = qkv[r0 + j, ko : ko + hs]
                gkj, gvj = dqkv[r0 + j, ko : ko + hs], dqkv[r0 + j, vo : vo + hs]
                for d in range(hs):
                    gvj[d] += pij * gi[d]
                    gq[d] += dsj * kj[d]
                    gkj[d] += dsj * qi[d]
