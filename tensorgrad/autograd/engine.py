"""The layers over the plain backward path (``walk.py``): ``backward``, the public entry point,
which takes the plain path when nothing needs a layer; ``grad`` (gradients returned, ``.grad``
untouched, the walk pruned to the nodes that lead to its inputs); tensor hooks; retain_grad's
retained outputs; ``create_graph=True``, which records a graph of the backward itself (so
gradients can be differentiated again); and ``queue_callback``, run after every backward.
create_graph differentiates a kernel's node through its reference op, rerun on the kernel's
inputs: a hook of the tape's (``_keep_replay``, in ``graph.kernel_hooks``) keeps them at
every forward.

The layers do not copy the walk: they run ``walk.walk`` with their own per-node and per-leaf
steps (``_Layers``). ``backward`` needs them when create_graph is on or when a hook or a
retained output has ever been registered (``_registered``, a count that never goes down).

Imports: functools, .graph, .walk, ..devices.
"""

from __future__ import annotations

from functools import partial

from ..devices import get_array_module
from .graph import (
    RELEASED_MSG,
    Op,
    check_versions,
    constant,
    enable_grad,
    is_tensor,
    kernel_hooks,
    model_epoch,
    node_output,
    note_effect,
    retaining,
    saved_links,
    set_grad_enabled,
    watch,
)
from .walk import (
    accumulate_grad,
    check_grads,
    count_edges,
    leaf_mismatch,
    release,
    run_node,
    walk,
)

# ----------------------------------------------------------------------------- public entry points


_callbacks: list = []  # run once, at the end of the next backward (queue_callback)
_registered = 0  # hooks and retained outputs registered so far: while 0, the plain path will do


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
    if watch.traces and not create_graph:
        note_effect("it runs backward() inside the forward (off the tape: replay would not)")
    retain = create_graph if retain_graph is None else retain_graph
    try:
        roots = _roots(tensors, grad_tensors, create_graph, "backward")
        with set_grad_enabled(create_graph), retaining(retain):
            if create_graph or _registered:  # a layer may be needed: hooks, retained outputs
                layers = _Layers(retain, create_graph)
                walk(roots, layers.node, layers.leaf, True)
            else:
                walk(roots, run_node, partial(accumulate_grad, set()), retain)  # the plain path
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
    if watch.traces and not create_graph:
        note_effect("it takes autograd.grad inside the forward without create_graph (off the tape)")
    single = is_tensor(inputs)
    inputs = (inputs,) if single else tuple(inputs)
    for i, x in enumerate(inputs):
        if not is_tensor(x) or not x.requires_grad:
            raise RuntimeError(f"grad: input {i} is not a tensor that requires grad")
    roots = _roots(outputs, grad_outputs, create_graph, "grad")
    keys = [id(x) if x._node is None else (id(x._node), x._out_index) for x in inputs]
    targets = dict.fromkeys(keys)
    retain = create_graph if retain_graph is None else retain_graph
    layers = _Layers(retain, create_graph, targets, _leading_to(targets, roots))
    with set_grad_enabled(create_graph), retaining(retain):
        walk(roots, layers.node, layers.leaf, True)
    result = []
    for i, (x, key) in enumerate(zip(inputs, keys)):
        g = targets[key]
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


# ----------------------------------------------------------------------------- the layered steps


class _Layers:
    """The per-node and per-leaf steps of a walk that needs more than the plain path: hooks,
    retain_grad's retained outputs, grad()'s inputs (``targets``) and create_graph. The walk
    runs with retain_graph on: ``node`` releases each node it ran itself, unless ``retain``
    (grad() leaves the nodes it prunes as they are)."""

    def __init__(self, retain: bool, create_graph: bool, targets=None, needed=None):
        self.retain, self.create_graph = retain, create_graph
        self.targets = targets  # None: accumulate into leaves' .grad; else {key: gradient}
        self.needed = needed  # grad(): the nodes that lead to an input (None: every node)
        self.plain_leaf = partial(accumulate_grad, set())  # the plain path's per-leaf step

    def node(self, fn: Op, gys):
        if self.needed is not None and fn not in self.needed:
            return None  # grad(): no path to an input from here
        gxs = self._run(fn, gys)
        if not self.retain:
            release(fn)
        return gxs

    def _run(self, fn: Op, gys):
        """The plain path's ``run_node`` with the layers: hooks, retained and captured
        gradients of fn's outputs, then fn's backward (recorded under create_graph)."""
        if fn.released:
            raise RuntimeError(RELEASED_MSG)
        missing = [g is None for g in gys].count(True)  # (gys: () when no gradient reached fn)
        if missing == len(gys):
            return None
        if fn.checks:
            check_versions(fn)
        if fn.hooks is not None or fn.retained is not None or self.targets is not None:
            self._output_grads(fn, gys)
        create_graph = self.create_graph
        if missing and not fn.takes_none:  # outputs that received no gradient: zeros
            xp = get_array_module(*[g.array if is_tensor(g) else g for g in gys if g is not None])
            gys = [
                _zeros(xp, m, create_graph) if g is None else g for g, m in zip(gys, fn.out_meta)
            ]
        if create_graph:
            return check_grads(
                fn, differentiable_backward(fn, [g if g is None else constant(g) for g in gys])
            )
        return check_grads(fn, fn.backward(*gys))

    def _output_grads(self, fn: Op, gys: list) -> None:
        """Hooks on fn's outputs (which may replace a gradient in ``gys``), then the gradients
        that retain_grad() keeps or grad() asks for."""
        targets = self.targets
        for i, g in enumerate(gys):
            if g is None:
                continue
            if fn.hooks is not None and i in fn.hooks:
                gys[i] = g = run_hooks(fn.hooks[i], g)
            if targets is None and fn.retained is not None and i in fn.retained:
                self.leaf(fn.retained[i], g)
            elif targets is not None and (id(fn), i) in targets:
                targets[(id(fn), i)] = _accumulate(targets[(id(fn), i)], g)

    def leaf(self, t, g) -> None:
        hooks = getattr(t, "_hooks", None)
        if hooks:
            g = run_hooks(hooks, g)
        if self.targets is None:
            if is_tensor(g):  # create_graph: .grad is a tensor of the graph, added out of place
                _accumulate_graph_grad(t, g)
            else:
                self.plain_leaf(t, g)
        elif id(t) in self.targets:
            self.targets[id(t)] = _accumulate(self.targets[id(t)], g)


def _accumulate_graph_grad(t, g) -> None:
    a = t._array
    if tuple(g.shape) != tuple(a.shape) or g.dtype != a.dtype:
        raise RuntimeError(leaf_mismatch(g, a))
    t.grad = g if t.grad is None else t.grad + g


def _leading_to(targets: dict, roots) -> set:
    """The nodes from which some target (a leaf's id, or a node's (id, output)) is reached."""
    starts = list(dict.fromkeys(t._node for t, _ in roots if t._node is not None))
    count, order = count_edges(starts), []
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


def _keep_replay(fn: Op, inputs, arrays, kwargs) -> None:
    """The tape's hook for each node a kernel makes (``graph.kernel_hooks``): keep the input
    arrays, kwargs and input versions that ``_replayed_reference`` reruns its reference on. At
    every forward, as create_graph may be asked for by any later backward."""
    versions = [(x._version, x._version[0], x._array.shape) for x in inputs if is_tensor(x)]
    fn.replay = (arrays, kwargs, versions)


kernel_hooks.append(_keep_replay)


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
        model_epoch[0] += 1  # (a module's forward hook: compile's signature reads them)
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def register_hook(t, hook) -> RemovableHandle:
    """Run ``hook(grad)`` when t's gradient is computed (before a leaf accumulates it)."""
    global _registered
    if watch.traces:
        note_effect("it registers a gradient hook on a tensor (replay would not)")
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
    _registered += 1
    return RemovableHandle(hooks, hook)


# ----------------------------------------------------------------------------- retained outputs


def retain_grad(t) -> None:
    """Keep non-leaf t's gradient in its ``.grad`` during ``backward()`` (``Tensor.retain_grad``;
    a leaf always keeps its own)."""
    global _registered
    if watch.traces:
        note_effect("it calls retain_grad() (replay would not keep the gradient)")
    if t._node is not None:
        if t._node.retained is None:
            t._node.retained = {}
        t._node.retained[t._out_index] = t
        _registered += 1
