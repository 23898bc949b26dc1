"""The kernel registry: fast implementations of an op, registered per (op, device).

Every op has one reference implementation, a plain ``Op`` in ``ops/`` that names its op (``op
= "softmax"``); :data:`REFERENCES` maps each op that has kernels to it. A kernel is a
separately written implementation of the same op, with its own forward, backward and saved
state, registered for a device with a priority and a condition saying when it applies::

    @register("softmax", "cpu", priority=20, takes="float32, C-contiguous, last axis",
              when=lambda x, dim=-1: dim in (-1, x.ndim - 1))
    class NumbaSoftmax(Op):
        ...

A condition reads the arguments' shapes, dtypes, layouts and devices only, never their
values: ``which`` asks it with :class:`Spec` stand-ins. ``Op.apply`` asks :func:`pick` at
call time and runs the kernel of highest priority whose condition accepts the arguments,
else the reference; :func:`which` answers the same question for given arguments or specs,
and :func:`table` lists every kernel in that order (docs/internals.md prints it). Non-Op ops
(the fused AdamW update) are plain functions registered the same way. ``TG_KERNELS=0`` in the
environment, or ``set_enabled(False)``, runs the references only; the test suite checks
every registered kernel against its reference.

Imports: collections, contextlib, dataclasses, importlib, math, numpy, os, sys.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# op -> its reference implementation ("module:name"), which every kernel of it must equal
REFERENCES = {
    "softmax": "tensorgrad.ops.nn:Softmax",
    "log_softmax": "tensorgrad.ops.nn:LogSoftmax",
    "cross_entropy": "tensorgrad.ops.nn:CrossEntropy",
    "layer_norm": "tensorgrad.ops.nn:LayerNorm",
    "gelu": "tensorgrad.ops.nn:Gelu",
    "embedding": "tensorgrad.ops.nn:Embedding",
    "attention": "tensorgrad.ops.nn:Attention",
    "matmul": "tensorgrad.ops.linalg:MatMul",
    "add_layer_norm": "tensorgrad.compiler.patterns:AddLayerNorm",  # x + a, then LayerNorm
    "gpt2_block": "tensorgrad.compiler.patterns:GPT2Block",  # the block's ops, as traced
    "adamw": "tensorgrad.optim:adamw_update",
    "adamw_foreach": "tensorgrad.optim:adamw_foreach",
}


def reference(op: str):
    """The reference implementation of ``op`` (an Op class, a pattern or a function)."""
    module, name = REFERENCES[op].split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Kernel:
    op: str  # the reference op it replaces
    device: str  # 'cpu' or 'cuda'
    name: str  # unique, e.g. 'cpu.numba.softmax'
    impl: object  # an Op subclass (or a function, for non-Op ops)
    when: Callable | None  # condition on the arguments' shapes, dtypes, layouts, devices
    priority: int = 0  # the highest that applies runs
    takes: str = ""  # the condition in words (the table's column)


_registry: dict[tuple[str, str], list[Kernel]] = {}
_enabled = os.environ.get("TG_KERNELS", "1") != "0"
_disabled: set[str] = set()  # kernel names or op names switched off one by one


def register(op, device, name=None, when=None, priority: int = 0, takes: str = ""):
    """Decorator: register ``impl`` as a kernel of ``op`` on ``device``."""
    if op not in REFERENCES:
        raise ValueError(f"no reference for op {op!r}: add it to kernels.REFERENCES first")

    def deco(impl):
        kname = name or f"{device}.{getattr(impl, '__name__', op)}"
        if any(k.name == kname for ks in _registry.values() for k in ks):
            raise ValueError(f"a kernel named {kname!r} is already registered")
        ks = _registry.setdefault((op, device), [])
        ks.append(Kernel(op, device, kname, impl, when, priority, takes))
        ks.sort(key=lambda k: (-k.priority, k.name))  # (not import order)
        return impl

    return deco


def pick(op: str, device: str, *args, **kwargs):
    """The implementation to run for ``op`` on ``device`` with these arguments, or None."""
    kernels = _registry.get((op, device))
    if not kernels or not _enabled or op in _disabled:  # asked first: most ops have none
        return None
    k = _first(kernels, args, kwargs)
    return None if k is None else k.impl


def _first(kernels: list, args, kwargs) -> Kernel | None:
    for k in kernels:
        if k.name not in _disabled and (k.when is None or k.when(*args, **kwargs)):
            return k
    return None


class Spec:
    """An argument as a kernel's condition sees it: shape, dtype, layout and device, no data.
    ``Spec((8, 64), "float32")``; ``contiguous=False`` for a strided view."""

    def __init__(self, shape, dtype="float32", contiguous=True, device="cpu"):
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
        self.ndim, self.size = len(self.shape), math.prod(self.shape)
        self.flags = _Flags(contiguous)

    def __repr__(self):
        return f"Spec({self.shape}, {self.dtype})"


@dataclass(frozen=True)
class _Flags:
    c_contiguous: bool


def on_cpu(a) -> bool:
    """A NumPy array, or a Spec of one (what a CPU kernel's condition accepts)."""
    return isinstance(a, np.ndarray) or (isinstance(a, Spec) and a.device == "cpu")


def which(op: str, *args, device: str | None = None, **kwargs) -> str:
    """The name of what runs for ``op`` with these arguments (arrays, tensors or Specs):
    a kernel's name, or ``reference`` (none applies, or kernels are off). The device is the
    first argument's, as ``Op.apply`` takes it, unless given."""
    args = [getattr(a, "_array", a) for a in args]  # a Tensor's array
    if device is None:
        first = args[0] if args else None
        if isinstance(first, Spec):
            device = first.device
        else:
            from ..devices import device_of  # (here: the registry imports nothing of ours)

            device = device_of(first) if hasattr(first, "dtype") else "cpu"
    kernels = _registry.get((op, device), []) if _enabled and op not in _disabled else []
    k = _first(kernels, args, kwargs)
    return "reference" if k is None else k.name


def table(device: str | None = None) -> str:
    """Every registered kernel as a Markdown table, op by op in the order they are tried."""
    rows = ["| op | reference | kernel | priority | takes |", "|---|---|---|---|---|"]
    for k in registered(device=device):
        ref = REFERENCES[k.op].removeprefix("tensorgrad.")
        rows.append(f"| {k.op} | `{ref}` | `{k.name}` | {k.priority} | {k.takes} |")
    return "\n".join(rows)


def registered(op: str | None = None, device: str | None = None) -> list[Kernel]:
    """Every registered kernel (optionally of one op / device), whether enabled or not."""
    return [
        k
        for (o, d), ks in sorted(_registry.items())
        for k in ks
        if (op is None or o == op) and (device is None or d == device)
    ]


def is_enabled(name: str | None = None) -> bool:
    """Whether kernels run at all (no name), or whether the kernel / op ``name`` does."""
    return _enabled and (name is None or name not in _disabled)


def set_enabled(enabled: bool = True, names=None) -> None:
    """Turn all kernels (``names=None``) or the named kernels / ops on or off."""
    global _enabled
    if names is None:
        _enabled = bool(enabled)
        if enabled:
            _disabled.clear()
        return
    names = [names] if isinstance(names, str) else list(names)
    known = {k.name for k in registered()} | {k.op for k in registered()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"unknown kernels {unknown}; registered: {sorted(known)}")
    if enabled:
        _disabled.difference_update(names)
    else:
        _disabled.update(names)


def compile_counts() -> dict:
    """How this process got its CPU kernels' machine code so far, in specialisations:
    ``compiled`` here (and cached on disk for later processes), ``loaded`` from that cache,
    ``generated`` (the compiler's kernels for a model, built in every process). Zeros where
    numba has not run."""
    numba_math = sys.modules.get(f"{__name__}.numba_math")  # (never imports numba itself)
    return numba_math.counts() if numba_math else {"compiled": 0, "loaded": 0, "generated": 0}


@contextlib.contextmanager
def reference_only():
    """``with reference_only():`` runs every op through its reference implementation."""
    global _enabled
    prev = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = prev


@contextlib.contextmanager
def only(name: str):
    """``with only(kernel_name):`` runs that kernel where it applies, references elsewhere
    (the registry test uses it to check one kernel at a time)."""
    global _enabled
    if name not in {k.name for k in registered()}:  # (a typo would run references only)
        raise ValueError(f"unknown kernel {name!r}; registered: {[k.name for k in registered()]}")
    prev_enabled, prev_disabled = _enabled, set(_disabled)
    _enabled = True
    _disabled.clear()
    _disabled.update(k.name for k in registered() if k.name != name)
    try:
        yield
    finally:
        _enabled = prev_enabled
        _disabled.clear()
        _disabled.update(prev_disabled)
