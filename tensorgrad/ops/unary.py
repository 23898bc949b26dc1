"""More elementwise and shape ops: sin, cos, the piecewise-constant ones (sign, floor, ceil,
round: gradient 0, as PyTorch), flip, and prod. Backward is written against ``xp_of(g)``, so
it records a graph under ``create_graph=True`` (see ops/tensor_xp.py)."""

from __future__ import annotations

from ..autograd import Op, xp_of
from ..autograd.graph import is_tensor
from ..backend import get_array_module


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
