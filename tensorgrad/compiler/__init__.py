"""``tensorgrad.compile``: a module's forward traced once per input signature, then replayed.

    model = tg.compile(model)      # the same module; its forward is compiled in place
    loss = model(x, y)[1]          # 1st and 2nd call: eager, traced; then: replayed

How (docs/compile.md tells it on the GPT block):
- **Guards** (``guards.py``). A call's signature is the shapes, dtypes, devices, aliasing
  and requires_grad of its tensors and arrays, its plain arguments, grad mode, and each
  submodule (the object), its training flag and its parameters and buffers. Beside it, the
  Python state the traced code read (globals, closure cells, module and class attributes
  named in its code, a patched ``forward``) is checked before each replay; a change traces
  that state afresh (at most ``MAX_SIGNATURES`` traces in all; beyond that: eagerly).
- **Trace** (``trace.py``). The forward runs eagerly while the tape's op observer records
  each op; the result of that call is the eager one. The second call with the same signature
  is traced again and the two traces compared: a graph that changes with no guard changing
  (a constant computed from an input's values) is not replayed.
- **Plan** (``pipeline.py``, which lists every pass in order). Windows of ops that a kernel
  computes as one op become one step (``patterns.py``); then runs of elementwise ops become
  one generated numba kernel each, forward and backward: ``schedule.py`` picks the runs,
  ``codegen.py`` writes and compiles their kernels (the derivatives from one table of scalar
  rules), ``fused_op.py`` is the op that runs them.
- **Replay** (``replay.py``). Later calls run the recorded ops as one graph node, without
  eager mode's per-op Python (Tensors, kernel lookups, edges); its backward runs the ops'
  backwards in reverse. ``backward(create_graph=True)`` through it works: the ops run again
  eagerly on the saved inputs and that graph is differentiated.
- **Fall back.** A forward that reads a tensor's value in Python, writes a tensor in place,
  draws random numbers outside an op, sets a module attribute, ``.data``, a hook or the seed,
  calls a user's autograd.Function, takes an argument that is not a tensor, array or plain
  value, or has hooks on a submodule runs eagerly: one line (a ``CompileWarning``) says why,
  once. ``fullgraph=True`` raises instead.

Imports: dataclasses, sys, threading, time, warnings, .fused_op, .guards, .patterns, .pipeline,
.replay, .trace, ..autograd, ..kernels, ..tensor.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import warnings

from ..autograd import graph as tape
from ..autograd.graph import constant, is_grad_enabled
from ..kernels import threads
from ..tensor import Tensor
from .fused_op import FusedElementwise
from .guards import ModuleState, Uncompilable, signature, state_guards
from .patterns import Fold
from .pipeline import plan
from .replay import Replay, random_state
from .trace import Graph, Leaf, Struct, Tracer, same_graph, tracing

MAX_SIGNATURES = 8  # traces kept per compiled forward (shapes that change every call: eager)
MAX_REPLANS = 4  # plans made again for changed buffers; after that, buffers are not folded


class CompileWarning(UserWarning):
    """A compiled forward runs eagerly, and why."""


class Variant:
    """One way a signature was traced: its state ("seen" once, "ready" to replay, "eager"
    with its reason), its graph and the guards of the Python state the forward read."""

    __slots__ = ("state", "graph", "guards", "reason", "codes")

    def __init__(self, state, graph, guards, reason=None, codes=None):
        self.state, self.graph, self.guards, self.reason = state, graph, guards, reason
        self.codes = codes or {}  # the code objects its trace ran (guards.py)


class CompiledForward:
    """A module's (or a function's) forward, compiled: installed as ``module.forward``."""

    guard_by_identity = True  # (guards.py: its own entries are no state of the forward's)

    def __init__(self, fn, module=None, fullgraph: bool = False):
        self.fn, self.module, self.fullgraph = fn, module, fullgraph
        self.name = getattr(fn, "__qualname__", type(fn).__name__)
        self.entries: dict = {}  # signature -> [Variant, ...] (one per state of Python seen)
        self.said: set = set()
        self.trace_s = 0.0  # time spent tracing (the two eager calls that record)
        self.lock = threading.Lock()  # (two threads calling it: one updates entries at a time)
        self.state = ModuleState()  # the module's part of the signature, while it holds

    def __reduce__(self):
        """Pickled (a module sent to another process) as the forward it compiles: the copy is
        traced afresh."""
        return (CompiledForward, (self.fn, self.module, self.fullgraph))

    def __deepcopy__(self, memo):
        """A copy of the module gets its own compiled forward, traced afresh (an EMA copy, a
        best-model snapshot): the copy's forward bound to the copied module."""
        module = memo.get(id(self.module), self.module)
        fn = self.fn
        if getattr(fn, "__self__", None) is self.module and self.module is not None:
            fn = fn.__func__.__get__(module)
        return CompiledForward(fn, module, self.fullgraph)

    def __call__(self, *args, **kwargs):
        if tape.watch.traces:  # inside another compiled forward's trace: run as written, so
            return self.fn(*args, **kwargs)  # the outer trace records its ops and its Python
        try:
            key, live = signature(args, kwargs, self.module, is_grad_enabled(), self.state)
            block = tape._state.autocast  # a CPU autocast block casts ops: guarded, as dynamo
            key += (block and block.fast_dtype,)
        except Uncompilable as e:
            self._say(str(e))
            return self.fn(*args, **kwargs)
        variants = self.entries.get(key, ())
        seen, changed = None, None
        for v in variants:
            what = v.guards.changed()
            if what is not None:
                changed = changed or what
                continue
            if v.state == "ready":
                return self._replay(self._current(v, live), live, args, kwargs)
            if v.state == "eager":
                return self.fn(*args, **kwargs)
            seen = v
            break
        if seen is None and sum(len(vs) for vs in self.entries.values()) >= MAX_SIGNATURES:
            why = f"its inputs changed signature {MAX_SIGNATURES} times (shapes every call?)"
            if changed:
                why = f"{changed}, after {MAX_SIGNATURES} traces of it"
            self._say(why)
            return self.fn(*args, **kwargs)
        return self._trace(key, seen, args, kwargs, live)

    # ------------------------------------------------------------------ trace, replay
    def _trace(self, key, seen, args, kwargs, live):
        """Run the forward eagerly, recording it; the second trace of a signature (and state)
        must equal the first before the graph is kept. A graph that can be replayed is
        replayed at once on these inputs, from the random state the eager run started from,
        and that is what the call returns: every call of a compiled forward computes the
        same way, traced or not (a resumed run repeats an uninterrupted one bit for bit)."""
        t0, rng = time.perf_counter(), random_state()
        tracer = Tracer(live)
        lists = [(a, list(a)) for a in (*args, *kwargs.values()) if isinstance(a, (list, dict))]
        with tracing(tracer):
            out = self.fn(*args, **kwargs)
        graph = tracer.finish(out)
        if any(list(a) != before or _items(a) != _items(before) for a, before in lists):
            tracer.fail("it changes a list or dict argument in place (replay would not)")
        if not key[0] and any(graph.needs_grad[s] for s in graph.output_slots()):
            tracer.fail("it turns grad mode on inside a call made under no_grad (enable_grad)")
        if seen is not None:  # the first trace's Python too (a cached helper runs in one), of
            ours = {id(glob) for glob in tracer.codes.values()}  # the modules this one ran
            for code, glob in seen.codes.items():  # (not the first call's one-off setup: a
                if id(glob) in ours:  # kernel compiled, a library imported)
                    tracer.codes.setdefault(code, glob)
        guards = state_guards(tracer, self.module, self.fn)
        if graph.reason is None:
            graph.reason = guards.reason
        if graph.reason is None and seen is not None:
            what = seen.guards.changed()  # the first trace's state, after the second call
            if what is not None:
                graph.reason = f"it changes Python state that it reads: {what}"
        if graph.reason is None and not any(s.kind == "v" for s in _leaves(graph.outputs)):
            graph.reason = "it returns no tensor"
        if graph.reason is None and seen is not None and not same_graph(seen.graph, graph):
            graph.reason = (
                "its ops or constants changed between two calls of the same signature (an "
                "array computed from an input's values, or Python that branches on one)"
            )
        with self.lock:
            variants = self.entries.setdefault(key, [])
            if seen in variants:
                variants.remove(seen)
            if graph.reason is not None:
                variants.append(Variant("eager", None, guards, graph.reason))
            else:
                # composites as kernels, elementwise runs as generated ones (the first
                # trace's plan serves the second, which is the same graph)
                if seen is None:
                    self._plan(graph, live)
                else:
                    graph.plan, graph.composites = seen.graph.plan, seen.graph.composites
                    graph.pins, graph.replans = seen.graph.pins, seen.graph.replans
                state = "seen" if seen is None else "ready"
                variant = Variant(state, graph, guards, None, tracer.codes)
                variants.append(variant)
        self.trace_s += time.perf_counter() - t0
        if graph.reason is not None:
            self._say(graph.reason)
            return out
        if graph.device != "cpu":
            return out  # (the GPU's generator state is not restored: its eager result)
        del out, tracer  # the eager run's graph is freed before the replay
        random_state(rng)
        return self._replay(self._current(variant, live), live, args, kwargs)

    def _plan(self, graph: Graph, live) -> None:
        """Make the graph's plan: composites (a mask read from one of the module's buffers is
        folded: the plan is pinned to those buffers), then fused runs."""
        fold = None
        if graph.replans <= MAX_REPLANS:
            n = len(self.state.live) if self.module is not None else 0
            buffers = {  # the module's tensors that no gradient changes (its buffers)
                k
                for k in range(len(live) - n, len(live))
                if isinstance(live[k], Tensor) and not live[k].requires_grad
            }
            fold = Fold(graph, live, buffers)
        graph.plan = plan(graph, fold)
        graph.pins = list(fold.pins.values()) if fold is not None else []
        graph.composites = _composites(graph)

    def _current(self, v: Variant, live) -> Graph:
        """v's graph, with its plan made again first where a buffer the plan folded changed
        since (written in place: its version moved; or its memory swapped): a plan never
        replays a decision made on a buffer's old values. The graph is replaced, not changed,
        so that a replay in flight keeps the plan it ran."""
        g = v.graph
        for slot, version, array in g.pins:
            t = live[slot]
            if t.version != version or t.array is not array:
                break
        else:
            return g
        with self.lock:
            if v.graph is g:
                new = dataclasses.replace(g, replans=g.replans + 1)
                self._plan(new, live)
                v.graph = new
            return v.graph

    def _replay(self, graph: Graph, live, args, kwargs):
        grad = is_grad_enabled()
        if graph.device == "cpu":  # the thread counts are measured over these calls
            threads.tick((id(self), grad, threading.get_ident()), grad)
        used = [
            live[s].detach()
            if s not in graph.grad_used and isinstance(live[s], Tensor) and live[s].requires_grad
            else live[s]
            for s in graph.used
        ]
        rng = random_state()
        try:
            outs = Replay.apply(*used, graph=graph)
        except Exception:  # an op refused these inputs (an id out of range, say): the
            random_state(rng)  # forward as written decides (it may catch it, as eagerly)
            return self.fn(*args, **kwargs)
        it = iter(outs)

        def build(node):
            if isinstance(node, Struct):
                return node.build([build(x) for x in node.items])
            if node.kind == "c":
                return node.v
            if node.kind == "t":
                return constant(node.v.copy())  # a fresh constant, as eager makes one
            if node.kind == "i":
                return live[node.v]  # the input itself, as the eager forward returned it
            t = next(it)
            return t if node.rg and graph.needs_grad[node.v] and grad else constant(t.array)

        return build(graph.outputs)

    # ------------------------------------------------------------------ what it says
    def _say(self, reason: str) -> None:
        line = f"tensorgrad.compile: {self.name} runs eagerly: {reason}"
        if self.fullgraph:
            raise RuntimeError(line)
        if line not in self.said:
            self.said.add(line)
            warnings.warn(line, CompileWarning, stacklevel=_user_level())

    def summary(self) -> dict:
        """What compiled: signatures replayed, ops per graph, kernels among them, trace time."""
        variants = [v for vs in self.entries.values() for v in vs]
        ready = [v.graph for v in variants if v.state == "ready"]
        eager = sorted({v.reason for v in variants if v.state == "eager"})
        return {
            "compiled": len(ready),
            "ops": [len(g.steps) for g in ready],
            "kernels": [sum(s.impl is not s.ref for s in g.steps) for g in ready],
            "fused": [sum(issubclass(s.impl, FusedElementwise) for s in g.plan) for g in ready],
            "composites": [g.composites for g in ready],
            "patterns": [_patterns(g) for g in ready],
            "steps": [len(g.plan) for g in ready],
            "eager": eager,
            "trace_s": self.trace_s,
        }


def _items(x) -> list:
    """The identities of a list argument's items (or a dict's keys and values), in order."""
    return [id(v) for v in (x if isinstance(x, list) else [*x, *x.values()])]


def _user_level() -> int:
    """warnings.warn's stacklevel that names the first caller outside tensorgrad."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("tensorgrad."):
        frame, level = frame.f_back, level + 1
    return level


def _patterns(g: Graph) -> dict:
    """{what a composite stands for: how many} in the plan ("GPT-2 blocks as ...": 4)."""
    out: dict = {}
    for s in g.plan:
        if s.pattern:
            out[s.pattern] = out.get(s.pattern, 0) + 1
    return out


def _composites(g: Graph) -> int:
    """Steps of the plan that stand for a window of traced ops matched by a pattern."""
    traced = {id(s) for s in g.steps}
    return sum(id(s) not in traced and not issubclass(s.impl, FusedElementwise) for s in g.plan)


def _leaves(x):
    if isinstance(x, Leaf):
        yield x
    else:
        for y in x:
            yield from _leaves(y)


MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile(  # noqa: A001  (torch.compile's name)
    model=None,
    *,
    fullgraph: bool = False,
    dynamic=None,
    backend="inductor",
    mode=None,
    options=None,
    disable: bool = False,
):
    """Compile a module's forward in place and return the module (or wrap a function).

    As ``torch.compile``: usable as ``tg.compile(model)`` or as a decorator. ``fullgraph``
    raises where the forward would fall back to eager mode. There is one backend, and one
    mode: ``backend`` must be ``"inductor"`` (torch's default); ``mode`` may be any of
    torch's names, which all compile the same way here; ``dynamic`` is accepted (each new
    shape is traced afresh, up to ``MAX_SIGNATURES``); ``options`` must be empty (what it
    would tune does not exist here); ``disable=True`` returns the model as it is."""
    if backend != "inductor":
        raise ValueError(
            f"compile: backend={backend!r} is not available: tensorgrad has one backend, "
            "'inductor' (the default)"
        )
    if mode not in MODES:
        raise ValueError(f"compile: unknown mode {mode!r} (one of {', '.join(map(str, MODES))})")
    if options:
        raise ValueError(f"compile: options are not supported (got {sorted(options)})")
    if dynamic not in (None, True, False):
        raise ValueError(f"compile: dynamic must be None, True or False, got {dynamic!r}")
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, disable=disable)
    if disable:
        return model
    from ..nn.module import Module

    if isinstance(model, Module):
        if isinstance(model.__dict__.get("forward"), CompiledForward):
            return model  # compiled already
        model.forward = CompiledForward(model.forward, model, fullgraph)
        return model
    if callable(model):
        return CompiledForward(model, None, fullgraph)
    raise TypeError(f"compile: expected a Module or a function, got {type(model).__name__}")


def compiled_forward(model) -> CompiledForward | None:
    """The CompiledForward installed on ``model`` by compile (None if it is not compiled)."""
    fwd = getattr(model, "__dict__", {}).get("forward")
    return fwd if isinstance(fwd, CompiledForward) else None


__all__ = ["CompileWarning", "CompiledForward", "compile", "compiled_forward"]
