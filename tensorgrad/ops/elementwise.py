"""Elementwise ops: arithmetic with broadcasting, exp / log / sqrt / tanh / abs / relu /
sigmoid, where / masked_fill, and casts. (clamp, maximum, sin, ... are in ``more_math.py``.)

Binary ops accept a Python scalar as either operand; it keeps the tensor's
dtype (NumPy's weak scalar promotion), so float32 stays float32.

Imports: ..autograd, ..devices.
"""

from __future__ import annotations

from ..autograd import Op, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import BFLOAT16, errstate, get_array_module


def _shape(a):
    return getattr(a, "shape", ())


def _data(a):
    """The array of a saved value (a Tensor under create_graph), for masks and comparisons."""
    return a.array if is_tensor(a) else a


def _broadcastable(sx, sy) -> bool:
    for a, b in zip(reversed(sx), reversed(sy)):
        if a != b and a != 1 and b != 1:
            return False
    return True


def _check_broadcast(op: str, x, y):
    sx, sy = _shape(x), _shape(y)
    if not _broadcastable(sx, sy):
        raise ValueError(f"{op}: shapes {tuple(sx)} and {tuple(sy)} cannot be broadcast together")


def _float_of(x, y):
    """An integer or bool array meeting a float array takes the float's dtype, as in PyTorch
    (NumPy would make int64 × float32 float64)."""
    kx, ky = getattr(x, "dtype", None), getattr(y, "dtype", None)
    if kx is not None and ky is not None and (kx.kind == "f") != (ky.kind == "f"):
        if kx.kind == "f":
            return x, y.astype(kx)
        return x.astype(ky), y
    return x, y


class BinaryOp(Op):
    """Base of the broadcasting binary ops: checks that the shapes broadcast, gives an integer
    operand a float operand's dtype, then runs ``compute``; ``reduce`` sums each gradient back
    to its operand's shape."""

    def forward(self, x, y):
        self.sx = sx = getattr(x, "shape", ())
        self.sy = sy = getattr(y, "shape", ())
        # equal shapes, and scalars, always broadcast: asked first, as self.name is slow
        if sx != sy and sx and sy and not _broadcastable(sx, sy):
            _check_broadcast(self.name.lower(), x, y)
        return self.compute(*_float_of(x, y))

    def reduce(self, gx, gy):
        return (
            None if gx is None else unbroadcast(gx, self.sx),
            None if gy is None else unbroadcast(gy, self.sy),
        )


class Add(BinaryOp):
    def compute(self, x, y):
        return x + y

    def backward(self, g):
        nx, ny = self.needs_input_grad  # x + 0.5: no sum over g for the constant
        return self.reduce(g if nx else None, g if ny else None)


class Sub(BinaryOp):
    def compute(self, x, y):
        return x - y

    def backward(self, g):
        nx, ny = self.needs_input_grad
        return self.reduce(g if nx else None, -g if ny else None)


class Mul(BinaryOp):
    def compute(self, x, y):
        nx, ny = self.needs_input_grad
        self.save(x if ny else None, y if nx else None)  # only what a wanted gradient reads
        return x * y

    def backward(self, g):
        x, y = self.saved
        nx, ny = self.needs_input_grad
        return self.reduce(g * y if nx else None, g * x if ny else None)


class Div(BinaryOp):
    def compute(self, x, y):
        self.save(x if self.needs_input_grad[1] else None, y)
        return x / y

    def backward(self, g):
        x, y = self.saved
        nx, ny = self.needs_input_grad
        gx = g / y
        return self.reduce(gx if nx else None, -gx * x / y if ny else None)


class Pow(BinaryOp):
    """x ** y; the gradient for y uses log(x) and is only formed when y needs it."""

    def compute(self, x, y):
        # x ** 3 by products: the tanh GELU's cube, where NumPy's float32 pow is ~1000x slower
        out = x * x * x if isinstance(y, (int, float)) and y == 3 else x**y
        self.save(x, y, out)
        return out

    def backward(self, g):
        x, y, out = self.saved
        xp = xp_of(g)
        if isinstance(y, (int, float)):
            gx = g * y * x ** (y - 1) if y != 2 else g * 2 * x
            return self.reduce(gx, None)
        gx = g * y * x ** (y - 1)
        with errstate(get_array_module(), divide="ignore", invalid="ignore"):
            # a Python-scalar base makes a float64 0-d array here: keep g's dtype
            gy = g * out * xp.log(xp.where(_data(x) > 0, x, 1)).astype(g.dtype)
        return self.reduce(gx, gy)


class Neg(Op):
    def forward(self, x):
        return -x

    def backward(self, g):
        return -g


class Exp(Op):
    def forward(self, x):
        y = get_array_module(x).exp(x)
        self.save(y)
        return y

    def backward(self, g):
        return g * self.saved[0]


class Log(Op):
    def forward(self, x):
        self.save(x)
        return get_array_module(x).log(x)

    def backward(self, g):
        return g / self.saved[0]


class Sqrt(Op):
    def forward(self, x):
        y = get_array_module(x).sqrt(x)
        self.save(y)
        return y

    def backward(self, g):
        return g / (2 * self.saved[0])


class Tanh(Op):
    def forward(self, x):
        y = get_array_module(x).tanh(x)
        self.save(y)
        return y

    def backward(self, g):
        y = self.saved[0]
        return g * (1 - y * y)


class Abs(Op):
    def forward(self, x):
        self.save(x)
        return get_array_module(x).abs(x)

    def backward(self, g):
        return g * xp_of(g).sign(self.saved[0])


class Relu(Op):
    def forward(self, x):
        y = get_array_module(x).maximum(x, 0)
        self.save(y)
        return y

    def backward(self, g):
        return g * (_data(self.saved[0]) > 0).astype(g.dtype)


class Sigmoid(Op):
    def forward(self, x):
        xp = get_array_module(x)
        # overflow-free, and accurate for large negative x (where 0.5·(tanh(x/2) + 1) cancels to 0)
        e = xp.exp(-xp.abs(x))
        y = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))
        self.save(y)
        return y

    def backward(self, g):
        y = self.saved[0]
        return g * y * (1 - y)


class Where(Op):
    """where(cond, x, y): the gradient goes to x where cond holds, to y elsewhere."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, cond, x, y):
        xp = get_array_module(cond, x, y)
        self.save(cond)
        self.sx, self.sy = _shape(x), _shape(y)
        return xp.where(cond, x, y)

    def backward(self, g):
        xp = xp_of(g)
        cond = _data(self.saved[0])
        zero = g.dtype.type(0)
        gx = unbroadcast(xp.where(cond, g, zero), self.sx)
        gy = unbroadcast(xp.where(cond, zero, g), self.sy)
        return None, gx, gy


class MaskedFill(Op):
    """x with ``value`` wherever the (broadcast) boolean mask is True."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x, mask, value):
        xp = get_array_module(x)
        _check_broadcast("masked_fill", x, mask)
        if mask.ndim > x.ndim or any(
            m != 1 and m != s for m, s in zip(reversed(mask.shape), reversed(x.shape))
        ):
            raise ValueError(
                f"masked_fill: mask of shape {tuple(mask.shape)} does not broadcast to the "
                f"tensor's shape {tuple(x.shape)}"
            )
        self.save(mask)
        return xp.where(mask, xp.asarray(value, dtype=x.dtype), x)

    def backward(self, g):
        return xp_of(g).where(_data(self.saved[0]), g.dtype.type(0), g), None, None


class Cast(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x, dtype):
        self.dtype_in = x.dtype
        if dtype is BFLOAT16 and x.dtype != "float32":  # as PyTorch's, through float32 (a
            x = x.astype("float32")  # float64 rounds twice: to float32, then to bfloat16)
        return x.astype(dtype)

    def backward(self, g):
        return g.astype(self.dtype_in), None
