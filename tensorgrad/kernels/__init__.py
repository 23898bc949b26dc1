"""The kernel registry: fast implementations of an op, registered per (op, device).

Every op has one reference implementation, a plain ``Op`` in ``ops/``
that names its op (``op = "softmax"``). A kernel is a separately
written implementation of the same op, with its own forward, backward and saved state,
registered for a device with a predicate saying when it applies::

    @register("softmax", "cpu", when=lambda x, dim=-1: dim in (-1, x.ndim - 1))
    class ChunkedSoftmax(Op):
        ...

``Op.apply`` asks :func:`pick` at call time and runs the first kernel whose
predicate accepts the arguments, else the reference. Non-Op ops (the fused
AdamW update) are plain functions registered the same way. ``TG_KERNELS=0`` in the
environment, or ``set_enabled(False)``, runs the references only; :func:`registered`
lists every kernel, and the test suite checks each one against its reference.

Imports: collections, contextlib, dataclasses, os, sys.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    op: str  # the reference op it replaces
    device: str  # 'cpu' or 'cuda'
    name: str  # unique, e.g. 'cpu.chunked.softmax'
    impl: object  # an Op subclass (or a function, for non-Op ops)
    when: Callable | None  # predicate on the op's arguments (arrays and keywords)


_registry: dict[tuple[str, str], list[Kernel]] = {}
_enabled = os.environ.get("TG_KERNELS", "1") != "0"
_disabled: set[str] = set()  # kernel names or op names switched off one by one


def register(op: str, device: str, name: str | None = None, when: Callable | None = None):
    """Decorator: register ``impl`` as a kernel of ``op`` on ``device`` (newest first)."""

    def deco(impl):
        kname = name or f"{device}.{getattr(impl, '__name__', op)}"
        if any(k.name == kname for ks in _registry.values() for k in ks):
            raise ValueError(f"a kernel named {kname!r} is already registered")
        _registry.setdefault((op, device), []).insert(0, Kernel(op, device, kname, impl, when))
        return impl

    return deco


def pick(op: str, device: str, *args, **kwargs):
    """The implementation to run for ``op`` on ``device`` with these arguments, or None."""
    kernels = _registry.get((op, device))
    if not kernels or not _enabled or op in _disabled:  # asked first: most ops have none
        return None
    for k in kernels:
        if k.name not in _disabled and (k.when is None or k.when(*args, **kwargs)):
            return k.impl
    return None


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
