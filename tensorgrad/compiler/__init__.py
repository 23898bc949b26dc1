"""``tensorgrad.compile``: a module's forward traced once per input signature, then replayed.

    model = tg.compile(model)      # the same module; its forward is compiled in place
    loss = model(x, y)[1]          # 1st and 2nd call: eager, traced; then: replayed

How (docs/compile.md tells it on the GPT block):
- **Guards.** A call's signature is the shapes, dtypes, devices and requires_grad of its
  tensors and arrays, its plain arguments (ints, strings, None), grad mode, each submodule's
  training flag and the identity of its parameters and buffers. A new signature is traced
  afresh (at most ``MAX_SIGNATURES`` of them; beyond that the forward runs eagerly).
- **Trace** (``trace.py``). The forward runs eagerly while the tape's op observer records
  each op; the result of that call is the eager one. The second call with the same signature
  is traced again and the two traces compared: a graph that changes with no guard changing
  (a constant computed from an input's values) is not replayed.
- **Fuse** (``fuse.py``). Runs of elementwise ops become one generated numba kernel each,
  forward and backward (the derivatives from one table of scalar rules).
- **Replay** (``replay.py``). Later calls run the recorded ops as one graph node, without
  eager mode's per-op Python (Tensors, kernel lookups, edges); its backward runs the ops'
  backwards in reverse. ``backward(create_graph=True)`` through it works: the ops run again
  eagerly on the saved inputs and that graph is differentiated.
- **Fall back.** A forward that reads a tensor's value in Python, writes a tensor in place,
  draws random numbers outside an op, calls a user's autograd.Function, takes an argument
  that is not a tensor, array or plain value, or has hooks on a submodule runs eagerly: one
  line (a ``CompileWarning``) says why, once. ``fullgraph=True`` raises instead.

Imports: numpy, time, warnings, .fuse, .replay, .trace, ..autograd, ..devices, ..tensor.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .. import devices
from ..autograd.graph import constant, is_grad_enabled
from ..devices import device_of
from ..tensor import Tensor
from .fuse import FusedElementwise, plan
from .replay import Replay
from .trace import Graph, Leaf, Tracer, is_plain, same_graph, tracing

MAX_SIGNATURES = 8  # traces kept per compiled forward (shapes that change every call: eager)


class CompileWarning(UserWarning):
    """A compiled forward runs eagerly, and why."""


class Uncompilable(Exception):
    """This call cannot be compiled (its reason is the message)."""


class CompiledForward:
    """A module's (or a function's) forward, compiled: installed as ``module.forward``."""

    def __init__(self, fn, module=None, fullgraph: bool = False):
        self.fn, self.module, self.fullgraph = fn, module, fullgraph
        self.name = getattr(fn, "__qualname__", type(fn).__name__)
        self.entries: dict = {}  # signature -> ("seen" | "ready", Graph) or ("eager", reason)
        self.said: set = set()
        self.trace_s = 0.0  # time spent tracing (the two eager calls that record)

    def __call__(self, *args, **kwargs):
        try:
            key, live = self._guard(args, kwargs)
        except Uncompilable as e:
            self._say(str(e))
            return self.fn(*args, **kwargs)
        entry = self.entries.get(key)
        if entry is not None and entry[0] == "ready":
            return self._replay(entry[1], live)
        if entry is not None and entry[0] == "eager":
            return self.fn(*args, **kwargs)
        if entry is None and len(self.entries) >= MAX_SIGNATURES:
            self._say(f"its inputs changed signature {MAX_SIGNATURES} times (shapes every call?)")
            return self.fn(*args, **kwargs)
        return self._trace(key, entry, args, kwargs, live)

    # ------------------------------------------------------------------ guards
    def _guard(self, args, kwargs):
        parts, live = [is_grad_enabled()], []
        for a in args:
            _signature(a, parts, live)
        for k in sorted(kwargs):
            parts.append(k)
            _signature(kwargs[k], parts, live)
        if self.module is not None:
            _module_signature(self.module, parts, live)
        return tuple(parts), live

    # ------------------------------------------------------------------ trace, replay
    def _trace(self, key, entry, args, kwargs, live):
        """Run the forward eagerly, recording it; the second trace of a signature must equal
        the first before the graph is kept. A graph that can be replayed is replayed at once
        on these inputs, from the random state the eager run started from, and that is what
        the call returns: every call of a compiled forward computes the same way, traced or
        not (a resumed run repeats an uninterrupted one bit for bit)."""
        t0, rng = time.perf_counter(), _random_state()
        tracer = Tracer(live)
        with tracing(tracer):
            out = self.fn(*args, **kwargs)
        graph = tracer.finish(out)
        if graph.reason is None and not any(s.kind == "v" for s in _leaves(graph.outputs)):
            graph.reason = "it returns no tensor"
        if graph.reason is None and entry is not None and not same_graph(entry[1], graph):
            graph.reason = (
                "its ops or constants changed between two calls of the same signature (an "
                "array computed from an input's values, or Python that branches on one)"
            )
        if graph.reason is not None:
            self.entries[key] = ("eager", graph.reason)
            self._say(graph.reason)
            self.trace_s += time.perf_counter() - t0
            return out
        # composites as kernels, elementwise runs as generated ones (the first trace's plan
        # serves the second, which is the same graph)
        if entry is None:
            graph.plan = plan(graph)
            graph.composites = _composites(graph)
        else:
            graph.plan, graph.composites = entry[1].plan, entry[1].composites
        self.entries[key] = ("seen" if entry is None else "ready", graph)
        self.trace_s += time.perf_counter() - t0
        if graph.device != "cpu":
            return out  # (the GPU's generator state is not restored: its eager result)
        del out, tracer  # the eager run's graph is freed before the replay
        _random_state(rng)
        return self._replay(graph, live)

    def _replay(self, graph: Graph, live):
        args = [
            live[s].detach()
            if s not in graph.grad_used and isinstance(live[s], Tensor) and live[s].requires_grad
            else live[s]
            for s in graph.used
        ]
        outs = Replay.apply(*args, graph=graph)
        it = iter(outs)

        def build(leaf):
            if isinstance(leaf, Leaf):
                if leaf.kind == "c":
                    return leaf.v
                t = next(it)
                return t if graph.needs_grad[leaf.v] and is_grad_enabled() else constant(t.array)
            return type(leaf)(build(x) for x in leaf)

        return build(graph.outputs)

    # ------------------------------------------------------------------ what it says
    def _say(self, reason: str) -> None:
        line = f"tensorgrad.compile: {self.name} runs eagerly: {reason}"
        if self.fullgraph:
            raise RuntimeError(line)
        if line not in self.said:
            self.said.add(line)
            warnings.warn(line, CompileWarning, stacklevel=3)

    def summary(self) -> dict:
        """What compiled: signatures replayed, ops per graph, kernels among them, trace time."""
        ready = [e[1] for e in self.entries.values() if e[0] == "ready"]
        eager = sorted({e[1] for e in self.entries.values() if e[0] == "eager"})
        return {
            "compiled": len(ready),
            "ops": [len(g.steps) for g in ready],
            "kernels": [sum(s.impl is not s.cls for s in g.steps) for g in ready],
            "fused": [sum(issubclass(s.impl, FusedElementwise) for s in g.plan) for g in ready],
            "composites": [g.composites for g in ready],
            "patterns": [_patterns(g) for g in ready],
            "steps": [len(g.plan) for g in ready],
            "eager": eager,
            "trace_s": self.trace_s,
        }


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


def _random_state(state=None):
    """The CPU generator and its state; given one, put it back."""
    if state is None:
        gen = devices.generators.cpu
        return gen, gen.bit_generator.state
    devices.generators.cpu = state[0]
    state[0].bit_generator.state = state[1]


def _leaves(x):
    if isinstance(x, Leaf):
        yield x
    else:
        for y in x:
            yield from _leaves(y)


def _signature(x, parts: list, live: list) -> None:
    """Append x's guard to parts, and its tensors/arrays (read afresh each call) to live."""
    if isinstance(x, Tensor):
        live.append(x)
        a = x.array
        parts.append(("T", a.shape, a.dtype, device_of(a), x.requires_grad, _contiguous(a)))
    elif hasattr(x, "dtype") and hasattr(x, "shape") and not isinstance(x, np.generic):
        live.append(x)
        parts.append(("A", x.shape, x.dtype, device_of(x), _contiguous(x)))
    elif isinstance(x, (tuple, list)):
        parts.append((type(x), len(x)))
        for y in x:
            _signature(y, parts, live)
    elif is_plain(x):
        parts.append((type(x), x))
    else:
        raise Uncompilable(f"an argument is a {type(x).__name__}, not a tensor or plain value")


def _contiguous(a) -> bool:
    flags = getattr(a, "flags", None)
    return bool(flags is not None and flags.c_contiguous)


def _module_signature(root, parts: list, live: list) -> None:
    """Append each submodule's training flag and each parameter's and buffer's (id, shape,
    dtype, requires_grad) to ``parts``, and the tensors to ``live``: one walk of the tree,
    every module and tensor once (a shared one at its first place), in a fixed order.
    Raises Uncompilable where a submodule has forward hooks."""
    seen, stack = set(), [root]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        d = m.__dict__  # (read directly, not through properties: this runs every call)
        if m is not root and (d.get("_forward_pre_hooks") or d.get("_forward_hooks")):
            raise Uncompilable(
                f"{type(m).__name__} has forward hooks (they run only in eager mode)"
            )
        parts.append(m.training)
        for t in (*d["_parameters"].values(), *d["_buffers"].values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                live.append(t)
                a = t.array
                parts.append((id(t), a.shape, a.dtype, t.requires_grad))
        stack.extend(reversed(d["_modules"].values()))


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
    raises where the forward would fall back to eager mode; ``dynamic``, ``backend``,
    ``mode`` and ``options`` are accepted and ignored; ``disable=True`` returns it as is."""
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
