"""The neural-network ops a GPT is made of, each one reference Function with its backward.

Each op is written once, as the formula a reader knows, in plain array math through
``xp`` (NumPy or CuPy), so it runs on every backend and is the oracle for everything
faster: the chunked CPU passes and compiled kernels in ``tensorgrad/kernels/``, the
CUDA kernels in ``tensorgrad/cuda/``, registered under the same ``op`` name and
checked against these by the registry test.
"""

from __future__ import annotations

import math

from ..autograd import Function, unbroadcast
from ..backend import device_of, errstate, get_array_module, rng
from .linalg import matmul

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715

# ----------------------------------------------------------------------------- softmax family


class Softmax(Function):
    """y = exp(x - max x) / Σ exp(x - max x) along ``dim``;  ∂L/∂x = y·(g - Σ g·y)."""

    op = "softmax"

    def forward(self, x, dim=-1):
        xp = get_array_module(x)
        self.dim = dim
        e = xp.exp(x - x.max(axis=dim, keepdims=True))
        y = e / e.sum(axis=dim, keepdims=True)
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        return y * (g - (g * y).sum(axis=self.dim, keepdims=True))


class LogSoftmax(Function):
    """y = x - logsumexp(x) along ``dim``;  ∂L/∂x = g - softmax(x)·Σ g."""

    op = "log_softmax"

    def forward(self, x, dim=-1):
        xp = get_array_module(x)
        self.dim = dim
        z = x - x.max(axis=dim, keepdims=True)
        y = z - xp.log(xp.exp(z).sum(axis=dim, keepdims=True))
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        xp = get_array_module(g)
        return g - xp.exp(y) * g.sum(axis=self.dim, keepdims=True)


def check_classes(xp, t, n_classes: int) -> None:
    """IndexError naming the first target id outside [0, n_classes)."""
    if t.size:
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= n_classes:
            bad = lo if lo < 0 else hi
            raise IndexError(f"cross_entropy: target {bad} is out of range for {n_classes} classes")


def reduce_losses(xp, losses, valid, reduction: str):
    """Per-row losses (0 where ignored) reduced as PyTorch: 'none', 'sum', or the mean over
    the rows that are not ignored (NaN when every row is)."""
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    with errstate(xp, invalid="ignore", divide="ignore"):
        return losses.sum() / valid.sum().astype(losses.dtype)


def loss_coef(g, valid, reduction: str, dtype):
    """∂L/∂(row loss): g per row, 0 where ignored, divided by the count for 'mean'."""
    coef = valid.astype(dtype)
    if reduction == "mean":
        with errstate(get_array_module(coef), invalid="ignore", divide="ignore"):
            coef *= g / valid.sum().astype(dtype)  # every row ignored: NaN, as PyTorch
    else:
        coef *= g
    return coef


class CrossEntropy(Function):
    """loss_i = logsumexp(x_i) - x_i[t_i] over (N, C) logits;  ∂loss_i/∂x_i = softmax(x_i) - onehot(t_i).

    Rows whose target is ``ignore_index`` contribute nothing.
    """

    op = "cross_entropy"

    def forward(self, x, target, ignore_index=-100, reduction="mean"):
        xp = get_array_module(x)
        valid = target != ignore_index
        t = xp.where(valid, target, 0)
        check_classes(xp, t, x.shape[1])
        z = x - x.max(axis=1, keepdims=True)
        logp = z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))
        losses = xp.where(valid, -logp[xp.arange(x.shape[0]), t], xp.zeros((), x.dtype))
        self.reduction = reduction
        self.save(xp.exp(logp), t, valid)
        return reduce_losses(xp, losses, valid, reduction)

    def backward(self, g):
        p, t, valid = self.saved
        xp = get_array_module(p)
        coef = loss_coef(g, valid, self.reduction, p.dtype)
        gx = p * coef[:, None]
        gx[xp.arange(p.shape[0]), t] -= coef
        return gx, None


# ----------------------------------------------------------------------------- normalisation


class LayerNorm(Function):
    """y = x̂·w + b with x̂ = (x - mean) / √(var + eps) over the trailing ``nd`` dims
    (biased variance);  ∂L/∂x = (ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) / √(var + eps), ĝ = g·w."""

    op = "layer_norm"

    def forward(self, x, w, b, nd=1, eps=1e-5):
        xp = get_array_module(x)
        axes = tuple(range(x.ndim - nd, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        rstd = 1 / xp.sqrt(var + x.dtype.type(eps))
        xhat = (x - mean) * rstd
        self.axes, self.has_w, self.has_b = axes, w is not None, b is not None
        self.save(xhat, rstd, w)
        y = xhat if w is None else xhat * w
        return y if b is None else y + b

    def backward(self, g):
        xhat, rstd, w = self.saved
        lead = tuple(range(g.ndim - len(self.axes)))  # the axes w and b are broadcast over
        gw = (g * xhat).sum(axis=lead) if self.has_w else None
        gb = g.sum(axis=lead) if self.has_b else None
        gh = g if w is None else g * w
        mean_gh = gh.mean(axis=self.axes, keepdims=True)
        mean_ghx = (gh * xhat).mean(axis=self.axes, keepdims=True)
        return (gh - mean_gh - xhat * mean_ghx) * rstd, gw, gb


# ----------------------------------------------------------------------------- activations

# Abramowitz & Stegun 7.1.26-style rational erfc of W. J. Cody (1969), as in most libms:
# accurate to float64 rounding on float64 inputs, which the simpler fits are not
_ERF_A = (
    3.16112374387056560e00,
    1.13864154151050156e02,
    3.77485237685302021e02,
    3.20937758913846947e03,
    1.85777706184603153e-1,
)
_ERF_B = (
    2.36012909523441209e01,
    2.44024637934444173e02,
    1.28261652607737228e03,
    2.84423683343917062e03,
)
_ERFC_C = (
    5.64188496988670089e-1,
    8.88314979438837594e00,
    6.61191906371416295e01,
    2.98635138197400131e02,
    8.81952221241769090e02,
    1.71204761263407058e03,
    2.05107837782607147e03,
    1.23033935479799725e03,
    2.15311535474403846e-8,
)
_ERFC_D = (
    1.57449261107098347e01,
    1.17693950891312499e02,
    5.37181101862009858e02,
    1.62138957456669019e03,
    3.29079923573345963e03,
    4.36261909014324716e03,
    3.43936767414372164e03,
    1.23033935480374942e03,
)
_ERFC_P = (
    3.05326634961232344e-1,
    3.60344899949804439e-1,
    1.25781726111229246e-1,
    1.60837851487422766e-2,
    6.58749161529837803e-4,
    1.63153871373020978e-2,
)
_ERFC_Q = (
    2.56852019228982242e00,
    1.87295284992346725e00,
    5.27905102951428412e-1,
    6.05183413124413191e-2,
    2.33520497626869185e-3,
)
_SQRT_PI_INV = 1 / math.sqrt(math.pi)


def erf(xp, x):
    """The error function, elementwise (NumPy has none), after W. J. Cody's rational
    approximations (Math. Comp. 1969): three ranges of |x|, float64 rounding accuracy.
    Computed in float64 and returned in x's dtype."""
    z = xp.abs(x).astype(xp.float64)
    out = xp.empty_like(z)
    small = z < 0.5
    mid = (z >= 0.5) & (z < 4.0)
    big = z >= 4.0
    # |x| < 0.5: erf = x·P(x²)/Q(x²)
    zs = z[small]
    y = zs * zs
    num, den = _ERF_A[4] * y, y
    for i in range(3):
        num, den = (num + _ERF_A[i]) * y, (den + _ERF_B[i]) * y
    out[small] = zs * (num + _ERF_A[3]) / (den + _ERF_B[3])
    # 0.5 <= |x| < 4: erfc = exp(-x²)·P(x)/Q(x)
    zm = z[mid]
    num, den = _ERFC_C[8] * zm, zm
    for i in range(7):
        num, den = (num + _ERFC_C[i]) * zm, (den + _ERFC_D[i]) * zm
    erfc = (num + _ERFC_C[7]) / (den + _ERFC_D[7])
    out[mid] = 1 - _erfc_scale(xp, zm) * erfc
    # |x| >= 4: erfc = exp(-x²)/x·(1/√π + 1/x²·P(1/x²)/Q(1/x²))
    zb = z[big]
    y = 1 / (zb * zb)
    num, den = _ERFC_P[5] * y, y
    for i in range(4):
        num, den = (num + _ERFC_P[i]) * y, (den + _ERFC_Q[i]) * y
    r = y * (num + _ERFC_P[4]) / (den + _ERFC_Q[4])
    out[big] = 1 - _erfc_scale(xp, zb) * (_SQRT_PI_INV - r) / zb
    return xp.where(x < 0, -out, out).astype(x.dtype, copy=False)


def _erfc_scale(xp, z):
    """exp(-z²), with z² split into a 1/16-rounded part and a rest so no bits are lost."""
    zr = xp.trunc(z * 16) / 16
    return xp.exp(-zr * zr) * xp.exp(-(z - zr) * (z + zr))


class Gelu(Function):
    """GELU: x·Φ(x) ('none') or 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) ('tanh').

    Saves only x; backward recomputes Φ (or tanh) from it.
    """

    op = "gelu"

    def forward(self, x, approximate="tanh"):
        xp = get_array_module(x)
        self.approximate = approximate
        self.save(x)
        if approximate == "tanh":
            return 0.5 * x * (1 + xp.tanh(SQRT_2_OVER_PI * (x + GELU_C * x**3)))
        return x * (0.5 * (1 + erf(xp, x * (1 / math.sqrt(2.0)))))

    def backward(self, g):
        (x,) = self.saved
        xp = get_array_module(x)
        if self.approximate == "tanh":
            # d/dx = 0.5·(1 + t) + 0.5·x·(1 - t²)·√(2/π)·(1 + 3·0.044715·x²)
            t = xp.tanh(SQRT_2_OVER_PI * (x + GELU_C * x**3))
            return g * (
                0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_C * x * x)
            )
        # d/dx x·Φ(x) = Φ(x) + x·φ(x)
        cdf = 0.5 * (1 + erf(xp, x * (1 / math.sqrt(2.0))))
        pdf = xp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
        return g * (cdf + x * pdf)


class Dropout(Function):
    """Zero each element with probability p and scale the rest by 1/(1-p)."""

    op = "dropout"

    def forward(self, x, p=0.5):
        keep = rng(device_of(x)).random(x.shape, dtype=x.dtype) >= p
        mask = keep.astype(x.dtype) * x.dtype.type(1 / (1 - p))
        self.save(mask)
        return x * mask

    def backward(self, g):
        return g * self.saved[0]


# ----------------------------------------------------------------------------- lookup


class Embedding(Function):
    """Rows of w picked by integer ids; ∂L/∂w adds up g over repeated ids (kernels subclass
    it for a faster backward)."""

    op = "embedding"

    def forward(self, w, idx):
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= w.shape[0]):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise IndexError(f"embedding: index {bad} is out of range for {w.shape[0]} rows")
        self.save(idx)
        self.wshape = w.shape
        return w[idx]

    def backward(self, g):
        (idx,) = self.saved
        xp = get_array_module(g)
        gw = xp.zeros(self.wshape, dtype=g.dtype)
        xp.add.at(gw, idx.reshape(-1), g.reshape(-1, self.wshape[1]))
        return gw, None


# ----------------------------------------------------------------------------- attention


def causal_mask(xp, L: int, S: int):
    """Boolean (L, S) mask, True where query i may attend key j.

    Aligned to the bottom right (query i sits at position S - L + i), which is the
    top-left tril when L == S and the right mask for a query block after a KV cache.
    """
    return xp.tril(xp.ones((L, S), dtype=bool), k=S - L)


def check_attention(q, k, v) -> None:
    S, E = k.shape[-2], q.shape[-1]
    if k.shape[-1] != E or v.shape[-2] != S:
        raise ValueError(
            f"scaled_dot_product_attention: q {tuple(q.shape)}, k {tuple(k.shape)} and "
            f"v {tuple(v.shape)} do not line up"
        )


class Attention(Function):
    """o = P·v with P = softmax(q·kᵀ·scale + mask) over keys; a query whose keys are all
    masked gets zero output. Backward: ∂v = Pᵀg, ∂M = P·(gvᵀ - Σ P·gvᵀ) (an additive
    mask's gradient, summed to its shape), ∂S = ∂M·scale, ∂q = ∂S·k, ∂k = ∂Sᵀ·q. Keeps
    the (L, S) probabilities for backward."""

    op = "attention"

    def forward(self, q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        xp = get_array_module(q, k, v)
        check_attention(q, k, v)
        L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
        self.scale = q.dtype.type(1 / math.sqrt(E) if scale is None else scale)
        self.shapes = (q.shape, k.shape, v.shape)
        self.mask_meta = None if mask is None else (mask.shape, mask.dtype)
        s = matmul(q, k.swapaxes(-1, -2)) * self.scale
        allowed = causal_mask(xp, L, S) if is_causal else None
        if mask is not None and mask.dtype == bool:
            allowed = mask if allowed is None else (allowed & mask)
        elif mask is not None:
            s = s + mask.astype(s.dtype, copy=False)  # a float64 mask must not promote s
        if allowed is not None:
            s = xp.where(allowed, s, q.dtype.type(-xp.inf))
        m = s.max(axis=-1, keepdims=True)
        m = xp.where(xp.isfinite(m), m, q.dtype.type(0))  # a fully masked row: all exp(-inf)
        e = xp.exp(s - m)
        den = e.sum(axis=-1, keepdims=True)
        p = e / xp.where(den == 0, q.dtype.type(1), den)
        drop = None
        if dropout_p > 0.0:
            keep = rng(device_of(q)).random(p.shape, dtype=p.dtype) >= dropout_p
            drop = keep.astype(p.dtype) * p.dtype.type(1 / (1 - dropout_p))
        self.save(q, k, v, p, drop)
        return matmul(p if drop is None else p * drop, v)

    def backward(self, g):
        q, k, v, p, drop = self.saved
        sq, sk, sv = self.shapes
        pd = p if drop is None else p * drop
        gv = matmul(pd.swapaxes(-1, -2), g)
        gp = matmul(g, v.swapaxes(-1, -2))
        if drop is not None:
            gp = gp * drop
        gs = p * (gp - (gp * p).sum(axis=-1, keepdims=True))  # ∂ of the scores + mask
        gmask = mask_grad(self, gs)
        gs = gs * self.scale
        gq = matmul(gs, k)
        gk = matmul(gs.swapaxes(-1, -2), q)
        return unbroadcast(gq, sq), unbroadcast(gk, sk), unbroadcast(gv, sv), gmask


def mask_grad(fn, gs):
    """An additive float mask's gradient: the scores' (before scaling), summed to its shape;
    None when the mask is absent, boolean or needs no gradient."""
    if fn.mask_meta is None or not fn.needs_input_grad[3]:
        return None
    shape, dtype = fn.mask_meta
    gm = unbroadcast(gs, shape)
    return (gm.copy() if gm is gs else gm).astype(dtype, copy=False)
