"""The reverse walk: ``backward`` (into leaves' ``.grad``) and ``grad`` (returned, ``.grad``
untouched), with tensor hooks and, under ``create_graph=True``, a recorded graph of the
backward itself (so gradients can be differentiated again).

The walk is Kahn's algorithm over the nodes reachable from the outputs: count the edges
into each node, run a node's backward once every edge into it has delivered its
gradient. It is iterative, so graph depth is limited only by memory.
"""

from __future__ import annotations

import sys

from ..devices import get_array_module
from .graph import (
    RELEASED_MSG,
    Op,
    check_versions,
    constant,
    enable_grad,
    is_tensor,
    node_output,
    saved_links,
    set_grad_enabled,
)

# ----------------------------------------------------------------------------- public entry points


_callbacks: list = []  # run once, at the end of the next backward (queue_callback)


def queue_callback(fn) -> None:
    """Call ``fn()`` once, when the next backward walk has stored every gradient (how
    DistributedDataParallel reduces the gradients after ``loss.backward()``)."""
    _callbacks.append(fn)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph: bool = False) -> None:
    """Accumulate d(tensors)/d(leaf) into every leaf's ``.grad`` (``torch.autograd.backward``),
    then run the callbacks queued with ``queue_callback``.

    ``grad_tensors`` weighs each output (required for non-scalars); ``create_graph`` records
    the backward so the gradients can be differentiated again (``retain_graph`` defaults to
    it)."""
    retain = create_graph if retain_graph is None else retain_graph
    try:
        roots = _roots(tensors, grad_tensors, create_graph, "backward")
        with set_grad_enabled(create_graph):
            run_walk(roots, retain, create_graph, _Sink())
    except BaseException:
        _callbacks.clear()  # a failed walk: its gradients are incomplete, nothing to finish
        raise
    while _callbacks:
        _callbacks.pop(0)()


def grad(
    outputs,
    inputs,
    grad_outputs=None,
    retain_graph=None,
    create_graph: bool = False,
    allow_unused: bool = False,
    materialize_grads: bool = False,
) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs``, returned as a tuple (one per
    input) and not accumulated anywhere: ``.grad`` stays untouched (``torch.autograd.grad``).

    An input the outputs do not depend on raises unless ``allow_unused`` (then its entry is
    None, or zeros with ``materialize_grads``)."""
    single = is_tensor(inputs)
    inputs = (inputs,) if single else tuple(inputs)
    for i, x in enumerate(inputs):
        if not is_tensor(x) or not x.requires_grad:
            raise RuntimeError(f"grad: input {i} is not a tensor that requires grad")
    roots = _roots(outputs, grad_outputs, create_graph, "grad")
    keys = [id(x) if x._node is None else (id(x._node), x._out_index) for x in inputs]
    sink = _Sink(dict.fromkeys(keys))
    retain = create_graph if retain_graph is None else retain_graph
    with set_grad_enabled(create_graph):
        run_walk(roots, retain, create_graph, sink)
    result = []
    for i, (x, key) in enumerate(zip(inputs, keys)):
        g = sink.targets[key]
        if g is None and materialize_grads:
            g = _zeros(get_array_module(x.array), (x.array.shape, x.array.dtype), True)
        elif g is None and not allow_unused:
            raise RuntimeError(
                f"grad: input {i} (shape {tuple(x.shape)}) was not used in computing the "
                "outputs; pass allow_unused=True to get None for it"
            )
        result.append(g if g is None or is_tensor(g) else constant(g))
    return tuple(result)


def _roots(outputs, grads, create_graph: bool, who: str) -> list:
    """(output, seed) pairs: the seed is ones for a scalar output, else the given gradient,
    as arrays (Tensors under create_graph)."""
    if is_tensor(outputs):
        outputs, grads = (outputs,), (grads,)
    outputs = tuple(outputs)
    grads = (None,) * len(outputs) if grads is None else tuple(grads)
    if len(grads) != len(outputs):
        raise RuntimeError(f"{who}: got {len(grads)} gradients for {len(outputs)} outputs")
    roots = []
    for y, g in zip(outputs, grads):
        if not y.requires_grad:
            raise RuntimeError(
                f"{who}() on a tensor that does not require grad (no input needed a gradient, "
                "or it was computed under no_grad)"
            )
        xp = get_array_module(y.array)
        if g is None:
            if y.array.size != 1:
                raise RuntimeError(
                    f"{who}() without a gradient argument needs a scalar output, got shape "
                    f"{tuple(y.shape)}; pass a gradient of the same shape"
                )
            g = xp.ones_like(y.array)
        elif not (create_graph and is_tensor(g)):
            g = g.array if is_tensor(g) else xp.asarray(g, dtype=y.dtype)
        if tuple(g.shape) != tuple(y.array.shape):
            raise RuntimeError(
                f"{who}(): gradient shape {tuple(g.shape)} does not match the output "
                f"shape {tuple(y.shape)}"
            )
        if g.dtype != y.array.dtype:  # the array's dtype: NumPy compares it without converting
            g = g.astype(y.array.dtype)
        roots.append((y, constant(g) if create_graph else g))
    return roots


# ----------------------------------------------------------------------------- the walk


class _Sink:
    """Where gradients that reach leaves (and targets of ``grad``) end up."""

    def __init__(self, targets=None):
        self.targets = targets  # None: accumulate into leaves' .grad; else {key: gradient}
        self.handed = set()  # ids of the arrays already stored as a .grad in this walk

    def leaf(self, t, g) -> None:
        hooks = getattr(t, "_hooks", None)
        if hooks:
            g = run_hooks(hooks, g)
        if self.targets is None:
            if not is_tensor(g) and id(g) in self.handed:
                g = g.copy()  # Add hands one array to both inputs: no two .grad may share
            self.handed.add(id(g))
            _accumulate_grad(t, g)
        elif id(t) in self.targets:
            self.targets[id(t)] = _accumulate(self.targets[id(t)], g)


def run_walk(roots, retain_graph: bool, create_graph: bool, sink: _Sink) -> None:
    """Kahn's walk from ``roots``, a list of (tensor, seed gradient): a node runs its
    backward once every edge into it has delivered its gradient."""
    grads, starts = _seed(roots, sink)
    pending = _count_edges(starts)
    needed = None if sink.targets is None else _leading_to(sink.targets, starts, pending)
    ready = [fn for fn in starts if pending[fn] == 0]
    while ready:
        fn = ready.pop()
        if needed is not None and fn not in needed:  # grad(): no path to an input from here
            gxs = None
        else:
            gxs = _run_node(fn, grads.pop(fn, None), create_graph, sink)
            if not retain_graph:
                _release(fn)
        for e, gx in zip(fn.edges, gxs or [None] * len(fn.edges)):
            if type(e) is not tuple:  # a leaf (or None: an input that needs no gradient)
                if e is not None and gx is not None:
                    sink.leaf(e, gx)
                continue
            node = e[0]
            if gx is not None:
                _deliver(grads, e, gx)
            left = pending[node] - 1
            pending[node] = left
            if left == 0:
                ready.append(node)


def _leading_to(targets: dict, starts, pending: dict) -> set:
    """The nodes from which some target (a leaf's id, or a node's (id, output)) is reached."""
    count, order = dict(pending), []
    ready = [fn for fn in starts if count[fn] == 0]
    while ready:  # Kahn's order: every node before the nodes it feeds
        fn = ready.pop()
        order.append(fn)
        for e in fn.edges:
            if type(e) is tuple:
                count[e[0]] -= 1
                if count[e[0]] == 0:
                    ready.append(e[0])
    needed = set()
    for fn in reversed(order):
        if any((id(fn), i) in targets for i in range(fn.n_out)) or any(
            (e[0] in needed) if type(e) is tuple else (e is not None and id(e) in targets)
            for e in fn.edges
        ):
            needed.add(fn)
    return needed


def _seed(roots, sink: _Sink):
    """The roots' gradients, per node and output (a leaf root goes straight to the sink)."""
    grads, starts = {}, {}
    for t, seed in roots:
        if t._node is None:
            sink.leaf(t, seed)
        else:
            _deliver(grads, (t._node, t._out_index), seed)
            starts[t._node] = None
    return grads, list(starts)


def _deliver(grads: dict, edge, g) -> None:
    node, k = edge
    slot = grads.get(node)
    if slot is None:
        slot = grads[node] = [None] * node.n_out
    old = slot[k]
    slot[k] = g if old is None else old + g  # (_accumulate, inlined: once per edge)


def _count_edges(starts) -> dict:
    """For each node reachable from ``starts``, how many edges reach it from that subgraph."""
    pending = dict.fromkeys(starts, 0)
    stack = list(pending)
    while stack:
        for e in stack.pop().edges:
            if type(e) is tuple:
                n = e[0]
                if n in pending:
                    pending[n] += 1
                else:
                    pending[n] = 1
                    stack.append(n)
    return pending


def _run_node(fn: Op, gys, create_graph: bool, sink: _Sink):
    """Hooks, retained and captured gradients of fn's outputs, then fn's backward."""
    if fn.released:
        raise RuntimeError(RELEASED_MSG)
    if gys is None:
        return None
    missing = 0  # outputs that received no gradient (counted without comparing arrays)
    for g in gys:
        if g is None:
            missing += 1
    if missing == len(gys):
        return None
    if fn.checks:
        check_versions(fn)
    if fn.hooks is not None or fn.retained is not None or sink.targets is not None:
        _output_grads(fn, gys, sink)
    if missing:  # outputs that received no gradient contribute zeros
        xp = get_array_module(*[g.array if is_tensor(g) else g for g in gys if g is not None])
        gys = [_zeros(xp, m, create_graph) if g is None else g for g, m in zip(gys, fn.out_meta)]
    if create_graph:
        gxs = differentiable_backward(fn, [constant(g) for g in gys])
    else:
        gxs = fn.backward(*gys)
    if not isinstance(gxs, tuple):
        gxs = (gxs,)
    check_grads(fn, gxs)
    return gxs


def _output_grads(fn: Op, gys: list, sink: _Sink) -> None:
    """Hooks on fn's outputs (which may replace a gradient in ``gys``), then the gradients
    that retain_grad() keeps or grad() asks for."""
    for i, g in enumerate(gys):
        if g is None:
            continue
        if fn.hooks is not None and i in fn.hooks:
            gys[i] = g = run_hooks(fn.hooks[i], g)
        if sink.targets is None and fn.retained is not None and i in fn.retained:
            sink.leaf(fn.retained[i], g)
        elif sink.targets is not None and (id(fn), i) in sink.targets:
            sink.targets[(id(fn), i)] = _accumulate(sink.targets[(id(fn), i)], g)


def _release(fn: Op) -> None:
    fn.__dict__.clear()
    fn.checks = ()  # it holds the saved output tensors, and so their arrays
    fn.released = True


def _zeros(xp, meta, as_tensor: bool):
    shape, dtype = meta
    z = xp.zeros(shape, dtype)
    return constant(z) if as_tensor else z


def _accumulate(a, b):
    # never in place: a gradient array may be shared by several edges
    return b if a is None else a + b


# ----------------------------------------------------------------------------- create_graph


def differentiable_backward(fn: Op, gys):
    """Run fn's backward on Tensors under recording, with its saved inputs and outputs
    reconnected to the graph; a kernel defers to its reference op (replayed forward)."""
    impl = _replayed_reference(fn)
    saved = impl.__dict__.get("saved")
    with enable_grad():
        if saved is None:
            return impl.backward(*gys)
        impl.saved = tuple(_saved_tensor(fn, s, link) for s, link in zip(saved, impl.links))
        try:
            return impl.backward(*gys)
        finally:
            impl.saved = saved


def _saved_tensor(fn: Op, s, link):
    if link is None:
        return constant(s) if hasattr(s, "dtype") else s
    kind, k = link
    if kind == 1:
        return node_output(s, fn, k)
    e = fn.edges[k]
    if e is None:
        return constant(s)
    return node_output(s, *e) if type(e) is tuple else e


def _replayed_reference(fn: Op) -> Op:
    """fn itself when it is a reference op; for a kernel, its reference run forward again on
    the same input arrays (kernels save what their own backward needs, which is not
    written to be differentiated)."""
    replay = fn.__dict__.get("replay")
    if replay is None:
        return fn
    if "replayed" not in fn.__dict__:
        arrays, kwargs, versions = replay
        check_versions(fn, versions)
        if fn.reference.op == "dropout" or kwargs.get("dropout_p", 0.0) > 0.0:
            raise RuntimeError(
                f"{fn.name}: a kernel's random dropout mask cannot be differentiated twice; "
                "run the forward under tensorgrad.kernels.reference_only()"
            )
        ref = fn.reference()
        ref.reference, ref.needs_input_grad = fn.reference, fn.needs_input_grad
        out = ref.forward(*arrays, **kwargs)
        outs = out if ref.multi_output else (out,)
        ref.links = saved_links(ref.__dict__.get("saved", ()), arrays, outs)
        fn.replayed = ref
    return fn.replayed


# ----------------------------------------------------------------------------- hooks


def run_hooks(hooks, g):
    """Call each hook on the gradient (a Tensor); one that returns a value replaces it."""
    if not hooks:
        return g
    was_array = not is_tensor(g)
    gt = constant(g) if was_array else g
    for hook in list(hooks):
        new = hook(gt)
        if new is not None:
            if not is_tensor(new) or tuple(new.shape) != tuple(gt.shape):
                got = tuple(new.shape) if is_tensor(new) else type(new).__name__
                raise RuntimeError(
                    f"a hook returned {got} for a gradient of shape {tuple(gt.shape)}; "
                    "return a Tensor of the same shape (or None to keep it)"
                )
            gt = new.astype(gt.dtype)
    return gt.array if was_array else gt


class RemovableHandle:
    """Returned by ``register_hook`` and the Module hooks: ``.remove()`` unregisters."""

    def __init__(self, hooks: list, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def register_hook(t, hook) -> RemovableHandle:
    """Run ``hook(grad)`` when t's gradient is computed (before a leaf accumulates it)."""
    if not t.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that does not require grad")
    if t._node is None:
        if getattr(t, "_hooks", None) is None:
            t._hooks = []
        hooks = t._hooks
    else:
        if t._node.hooks is None:
            t._node.hooks = {}
        hooks = t._node.hooks.setdefault(t._out_index, [])
    hooks.append(hook)
    return RemovableHandle(hooks, hook)


# ----------------------------------------------------------------------------- the contract


def check_grads(fn: Op, gxs) -> None:
    """The gradient contract: one gradient per input, each exactly its input's shape and a
    float dtype equal to the input's; never None for an input that requires grad, unless
    the op lists that input in ``non_differentiable`` (PyTorch raises there too) or is a
    user's Function (where None means no gradient, as in PyTorch)."""
    in_meta = fn.in_meta
    if len(gxs) == len(in_meta):  # the usual case, checked in one quick pass
        for gx, meta in zip(gxs, in_meta):
            if meta is not None and (
                gx is None or getattr(gx, "shape", None) != meta[0] or gx.dtype != meta[1]
            ):
                break  # a None, or a mismatch: the pass below decides and explains
        else:
            return
    if len(gxs) != len(fn.in_meta):
        raise RuntimeError(
            f"{fn.name}.backward returned {len(gxs)} gradients for {len(fn.in_meta)} inputs"
        )
    for i, (gx, meta) in enumerate(zip(gxs, fn.in_meta)):
        if meta is None:
            continue
        if gx is None:
            if fn.none_is_no_gradient or i in (fn.reference or type(fn)).non_differentiable:
                continue
            raise RuntimeError(
                f"{fn.name}.backward returned no gradient for input {i}, which requires grad: "
                "the derivative of this op for that input is not implemented (pass it "
                "detached, or as a plain array)"
            )
        shape, dtype = meta
        if not hasattr(gx, "shape") or tuple(gx.shape) != tuple(shape):
            got = tuple(gx.shape) if hasattr(gx, "shape") else type(gx).__name__
            raise RuntimeError(
                f"{fn.name}.backward returned a gradient of shape {got} for input {i} of "
                f"shape {tuple(shape)}"
            )
        if gx.dtype != dtype:
            raise RuntimeError(
                f"{fn.name}.backward returned a {gx.dtype} gradient for input {i} of dtype {dtype}"
            )


# ----------------------------------------------------------------------------- leaf .grad


def _accumulate_grad(t, g) -> None:
    """Add g (exactly t's shape and dtype, by the contract) into leaf t's ``.grad``."""
    a = t._array
    if tuple(g.shape) != tuple(a.shape) or g.dtype != a.dtype:
        raise RuntimeError(
            f"gradient of shape {tuple(g.shape)} and dtype {g.dtype} does not match the leaf's "
            f"shape {tuple(a.shape)} and dtype {a.dtype}"
        )
    if is_tensor(g):  # create_graph: .grad is a tensor of the graph, added out of place
        t.grad = g if t.grad is None else t.grad + g
        return
    if t.grad is None:
        if not getattr(g.flags, "writeable", True):
            g = g.copy()  # a broadcast view (from sum/mean/expand): .grad must be writable
        t.grad = constant(g)
        return
    old = t.grad.array
    if (
        getattr(old, "base", None) is None  # owns its memory: not a view of a shared array
        and getattr(old.flags, "writeable", True)
        and _refs(old) <= _SOLE_REFS
    ):
        # nobody else holds this array (no view of it, no op saved it, no other tensor wraps
        # it, no caller kept it from .numpy()), so adding in place changes only this .grad
        # tensor, which is PyTorch's behaviour; it saves a fresh array per accumulation (154
        # MB for GPT-2's tied embedding). Two parameters given one .grad tensor share it, as
        # in PyTorch.
        old += g
        t.grad._version[0] += 1
    else:
        t.grad = constant(old + g)


def _refs(a) -> int:
    getrefcount = getattr(sys, "getrefcount", None)
    return getrefcount(a) if getrefcount is not None else 1 << 30  # no refcounts: never


class _Holder:
    __slots__ = ("array",)


def _calibrate() -> int:
    """The reference count _accumulate_grad sees for an array held by one tensor only:
    measured with the same code shape, because interpreters count a local variable or a
    call's argument differently (CPython 3.14 borrows some references)."""
    h = _Holder()
    h.array = object()
    old = h.array
    return _refs(old)


_SOLE_REFS = _calibrate()
