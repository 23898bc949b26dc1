"""Neural-network functions, ``F.*``: check, then apply (``import tensorgrad.nn.functional as
F``, as ``torch.nn.functional``).

Each function checks its arguments (shapes, dims, dtypes) with one clear error, then
applies one op: the reference Op in ``ops/nn.py`` (the formula, with its
backward), which runs a registered kernel instead where one applies
(``tensorgrad.kernels``). Composed one-liners (relu) build on Tensor methods.

This file holds the functions a GPT uses; the rest of ``F`` (log_softmax, silu, pad,
batch_norm, ...; nll_loss, mse_loss, ...) is written in ``activations.py`` and ``losses.py``
and re-exported here, so that ``F.silu`` works as in PyTorch.

Imports: numpy, .activations, .losses, ..ops, ..tensor.
"""

from __future__ import annotations

import numpy as np

from ..ops.dims import wrap_dim
from ..ops.linalg import Linear
from ..ops.nn import (
    Attention,
    CrossEntropy,
    Dropout,
    Embedding,
    Gelu,
    LayerNorm,
    Softmax,
    causal_mask,
)
from ..ops.special import erf
from ..tensor import Tensor, as_array
from .activations import (
    batch_norm,
    elu,
    leaky_relu,
    log_softmax,
    normalize,
    pad,
    sigmoid,
    silu,
    softplus,
    tanh,
)
from .losses import (
    binary_cross_entropy_with_logits,
    l1_loss,
    mse_loss,
    nll_loss,
    one_hot,
    smoothed_cross_entropy,
    soft_cross_entropy,
)

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
        return soft_cross_entropy(logits, target, weight, reduction, label_smoothing)
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
        return smoothed_cross_entropy(
            logits, target, ignore_index, reduction, label_smoothing, cross_entropy
        )
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
    pad = None if padding_idx is None else padding_idx % weight.shape[0]
    return Embedding.apply(weight, idx, padding_idx=pad)  # (its backward zeroes row pad)


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
