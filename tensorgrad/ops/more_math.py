"""The pointwise and reduction ops beyond the GPT's: sin, cos, log10, log2, the
piecewise-constant ones (sign, floor, ceil, round: gradient 0, as PyTorch), clamp, maximum /
minimum, var, cumsum, prod, and einsum; and comparisons and logic (==, <, &, ~, isnan: no
gradient, ``Compare`` and ``Predicate``). Each is one reference ``Op`` with its backward, as in
the core files; Tensor methods and ``tensorgrad.einsum`` apply them. Backward is written
against ``xp_of(g)``, so it records a graph under ``create_graph=True`` (see ops/tensor_xp.py).

Imports: math, operator, .elementwise, .reduce, ..autograd, ..devices.
"""

from __future__ import annotations

import math
import operator

from ..autograd import Op, no_grad, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import errstate, get_array_module
from .elementwise import BinaryOp
from .reduce import expand_back, normalize_dims


def _shape(a):
    return getattr(a, "shape", ())


def _data(a):
    """The array of a saved value (a Tensor under create_graph), for masks and comparisons."""
    return a.array if is_tensor(a) else a


# ----------------------------------------------------------------------------- pointwise


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


class Clamp(Op):
    """clip(x, lo, hi) (either bound None, a number or an array that broadcasts); the
    gradient reaches x where lo <= x <= hi, lo where x < lo < hi, and hi where x > hi or
    hi < lo (the output is hi there), as torch.clamp's."""

    def forward(self, x, lo=None, hi=None):
        xp = get_array_module(x)
        self.save(x, lo, hi)
        self.shapes = (_shape(x), _shape(lo), _shape(hi))
        self.dtypes = tuple(getattr(b, "dtype", None) for b in (lo, hi))
        y = x
        if lo is not None:
            y = xp.maximum(y, xp.asarray(lo, dtype=x.dtype))
        if hi is not None:
            y = xp.minimum(y, xp.asarray(hi, dtype=x.dtype))
        return y

    def backward(self, g):
        x, lo, hi = (_data(a) for a in self.saved)
        sx, slo, shi = self.shapes
        keep = x == x  # False only at NaN
        if lo is not None:
            keep = keep & (x >= lo)
        if hi is not None:
            keep = keep & (x <= hi)
        gx = unbroadcast(g * keep.astype(g.dtype), sx)
        glo = ghi = None
        if self.needs_input_grad[1]:
            to_lo = (x < lo) & (lo < hi) if hi is not None else x < lo
            glo = unbroadcast(g * to_lo.astype(g.dtype), slo).astype(self.dtypes[0])
        if self.needs_input_grad[2]:
            to_hi = (x > hi) | (hi < lo) if lo is not None else x > hi
            ghi = unbroadcast(g * to_hi.astype(g.dtype), shi).astype(self.dtypes[1])
        return gx, glo, ghi


def _gt(a, b):
    return a > b


def _lt(a, b):
    return a < b


def _split_ties(g, x, y, x_wins, y_wins):
    x, y = _data(x), _data(y)
    half = (x == y).astype(g.dtype) * g.dtype.type(0.5)
    return g * (x_wins(x, y).astype(g.dtype) + half), g * (y_wins(x, y).astype(g.dtype) + half)


class Maximum(BinaryOp):
    """max(x, y) elementwise; at ties each input gets half the gradient (as torch.maximum)."""

    def compute(self, x, y):
        self.save(x, y)
        return get_array_module(x, y).maximum(x, y)

    def backward(self, g):
        x, y = self.saved
        return self.reduce(*_split_ties(g, x, y, _gt, _lt))


class Minimum(BinaryOp):
    """min(x, y) elementwise; at ties each input gets half the gradient (as torch.minimum)."""

    def compute(self, x, y):
        self.save(x, y)
        return get_array_module(x, y).minimum(x, y)

    def backward(self, g):
        x, y = self.saved
        return self.reduce(*_split_ties(g, x, y, _lt, _gt))


# ----------------------------------------------------------------------------- reductions


class Var(Op):
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
        self.save(x)
        with errstate(xp, divide="ignore", invalid="ignore"):
            return (xc * xc).sum(axis=self.axes, keepdims=keepdim) / x.dtype.type(self.denom)

    def backward(self, g):
        (x,) = self.saved
        xc = x - xp_of(x).mean(x, axis=self.axes, keepdims=True)
        g = expand_back(g, x.shape, self.axes, self.keepdim)
        with errstate(get_array_module(), divide="ignore", invalid="ignore"):
            return g * xc * (x.dtype.type(2) / x.dtype.type(self.denom))


class Cumsum(Op):
    """Running sum along ``dim``;  the gradient is the reversed running sum of g."""

    def forward(self, x, dim):
        self.dim = dim
        return get_array_module(x).cumsum(x, axis=dim, dtype=x.dtype)

    def backward(self, g):
        xp = xp_of(g)
        return xp.flip(xp.cumsum(xp.flip(g, self.dim), axis=self.dim), self.dim), None


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


# ----------------------------------------------------------------------------- einsum


def _einsum_spec(equation: str, ndims) -> tuple:
    """(input subscripts, output subscript) with '...' spelled out as letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ndims):
        raise ValueError(f"einsum: {equation!r} names {len(ins)} operands, got {len(ndims)}")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    n_ell = max(
        (nd - len(s.replace("...", "")) for s, nd in zip(ins, ndims) if "..." in s), default=0
    )
    ell = "".join(spare[:n_ell])
    ins = [
        s.replace("...", ell[len(ell) - (nd - len(s.replace("...", ""))) :])
        for s, nd in zip(ins, ndims)
    ]
    if not arrow:  # implicit output: the letters seen once, sorted, after the ellipsis dims
        letters = "".join(ins)
        rhs = ell + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
        )
    else:
        rhs = rhs.replace("...", ell)
    for s, nd in zip(ins, ndims):
        if len(s) != nd:
            raise ValueError(f"einsum: subscript {s!r} does not match an operand with {nd} dims")
        if len(set(s)) != len(s):
            raise ValueError(f"einsum: repeated subscript in {s!r} (diagonals) is not supported")
    return ins, rhs


class Einsum(Op):
    """xp.einsum; the gradient of each operand is the einsum of g with the others."""

    def forward(self, *xs, equation):
        xp = get_array_module(*xs)
        self.ins, self.out = _einsum_spec(equation, [x.ndim for x in xs])
        self.save(*xs)
        spec = ",".join(self.ins) + "->" + self.out
        return xp.einsum(spec, *xs)

    def backward(self, g):
        xs = self.saved
        xp = xp_of(g, *xs)
        gxs = []
        for i, (x, s) in enumerate(zip(xs, self.ins)):
            if not self.needs_input_grad[i]:
                gxs.append(None)
                continue
            others = [(xs[j], self.ins[j]) for j in range(len(xs)) if j != i]
            seen = set(self.out).union(*[set(o) for _, o in others])
            kept = "".join(c for c in s if c in seen)  # letters summed in x alone broadcast back
            spec = ",".join([self.out] + [o for _, o in others]) + "->" + kept
            gk = xp.einsum(spec, g, *[a for a, _ in others])
            shape = [x.shape[k] if c in seen else 1 for k, c in enumerate(s)]
            gk = xp.broadcast_to(xp.reshape(gk, shape), x.shape)
            gxs.append(gk if gk.dtype == x.dtype else gk.astype(x.dtype))
        return tuple(gxs)


# ----------------------------------------------------------------------------- comparisons


class NoGradient(Op):
    """Base of the ops whose results carry no gradient (comparisons, logic, isnan), as in
    PyTorch: never a node of the graph, whatever their inputs require. Tensor applies them as
    ops while a compile trace watches its thread, so that the trace records them and replays
    them on each call's values; otherwise it calls ``compute`` on the arrays (nothing to
    record, no op's overhead)."""

    @classmethod
    def apply(cls, *inputs, **kwargs):
        with no_grad():  # nothing records it: its outputs are leaves without grad
            return super().apply(*inputs, **kwargs)

    def backward(self, *grads):  # pragma: no cover - never recorded
        raise RuntimeError(f"{type(self).__name__} has no gradient")


# Compare's ``fn``: the operator it applies (``&``, ``|`` and ``^`` are bitwise: integers give
# integers, booleans booleans), or the name of the array module's function (logical_*)
COMPARISONS = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "logical_xor": "logical_xor",
}
PREDICATES = ("invert", "logical_not", "isnan", "isinf", "isfinite")  # Predicate's fn


class Compare(NoGradient):
    """x ``fn`` y (``COMPARISONS``: ==, !=, <, <=, >, >=, &, |, ^, logical_and/or/xor), both
    cast to ``dtype`` first (their PyTorch result type: an int tensor < 0.5 compares floats,
    float32 == a float64 0-d tensor compares in float32); y may be a Python number."""

    @staticmethod
    def compute(x, y, fn, dtype):
        a = x.astype(dtype, copy=False)
        b = y.astype(dtype, copy=False) if hasattr(y, "dtype") else y
        f = COMPARISONS[fn]
        return getattr(get_array_module(a), f)(a, b) if isinstance(f, str) else f(a, b)

    def forward(self, x, y, fn, dtype):
        return Compare.compute(x, y, fn, dtype)


class Predicate(NoGradient):
    """``fn`` of x, elementwise (``PREDICATES``: ~x, logical_not, isnan, isinf, isfinite)."""

    @staticmethod
    def compute(x, fn):
        if fn not in PREDICATES:
            raise ValueError(f"Predicate: unknown fn {fn!r}")
        return ~x if fn == "invert" else getattr(get_array_module(x), fn)(x)

    def forward(self, x, fn):
        return Predicate.compute(x, fn)
