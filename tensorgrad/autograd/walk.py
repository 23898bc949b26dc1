"""The plain backward path: what ``loss.backward()`` runs when nothing asks for more (no hooks,
no retain_grad, no create_graph, no ``grad()`` inputs). Read it top to bottom:

- ``walk``: Kahn's algorithm over the nodes reachable from the roots: count the edges into each
  node (``count_edges``), run a node once every edge into it has delivered its gradient
  (``deliver``), then free what it saved (``release``). Iterative, so graph depth is limited
  only by memory.
- ``run_node``: a node's backward: zeros stand in for outputs that got no gradient; what it
  returns passes the gradient contract's fast pass (``check_grads``).
- ``accumulate_grad``: the gradient that reaches a leaf is added into its ``.grad``, in place
  when nothing else holds that array.

The layers (``engine.py``: grad(), hooks, retain_grad, create_graph) reuse ``walk`` with their
own per-node and per-leaf steps; nothing here branches for them.

Imports: sys, .graph, ..devices.
"""

from __future__ import annotations

import sys

from ..devices import get_array_module
from .graph import RELEASED_MSG, Op, check_versions, constant, explain_grads

# ----------------------------------------------------------------------------- Kahn's walk


def walk(roots, node_step, to_leaf, retain_graph: bool) -> None:
    """Kahn's walk from ``roots``, a list of (tensor, seed gradient): ``node_step(fn, gys)``
    runs once every edge into fn has delivered its gradient and returns fn's input gradients
    (or None); ``to_leaf(t, g)`` takes each gradient that reaches a leaf."""
    grads = {}  # per node, its outputs' gradients so far: first the roots' nodes
    for t, seed in roots:
        if t._node is None:
            to_leaf(t, seed)  # a root that is a leaf
        else:
            deliver(grads, (t._node, t._out_index), seed)
    pending = count_edges(grads)
    ready = [fn for fn in grads if pending[fn] == 0]
    while ready:
        fn = ready.pop()
        gxs = node_step(fn, grads.pop(fn, ()))  # (): no gradient reached fn
        if not retain_graph:
            release(fn)
        for e, gx in zip(fn.edges, gxs or [None] * len(fn.edges)):
            if type(e) is tuple:  # (node, output): an edge into another node
                if gx is not None:
                    deliver(grads, e, gx)
                pending[e[0]] -= 1
                if pending[e[0]] == 0:
                    ready.append(e[0])
            elif e is not None and gx is not None:  # a leaf (None: an input needing no gradient)
                to_leaf(e, gx)


def count_edges(starts) -> dict:
    """For each node reachable from ``starts``, how many edges reach it from that subgraph."""
    pending, stack = dict.fromkeys(starts, 0), list(starts)
    while stack:
        for e in stack.pop().edges:
            if type(e) is tuple:
                if e[0] not in pending:
                    stack.append(e[0])
                pending[e[0]] = pending.get(e[0], 0) + 1
    return pending


def deliver(grads: dict, edge, g) -> None:
    """Add g into output k of the node of ``edge`` (node, k); never in place, as a gradient
    array may be shared by several edges."""
    node, k = edge
    slot = grads.get(node) or grads.setdefault(node, [None] * node.n_out)
    slot[k] = g if slot[k] is None else slot[k] + g


def release(fn: Op) -> None:
    """Free what fn saved for its backward (a second backward through it raises); a node that
    holds a graph (compile's Replay) releases each part as its own backward runs it."""
    if not fn.holds_graph:
        fn.__dict__.clear()
        fn.checks, fn.released = (), True


# ----------------------------------------------------------------------------- a node's backward


def run_node(fn: Op, gys):
    """A node's backward, on its outputs' gradients ``gys`` (None for an output that got none;
    ``()`` when none did): fn's input gradients, or None when there is nothing to run."""
    if fn.released:
        raise RuntimeError(RELEASED_MSG)
    missing = [g is None for g in gys].count(True)  # (not gys.count(None): it compares arrays)
    if missing == len(gys):
        return None
    if fn.checks:
        check_versions(fn)  # no tensor that fn saved was changed in place since
    if missing and not fn.takes_none:  # outputs that received no gradient contribute zeros
        xp = get_array_module(*[g for g in gys if g is not None])
        gys = [xp.zeros(*m) if g is None else g for g, m in zip(gys, fn.out_meta)]
    return check_grads(fn, fn.backward(*gys))


def check_grads(fn: Op, gxs) -> tuple:
    """The gradient contract, on what fn's backward returned (as a tuple, which this returns):
    one gradient per input, each exactly its input's shape and a float dtype equal to the
    input's; never None for an input that requires grad, unless the op lists that input in
    ``non_differentiable`` (PyTorch raises there too) or is a user's Function (where None means
    no gradient, as in PyTorch)."""
    gxs = gxs if isinstance(gxs, tuple) else (gxs,)
    if len(gxs) == len(fn.in_meta):  # the usual case, checked in one quick pass
        for g, m in zip(gxs, fn.in_meta):  # m: (shape, dtype) of an input that requires grad
            if m is not None and (g is None or getattr(g, "shape", 0) != m[0] or g.dtype != m[1]):
                break  # a None, or a mismatch: explain_grads decides and explains
        else:
            return gxs
    explain_grads(fn, gxs)
    return gxs


# ----------------------------------------------------------------------------- a leaf's .grad


def accumulate_grad(handed: set, t, g) -> None:
    """Add array g (exactly t's shape and dtype, by the contract) into leaf t's ``.grad``.
    ``handed``: the ids of the arrays this walk has handed to leaves so far (the per-leaf step
    of a walk is ``functools.partial(accumulate_grad, set())``)."""
    if id(g) in handed:
        g = g.copy()  # Add hands one array to both inputs: no two .grad may share it
    handed.add(id(g))
    if tuple(g.shape) != tuple(t._array.shape) or g.dtype != t._array.dtype:
        raise RuntimeError(leaf_mismatch(g, t._array))
    if t.grad is None:
        if not getattr(g.flags, "writeable", True):
            g = g.copy()  # a broadcast view (from sum/mean/expand): .grad must be writable
        t.grad = constant(g)
        return
    old = t.grad.array
    owns = getattr(old, "base", None) is None and getattr(old.flags, "writeable", True)
    if owns and _refs(old) <= _SOLE_REFS:  # (owns: its memory, not a view of a shared array)
        # nobody else holds this array (no view of it, no op saved it, no other tensor wraps
        # it, no caller kept it from .numpy()), so adding in place changes only this .grad
        # tensor, which is PyTorch's behaviour; it saves a fresh array per accumulation (154
        # MB for GPT-2's tied embedding). Two parameters given one .grad tensor share it, as
        # in PyTorch.
        old += g
        t.grad._version[0] += 1
    else:
        t.grad = constant(old + g)


# ----------------------------------------------------------------------------- off the path


def leaf_mismatch(g, a) -> str:
    """The error for a gradient g that does not fit its leaf's array a (the contract checks
    each gradient against its input's array as it was at the forward)."""
    return (
        f"gradient of shape {tuple(g.shape)} and dtype {g.dtype} does not match the leaf's "
        f"shape {tuple(a.shape)} and dtype {a.dtype}"
    )


# sys.getrefcount; an interpreter without it gets a constant (and so does _SOLE_REFS)
_refs = getattr(sys, "getrefcount", None) or (lambda a: 1 << 30)


class _Holder:
    __slots__ = ("array",)


def _calibrate() -> int:
    """The reference count accumulate_grad sees for an array held by one tensor only:
    measured with the same code shape, because interpreters count a local variable or a
    call's argument differently (CPython 3.14 borrows some references)."""
    h = _Holder()
    h.array = object()
    old = h.array
    return _refs(old)


_SOLE_REFS = _calibrate()
