"""Tensor: an array, its gradient, and the graph node that produced it.

Operators and methods mirror PyTorch's names and arguments (``dim``, ``keepdim``), its
dimension checks (``ops/dims.py``) and its type promotion (``ops/dtypes.py``), so
nanoGPT-style code ports by changing its imports. Each method is a thin call into a
Function from ``ops/``; nothing here computes on arrays except the no-grad comparisons,
sorting, and in-place writes.

Views (slices, view, transpose, split, ...) that really share their base's memory share
its version counter and remember the base and how to find their region in it. So, as in
PyTorch, an in-place write through a view of a leaf that requires grad raises, and one
into any other tensor in the graph (or a view of it) is recorded: the base takes a
WriteView node and its views ReadView nodes of it (``ops/shape.py``).
"""

from __future__ import annotations

import weakref
from collections import namedtuple

import numpy as np

from . import autograd
from .autograd import Op, is_grad_enabled
from .backend import (
    device_of,
    get_array_module,
    parse_device,
    rng,
    shares_memory,
    to_device,
    to_numpy,
    xp_for,
)
from .ops import elementwise as E
from .ops import linalg, reduce
from .ops import shape as shape_ops
from .ops.dims import wrap_dim, wrap_dims
from .ops.dtypes import result_type
from .ops.nn import LogSoftmax, Softmax

DEFAULT_DTYPE = np.float32
_FLOAT_KINDS = "f"

MaxResult = namedtuple("MaxResult", ["values", "indices"])  # max(dim), min(dim), sort, topk


class Size(tuple):
    """A shape: a tuple with torch.Size's ``numel()`` (printed as a plain tuple)."""

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    def __getitem__(self, i):
        out = tuple.__getitem__(self, i)
        return Size(out) if isinstance(i, slice) else out


def _tracked(value) -> bool:
    """Whether a fill value is a tensor whose gradient must be recorded."""
    return isinstance(value, Tensor) and value.requires_grad and is_grad_enabled()


def _scalar_tensor(op: str, value):
    if value.ndim:
        raise RuntimeError(
            f"{op} only supports a 0-dimensional value tensor, but got tensor with "
            f"{value.ndim} dimension(s)"
        )
    return value


def as_array(x, dtype=None, device=None):
    """The backend array behind ``x`` (a Tensor, an array, a list or a scalar)."""
    if isinstance(x, Tensor):
        return x.data
    if device is not None and parse_device(device) == "cuda":
        return xp_for("cuda").asarray(x, dtype=dtype)
    if device_of(x) != "cpu":  # already a GPU array (CuPy, or a registered stand-in)
        return x if dtype is None else x.astype(dtype, copy=False)
    return np.asarray(x, dtype=dtype)


def _index_key(key, xp=np):
    """Replace Tensors inside an index by their arrays.

    Lists become ``xp`` arrays (so that backward sees integer arrays and accumulates
    repeats), and so do NumPy index arrays used on a GPU tensor.
    """

    def one(k):
        if isinstance(k, Tensor):
            return k.data
        if isinstance(k, list) or (xp is not np and isinstance(k, np.ndarray)):
            return xp.asarray(k)
        return k

    return tuple(one(k) for k in key) if isinstance(key, tuple) else one(key)


def _dims(args):
    """Accept f(2, 3), f((2, 3)) and f([2, 3])."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _is_dtype(x) -> bool:
    if isinstance(x, (str, Tensor)) or x is None:
        return False
    try:
        np.dtype(x)
    except TypeError:
        return False
    return True


def _to_args(args, kwargs):
    """(device, dtype) from PyTorch's .to() forms: to(device), to(dtype), to(device, dtype),
    to(tensor), and the keywords device=, dtype= (non_blocking= and copy= are accepted)."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif _is_dtype(a):
            dtype = a
        else:
            device = a
    return (None if device is None else parse_device(device)), dtype


class Tensor:
    """An n-d array with reverse-mode autograd (float32 unless a dtype is given)."""

    __slots__ = (
        "data",
        "grad",
        "_requires_grad",
        "_node",
        "_out_index",
        "_version",
        "name",
        "_base",
        "_view_fn",
        "_views",
        "_hooks",
        "__weakref__",
    )
    __array_priority__ = 1000  # make ndarray + Tensor call Tensor.__radd__

    def __init__(self, data, requires_grad: bool = False, dtype=None, device=None):
        if isinstance(data, Tensor):
            data = data.data
        arr = as_array(data, dtype=dtype, device=device)
        if dtype is None and arr.dtype == np.float64 and not hasattr(data, "dtype"):
            arr = arr.astype(DEFAULT_DTYPE)  # Python floats become float32, as in PyTorch
        if device is not None:
            arr = to_device(arr, device)
        self.data = arr
        self.grad = None
        self._node = None
        self._out_index = 0
        self._version = [0]
        self.name = None
        self._base = self._view_fn = self._views = None
        self._requires_grad = False
        self.requires_grad = requires_grad

    @classmethod
    def _make(cls, data, node, index):
        if isinstance(data, np.generic):
            data = np.asarray(data)  # full reductions give NumPy scalars: keep a 0-d array
        t = object.__new__(cls)
        t.data, t.grad, t._node, t._out_index, t._version, t.name = (
            data,
            None,
            node,
            index,
            [0],
            None,
        )
        t._base = t._view_fn = t._views = None
        t._requires_grad = node is not None
        return t

    # ------------------------------------------------------------------ attributes
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool):
        if value and self.data.dtype.kind not in _FLOAT_KINDS:
            raise RuntimeError(
                f"only floating-point tensors can require gradients, got dtype {self.data.dtype}"
            )
        if not value and self._node is not None:
            raise RuntimeError(
                "requires_grad can only be turned off on leaf tensors; use .detach()"
            )
        self._requires_grad = bool(value)

    def requires_grad_(self, value: bool = True) -> Tensor:
        self.requires_grad = value
        return self

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self) -> Op | None:
        return self._node

    shape = property(lambda self: Size(self.data.shape))
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    device = property(lambda self: device_of(self.data))
    is_cuda = property(lambda self: self.device == "cuda")
    T = property(lambda self: self.permute(*reversed(range(self.ndim))))
    mT = property(lambda self: self.transpose(-2, -1))

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self.data.shape)
        if self.ndim == 0:
            raise IndexError(f"size: dimension specified as {dim} but tensor has no dimensions")
        return self.data.shape[wrap_dim("size", dim, self.ndim)]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(self.data.size)

    nelement = numel

    def element_size(self) -> int:
        return int(self.data.dtype.itemsize)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __repr__(self) -> str:
        extra = ", requires_grad=True" if self.requires_grad else ""
        dev = ", device='cuda'" if self.device == "cuda" else ""
        body = np.array2string(to_numpy(self.data), precision=4, separator=", ", threshold=50)
        return f"tensor({body}, dtype={self.dtype}{dev}{extra})"

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

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (copied to the host when on the GPU)."""
        return to_numpy(self.data)

    def __array__(self, dtype=None, copy=None):
        a = to_numpy(self.data)
        return a if dtype is None else a.astype(dtype, copy=False)

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.data.dtype.kind not in "iu" or self.data.size != 1:
            raise TypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def detach(self) -> Tensor:
        t = Tensor._make(self.data, None, 0)
        t._version = self._version  # shares storage, so shares the version counter
        return t

    def detach_(self) -> Tensor:
        self._node, self._requires_grad = None, False
        return self

    def clone(self) -> Tensor:
        """A copy with its own memory; differentiable."""
        return shape_ops.Clone.apply(self)

    def to(self, *args, **kwargs) -> Tensor:
        """to(device), to(dtype), to(device, dtype), to(other): differentiable; no-op when
        nothing changes."""
        device, dtype = _to_args(args, kwargs)
        out = self
        if device is not None and device != self.device:
            out = ToDevice.apply(out, device)
        if dtype is not None and np.dtype(dtype) != self.dtype:
            out = out.astype(dtype)
        return out

    def cuda(self, device=None, non_blocking: bool = False) -> Tensor:
        return self.to("cuda")

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def pin_memory(self) -> Tensor:
        return self  # host arrays need no pinning here; kept so data loaders port unchanged

    def astype(self, dtype) -> Tensor:
        if np.dtype(dtype) == self.dtype:
            return self
        return E.Cast.apply(self, np.dtype(dtype))

    def float(self):
        return self.astype(np.float32)

    def double(self):
        return self.astype(np.float64)

    def half(self):
        return self.astype(np.float16)

    def long(self):
        return self.astype(np.int64)

    def int(self):
        return self.astype(np.int32)

    def bool(self):
        return self.astype(np.bool_)

    def type_as(self, other):
        return self.astype(other.dtype)

    def is_floating_point(self) -> bool:
        return self.dtype.kind == "f"

    # ------------------------------------------------------------------ autograd
    def backward(self, gradient=None, retain_graph=None, create_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``. ``create_graph=True``
        records the backward, so the gradients can be differentiated again."""
        autograd.backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` during ``backward()`` (leaves
        always keep theirs)."""
        if self._node is not None:
            if self._node.retained is None:
                self._node.retained = {}
            self._node.retained[self._out_index] = self

    def register_hook(self, hook):
        """Call ``hook(grad)`` whenever this tensor's gradient is computed; a returned tensor
        replaces the gradient (on a leaf: before it is accumulated into ``.grad``). Returns
        a handle whose ``.remove()`` unregisters it."""
        return autograd.register_hook(self, hook)

    # ------------------------------------------------------------------ arithmetic
    def _binary(self, cls, other, reflected=False, true_divide=False):
        """Apply a binary op after PyTorch's type promotion: both operands are cast to the
        result dtype (a float for true division of integers); Python numbers stay numbers."""
        if isinstance(other, np.generic):
            other = other.item()  # NumPy scalars act as Python numbers (float32 stays float32)
        if not isinstance(other, (Tensor, bool, int, float)):
            other = Tensor(other)  # an array keeps its dtype; a list of floats is float32
        if isinstance(other, Tensor) and other.device != self.device:
            raise RuntimeError(
                f"{cls.__name__.lower()}: expected all tensors on the same device, got "
                f"{self.device} and {other.device}"
            )
        dt = result_type(self, other)
        if true_divide and dt.kind in "biu":
            dt = np.dtype(DEFAULT_DTYPE)
        x = self.astype(dt)
        if isinstance(other, Tensor):
            other = other.astype(dt)
        elif dt.kind == "f":
            other = float(other)
        return cls.apply(other, x) if reflected else cls.apply(x, other)

    def __add__(self, o):
        return self._binary(E.Add, o)

    def __radd__(self, o):
        return self._binary(E.Add, o, True)

    def __sub__(self, o):
        return self._binary(E.Sub, o)

    def __rsub__(self, o):
        return self._binary(E.Sub, o, True)

    def __mul__(self, o):
        return self._binary(E.Mul, o)

    def __rmul__(self, o):
        return self._binary(E.Mul, o, True)

    def __truediv__(self, o):
        return self._binary(E.Div, o, true_divide=True)

    def __rtruediv__(self, o):
        return self._binary(E.Div, o, True, true_divide=True)

    def __pow__(self, o):
        return self._binary(E.Pow, o)

    def __rpow__(self, o):
        return self._binary(E.Pow, o, True)

    def __neg__(self):
        return E.Neg.apply(self)

    def __matmul__(self, o):
        return self._binary(linalg.MatMul, o)

    def __rmatmul__(self, o):
        return self._binary(linalg.MatMul, o, True)

    def _no_grad_binary(self, op, other, reflected=False):
        """Integer-valued results (//, %): no gradient, PyTorch's result dtype."""
        o = other.data if isinstance(other, Tensor) else other
        dt = result_type(self, other)
        a, b = (
            self.data.astype(dt, copy=False),
            (o.astype(dt, copy=False) if hasattr(o, "dtype") else o),
        )
        out = op(b, a) if reflected else op(a, b)
        return Tensor._make(get_array_module(out).asarray(out, dtype=dt), None, 0)

    def __floordiv__(self, o):
        return self._no_grad_binary(lambda a, b: a // b, o)

    def __rfloordiv__(self, o):
        return self._no_grad_binary(lambda a, b: a // b, o, True)

    def __mod__(self, o):
        return self._no_grad_binary(lambda a, b: a % b, o)

    def __rmod__(self, o):
        return self._no_grad_binary(lambda a, b: a % b, o, True)

    def matmul(self, o):
        return self @ o

    def add(self, o, alpha=1):
        return self + (o if alpha == 1 else o * alpha)

    def sub(self, o, alpha=1):
        return self - (o if alpha == 1 else o * alpha)

    mul, div, pow = __mul__, __truediv__, __pow__
    multiply, divide, floor_divide = __mul__, __truediv__, __floordiv__

    def maximum(self, other):
        return self._binary(E.Maximum, other)

    def minimum(self, other):
        return self._binary(E.Minimum, other)

    # comparisons and logic: no gradient, boolean results
    def _compare(self, op, other):
        if isinstance(other, Tensor):
            other = other.data
        elif not isinstance(other, (bool, int, float, list, tuple, np.generic)) and not hasattr(
            other, "dtype"
        ):
            return NotImplemented  # e.g. pytest.approx: let the other side compare
        return Tensor._make(op(self.data, other), None, 0)

    __eq__ = lambda self, o: self._compare(lambda a, b: a == b, o)  # noqa: E731
    __ne__ = lambda self, o: self._compare(lambda a, b: a != b, o)  # noqa: E731
    __lt__ = lambda self, o: self._compare(lambda a, b: a < b, o)  # noqa: E731
    __le__ = lambda self, o: self._compare(lambda a, b: a <= b, o)  # noqa: E731
    __gt__ = lambda self, o: self._compare(lambda a, b: a > b, o)  # noqa: E731
    __ge__ = lambda self, o: self._compare(lambda a, b: a >= b, o)  # noqa: E731
    __and__ = lambda self, o: self._compare(lambda a, b: a & b, o)  # noqa: E731
    __or__ = lambda self, o: self._compare(lambda a, b: a | b, o)  # noqa: E731
    __xor__ = lambda self, o: self._compare(lambda a, b: a ^ b, o)  # noqa: E731
    __invert__ = lambda self: Tensor._make(~self.data, None, 0)  # noqa: E731
    __hash__ = object.__hash__
    eq, ne, lt, le, gt, ge = __eq__, __ne__, __lt__, __le__, __gt__, __ge__
    logical_not = __invert__

    def isnan(self):
        return Tensor._make(get_array_module(self.data).isnan(self.data), None, 0)

    def isinf(self):
        return Tensor._make(get_array_module(self.data).isinf(self.data), None, 0)

    def isfinite(self):
        return Tensor._make(get_array_module(self.data).isfinite(self.data), None, 0)

    def all(self):
        return Tensor._make(get_array_module(self.data).asarray(self.data.all()), None, 0)

    def any(self):
        return Tensor._make(get_array_module(self.data).asarray(self.data.any()), None, 0)

    # ------------------------------------------------------------------ in place
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
        return self._adopt(op, self._binary(cls, other, true_divide=true_divide))

    def _adopt(self, op: str, r: Tensor) -> Tensor:
        """Write the out-of-place result r into self's memory and take over r's graph node,
        so that later ops (and backward) see self as the result."""
        if r.shape != self.shape:
            raise RuntimeError(
                f"{op}: result shape {r.shape} does not fit the tensor's shape {self.shape}"
            )
        if r.dtype.kind == "f" and self.dtype.kind != "f":
            raise RuntimeError(
                f"{op}: result type {r.dtype} can't be cast to the desired output type {self.dtype}"
            )
        base = self._base
        if base is not None and is_grad_enabled() and (base.requires_grad or r.requires_grad):
            vf = self._view_fn
            return self._write_through(r.astype(self.dtype), vf, lambda a, v: _put_all(vf(a), v))
        get_array_module(self.data).copyto(self.data, r.data, casting="unsafe")
        self._written()
        if r._node is not None:
            self._node, self._out_index, self._requires_grad = r._node, r._out_index, True
            r._node.out_meta[r._out_index] = (self.data.shape, self.data.dtype)
            self._refresh_views(self)
        return self

    @staticmethod
    def _refresh_views(base: Tensor, skip: Tensor | None = None) -> None:
        """After a recorded write into ``base``'s memory, its other live views read the new
        values: each takes a ReadView node of the rewritten base (as PyTorch regenerates a
        stale view's grad_fn)."""
        for w in list(base._views or ()):
            if w is not skip:
                r = shape_ops.ReadView.apply(base, get=w._view_fn)
                w._node, w._out_index, w._requires_grad = r._node, 0, r._node is not None

    def _write_through(self, value: Tensor, get, put) -> Tensor:
        """A recorded write of ``value`` into the region ``get`` of this tensor's base (or of
        itself): the base takes a WriteView node and this tensor, when it is a view, a ReadView
        of it, so that later uses and backward see the new values (PyTorch's rebase)."""
        target = self._base if self._base is not None else self
        t = shape_ops.WriteView.apply(target, value, get=get, put=put)
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
            new = self.data.copy()
            fill(new)
            vf = self._view_fn if base is not None else _identity
            return self._write_through(
                Tensor._make(new, None, 0), vf, lambda a, v: _put_all(vf(a), v)
            )
        fill(self.data)
        self._written()
        return self

    def __setitem__(self, key, value):
        self._check_inplace("setitem")
        xp = get_array_module(self.data)
        k = _index_key(key, xp)
        base = self._base
        if is_grad_enabled() and (
            self.requires_grad
            or (base is not None and base.requires_grad)
            or (isinstance(value, Tensor) and value.requires_grad)
        ):
            # recorded: region k of this tensor (of its base, through the view) is replaced
            v = value if isinstance(value, Tensor) else Tensor(as_array(value), device=self.device)
            vf = self._view_fn

            def get(a):
                return (a if vf is None else vf(a))[k]

            def put(a, val):
                (a if vf is None else vf(a))[k] = val

            self._write_through(v.astype(self.dtype), get, put)
            return
        v = value.data if isinstance(value, Tensor) else value
        if isinstance(v, (list, tuple, np.ndarray)) and xp is not np:
            v = xp.asarray(v)  # host values written into a GPU tensor
        self.data[k] = v
        self._written()

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def fill_(self, value) -> Tensor:
        if _tracked(value):  # recorded, so that the value gets its gradient
            self[...] = _scalar_tensor("fill_", value)
            return self
        v = value.item() if isinstance(value, Tensor) else value

        def fill(a):
            a[...] = v

        return self._write("fill_", fill)

    def copy_(self, src) -> Tensor:
        """Copy src's values (broadcast, cast, moved to this device) into this tensor."""
        if is_grad_enabled() and isinstance(src, Tensor) and src.requires_grad:
            self[...] = src.to(self.device)  # recorded, as a write of the whole tensor
            return self
        xp = get_array_module(self.data)
        s = to_device(as_array(src), self.device)

        def fill(a):
            xp.copyto(a, xp.broadcast_to(xp.asarray(s), a.shape), casting="unsafe")

        return self._write("copy_", fill)

    def normal_(self, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
        """Fill with N(mean, std²) samples from the seeded generator (or ``generator``)."""
        g = _rng_of(generator, self.device)
        draw = (
            g.standard_normal(self.data.shape, dtype=np.float32)
            if self.dtype != np.float64
            else g.standard_normal(self.data.shape)
        )

        def fill(a):
            a[...] = draw * std + mean

        return self._write("normal_", fill)

    def uniform_(self, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
        """Fill with U[a, b) samples from the seeded generator (or ``generator``)."""
        g = _rng_of(generator, self.device)
        draw = (
            g.random(self.data.shape, dtype=np.float32)
            if self.dtype != np.float64
            else g.random(self.data.shape)
        )

        def fill(arr):
            arr[...] = draw * (b - a) + a

        return self._write("uniform_", fill)

    def masked_fill_(self, mask, value) -> Tensor:
        m = as_array(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill_: mask must be boolean, got {m.dtype}")
        if _tracked(value):  # recorded, so that the value gets its gradient
            self[...] = self.masked_fill(m, value)
            return self
        v = value.item() if isinstance(value, Tensor) else value
        if self._in_graph():  # recorded, as x = x.masked_fill(mask, value)
            self._check_inplace("masked_fill_")
            return self._adopt("masked_fill_", E.MaskedFill.apply(self, m, v))
        xp = get_array_module(self.data)
        return self._write("masked_fill_", lambda a: xp.copyto(a, v, where=m))

    def clamp_(self, min=None, max=None) -> Tensor:
        if self._in_graph():
            self._check_inplace("clamp_")
            # Clamp saves its input: clamp a copy, since self is about to be overwritten
            return self._adopt("clamp_", self.clone().clamp(min, max))
        xp = get_array_module(self.data)
        return self._write("clamp_", lambda a: xp.clip(a, min, max, out=a))

    def _in_graph(self) -> bool:
        """Whether an in-place write to this tensor must be recorded: grad mode is on and it
        (or the base it is a view of) takes part in autograd."""
        base = self._base
        return is_grad_enabled() and (
            self.requires_grad or (base is not None and base.requires_grad)
        )

    # ------------------------------------------------------------------ unary math
    exp = lambda self: E.Exp.apply(self)  # noqa: E731
    log = lambda self: E.Log.apply(self)  # noqa: E731
    sqrt = lambda self: E.Sqrt.apply(self)  # noqa: E731
    tanh = lambda self: E.Tanh.apply(self)  # noqa: E731
    abs = lambda self: E.Abs.apply(self)  # noqa: E731
    relu = lambda self: E.Relu.apply(self)  # noqa: E731
    sigmoid = lambda self: E.Sigmoid.apply(self)  # noqa: E731
    __abs__ = abs

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
        return E.Clamp.apply(x, min, max)

    clip = clamp

    # ------------------------------------------------------------------ reductions
    def sum(self, dim=None, keepdim: bool = False, dtype=None):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind in "biu":
            x = x.astype(np.int64)  # PyTorch sums integers (and bools) in int64
        return reduce.Sum.apply(x, dim=dim, keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False, dtype=None):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind != "f":
            raise RuntimeError(
                f"mean: expected a floating point input, got {x.dtype}; pass "
                "dtype=tg.float32 or call .float() first"
            )
        return reduce.Mean.apply(x, dim=dim, keepdim=keepdim)

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None):
        """Variance; ``correction`` (or ``unbiased``) 1 divides by n-1 as PyTorch, 0 by n."""
        c = (1 if unbiased else 0) if correction is None else correction
        return reduce.Var.apply(self, dim=dim, keepdim=keepdim, correction=c)

    def std(self, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None):
        return self.var(dim, keepdim, unbiased, correction).sqrt()

    def norm(self, p=2, dim=None, keepdim: bool = False):
        """The p-norm over ``dim`` (every element by default; 'fro' is 2, inf the max |x|)."""
        if p == "fro" or p == 2:
            return (self * self).sum(dim, keepdim).sqrt()
        if p == float("inf"):
            return self.abs().amax(dim, keepdim)
        if p == 1:
            return self.abs().sum(dim, keepdim)
        return (self.abs() ** p).sum(dim, keepdim) ** (1.0 / p)

    def _dims(self, op: str, dim):
        """``dim`` checked under the name of the op the user called (None stays None)."""
        return None if dim is None else wrap_dims(op, dim, self.ndim)

    def amax(self, dim=None, keepdim: bool = False, _op: str = "amax"):
        return reduce.Max.apply(self, dim=self._dims(_op, dim), keepdim=keepdim)

    def amin(self, dim=None, keepdim: bool = False, _op: str = "amin"):
        return -(-self).amax(self._dims(_op, dim), keepdim)

    def max(self, dim=None, keepdim: bool = False):
        """max() -> scalar tensor; max(dim) -> (values, indices); max(other) elementwise."""
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        if dim is None:
            return self.amax()
        return MaxResult(self.amax(dim, keepdim, "max"), self.argmax(dim, keepdim))

    def min(self, dim=None, keepdim: bool = False):
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        if dim is None:
            return self.amin()
        return MaxResult(self.amin(dim, keepdim, "min"), self.argmin(dim, keepdim))

    def argmax(self, dim=None, keepdim: bool = False):
        xp = get_array_module(self.data)
        if dim is None:
            return Tensor._make(xp.asarray(xp.argmax(self.data)), None, 0)
        d = wrap_dim("argmax", dim, self.ndim)
        return Tensor._make(xp.asarray(xp.argmax(self.data, axis=d, keepdims=keepdim)), None, 0)

    def argmin(self, dim=None, keepdim: bool = False):
        xp = get_array_module(self.data)
        if dim is None:
            return Tensor._make(xp.asarray(xp.argmin(self.data)), None, 0)
        d = wrap_dim("argmin", dim, self.ndim)
        return Tensor._make(xp.asarray(xp.argmin(self.data, axis=d, keepdims=keepdim)), None, 0)

    def cumsum(self, dim: int, dtype=None):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind in "biu":
            x = x.astype(np.int64)
        return reduce.Cumsum.apply(x, wrap_dim("cumsum", dim, self.ndim))

    def softmax(self, dim: int = -1):
        return Softmax.apply(self, dim=wrap_dim("softmax", dim, self.ndim))

    def log_softmax(self, dim: int = -1):
        return LogSoftmax.apply(self, dim=wrap_dim("log_softmax", dim, self.ndim))

    # ------------------------------------------------------------------ sorting
    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False):
        xp = get_array_module(self.data)
        d = wrap_dim("argsort", dim, self.ndim)
        a = self.data if self.ndim else self.data.reshape(1)
        # a stable sort of -x keeps ties in index order, as PyTorch's stable descending sort
        idx = xp.argsort(-a if descending else a, axis=d, kind="stable")
        return Tensor._make(idx.reshape(self.data.shape), None, 0)

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False):
        """(values, indices) sorted along ``dim`` (stably); values carry the gradient."""
        idx = self.argsort(wrap_dim("sort", dim, self.ndim), descending)
        return MaxResult(self.gather(dim, idx), idx)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
        """(values, indices) of the k largest (or smallest) along ``dim``, largest first."""
        d = wrap_dim("topk", dim, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if not 0 <= k <= n:
            raise RuntimeError(f"topk: k ({k}) is out of range for dimension {d} of size {n}")
        idx = self.argsort(d, descending=largest)
        idx = idx[(slice(None),) * d + (slice(0, k),)] if self.ndim else idx
        idx = Tensor._make(get_array_module(idx.data).ascontiguousarray(idx.data), None, 0)
        return MaxResult(self.gather(d, idx), idx)

    # ------------------------------------------------------------------ indexing ops
    def gather(self, dim: int, index):
        """out[i][j] = self[i][index[i][j]] along ``dim`` (torch.gather)."""
        d = wrap_dim("gather", dim, self.ndim)
        idx = as_array(index)
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"gather: index must be an integer tensor, got {idx.dtype}")
        if idx.ndim != self.ndim:
            raise RuntimeError(f"gather: index has {idx.ndim} dims, the input {self.ndim}")
        return shape_ops.Gather.apply(self, idx, d)

    def scatter_add(self, dim: int, index, src):
        """self with src[i][j] added at [i][index[i][j]] along ``dim`` (torch.scatter_add)."""
        d = wrap_dim("scatter_add", dim, self.ndim)
        idx = as_array(index)
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"scatter_add: index must be an integer tensor, got {idx.dtype}")
        src = src if isinstance(src, Tensor) else Tensor(as_array(src, dtype=self.dtype))
        return shape_ops.ScatterAdd.apply(self, idx, src.astype(self.dtype), d)

    def index_select(self, dim: int, index):
        d = wrap_dim("index_select", dim, self.ndim)
        idx = as_array(index)
        if idx.ndim > 1 or idx.dtype.kind not in "iu":
            raise RuntimeError("index_select: index must be a 0-d or 1-d integer tensor")
        return self[(slice(None),) * d + (idx.reshape(-1),)]

    def masked_fill(self, mask, value):
        """Copy of self with ``value`` where the broadcast boolean ``mask`` is True."""
        m = as_array(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill: mask must be boolean, got {m.dtype}")
        if _tracked(value):  # the value gets the gradient of every filled element
            filled = E.MaskedFill.apply(self, m, 0)  # checks the mask's shape
            return E.Where.apply(m, _scalar_tensor("masked_fill", value).to(self.dtype), filled)
        v = value.item() if isinstance(value, Tensor) else value
        return E.MaskedFill.apply(self, m, v)

    # ------------------------------------------------------------------ shape
    def _view_of(self, out: Tensor, fn) -> Tensor:
        """Mark ``out`` as a view of self when it really shares self's memory: it then shares
        the version counter, remembers the base and, as ``fn`` after self's own, how to find
        its region in an array shaped like the base (for recorded in-place writes)."""
        if shares_memory(out.data, self.data):
            out._version = self._version
            if self._base is None:
                out._base, out._view_fn = self, fn
            else:
                inner = self._view_fn
                out._base, out._view_fn = self._base, (lambda a: fn(inner(a)))
            base = out._base
            if base._views is None:
                base._views = weakref.WeakSet()
            base._views.add(out)  # to re-derive it from the base after an in-place write
        return out

    def view(self, *shape_):
        """The same memory with another shape; raises where NumPy would have to copy."""
        if len(shape_) == 1 and _is_dtype(shape_[0]) and not isinstance(shape_[0], int):
            raise RuntimeError("view(dtype) is not supported; use .to(dtype)")
        out = shape_ops.Reshape.apply(self, _dims(shape_))
        if out.data.size and not shares_memory(out.data, self.data):
            raise RuntimeError(
                f"view size is not compatible with input tensor's size and stride (shape "
                f"{tuple(self.shape)} to {tuple(out.shape)}: at least one dimension spans "
                "across two contiguous subspaces). Use .reshape(...) instead."
            )
        return self._view_of(out, _reshaper(out.data.shape))

    def reshape(self, *shape_):
        """view when the memory allows it, else a copy."""
        out = shape_ops.Reshape.apply(self, _dims(shape_))
        return self._view_of(out, _reshaper(out.data.shape))

    def view_as(self, other):
        return self.view(other.shape)

    def reshape_as(self, other):
        return self.reshape(other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        if self.ndim == 0:
            return self.reshape(1)
        s = wrap_dim("flatten", start_dim, self.ndim)
        e = wrap_dim("flatten", end_dim, self.ndim)
        if s > e:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        return self.reshape(*self.shape[:s], -1, *self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes):
        d = wrap_dim("unflatten", dim, self.ndim)
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1 :])

    def permute(self, *dims):
        dims = tuple(wrap_dim("permute", d, self.ndim) for d in _dims(dims))
        return self._view_of(shape_ops.Permute.apply(self, dims), _permuter(dims))

    def transpose(self, dim0: int, dim1: int):
        d0 = wrap_dim("transpose", dim0, self.ndim)
        d1 = wrap_dim("transpose", dim1, self.ndim)
        if self.ndim < 2:
            return self
        dims = list(range(self.ndim))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return self.permute(*dims)

    swapaxes = transpose

    def movedim(self, source: int, destination: int):
        s = wrap_dim("movedim", source, self.ndim)
        d = wrap_dim("movedim", destination, self.ndim)
        dims = list(range(self.ndim))
        dims.insert(d, dims.pop(s))
        return self.permute(*dims)

    def t(self):
        if self.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dims, got {self.ndim}")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def contiguous(self):
        if self.data.flags.c_contiguous:
            return self
        return shape_ops.Contiguous.apply(self)

    def is_contiguous(self) -> bool:
        return bool(self.data.flags.c_contiguous)

    def unsqueeze(self, dim: int):
        d = wrap_dim("unsqueeze", dim, self.ndim + 1)
        return self.reshape(*self.shape[:d], 1, *self.shape[d:])

    def squeeze(self, dim=None):
        if dim is None:
            return self.reshape(*[s for s in self.shape if s != 1])
        if self.ndim == 0:
            wrap_dims("squeeze", dim, 0)
            return self
        dims = set(wrap_dims("squeeze", dim, self.ndim))
        return self.reshape(*[s for i, s in enumerate(self.shape) if not (i in dims and s == 1)])

    def expand(self, *sizes):
        out = shape_ops.Expand.apply(self, _dims(sizes))
        return self._view_of(out, _expander(out.data.shape))

    def expand_as(self, other):
        return self.expand(other.shape)

    def repeat(self, *sizes):
        sizes = _dims(sizes)
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

    def __getitem__(self, key):
        k = _index_key(key, get_array_module(self.data))
        out = shape_ops.GetItem.apply(self, k)
        return self._view_of(out, _indexer(k))  # basic indexing is a view: writes show up

    def split(self, split_size_or_sections, dim: int = 0):
        """Pieces of ``split_size`` along dim (the last may be smaller), or of the listed sizes."""
        if self.ndim == 0:
            raise RuntimeError("split: a 0-d tensor cannot be split")
        d = wrap_dim("split", dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int):
            step = split_size_or_sections
            if step <= 0:
                raise ValueError(f"split: split_size must be positive, got {step}")
            sizes = [min(step, n - i) for i in range(0, n, step)] or [0]
        else:
            sizes = [int(s) for s in split_size_or_sections]
            if sum(sizes) != n:
                raise ValueError(f"split: sizes {sizes} do not add up to {n} (dim {dim})")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        pieces = shape_ops.Split.apply(self, sizes, d)
        return tuple(
            self._view_of(t, _indexer((slice(None),) * d + (slice(a, a + n),)))
            for t, a, n in zip(pieces, starts, sizes)
        )

    def chunk(self, chunks: int, dim: int = 0):
        if self.ndim == 0:
            raise RuntimeError("chunk: a 0-d tensor cannot be chunked")
        if chunks <= 0:
            raise RuntimeError(f"chunk: chunks must be positive, got {chunks}")
        n = self.shape[wrap_dim("chunk", dim, self.ndim)]
        return self.split(max(-(-n // chunks), 1), dim)

    def unbind(self, dim: int = 0):
        """The slices along ``dim``, each without that dim."""
        d = wrap_dim("unbind", dim, self.ndim)
        return tuple(p.squeeze(d) for p in self.split(1, d))

    def tril(self, diagonal: int = 0):
        xp = xp_for(self.device)
        keep = xp.tril(xp.ones(self.shape[-2:], dtype=bool), k=diagonal)
        return E.Where.apply(keep, self, xp.zeros((), dtype=self.dtype))

    def triu(self, diagonal: int = 0):
        xp = xp_for(self.device)
        keep = xp.triu(xp.ones(self.shape[-2:], dtype=bool), k=diagonal)
        return E.Where.apply(keep, self, xp.zeros((), dtype=self.dtype))


# how a view finds its region in an array shaped like its base (composed along view chains)
def _reshaper(shape):
    return lambda a: a.reshape(shape)


def _permuter(dims):
    return lambda a: a.transpose(dims)


def _expander(shape):
    return lambda a: get_array_module(a).broadcast_to(a, shape)


def _indexer(key):
    return lambda a: a[key]


def _put_all(a, v):
    a[...] = v


def _identity(a):
    return a


def _rng_of(generator, device: str):
    """The random generator to draw from: ``generator`` (a tg.Generator) or the seeded one."""
    if generator is None:
        return rng(device)
    return generator.rng(device)


class ToDevice(Op):
    def forward(self, x, device):
        self.src = device_of(x)
        return to_device(x, device)

    def backward(self, g):
        if isinstance(g, Tensor):  # recorded (create_graph): the move back is an op too
            return ToDevice.apply(g, self.src), None
        return to_device(g, self.src), None


autograd.register_tensor_type(Tensor)
