"""PyTorch's dimension rules, in one place: every ``dim`` argument is checked here.

Imports: nothing.
"""

from __future__ import annotations


def wrap_dim(op: str, dim, ndim: int) -> int:
    """``dim`` as a non-negative axis of an ``ndim``-d tensor, or PyTorch's IndexError.

    As in PyTorch a 0-d tensor accepts dims -1 and 0.
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        if hasattr(dim, "__index__"):
            dim = int(dim.__index__())
        else:
            raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"{op}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
            f"but got {dim})"
        )
    return dim % n


def wrap_dims(op: str, dims, ndim: int) -> tuple:
    """A tuple of distinct non-negative axes (``None`` is every axis)."""
    if dims is None:
        return tuple(range(ndim))
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = tuple(wrap_dim(op, d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: dim {dims} names the same dimension twice")
    return out


def size_args(args) -> tuple:
    """Sizes given as f(2, 3), f((2, 3)) or f([2, 3]), as a tuple."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)
