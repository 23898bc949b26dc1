"""The CUDA kernels of ``kernels.py`` / ``flash.py`` as kernels registered for 'cuda'.

Each class is the GPU implementation of one reference op of ``ops/nn.py`` (same
arguments, same results to float32 rounding), with its own saved state: LayerNorm
keeps x, mean and rstd; GELU keeps x; cross-entropy keeps the logits and the
logsumexp (never the (N, C) probabilities); flash attention keeps q, k, v, the output
and the logsumexp per row. They apply to float32 CuPy arrays only.

Imports: math, numpy, .flash, .kernels, ..autograd, ..devices, ..kernels, ..ops.
"""

from __future__ import annotations

import math

import numpy as np

from .. import devices
from ..autograd import Op, unbroadcast
from ..kernels import Spec, register
from ..ops.nn import (
    Embedding,
    check_attention,
    check_classes,
    loss_coef,
    reduce_losses,
    without_padding_row,
)
from . import flash as FA
from . import kernels as K


def on_gpu(*arrays) -> bool:
    """True when every array is a float32 CuPy array (or None)."""
    return all(a is None or (_cupy(a) and a.dtype == np.float32) for a in arrays)


def _cupy(a) -> bool:
    """A CuPy array, or a Spec of one (kernels.which)."""
    return devices.is_cupy_array(a) or (isinstance(a, Spec) and a.device == "cuda")


@register(
    "softmax",
    "cuda",
    name="cuda.softmax",
    priority=10,
    takes="float32 CuPy, rows the kernel's block holds",
    when=lambda x, dim=-1: on_gpu(x) and K.softmax_supported(x, dim),
)
class CudaSoftmax(Op):
    def forward(self, x, dim=-1):
        y = K.softmax_forward(x)  # one CUDA block per row
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        return y * (g - (g * y).sum(axis=-1, keepdims=True))


@register(
    "cross_entropy",
    "cuda",
    name="cuda.cross_entropy",
    priority=10,
    takes="float32 CuPy (N, C) logits",
    when=lambda x, target, **kw: on_gpu(x) and K.cross_entropy_supported(x),
)
class CudaCrossEntropy(Op):
    def forward(self, x, target, ignore_index=-100, reduction="mean"):
        xp = devices.get_array_module(x)
        valid = target != ignore_index
        t = xp.where(valid, target, 0)
        check_classes(xp, t, x.shape[1])
        nll, lse = K.cross_entropy_forward(x, t)  # logsumexp(row) - x[t]; no (N, C) probs
        losses = xp.where(valid, nll, xp.zeros((), x.dtype))
        self.reduction = reduction
        self.save(x, lse, t, valid)
        return reduce_losses(xp, losses, valid, reduction)

    def backward(self, g):
        x, lse, t, valid = self.saved
        coef = loss_coef(g, valid, self.reduction, x.dtype)
        return K.cross_entropy_backward(x, t, lse, coef), None


@register(
    "layer_norm",
    "cuda",
    name="cuda.layer_norm",
    priority=10,
    takes="float32 CuPy x, w, b",
    when=lambda x, w, b, **kw: on_gpu(x, w, b) and K.layer_norm_supported(x, w, b),
)
class CudaLayerNorm(Op):
    def forward(self, x, w, b, nd=1, eps=1e-5):
        y, mean, rstd = K.layer_norm_forward(x, w, b, nd, eps)  # one CUDA block per row
        self.nd, self.has_w, self.has_b = nd, w is not None, b is not None
        self.save(x, mean, rstd, w)
        return y

    def backward(self, g):
        x, mean, rstd, w = self.saved
        return K.layer_norm_backward(g, x, w, mean, rstd, self.nd, self.has_w, self.has_b)


@register(
    "gelu",
    "cuda",
    name="cuda.gelu",
    priority=10,
    takes="float32 CuPy",
    when=lambda x, approximate="tanh": on_gpu(x) and K.gelu_supported(x),
)
class CudaGelu(Op):
    def forward(self, x, approximate="tanh"):
        self.approximate = approximate
        self.save(x)  # backward recomputes tanh / erf from x in the same single pass
        return K.gelu_forward(x, approximate)

    def backward(self, g):
        return K.gelu_backward(g, self.saved[0], self.approximate)


@register(
    "embedding",
    "cuda",
    name="cuda.embedding",
    priority=10,
    takes="float32 CuPy weight",
    when=lambda w, idx, **kw: on_gpu(w),
)  # (Op.apply checks idx is on w's device)
class CudaEmbedding(Embedding):
    """The reference's forward; backward: sorted ids, one block per id (deterministic sums)."""

    def backward(self, g):
        (idx,) = self.saved
        return without_padding_row(
            K.embedding_backward(idx, g, self.wshape), self.padding_idx
        ), None


@register(
    "attention",
    "cuda",
    name="cuda.flash_attention",
    priority=10,
    takes="float32 CuPy q, k, v, head sizes the kernel tiles",
    when=lambda q, k, v, mask, dropout_p=0.0, **kw: (
        on_gpu(q, k, v) and FA.flash_supported(q, k, v, mask, dropout_p)
    ),
)
class FlashAttention(Op):
    """Tiled online softmax: keeps the logsumexp per query, never the (L, S) scores."""

    def forward(self, q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        check_attention(q, k, v)
        E = q.shape[-1]
        self.scale = float(1 / math.sqrt(E) if scale is None else scale)
        self.shapes, self.is_causal = (q.shape, k.shape, v.shape), is_causal
        o, lse = FA.flash_attention_forward(q, k, v, is_causal, self.scale)
        self.save(q, k, v, o, lse)
        return o

    def backward(self, g):
        q, k, v, o, lse = self.saved
        sq, sk, sv = self.shapes
        gq, gk, gv = FA.flash_attention_backward(q, k, v, o, lse, g, self.is_causal, self.scale)
        return unbroadcast(gq, sq), unbroadcast(gk, sk), unbroadcast(gv, sv), None


register(
    "adamw",
    "cuda",
    name="cuda.adamw",
    priority=10,
    takes="float32 CuPy x, g, m, v",
    when=lambda x, g, m, v: on_gpu(x, g, m, v),
)(K.adamw_update)


MATMUL_PRECISIONS = ("highest", "tf32", "bf16")
_precision = ["highest"]


def set_matmul_precision(precision: str) -> None:
    """How float32 matmuls run on the GPU: 'highest' (float32 products), 'tf32' or 'bf16'
    (tensor cores with inputs rounded to TF32 / bfloat16, float32 accumulation). Weights,
    activations and optimizer state stay float32 in every mode; the CPU always uses float32."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision must be one of {MATMUL_PRECISIONS}, got {precision!r}")
    _precision[0] = precision


def get_matmul_precision() -> str:
    return _precision[0]


# torch.set_float32_matmul_precision's names, and the GPU mode each picks: 'high' lets float32
# matmuls use TF32 tensor cores, 'medium' bfloat16 ones; the CPU computes float32 in every mode
FLOAT32_PRECISIONS = {"highest": "highest", "high": "tf32", "medium": "bf16"}


def set_float32_matmul_precision(precision: str) -> None:
    """As ``torch.set_float32_matmul_precision``: 'highest', 'high' (TF32 on the GPU) or
    'medium' (bfloat16 on the GPU); the CPU keeps float32."""
    if precision not in FLOAT32_PRECISIONS:
        raise RuntimeError(
            f"Invalid precision {precision!r}: expected one of {', '.join(FLOAT32_PRECISIONS)}"
        )
    set_matmul_precision(FLOAT32_PRECISIONS[precision])


def get_float32_matmul_precision() -> str:
    return {mode: name for name, mode in FLOAT32_PRECISIONS.items()}[_precision[0]]


@register(
    "matmul",
    "cuda",
    name="cuda.matmul_tensor_cores",
    priority=10,
    takes="float32 CuPy matrices (TF32 tensor cores when allowed)",
    when=lambda x, y: _precision[0] != "highest" and on_gpu(x, y),
)
def tensor_core_matmul(x, y):
    return K.matmul(x, y, _precision[0])
