"""Trace: run a forward once, eagerly, and record the ops it ran as a ``Graph``.

The tape already sees every op: ``Op.apply`` tells ``op_observers`` of each one after its
forward. A ``Tracer`` is such an observer. It numbers the values the forward computes
(slots): first the live inputs (the call's tensors and arrays, the module's parameters and
buffers), then each op's outputs, and keeps a ``Step`` per op: its reference Op and the class
that ran it, where each input comes from (a slot, or a constant), its keyword arguments, the
slots it writes. ``last_reads`` says where each value is read for the last time.

What a list of ops cannot replay makes the trace fail with a reason (``Graph.reason``), and
the forward then runs eagerly:
- a tensor's value read in Python (``.item()``, ``bool(t)``, ``.tolist()``, ``.numpy()``,
  ``float(t)``, ``.array`` outside tensorgrad's own code): what follows depends on the data;
- a tensor written in place (BatchNorm's running statistics, ``x += 1``);
- random numbers drawn outside an op (``tg.randn`` in a forward: replay would reuse them);
- a user's ``autograd.Function``, whose forward is Python the trace does not see;
- a tensor that requires grad and is neither an input, a parameter nor a buffer;
- an index that a list of ops cannot replay: a traced tensor inside a tuple key (``x[:, idx]``
  keeps the trace's values), a boolean mask of a traced tensor (``x[mask]``: the result's
  shape depends on its values).
Comparisons and logic of traced tensors (``x > 0``, ``~m``, ``isnan``) are ops (Compare,
Predicate), recorded and replayed like any other.
An array that is none of these (a causal mask, position ids) is a constant of the graph;
``same_graph`` compares two traces so that a constant computed from an input's values, which
changes from call to call, is caught before anything is replayed.

Imports: contextlib, dataclasses, functools, sys, threading, weakref, .guards, ..autograd,
..devices, ..ops, ..tensor, ..types.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import weakref
from dataclasses import dataclass, field

from .. import devices
from ..autograd import graph as tape
from ..autograd import observe
from ..ops.shape import GetItem
from ..tensor import Tensor
from ..types import rebuild_dataclass
from .guards import guarded_code, is_plain

RANDOM_OPS = ("dropout",)  # ops that draw from the generator inside their forward


@dataclass
class Step:
    """One op of a graph or of its plan: what it computes (``ref``) and what runs (``impl``).

    A traced step's ``ref`` is the reference Op the tape recorded (``Add``, ``LayerNorm``) and
    its ``impl`` the class that ran it: a registered kernel's, or ``ref`` itself. A plan's
    step may stand for several traced ops; its ``ref`` is then the one reference Op that
    computes them all where there is one (a composite's ``Pattern.ref``: ``Gelu`` for a GELU
    written out, ``Attention``, ``AddLayerNorm``), and None where no single one does: a
    composite whose kernel is the whole op (the GPT-2 block: ``pattern`` says what it stands
    for) or a fused run (``impl`` is the generated ``FusedElementwise`` subclass, named after
    the ops it stands for, ``Fused[add+gelu+mul]``, its source in ``impl.source``)."""

    ref: type | None  # the reference Op it computes (what the tape records), or None
    impl: type  # what runs: a registered kernel's class, a generated one, or ref itself
    ins: list  # per input: ("v", slot) a graph value, or ("c", value) a constant
    kwargs: dict  # keyword arguments; an array among them is ("v", slot) or ("c", array)
    outs: list  # the slots its outputs fill
    needs: tuple  # per input: whether a gradient flows to it (when recording)
    meta: list  # per output: (shape, dtype)
    pattern: str = ""  # a composite's: what it stands for ("GPT-2 blocks as ..."), else ""


class Leaf:
    """One leaf of a forward's result: kind "v" a traced value (its slot; ``rg`` whether the
    eager result required grad), "i" a live input returned as it is (its slot), "t" a
    constant tensor (its array: a fresh copy each call), "c" a plain value."""

    __slots__ = ("kind", "v", "rg")

    def __init__(self, kind: str, v, rg: bool = True):
        self.kind, self.v, self.rg = kind, v, rg

    def __eq__(self, other):
        return (
            isinstance(other, Leaf)
            and (self.kind, self.rg) == (other.kind, other.rg)
            and same_value(self.v, other.v)
        )


class Struct:
    """A container in a forward's result: a tuple, list, namedtuple, dict or dataclass whose
    items are Leafs or Structs (``keys``: a dict's keys, a dataclass's field names)."""

    __slots__ = ("cls", "keys", "items")

    def __init__(self, cls, keys, items):
        self.cls, self.keys, self.items = cls, keys, items

    def __iter__(self):
        return iter(self.items)

    def __eq__(self, other):
        return (
            isinstance(other, Struct)
            and (self.cls, self.keys) == (other.cls, other.keys)
            and same_value(self.items, other.items)
        )

    def build(self, values: list):
        """The container again, holding ``values`` (one per item)."""
        cls = self.cls
        if self.keys is None:
            return cls(*values) if hasattr(cls, "_fields") else cls(values)
        if issubclass(cls, dict):
            return cls(zip(self.keys, values))
        return rebuild_dataclass(cls, dict(zip(self.keys, values)))  # a dataclass


@dataclass
class Graph:
    n_inputs: int  # slots 0..n_inputs-1: the live inputs, in the order of ``inputs``
    steps: list = field(default_factory=list)
    outputs: object = None  # the forward's result, tensors and constants as Leaf
    needs_grad: list = field(default_factory=list)  # per slot: carries a gradient
    meta: list = field(default_factory=list)  # per slot: (shape, dtype)
    reason: str | None = None  # why it cannot be replayed (None: it can)
    plan: list = field(default_factory=list)  # the steps replay runs (pipeline.plan)
    device: str = "cpu"  # where the live inputs are (kernels are generated for the CPU only)
    used: list = field(default_factory=list)  # the input slots some step or output reads
    composites: int = 0  # plan steps that stand for a window matched by a pattern
    grad_used: set = field(default_factory=set)  # slots some step's gradient flows back to
    random: bool = False  # some op draws from the generator (dropout)
    pins: list = field(default_factory=list)  # (slot, version, array): buffers the plan read
    replans: int = 0  # plans made again because a pinned buffer changed

    def output_slots(self) -> list:
        """The slots of the tensors in the forward's result, in order."""
        return list(_slots(self.outputs))


def last_reads(graph: Graph, steps: list) -> dict:
    """The last-use analysis, one for the compiler: slot -> index of the last of ``steps``
    that reads it (as an input or a keyword argument), ``len(steps)`` for the slots of the
    graph's result. Its keys are every slot something reads; a slot that is no key, or
    whose entry is k < len(steps), is dead after step k (replay frees it there, a fused run
    need not write it)."""
    last = {}
    for k, st in enumerate(steps):
        for kind, v in list(st.ins) + list(st.kwargs.values()):
            if kind == "v":
                last[v] = k
    for s in graph.output_slots():
        last[s] = len(steps)
    return last


def _slots(x):
    if isinstance(x, Leaf):
        if x.kind == "v":
            yield x.v
    else:
        for y in x:
            yield from _slots(y)


def _forget(tracer_ref, k: int, _dead=None) -> None:
    """An object the trace numbered died: its id's entries go (the tracer is held weakly,
    so a finished trace is freed at once, not by the cycle collector)."""
    tracer = tracer_ref()
    if tracer is not None:
        tracer.slot_of.pop(k, None)
        tracer.refs.pop(k, None)
        tracer.made_at.pop(k, None)


class Tracer:
    """Records the ops of one forward (install with ``tracing``)."""

    def __init__(self, live: list):
        """live: the tensors (or arrays) read afresh at every call, in slot order."""
        self.graph = Graph(n_inputs=len(live))
        self.slot_of: dict[int, int] = {}  # id(Tensor) or id(array) -> slot, while it lives
        self.refs: dict = {}  # id -> a weak reference that drops the id's entries at death
        self.me = weakref.ref(self)  # (what those references call back through)
        self.keep = list(live)  # what is held strongly: the inputs (and the unweakrefable)
        self.versions: list = []  # (a tensor's version counter, its version when seen)
        self.made_at: dict = {}  # id(an op's output) -> its entry in versions
        self.draws = 0  # random draws since the last op
        self.thread = threading.get_ident()  # ops of other threads are not this forward's
        self.codes: dict = {}  # code object run during the trace -> its globals (guards.py)
        self.modules: dict = {}  # id -> a module whose method ran (a compiled function's)
        self.constants: list = []  # the tensors it read that are no value of the trace
        self.live_ids = {id(t) for t in live}  # (a returned input comes back as itself)
        for k, t in enumerate(live):
            self._bind(t, k)
            self.graph.needs_grad.append(isinstance(t, Tensor) and t.requires_grad)
            a = t.array if isinstance(t, Tensor) else t
            self.graph.meta.append((tuple(a.shape), a.dtype))
            if devices.device_of(a) != "cpu":
                self.graph.device = devices.device_of(a)

    def traced(self, x) -> bool:
        """Whether x is a value of the trace (a live input or an op's output)."""
        return isinstance(x, Tensor) and (id(x) in self.slot_of or id(x.array) in self.slot_of)

    def fail(self, reason: str) -> None:
        if self.graph.reason is None:
            self.graph.reason = reason

    def effect(self, what: str, tensor=None) -> None:
        """Python state changed during the forward (tape.note_effect): replay would not."""
        if tensor is None or self.traced(tensor):
            self.fail(what)

    def _bind(self, x, slot: int) -> None:
        self._hold(x, slot)
        if isinstance(x, Tensor):
            if id(x.array) not in self.slot_of:
                self._hold(x.array, slot)
            self.made_at[id(x)] = len(self.versions)
            self.versions.append((tape.version_counter(x), x.version))

    def _hold(self, x, slot: int) -> None:
        """Map id(x) to its slot for as long as x lives. The trace holds its values weakly,
        as eager mode holds them (a value no later op reads is freed), so tracing costs no
        more memory than an eager call; at x's death its entries go, so an object that
        reuses its id later is not taken for it."""
        k = id(x)
        self.slot_of[k] = slot
        try:
            self.refs[k] = weakref.ref(x, functools.partial(_forget, self.me, k))
        except TypeError:  # (no weak references to it: held)
            self.keep.append(x)

    def rebase(self, x) -> None:
        """x, an op's output, became a view: it counts its base's versions from now on
        (tape.note_view), so its version when made is the base's now, not a write."""
        k = self.made_at.get(id(x))
        if k is not None:
            self.versions[k] = (tape.version_counter(x), x.version)

    def value(self, x):
        """Where input x of an op comes from: ("v", slot) or ("c", constant)."""
        slot = self.slot_of.get(id(x))
        if slot is None and isinstance(x, Tensor):
            slot = self.slot_of.get(id(x.array))  # the same array in another Tensor
        if slot is not None:
            if isinstance(x, Tensor):
                self.versions.append((tape.version_counter(x), x.version))
            return ("v", slot)
        if isinstance(x, Tensor):
            if x.requires_grad:
                self.fail(
                    "it uses a tensor that requires grad and is neither an input, a "
                    "parameter nor a buffer (pass it as an argument, or compile the module "
                    "that holds it: a training step compiled whole runs eagerly, its model "
                    "compiled on its own does not)"
                )
            self.constants.append(x)  # (guarded: a later requires_grad_() or .data)
            return ("c", x.array)
        return ("c", x)

    def __call__(self, cls, fn, inputs, kwargs, results) -> None:
        if threading.get_ident() != self.thread:  # another thread's op: not this forward's,
            if any(self.traced(x) for x in inputs):  # unless it computes on its values
                self.fail("it runs ops on its tensors in another thread (a thread pool)")
            return
        if fn is None:
            self.fail(f"it calls a user-defined autograd.Function ({cls.__name__})")
        elif self.draws and cls.op not in RANDOM_OPS and not kwargs.get("dropout_p"):
            self.fail("it draws random numbers outside an op (tg.randn or the like)")
        self.graph.random = self.graph.random or bool(self.draws)
        self.draws = 0
        if fn is None:
            return
        g = self.graph
        ins = [self.value(x) for x in inputs]
        kw = {k: self.value(v) if hasattr(v, "dtype") else ("c", v) for k, v in kwargs.items()}
        if any(isinstance(x, (tuple, list)) and self._holds_traced(x) for x in inputs):
            self.fail(
                "it indexes with a traced tensor inside a tuple or list (x[:, idx]), which "
                "replay would keep as the trace's values"
            )
        if cls is GetItem and ins[1][0] == "v" and g.meta[ins[1][1]][1].kind == "b":
            self.fail(
                "it indexes with a boolean mask of a traced tensor (x[mask]): the result's "
                "shape depends on the mask's values"
            )
        outs, meta = [], []
        for r in results:
            slot = len(g.needs_grad)
            a = r.array
            meta.append((tuple(a.shape), a.dtype))
            g.needs_grad.append(r.requires_grad)
            g.meta.append(meta[-1])
            self._bind(r, slot)
            outs.append(slot)
        needs = tuple(bool(n) for n in fn.needs_input_grad)
        g.steps.append(Step(cls, type(fn), ins, kw, outs, needs, meta))

    def _holds_traced(self, xs) -> bool:
        """Whether a tuple or list (an index key) holds a value of the trace."""
        for x in xs:
            if isinstance(x, (tuple, list)):
                if self._holds_traced(x):
                    return True
            elif hasattr(x, "dtype") and (id(x) in self.slot_of or self.traced(x)):
                return True
        return False

    def finish(self, result) -> Graph:
        g = self.graph
        if self.draws:
            self.fail("it draws random numbers outside an op (tg.randn or the like)")
        if any(counter[0] != v for counter, v in self.versions):
            self.fail("it writes into a tensor in place (running statistics, x += ...)")
        g.outputs = self._outputs(result)
        g.used = sorted(s for s in last_reads(g, g.steps) if s < g.n_inputs)  # (read ones)
        # inputs some gradient flows back to (the others are passed detached: an input read
        # only where no gradient flows, a comparison say, gets none, as in eager mode)
        g.grad_used = {v for st in g.steps for (k, v), n in zip(st.ins, st.needs) if k == "v" and n}
        g.grad_used |= set(g.output_slots())
        return g

    def _outputs(self, r):
        if isinstance(r, (tuple, list)):
            return self._rebuildable(r, Struct(type(r), None, [self._outputs(x) for x in r]))
        if isinstance(r, dict):
            items = [self._outputs(x) for x in r.values()]
            return self._rebuildable(r, Struct(type(r), list(r), items))
        if dataclasses.is_dataclass(r) and not isinstance(r, type):
            keys = [f.name for f in dataclasses.fields(r)]
            items = [self._outputs(getattr(r, k)) for k in keys]
            return self._rebuildable(r, Struct(type(r), keys, items))
        if isinstance(r, Tensor):
            kind, v = self.value(r)
            if kind == "c":
                return Leaf("t", v)  # a constant tensor: a fresh one at every call
            if id(r) in self.live_ids:
                return Leaf("i", v)  # an input, parameter or buffer returned as it is
            return Leaf("v", v, r.requires_grad)
        if is_plain(r):
            return Leaf("c", r)
        self.fail(f"it returns a {type(r).__name__}")
        return Leaf("c", r)

    def _rebuildable(self, r, struct: Struct) -> Struct:
        """``struct``, if its container can be made again from its items (a defaultdict, or a
        dict whose __init__ takes other arguments, cannot: the forward then runs eagerly)."""
        try:
            values = (
                list(r.values())
                if isinstance(r, dict)
                else [getattr(r, k) for k in struct.keys]
                if struct.keys
                else list(r)
            )
            struct.build(values)
        except Exception:  # noqa: BLE001  (whatever its constructor raises)
            self.fail(f"it returns a {type(r).__name__}, which cannot be rebuilt from its items")
        return struct


_VALUE_READS = ("item", "tolist", "numpy", "__array__", "__bool__", "__float__", "__int__")
_VALUE_READS += ("equal", "allclose")
# Tensor methods whose results are computed outside the tape (no op records them): on a traced
# value, replay would reuse the result of the trace as a constant. Every public name of // and
# % is listed (an alias such as ``floor_divide`` is a name of its own). Comparisons and logic
# (==, <, &, ~, logical_*, isnan, isinf, isfinite) are ops (Compare, Predicate): replayed.
_FLOOR_MOD = ("__floordiv__", "__rfloordiv__", "floor_divide", "__mod__", "__rmod__")
_OFF_TAPE = ("argmax", "argmin", "all", "any", "argsort", "unique", "histogram")  # (sort, topk)
_OFF_TAPE += ("nonzero", *_FLOOR_MOD)
_WHAT = dict.fromkeys(_FLOOR_MOD, "// or %")
# tensorgrad functions that hand a tensor's values to their caller
_CONVERSIONS = ("as_array", "tensor", "new_tensor")


def _ours(frame) -> bool:
    return frame.f_globals.get("__name__", "").startswith("tensorgrad")


# Tracing patches Tensor's value-reading methods and the generator getter once, while any
# thread traces (a count under a lock); the patched methods act only for the traces of the
# thread that calls them (tape.watch.traces is per thread), so another thread's eager code
# runs as before, and nothing stays patched after the last trace ends, exception or not.
_lock = threading.Lock()
_tracing = 0  # traces running, all threads
_saved: dict = {}  # name -> Tensor's own method, while patched
_ARRAY = vars(Tensor)["array"]  # the property itself, unpatched
_GUARDED: dict = {}  # code object -> whether the state it reads is guarded (guards.py)


def _traces():
    """This thread's running traces (empty inside an unobserved() block)."""
    w = tape.watch
    return w.traces if not w.hidden else ()


def _reader(name, method):
    def read(self, *args, **kwargs):
        for tracer in _traces():
            tracer.fail(f"it reads a tensor's value in Python ({name})")
        return method(self, *args, **kwargs)

    return read


def _computed_off_tape(name, method):
    def compute(self, *args, **kwargs):
        for tracer in _traces():
            if any(tracer.traced(t) for t in (self, *args)):
                what = _WHAT.get(name, name)
                tracer.fail(f"it computes {what} of a traced tensor, which no op records")
        return method(self, *args, **kwargs)

    return compute


def _read_array(self):
    # tensorgrad's own code passes arrays to ops (which the trace sees); code outside it
    # that takes a tensor's array computes in Python on its values. A conversion
    # (as_array, tensor) reads for its caller.
    traces = _traces()
    if traces:
        frame = sys._getframe(1)
        while frame.f_code.co_name in _CONVERSIONS and _ours(frame):
            frame = frame.f_back
        if not _ours(frame):
            for tracer in traces:
                tracer.fail("it reads a tensor's array (.array, as_array) in Python")
    return _ARRAY.fget(self)


def _counting_get(*args, **kwargs):
    for tracer in _traces():
        tracer.draws += 1
    return type(devices.generators).get(devices.generators, *args, **kwargs)


def _reseeded():
    tape.note_effect("it reseeds the generator (tg.manual_seed): replay would not")


def _profile(frame, event, arg):
    """sys.setprofile's hook while this thread traces: note each Python function that runs
    (its code names the globals and attributes it can read)."""
    if event == "call":
        code = frame.f_code
        guarded = _GUARDED.get(code)
        if guarded is None:
            guarded = _GUARDED[code] = guarded_code(frame)
        if guarded:
            module = None
            if code.co_argcount and code.co_varnames[0] == "self":
                module = frame.f_locals.get("self")
                if "_parameters" not in getattr(module, "__dict__", ()):
                    module = None
            for tracer in tape.watch.traces:
                tracer.codes.setdefault(code, frame.f_globals)
                if module is not None:
                    tracer.modules.setdefault(id(module), module)


def _patch() -> None:
    global _tracing
    with _lock:
        _tracing += 1
        if _tracing > 1:
            return
        names = [*_VALUE_READS, *(n for n in _OFF_TAPE if hasattr(Tensor, n))]
        for name in names:
            _saved[name] = vars(Tensor).get(name)  # None: inherited from a mixin
            wrap = _reader if name in _VALUE_READS else _computed_off_tape
            setattr(Tensor, name, wrap(name, getattr(Tensor, name)))
        _saved["array"] = _ARRAY
        Tensor.array = property(_read_array, _ARRAY.fset, doc=_ARRAY.__doc__)
        devices.generators.get = _counting_get
        devices.seed_observers.append(_reseeded)


def _unpatch() -> None:
    global _tracing
    with _lock:
        _tracing -= 1
        if _tracing:
            return
        for name, method in _saved.items():
            if method is None:
                delattr(Tensor, name)  # inherited from a mixin: uncover it again
            else:
                setattr(Tensor, name, method)
        _saved.clear()
        del devices.generators.get  # the instance attribute: the class's method again
        devices.seed_observers.remove(_reseeded)


@contextlib.contextmanager
def tracing(tracer: Tracer):
    """Record this thread's ops into ``tracer``, with the Python functions that run; flag
    value reads, random draws outside ops and effects replay would skip."""
    _patch()
    watch = tape.watch
    outer, profiler = watch.traces, sys.getprofile()
    if profiler is not None and profiler is not _profile:
        tracer.fail("a profiler (sys.setprofile) runs, so the Python state it reads is unknown")
    watch.traces = (*outer, tracer)
    observe.add_op_observer(tracer)
    if profiler is None:
        sys.setprofile(_profile)
    try:
        yield tracer
    finally:
        if profiler is None:
            sys.setprofile(None)
        observe.remove_op_observer(tracer)
        watch.traces = outer
        _unpatch()


def same_graph(a: Graph, b: Graph) -> bool:
    """Whether two traces of one signature ran the same ops on the same constants."""
    if len(a.steps) != len(b.steps) or not same_value(a.outputs, b.outputs):
        return False
    for s, t in zip(a.steps, b.steps):
        if (s.ref, s.impl, s.outs, s.needs) != (t.ref, t.impl, t.outs, t.needs):
            return False
        if not same_value(s.ins, t.ins) or not same_value(s.kwargs, t.kwargs):
            return False
    return True


def same_value(x, y) -> bool:
    if isinstance(x, dict):
        return (
            isinstance(y, dict) and x.keys() == y.keys() and all(same_value(x[k], y[k]) for k in x)
        )
    if isinstance(x, (list, tuple)):
        return (
            type(x) is type(y) and len(x) == len(y) and all(same_value(a, b) for a, b in zip(x, y))
        )
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        return (
            hasattr(y, "dtype")
            and x.shape == y.shape
            and x.dtype == y.dtype
            and bool(devices.get_array_module(x).array_equal(x, y))
        )
    try:
        return bool(x == y) and type(x) is type(y)
    except (TypeError, ValueError):
        return x is y
