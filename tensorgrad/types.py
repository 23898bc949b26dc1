"""dtypes and devices as PyTorch names and prints them: ``tg.float32``, ``tg.device('cpu')``,
``tg.finfo``, ``tg.iinfo``.

A ``dtype`` wraps a NumPy dtype: NumPy and CuPy accept it wherever they take a dtype (through
its ``.dtype``), it equals the NumPy dtype and its scalar type (``x.dtype == np.float32``),
and it answers NumPy's attributes (``kind``, ``itemsize``). ``bfloat16`` wraps ml_dtypes'
bfloat16 (NumPy kind 'V', 'f' here); without ml_dtypes it is a ``ReducedFloat`` whose use as
storage raises. A ``device`` is a ``str`` ('cpu' or 'cuda') with PyTorch's ``.type`` and
``.index``.

Imports: dataclasses, ml_dtypes, numpy, .devices, .tensor_inplace.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .devices import BFLOAT16, parse_device
from .tensor_inplace import InPlace

try:  # NumPy's finfo, knowing bfloat16 (np.finfo does since ml_dtypes 0.7)
    from ml_dtypes import finfo as _finfo
except ImportError:
    _finfo = np.finfo


class dtype:  # noqa: N801  (torch.dtype)
    """A tensor element type (``tg.float32``); ``np.dtype(tg.float32)`` is NumPy's."""

    __slots__ = ("dtype", "kind")  # kind kept as a slot: ``x.dtype.kind`` is asked per op

    def __init__(self, np_dtype):
        object.__setattr__(self, "dtype", np.dtype(np_dtype))
        # bfloat16 (ml_dtypes) is NumPy kind 'V'; as a tensor's dtype it is a float
        object.__setattr__(self, "kind", "f" if self.dtype is BFLOAT16 else self.dtype.kind)

    def __repr__(self) -> str:
        return f"torch.{self.dtype.name}"

    __str__ = __repr__

    def __eq__(self, other):
        if isinstance(other, str) and other.startswith("torch."):
            other = other[6:]
        try:
            return self.dtype == np.dtype(other)
        except TypeError:
            return NotImplemented

    def __hash__(self):
        return hash(self.dtype)

    def __getattr__(self, name):  # kind, type, name, char, str: NumPy's answers
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dtype, name)

    def __copy__(self):
        return self  # one object per dtype

    def __deepcopy__(self, memo):
        return self

    @property
    def is_floating_point(self) -> bool:
        return self.kind == "f"

    @property
    def is_signed(self) -> bool:
        return self.kind in "fi"

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


_CACHE: dict = {}


def as_dtype(d) -> dtype:
    """The one ``dtype`` object for anything NumPy reads as a dtype."""
    out = _CACHE.get(d) if isinstance(d, np.dtype) else None  # a tensor's own: no conversion
    if out is None:
        key = np.dtype(d)
        out = _CACHE.get(key)
        if out is None:
            out = _CACHE[key] = dtype(key)
    return out


class ReducedFloat:
    """``tensorgrad.bfloat16`` without ml_dtypes: accepted by autocast on 'cuda'; as a
    tensor's dtype it raises TypeError."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"tensorgrad.{self.name}"

    @property
    def dtype(self):  # NumPy reads .dtype when given this object as a dtype
        raise TypeError(
            f"tensorgrad.{self.name} tensors need ml_dtypes (NumPy's {self.name}): "
            "pip install ml_dtypes"
        )

    @property
    def itemsize(self) -> int:
        return 2

    is_floating_point = True


bfloat16 = as_dtype(BFLOAT16) if BFLOAT16 is not None else ReducedFloat("bfloat16")


class device(str):  # noqa: N801  (torch.device)
    """A device: 'cpu' or 'cuda' (a str, so ``x.device == 'cuda'`` holds), with ``.type``."""

    def __new__(cls, type_: str = "cpu", index: int | None = None):
        t = str(type_)
        if ":" in t:
            t, idx = t.split(":", 1)
            index = int(idx)
        if t not in ("cpu", "cuda"):
            raise RuntimeError(f"unknown device {type_!r}: expected 'cpu' or 'cuda'")
        d = str.__new__(cls, t)
        d._index = index
        return d

    @property
    def type(self) -> str:
        return str.__str__(self)

    @property
    def index(self) -> int | None:
        return self._index

    def __repr__(self) -> str:
        idx = "" if self._index is None else f", index={self._index}"
        return f"device(type='{self.type}'{idx})"


class finfo:  # noqa: N801  (torch.finfo)
    """Limits of a floating dtype: ``eps``, ``max``, ``min``, ``tiny``, ``bits``, ``resolution``."""

    def __init__(self, type_=None):
        info = _finfo(np.dtype(type_ if type_ is not None else np.float32))
        self.bits, self.dtype = info.bits, repr(as_dtype(info.dtype))[6:]
        self.eps, self.max, self.min = float(info.eps), float(info.max), float(info.min)
        self.tiny = self.smallest_normal = float(info.smallest_normal)
        self.resolution = float(info.resolution)


class iinfo:  # noqa: N801  (torch.iinfo)
    """Limits of an integer dtype: ``bits``, ``max``, ``min``."""

    def __init__(self, type_):
        info = np.iinfo(np.dtype(type_))
        self.bits, self.max, self.min = info.bits, int(info.max), int(info.min)
        self.dtype = repr(as_dtype(np.dtype(type_)))[6:]


def is_dtype(x) -> bool:
    if isinstance(x, (str, InPlace)) or x is None:
        return False
    try:
        np.dtype(x)
    except TypeError:  # tensorgrad.bfloat16 without ml_dtypes (no storage) is still a dtype:
        return isinstance(getattr(type(x), "dtype", None), property)  # using it says why
    return True


def to_args(args, kwargs):
    """(device, dtype) from PyTorch's .to() forms: to(device), to(dtype), to(device, dtype),
    to(tensor), and the keywords device=, dtype= (non_blocking= and copy= are accepted)."""
    device_, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, InPlace):
            device_, dtype = a.device, a.dtype
        elif is_dtype(a):
            dtype = a
        else:
            device_ = a
    return (None if device_ is None else parse_device(device_)), dtype


class Size(tuple):
    """A shape: a tuple with torch.Size's ``numel()``, printed as ``torch.Size([2, 3])``."""

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    def __getitem__(self, i):
        out = tuple.__getitem__(self, i)
        return Size(out) if isinstance(i, slice) else out

    def __repr__(self) -> str:
        return f"torch.Size({list(self)})"

    __str__ = __repr__


def rebuild_dataclass(cls, fields: dict):
    """An instance of dataclass ``cls`` from its fields: the init fields through ``__init__``
    (so __post_init__ runs), the others set after (compile's outputs, a loaded checkpoint)."""
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    obj = cls(**{k: v for k, v in fields.items() if k in init})
    for k, v in fields.items():
        if k not in init:
            object.__setattr__(obj, k, v)
    return obj
