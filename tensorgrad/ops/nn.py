"""The neural-network ops a GPT is made of, each one reference Op with its backward.

Each op is written once, as the formula a reader knows, in plain array math through
``xp`` (NumPy or CuPy), so it runs on every backend and is the oracle for everything
faster: the chunked CPU passes and compiled kernels in ``tensorgrad/kernels/``, the
CUDA kernels in ``tensorgrad/cuda/``, registered under the same ``op`` name and
checked against these by the registry test.

Imports: math, .linalg, .shape, .special, ..autograd, ..devices.
"""

from __future__ import annotations

import math

from ..autograd import Op, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import device_of, errstate, get_array_module, is_cpu_array, rng
from .linalg import matmul
from .shape import add_at
from .special import erf

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # GELU's tanh form (the kernels use these too)
GELU_C = 0.044715


def _array(a):
    """The array of a saved value (a Tensor under create_graph): masks, ids, shifts."""
    return a.array if is_tensor(a) else a


def _mT(a):
    return xp_of(a).swapaxes(a, -1, -2)


# ----------------------------------------------------------------------------- softmax family


def log_softmax_array(xp, x, dim):
    """x - logsumexp(x) along dim, shifted by the max so that nothing overflows."""
    z = x - x.max(axis=dim, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=dim, keepdims=True))


def softmax(x, dim):
    """softmax of an array, or (recorded) of a Tensor."""
    return Softmax.apply(x, dim=dim) if is_tensor(x) else Softmax().forward(x, dim)


class Softmax(Op):
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
        return y * (g - xp_of(g, y).sum(g * y, axis=self.dim, keepdims=True))


class LogSoftmax(Op):
    """y = x - logsumexp(x) along ``dim``;  ∂L/∂x = g - softmax(x)·Σ g."""

    op = "log_softmax"

    def forward(self, x, dim=-1):
        self.dim = dim
        y = log_softmax_array(get_array_module(x), x, dim)
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        xp = xp_of(g, y)
        return g - xp.exp(y) * xp.sum(g, axis=self.dim, keepdims=True)


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
    count = valid.sum().astype(losses.dtype)
    if is_cpu_array(valid) and count:  # nothing to silence (errstate costs more than the mean;
        # on a GPU, asking whether count is 0 would wait for the device)
        return losses.sum() / count
    with errstate(xp, invalid="ignore", divide="ignore"):
        return losses.sum() / count


def loss_coef(g, valid, reduction: str, dtype):
    """∂L/∂(row loss): g per row, 0 where ignored, divided by the count for 'mean'."""
    coef = valid.astype(dtype)
    if reduction != "mean":
        return coef * g
    count = valid.sum().astype(dtype)
    if is_cpu_array(valid) and count:  # nothing to silence (see reduce_losses)
        return coef * (g / count)
    with errstate(get_array_module(valid), invalid="ignore", divide="ignore"):
        return coef * (g / count)  # every row ignored: NaN, as PyTorch


class CrossEntropy(Op):
    """loss_i = logsumexp(x_i) - x_i[t_i] over (N, C) logits;  ∂loss_i/∂x_i = softmax(x_i) - onehot(t_i).

    Rows whose target is ``ignore_index`` contribute nothing.
    """

    op = "cross_entropy"

    def forward(self, x, target, ignore_index=-100, reduction="mean"):
        xp = get_array_module(x)
        valid = target != ignore_index
        t = xp.where(valid, target, 0)
        check_classes(xp, t, x.shape[1])
        logp = log_softmax_array(xp, x, 1)
        losses = xp.where(valid, -logp[xp.arange(x.shape[0]), t], xp.zeros((), x.dtype))
        self.reduction = reduction
        self.save(x, t, valid)
        return reduce_losses(xp, losses, valid, reduction)

    def backward(self, g):
        x, t, valid = self.saved
        t, valid = _array(t), _array(valid)
        coef = loss_coef(g, valid, self.reduction, x.dtype)
        rows = get_array_module(t).arange(x.shape[0])
        return softmax(x, 1) * coef[:, None] - add_at(tuple(x.shape), (rows, t), coef), None


# ----------------------------------------------------------------------------- normalisation


def normalize(x, axes, eps):
    """(x̂, 1/√(var + eps)) over ``axes``: x̂ = (x - mean)·rstd, biased variance."""
    xp = xp_of(x)
    xc = x - xp.mean(x, axis=axes, keepdims=True)
    rstd = 1 / xp.sqrt(xp.mean(xc * xc, axis=axes, keepdims=True) + x.dtype.type(eps))
    return xc * rstd, rstd


class LayerNorm(Op):
    """y = x̂·w + b with x̂ = (x - mean) / √(var + eps) over the trailing ``nd`` dims
    (biased variance);  ∂L/∂x = (ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) / √(var + eps), ĝ = g·w.
    Keeps x and w; backward normalises x again."""

    op = "layer_norm"

    def forward(self, x, w, b, nd=1, eps=1e-5):
        self.axes = tuple(range(x.ndim - nd, x.ndim))
        self.eps, self.has_w, self.has_b = eps, w is not None, b is not None
        xhat, _ = normalize(x, self.axes, eps)
        self.save(x, w)
        y = xhat if w is None else xhat * w
        return y if b is None else y + b

    def backward(self, g):
        x, w = self.saved
        xp = xp_of(g, x, w)
        xhat, rstd = normalize(x, self.axes, self.eps)
        lead = tuple(range(g.ndim - len(self.axes)))  # the axes w and b are broadcast over
        gw = xp.sum(g * xhat, axis=lead) if self.has_w else None
        gb = xp.sum(g, axis=lead) if self.has_b else None
        gh = g if w is None else g * w
        mean_gh = xp.mean(gh, axis=self.axes, keepdims=True)
        mean_ghx = xp.mean(gh * xhat, axis=self.axes, keepdims=True)
        return (gh - mean_gh - xhat * mean_ghx) * rstd, gw, gb


# ----------------------------------------------------------------------------- activations

INV_SQRT_2 = 1 / math.sqrt(2.0)
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


class Gelu(Op):
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
        return x * (0.5 * (1 + erf(x * INV_SQRT_2)))

    def backward(self, g):
        (x,) = self.saved
        xp = xp_of(x)
        if self.approximate == "tanh":
            # d/dx = 0.5·(1 + t) + 0.5·x·(1 - t²)·√(2/π)·(1 + 3·0.044715·x²)
            t = xp.tanh(SQRT_2_OVER_PI * (x + GELU_C * x**3))
            return g * (
                0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_C * x * x)
            )
        # d/dx x·Φ(x) = Φ(x) + x·φ(x)
        cdf = 0.5 * (1 + erf(x * INV_SQRT_2))
        pdf = xp.exp(-0.5 * x * x) * INV_SQRT_2PI
        return g * (cdf + x * pdf)


def dropout_mask(shape, p: float, dtype, device: str):
    """The scaled keep-mask dropout multiplies by: 1/(1-p) with probability 1-p, else 0."""
    keep = rng(device).random(shape, dtype=dtype) >= p
    return keep.astype(dtype) * dtype.type(1 / (1 - p))


class Dropout(Op):
    """Zero each element with probability p and scale the rest by 1/(1-p)."""

    op = "dropout"

    def forward(self, x, p=0.5):
        mask = dropout_mask(x.shape, p, x.dtype, device_of(x))
        self.save(mask)
        return x * mask

    def backward(self, g):
        return g * self.saved[0]


# ----------------------------------------------------------------------------- lookup


def embedding_range_error(lo: int, hi: int, rows: int) -> str:
    return f"embedding: index {lo if lo < 0 else hi} is out of range for {rows} rows"


class Embedding(Op):
    """Rows of w picked by integer ids; ∂L/∂w adds up g over repeated ids (kernels subclass
    it for a faster backward)."""

    op = "embedding"

    def forward(self, w, idx, padding_idx=None):
        lo, hi = (int(idx.min()), int(idx.max())) if idx.size else (0, 0)
        if lo < 0 or hi >= w.shape[0]:
            raise IndexError(embedding_range_error(lo, hi, w.shape[0]))
        self.save(idx)
        self.wshape, self.padding_idx = w.shape, padding_idx
        return w[idx]

    def backward(self, g):
        idx = _array(self.saved[0]).reshape(-1)
        gw = add_at(self.wshape, idx, xp_of(g).reshape(g, (-1, self.wshape[1])))
        return without_padding_row(gw, self.padding_idx), None


def without_padding_row(gw, padding_idx):
    """The embedding's weight gradient with row ``padding_idx`` zero (it learns nothing)."""
    if padding_idx is None:
        return gw
    rows = get_array_module(_array(gw)).arange(gw.shape[0]).reshape(-1, 1)
    return xp_of(gw).where(rows != padding_idx, gw, gw.dtype.type(0))


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


def attention_probs(q, k, mask, is_causal: bool, scale):
    """P = softmax(q·kᵀ·scale + mask) over the keys; a query whose keys are all masked gets
    a row of zeros. On arrays, or (recorded) on Tensors."""
    xp, raw = xp_of(q, k), get_array_module(_array(q))
    L, S = q.shape[-2], k.shape[-2]
    s = matmul(q, _mT(k)) * scale
    allowed = causal_mask(raw, L, S) if is_causal else None
    if mask is not None and mask.dtype == bool:
        allowed = _array(mask) if allowed is None else (allowed & _array(mask))
    elif mask is not None:
        s = s + (mask if mask.dtype == s.dtype else mask.astype(s.dtype))  # no float64 promotion
    if allowed is not None:
        s = xp.where(allowed, s, s.dtype.type(-raw.inf))
    m = _array(s).max(axis=-1, keepdims=True)  # a shift softmax does not depend on
    m = raw.where(raw.isfinite(m), m, m.dtype.type(0))  # a fully masked row: all exp(-inf)
    e = xp.exp(s - m)
    den = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(_array(den) == 0, den.dtype.type(1), den)


class Attention(Op):
    """o = P·v with P = attention_probs(q, k, mask) (dropout on P when training). Backward:
    ∂v = Pᵀg, ∂M = P·(gvᵀ - Σ P·gvᵀ) (an additive mask's gradient, summed to its shape),
    ∂S = ∂M·scale, ∂q = ∂S·k, ∂k = ∂Sᵀ·q. Keeps q, k, v, the mask (and the dropout mask);
    backward computes P again."""

    op = "attention"

    def forward(self, q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        check_attention(q, k, v)
        E = q.shape[-1]
        self.scale = q.dtype.type(1 / math.sqrt(E) if scale is None else scale)
        self.shapes, self.is_causal = (q.shape, k.shape, v.shape), is_causal
        self.mask_meta = None if mask is None else (mask.shape, mask.dtype)
        p = attention_probs(q, k, mask, is_causal, self.scale)
        drop = None
        if dropout_p > 0.0:
            drop = dropout_mask(p.shape, dropout_p, p.dtype, device_of(q))
        self.save(q, k, v, mask, drop)
        return matmul(p if drop is None else p * drop, v)

    def backward(self, g):
        q, k, v, mask, drop = self.saved
        sq, sk, sv = self.shapes
        p = attention_probs(q, k, mask, self.is_causal, self.scale)
        pd = p if drop is None else p * drop
        gv = matmul(_mT(pd), g)
        gp = matmul(g, _mT(v))
        if drop is not None:
            gp = gp * drop
        gs = p * (gp - xp_of(gp, p).sum(gp * p, axis=-1, keepdims=True))  # ∂ scores + mask
        gmask = mask_grad(self, gs)
        gs = gs * self.scale
        gq = matmul(gs, k)
        gk = matmul(_mT(gs), q)
        return unbroadcast(gq, sq), unbroadcast(gk, sk), unbroadcast(gv, sv), gmask


def mask_grad(fn, gs):
    """An additive float mask's gradient: the scores' (before scaling), summed to its shape;
    None when the mask is absent, boolean or needs no gradient."""
    if fn.mask_meta is None or not fn.needs_input_grad[3]:
        return None
    shape, dtype = fn.mask_meta
    gm = unbroadcast(gs, shape)
    if gm is gs and not is_tensor(gm):
        gm = gm.copy()  # a kernel goes on to scale gs in place
    return gm if gm.dtype == dtype else gm.astype(dtype)
