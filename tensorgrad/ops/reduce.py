"""Reductions over ``dim`` (int, tuple or None; negative allowed) with ``keepdim``: sum, mean,
max. (var, cumsum and prod are in ``more_math.py``.)

Imports: .dims, ..autograd.
"""

from __future__ import annotations

from ..autograd import Op, xp_of
from ..autograd.graph import is_tensor
from .dims import wrap_dims


def normalize_dims(dim, ndim: int, op: str = "reduce") -> tuple:
    """``dim`` as a sorted tuple of non-negative axes (PyTorch's range check)."""
    return tuple(sorted(wrap_dims(op, dim, ndim))) if ndim else ()


def expand_back(g, shape, axes, keepdim):
    """Re-insert reduced axes so that ``g`` broadcasts against the input."""
    if not keepdim and axes:
        g = xp_of(g).reshape(g, [1 if i in axes else s for i, s in enumerate(shape)])
    return g


class Sum(Op):
    def forward(self, x, dim=None, keepdim=False):
        self.shape = x.shape
        self.axes = normalize_dims(dim, x.ndim, self.name.lower())
        self.keepdim = keepdim
        return x.sum(axis=self.axes, keepdims=keepdim)

    def backward(self, g):
        g = expand_back(g, self.shape, self.axes, self.keepdim)
        return xp_of(g).broadcast_to(g, self.shape)


class Mean(Op):
    def forward(self, x, dim=None, keepdim=False):
        self.shape = x.shape
        self.axes = normalize_dims(dim, x.ndim, self.name.lower())
        self.keepdim = keepdim
        self.n = 1
        for a in self.axes:
            self.n *= x.shape[a]
        return x.mean(axis=self.axes, keepdims=keepdim)

    def backward(self, g):
        g = expand_back(g, self.shape, self.axes, self.keepdim)
        return xp_of(g).broadcast_to(g / g.dtype.type(self.n), self.shape)


class Max(Op):
    """Max over dims; ties share the gradient equally (as torch.amax)."""

    def forward(self, x, dim=None, keepdim=False):
        if x.size == 0:
            raise ValueError("max() of an empty tensor")
        self.axes = normalize_dims(dim, x.ndim, self.name.lower())
        self.keepdim = keepdim
        y = x.max(axis=self.axes, keepdims=True)
        self.save(x, y)
        return y if keepdim else y.reshape([s for i, s in enumerate(y.shape) if i not in self.axes])

    def backward(self, g):
        x, y = (a.array if is_tensor(a) else a for a in self.saved)  # the ties carry no gradient
        g = expand_back(g, x.shape, self.axes, self.keepdim)
        hit = x == y
        count = hit.sum(axis=self.axes, keepdims=True).astype(g.dtype)
        return g * hit / count
