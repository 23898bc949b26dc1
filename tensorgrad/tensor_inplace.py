"""In-place writes and views: how ``x += y``, ``x[k] = v``, ``fill_`` and friends change a
tensor's memory, and how views that share that memory stay consistent.

``InPlace`` is a base class of ``Tensor`` holding these methods, so that tensor.py reads as the
operators a learner needs first. Views (slices, view, transpose, split, ...) that really share
their base's memory share its version counter and remember the base and how to find their region
in it (tensor.py's ``Tensor._view_of`` marks them, with a region function from the end of this
file). So, as in PyTorch, an in-place write through a view of a leaf that requires grad raises,
and one into any other tensor in the graph (or a view of it) is recorded: the base takes a
WriteView node and its views ReadView nodes of it (``ops/more_shape.py``).

Imports: numpy, .autograd, .devices, .indexing, .ops.
"""

from __future__ import annotations

import numpy as np

from .autograd import is_grad_enabled
from .autograd.graph import apply_hooks
from .devices import (
    BFLOAT16,
    device_of,
    get_array_module,
    is_array,
    parse_device,
    rng,
    to_device,
    xp_for,
)
from .indexing import index_steps
from .ops import elementwise as E
from .ops import more_shape as MS
from .ops import shape as shape_ops
from .ops.dims import wrap_dim


def as_array(x, dtype=None, device=None):
    """The backend array behind ``x`` (a Tensor, an array, a list or a scalar)."""
    if isinstance(x, InPlace):
        return x.array
    if device is not None and parse_device(device) == "cuda":
        return xp_for("cuda").asarray(x, dtype=dtype)
    if device_of(x) != "cpu":  # already a GPU array (CuPy, or a registered stand-in)
        return x if dtype is None else x.astype(dtype, copy=False)
    if dtype is not None and np.dtype(dtype) is BFLOAT16:  # as PyTorch's, through float32
        x = np.asarray(x, dtype=np.float32)
    return np.asarray(x, dtype=dtype)


def storable(value):
    """``value`` if a Tensor can hold it (a NumPy or CuPy array; a NumPy scalar becomes a
    0-d array); else PyTorch's TypeError."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if not is_array(value):
        raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
    return value


def tracked(value) -> bool:
    """Whether a fill value is a tensor whose gradient must be recorded."""
    return isinstance(value, InPlace) and value.requires_grad and is_grad_enabled()


def scalar_value(op: str, value):
    """A fill value tensor, which must be 0-d (as PyTorch's)."""
    if value.ndim:
        raise RuntimeError(
            f"{op} only supports a 0-dimensional value tensor, but got tensor with "
            f"{value.ndim} dimension(s)"
        )
    return value


# the ufunc of each arithmetic op that InPlace._direct may run into a tensor's own memory
_UFUNCS = {E.Add: np.add, E.Sub: np.subtract, E.Mul: np.multiply, E.Div: np.divide}


class InPlace:
    """Tensor's in-place and view methods (Tensor subclasses this; it adds no state)."""

    __slots__ = ()

    def _check_inplace(self, op: str):
        """PyTorch's rule for writing into this tensor's memory while recording: not into a leaf
        that requires grad, nor through a view of one (its .grad would be of other values)."""
        if not is_grad_enabled():
            return
        if self.requires_grad and self._node is None:
            raise RuntimeError(
                f"{op}: a leaf tensor that requires grad is used in an in-place operation; "
                "wrap it in `with tg.no_grad():` or use an out-of-place op"
            )
        base = self._base
        if base is not None and base.requires_grad and base._node is None:
            raise RuntimeError(
                f"{op}: a view of a leaf tensor that requires grad is used in an in-place "
                "operation; wrap it in `with tg.no_grad():` or use an out-of-place op"
            )

    def _written(self):
        self._version[0] += 1

    def _inplace(self, cls, other, op: str, true_divide=False):
        """x op= y: write the result into x's array, bump its version, adopt the new node."""
        self._check_inplace(op)
        if self._direct(cls, other):
            b = other._array if isinstance(other, InPlace) else float(other)
            _UFUNCS[cls](self._array, b, out=self._array)
            self._written()
            return self
        return self._adopt(op, self._binary(cls, other, true_divide=true_divide))

    def _direct(self, cls, other) -> bool:
        """Whether ``x op= other`` can be one NumPy ufunc writing into x's memory, with the
        same result as the general path: nothing to record, a float tensor, and a Python
        number or a tensor of x's dtype and shape (the lectures' ``p.data += -lr * p.grad``:
        no new array, no copy)."""
        a = self._array
        if cls not in _UFUNCS or type(a) is not np.ndarray or a.dtype.kind != "f":
            return False
        if apply_hooks:  # a tool watching the ops (a trace, gpt-explain) sees the op run
            return False
        if isinstance(other, InPlace):
            o = other._array
            if type(o) is not np.ndarray or o.dtype != a.dtype or o.shape != a.shape:
                return False
            recorded = other._requires_grad
        elif type(other) is float or type(other) is int:  # not bool: it promotes otherwise
            recorded = False
        else:
            return False
        if not is_grad_enabled():
            return True
        base = self._base
        return not (recorded or self._requires_grad or (base is not None and base.requires_grad))

    def _adopt(self, op: str, r: InPlace) -> InPlace:
        """Write the out-of-place result r into self's memory and take over r's graph node,
        so that later ops (and backward) see self as the result."""
        a, ra = self._array, r._array  # the arrays' shapes and dtypes: cheaper than the Tensor's
        if ra.shape != a.shape:
            raise RuntimeError(
                f"{op}: result shape {tuple(r.shape)} does not fit the tensor's shape {tuple(self.shape)}"
            )
        if r.dtype.kind == "f" and self.dtype.kind != "f":  # (bfloat16 is NumPy kind 'V')
            raise RuntimeError(
                f"{op}: result type {r.dtype} can't be cast to the desired output type {self.dtype}"
            )
        base = self._base
        if base is not None and is_grad_enabled() and (base.requires_grad or r.requires_grad):
            vf = self._view_fn
            return self._write_through(r.astype(self.dtype), vf, lambda a, v: put_all(vf(a), v))
        get_array_module(a).copyto(a, ra, casting="unsafe")
        self._written()
        if r._node is not None:
            self._node, self._out_index, self._requires_grad = r._node, r._out_index, True
            r._node.out_meta[r._out_index] = (self._array.shape, self._array.dtype)
            self._refresh_views(self)
        return self

    @staticmethod
    def _refresh_views(base: InPlace, skip: InPlace | None = None) -> None:
        """After a recorded write into ``base``'s memory, its other live views read the new
        values: each takes a ReadView node of the rewritten base (as PyTorch regenerates a
        stale view's grad_fn)."""
        for w in list(base._views or ()):
            if w is not skip:
                r = MS.ReadView.apply(base, get=w._view_fn)
                w._node, w._out_index, w._requires_grad = r._node, 0, r._node is not None

    def _write_through(self, value: InPlace, get, put) -> InPlace:
        """A recorded write of ``value`` into the region ``get`` of this tensor's base (or of
        itself): the base takes a WriteView node and this tensor, when it is a view, a ReadView
        of it, so that later uses and backward see the new values (PyTorch's rebase)."""
        target = self._base if self._base is not None else self
        t = MS.WriteView.apply(target, value, get=get, put=put)
        self._written()
        target._node, target._out_index, target._requires_grad = t._node, 0, True
        self._refresh_views(target)  # this tensor too, when it is a view
        return self

    def __iadd__(self, o):
        return self._inplace(E.Add, o, "add_")

    def __isub__(self, o):
        return self._inplace(E.Sub, o, "sub_")

    def __imul__(self, o):
        return self._inplace(E.Mul, o, "mul_")

    def __itruediv__(self, o):
        return self._inplace(E.Div, o, "div_", true_divide=True)

    def add_(self, o, alpha=1):
        return self._inplace(E.Add, o if alpha == 1 else o * alpha, "add_")

    def sub_(self, o, alpha=1):
        return self._inplace(E.Sub, o if alpha == 1 else o * alpha, "sub_")

    def mul_(self, o):
        return self._inplace(E.Mul, o, "mul_")

    def div_(self, o):
        return self._inplace(E.Div, o, "div_", true_divide=True)

    def _write(self, op: str, fill):
        """An in-place write of values that need no gradient: ``fill(array)`` changes the
        array and the version moves. On a tensor in the graph (or a view of one) the write is
        recorded, so that no gradient flows to the overwritten values."""
        self._check_inplace(op)
        base = self._base
        if self._in_graph():
            new = self._array.copy()
            fill(new)
            vf = self._view_fn if base is not None else identity
            return self._write_through(self._leaf(new), vf, lambda a, v: put_all(vf(a), v))
        fill(self._array)
        self._written()
        return self

    def __setitem__(self, key, value):
        self._check_inplace("setitem")
        xp = get_array_module(self._array)
        steps = index_steps(key, xp)
        if len(steps) == 2:  # integers first (a view), then the index arrays, as PyTorch
            self[steps[0]][steps[1]] = value
            return
        k = steps[0]
        base = self._base
        if is_grad_enabled() and (
            self.requires_grad
            or (base is not None and base.requires_grad)
            or (isinstance(value, InPlace) and value.requires_grad)
        ):
            # recorded: region k of this tensor (of its base, through the view) is replaced
            v = (
                value
                if isinstance(value, InPlace)
                else self._leaf(to_device(as_array(value), self.device))
            )
            vf = self._view_fn

            def get(a):
                return (a if vf is None else vf(a))[k]

            def put(a, val):
                (a if vf is None else vf(a))[k] = val

            self._write_through(v.astype(self.dtype), get, put)
            return
        v = value.array if isinstance(value, InPlace) else value
        if isinstance(v, (list, tuple, np.ndarray)) and xp is not np:
            v = xp.asarray(v)  # host values written into a GPU tensor
        self._array[k] = v
        self._written()

    def zero_(self) -> InPlace:
        return self.fill_(0)

    def fill_(self, value) -> InPlace:
        if tracked(value):  # recorded, so that the value gets its gradient
            self[...] = scalar_value("fill_", value)
            return self
        v = value.item() if isinstance(value, InPlace) else value

        def fill(a):
            a[...] = v

        return self._write("fill_", fill)

    def copy_(self, src) -> InPlace:
        """Copy src's values (broadcast, cast, moved to this device) into this tensor."""
        if is_grad_enabled() and isinstance(src, InPlace) and src.requires_grad:
            self[...] = src.to(self.device)  # recorded, as a write of the whole tensor
            return self
        xp = get_array_module(self._array)
        s = to_device(as_array(src), self.device)

        def fill(a):
            xp.copyto(a, xp.broadcast_to(xp.asarray(s), a.shape), casting="unsafe")

        return self._write("copy_", fill)

    def normal_(self, mean: float = 0.0, std: float = 1.0, generator=None) -> InPlace:
        """Fill with N(mean, std²) samples from the seeded generator (or ``generator``)."""
        g = rng_of(generator, self.device)
        draw = (
            g.standard_normal(self._array.shape, dtype=np.float32)
            if self.dtype != np.float64
            else g.standard_normal(self._array.shape)
        )

        def fill(a):
            a[...] = draw * std + mean

        return self._write("normal_", fill)

    def uniform_(self, a: float = 0.0, b: float = 1.0, generator=None) -> InPlace:
        """Fill with U[a, b) samples from the seeded generator (or ``generator``)."""
        g = rng_of(generator, self.device)
        draw = (
            g.random(self._array.shape, dtype=np.float32)
            if self.dtype != np.float64
            else g.random(self._array.shape)
        )

        def fill(arr):
            arr[...] = draw * (b - a) + a

        return self._write("uniform_", fill)

    def bernoulli_(self, p=0.5, generator=None) -> InPlace:
        """Fill with 1 where a U[0, 1) draw is below ``p`` (a number or a tensor of
        probabilities), else 0, as PyTorch's."""
        g = rng_of(generator, self.device)
        draw = g.random(self._array.shape, dtype=np.float32)
        prob = as_array(p) if isinstance(p, InPlace) else p

        def fill(arr):
            arr[...] = draw < prob

        return self._write("bernoulli_", fill)

    def masked_fill_(self, mask, value) -> InPlace:
        m = as_array(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill_: mask must be boolean, got {m.dtype}")
        if tracked(value):  # recorded, so that the value gets its gradient
            self[...] = self.masked_fill(m, value)
            return self
        v = value.item() if isinstance(value, InPlace) else value
        if self._in_graph():  # recorded, as x = x.masked_fill(mask, value)
            self._check_inplace("masked_fill_")
            return self._adopt("masked_fill_", E.MaskedFill.apply(self, m, v))
        xp = get_array_module(self._array)
        return self._write("masked_fill_", lambda a: xp.copyto(a, v, where=m))

    def clamp_(self, min=None, max=None) -> InPlace:
        if self._in_graph():
            self._check_inplace("clamp_")
            # Clamp saves its input: clamp a copy, since self is about to be overwritten
            return self._adopt("clamp_", self.clone().clamp(min, max))
        xp = get_array_module(self._array)
        return self._write("clamp_", lambda a: xp.clip(a, min, max, out=a))

    def neg_(self) -> InPlace:
        return self._update("neg_", lambda x: -x)

    def exp_(self) -> InPlace:
        return self._update("exp_", lambda x: x.exp())

    def lerp_(self, end, weight) -> InPlace:
        return self._update("lerp_", lambda x: x + (end - x) * weight)

    def addcmul_(self, tensor1, tensor2, value=1) -> InPlace:
        return self._update("addcmul_", lambda x: x + tensor1 * tensor2 * value)

    def addcdiv_(self, tensor1, tensor2, value=1) -> InPlace:
        return self._update("addcdiv_", lambda x: x + tensor1 / tensor2 * value)

    def _update(self, op: str, fn) -> InPlace:
        """In place, self becomes ``fn(self)`` (an out-of-place op): recorded when self or the
        values written take part in autograd."""
        self._check_inplace(op)
        return self._adopt(op, fn(self))

    def _in_graph(self) -> bool:
        """Whether an in-place write to this tensor must be recorded: grad mode is on and it
        (or the base it is a view of) takes part in autograd."""
        base = self._base
        return is_grad_enabled() and (
            self.requires_grad or (base is not None and base.requires_grad)
        )

    def chunk(self, chunks: int, dim: int = 0):
        if self.ndim == 0:
            raise RuntimeError("chunk: a 0-d tensor cannot be chunked")
        if chunks <= 0:
            raise RuntimeError(f"chunk: chunks must be positive, got {chunks}")
        n = self.shape[wrap_dim("chunk", dim, self.ndim)]
        return self.split(max(-(-n // chunks), 1), dim)

    def repeat(self, *sizes):
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        if len(sizes) < self.ndim:
            raise RuntimeError(
                "repeat: the number of repeat dims can not be smaller than the "
                "number of tensor dims"
            )
        out = self.reshape(*([1] * (len(sizes) - self.ndim)), *self.shape)
        for d, r in enumerate(sizes):
            if r != 1:
                out = shape_ops.Cat.apply(*([out] * r), dim=d)
        return out


# how a view finds its region in an array shaped like its base (composed along view chains)
def reshaper(shape):
    return lambda a: a.reshape(shape)


def permuter(dims):
    return lambda a: a.transpose(dims)


def expander(shape):
    return lambda a: get_array_module(a).broadcast_to(a, shape)


def indexer(key):
    return lambda a: a[key]


def put_all(a, v):
    a[...] = v


def identity(a):
    return a


def rng_of(generator, device: str):
    """The random generator to draw from: ``generator`` (a tg.Generator) or the seeded one."""
    if generator is None:
        return rng(device)
    return generator.rng(device)
