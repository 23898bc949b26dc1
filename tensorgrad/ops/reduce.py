"""Reductions over ``dim`` (int, tuple or None; negative allowed) with ``keepdim``."""

from __future__ import annotations

from ..autograd import Function
from ..backend import errstate, get_array_module
from .dims import wrap_dims


def normalize_dims(dim, ndim: int, op: str = "reduce") -> tuple:
    """``dim`` as a sorted tuple of non-negative axes (PyTorch's range check)."""
    return tuple(sorted(wrap_dims(op, dim, ndim))) if ndim else ()


def _expand_back(g, shape, axes, keepdim):
    """Re-insert reduced axes so that ``g`` broadcasts against the input."""
    if not keepdim and axes:
        g = g.reshape([1 if i in axes else s for i, s in enumerate(shape)])
    return g


class Sum(Function):
    def forward(self, x, dim=None, keepdim=False):
        self.shape = x.shape
        self.axes = normalize_dims(dim, x.ndim, self.name.lower())
        self.keepdim = keepdim
        return x.sum(axis=self.axes, keepdims=keepdim)

    def backward(self, g):
        xp = get_array_module(g)
        g = _expand_back(g, self.shape, self.axes, self.keepdim)
        return xp.broadcast_to(g, self.shape)


class Mean(Function):
    def forward(self, x, dim=None, keepdim=False):
        self.shape = x.shape
        self.axes = normalize_dims(dim, x.ndim, self.name.lower())
        self.keepdim = keepdim
        self.n = 1
        for a in self.axes:
            self.n *= x.shape[a]
        return x.mean(axis=self.axes, keepdims=keepdim)

    def backward(self, g):
        xp = get_array_module(g)
        g = _expand_back(g, self.shape, self.axes, self.keepdim)
        return xp.broadcast_to(g / g.dtype.type(self.n), self.shape)


class Var(Function):
    """Variance with ``correction`` (1 = unbiased, PyTorch's default)."""

    def forward(self, x, dim=None, keepdim=False, correction=1):
        xp = get_array_module(x)
        self.axes = normalize_dims(dim, x.ndim, self.name.lower())
        self.keepdim = keepdim
        n = 1
        for a in self.axes:
            n *= x.shape[a]
        self.denom = max(n - correction, 0)
        xc = x - x.mean(axis=self.axes, keepdims=True)
        self.save(xc)
        with errstate(xp, divide="ignore", invalid="ignore"):
            return (xc * xc).sum(axis=self.axes, keepdims=keepdim) / x.dtype.type(self.denom)

    def backward(self, g):
        (xc,) = self.saved
        g = _expand_back(g, xc.shape, self.axes, self.keepdim)
        return g * xc * (xc.dtype.type(2) / xc.dtype.type(self.denom))


class Max(Function):
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
        x, y = self.saved
        g = _expand_back(g, x.shape, self.axes, self.keepdim)
        hit = x == y
        count = hit.sum(axis=self.axes, keepdims=True).astype(g.dtype)
        return g * hit / count


class Cumsum(Function):
    """Running sum along ``dim``;  the gradient is the reversed running sum of g."""

    def forward(self, x, dim):
        self.dim = dim
        return get_array_module(x).cumsum(x, axis=dim, dtype=x.dtype)

    def backward(self, g):
        xp = get_array_module(g)
        return xp.flip(xp.cumsum(xp.flip(g, self.dim), axis=self.dim), self.dim), None
