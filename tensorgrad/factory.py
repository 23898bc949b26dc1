"""Creating tensors (tensor, zeros, randn, arange, ...) and combining them (cat, stack, where).

``randn`` and ``rand`` draw from the seeded generators of ``devices`` (``tg.manual_seed``), or
from ``generator=`` (a ``tg.Generator``, in ``sampling.py`` with the other random draws:
randint, randperm, multinomial).

Imports: numpy, .devices, .ops, .tensor, .types.
"""

from __future__ import annotations

import numpy as np

from . import devices
from .devices import device_of, parse_device, rng, xp_for
from .ops import shape as shape_ops
from .ops.dtypes import result_type, scalar_dtype
from .tensor import DEFAULT_DTYPE, Tensor, as_array
from .types import device as _device


def _shape(size):
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def _new(arr, requires_grad):
    t = Tensor._make(arr, None, 0)
    t.requires_grad = requires_grad
    return t


def set_default_device(device) -> None:
    """Where tensors and new modules' parameters are made when no device is given ('cpu',
    'cuda'; None: back to the CPU), as torch.set_default_device."""
    devices.set_default_device(device)


def get_default_device() -> _device:
    return _device(devices.default_device)


def _default(device):
    """``device``, or the default device when None and it is not the CPU (data stays put)."""
    return (
        device if device is not None or devices.default_device == "cpu" else devices.default_device
    )


def tensor(data, requires_grad: bool = False, dtype=None, device=None) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (as torch.tensor; ``as_tensor`` and
    ``from_numpy`` share memory); Python floats become float32, integers int64."""
    device = _default(device)
    t = Tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)
    src = data.array if isinstance(data, Tensor) else data
    same_device = devices.is_array(src) and device_of(src) == device_of(t.array)
    if same_device and devices.shares_memory(t.array, src):
        t.array = t.array.copy()
    return t


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """``data`` as a tensor, sharing its memory where dtype and device allow (torch.as_tensor);
    a Tensor of that dtype and device is returned as it is."""
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype) if dtype or device else data
    return Tensor(data, dtype=dtype, device=_default(device))


def zeros(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.zeros(_shape(size), dtype=dtype or DEFAULT_DTYPE), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.ones(_shape(size), dtype=dtype or DEFAULT_DTYPE), requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A tensor of ``fill_value``; its dtype follows the value as PyTorch's: bool, int64, or
    float32 for a float."""
    xp = xp_for(parse_device(device))
    v = fill_value.item() if isinstance(fill_value, Tensor) else fill_value
    dt = dtype or scalar_dtype(v)
    return _new(xp.full(_shape((size,)), v, dtype=dt), requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    return zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def _like(t, dtype, device):
    return t.shape, dtype or t.dtype, device or t.device


def zeros_like(t: Tensor, dtype=None, device=None, requires_grad=False) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return zeros(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def ones_like(t: Tensor, dtype=None, device=None, requires_grad=False) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return ones(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def full_like(t: Tensor, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return full(shape, fill_value, dtype=dtype, device=device, requires_grad=requires_grad)


empty_like = zeros_like


# ----------------------------------------------------------------------------- random
def _gen(generator, device):
    """The backend generator to draw from: ``generator``'s (a tg.Generator) or the seeded one."""
    return generator.rng(device) if generator else rng(device)


def _draw_float(g, method: str, shape, dtype):
    dt = np.dtype(dtype or DEFAULT_DTYPE)
    if dt.kind != "f" and dt is not devices.BFLOAT16:
        raise TypeError(f"{method}: dtype must be a floating type, got {dt}")
    # the generators draw float32 or float64 only; other floats are cast from float32
    direct = dt in (np.dtype(np.float32), np.dtype(np.float64))
    arr = getattr(g, method)(shape, dtype=dt if direct else np.float32)
    return arr if direct else arr.astype(dt)


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None) -> Tensor:
    """Standard normal samples from the seeded generator (``tg.manual_seed``)."""
    g = _gen(generator, parse_device(device))
    return _new(_draw_float(g, "standard_normal", _shape(size), dtype), requires_grad)


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None) -> Tensor:
    """Uniform samples in [0, 1) from the seeded generator."""
    g = _gen(generator, parse_device(device))
    return _new(_draw_float(g, "random", _shape(size), dtype), requires_grad)


def randn_like(t: Tensor, dtype=None, device=None, requires_grad=False) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return randn(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def rand_like(t: Tensor, dtype=None, device=None, requires_grad=False) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return rand(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None) -> Tensor:
    if end is None:
        start, end = 0, start
    xp = xp_for(parse_device(device))
    if dtype is None:
        ints = all(isinstance(v, int) for v in (start, end, step))
        dtype = np.int64 if ints else DEFAULT_DTYPE
    return _new(xp.arange(start, end, step, dtype=dtype), False)


def _promoted(op: str, tensors) -> list:
    """Tensors (lists and arrays become tensors) cast to their PyTorch result type."""
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError(f"{op}: expected a non-empty list of tensors")
    _same_device(op, tensors)
    dt = result_type(*tensors)
    return [t.astype(dt) for t in tensors]


def cat(tensors, dim: int = 0) -> Tensor:
    """Join along ``dim``; mixed dtypes promote as PyTorch (int64 with float32 is float32)."""
    return shape_ops.Cat.apply(*_promoted("cat", tensors), dim=dim)


concat = cat


def stack(tensors, dim: int = 0) -> Tensor:
    return shape_ops.Stack.apply(*_promoted("stack", tensors), dim=dim)


def where(condition, x=None, y=None) -> Tensor:
    """Elements of x where condition holds, else of y (broadcast; Python numbers allowed), in
    their PyTorch result type (an int tensor and 0.5 give float32). ``where(condition)`` alone
    is ``condition.nonzero(as_tuple=True)``."""
    if x is None and y is None:
        c = condition if isinstance(condition, Tensor) else Tensor(condition)
        return c.nonzero(as_tuple=True)
    if not isinstance(x, Tensor):
        dev = y.device if isinstance(y, Tensor) else None  # numbers join the tensor's device
        ops = [v if isinstance(v, (Tensor, bool, int, float)) else Tensor(v) for v in (x, y)]
        x = Tensor(as_array(x, dtype=result_type(*ops), device=dev))
    return x.where(condition, y)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """x with the elements above the ``diagonal``-th diagonal zeroed (last two dims)."""
    return (x if isinstance(x, Tensor) else Tensor(x)).tril(diagonal)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """x with the elements below the ``diagonal``-th diagonal zeroed (last two dims)."""
    return (x if isinstance(x, Tensor) else Tensor(x)).triu(diagonal)


def eye(n: int, m: int | None = None, dtype=None, device=None) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.eye(n, m, dtype=dtype or DEFAULT_DTYPE), False)


def linspace(start, end, steps: int, dtype=None, device=None) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.linspace(start, end, steps, dtype=dtype or DEFAULT_DTYPE), False)


def _same_device(op: str, tensors):
    devs = {device_of(t.array) for t in tensors}
    if len(devs) > 1:
        raise RuntimeError(f"{op}: expected all tensors on the same device, got {sorted(devs)}")
