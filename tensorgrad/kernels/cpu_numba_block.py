"""The compiled passes of the fused GPT-2 block (``cpu_gpt2_block``): one pass over the rows
for each of LayerNorm (optionally after the residual add and a bias), bias + GELU, and their
backwards with the bias / LayerNorm parameter gradients summed on the way.

All take (N, C) float32 C-contiguous arrays (N = B·T rows). Column sums (bias and
LayerNorm-parameter gradients) go into ``parts`` (P, C) partial sums, one per block of
rows, summed by the caller: a fixed P, so the sums are the same on any thread count.

Imports: numba, numpy, .cpu_numba, .numba_math, ..ops.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..ops.nn import GELU_C, SQRT_2_OVER_PI
from .cpu_numba import EXP_FM, FM, rdot, rsum
from .numba_math import exp32, jit

F32 = np.float32
K = F32(SQRT_2_OVER_PI)
K3 = F32(3 * GELU_C)
GC = F32(GELU_C)


@jit(fastmath=FM)
def ln_row(xi, w, b, eps, yi):
    """yi = LayerNorm(xi)·w + b for one row; returns (mean, 1/std)."""
    c = xi.size
    mean = rsum(xi) / c
    var = F32(0)
    for j in range(c):  # two passes over a row in L1: no cancellation in E[x²] - E[x]²
        d = xi[j] - mean
        var += d * d
    r = F32(1) / np.sqrt(F32(var / c) + eps)
    for j in range(c):
        yi[j] = (xi[j] - mean) * r * w[j] + b[j]
    return F32(mean), r


@jit(parallel=True, fastmath=FM)
def ln_fwd(x, w, b, eps, y, mean, rstd):
    """y = LayerNorm(x) per row; keeps each row's mean and 1/std for backward."""
    for i in prange(x.shape[0]):
        mean[i], rstd[i] = ln_row(x[i], w, b, eps, y[i])


@jit(parallel=True, fastmath=FM)
def residual_ln_fwd(x, a, bias, w, b, eps, s, y, mean, rstd):
    """s = x + a + bias (the residual stream after a sublayer), y = LayerNorm(s); s may be a."""
    n, c = x.shape
    for i in prange(n):
        si = s[i]
        for j in range(c):
            si[j] = x[i, j] + a[i, j] + bias[j]
        mean[i], rstd[i] = ln_row(si, w, b, eps, y[i])


@jit(parallel=True, fastmath=FM)
def residual_bias_add(out, x, bias):
    """out += x + bias (the block's output: residual stream plus the MLP's projection)."""
    n, c = out.shape
    for i in prange(n):
        for j in range(c):
            out[i, j] += x[i, j] + bias[j]


@jit(parallel=True, fastmath=EXP_FM)
def bias_gelu_fwd(f, bias, out):
    """f += bias in place (f then holds GELU's input), out = GELU_tanh(f) as f·σ(2u)."""
    n, c = f.shape
    for i in prange(n):
        for j in range(c):
            v = f[i, j] + bias[j]
            f[i, j] = v
            u = K * (v + GC * v * v * v)
            out[i, j] = v / (F32(1) + exp32(min(F32(-2) * u, F32(80))))


@jit(parallel=True, fastmath=EXP_FM)
def gelu_bwd_bias(f, d, a, parts):
    """d <- d·GELU_tanh'(f) in place; a = GELU_tanh(f) again, as bias_gelu_fwd computed it
    (recomputed here, where the derivative needs the same exp, rather than kept from the
    forward: 4·C floats per row less held by every block until its backward); parts[p] +=
    the column sums of d (the bias gradient)."""
    n, c = f.shape
    P = parts.shape[0]
    for p in prange(P):
        acc = parts[p]
        for i in range(p * n // P, (p + 1) * n // P):
            for j in range(c):
                x = f[i, j]
                x2 = x * x
                e = exp32(min(F32(-2) * K * (x + GC * x2 * x), F32(80)))
                a[i, j] = x / (F32(1) + e)
                s = F32(1) / (F32(1) + e)
                es = e * s * s  # first: e alone may be 5e34, times x it would overflow
                v = d[i, j] * (s + x * F32(2) * es * K * (F32(1) + K3 * x2))
                d[i, j] = v
                acc[j] += v


@jit(parallel=True, fastmath=FM)
def ln_bwd_residual(dy, x, w, mean, rstd, resid, dx, gw_parts, gb_parts):
    """dx = resid + ∂LayerNorm(x)/∂x · dy per row (resid may be dx: accumulate in place);
    gw_parts / gb_parts[p] += Σ dy·x̂ and Σ dy over block p's rows."""
    n, c = x.shape
    P = gw_parts.shape[0]
    for p in prange(P):
        gwp, gbp = gw_parts[p], gb_parts[p]
        for i in range(p * n // P, (p + 1) * n // P):
            xi, gi, m, r = x[i], dy[i], mean[i], rstd[i]
            s1 = F32(0)  # Σ ĝ, ĝ = dy·w
            s2 = F32(0)  # Σ ĝ·(x - mean)
            for j in range(c):
                gh = gi[j] * w[j]
                s1 += gh
                s2 += gh * (xi[j] - m)
            a = F32(s1 / c)
            k = F32(s2 * r / c)  # mean(ĝ·x̂)
            for j in range(c):
                xh = (xi[j] - m) * r
                dx[i, j] = resid[i, j] + (gi[j] * w[j] - a - xh * k) * r
                gwp[j] += gi[j] * xh
                gbp[j] += gi[j]


# ----------------------------------------------------------------------------- short attention
# Causal attention head by head, for sequences too short for the query strips' GEMMs
# (cpu_gpt2_block.SHORT_T): there NumPy's batched matmul makes one BLAS call per (batch,
# head) matrix of a few rows, and its call costs more than the matrix. Each head's q, k, v
# are row slices of the (N, 3C) projection (k at column C + h·hs, v at 2C + h·hs), so every
# inner loop runs over hs contiguous floats and vectorises (a 2-D view per head would not:
# numba types it 'A' and leaves its loops scalar).


@jit(fastmath=FM)
def _head_scores(qkv, r, qo, r0, ko, hs, n, s, scale):
    """s[j] = q_r · k_(r0 + j) · scale for j < n (q at column qo, k at ko)."""
    qi = qkv[r, qo : qo + hs]
    for j in range(n):
        kj = qkv[r0 + j, ko : ko + hs]
        acc = F32(0)
        for d in range(hs):
            acc += qi[d] * kj[d]
        s[j] = acc * scale


@jit(fastmath=EXP_FM)
def _head_softmax(s, n):
    """s[:n] <- e^(s - max) in place; returns (max, Σ e^(s - max))."""
    m = s[0]
    for j in range(1, n):
        m = max(m, s[j])
    tot = F32(0)
    for j in range(n):
        e = exp32(s[j] - m)
        s[j] = e
        tot += e
    return m, tot


@jit(parallel=True, fastmath=FM)
def short_attention_fwd(qkv, y, lse, T, nh, hs, scale):
    """y (N, C) = causal softmax(q·kᵀ·scale)·v per head of qkv (N, 3C); lse (B·nh, T)."""
    C = nh * hs
    for bh in prange(lse.shape[0]):
        h, r0 = bh % nh, (bh // nh) * T
        qo, ko, vo = h * hs, C + h * hs, 2 * C + h * hs
        s, acc = np.empty(T, F32), np.empty(hs, F32)
        for i in range(T):
            n = i + 1
            _head_scores(qkv, r0 + i, qo, r0, ko, hs, n, s, scale)
            m, tot = _head_softmax(s, n)
            for d in range(hs):
                acc[d] = 0
            for j in range(n):
                pj, vj = s[j], qkv[r0 + j, vo : vo + hs]
                for d in range(hs):
                    acc[d] += pj * vj[d]
            inv, yi = F32(1) / tot, y[r0 + i, qo : qo + hs]
            for d in range(hs):
                yi[d] = acc[d] * inv
            lse[bh, i] = m + F32(np.log(tot))


@jit(fastmath=EXP_FM)  # exp32 inside: no reassoc here (the dot is rdot's)
def _head_bwd_row(qkv, g, dqkv, r, r0, qo, ko, vo, hs, n, s, dq, D, L, scale):
    """One query's share: gv_j += p_j·g, gk_j += ds_j·q, dq = Σ ds_j·k_j over keys j < n,
    p_j = e^(s_j - L) and ds_j = p_j·(g·v_j - D)·scale."""
    qi, gi = qkv[r, qo : qo + hs], g[r, qo : qo + hs]
    for d in range(hs):
        dq[d] = 0
    for j in range(n):
        p = exp32(s[j] - L)
        vj, kj = qkv[r0 + j, vo : vo + hs], qkv[r0 + j, ko : ko + hs]
        gkj, gvj = dqkv[r0 + j, ko : ko + hs], dqkv[r0 + j, vo : vo + hs]
        ds = p * (rdot(gi, vj) - D) * scale
        for d in range(hs):
            gvj[d] += p * gi[d]
            dq[d] += ds * kj[d]
            gkj[d] += ds * qi[d]


@jit(parallel=True, fastmath=FM)
def short_attention_bwd(qkv, y, g, lse, T, nh, hs, scale, dqkv):
    """dqkv (N, 3C, zeros on entry) <- the gradients of q, k, v given g = ∂y (N, C)."""
    C = nh * hs
    for bh in prange(lse.shape[0]):
        h, r0 = bh % nh, (bh // nh) * T
        qo, ko, vo = h * hs, C + h * hs, 2 * C + h * hs
        s, dq = np.empty(T, F32), np.empty(hs, F32)
        for i in range(T):
            r = r0 + i
            gi, oi = g[r, qo : qo + hs], y[r, qo : qo + hs]
            D = F32(0)  # rowsum(g·o)
            for d in range(hs):
                D += gi[d] * oi[d]
            _head_scores(qkv, r, qo, r0, ko, hs, i + 1, s, scale)
            _head_bwd_row(qkv, g, dqkv, r, r0, qo, ko, vo, hs, i + 1, s, dq, D, lse[bh, i], scale)
            gq = dqkv[r, qo : qo + hs]
            for d in range(hs):
                gq[d] = dq[d]
