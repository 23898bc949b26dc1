"""``tg.save(obj, path)`` / ``tg.load(path)``: state dicts of tensors, without pickle.

The tensors (and arrays) go into one safetensors file; everything else in ``obj`` (nested
dicts, lists, tuples, numbers, strings, None) goes, as JSON, into its metadata, with each
tensor replaced by a reference to its entry. Loading never executes code from the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from .backend import to_device, to_numpy
from .tensor import Tensor

_KEY = "tensorgrad.json"


def _encode(obj, arrays: dict, path: str):
    if isinstance(obj, (Tensor, np.ndarray)) or hasattr(obj, "__cuda_array_interface__"):
        name = path or "_"
        while name in arrays:  # {"a.b": x, "a": {"b": y}} spell the same path
            name += "'"
        arrays[name] = np.ascontiguousarray(to_numpy(obj.array if isinstance(obj, Tensor) else obj))
        return {"__tensor__" if isinstance(obj, Tensor) else "__array__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, arrays, f"{path}.{k}" if path else k) for k, v in obj.items()}
        return {
            "__items__": [
                [
                    _encode(k, arrays, f"{path}.key{i}"),
                    _encode(v, arrays, f"{path}.{k}" if path else str(k)),
                ]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, arrays, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"save: cannot store a {type(obj).__name__} (tensors, arrays, dicts, lists, "
        "tuples, numbers, strings and None only; no pickle)"
    )


def _decode(obj, arrays: dict, device):
    if isinstance(obj, list):
        return [_decode(v, arrays, device) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        a = arrays[obj["__tensor__"]]
        return Tensor(a if device is None else to_device(a, device), dtype=a.dtype)
    if "__array__" in obj:
        return arrays[obj["__array__"]]
    if "__tuple__" in obj:
        return tuple(_decode(v, arrays, device) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, arrays, device): _decode(v, arrays, device) for k, v in obj["__items__"]}
    return {k: _decode(v, arrays, device) for k, v in obj.items()}


def save(obj, f) -> None:
    """Write ``obj`` (a state dict, or a dict holding several) to the file ``f``."""
    arrays: dict = {}
    tree = _encode(obj, arrays, "")
    data = st_save(arrays, metadata={_KEY: json.dumps(tree)})
    path = Path(os.fspath(f))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a crash mid-write leaves the old file intact


def load(f, map_location=None, weights_only: bool = True):
    """Read what ``save`` wrote; tensors come back as Tensors (on ``map_location``, default
    the CPU), arrays as NumPy arrays. ``weights_only`` is accepted: nothing else is possible."""
    data = Path(os.fspath(f)).read_bytes()
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    if _KEY not in meta:
        raise ValueError(f"load: {f} was not written by tensorgrad.save (no {_KEY!r} metadata)")
    device = None if map_location in (None, "cpu") else str(map_location)
    return _decode(json.loads(meta[_KEY]), st_load(data), device)
