"""How a DataLoader turns a list of samples into one batch (``default_collate``) and how it
converts single samples when it does not batch (``default_convert``), as in torch.utils.data.

default_collate, by the type of the first sample (``batch[0]``, as PyTorch's):
    Tensor            -> stack along a new dim 0 (every sample must have the same shape)
    NumPy array       -> stacked, as a Tensor of the array's dtype
    NumPy scalar      -> a 1-d Tensor of the dtype torch.tensor infers (as int / bool)
    float             -> a 1-d float64 Tensor (every sample a real number, else TypeError)
    int / bool        -> a 1-d Tensor of the dtype torch.tensor infers from all of them:
                         bool, int64, float32, complex64 or a NumPy scalar's own dtype,
                         promoted as torch.promote_types ([1, 2.5] -> float32,
                         [True, 2] -> int64, [1, np.float64(2.5)] -> float64); a string
                         is a TypeError, an int beyond int64 a ValueError
    str / bytes       -> the list unchanged
    dict (Mapping)    -> a dict of the same keys, each value collated
    namedtuple        -> the same namedtuple, each field collated
    tuple / list      -> a list (a tuple becomes a list, as in PyTorch) of collated positions
    anything else     -> TypeError (None, complex first, NumPy datetimes, ...)

Imports: collections, numpy, ...factory, ...tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...factory import stack
from ...tensor import Tensor


def _array_to_tensor(a: np.ndarray) -> Tensor:
    return Tensor(np.ascontiguousarray(a), dtype=a.dtype)


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
_UNPROMOTABLE = (np.uint16, np.uint32, np.uint64)  # torch refuses to promote these


def _scalar_dtype(x) -> np.dtype:
    """The dtype torch.tensor infers for one number: bool, int64, float32 (the default),
    complex64, or a NumPy scalar's (or 0-d array's) own dtype."""
    if isinstance(x, (np.generic, np.ndarray)) and x.ndim == 0 and x.dtype.kind in _KIND_RANK:
        return x.dtype
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, int):
        return np.dtype(np.int64)
    if isinstance(x, float):
        return np.dtype(np.float32)
    if isinstance(x, complex):
        return np.dtype(np.complex64)
    if isinstance(x, (str, bytes, Sequence, np.ndarray)):
        raise TypeError(f"default_collate: cannot batch a {type(x).__name__} with numbers")
    raise RuntimeError(f"default_collate: could not infer the dtype of {type(x).__name__}")


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch.promote_types: the higher kind (bool < int < float < complex) wins, its own size
    kept (int64 with float16 is float16); within a kind, and complex with float, as NumPy."""
    if a == b:
        return a
    if a.type in _UNPROMOTABLE or b.type in _UNPROMOTABLE:
        raise RuntimeError(f"default_collate: promotion of {a} with {b} is not supported")
    ra, rb = _KIND_RANK[a.kind], _KIND_RANK[b.kind]
    if ra == rb or {ra, rb} == {2, 3}:
        return np.promote_types(a, b)
    return a if ra > rb else b


def _numbers(batch) -> Tensor:
    """A list of numbers as torch.tensor makes it: one dtype promoted over every sample; an
    int that does not fit int64 is an error, as in PyTorch, not an object or float array."""
    dtype = _scalar_dtype(batch[0])
    for x in batch[1:]:
        dtype = _promote(dtype, _scalar_dtype(x))
    if dtype == np.int64:
        for x in batch:
            if isinstance(x, int) and not -(2**63) <= x < 2**63:
                raise ValueError(f"default_collate: the int {str(x)[:30]} does not fit int64")
    return _array_to_tensor(np.array(batch, dtype=dtype))


def _reals(batch) -> Tensor:
    """A batch whose first sample is a float: float64, every sample a real number."""
    for x in batch:
        ok = isinstance(x, (int, float, np.ndarray, np.generic))
        if (
            not ok
            or isinstance(x, (np.ndarray, np.generic))
            and (x.ndim or x.dtype.kind not in "biuf")
        ):
            raise TypeError(f"default_collate: must be real number, not {type(x).__name__}")
    return _array_to_tensor(np.array(batch, dtype=np.float64))


def default_collate(batch):
    """Merge a list of samples into a batch (see the module docstring for each type)."""
    if not isinstance(batch, (list, tuple)) or not batch:
        raise TypeError(f"default_collate: expected a non-empty list of samples, got {batch!r}")
    elem = batch[0]
    if isinstance(elem, Tensor):
        shapes = {tuple(t.shape) for t in batch}
        if len(shapes) > 1:
            raise RuntimeError(
                f"default_collate: stack expects each tensor to be equal size, got {sorted(shapes)}"
            )
        return stack(list(batch), 0)
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind not in _KIND_RANK:
            raise TypeError(f"default_collate: cannot batch NumPy arrays of dtype {elem.dtype}")
        return _array_to_tensor(np.stack(batch))
    if isinstance(elem, np.generic) and elem.dtype.kind in _KIND_RANK:
        return _numbers(batch)
    if isinstance(elem, float):
        return _reals(batch)
    if isinstance(elem, int):  # a bool is an int; the dtype follows every sample
        return _numbers(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, Mapping):
        out = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(out)
        except TypeError:  # a Mapping that cannot be built from a dict
            return out
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(s) for s in zip(*batch)))
    if isinstance(elem, Sequence):
        if len({len(e) for e in batch}) > 1:
            raise RuntimeError(
                "default_collate: each element in list of batch should be of equal size"
            )
        return [default_collate(s) for s in zip(*batch)]  # strings stay a tuple, as in PyTorch
    raise TypeError(
        "default_collate: batch must contain tensors, NumPy arrays, numbers, dicts or lists; "
        f"found {type(elem).__name__}"
    )


def default_convert(data):
    """One sample as the DataLoader returns it with ``batch_size=None``: NumPy arrays and
    scalars become Tensors, inside dicts, tuples and lists too; everything else is unchanged."""
    if isinstance(data, np.ndarray) and data.dtype.kind not in "SUO":
        return _array_to_tensor(data)
    if isinstance(data, np.generic) and not isinstance(data, (np.str_, np.bytes_)):
        return _array_to_tensor(np.asarray(data))
    if isinstance(data, Mapping):
        return {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(v) for v in data))
    if isinstance(data, tuple):
        return [default_convert(v) for v in data]
    if isinstance(data, list):
        return [default_convert(v) for v in data]
    return data
