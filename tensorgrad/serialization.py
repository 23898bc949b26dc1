"""``tg.save(obj, path)`` / ``tg.load(path)``: state dicts of tensors, without pickle.

The tensors (and arrays, and NumPy scalars) go into one safetensors file; everything else in
``obj`` (nested dicts, lists, tuples, numbers, strings, None; dataclasses, namedtuples, enums
and plain-field objects as their class's name and fields) goes, as JSON, into its metadata,
with each tensor replaced by a reference to its entry. load() gives an object's fields as a
dict, or the object where its class was allowed (``add_safe_globals``). Loading never executes code from the
file, and treats it as untrusted: it must be a regular file whose header describes exactly its
bytes, and only the arrays the JSON names are read (each once, at its offsets). Anything else
is one ``ValueError`` line: "load: <path> is not a tensorgrad file: ..." or "... is corrupt: ...".

Imports: argparse, contextlib, dataclasses, enum, errno, json, math, numpy, os, pathlib,
safetensors, secrets, stat, types, .devices, .tensor, .types.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import errno
import json
import math
import os
import secrets
import stat
import types
from pathlib import Path

import numpy as np
from safetensors.numpy import save as st_save

from .devices import BFLOAT16, to_device, to_numpy
from .tensor import Tensor
from .types import rebuild_dataclass

_KEY = "tensorgrad.json"
MAX_HEADER = 100 << 20  # bytes of JSON; a state dict with 10,000 tensors needs about 1 MB
MAX_DEPTH = 100  # containers inside one another; a checkpoint needs about 5
_DTYPES = {  # safetensors' names for the dtypes NumPy stores (little-endian on disk)
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "C64": np.complex64,
}
if BFLOAT16 is not None:  # (ml_dtypes): st_save writes it as U16, then _bf16_header says BF16
    _DTYPES["BF16"] = BFLOAT16
_STORED = {np.dtype(t) for t in _DTYPES.values()}
_ITEMSIZE = {k: np.dtype(t).itemsize for k, t in _DTYPES.items()}
_MARKERS = ("__tensor__", "__array__", "__scalar__", "__tuple__", "__items__", "__object__")


class _Arrays(dict):
    """save's arrays by name, and ``seen``: id -> (name, the array object stored under it)."""

    def __init__(self):
        super().__init__()
        self.seen: dict = {}


class _Refused(Exception):
    """Why a file cannot be loaded; load() turns it into one ValueError line with the path."""


# ----------------------------------------------------------------------------- save
def _host(x) -> np.ndarray:
    a = to_numpy(x)
    if a.dtype.newbyteorder("=") not in _STORED:  # complex128, str, object, structured...
        raise TypeError(f"save: cannot store dtype {a.dtype} (safetensors has no such dtype)")
    return np.ascontiguousarray(a).reshape(a.shape)  # ascontiguousarray makes a 0-d array 1-d


def _bf16_header(data: bytes, names: list) -> bytes:
    """The safetensors bytes with the entries ``names`` marked BF16 (written as U16)."""
    if not names:
        return data
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    for k in names:
        header[k]["dtype"] = "BF16"
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # (the data starts 8-aligned, as safetensors writes it)
    return len(h).to_bytes(8, "little") + h + data[8 + n :]


def _encode(obj, arrays: dict, path: str, depth: int = 0):
    if depth > MAX_DEPTH:
        raise ValueError(f"save: obj is nested more than {MAX_DEPTH} levels deep (or holds itself)")
    d = depth + 1
    is_tensor = isinstance(obj, Tensor)
    if is_tensor or isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        src = obj.array if is_tensor else obj
        name, _ = arrays.seen.get(id(src), (None, None))  # one array twice (tied weights):
        if name is None:  # stored once
            name = path or "_"
            while name in arrays:  # {"a.b": x, "a": {"b": y}} spell the same path
                name += "'"
            arrays[name] = _host(src)
            arrays.seen[id(src)] = (name, src)  # (src kept alive: its id is not reused)
        return {"__tensor__" if is_tensor else "__array__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, arrays, f"{path}.{k}" if path else k, d) for k, v in obj.items()}
        return {
            "__items__": [
                [
                    _encode(k, arrays, f"{path}.key{i}", d),
                    _encode(v, arrays, f"{path}.{k}" if path else str(k), d),
                ]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    fields = _fields_of(obj)
    if fields is not None:  # a dataclass, namedtuple, enum or plain-field object: as data
        kind, values = fields
        where = f"{path}." if path else ""
        enc = {k: _encode(v, arrays, f"{where}{k}", d) for k, v in values.items()}
        return {"__object__": {"class": class_name(type(obj)), "kind": kind, "fields": enc}}
    if isinstance(obj, (list, tuple)):
        items = [
            _encode(v, arrays, f"{path}.{i}" if path else str(i), d) for i, v in enumerate(obj)
        ]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, np.generic):
        if obj.dtype not in _STORED:  # e.g. np.str_: stored as the Python value
            v = obj.item()
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise TypeError(
                    f"save: cannot store dtype {obj.dtype} (no Python value JSON holds)"
                )
            return _encode(v, arrays, path, d)
        enc = _encode(np.asarray(obj), arrays, path, d)  # a 0-d array keeps the dtype
        return {"__scalar__": enc["__array__"]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"save: cannot store a {type(obj).__name__} (tensors, arrays, dicts, lists, tuples, "
        "numbers, strings, None, dataclasses, namedtuples, enums and plain-field objects only; "
        "no pickle)"
    )


# ----------------------------------------------------------------------------- objects as data
# A checkpoint's config object (build-nanogpt saves its GPTConfig dataclass) is stored as
# JSON: its class's name and its fields (no pickle, here or anywhere). load() gives back the
# fields as a plain dict, or the object itself where the user allowed its class with
# add_safe_globals (PyTorch's names for its weights-only loading): a class is found by its
# name among the allowed ones only, never imported by a name read from the file.
_SAFE: dict = {}  # class name -> class


def class_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def add_safe_globals(classes) -> None:
    """Allow load() to rebuild objects of these classes (dataclasses, namedtuples, enums,
    plain-field classes) instead of giving their fields as dicts."""
    for cls in classes:
        if not isinstance(cls, type):
            raise TypeError(f"add_safe_globals: {cls!r} is not a class")
        _SAFE[class_name(cls)] = cls


def get_safe_globals() -> list:
    return list(_SAFE.values())


def clear_safe_globals() -> None:
    _SAFE.clear()


@contextlib.contextmanager
def safe_globals(classes):
    """add_safe_globals for the block only (torch.serialization.safe_globals)."""
    before = dict(_SAFE)
    add_safe_globals(classes)
    try:
        yield
    finally:
        _SAFE.clear()
        _SAFE.update(before)


def _fields_of(obj):
    """(kind, {field: value}) of an object stored as data, or None."""
    if isinstance(obj, enum.Enum):
        return "enum", {"value": obj.value}
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return "namedtuple", dict(zip(type(obj)._fields, obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return "dataclass", {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, (types.SimpleNamespace, argparse.Namespace)):
        return "object", dict(vars(obj))
    return None


def _rebuild(spec: dict, fields: dict):
    """The object itself where its class is allowed; else its fields as a dict (an enum: its
    value)."""
    kind, name = spec.get("kind"), spec.get("class")
    if kind not in ("enum", "namedtuple", "dataclass", "object") or not isinstance(name, str):
        raise _Refused("is corrupt: it holds an object entry without a kind and a class")
    cls = _SAFE.get(name)
    if kind == "enum":
        return fields.get("value") if cls is None else cls(fields.get("value"))
    if cls is None:
        return fields
    try:
        if kind == "object":
            obj = cls.__new__(cls)
            vars(obj).update(fields)
            return obj
        if kind == "namedtuple":
            return cls(**fields)
        return rebuild_dataclass(cls, fields)
    except (TypeError, ValueError) as e:
        raise _Refused(f"holds a {name} that its class does not take back: {e}") from None


def save(obj, f) -> None:
    """Write ``obj`` (a state dict, or a dict holding several) to the file ``f``.

    The bytes go to a new temporary file (created exclusively, so nothing planted at its
    name is written through) beside ``f``, which then replaces ``f`` in one rename: a crash
    mid-write leaves the old file intact. A symbolic link ``f`` is written through, to its
    target (as torch.save does), and a file replaced keeps its permission bits; anything
    else that is not a regular file (a device, a FIFO, a directory) is refused, unchanged."""
    arrays = _Arrays()
    tree = _encode(obj, arrays, "")
    bf16 = [k for k, a in arrays.items() if a.dtype == BFLOAT16]
    for k in bf16:  # (safetensors' NumPy writer knows no bfloat16: its bits, as U16)
        arrays[k] = arrays[k].view(np.uint16)
    data = _bf16_header(st_save(arrays, metadata={_KEY: json.dumps(tree)}), bf16)
    shown = os.fspath(f)
    path = _target(shown)
    fd, tmp = _create_beside(path, shown)
    try:
        with os.fdopen(fd, "wb") as out:
            if path.exists():
                os.fchmod(out.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None:
            raise _save_error(e.errno, shown) from None
        raise


def _save_error(code: int, shown: str) -> OSError:
    """One line naming the user's path (never the temporary file's)."""
    name = shown if len(shown) <= 80 else f"{shown[:60]}... ({len(shown)} characters)"
    err = OSError(code, f"save: cannot write {name!r}: {os.strerror(code)}")
    err.filename = shown
    return err


def _target(shown: str) -> Path:
    """The file save replaces: f itself, or the target of the symbolic link f; refused when it
    exists and is not a regular file, or when f names no file at all."""
    if not shown:
        raise _save_error(errno.ENOENT, shown)
    path = Path(os.path.realpath(shown))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as e:
        raise _save_error(e.errno, shown) from None
    if stat.S_ISDIR(mode):
        raise _save_error(errno.EISDIR, shown)
    if not stat.S_ISREG(mode):
        err = OSError(errno.EINVAL, f"save: {shown!r} is not a regular file (a device or pipe)")
        err.filename = shown
        raise err
    return path


def _create_beside(path: Path, shown: str) -> tuple[int, Path]:
    """A new file with a random name beside path, created exclusively (a file or link planted
    at that name fails the call instead of being written through), mode 0o666 less the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name[:100]}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as e:
            raise _save_error(e.errno, shown) from None
    raise _save_error(errno.EEXIST, shown)


# ----------------------------------------------------------------------------- load
def _open_regular(path: str) -> int:
    """A descriptor of path, which must be a regular file (a FIFO is not waited on)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "load: a directory, not a file", path)
    raise ValueError(
        f"load: {path} is not a tensorgrad file: not a regular file (a device or pipe)"
    )


def _read_header(fh, size: int) -> tuple[dict, int, object]:
    """(name -> tensor entry, where the data starts, the JSON tree) of an open file of size
    bytes; every entry is checked and the entries must tile the data, which fills the file."""
    head = fh.read(8)
    n = int.from_bytes(head, "little")
    if len(head) < 8 or n > size - 8 or n > MAX_HEADER:
        raise _Refused(f"is not a tensorgrad file: {_no_header(head, n, size)}")
    try:
        header = json.loads(fh.read(n).decode("utf-8"))
    except (ValueError, RecursionError):  # bad UTF-8 or JSON, too deep, an int of 5000 digits
        raise _Refused("is not a tensorgrad file: its header is not JSON") from None
    meta = header.pop("__metadata__", None) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get(_KEY), str):
        raise _Refused(f"is not a tensorgrad file: no {_KEY!r} metadata")
    why = layout_problem(header, size - 8 - n, _ITEMSIZE)
    if why is not None:
        raise _Refused(f"is corrupt: {why}")
    try:
        tree = json.loads(meta[_KEY])
    except (ValueError, RecursionError):
        raise _Refused(f"is corrupt: its {_KEY} is not JSON (or is nested too deep)") from None
    return header, 8 + n, tree


def _no_header(head: bytes, n: int, size: int) -> str:
    """Why the first 8 bytes are not a safetensors header length (naming torch.save's formats)."""
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        kind = "a zip archive" if head[:1] == b"P" else "a pickle"
        return (
            f"it is {kind}, as torch.save writes; tensorgrad.load reads only what "
            "tensorgrad.save wrote (it never unpickles)"
        )
    if len(head) < 8:
        return f"{size} bytes, shorter than its 8-byte header"
    if n > size - 8:
        return f"its header of {n} bytes does not fit in the file ({size} bytes)"
    return f"its header of {n} bytes is over the {MAX_HEADER} bytes a header may have"


def layout_problem(entries: dict, data_bytes: int, itemsizes: dict) -> str | None:
    """Why the tensor entries of a safetensors header (name -> {"dtype", "shape",
    "data_offsets"}, ``__metadata__`` removed) do not lay out a data section of
    ``data_bytes`` bytes exactly, in words naming the tensor; None when they do.

    Each entry is an object with a dtype of ``itemsizes`` (its name -> bytes per element), a
    shape of at most 32 non-negative integers that NumPy can allocate, and two data offsets,
    in order, inside the data, as many bytes apart as its shape and dtype need. Sorted by
    offset, the entries neither overlap nor leave a gap, and the last ends where the data
    does. Each way to fail has its own words. (gpt.store.validate checks its files with it.)"""
    spans = []
    for name, t in entries.items():
        what = _short(name)
        if not isinstance(t, dict):
            return f"the entry of {what} is not a JSON object"
        dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in itemsizes:
            return f"{what} has the dtype {_short(dtype)}, not one of {', '.join(itemsizes)}"
        if not (
            isinstance(shape, list)
            and len(shape) <= 32
            and all(_is_int(s) and s >= 0 for s in shape)
        ):
            return f"the shape of {what} is not a list of at most 32 non-negative integers"
        if math.prod(max(s, 1) for s in shape) * 16 >= 2**63:  # NumPy's bound
            return f"the shape of {what} is too large"
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_int(o) and o >= 0 for o in offsets)
        ):
            return f"the data_offsets of {what} are not two non-negative integers"
        a, b = offsets
        if a > b:
            return f"the data of {what} ends (at byte {b}) before it begins ({a})"
        if b > data_bytes:
            return (
                f"the data of {what} (bytes {a} to {b}) runs past the end of the file, "
                f"whose data is {data_bytes} bytes"
            )
        need = math.prod(shape) * itemsizes[dtype]
        if b - a != need:
            return f"the data of {what} is {b - a} bytes; its shape {shape} of {dtype} needs {need}"
        spans.append((a, b, what))
    end, last = 0, None
    for a, b, what in sorted(spans):
        if a < end:
            return f"the data of {what} (bytes {a} to {b}) overlaps that of {last}"
        if a > end:
            after = f"after the data of {last}" if last else "at the start of the data"
            return f"a gap of {a - end} bytes {after}, before the data of {what}"
        end, last = b, what
    if end != data_bytes:
        return f"{data_bytes - end} bytes follow the last tensor's data (the file is padded)"
    return None


def _short(name) -> str:
    """A name from the file for a message: quoted, and cut if long."""
    s = json.dumps(name)
    return s if len(s) <= 60 else s[:57] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _reader(fh, header: dict, start: int):
    """take(name): the array of entry name, read from its offsets once; named again (an
    array saved once for two entries, as tied weights), the same array again."""
    taken: dict = {}

    def take(name) -> np.ndarray:
        if not (isinstance(name, str) and name in header):
            raise _Refused(f"is corrupt: its {_KEY} names a missing array ({_short(name)})")
        if name in taken:
            return taken[name]
        t = header[name]
        a = np.empty(t["shape"], np.dtype(_DTYPES[t["dtype"]]).newbyteorder("<"))
        buf, got = memoryview(a.reshape(-1).view(np.uint8)), 0
        fh.seek(start + t["data_offsets"][0])
        while got < len(buf):
            k = fh.readinto(buf[got:])
            if not k:
                raise _Refused(f"is corrupt: the file ended inside {_short(name)}")
            got += k
        taken[name] = a
        return a

    return take


def _decode(obj, take, device, depth: int = 0):
    if depth > MAX_DEPTH:
        raise _Refused(f"is corrupt: its {_KEY} is nested more than {MAX_DEPTH} levels deep")
    d = depth + 1
    if isinstance(obj, list):
        return [_decode(v, take, device, d) for v in obj]
    if not isinstance(obj, dict):
        return obj  # a JSON string, number, true/false or null
    marks = [k for k in obj if k.startswith("__")]
    if not marks:
        return {k: _decode(v, take, device, d) for k, v in obj.items()}
    kind, v = marks[0], obj[marks[0]]
    if len(obj) != 1 or kind not in _MARKERS:
        raise _Refused(f"is corrupt: its {_KEY} holds an unknown entry {_short(kind)}")
    if kind == "__tensor__":
        a = take(v)
        return Tensor(a if device is None else to_device(a, device), dtype=a.dtype)
    if kind == "__array__":
        return take(v)
    if kind == "__scalar__":
        a = take(v)
        if a.ndim:
            raise _Refused(f"is corrupt: the scalar {_short(v)} has shape {a.shape}")
        return a[()]
    if kind == "__object__":
        if not isinstance(v, dict) or not isinstance(v.get("fields"), dict):
            raise _Refused(f"is corrupt: its {_KEY} holds an object entry without fields")
        fields = {k: _decode(x, take, device, d) for k, x in v["fields"].items()}
        return _rebuild(v, fields)
    if not isinstance(v, list):
        raise _Refused(f"is corrupt: its {_KEY} holds a {kind} that is not a list")
    if kind == "__tuple__":
        return tuple(_decode(x, take, device, d) for x in v)
    out = {}
    for pair in v:  # __items__: [key, value] pairs of a dict with keys JSON cannot spell
        if not isinstance(pair, list) or len(pair) != 2:
            raise _Refused(f"is corrupt: its {_KEY} holds a dict item that is not a pair")
        key = _decode(pair[0], take, device, d)
        try:
            hash(key)
        except TypeError:
            raise _Refused(f"is corrupt: its {_KEY} holds an unhashable dict key") from None
        out[key] = _decode(pair[1], take, device, d)
    return out


def load(f, map_location=None, weights_only: bool = True):
    """Read what ``save`` wrote; tensors come back as Tensors (on ``map_location``, default
    the CPU), arrays as NumPy arrays, NumPy scalars with their dtype, 0-d tensors as 0-d.
    ``weights_only`` is accepted: nothing else is possible. A file tensorgrad did not write
    (a torch.save zip or pickle, a device, a truncated or crafted file) is one ValueError."""
    path = os.fspath(f)
    device = None if map_location in (None, "cpu") else str(map_location)
    with os.fdopen(_open_regular(path), "rb") as fh:
        try:
            header, start, tree = _read_header(fh, os.fstat(fh.fileno()).st_size)
            return _decode(tree, _reader(fh, header, start), device)
        except _Refused as e:
            raise ValueError(f"load: {path} {e}") from None
