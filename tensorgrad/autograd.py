"""The tape: Function (one recorded op), the reverse walk, and no_grad.

A ``Function`` subclass computes ``forward`` on raw backend arrays and
``backward`` on raw arrays, returning one gradient (or None) per input. Calling
``SomeFunction.apply(*inputs)`` runs forward and, when any input requires grad
and recording is on, keeps the Function instance as the graph node of its
outputs. The instance is its own context: forward stores what backward needs
as attributes, and the walk deletes them once backward has used them.

The walk in :func:`backward` is iterative (Kahn's algorithm over the nodes
reachable from the root), so graph depth is limited only by memory.
"""

from __future__ import annotations

import contextlib
import threading

from . import backend as _backend
from .backend import get_array_module

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


class set_grad_enabled(contextlib.ContextDecorator):
    """Context manager and decorator that turns recording on or off."""

    def __init__(self, mode: bool):
        self.mode = bool(mode)

    def __enter__(self):
        self.prev = is_grad_enabled()
        _state.enabled = self.mode

    def __exit__(self, *exc):
        _state.enabled = self.prev
        return False


class no_grad(set_grad_enabled):
    """Nothing computed inside is recorded (``with tg.no_grad():`` or ``@tg.no_grad()``)."""

    def __init__(self):
        super().__init__(False)


class enable_grad(set_grad_enabled):
    def __init__(self):
        super().__init__(True)


def unbroadcast(g, shape: tuple):
    """Sum a broadcast gradient back down to ``shape`` (NumPy broadcasting rules)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


RELEASED_MSG = (
    "Trying to backward through the graph a second time (or to use saved values after they "
    "were freed). The saved arrays are released after the first backward; pass "
    "retain_graph=True to the first backward() if you need to backward twice."
)


class Function:
    """One recorded operation. Subclasses define ``forward`` and ``backward``."""

    # graph fields live in slots so that releasing the context (``__dict__``) keeps them
    __slots__ = ("edges", "checks", "n_out", "out_meta", "retained", "released", "__dict__")
    multi_output = False  # forward returns a tuple of arrays

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, *grads):  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, *arrays):
        """Keep arrays for backward; in-place changes to them are caught at backward."""
        self.saved = arrays

    @property
    def name(self) -> str:
        return type(self).__name__

    @classmethod
    def apply(cls, *inputs, **kwargs):
        from .tensor import Tensor

        fn = cls()
        arrays = [x.data if isinstance(x, Tensor) else x for x in inputs]
        if _backend._multi:  # a GPU (or stand-in) module is loaded: no mixing devices
            _backend.check_same_device(cls.__name__.lower(), arrays)
        out = fn.forward(*arrays, **kwargs)
        outs = out if cls.multi_output else (out,)
        record = is_grad_enabled() and any(
            isinstance(x, Tensor) and x.requires_grad for x in inputs
        )
        if not record:
            results = [Tensor._make(o, None, 0) for o in outs]
            return tuple(results) if cls.multi_output else results[0]

        edges = []
        for x in inputs:
            if isinstance(x, Tensor) and x.requires_grad:
                edges.append((x._node, x._out_index) if x._node is not None else x)
            else:
                edges.append(None)
        fn.edges = edges
        fn.n_out = len(outs)
        fn.out_meta = [(o.shape, o.dtype) for o in outs]
        fn.retained = None
        fn.released = False
        results = [Tensor._make(o, fn, i) for i, o in enumerate(outs)]
        saved = fn.__dict__.get("saved", ())
        checks = []
        if saved:
            # remember the version of every tensor whose array backward will read
            for t in (*inputs, *results):
                if isinstance(t, Tensor) and any(s is t.data for s in saved):
                    checks.append((t, t._version[0]))
        fn.checks = checks
        return tuple(results) if cls.multi_output else results[0]


def _check_versions(fn: Function):
    for t, v in fn.checks:
        if t._version[0] != v:
            raise RuntimeError(
                f"a tensor of shape {tuple(t.shape)} needed by the backward of {fn.name} was "
                f"modified in place after it was saved (version {v} -> {t._version[0]}); "
                "use an out-of-place op (x = x + y) instead of x += y or x[...] = ..."
            )


def _accumulate(a, b):
    # never in place: a gradient array may be shared by several edges
    return b if a is None else a + b


def backward(root, grad=None, retain_graph: bool = False) -> None:
    """Reverse-mode sweep from ``root`` (a Tensor), accumulating into leaf ``.grad``."""
    from .tensor import Tensor

    if not root.requires_grad:
        raise RuntimeError(
            "backward() on a tensor that does not require grad (no input needed a gradient, "
            "or it was computed under no_grad)"
        )
    xp = get_array_module(root.data)
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(
                f"backward() without a gradient argument needs a scalar output, got shape "
                f"{tuple(root.shape)}; pass a gradient of the same shape"
            )
        grad = xp.ones_like(root.data)
    else:
        grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad, dtype=root.dtype)
        if grad.shape != root.data.shape:
            raise RuntimeError(
                f"backward(): gradient shape {tuple(grad.shape)} does not match the output "
                f"shape {tuple(root.shape)}"
            )
    if root._node is None:  # a leaf: its gradient is the seed
        root._accumulate_grad(grad)
        return

    # count, for each node, how many edges reach it from the root's subgraph
    start = root._node
    pending = {start: 0}
    stack = [start]
    while stack:
        fn = stack.pop()
        for e in fn.edges:
            if type(e) is tuple:
                n = e[0]
                if n in pending:
                    pending[n] += 1
                else:
                    pending[n] = 1
                    stack.append(n)

    grads = {start: [None] * start.n_out}
    grads[start][root._out_index] = grad
    handed = set()  # ids of the arrays already stored as a .grad in this walk

    def store(t, g):
        # Add hands one array to both inputs: copy, so that no two .grad share (in-place safe)
        if id(g) in handed:
            g = g.copy()
        handed.add(id(g))
        t._accumulate_grad(g)

    ready = [start]
    while ready:
        fn = ready.pop()
        gys = grads.pop(fn, None)
        if fn.released:
            raise RuntimeError(RELEASED_MSG)
        gxs = None
        if gys is not None and any(g is not None for g in gys):
            _check_versions(fn)
            if fn.retained is not None:
                for i, t in fn.retained.items():
                    if gys[i] is not None:
                        store(t, gys[i])
            if fn.n_out == 1:
                gxs = fn.backward(gys[0])
            else:
                # outputs that received no gradient contribute zeros
                gys = [
                    g if g is not None else xp.zeros(shape, dtype)
                    for g, (shape, dtype) in zip(gys, fn.out_meta)
                ]
                gxs = fn.backward(*gys)
            if not isinstance(gxs, tuple):
                gxs = (gxs,)
        if not retain_graph:
            fn.__dict__.clear()
            fn.checks = ()  # it holds the saved output tensors, and so their arrays
            fn.released = True
        for i, e in enumerate(fn.edges):
            if e is None:
                continue
            gx = gxs[i] if gxs is not None else None
            if type(e) is tuple:
                node, k = e
                if gx is not None:
                    slot = grads.get(node)
                    if slot is None:
                        slot = grads[node] = [None] * node.n_out
                    slot[k] = _accumulate(slot[k], gx)
                pending[node] -= 1
                if pending[node] == 0:
                    ready.append(node)
            elif gx is not None:
                store(e, gx)
