"""Tensor: an array, its gradient, and the graph node that produced it.

Operators and methods mirror PyTorch's names and arguments (``dim``, ``keepdim``),
so nanoGPT-style code ports line for line. Each method is a thin call into a
Function from ``ops/``; nothing here computes on arrays except the no-grad
comparisons and in-place writes.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from . import autograd
from .autograd import Function, is_grad_enabled
from .backend import device_of, get_array_module, parse_device, to_device, to_numpy, xp_for

DEFAULT_DTYPE = np.float32
_FLOAT_KINDS = "f"

MaxResult = namedtuple("MaxResult", ["values", "indices"])


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


class Tensor:
    """An n-d array with reverse-mode autograd (float32 unless a dtype is given)."""

    __slots__ = ("data", "grad", "_requires_grad", "_node", "_out_index", "_version", "name",
                 "__weakref__")
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
        self._requires_grad = False
        self.requires_grad = requires_grad

    @classmethod
    def _make(cls, data, node, index):
        t = object.__new__(cls)
        t.data, t.grad, t._node, t._out_index, t._version, t.name = data, None, node, index, [0], None
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
            raise RuntimeError("requires_grad can only be turned off on leaf tensors; use .detach()")
        self._requires_grad = bool(value)

    def requires_grad_(self, value: bool = True) -> "Tensor":
        self.requires_grad = value
        return self

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self) -> Function | None:
        return self._node

    shape = property(lambda self: tuple(self.data.shape))
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    device = property(lambda self: device_of(self.data))
    T = property(lambda self: self.permute(*reversed(range(self.ndim))))
    mT = property(lambda self: self.transpose(-2, -1))

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        extra = ", requires_grad=True" if self.requires_grad else ""
        dev = ", device='cuda'" if self.device == "cuda" else ""
        body = np.array2string(to_numpy(self.data), precision=4, separator=", ", threshold=50)
        return f"tensor({body}, dtype={self.dtype}{dev}{extra})"

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (copied to the host when on the GPU)."""
        return to_numpy(self.data)

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

    def __bool__(self):
        return bool(self.item())

    def detach(self) -> "Tensor":
        t = Tensor._make(self.data, None, 0)
        t._version = self._version  # shares storage, so shares the version counter
        return t

    def to(self, device=None, dtype=None) -> "Tensor":
        """Move to 'cpu'/'cuda' and/or cast; differentiable, and a no-op when nothing changes."""
        if device is not None and not isinstance(device, str) and dtype is None:
            device, dtype = None, device  # t.to(tg.float64)
        out = self
        if device is not None and parse_device(device) != self.device:
            out = ToDevice.apply(out, parse_device(device))
        if dtype is not None and np.dtype(dtype) != self.dtype:
            out = out.astype(dtype)
        return out

    def cuda(self) -> "Tensor":
        return self.to("cuda")

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def astype(self, dtype) -> "Tensor":
        from .ops.elementwise import Cast

        if np.dtype(dtype) == self.dtype:
            return self
        return Cast.apply(self, np.dtype(dtype))

    def float(self):
        return self.astype(np.float32)

    def double(self):
        return self.astype(np.float64)

    def long(self):
        return self.astype(np.int64)

    def int(self):
        return self.astype(np.int32)

    def bool(self):
        return self.astype(np.bool_)

    type_as = lambda self, other: self.astype(other.dtype)  # noqa: E731

    # ------------------------------------------------------------------ autograd
    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        autograd.backward(self, gradient, retain_graph=retain_graph)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` during backward."""
        if self._node is not None:
            if self._node.retained is None:
                self._node.retained = {}
            self._node.retained[self._out_index] = self

    def _accumulate_grad(self, g):
        if g.dtype != self.data.dtype:
            g = g.astype(self.data.dtype)
        if g.shape != self.data.shape:
            g = get_array_module(g).broadcast_to(g, self.data.shape)
        if self.grad is None:
            if not getattr(g.flags, "writeable", True):
                g = g.copy()  # a broadcast view (from sum/mean/expand): .grad must be writable
            self.grad = Tensor._make(g, None, 0)
        else:
            self.grad = Tensor._make(self.grad.data + g, None, 0)

    def zero_(self) -> "Tensor":
        with autograd.no_grad():
            self[...] = 0
        return self

    # ------------------------------------------------------------------ arithmetic
    def _binary(self, cls, other, reflected=False):
        from .ops.elementwise import Cast

        x = self
        if isinstance(other, np.generic):
            other = other.item()  # NumPy scalars act as Python scalars (float32 stays float32)
        if not isinstance(other, Tensor):
            if isinstance(other, (bool, int, float)):
                if isinstance(other, float) and x.dtype.kind not in "fc":
                    x = Cast.apply(x, DEFAULT_DTYPE)  # int tensor * 0.5 -> float32
            else:
                other = Tensor(other)
        elif other.device != self.device:
            raise RuntimeError(
                f"{cls.__name__.lower()}: expected all tensors on the same device, got "
                f"{self.device} and {other.device}"
            )
        return cls.apply(other, x) if reflected else cls.apply(x, other)

    def __add__(self, o):
        from .ops.elementwise import Add

        return self._binary(Add, o)

    def __radd__(self, o):
        from .ops.elementwise import Add

        return self._binary(Add, o, True)

    def __sub__(self, o):
        from .ops.elementwise import Sub

        return self._binary(Sub, o)

    def __rsub__(self, o):
        from .ops.elementwise import Sub

        return self._binary(Sub, o, True)

    def __mul__(self, o):
        from .ops.elementwise import Mul

        return self._binary(Mul, o)

    def __rmul__(self, o):
        from .ops.elementwise import Mul

        return self._binary(Mul, o, True)

    def __truediv__(self, o):
        from .ops.elementwise import Div

        return self._binary(Div, o)

    def __rtruediv__(self, o):
        from .ops.elementwise import Div

        return self._binary(Div, o, True)

    def __pow__(self, o):
        from .ops.elementwise import Pow

        return self._binary(Pow, o)

    def __rpow__(self, o):
        from .ops.elementwise import Pow

        return self._binary(Pow, o, True)

    def __neg__(self):
        from .ops.elementwise import Neg

        return Neg.apply(self)

    def __matmul__(self, o):
        from .ops.linalg import MatMul

        return self._binary(MatMul, o)

    def __rmatmul__(self, o):
        from .ops.linalg import MatMul

        return self._binary(MatMul, o, True)

    matmul = __matmul__
    add, sub, mul, div, pow = __add__, __sub__, __mul__, __truediv__, __pow__

    # comparisons and logic: no gradient, boolean results
    def _compare(self, op, other):
        other = other.data if isinstance(other, Tensor) else other
        return Tensor._make(op(self.data, other), None, 0)

    __eq__ = lambda self, o: self._compare(lambda a, b: a == b, o)  # noqa: E731
    __ne__ = lambda self, o: self._compare(lambda a, b: a != b, o)  # noqa: E731
    __lt__ = lambda self, o: self._compare(lambda a, b: a < b, o)  # noqa: E731
    __le__ = lambda self, o: self._compare(lambda a, b: a <= b, o)  # noqa: E731
    __gt__ = lambda self, o: self._compare(lambda a, b: a > b, o)  # noqa: E731
    __ge__ = lambda self, o: self._compare(lambda a, b: a >= b, o)  # noqa: E731
    __and__ = lambda self, o: self._compare(lambda a, b: a & b, o)  # noqa: E731
    __or__ = lambda self, o: self._compare(lambda a, b: a | b, o)  # noqa: E731
    __invert__ = lambda self: Tensor._make(~self.data, None, 0)  # noqa: E731
    __hash__ = object.__hash__
    eq, ne, lt, le, gt, ge = __eq__, __ne__, __lt__, __le__, __gt__, __ge__

    # ------------------------------------------------------------------ in place
    def _inplace(self, cls, other):
        """x op= y: write the result into x's array, bump its version, adopt the new node."""
        if self.requires_grad and self._node is None and is_grad_enabled():
            raise RuntimeError(
                "a leaf tensor that requires grad is used in an in-place operation; "
                "wrap it in `with tg.no_grad():` or use an out-of-place op"
            )
        r = self._binary(cls, other)
        if r.shape != self.shape:
            raise ValueError(
                f"in-place op: result shape {r.shape} does not fit the tensor's shape {self.shape}"
            )
        get_array_module(self.data).copyto(self.data, r.data, casting="same_kind")
        self._version[0] += 1
        if r._node is not None:
            self._node, self._out_index, self._requires_grad = r._node, r._out_index, True
            r._node.out_meta[r._out_index] = (self.data.shape, self.data.dtype)
        return self

    def __iadd__(self, o):
        from .ops.elementwise import Add

        return self._inplace(Add, o)

    def __isub__(self, o):
        from .ops.elementwise import Sub

        return self._inplace(Sub, o)

    def __imul__(self, o):
        from .ops.elementwise import Mul

        return self._inplace(Mul, o)

    def __itruediv__(self, o):
        from .ops.elementwise import Div

        return self._inplace(Div, o)

    def __setitem__(self, key, value):
        if is_grad_enabled() and (
            self.requires_grad or (isinstance(value, Tensor) and value.requires_grad)
        ):
            raise RuntimeError(
                "item assignment into a tensor that takes part in autograd is not supported; "
                "build the result with tg.where, masked_fill or tg.cat, or use tg.no_grad()"
            )
        xp = get_array_module(self.data)
        v = value.data if isinstance(value, Tensor) else value
        if isinstance(v, (list, tuple, np.ndarray)) and xp is not np:
            v = xp.asarray(v)  # host values written into a GPU tensor
        self.data[_index_key(key, xp)] = v
        self._version[0] += 1

    # ------------------------------------------------------------------ unary math
    def _unary(self, name):
        from .ops import elementwise

        return getattr(elementwise, name).apply(self)

    exp = lambda self: self._unary("Exp")  # noqa: E731
    log = lambda self: self._unary("Log")  # noqa: E731
    sqrt = lambda self: self._unary("Sqrt")  # noqa: E731
    tanh = lambda self: self._unary("Tanh")  # noqa: E731
    abs = lambda self: self._unary("Abs")  # noqa: E731
    relu = lambda self: self._unary("Relu")  # noqa: E731
    sigmoid = lambda self: self._unary("Sigmoid")  # noqa: E731
    __abs__ = abs

    def rsqrt(self):
        return self.sqrt() ** -1

    def square(self):
        return self * self

    # ------------------------------------------------------------------ reductions
    def sum(self, dim=None, keepdim: bool = False):
        from .ops.reduce import Sum

        return Sum.apply(self, dim=dim, keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        from .ops.reduce import Mean

        return Mean.apply(self, dim=dim, keepdim=keepdim)

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None):
        """Variance; ``correction`` (or ``unbiased``) 1 divides by n-1 as PyTorch, 0 by n."""
        from .ops.reduce import Var

        c = (1 if unbiased else 0) if correction is None else correction
        return Var.apply(self, dim=dim, keepdim=keepdim, correction=c)

    def std(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        return self.var(dim, keepdim, unbiased).sqrt()

    def amax(self, dim=None, keepdim: bool = False):
        from .ops.reduce import Max

        return Max.apply(self, dim=dim, keepdim=keepdim)

    def amin(self, dim=None, keepdim: bool = False):
        return -(-self).amax(dim, keepdim)

    def max(self, dim=None, keepdim: bool = False):
        """max() -> scalar tensor; max(dim) -> (values, indices), as PyTorch."""
        if dim is None:
            return self.amax()
        return MaxResult(self.amax(dim, keepdim), self.argmax(dim, keepdim))

    def min(self, dim=None, keepdim: bool = False):
        if dim is None:
            return self.amin()
        return MaxResult(self.amin(dim, keepdim), self.argmin(dim, keepdim))

    def argmax(self, dim=None, keepdim: bool = False):
        xp = get_array_module(self.data)
        out = xp.argmax(self.data, axis=dim, keepdims=keepdim) if dim is not None else \
            xp.argmax(self.data)
        return Tensor._make(xp.asarray(out), None, 0)

    def argmin(self, dim=None, keepdim: bool = False):
        return (-self.detach()).argmax(dim, keepdim)

    def softmax(self, dim: int = -1):
        from .functional import softmax

        return softmax(self, dim)

    def log_softmax(self, dim: int = -1):
        from .functional import log_softmax

        return log_softmax(self, dim)

    # ------------------------------------------------------------------ shape
    def _view_of(self, out: "Tensor") -> "Tensor":
        out._version = self._version  # views share storage, so they share the version counter
        return out

    def view(self, *shape):
        from .ops.shape import Reshape

        return self._view_of(Reshape.apply(self, _dims(shape)))

    reshape = view

    def view_as(self, other):
        return self.view(other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        if self.ndim == 0:
            return self.view(1)
        s, e = start_dim % self.ndim, end_dim % self.ndim
        return self.view(*self.shape[:s], -1, *self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes):
        d = dim % self.ndim
        return self.view(*self.shape[:d], *sizes, *self.shape[d + 1 :])

    def permute(self, *dims):
        from .ops.shape import Permute

        return self._view_of(Permute.apply(self, _dims(dims)))

    def transpose(self, dim0: int, dim1: int):
        dims = list(range(self.ndim))
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return self.permute(*dims)

    def movedim(self, source: int, destination: int):
        dims = list(range(self.ndim))
        dims.insert(destination % self.ndim, dims.pop(source % self.ndim))
        return self.permute(*dims)

    def t(self):
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dims, got {self.ndim}")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def contiguous(self):
        from .ops.shape import Contiguous

        if self.data.flags.c_contiguous:
            return self
        return Contiguous.apply(self)

    def is_contiguous(self) -> bool:
        return bool(self.data.flags.c_contiguous)

    def unsqueeze(self, dim: int):
        d = dim % (self.ndim + 1)
        return self.view(*self.shape[:d], 1, *self.shape[d:])

    def squeeze(self, dim=None):
        if dim is None:
            return self.view(*[s for s in self.shape if s != 1])
        dims = {d % self.ndim for d in ((dim,) if isinstance(dim, int) else dim)}
        return self.view(*[s for i, s in enumerate(self.shape) if not (i in dims and s == 1)])

    def expand(self, *sizes):
        from .ops.shape import Expand

        return self._view_of(Expand.apply(self, _dims(sizes)))

    def expand_as(self, other):
        return self.expand(other.shape)

    def repeat(self, *sizes):
        from .factory import cat

        out = self
        sizes = _dims(sizes)
        out = out.view(*([1] * (len(sizes) - self.ndim)), *self.shape)
        for d, r in enumerate(sizes):
            if r != 1:
                out = cat([out] * r, dim=d)
        return out

    def __getitem__(self, key):
        from .ops.shape import GetItem

        out = GetItem.apply(self, _index_key(key, get_array_module(self.data)))
        if get_array_module(self.data).may_share_memory(out.data, self.data):
            self._view_of(out)  # basic indexing is a view: in-place writes must show up
        return out

    def split(self, split_size_or_sections, dim: int = 0):
        """Pieces of ``split_size`` along dim (the last may be smaller), or of the listed sizes."""
        from .ops.shape import Split

        d = dim % self.ndim
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
        return tuple(self._view_of(t) for t in Split.apply(self, sizes, d))

    def chunk(self, chunks: int, dim: int = 0):
        n = self.shape[dim % self.ndim]
        return self.split(-(-n // chunks), dim)

    def masked_fill(self, mask, value: float):
        """Copy of self with ``value`` where the broadcast boolean ``mask`` is True."""
        from .ops.elementwise import MaskedFill

        m = as_array(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill: mask must be boolean, got {m.dtype}")
        return MaskedFill.apply(self, m, value)

    def masked_fill_(self, mask, value: float):
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError("masked_fill_ on a tensor that requires grad; use masked_fill")
        m = as_array(mask)
        get_array_module(self.data).copyto(self.data, value, where=m)
        self._version[0] += 1
        return self


class ToDevice(Function):
    def forward(self, x, device):
        self.src = device_of(x)
        return to_device(x, device)

    def backward(self, g):
        return to_device(g, self.src), None

autograd.register_tensor_type(Tensor)
