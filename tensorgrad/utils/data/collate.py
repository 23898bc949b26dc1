"""How a DataLoader turns a list of samples into one batch (``default_collate``) and how it
converts single samples when it does not batch (``default_convert``), as in torch.utils.data.

default_collate, by the type of the first sample (``batch[0]``, as PyTorch's):
    Tensor            -> stack along a new dim 0 (every sample must have the same shape)
    NumPy array       -> stacked, as a Tensor of the array's dtype
    NumPy scalar      -> a 1-d Tensor: NumPy scalars only, of their promoted dtype; mixed
                         with Python numbers, the dtype torch.as_tensor infers
    float             -> a 1-d float64 Tensor (any ints and bools after it become floats)
    int / bool        -> a 1-d Tensor of the dtype torch.tensor infers from all of them:
                         bool if all are bools, float32 if any is a float, else int64
                         ([1, 2.5] -> [1.0, 2.5] float32; [True, 2] -> [1, 2] int64)
    str / bytes       -> the list unchanged
    dict (Mapping)    -> a dict of the same keys, each value collated
    namedtuple        -> the same namedtuple, each field collated
    tuple / list      -> a list (a tuple becomes a list, as in PyTorch) of collated positions
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...factory import stack, tensor
from ...tensor import Tensor


def _array_to_tensor(a: np.ndarray) -> Tensor:
    return Tensor(np.ascontiguousarray(a), dtype=a.dtype)


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
        if elem.dtype.kind in "SUO":
            raise TypeError(f"default_collate: cannot batch NumPy arrays of dtype {elem.dtype}")
        return _array_to_tensor(np.stack(batch))
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        if all(isinstance(x, np.generic) for x in batch):
            return _array_to_tensor(np.asarray(batch))
        return tensor(batch)
    if isinstance(elem, float):
        return tensor(batch, dtype=np.float64)
    if isinstance(elem, int):  # a bool is an int; the dtype follows every sample, not the first
        return tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, Mapping):
        out = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(out)
        except TypeError:  # a Mapping that cannot be built from a dict
            return out
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, Sequence):
        if len({len(e) for e in batch}) > 1:
            raise RuntimeError(
                "default_collate: each element in list of batch should be of equal size"
            )
        return [default_collate(list(s)) for s in zip(*batch)]
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
