"""More elementwise and shape ops: sin, cos, the piecewise-constant ones (sign, floor, ceil,
round: gradient 0, as PyTorch), flip, and prod."""

from __future__ import annotations

from ..autograd import Function
from ..backend import get_array_module


class Sin(Function):
    def forward(self, x):
        self.save(x)
        return get_array_module(x).sin(x)

    def backward(self, g):
        (x,) = self.saved
        return g * get_array_module(g).cos(x)


class Cos(Function):
    def forward(self, x):
        self.save(x)
        return get_array_module(x).cos(x)

    def backward(self, g):
        (x,) = self.saved
        return -g * get_array_module(g).sin(x)


class Stepwise(Function):
    """sign, floor, ceil or round (``fn``): flat almost everywhere, so the gradient is 0."""

    def forward(self, x, fn, decimals=0):
        xp = get_array_module(x)
        return xp.round(x, decimals) if fn == "round" else getattr(xp, fn)(x)

    def backward(self, g):
        return get_array_module(g).zeros_like(g)


class Flip(Function):
    def forward(self, x, dims):
        self.dims = dims
        return get_array_module(x).flip(x, dims).copy()

    def backward(self, g):
        return get_array_module(g).flip(g, self.dims), None


class Prod(Function):
    """Product along ``dim`` (every element when None); ∂x_i = g·(product of the others),
    from exclusive running products (right for zeros too)."""

    def forward(self, x, dim=None, keepdim=False):
        xp = get_array_module(x)
        self.shape, self.dim, self.keepdim = x.shape, dim, keepdim
        a = x.reshape(-1) if dim is None else xp.moveaxis(x, dim, -1)
        self.save(a)
        out = a.prod(axis=-1)
        if dim is not None and keepdim:
            out = xp.expand_dims(out, dim)
        return out

    def backward(self, g):
        (a,) = self.saved
        xp = get_array_module(g)
        ones = xp.ones(a.shape[:-1] + (1,), dtype=a.dtype)
        left = xp.cumprod(xp.concatenate([ones, a[..., :-1]], axis=-1), axis=-1)
        right = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(a, -1)[..., :-1]], -1), -1), -1)
        if self.dim is not None and self.keepdim:
            g = xp.squeeze(g, self.dim)
        gx = xp.asarray(g)[..., None] * left * right
        if self.dim is None:
            return gx.reshape(self.shape)
        return xp.moveaxis(gx, -1, self.dim)
