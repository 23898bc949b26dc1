"""Replay: a traced ``Graph`` run again as one graph node, ``Replay``.

Its forward runs each step's forward on arrays, in order, without the per-op Python of
eager mode (no Tensor per value, no kernel lookup, no graph edges, no device checks): the
kernel chosen at trace time runs again, since the guards keep the shapes, dtypes and devices
the same. Each step's op instance keeps what its backward needs, as in eager mode. Its
backward runs the steps' backwards in reverse, adding up each value's gradient; values that
no later step reads are dropped as the walk passes them.

``backward(create_graph=True)``: the steps run again eagerly on the saved inputs, as tensors
that record a graph, and that graph is differentiated (so a compiled module's gradients are
themselves differentiable, as an eager one's).

Imports: numpy, .trace, ..autograd, ..devices.
"""

from __future__ import annotations

import numpy as np

from .. import devices
from ..autograd import graph as tape
from ..autograd.engine import grad as autograd_grad
from ..autograd.walk import check_grads
from ..devices import get_array_module
from .trace import Graph, last_reads


def random_state(state=None):
    """The CPU generator and its state; given one, put it back."""
    if state is None:
        gen = devices.generators.cpu
        return gen, gen.bit_generator.state
    devices.generators.cpu = state[0]
    state[0].bit_generator.state = state[1]


def _arg(env, ref):
    kind, v = ref
    return env[v] if kind == "v" else v


def _frees(graph: Graph) -> list:
    """Per plan step, the slots no later step (nor the result) reads: replay drops them there,
    as eager mode drops a temporary (computed once per graph)."""
    frees = graph.__dict__.get("_frees")
    if frees is None:
        frees = [[] for _ in graph.plan]
        for v, k in last_reads(graph, graph.plan).items():
            if k < len(graph.plan):  # (the result's slots: len(plan), kept)
                frees[k].append(v)
        graph._frees = frees
    return frees


class Replay(tape.Op):
    """The graph node of one compiled call: ``Replay.apply(*used, graph=g)``, ``used`` the
    live inputs the graph reads (``graph.used``: an unused parameter gets no gradient, as in
    eager mode, rather than a None the walk would take for a missing one)."""

    multi_output = True
    holds_graph = True  # each step is released as its backward runs (not the whole node)
    none_is_no_gradient = True  # an input only another output reaches gets none (as eagerly)
    takes_none = True  # an output no gradient reached (the logits beside the loss) adds
    # nothing: zeros of its shape would be a whole (B, T, vocab) array, added to a real one

    def forward(self, *arrays, graph: Graph):
        record = any(self.needs_input_grad)
        if record and graph.random:  # create_graph's re-run must draw the same masks
            self.rng = random_state()
        env = [None] * len(graph.needs_grad)
        for slot, a in zip(graph.used, arrays):
            env[slot] = a
        fns, frees = [], _frees(graph)
        for k, st in enumerate(graph.plan):
            fn = st.impl()
            fn.reference = st.ref  # (None: no one reference Op; Op.name says impl's)
            fn.needs_input_grad = st.needs if record else (False,) * len(st.ins)
            args = [_arg(env, r) for r in st.ins]
            kwargs = {k: _arg(env, r) for k, r in st.kwargs.items()}
            out = fn.forward(*args, **kwargs)
            outs = out if st.impl.multi_output else (out,)
            for slot, o in zip(st.outs, outs):
                env[slot] = np.asarray(o) if isinstance(o, np.generic) else o
            if record:
                fns.append(fn)
            for slot in frees[k]:
                env[slot] = None  # no later step reads it (what backward needs, ops saved)
        self.graph, self.fns = graph, fns
        self.out_slots = graph.output_slots()
        outs = tuple(env[s] for s in self.out_slots)
        if record:
            # in-place changes before backward are caught, as eagerly: to an input, and to an
            # output that an op inside saved for its backward (tanh's y, say)
            kept = {id(a) for fn in fns for a in fn.__dict__.get("saved", ())}
            ins = {id(a) for a in arrays}
            self.save(*arrays, *(o for o in outs if id(o) in kept and id(o) not in ins))
            if graph.random:
                self.rng_after = devices.generators.cpu.bit_generator.state
        return outs

    def backward(self, *gys):
        if any(tape.is_tensor(g) for g in gys):
            return self._differentiable_backward(gys)
        graph = self.graph
        grads: list = [None] * len(graph.needs_grad)
        for slot, g in zip(self.out_slots, gys):
            if g is not None:
                grads[slot] = g if grads[slot] is None else grads[slot] + g
        fns = self.fns
        keep = tape._state.retain_graph  # backward(retain_graph=True): run them again later
        for k in range(len(graph.plan) - 1, -1, -1):
            st, fn = graph.plan[k], fns[k]
            gouts = [grads[s] for s in st.outs]
            if all(g is None for g in gouts) or not any(st.needs):
                continue  # not on this backward's path: kept for one through another output
            if fn is None:
                raise RuntimeError(tape.RELEASED_MSG)
            if not keep:  # dropped once its backward has run, with what it saved (as the
                fns[k] = None  # eager walk releases each node): activations go as gradients come
            for s in st.outs:
                grads[s] = None  # this value's gradient is complete: free it
            if any(g is None for g in gouts):  # outputs no gradient reached: zeros
                xp = get_array_module(*[g for g in gouts if g is not None])
                gouts = [xp.zeros(*m) if g is None else g for g, m in zip(gouts, st.meta)]
            gxs = fn.backward(*gouts)
            if not isinstance(gxs, tuple):
                gxs = (gxs,)
            # the gradient contract, checked as the eager walk checks it
            fn.in_meta = [
                graph.meta[r[1]] if need and r[0] == "v" else None
                for r, need in zip(st.ins, st.needs)
            ]
            check_grads(fn, gxs)
            for ref, need, gx in zip(st.ins, st.needs, gxs):
                if need and gx is not None and ref[0] == "v":
                    s = ref[1]
                    grads[s] = gx if grads[s] is None else grads[s] + gx
        return tuple(grads[s] for s in graph.used)

    def _differentiable_backward(self, gys):
        """Under create_graph: the steps again, eagerly, on the saved inputs (tensors linked
        to the graph), and that graph's gradients, themselves recorded."""
        graph = self.graph
        live = self.saved[: len(graph.used)]  # (the inputs; the outputs it saved follow)
        with tape.enable_grad():
            env = [None] * len(graph.needs_grad)
            for slot, t in zip(graph.used, live):
                env[slot] = t
            now = random_state()
            if graph.random:  # the forward's draws again: the same dropout masks
                random_state(self.rng)
            try:
                for st in graph.steps:
                    args = [_arg(env, r) for r in st.ins]
                    kwargs = {k: _arg(env, r) for k, r in st.kwargs.items()}
                    out = st.ref.apply(*args, **kwargs)  # (traced steps: ref is set)
                    for slot, o in zip(st.outs, out if isinstance(out, tuple) else (out,)):
                        env[slot] = o
                if graph.random and devices.generators.cpu.bit_generator.state != self.rng_after:
                    raise RuntimeError(
                        "backward(create_graph=True) through a compiled forward: its ops drew "
                        "other random numbers when run again (run the forward uncompiled)"
                    )
            finally:
                random_state(now)
            pairs = [
                (env[s], g)
                for s, g in zip(self.out_slots, gys)
                if g is not None and graph.needs_grad[s]
            ]
            wrt = [(k, t) for k, t in enumerate(live) if tape.is_tensor(t) and t.requires_grad]
            gs = autograd_grad(
                [o for o, _ in pairs],
                [t for _, t in wrt],
                [g for _, g in pairs],
                create_graph=True,
                allow_unused=True,
            )
        out = [None] * len(live)
        for (k, _), g in zip(wrt, gs):
            out[k] = g
        return tuple(out)
