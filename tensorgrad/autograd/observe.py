"""Watching the ops run: ``record_ops(observer)`` tells an observer of every op after its
forward, and ``unobserved()`` hides a side computation from observers. The observers are in
``op_observers``; while it holds any, one hook in the tape's ``apply_hooks`` (``graph.py``)
shows them each op. Add and remove observers with ``add_op_observer``/``remove_op_observer``
(``record_ops`` does), which keep that hook registered exactly while there are observers.

Imports: contextlib, threading, .graph.
"""

from __future__ import annotations

import contextlib
import threading

from .graph import apply_hooks, watch

# Callables told of every op as it runs, after its forward: observe(reference Op class, the
# instance that ran (a kernel's, or the reference's; None for a Function), inputs, kwargs,
# output Tensors). Empty but for tools that watch a forward (tensorgrad.compile traces one).
# Process-wide: an observer that watches one thread's forward compares threading.get_ident()
# itself.
op_observers: list = []
_lock = threading.Lock()  # observers come and go from any thread (a trace, gpt-explain)


def _show(cls, fn, inputs, kwargs, results) -> None:
    """The tape's hook while anyone observes: each observer sees the op (not inside this
    thread's ``unobserved()`` blocks)."""
    if not watch.hidden:
        for observe in tuple(op_observers):  # (a copy: another thread may remove one meanwhile)
            observe(cls, fn, inputs, kwargs, results)


def add_op_observer(observer) -> None:
    """Show ``observer`` every op from now on (its hook in the tape registered with the first)."""
    with _lock:
        op_observers.append(observer)
        if _show not in apply_hooks:
            apply_hooks.append(_show)


def remove_op_observer(observer) -> None:
    """Stop showing ``observer`` the ops (the tape's hook goes with the last observer)."""
    with _lock:
        op_observers.remove(observer)
        if not op_observers and _show in apply_hooks:
            apply_hooks.remove(_show)


class record_ops(contextlib.ContextDecorator):
    """Watch the ops run: inside the block, ``observer(op, ran, inputs, kwargs, outputs)`` is
    called after each op's forward (``op_observers``), with the reference Op class (e.g.
    ``tensorgrad.ops.nn.Softmax``; your ``Function`` subclass for yours), the instance that ran
    (a kernel's or the reference's; None for a Function), the inputs and keyword arguments as
    passed, and the output Tensors. For tools that show a model's intermediate values as they
    are made (gpt-explain finds the attention's scores this way); the observer must leave them
    as they are. Process-wide; nested blocks each see every op."""

    def __init__(self, observer):
        self.observer = observer

    def __enter__(self):
        add_op_observer(self.observer)
        return self.observer

    def __exit__(self, *exc):
        remove_op_observer(self.observer)
        return False


class unobserved(contextlib.ContextDecorator):
    """Ops run inside are not shown to op observers: a side computation that is not part of
        the forward being watched (a model's self-check on a copy of itself), so that neither a
        trace (tensorgrad.compile) nor a tool that records stages (record_ops) takes it in. It
    hides this thread's ops only."""

    def __enter__(self):
        watch.hidden += 1  # this thread's ops only: another thread's trace still sees its own

    def __exit__(self, *exc):
        watch.hidden -= 1
        return False
