"""Creating tensors (tensor, zeros, randn, arange, ...) and combining them (cat, stack, where)."""

from __future__ import annotations

import numpy as np

from .backend import device_of, parse_device, rng, xp_for
from .tensor import DEFAULT_DTYPE, Tensor, as_array


def _shape(size):
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def _new(arr, requires_grad):
    t = Tensor._make(arr, None, 0)
    t.requires_grad = requires_grad
    return t


def tensor(data, requires_grad: bool = False, dtype=None, device=None) -> Tensor:
    """A new leaf tensor; Python floats become float32, integers int64, as in PyTorch."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)


def zeros(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.zeros(_shape(size), dtype=dtype or DEFAULT_DTYPE), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.ones(_shape(size), dtype=dtype or DEFAULT_DTYPE), requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    xp = xp_for(parse_device(device))
    return _new(xp.full(tuple(size), fill_value, dtype=dtype or DEFAULT_DTYPE), requires_grad)


def empty(*size, dtype=None, device=None) -> Tensor:
    return zeros(*size, dtype=dtype, device=device)


def zeros_like(t: Tensor, dtype=None) -> Tensor:
    return zeros(t.shape, dtype=dtype or t.dtype, device=t.device)


def ones_like(t: Tensor, dtype=None) -> Tensor:
    return ones(t.shape, dtype=dtype or t.dtype, device=t.device)


def randn(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Standard normal samples from the seeded generator (``tg.manual_seed``)."""
    dev = parse_device(device)
    arr = rng(dev).standard_normal(_shape(size), dtype=np.dtype(dtype or DEFAULT_DTYPE))
    return _new(arr, requires_grad)


def rand(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = parse_device(device)
    arr = rng(dev).random(_shape(size), dtype=np.dtype(dtype or DEFAULT_DTYPE))
    return _new(arr, requires_grad)


def randint(low: int, high: int, size, dtype=None, device=None) -> Tensor:
    dev = parse_device(device)
    arr = rng(dev).integers(low, high, size=tuple(size), dtype=np.dtype(dtype or np.int64))
    return _new(arr, False)


def arange(start, end=None, step=1, dtype=None, device=None) -> Tensor:
    if end is None:
        start, end = 0, start
    xp = xp_for(parse_device(device))
    if dtype is None:
        ints = all(isinstance(v, int) for v in (start, end, step))
        dtype = np.int64 if ints else DEFAULT_DTYPE
    return _new(xp.arange(start, end, step, dtype=dtype), False)


def cat(tensors, dim: int = 0) -> Tensor:
    from .ops.shape import Cat

    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    _same_device("cat", tensors)
    return Cat.apply(*tensors, dim=dim)


concat = cat


def stack(tensors, dim: int = 0) -> Tensor:
    from .ops.shape import Stack

    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    _same_device("stack", tensors)
    return Stack.apply(*tensors, dim=dim)


def where(condition, x, y) -> Tensor:
    """Elements of x where condition holds, else of y (broadcast; scalars allowed)."""
    from .ops.elementwise import Where

    c = as_array(condition)
    if c.dtype != np.bool_:
        raise TypeError(f"where: condition must be boolean, got {c.dtype}")
    ref = x if isinstance(x, Tensor) else y
    dev = ref.device if isinstance(ref, Tensor) else None  # scalars join the tensor's device
    if not isinstance(x, Tensor):
        x = Tensor(as_array(x, dtype=getattr(ref, "dtype", None), device=dev))
    if not isinstance(y, Tensor):
        y = Tensor(as_array(y, dtype=x.dtype, device=dev))
    _same_device("where", [x, y])
    return Where.apply(c, x, y)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """x with the elements above the ``diagonal``-th diagonal zeroed (last two dims)."""
    xp = xp_for(x.device)
    return where(Tensor(xp.tril(xp.ones(x.shape[-2:], dtype=bool), k=diagonal)), x, 0.0)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """x with the elements below the ``diagonal``-th diagonal zeroed (last two dims)."""
    xp = xp_for(x.device)
    return where(Tensor(xp.triu(xp.ones(x.shape[-2:], dtype=bool), k=diagonal)), x, 0.0)


def _same_device(op: str, tensors):
    devs = {device_of(t.data) for t in tensors}
    if len(devs) > 1:
        raise RuntimeError(f"{op}: expected all tensors on the same device, got {sorted(devs)}")
