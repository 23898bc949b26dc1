"""Watching the ops run: ``record_ops(observer)`` tells an observer of every op after its
forward, and ``unobserved()`` hides a side computation from observers. Both edit
``graph.op_observers``, the list that ``Op.apply`` reads.

Imports: contextlib, .graph.
"""

from __future__ import annotations

import contextlib

from .graph import op_observers, watch


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
        op_observers.append(self.observer)
        return self.observer

    def __exit__(self, *exc):
        op_observers.remove(self.observer)
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
