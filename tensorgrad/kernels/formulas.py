"""Each formula of the CPU kernels, stated once: GELU, LayerNorm, softmax and its kin, per
number or per row, as numba functions inlined where they are called.

The reference ops (``tensorgrad/ops/nn.py``) are the readable statement and the oracle.
Everything faster is built from the functions here: the per-op kernels (``cpu_numba``), the
fused GPT-2 block's passes (``cpu_numba_block``), the short and the flash attention
(``cpu_numba_attention``) and the compiler's generated kernels (its GELU rules call
``gelu_tanh`` and ``gelu_erf`` and their ``_deriv`` forms). A fix made here (a guard, an eps,
a dtype rule) reaches all of them; ``tests/test_kernels*.py`` check every caller against its
reference op.

Conventions. Each function is ``inline="always"``: numba pastes it into its caller, which
compiles it with its own flags (``contract`` only, see numba_math's "One computation"); a
call per row cost more than the row (LayerNorm on gpt-nano's rows of 48: 9.5 against 6.8
µs). The softmax functions work in place on their row (the attention's scores become its
probabilities): LLVM keeps a loop scalar where an output may alias an input (its run-time
overlap check fails when they are the same array), so a caller with separate input and
output copies the row first (it is in L1 then). GELU and LayerNorm take float32 or float64
(``like``, ``exp_of``: numba_math); the softmax family is float32 (``exp32``).

Imports: math, numpy, .numba_math, ..ops.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.nn import GELU_C, SQRT_2_OVER_PI  # the tanh GELU's constants, the reference's
from .numba_math import (
    erfc_of,
    exp32,
    exp32_nonpos,
    exp_nonpos_of,
    exp_of,
    jit,
    like,
    rdot2dev,
    rmax,
    rsqdev,
    rsum,
)

F32 = np.float32
# The one fast-math flag of every kernel: FMA where the code multiplies and adds. Not
# reassoc (nor nsz): that let the cached and the freshly compiled copy of a kernel order
# its sums differently (numba_math's "One computation"); no nnan/ninf: inf/NaN propagate.
FM = {"contract"}

R2, R2PI = 1 / math.sqrt(2.0), 1 / math.sqrt(2 * math.pi)  # the exact GELU's


# ----------------------------------------------------------------------------- GELU
@jit(inline="always", fastmath=FM)
def gelu_tanh(x):
    """0.5·x·(1 + tanh(u)) = x·σ(2u) = x / (1 + e^(-2u)), u = √(2/π)(x + 0.044715x³): no
    cancellation at large negative x, where e^(-2u) = inf gives -0, as the reference does."""
    u = like(SQRT_2_OVER_PI, x) * (x + like(GELU_C, x) * x * x * x)
    return x / (like(1, x) + exp_of(like(-2, x) * u))


@jit(inline="always", fastmath=FM)
def gelu_tanh_grad(x):
    """(GELU_tanh(x), its derivative) with one exp: d/dx x·σ(2u) = σ + x·2σ(1-σ)·u' with
    σ(1-σ) = e·σ², e = e^(-2u). Where e is inf (σ = 0) or 0 (σ = 1) that term is 0 and the
    derivative σ. (e was capped at e^80 once, against inf·0: far in the negative tail that
    left x·e^-80, a gradient of -3864 at x = -1e13.)"""
    k = like(SQRT_2_OVER_PI, x)
    x2 = x * x
    e = exp_of(like(-2, x) * k * (x + like(GELU_C, x) * x2 * x))
    s = like(1, x) / (like(1, x) + e)
    es = e * s * s  # first: e alone may be 5e34, times x it would overflow; NaN where e = inf
    d = s + x * like(2, x) * es * k * (like(1, x) + like(3 * GELU_C, x) * x2)
    return x / (like(1, x) + e), d if es > 0 else s


@jit(inline="always", fastmath=FM)
def gelu_tanh_deriv(x):
    """The tanh GELU's derivative alone (the compiler's generated backward reads it)."""
    return gelu_tanh_grad(x)[1]


@jit(inline="always", fastmath=FM)
def phi(x):
    """Φ(x) = erfc(-x/√2)/2, the standard normal's CDF (exact in the lower tail)."""
    h = like(0.5, x) * erfc_of(abs(x) * like(R2, x))
    return like(1, x) - h if x >= 0 else h


@jit(inline="always", fastmath=FM)
def gelu_erf(x):
    """The exact GELU x·Φ(x)."""
    return x * phi(x)


@jit(inline="always", fastmath=FM)
def gelu_erf_grad(x):
    """(x·Φ(x), its derivative Φ(x) + x·φ(x)) with one Φ."""
    p = phi(x)
    return x * p, p + x * like(R2PI, x) * exp_nonpos_of(like(-0.5, x) * x * x)


@jit(inline="always", fastmath=FM)
def gelu_erf_deriv(x):
    """The exact GELU's derivative alone (the compiler's generated backward reads it)."""
    return gelu_erf_grad(x)[1]


# ----------------------------------------------------------------------------- LayerNorm
@jit(inline="always", fastmath=FM)
def ln_row(xi, w, b, eps, yi):
    """yi = LayerNorm(xi)·w + b for one row; returns (mean, 1/std). All in x's dtype: a float64
    mean (an int divisor promotes) made the row loops float64, half as wide (13 against 5 µs
    on gpt-nano's 384 rows of 48, family 26 model 2)."""
    c, t = xi.size, xi.dtype.type
    mean = t(rsum(xi) / c)
    var = rsqdev(xi, mean)  # two passes (the row is in L1): no cancellation in E[x²]-E[x]²
    r = t(1) / np.sqrt(var / t(c) + eps)
    for j in range(c):
        yi[j] = (xi[j] - mean) * r * w[j] + b[j]
    return mean, r


@jit(inline="always", fastmath=FM)
def ln_row_grad(gi, xi, w, mean, r, di, gwp, gbp, add):
    """di = ∂LayerNorm/∂x · gi for one row, added to what di holds where ``add`` (the
    residual stream's gradient); gwp += gi·x̂, gbp += gi (the parameters' partial sums).

    In x's dtype, as ((ĝ - x̂·k) - a)·r with ĝ = g·w, a = mean(ĝ), k = mean(ĝ·x̂): where the
    gradient is 0 (LayerNorm over one feature: x̂ = 0, a = ĝ) it is 0 whichever product LLVM
    fuses into an FMA. Written as ĝ - a - x̂·k, the FMA g·w - a left g·w's rounding error
    times 1/std there (tests/test_kernels.py::test_layer_norm_kernel_over_one_feature)."""
    c, t = xi.size, xi.dtype.type
    s1, s2 = rdot2dev(gi, w, xi, mean)  # Σ ĝ and Σ ĝ·(x - mean)
    a = t(s1 / c)
    k = t(s2 * r / c)
    for j in range(c):
        xh = (xi[j] - mean) * r
        v = ((gi[j] * w[j] - xh * k) - a) * r
        di[j] = di[j] + v if add else v  # (LLVM unswitches the loop: two vector loops)
        gwp[j] += gi[j] * xh
        gbp[j] += gi[j]


# ----------------------------------------------------------------------------- softmax
@jit(inline="always", fastmath=FM)
def softmax_in_place(row, lim):
    """row[:lim] <- softmax(row[:lim]), row[lim:] <- 0; returns the logsumexp of row[:lim]
    (-inf where lim is 0: a row that sees nothing is zeros). Float32 rows."""
    if lim == 0:  # (if/else, one return: numba 0.68 under parallel=True, see cpu_numba._ce_bwd)
        row[:] = 0
        lse = F32(-np.inf)
    else:
        m = rmax(row[:lim])
        for j in range(lim):
            row[j] = exp32_nonpos(row[j] - m)
        tot = normalize(row, lim)
        row[lim:] = 0
        lse = m + F32(math.log(tot))
    return lse


@jit(inline="always", fastmath=FM)
def max_shift(row, lim):
    """row[:lim] -= its max; returns the max. (softmax's first step, for a caller that
    exponentiates many short rows in one flat loop: the short attention.)"""
    m = rmax(row[:lim])
    for j in range(lim):
        row[j] -= m
    return m


@jit(inline="always", fastmath=FM)
def normalize(row, lim):
    """row[:lim] /= its sum (as one reciprocal and lim products); returns the sum.
    (softmax's last step.)"""
    tot = rsum(row[:lim])
    inv = F32(1) / tot
    for j in range(lim):
        row[j] *= inv
    return tot


@jit(inline="always", fastmath=FM)
def softmax_grad_in_place(g, y, d, scale):
    """g <- y·(g - d)·scale: softmax's backward for one row, d = Σ g·y (the row's dot; in
    attention rowsum(∂o·o), the same number), scale the scores' factor (1 for softmax)."""
    for j in range(g.size):
        g[j] = y[j] * (g[j] - d) * scale


@jit(inline="always", fastmath=FM)
def probs_again(row, scale, lim, lse):
    """row (scores) <- the probabilities e^(row·scale - lse) a softmax gave them (lse its
    logsumexp), keys >= lim zero: attention's backward recomputing its forward's."""
    for j in range(lim):
        row[j] = exp32(row[j] * scale - lse)
    row[lim:] = 0


@jit(inline="always", fastmath=FM)
def log_softmax_row(xi, yi):
    """yi = log_softmax(xi) = (x - m) - log Σ e^(x - m), m = max x; x - m is exact, so ±1e4
    logits keep their digits. Returns (m, log Σ e^(x - m))."""
    m = rmax(xi)
    for j in range(xi.size):
        yi[j] = exp32_nonpos(xi[j] - m)
    ls = F32(math.log(rsum(yi)))
    for j in range(xi.size):
        yi[j] = (xi[j] - m) - ls
    return m, ls


@jit(inline="always", fastmath=FM)
def log_softmax_grad(gi, yi, o):
    """o = gi - e^yi·Σ gi: log_softmax's backward for one row."""
    sg = rsum(gi)
    for j in range(gi.size):
        o[j] = gi[j] - exp32_nonpos(yi[j]) * sg
