"""PyTorch's other Tensor methods: the ones a GPT does not use, kept apart so that the core
``tensor.py`` reads short. More math (sin, clamp, var, norm, cumsum, ...), more shapes
(flip, roll, unflatten, *_as), conversions (half, bfloat16, double, pin_memory), ``new_*``
and ``__format__``. Each is a call into an op or a composition of Tensor methods, as in
``tensor.py``; a reader of the core can skip this file.

Imports: numpy, .devices, .ops, .tensor_select, .types.
"""

from __future__ import annotations

import numpy as np

from .devices import xp_for
from .ops import more_math as M
from .ops import more_shape as MS
from .ops.dims import size_args, wrap_dim, wrap_dims
from .ops.nn import LogSoftmax
from .tensor_select import Select
from .types import as_dtype, bfloat16


class Extras(Select):
    """The Tensor methods beyond the core's (Tensor's base class: tensor.py lists the rest)."""

    __slots__ = ()

    def element_size(self) -> int:
        return int(self._array.dtype.itemsize)

    def __format__(self, spec: str) -> str:
        """f"{loss:.4f}" formats a one-element tensor's value, as PyTorch."""
        if self.ndim == 0:
            return format(self.item(), spec)
        if spec:
            raise TypeError(
                f"unsupported format string {spec!r} passed to Tensor.__format__ "
                f"(a tensor of shape {tuple(self.shape)}); format .item() or a 0-d "
                "tensor"
            )
        return repr(self)

    def pin_memory(self):
        return self  # host arrays need no pinning here; kept so data loaders port unchanged

    def double(self):
        return self.astype(np.float64)

    def half(self):
        return self.astype(np.float16)

    def bfloat16(self):
        return self.astype(bfloat16)

    def _new_full(self, size, value, dtype, device, requires_grad):
        xp = xp_for(device or self.device)
        t = self._leaf(xp.full(size_args(size), value, dtype=as_dtype(dtype or self.dtype).dtype))
        t.requires_grad = requires_grad
        return t

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        """A tensor of zeros with self's dtype and device (unless given)."""
        return self._new_full(size, 0, dtype, device, requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return self._new_full(size, 1, dtype, device, requires_grad)

    new_empty = new_zeros

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        return self._new_full((size,), fill_value, dtype, device, requires_grad)

    def maximum(self, other):
        return self._binary(M.Maximum, other)

    def minimum(self, other):
        return self._binary(M.Minimum, other)

    sin = lambda self: M.Sin.apply(self._floating())  # noqa: E731

    cos = lambda self: M.Cos.apply(self._floating())  # noqa: E731

    log10 = lambda self: M.Log10.apply(self)  # noqa: E731

    log2 = lambda self: M.Log2.apply(self)  # noqa: E731

    roll = lambda self, shifts, dims=None: MS.roll(self, shifts, dims)  # noqa: E731

    sign = lambda self: M.Stepwise.apply(self, fn="sign")  # noqa: E731

    floor = lambda self: M.Stepwise.apply(self, fn="floor")  # noqa: E731

    ceil = lambda self: M.Stepwise.apply(self, fn="ceil")  # noqa: E731

    round = lambda self, decimals=0: M.Stepwise.apply(self, fn="round", decimals=decimals)  # noqa: E731

    def flip(self, *dims):
        return MS.Flip.apply(self, wrap_dims("flip", size_args(dims), self.ndim))

    def mm(self, o):
        if self.ndim != 2 or getattr(o, "ndim", 0) != 2:
            raise RuntimeError("mm: both arguments must be 2-D matrices")
        return self @ o

    def dot(self, o):
        if self.ndim != 1 or getattr(o, "ndim", 0) != 1:
            raise RuntimeError("1D tensors expected, but got other shapes (dot)")
        return self @ o

    def outer(self, o):
        return self.unsqueeze(1) * o.unsqueeze(0)

    def nan_to_num(self, nan: float = 0.0, posinf=None, neginf=None):
        """NaN, +inf and -inf replaced (by 0 and the dtype's largest/smallest finite values by
        default); the gradient flows where self was finite."""
        info = np.finfo(self.dtype)
        out = self.where(~self.isnan(), nan).where(self != np.inf, posinf or info.max)
        return out.where(self != -np.inf, info.min if neginf is None else neginf)

    def rsqrt(self):
        return self.sqrt() ** -1

    def square(self):
        return self * self

    def clamp(self, min=None, max=None):
        """Elementwise clip to [min, max] (either may be None); gradient 1 inside, 0 outside."""
        if min is None and max is None:
            raise RuntimeError("clamp: at least one of 'min' or 'max' must not be None")
        float_bound = any(
            isinstance(b, float) or getattr(b, "dtype", np.dtype(int)).kind == "f"
            for b in (min, max)
        )
        x = self.float() if float_bound and self.dtype.kind != "f" else self  # as promotion
        # tensor bounds stay tensors: they may require grad (each gets its gradient)
        return M.Clamp.apply(x, min, max)

    clip = clamp

    def prod(self, dim=None, keepdim: bool = False, dtype=None, *, keepdims=False):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind in "biu":
            x = x.astype(np.int64)
        d = None if dim is None else wrap_dim("prod", dim, self.ndim)
        return M.Prod.apply(x, dim=d, keepdim=keepdim or keepdims)

    def logsumexp(self, dim, keepdim: bool = False, *, keepdims=False):
        """log(sum(exp(x))) along ``dim``, shifted by the max so large values stay finite."""
        m = self.detach().amax(dim, keepdim=True)
        m = m.where(m.isfinite(), 0.0)
        out = (self - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim or keepdims else out.squeeze(dim)

    def var(self, dim=None, keepdim=False, unbiased=True, correction=None, *, keepdims=False):
        """Variance; ``correction`` (or ``unbiased``) 1 divides by n-1 as PyTorch, 0 by n."""
        c = (1 if unbiased else 0) if correction is None else correction
        return M.Var.apply(self, dim=dim, keepdim=keepdim or keepdims, correction=c)

    def std(self, dim=None, keepdim=False, unbiased=True, correction=None, *, keepdims=False):
        return self.var(dim, keepdim or keepdims, unbiased, correction).sqrt()

    def norm(self, p=2, dim=None, keepdim: bool = False):
        """The p-norm over ``dim`` (every element by default; 'fro' is 2, inf the max |x|)."""
        if p == "fro" or p == 2:
            return (self * self).sum(dim, keepdim).sqrt()
        if p == float("inf"):
            return self.abs().amax(dim, keepdim)
        if p == 1:
            return self.abs().sum(dim, keepdim)
        return (self.abs() ** p).sum(dim, keepdim) ** (1.0 / p)

    def amin(self, dim=None, keepdim: bool = False, _op: str = "amin", *, keepdims=False):
        return -(-self).amax(self._dims(_op, dim), keepdim or keepdims)

    def cumsum(self, dim: int, dtype=None):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind in "biu":
            x = x.astype(np.int64)
        return M.Cumsum.apply(x, wrap_dim("cumsum", dim, self.ndim))

    def log_softmax(self, dim: int = -1):
        return LogSoftmax.apply(self, dim=wrap_dim("log_softmax", dim, self.ndim))

    def view_as(self, other):
        return self.view(other.shape)

    def reshape_as(self, other):
        return self.reshape(other.shape)

    def unflatten(self, dim: int, sizes):
        d = wrap_dim("unflatten", dim, self.ndim)
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1 :])

    def expand_as(self, other):
        return self.expand(other.shape)
