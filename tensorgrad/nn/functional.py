"""Neural-network functions (``import tensorgrad.nn.functional as F``, as ``torch.nn.functional``): check, then apply.

Each function checks its arguments (shapes, dims, dtypes) with one clear error, then
applies one op: the reference Op in ``ops/nn.py`` (the formula, with its
backward), which runs a registered kernel instead where one applies
(``tensorgrad.kernels``). Composed one-liners (relu) build on Tensor methods.
"""

from __future__ import annotations

import numpy as np

from ..autograd import is_grad_enabled, no_grad
from ..devices import get_array_module
from ..factory import where
from ..ops.dims import wrap_dim
from ..ops.linalg import Linear
from ..ops.nn import (
    Attention,
    CrossEntropy,
    Dropout,
    Embedding,
    Gelu,
    LayerNorm,
    LogSoftmax,
    Softmax,
    causal_mask,
    erf,
)
from ..ops.shape import Pad
from ..tensor import Tensor, as_array

__all__ = [
    "softmax",
    "log_softmax",
    "cross_entropy",
    "layer_norm",
    "batch_norm",
    "gelu",
    "relu",
    "dropout",
    "linear",
    "embedding",
    "scaled_dot_product_attention",
    "causal_mask",
    "erf",
    "silu",
    "tanh",
    "sigmoid",
    "pad",
    "mse_loss",
    "l1_loss",
    "one_hot",
    "nll_loss",
    "binary_cross_entropy_with_logits",
    "softplus",
    "leaky_relu",
    "elu",
    "normalize",
]


def softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``dim``; finite for any finite input; ``dtype``
    casts x first.

    A row that is entirely -inf has no defined softmax and gives NaN, as in PyTorch.
    """
    x = x if dtype is None else x.to(dtype)
    return Softmax.apply(x, dim=wrap_dim("softmax", dim, x.ndim))


def log_softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor:
    """x - logsumexp(x) along ``dim`` (max-shifted, so ±1e4 logits stay finite)."""
    x = x if dtype is None else x.to(dtype)
    return LogSoftmax.apply(x, dim=wrap_dim("log_softmax", dim, x.ndim))


def cross_entropy(
    logits: Tensor,
    target,
    weight=None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
):
    """Cross-entropy of ``logits`` (N, C) against class ids ``target`` (N,), fused, or against
    class probabilities (float, shaped like the logits); ``weight`` (C,) weighs each class
    (composed from log_softmax and nll_loss). ``size_average``/``reduce`` are PyTorch's
    deprecated arguments, accepted so that positions match; leave them None.

    Positions whose target equals ``ignore_index`` contribute nothing; 'mean' divides
    by the number of the others (NaN when every target is ignored, as in PyTorch).
    Logits of shape (N, C, d1, ...) take targets (N, d1, ...), with classes on dim 1.
    ``label_smoothing`` ε mixes in the uniform distribution: (1-ε)·loss + ε·mean_c(-log p_c).
    """
    t = as_array(target)
    if t.dtype.kind == "f" and t.shape == logits.shape:  # class probabilities
        return _soft_cross_entropy(logits, target, weight, reduction, label_smoothing)
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold integer class ids, got {t.dtype}")
    if t.dtype not in (np.int64, np.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {t.dtype}")
    if weight is not None:
        if label_smoothing:
            raise NotImplementedError("cross_entropy: weight= with label_smoothing")
        return nll_loss(log_softmax(logits, 1 if logits.ndim > 1 else 0), target, weight,
                        ignore_index, reduction)  # fmt: skip
    if label_smoothing:
        return _smoothed_cross_entropy(logits, target, ignore_index, reduction, label_smoothing)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(
            f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    x = logits
    if x.ndim == 1:
        x, t = x.unsqueeze(0), t.reshape(1)
    elif x.ndim > 2:
        x = x.movedim(1, -1).reshape(-1, x.shape[1])
        t = t.reshape(-1)
    if t.shape != (x.shape[0],):
        raise ValueError(
            f"cross_entropy: target shape {tuple(as_array(target).shape)} does not match logits "
            f"shape {tuple(logits.shape)}"
        )
    out = CrossEntropy.apply(x, t, ignore_index=ignore_index, reduction=reduction)
    if reduction == "none":
        if logits.ndim == 1:
            return out.reshape(())
        if logits.ndim > 2:
            return out.reshape(as_array(target).shape)
    return out


def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims
    (biased variance, as PyTorch)."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.ndim - len(ns) :]) != ns:
        raise ValueError(
            f"layer_norm: normalized_shape {ns} does not match the input's trailing dims "
            f"{tuple(x.shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != ns:
            raise ValueError(
                f"layer_norm: {name} of shape {tuple(p.shape)} does not match normalized_shape {ns}"
            )
    return LayerNorm.apply(x, weight, bias, nd=len(ns), eps=eps)


def batch_norm(
    x: Tensor,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1), over every other dim.

    training: the batch's mean and biased variance, and the running statistics (when given)
    updated in place, ``(1 - momentum)·running + momentum·batch`` with the unbiased variance;
    else the running statistics. Composed of Tensor ops, which give its gradient."""
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected an input of (N, C, ...), got {tuple(x.shape)}")
    dims = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)  # statistics broadcast along the channels
    if training:
        n = x.numel() // x.shape[1]
        if n <= 1:
            raise ValueError(
                "Expected more than 1 value per channel when training, got input size "
                f"{tuple(x.shape)}"
            )
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        with no_grad():
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(mean * momentum)
            if running_var is not None:
                running_var.mul_(1 - momentum).add_(var * (momentum * n / (n - 1)))
    else:
        mean, var = running_mean, running_var
    y = (x - mean.view(shape)) / (var.view(shape) + eps).sqrt()
    if weight is not None:
        y = y * weight.view(shape)
    return y if bias is None else y + bias.view(shape)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: exact x·Φ(x) ('none') or the tanh approximation used by GPT-2 ('tanh')."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(x, approximate=approximate)


def relu(x: Tensor) -> Tensor:
    return x.relu()


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (when training)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    return Dropout.apply(x, p=p)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias with weight of shape (out, in), as one 2-D GEMM over all rows."""
    return Linear.apply(x, weight, bias)


def embedding(idx, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` picked by integer ``idx``; repeated ids add up in the gradient; the
    row ``padding_idx`` gets none."""
    idx = as_array(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    out = Embedding.apply(weight, idx)
    if padding_idx is None:
        return out
    pad = (idx == padding_idx % weight.shape[0])[..., None]
    return where(pad, out.detach(), out)  # same values, no gradient from the padding rows


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """Attention over (..., L, E) queries and (..., S, E) keys/values as one fused op.

    ``attn_mask`` is boolean (True = may attend, as PyTorch) or additive float, and
    broadcasts to (..., L, S). ``is_causal`` masks future keys (bottom-right aligned when
    L != S). Queries whose keys are all masked output zeros.
    """
    # a float mask tensor stays a tensor: it may require grad (relative-position biases)
    m = attn_mask if attn_mask is None or isinstance(attn_mask, Tensor) else as_array(attn_mask)
    return Attention.apply(q, k, v, m, dropout_p=dropout_p, is_causal=is_causal, scale=scale)


# ----------------------------------------------------------------------------- composed


def _smoothed_cross_entropy(logits, target, ignore_index, reduction, eps):
    """cross_entropy with label smoothing, composed from the fused loss and log_softmax."""
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {eps}")
    nll = cross_entropy(logits, target, ignore_index=ignore_index, reduction="none")
    cdim = 1 if logits.ndim > 1 else 0
    uniform = -log_softmax(logits, cdim).mean(cdim)  # (N, d1, ...): -mean_c log p_c
    valid = as_array(target) != ignore_index
    rows = uniform.masked_fill(~valid, 0.0) * eps + nll * (1.0 - eps)
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / float(valid.sum())


def silu(x: Tensor) -> Tensor:
    """x·sigmoid(x) (swish)."""
    return x * x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def pad(x: Tensor, pad, mode: str = "constant", value: float = 0.0) -> Tensor:
    """Constant padding, ``pad`` = (left, right) for the last dim, then the one before, ...;
    negative amounts crop. Only mode='constant'."""
    if mode != "constant":
        raise NotImplementedError(f"pad: only mode='constant' is supported, got {mode!r}")
    return Pad.apply(x, tuple(pad), value=0.0 if value is None else value)


def _reduce(rows: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return rows.mean()
    if reduction == "sum":
        return rows.sum()
    if reduction == "none":
        return rows
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse_loss(x: Tensor, target, reduction: str = "mean") -> Tensor:
    """mean((x - target)²) (broadcast, as PyTorch)."""
    d = x - target
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(x: Tensor, target, reduction: str = "mean") -> Tensor:
    return _reduce((x - target).abs(), reduction, "l1_loss")


def one_hot(idx, num_classes: int = -1) -> Tensor:
    """int64 (..., num_classes) with a 1 at each id (num_classes -1: max id + 1)."""
    t = as_array(idx)
    n = int(t.max()) + 1 if num_classes < 0 else num_classes
    xp = get_array_module(t)
    return Tensor((t[..., None] == xp.arange(n)).astype(xp.int64), dtype=xp.int64)


# ----------------------------------------------------------------------------- more losses


def _classes_last(x: Tensor, t):
    """(N, C, d1, ...) logits and (N, d1, ...) targets as (M, C) and (M,)."""
    if x.ndim == 1:
        return x.unsqueeze(0), t.reshape(1)
    if x.ndim > 2:
        return x.movedim(1, -1).reshape(-1, x.shape[1]), t.reshape(-1)
    return x, t


def nll_loss(logp: Tensor, target, weight=None, ignore_index: int = -100, reduction="mean"):
    """-weight[t]·logp[t] per position, for log-probabilities (N, C) or (N, C, d1, ...) and
    class ids (N,) or (N, d1, ...); 'mean' divides by the summed weight of the kept positions."""
    t = as_array(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"nll_loss: target must hold integer class ids, got {t.dtype}")
    if getattr(weight, "requires_grad", False) and is_grad_enabled():
        raise RuntimeError("nll_loss: the derivative for 'weight' is not implemented (detach it)")
    x, tf = _classes_last(logp, t)
    keep = tf != ignore_index
    xp = get_array_module(tf)
    safe = xp.where(keep, tf, 0).astype(np.int64)
    picked = -x.gather(1, safe[:, None]).squeeze(1)  # (M,)
    w = xp.ones(x.shape[1], dtype=x.dtype.type) if weight is None else as_array(weight)
    wt = xp.where(keep, w[safe], 0).astype(x.dtype.type)
    rows = picked * Tensor(wt)
    if reduction == "none":
        return rows.reshape(t.shape) if logp.ndim != 1 else rows.reshape(())
    if reduction == "mean":
        return rows.sum() / float(wt.sum())
    return _reduce(rows, reduction, "nll_loss")


def _soft_cross_entropy(logits: Tensor, target, weight, reduction: str, eps: float) -> Tensor:
    """cross_entropy against class probabilities: -sum_c weight_c·target_c·log p_c per row."""
    t = target if isinstance(target, Tensor) else Tensor(target)
    if t.shape != logits.shape:
        raise ValueError(
            f"cross_entropy: probability targets of shape {tuple(t.shape)} do not match logits "
            f"of shape {tuple(logits.shape)}"
        )
    cdim = 1 if logits.ndim > 1 else 0
    c = logits.shape[cdim]
    if eps:
        t = t * (1.0 - eps) + eps / c
    logp = log_softmax(logits, cdim)
    if weight is not None:
        w = weight if isinstance(weight, Tensor) else Tensor(weight)
        logp = logp * w.reshape([c] + [1] * (logits.ndim - cdim - 1))
    rows = -(t * logp).sum(cdim)
    if reduction == "mean":
        return rows.sum() / (rows.numel() if logits.ndim > 1 else 1)
    return _reduce(rows, reduction, "cross_entropy")


def binary_cross_entropy_with_logits(
    x: Tensor, target, weight=None, reduction: str = "mean", pos_weight=None
) -> Tensor:
    """-[pos_weight·y·log σ(x) + (1-y)·log(1-σ(x))]·weight, written with
    log σ(x) = -softplus(-x) so that large |x| stay finite."""
    y = target if isinstance(target, Tensor) else Tensor(target)
    log1p_exp = ((-x.abs()).exp() + 1.0).log() + (-x).relu()  # softplus(-x) = -log σ(x)
    if pos_weight is None:
        rows = (1.0 - y) * x + log1p_exp
    else:
        rows = (1.0 - y) * x + (1.0 + (pos_weight - 1.0) * y) * log1p_exp
    if weight is not None:
        rows = rows * weight
    return _reduce(rows, reduction, "binary_cross_entropy_with_logits")


# ----------------------------------------------------------------------------- activations


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(βx))/β, and x itself where βx > threshold (as PyTorch)."""
    bx = x * beta
    soft = (((-bx.abs()).exp() + 1.0).log() + bx.relu()) / beta
    return where(bx > threshold, x, soft)


def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x where x > 0, else negative_slope·x."""
    return where(x > 0, x, x * negative_slope)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, else alpha·(exp(x) - 1)."""
    return where(x > 0, x, (x.clamp(max=0.0).exp() - 1.0) * alpha)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(‖x‖_p, eps) along ``dim``."""
    return x / x.norm(p, dim, keepdim=True).clamp(min=eps)
