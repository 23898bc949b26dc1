"""Neural-network functions (``import tensorgrad.functional as F``): check, then apply.

Each function checks its arguments (shapes, dims, dtypes) with one clear error, then
applies one op: the reference Op in ``ops/nn.py`` (the formula, with its
backward), which runs a registered kernel instead where one applies
(``tensorgrad.kernels``). Composed one-liners (relu) build on Tensor methods.
"""

from __future__ import annotations

from . import kernels
from .backend import device_of, get_array_module
from .ops.dims import wrap_dim
from .ops.linalg import Linear
from .ops.nn import (
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
from .ops.shape import Pad
from .tensor import Tensor, as_array

__all__ = [
    "softmax",
    "log_softmax",
    "cross_entropy",
    "layer_norm",
    "gelu",
    "relu",
    "dropout",
    "linear",
    "embedding",
    "scaled_dot_product_attention",
    "gpt2_block",
    "gpt2_block_reference",
    "causal_mask",
    "erf",
    "silu",
    "tanh",
    "sigmoid",
    "pad",
    "mse_loss",
    "l1_loss",
    "one_hot",
]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``dim``; finite for any finite input.

    A row that is entirely -inf has no defined softmax and gives NaN, as in PyTorch.
    """
    return Softmax.apply(x, dim=wrap_dim("softmax", dim, x.ndim))


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """x - logsumexp(x) along ``dim`` (max-shifted, so ±1e4 logits stay finite)."""
    return LogSoftmax.apply(x, dim=wrap_dim("log_softmax", dim, x.ndim))


def cross_entropy(
    logits: Tensor,
    target,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
):
    """Cross-entropy of ``logits`` (N, C) against class ids ``target`` (N,), fused.

    Positions whose target equals ``ignore_index`` contribute nothing; 'mean' divides
    by the number of the others (NaN when every target is ignored, as in PyTorch).
    Logits of shape (N, C, d1, ...) take targets (N, d1, ...), with classes on dim 1.
    ``label_smoothing`` ε mixes in the uniform distribution: (1-ε)·loss + ε·mean_c(-log p_c).
    """
    if label_smoothing:
        return _smoothed_cross_entropy(logits, target, ignore_index, reduction, label_smoothing)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(
            f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    t = as_array(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold integer class ids, got {t.dtype}")
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


def embedding(idx, weight: Tensor) -> Tensor:
    """Rows of ``weight`` picked by integer ``idx``; repeated ids add up in the gradient."""
    idx = as_array(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    return Embedding.apply(weight, idx)


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


# ----------------------------------------------------------------------------- GPT-2 block

GPT2_BLOCK_PARAMS = (
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
)


def gpt2_block(x: Tensor, params, n_head: int, eps: float = 1e-5, approximate: str = "tanh"):
    """One pre-LayerNorm GPT-2 block, x + attn(ln_1(x)) then + mlp(ln_2(x)), causal, no
    dropout; ``params`` are its 12 tensors in the order of ``GPT2_BLOCK_PARAMS`` (biases may
    be None). The reference is :func:`gpt2_block_reference`, the composition of the ops
    above; a kernel registered for op 'gpt2_block' (the fused CPU block) runs instead where
    its predicate accepts the arrays, as one graph node."""
    params = tuple(params)
    if len(params) != len(GPT2_BLOCK_PARAMS):
        raise ValueError(f"gpt2_block: expected {len(GPT2_BLOCK_PARAMS)} params, got {len(params)}")
    if x.ndim != 3 or x.shape[2] % n_head:
        raise ValueError(f"gpt2_block: x must be (B, T, C) with C divisible by n_head={n_head}")
    kw = {"n_head": n_head, "eps": eps, "approximate": approximate}
    arrays = [x.data] + [None if p is None else p.data for p in params]
    impl = kernels.pick("gpt2_block", device_of(x.data), *arrays, **kw)
    if impl is None:
        return gpt2_block_reference(x, params, **kw)
    return impl.apply(x, *params, **kw)


def gpt2_block_reference(x: Tensor, params, n_head: int, eps: float = 1e-5, approximate="tanh"):
    """gpt2_block as the composition of layer_norm, linear, attention and gelu (the math
    of gpt.model.Block)."""
    ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mlp_w, mlp_b = params
    B, T, C = x.shape
    nh, hs = n_head, C // n_head
    q, k, v = linear(layer_norm(x, C, ln1_w, ln1_b, eps), attn_w, attn_b).split(C, dim=2)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    y = scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
    x = x + linear(y, proj_w, proj_b)
    h = gelu(linear(layer_norm(x, C, ln2_w, ln2_b, eps), fc_w, fc_b), approximate)
    return x + linear(h, mlp_w, mlp_b)


# ----------------------------------------------------------------------------- composed


def _smoothed_cross_entropy(logits, target, ignore_index, reduction, eps):
    """cross_entropy with label smoothing, composed from the fused loss and log_softmax."""
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {eps}")
    nll = cross_entropy(logits, target, ignore_index, reduction="none")
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
