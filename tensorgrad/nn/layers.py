"""The layers a GPT is made of: ``Linear``, ``Embedding``, ``LayerNorm``, ``Dropout``, ``GELU``
(PyTorch's initial values; each forward is one ``F`` function).

Imports: math, numpy, .functional, .module, ..devices, ..tensor.
"""

from __future__ import annotations

import math

import numpy as np

from ..devices import rng
from ..tensor import DEFAULT_DTYPE
from . import functional as F
from .module import Module, Parameter


def _uniform(shape, bound):
    return rng("cpu").uniform(-bound, bound, size=shape).astype(DEFAULT_DTYPE)


class Linear(Module):
    """y = x @ weight.T + bias, weight (out_features, in_features), PyTorch's default init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim), N(0, 1) at init; the row at
    ``padding_idx`` starts at zero and gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        w = rng("cpu").standard_normal((num_embeddings, embedding_dim), dtype=DEFAULT_DTYPE)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = ns, eps
        self.weight = Parameter(np.ones(ns, DEFAULT_DTYPE)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(ns, DEFAULT_DTYPE)) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        affine = self.weight is not None
        bias = f", bias={self.bias is not None}" if affine else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={affine}{bias}"


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p, self.inplace = p, inplace  # inplace is accepted; the result is a new tensor

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"
