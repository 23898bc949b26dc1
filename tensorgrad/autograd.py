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
import sys
import threading

from . import backend as _backend
from . import kernels as _kernels
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


def _shares(xp, a, b) -> bool:
    """Whether array a may overlap array b in memory (a view of it, or it itself)."""
    if a is b:
        return True
    msm = getattr(xp, "may_share_memory", None)
    return bool(msm(a, b)) if msm is not None else getattr(a, "base", None) is b


class Function:
    """One recorded operation. Subclasses define ``forward`` and ``backward``.

    ``op`` names the op for the kernel registry: a reference Function with an ``op``
    runs the first registered kernel of that op that applies (``tensorgrad.kernels``).
    """

    # graph fields live in slots so that releasing the context (``__dict__``) keeps them
    __slots__ = (
        "edges",
        "checks",
        "n_out",
        "out_meta",
        "in_meta",
        "retained",
        "released",
        "needs_input_grad",
        "reference",
        "__dict__",
    )
    multi_output = False  # forward returns a tuple of arrays
    op: str | None = None  # the registry's name for this op (reference Functions only)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, *grads):  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, *arrays):
        """Keep arrays for backward: the one way to keep them. Each is guarded: an in-place
        change to a tensor it belongs to raises at backward, and an array that belongs to
        no tensor (an index or mask passed as a plain array) is copied."""
        self.saved = arrays

    @property
    def name(self) -> str:
        """The op's name (the reference Function's), with the kernel that ran it if any."""
        ref = getattr(self, "reference", None)
        if ref is None or ref is type(self):
            return type(self).__name__
        return f"{ref.__name__} (kernel {type(self).__name__})"

    @classmethod
    def apply(cls, *inputs, **kwargs):
        Tensor = _tensor_type
        arrays = [x.data if isinstance(x, Tensor) else x for x in inputs]
        if _backend._multi:  # a GPU (or stand-in) module is loaded: no mixing devices
            _backend.check_same_device(cls.__name__.lower(), arrays)
        impl = cls
        if cls.op is not None and arrays and hasattr(arrays[0], "dtype"):
            impl = _kernels.pick(cls.op, _backend.device_of(arrays[0]), *arrays, **kwargs) or cls
        fn = impl()
        fn.reference = cls
        needs = tuple(isinstance(x, Tensor) and x.requires_grad for x in inputs)
        record = is_grad_enabled() and any(needs)
        fn.needs_input_grad = needs if record else (False,) * len(inputs)
        out = fn.forward(*arrays, **kwargs)
        outs = out if impl.multi_output else (out,)
        if not record:
            results = [Tensor._make(o, None, 0) for o in outs]
            return tuple(results) if impl.multi_output else results[0]

        edges, in_meta = [], []
        for x in inputs:
            if isinstance(x, Tensor) and x.requires_grad:
                edges.append((x._node, x._out_index) if x._node is not None else x)
                in_meta.append((x.data.shape, x.data.dtype))
            else:
                edges.append(None)
                in_meta.append(None)
        fn.edges, fn.in_meta = edges, in_meta
        fn.n_out = len(outs)
        fn.out_meta = [(o.shape, o.dtype) for o in outs]
        fn.retained = None
        fn.released = False
        results = [Tensor._make(o, fn, i) for i, o in enumerate(outs)]
        fn.checks = _guard_saved(fn, inputs, results) if "saved" in fn.__dict__ else ()
        return tuple(results) if impl.multi_output else results[0]


def _guard_saved(fn: Function, inputs, results) -> list:
    """Version checks for every tensor whose memory a saved array shares; copies of saved
    arrays that share the memory of a plain-array input (nothing else would see it change)."""
    Tensor = _tensor_type
    checks, saved, copied = [], list(fn.saved), False
    for i, s in enumerate(saved):
        if not hasattr(s, "dtype") or not getattr(s, "ndim", 0):
            continue  # None, Python scalars and 0-d arrays cannot be changed behind our back
        xp = get_array_module(s)
        for t in (*inputs, *results):
            if isinstance(t, Tensor):
                if _shares(xp, s, t.data) and all(c[0] is not t for c in checks):
                    checks.append((t, t._version[0]))
            elif hasattr(t, "dtype") and getattr(t, "ndim", 0) and _shares(xp, s, t):
                saved[i], copied = s.copy(), True
                break
    if copied:
        fn.saved = tuple(saved)
    return checks


_tensor_type = None  # tensorgrad.tensor.Tensor, registered by that module (no import cycle)


def register_tensor_type(cls) -> None:
    global _tensor_type
    _tensor_type = cls


def _check_versions(fn: Function):
    for t, v in fn.checks:
        if t._version[0] != v:
            raise RuntimeError(
                f"a tensor of shape {tuple(t.shape)} needed by the backward of {fn.name} was "
                f"modified in place after it was saved (version {v} -> {t._version[0]}); "
                "use an out-of-place op (x = x + y) instead of x += y or x[...] = ..."
            )


def _check_grads(fn: Function, gxs) -> None:
    """The gradient contract: one gradient per input, each exactly its input's shape and a
    float dtype equal to the input's."""
    if len(gxs) != len(fn.in_meta):
        raise RuntimeError(
            f"{fn.name}.backward returned {len(gxs)} gradients for {len(fn.in_meta)} inputs"
        )
    for i, (gx, meta) in enumerate(zip(gxs, fn.in_meta)):
        if gx is None or meta is None:
            continue
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


def _accumulate(a, b):
    # never in place: a gradient array may be shared by several edges
    return b if a is None else a + b


def _accumulate_grad(t, g) -> None:
    """Add g (exactly t's shape and dtype, by the contract) into leaf t's ``.grad``."""
    if tuple(g.shape) != tuple(t.data.shape) or g.dtype != t.data.dtype:
        raise RuntimeError(
            f"gradient of shape {tuple(g.shape)} and dtype {g.dtype} does not match the leaf's "
            f"shape {tuple(t.data.shape)} and dtype {t.data.dtype}"
        )
    if t.grad is None:
        if not getattr(g.flags, "writeable", True):
            g = g.copy()  # a broadcast view (from sum/mean/expand): .grad must be writable
        t.grad = _tensor_type._make(g, None, 0)
        return
    old = t.grad.data
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
        t.grad = _tensor_type._make(old + g, None, 0)


def _refs(a) -> int:
    getrefcount = getattr(sys, "getrefcount", None)
    return getrefcount(a) if getrefcount is not None else 1 << 30  # no refcounts: never


class _Holder:
    __slots__ = ("data",)


def _calibrate() -> int:
    """The reference count _accumulate_grad sees for an array held by one tensor only:
    measured with the same code shape, because interpreters count a local variable or a
    call's argument differently (CPython 3.14 borrows some references)."""
    h = _Holder()
    h.data = object()
    old = h.data
    return _refs(old)


_SOLE_REFS = _calibrate()


_callbacks: list = []  # run once, at the end of the next backward (queue_callback)


def queue_callback(fn) -> None:
    """Call ``fn()`` once, when the next backward walk has stored every gradient (how
    DistributedDataParallel reduces the gradients after ``loss.backward()``)."""
    _callbacks.append(fn)


def backward(root, grad=None, retain_graph: bool = False) -> None:
    """Reverse-mode sweep from ``root`` (a Tensor), accumulating into leaf ``.grad``, then
    the callbacks queued with ``queue_callback``."""
    try:
        _walk(root, grad, retain_graph)
    except BaseException:
        _callbacks.clear()  # a failed walk: its gradients are incomplete, nothing to finish
        raise
    while _callbacks:
        _callbacks.pop(0)()


def _walk(root, grad, retain_graph: bool) -> None:
    Tensor = _tensor_type
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
        _accumulate_grad(root, grad.astype(root.dtype, copy=False))
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
        _accumulate_grad(t, g)

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
            _check_grads(fn, gxs)
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
