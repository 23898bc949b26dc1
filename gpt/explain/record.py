"""gpt-explain's forward: the model's own forward, run once and watched.

``record(model, idx, targets)`` calls ``model(idx, targets)``, its code as written, op by op,
with a forward hook on every module and an op observer (``tensorgrad.autograd.record_ops``). It
returns what ran as a tree of ``Call``: per module call its inputs, its output and, in the order
they ran, the calls of its children and the groups of its own ops (``OpGroup``: the ops of one
statement of its code, e.g. ``att = F.softmax(att, dim=-1)``), each with the statement that ran
it, found from the call stack (the first frame outside tensorgrad). Nothing is computed twice:
every tensor kept is one the model's forward made, so an edit to the model's code shows.
gpt.explain.stages names what was recorded.

A module without children, or with one of GPT-2's layer names (``LEAVES``: ``ln_1``, ``c_attn``,
...), is a leaf: its output is one stage, the ops inside it only listed.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import tensorgrad
from tensorgrad.autograd import record_ops

from .where import statement

LEAVES = {"wte", "wpe", "ln_1", "ln_2", "ln_f", "c_attn", "c_proj", "c_fc", "gelu", "lm_head"}
_LIBRARY = str(Path(tensorgrad.__file__).resolve().parent) + "/"
_PASS_THROUGH = {contextlib.__file__, functools.__file__}  # decorators' wrappers


@dataclass
class Op:
    """One op that ran: its reference class, its name as run (with the kernel, if one ran it),
    its keyword arguments and its inputs as passed."""

    cls: type
    ran: str
    kwargs: dict
    inputs: tuple

    @property
    def name(self) -> str:
        return self.cls.__name__


@dataclass
class OpGroup:
    """Consecutive ops of one statement of a module's own code; ``outputs``: the last op's."""

    ops: list
    outputs: tuple
    place: tuple  # (file, first line, last line, code): gpt.explain.where.statement


@dataclass
class Call:
    """One call of a module: ``events``, in order, are its children's calls and its OpGroups;
    a leaf's ops are only listed (``ops``)."""

    module: object
    name: str  # the attribute its parent holds it under ('' for the model)
    leaf: bool
    args: tuple
    place: tuple  # the statement that called it
    output: object = None
    events: list = field(default_factory=list)
    ops: list = field(default_factory=list)


def caller_place(frame) -> tuple:
    """The statement of the first frame outside tensorgrad, from ``frame`` outwards."""
    f = frame
    while f is not None and (
        f.f_code.co_filename.startswith(_LIBRARY) or f.f_code.co_filename in _PASS_THROUGH
    ):
        f = f.f_back
    if f is None:
        return ("?", 0, 0, "")
    return statement(f.f_code.co_filename, f.f_lineno)


class _Watcher:
    """The hooks and the op observer of one recorded forward; ``root`` is the model's Call."""

    def __init__(self, model):
        self.stack, self.root = [], None
        self.thread = threading.get_ident()  # the observer is process-wide: this thread's ops
        self.names = {id(m): n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
        self.leaves = {
            id(m) for n, m in model.named_modules()
            if n and (n.rsplit(".", 1)[-1] in LEAVES or not any(True for _ in m.children()))
        }  # fmt: skip

    def before(self, module, args):
        if threading.get_ident() != self.thread:
            return
        leaf = id(module) in self.leaves
        place = caller_place(sys._getframe(1))
        self.stack.append(Call(module, self.names.get(id(module), ""), leaf, args, place))

    def after(self, module, args, output):
        if threading.get_ident() != self.thread:
            return
        call = self.stack.pop()
        call.output = output
        if not self.stack:
            self.root = call
        elif not (call.leaf and args and output is args[0]):  # dropout off: nothing happened
            self.stack[-1].events.append(call)

    def op(self, cls, fn, inputs, kwargs, outputs):
        if not self.stack or threading.get_ident() != self.thread:
            return
        top = self.stack[-1]
        ran = cls.__name__ if fn is None else fn.name
        op = Op(cls, ran, dict(kwargs), tuple(inputs))
        if top.leaf:
            top.ops.append(op)
            return
        place = caller_place(sys._getframe(1))
        last = top.events[-1] if top.events else None
        if isinstance(last, OpGroup) and last.place == place:
            last.ops.append(op)
            last.outputs = tuple(outputs)
        else:
            top.events.append(OpGroup([op], tuple(outputs), place))


def record(model, idx, targets):
    """(the model's Call, logits, loss) of ``model(idx, targets)`` run as written and watched."""
    w = _Watcher(model)
    handles = []
    with record_ops(w.op):
        try:
            for m in model.modules():
                handles.append(m.register_forward_pre_hook(w.before))
                handles.append(m.register_forward_hook(w.after))
            logits, loss = model(idx, targets)
        finally:
            for h in handles:
                h.remove()
    return w.root, logits, loss
