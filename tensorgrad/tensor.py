"""Tensor: an array, its gradient, and the graph node that produced it.

Operators and methods mirror PyTorch's names and arguments (``dim``, ``keepdim``), its
dimension checks (``ops/dims.py``), its type promotion (``ops/dtypes.py``) and its indexing
rule (``indexing.py``), so nanoGPT-style code ports by changing its imports. Each method is a
thin call into an Op from ``ops/``; nothing here computes on arrays.

This file holds the methods a GPT uses, the views among them (``_view_of`` records how a
view maps onto its base, so that an in-place write through it reaches the base). Tensor takes
PyTorch's others from three base classes, which a reader of the core can skip:
``tensor_extras.Extras`` (more math and shapes, conversions, ``new_*``),
``tensor_select.Select`` (comparisons, sorting, gather/scatter) and ``tensor_inplace.InPlace``
(in-place writes, and the small helpers that convert arrays and find a view's region in its
base, imported below). Printing is in ``printing.py``.

Imports: numpy, weakref, .autograd, .devices, .indexing, .ops, .printing, .tensor_extras,
.tensor_inplace, .tensor_select, .types.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import autograd
from . import devices as _devices
from .autograd import Op
from .autograd.graph import model_epoch, note_effect, note_view
from .autograd.graph import watch as _watch
from .devices import device_of, get_array_module, shares_memory, to_device, to_numpy
from .indexing import index_steps
from .ops import elementwise as E
from .ops import linalg, reduce
from .ops import shape as shape_ops
from .ops.dims import size_args, wrap_dim, wrap_dims
from .ops.dtypes import result_type
from .ops.nn import Softmax
from .printing import tensor_repr
from .tensor_extras import Extras
from .tensor_inplace import (
    as_array,
    expander,
    indexer,
    permuter,
    reshaper,
    scalar_value,
    storable,
    tracked,
)
from .tensor_select import MaxResult
from .types import Size, as_dtype, device, is_dtype, to_args

DEFAULT_DTYPE = np.float32
_FLOAT_KINDS = "f"

__all__ = ["DEFAULT_DTYPE", "MaxResult", "Size", "Tensor", "as_array", "to_args"]


class Tensor(Extras):
    """An n-d array with reverse-mode autograd (float32 unless a dtype is given). PyTorch's
    methods beyond the ones here come from the base classes (the module docstring lists them)."""

    __slots__ = (
        "_array",
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
            data = data.array
        arr = as_array(data, dtype=dtype, device=device)
        if dtype is None and arr.dtype == np.float64 and not hasattr(data, "dtype"):
            arr = arr.astype(DEFAULT_DTYPE)  # Python floats become float32, as in PyTorch
        if device is not None:
            arr = to_device(arr, device)
        self._array = arr
        self.grad = None
        self._node = None
        self._out_index = 0
        self._version = [0]
        self.name = None
        self._base = self._view_fn = self._views = self._hooks = None
        self._requires_grad = False
        if requires_grad:  # (through the setter: its checks)
            self.requires_grad = requires_grad

    @staticmethod
    def _leaf(data) -> Tensor:
        """A new Tensor (never a subclass) holding ``data``, outside any graph."""
        return Tensor._make(data, None, 0)

    @classmethod
    def _make(cls, data, node, index):
        if isinstance(data, np.generic):
            data = np.asarray(data)  # full reductions give NumPy scalars: keep a 0-d array
        t = object.__new__(cls)
        t._array, t.grad, t._node, t._out_index, t._version, t.name = data, None, node, index, [0], None  # fmt: skip
        t._base = t._view_fn = t._views = t._hooks = None
        t._requires_grad = node is not None
        return t

    # ------------------------------------------------------------------ attributes
    @property
    def array(self):
        """The backend array itself (NumPy, or CuPy on the GPU): tensorgrad's name."""
        return self._array

    @array.setter
    def array(self, value):  # a Tensor given stores its array, as p.data = t does
        if _watch.traces:  # inside a compile trace: a traced tensor's memory swapped
            note_effect("it assigns a tensor's .data (replay would skip the assignment)", self)
        new = value._array if isinstance(value, Tensor) else storable(value)
        old = self._array
        if self._requires_grad or old.shape != new.shape or old.dtype != new.dtype:
            model_epoch[0] += 1  # (compile's signature: a parameter's memory or meta)
        self._array = new

    @property
    def data(self) -> Tensor:
        """As PyTorch's: a Tensor sharing this memory, outside autograd (``p.data.zero_()``)."""
        return Tensor._make(self._array, None, 0)

    data = data.setter(array.fset)

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool):
        if value and self.dtype.kind not in _FLOAT_KINDS:
            raise RuntimeError(
                f"only floating-point tensors can require gradients, got dtype {self._array.dtype}"
            )
        if not value and self._node is not None:
            raise RuntimeError(
                "requires_grad can only be turned off on leaf tensors; use .detach()"
            )
        if _watch.traces:  # a traced tensor made a leaf of its own (x.requires_grad_())
            note_effect("it sets requires_grad on a traced tensor (replay would not)", self)
        self._requires_grad = bool(value)
        model_epoch[0] += 1  # (compile's signature reads it)

    def requires_grad_(self, value: bool = True) -> Tensor:
        self.requires_grad = value
        return self

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self) -> Op | None:
        return self._node

    @property
    def version(self) -> int:
        """In-place writes to this memory so far, views' included (PyTorch's ``t._version``)."""
        return self._version[0]

    def mark_written(self) -> None:
        """Count a write made to ``.array`` directly: graphs that saved this tensor see it stale."""
        self._version[0] += 1

    shape = property(lambda self: Size(self._array.shape))
    dtype = property(lambda self: as_dtype(self._array.dtype))
    ndim = property(lambda self: self._array.ndim)
    device = property(lambda self: device(device_of(self._array)))
    is_cuda = property(lambda self: self.device == "cuda")
    T = property(lambda self: self.permute(*reversed(range(self.ndim))))
    mT = property(lambda self: self.transpose(-2, -1))

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._array.shape)
        if self.ndim == 0:
            raise IndexError(f"size: dimension specified as {dim} but tensor has no dimensions")
        return self._array.shape[wrap_dim("size", dim, self.ndim)]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(self._array.size)

    nelement = numel

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __repr__(self) -> str:
        return tensor_repr(self)

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (copied to the host when on the GPU); as PyTorch, not of a
        tensor that requires grad."""
        if self.requires_grad:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                "instead."
            )
        if self._array.dtype is _devices.BFLOAT16:  # as PyTorch's (NumPy has no bfloat16)
            raise TypeError("Got unsupported ScalarType BFloat16")
        return to_numpy(self._array)

    def __array__(self, dtype=None, copy=None):
        a = to_numpy(self._array)
        return a if dtype is None else a.astype(dtype, copy=False)

    def item(self):
        if self._array.size != 1:
            raise ValueError(
                f"item() needs a tensor with one element, got shape {tuple(self.shape)}"
            )
        return self._array.reshape(()).item()

    def tolist(self):
        return to_numpy(self._array).tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self._array.dtype.kind not in "iu" or self._array.size != 1:
            raise TypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def detach(self) -> Tensor:
        t = Tensor._make(self._array, None, 0)
        t._version = self._version  # shares storage, so shares the version counter
        return t

    def detach_(self) -> Tensor:
        self._node, self._requires_grad = None, False
        model_epoch[0] += 1
        return self

    def clone(self) -> Tensor:
        """A copy with its own memory; differentiable."""
        return shape_ops.Clone.apply(self)

    def to(self, *args, **kwargs) -> Tensor:
        """to(device), to(dtype), to(device, dtype), to(other): differentiable; no-op when
        nothing changes."""
        device, dtype = to_args(args, kwargs)
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

    def astype(self, dtype) -> Tensor:
        if np.dtype(dtype) == self.dtype:
            return self
        return E.Cast.apply(self, np.dtype(dtype))

    def float(self):
        return self.astype(np.float32)

    def long(self):
        return self.astype(np.int64)

    def int(self):
        return self.astype(np.int32)

    def bool(self):
        return self.astype(np.bool_)

    def type_as(self, other):
        return self.astype(other.dtype)

    def _floating(self) -> Tensor:
        """Self, or an integer tensor as float32 (PyTorch's default dtype, not NumPy's float64)."""
        return self if self.dtype.kind in "fc" else self.astype(DEFAULT_DTYPE)

    def is_floating_point(self) -> bool:
        return self.dtype.kind == "f"

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False) -> Tensor:
        """A new leaf with ``data``'s values (copied) in self's dtype and device (unless given)."""
        t = Tensor(as_array(data), dtype=dtype or self.dtype, device=device or self.device)
        t.array = t.array.copy()
        t.requires_grad = requires_grad
        return t

    # ------------------------------------------------------------------ autograd
    def backward(self, gradient=None, retain_graph=None, create_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``. ``create_graph=True``
        records the backward, so the gradients can be differentiated again."""
        autograd.backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` during ``backward()`` (leaves
        always keep theirs)."""
        autograd.engine.retain_grad(self)

    def register_hook(self, hook):
        """Call ``hook(grad)`` whenever this tensor's gradient is computed; a returned tensor
        replaces the gradient (on a leaf: before it is accumulated into ``.grad``). Returns
        a handle whose ``.remove()`` unregisters it."""
        return autograd.register_hook(self, hook)

    # ------------------------------------------------------------------ arithmetic
    def _binary(self, cls, other, reflected=False, true_divide=False):
        """Apply a binary op after PyTorch's type promotion: both operands are cast to the
        result dtype (a float for true division of integers); Python numbers stay numbers."""
        dt = self._array.dtype
        if dt.kind == "f":
            # the common cases need no promotion: a float tensor with a Python number (not a
            # bool), or with a tensor of its dtype (on its device: one device unless a second
            # array module is loaded). Small tensors spend more time deciding this than adding.
            kind = type(other)
            if kind is float or kind is int:
                other = float(other)
                return cls.apply(other, self) if reflected else cls.apply(self, other)
            if isinstance(other, Tensor) and other._array.dtype == dt and not _devices._multi:
                return cls.apply(other, self) if reflected else cls.apply(self, other)
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
        elif dt is _devices.BFLOAT16 and cls in (E.Add, E.Sub):  # as PyTorch's add kernel
            other = float(dt.type(other))  # (mul and div take the number as it is)
        return cls.apply(other, x) if reflected else cls.apply(x, other)

    # (binary operators as one-liners: each is _binary with its op, reflected for __r*__)
    __add__ = lambda self, o: self._binary(E.Add, o)  # noqa: E731
    __radd__ = lambda self, o: self._binary(E.Add, o, True)  # noqa: E731
    __sub__ = lambda self, o: self._binary(E.Sub, o)  # noqa: E731
    __rsub__ = lambda self, o: self._binary(E.Sub, o, True)  # noqa: E731
    __mul__ = lambda self, o: self._binary(E.Mul, o)  # noqa: E731
    __rmul__ = lambda self, o: self._binary(E.Mul, o, True)  # noqa: E731
    __truediv__ = lambda self, o: self._binary(E.Div, o, true_divide=True)  # noqa: E731
    __rtruediv__ = lambda self, o: self._binary(E.Div, o, True, true_divide=True)  # noqa: E731
    __pow__ = lambda self, o: self._binary(E.Pow, o)  # noqa: E731
    __rpow__ = lambda self, o: self._binary(E.Pow, o, True)  # noqa: E731

    def __neg__(self):
        return E.Neg.apply(self)

    def __matmul__(self, o):
        return self._binary(linalg.MatMul, _same_dtype(self, o))

    def __rmatmul__(self, o):
        return self._binary(linalg.MatMul, _same_dtype(self, o), True)

    def _no_grad_binary(self, op, other, reflected=False):
        """Integer-valued results (//, %): no gradient, PyTorch's result dtype."""
        o = other.array if isinstance(other, Tensor) else other
        dt = result_type(self, other)
        a, b = (
            self._array.astype(dt, copy=False),
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

    # ------------------------------------------------------------------ unary math
    # (of an integer tensor: float32, PyTorch's default dtype, not NumPy's float64)
    exp = lambda self: E.Exp.apply(self._floating())  # noqa: E731
    log = lambda self: E.Log.apply(self._floating())  # noqa: E731
    sqrt = lambda self: E.Sqrt.apply(self._floating())  # noqa: E731
    tanh = lambda self: E.Tanh.apply(self._floating())  # noqa: E731
    abs = lambda self: E.Abs.apply(self)  # noqa: E731
    relu = lambda self: E.Relu.apply(self)  # noqa: E731
    sigmoid = lambda self: E.Sigmoid.apply(self._floating())  # noqa: E731
    __abs__ = abs

    # ------------------------------------------------------------------ reductions
    def sum(self, dim=None, keepdim: bool = False, dtype=None, *, keepdims=False):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind in "biu":
            x = x.astype(np.int64)  # PyTorch sums integers (and bools) in int64
        return reduce.Sum.apply(x, dim=dim, keepdim=keepdim or keepdims)

    def mean(self, dim=None, keepdim: bool = False, dtype=None, *, keepdims=False):
        x = self if dtype is None else self.astype(dtype)
        if x.dtype.kind != "f":
            raise RuntimeError(
                f"mean: expected a floating point input, got {x.dtype}; pass "
                "dtype=tg.float32 or call .float() first"
            )
        return reduce.Mean.apply(x, dim=dim, keepdim=keepdim or keepdims)

    def _dims(self, op: str, dim):
        """``dim`` checked under the name of the op the user called (None stays None)."""
        return None if dim is None else wrap_dims(op, dim, self.ndim)

    def amax(self, dim=None, keepdim: bool = False, _op: str = "amax", *, keepdims=False):
        return reduce.Max.apply(self, dim=self._dims(_op, dim), keepdim=keepdim or keepdims)

    def softmax(self, dim: int = -1):
        return Softmax.apply(self, dim=wrap_dim("softmax", dim, self.ndim))

    def masked_fill(self, mask, value):
        """Copy of self with ``value`` where the broadcast boolean ``mask`` is True."""
        m = as_array(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill: mask must be boolean, got {m.dtype}")
        if tracked(value):  # the value gets the gradient of every filled element
            filled = E.MaskedFill.apply(self, m, 0)  # checks the mask's shape
            return E.Where.apply(m, scalar_value("masked_fill", value).to(self.dtype), filled)
        v = value.item() if isinstance(value, Tensor) else value
        return E.MaskedFill.apply(self, m, v)

    # ------------------------------------------------------------------ shape
    def _view_of(self, out: Tensor, fn, shared: bool | None = None) -> Tensor:
        """Mark ``out`` as a view of self when it really shares self's memory (``shared``, when
        the caller knows): it then shares the version counter, remembers the base and, as
        ``fn`` after self's own, how to find its region in an array shaped like the base (for
        recorded in-place writes)."""
        if shared is None:
            shared = shares_memory(out._array, self._array)
        if shared:
            out._version = self._version
            if _watch.traces:  # a compile trace noted its version when the op made it
                note_view(out)
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
        if len(shape_) == 1 and is_dtype(shape_[0]) and not isinstance(shape_[0], int):
            return self._view_dtype(as_dtype(shape_[0]))
        out = shape_ops.Reshape.apply(self, size_args(shape_))
        shared = shares_memory(out.array, self._array)
        if out.array.size and not shared:
            raise RuntimeError(
                f"view size is not compatible with input tensor's size and stride (shape "
                f"{tuple(self.shape)} to {tuple(out.shape)}: at least one dimension spans "
                "across two contiguous subspaces). Use .reshape(...) instead."
            )
        return self._view_of(out, reshaper(out.array.shape), shared)

    def _view_dtype(self, dt):
        """``view(dtype)``: the same bytes read as another dtype (llm.c writes bfloat16 as
        ``t.view(torch.int16)``); the last dimension scales by the itemsizes' ratio, as
        PyTorch's. Not differentiable: the result requires no grad."""
        a, size = self._array, np.dtype(dt.dtype).itemsize
        if size != a.dtype.itemsize and (a.ndim == 0 or not a.flags.c_contiguous):
            raise RuntimeError(
                f"view({dt}): a {self.dtype} tensor with another itemsize must be contiguous "
                "with at least one dimension"
            )
        try:
            return type(self)(a.view(dt.dtype))
        except ValueError as e:
            raise RuntimeError(f"view({dt}) of shape {tuple(self.shape)}: {e}") from None

    def reshape(self, *shape_):
        """view when the memory allows it, else a copy."""
        out = shape_ops.Reshape.apply(self, size_args(shape_))
        return self._view_of(out, reshaper(out.array.shape))

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        if self.ndim == 0:
            return self.reshape(1)
        s = wrap_dim("flatten", start_dim, self.ndim)
        e = wrap_dim("flatten", end_dim, self.ndim)
        if s > e:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        return self.reshape(*self.shape[:s], -1, *self.shape[e + 1 :])

    def permute(self, *dims):
        dims = tuple(wrap_dim("permute", d, self.ndim) for d in size_args(dims))
        return self._view_of(shape_ops.Permute.apply(self, dims), permuter(dims))

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
        if self._array.flags.c_contiguous:
            return self
        return shape_ops.Contiguous.apply(self)

    def is_contiguous(self) -> bool:
        return bool(self._array.flags.c_contiguous)

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
        out = shape_ops.Expand.apply(self, size_args(sizes))
        return self._view_of(out, expander(out.array.shape))

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
            self._view_of(t, indexer((slice(None),) * d + (slice(a, a + n),)))
            for t, a, n in zip(pieces, starts, sizes)
        )

    def unbind(self, dim: int = 0):
        """The slices along ``dim``, each without that dim."""
        d = wrap_dim("unbind", dim, self.ndim)
        return tuple(p.squeeze(d) for p in self.split(1, d))

    def __getitem__(self, key):
        out = self
        for k in index_steps(key, get_array_module(self._array)):  # PyTorch's rule: indexing.py
            # basic indexing gives a view: writes show up in the base
            out = out._view_of(shape_ops.GetItem.apply(out, k), indexer(k))
        return out


def _same_dtype(x: Tensor, o):
    """PyTorch's matmul takes no mixed dtypes (float32 @ float64 raises)."""
    o = o if isinstance(o, Tensor) else Tensor(o)
    if o._array.dtype != x._array.dtype and autograd.graph._state.autocast is None:
        c = {"float32": "float", "float64": "double", "float16": "c10::Half", "int64": "long int"}
        c["bfloat16"] = "c10::BFloat16"
        a, b = (c.get(d.name, d.name) for d in (x.dtype, o.dtype))
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {a} != {b}")
    return o


class ToDevice(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x, device):
        self.src = device_of(x)
        return to_device(x, device)

    def backward(self, g):
        if isinstance(g, Tensor):  # recorded (create_graph): the move back is an op too
            return ToDevice.apply(g, self.src), None
        return to_device(g, self.src), None


autograd.register_tensor_type(Tensor)
