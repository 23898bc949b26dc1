"""More elementwise and shape ops: sin, cos, log10, log2, the piecewise-constant ones (sign,
floor, ceil, round: gradient 0, as PyTorch), flip, roll, and prod. Backward is written against ``xp_of(g)``, so
it records a graph under ``create_graph=True`` (see ops/tensor_xp.py)."""

from __future__ import annotations

import math

from ..autograd import Op, xp_of
from ..autograd.graph import is_tensor
from ..devices import get_array_module
from .dims import wrap_dim


class Sin(Op):
    def forward(self, x):
        self.save(x)
        return get_array_module(x).sin(x)

    def backward(self, g):
        (x,) = self.saved
        return g * xp_of(g, x).cos(x)


class Cos(Op):
    def forward(self, x):
        self.save(x)
        return get_array_module(x).cos(x)

    def backward(self, g):
        (x,) = self.saved
        return -g * xp_of(g, x).sin(x)


def _correctly_rounded(fn, x):
    """fn(x) through float64: NumPy's float32 log10 and log2 are an ulp off for many inputs
    (log10(1000) = 3.0000002); rounded from float64 they agree with PyTorch's. Integers give
    float32, as PyTorch."""
    if x.dtype.kind != "f":
        return fn(x.astype("float64")).astype("float32")
    return fn(x.astype("float64")).astype(x.dtype) if x.dtype.itemsize < 8 else fn(x)


class Log10(Op):
    def forward(self, x):
        self.save(x)
        return _correctly_rounded(get_array_module(x).log10, x)

    def backward(self, g):
        return g / (self.saved[0] * math.log(10.0))


class Log2(Op):
    def forward(self, x):
        self.save(x)
        return _correctly_rounded(get_array_module(x).log2, x)

    def backward(self, g):
        return g / (self.saved[0] * math.log(2.0))


class Stepwise(Op):
    """sign, floor, ceil or round (``fn``): flat almost everywhere, so the gradient is 0."""

    def forward(self, x, fn, decimals=0):
        xp = get_array_module(x)
        return xp.round(x, decimals) if fn == "round" else getattr(xp, fn)(x)

    def backward(self, g):
        return xp_of(g).zeros_like(g)


class Flip(Op):
    def forward(self, x, dims):
        self.dims = dims
        return get_array_module(x).flip(x, dims).copy()

    def backward(self, g):
        return xp_of(g).flip(g, self.dims), None


class Roll(Op):
    """Elements shifted ``shifts`` places along ``dims``, wrapping around (dims None: along the
    flattened array, the shape kept); the gradient is g shifted back."""

    def forward(self, x, shifts, dims):
        self.shifts, self.dims = shifts, dims
        return get_array_module(x).roll(x, shifts, dims)

    def backward(self, g):
        back = tuple(-s for s in self.shifts) if self.dims is not None else -self.shifts
        return xp_of(g).roll(g, back, self.dims)


def roll(x, shifts, dims=None):
    """torch.roll: ``shifts`` and ``dims`` ints or tuples of equal length; dims None rolls the
    flattened tensor (one shift) and keeps its shape."""
    shifts = tuple(int(s) for s in shifts) if isinstance(shifts, (tuple, list)) else (int(shifts),)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(
                f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims: 0"
            )
        return Roll.apply(x, shifts=shifts[0], dims=None)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims):
        raise RuntimeError(
            f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims: {len(dims)}"
        )
    return Roll.apply(x, shifts=shifts, dims=tuple(wrap_dim("roll", d, x.ndim) for d in dims))


class Prod(Op):
    """Product along ``dim`` (every element when None); ∂x_i = g·(product of the others),
    from exclusive running products (right for zeros too)."""

    def forward(self, x, dim=None, keepdim=False):
        xp = get_array_module(x)
        self.shape, self.dim, self.keepdim = x.shape, dim, keepdim
        self.save(x)
        a = x.reshape(-1) if dim is None else xp.moveaxis(x, dim, -1)
        out = a.prod(axis=-1)
        if dim is not None and keepdim:
            out = xp.expand_dims(out, dim)
        return out

    def backward(self, g):
        (x,) = self.saved
        xp = xp_of(g, x)
        a = xp.reshape(x, (-1,)) if self.dim is None else xp.moveaxis(x, self.dim, -1)
        g = xp.reshape(g, a.shape[:-1] + (1,))  # the product's gradient, one per row
        gx = g * others_product(a)
        if self.dim is None:
            return xp.reshape(gx, self.shape)
        return xp.moveaxis(gx, -1, self.dim)


def others_product(a):
    """For each i along the last axis, the product of every other element (zeros included).
    On arrays: exclusive running products from both ends; on Tensors (a recorded backward):
    the product of each row with element i set to 1, through Prod itself, so that it can be
    differentiated again."""
    if is_tensor(a):
        xp, raw = xp_of(a), get_array_module(a.array)
        n = a.shape[-1]
        eye = raw.eye(n, dtype=bool)  # (n, n): row i marks element i
        rows = xp.where(eye, a.dtype.type(1), xp.reshape(a, a.shape[:-1] + (1, n)))
        return Prod.apply(rows, dim=-1)
    xp = get_array_module(a)
    ones = xp.ones(a.shape[:-1] + (1,), dtype=a.dtype)
    left = xp.cumprod(xp.concatenate([ones, a[..., :-1]], axis=-1), axis=-1)
    right = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(a, -1)[..., :-1]], -1), -1), -1)
    return left * right
