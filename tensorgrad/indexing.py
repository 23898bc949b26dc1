"""Indexing keys: PyTorch's indexing rule, on top of NumPy's.

The two differ where an integer meets an index array. NumPy counts the integer as one more
advanced index, so in ``x[0, :, [1, 2]]`` (x of shape (2, 3, 4)) the two advanced indices are
apart and the indexed dim moves to the front: shape (2, 3). PyTorch applies integers first, as
basic indexing, and then the arrays: shape (3, 2). ``index_steps`` turns a user's key into the
one or two NumPy keys that give PyTorch's result; every ``x[key]`` and ``x[key] = v`` goes
through it.

Imports: numpy.
"""

from __future__ import annotations

import numpy as np


def _is_tensor(k) -> bool:
    return hasattr(k, "grad") and hasattr(k, "grad_fn")  # a Tensor (this avoids an import cycle)


def _one(k, xp):
    if _is_tensor(k):
        return k.array
    if isinstance(k, list):
        # [] indexes nothing (int64, as PyTorch); lists of bools stay boolean masks
        return xp.asarray(k) if k else xp.zeros(0, dtype=np.int64)
    if xp is not np and isinstance(k, np.ndarray):
        return xp.asarray(k)  # NumPy index arrays used on a GPU tensor
    if isinstance(k, slice) and k.step is not None and int(k.step) < 0:
        raise ValueError(
            "step must be greater than zero (PyTorch has no negative steps; use .flip)"
        )
    return k


def _advanced(k) -> bool:
    return getattr(k, "ndim", 0) > 0 and hasattr(k, "dtype")


def _is_int(k) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def index_steps(key, xp=np) -> list:
    """The NumPy keys, applied one after the other, that index as PyTorch does ``key``.

    Tensors become their arrays and lists ``xp`` arrays (so that backward sees integer arrays
    and adds repeats). A key that mixes integers with index arrays becomes two: the integers
    (slices elsewhere), then the rest without them.
    """
    if not isinstance(key, tuple):  # one key: nothing to reorder
        return [_one(key, xp)]
    items = tuple(_one(k, xp) for k in key)
    if not (any(_is_int(k) for k in items) and any(_advanced(k) for k in items)):
        return [items]
    first, rest = [], []
    for k in items:
        if _is_int(k):
            first.append(k)
        elif k is None:
            rest.append(k)
        elif k is Ellipsis:
            first.append(k)
            rest.append(k)
        else:
            # a boolean mask spans as many dims as it has
            span = k.ndim if getattr(k, "dtype", None) is not None and k.dtype.kind == "b" else 1
            first.extend([slice(None)] * span)
            rest.append(k)
    return [tuple(first), tuple(rest)]
