"""The tape's nodes: grad mode, ``Op`` (one recorded array operation) and its saved arrays.

An ``Op`` subclass (the library's reference ops in ``ops/`` and the kernels) computes
``forward`` on raw backend arrays and ``backward`` returning one gradient (or None) per
input. Calling ``SomeOp.apply(*inputs)`` runs forward and, when any input requires grad
and recording is on, keeps the instance as the graph node of its outputs. The instance
is its own context: forward stores what backward needs as attributes, and the walk
deletes them once backward has used them. (Users write ``tensorgrad.autograd.Function``,
which works on Tensors; ``Op`` is the array-level machinery under it.)

Backward code computes through ``xp = xp_of(g)``: NumPy or CuPy for arrays (first-order
backward, the fast path), or the differentiable functions of ``ops/tensor_xp.py`` when
the walk records a graph of the backward (``create_graph=True``). So each derivative is
written once and is itself differentiable. For that, an op saves only its inputs, its
outputs and constants (masks, indices): the walk reconnects saved inputs and outputs to
the graph before it runs a backward on Tensors.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from .. import backend as _backend
from .. import kernels as _kernels
from ..backend import get_array_module, shares_memory

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


# ----------------------------------------------------------------------------- registered types

_tensor_type = None  # tensorgrad.tensor.Tensor, registered by that module (no import cycle)
_tensor_xp = None  # the differentiable namespace of ops/tensor_xp.py, registered the same way


def register_tensor_type(cls) -> None:
    global _tensor_type
    _tensor_type = cls


def register_tensor_xp(namespace) -> None:
    global _tensor_xp
    _tensor_xp = namespace


def is_tensor(x) -> bool:
    return _tensor_type is not None and isinstance(x, _tensor_type)


def constant(a):
    """Array a as a Tensor outside the graph (no gradient flows into it)."""
    return a if is_tensor(a) else _tensor_type._make(a, None, 0)


def node_output(a, node, index: int):
    """A Tensor holding array a as output ``index`` of ``node`` (None: a leaf-less constant)."""
    return _tensor_type._make(a, node, index)


def xp_of(*xs):
    """The namespace backward code computes with: the Tensor one when any x is a Tensor
    (a graph of the backward is being recorded), else NumPy or CuPy."""
    for x in xs:
        if is_tensor(x):
            return _tensor_xp
    return get_array_module(*xs)


def unbroadcast(g, shape: tuple):
    """Sum a broadcast gradient back down to ``shape`` (NumPy broadcasting rules)."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    xp = xp_of(g)
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1
    )
    return xp.reshape(xp.sum(g, axis=axes), shape)


RELEASED_MSG = (
    "Trying to backward through the graph a second time (or to use saved values after they "
    "were freed). The saved arrays are released after the first backward; pass "
    "retain_graph=True to the first backward() if you need to backward twice."
)


# ----------------------------------------------------------------------------- the node


class Op:
    """One recorded array operation. Subclasses define ``forward`` and ``backward``.

    ``op`` names the op for the kernel registry: a reference Op with an ``op`` runs the
    first registered kernel of that op that applies (``tensorgrad.kernels``).
    """

    # graph fields live in slots so that releasing the context (``__dict__``) keeps them
    __slots__ = (
        "edges",
        "checks",
        "n_out",
        "out_meta",
        "in_meta",
        "retained",
        "hooks",
        "released",
        "needs_input_grad",
        "reference",
        "__dict__",
    )
    multi_output = False  # forward returns a tuple of arrays
    non_differentiable: tuple = ()  # input positions whose gradient is never defined
    none_is_no_gradient = False  # backward may return None for any input (a user's Function)
    op: str | None = None  # the registry's name for this op (reference Ops only)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, *grads):  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, *arrays):
        """Keep arrays for backward: the one way to keep them. Each is guarded: an in-place
        change to a tensor it belongs to raises at backward, and an array that belongs to
        no tensor (an index or mask passed as a plain array) is copied. Save inputs,
        outputs and constants only (recompute the rest in backward), so that the backward
        is differentiable."""
        self.saved = arrays

    @property
    def name(self) -> str:
        """The op's name (the reference Op's), with the kernel that ran it if any."""
        ref = getattr(self, "reference", None)
        if ref is None or ref is type(self):
            return type(self).__name__
        return f"{ref.__name__} (kernel {type(self).__name__})"

    @classmethod
    def apply(cls, *inputs, **kwargs):
        Tensor = _tensor_type
        arrays = [x.array if isinstance(x, Tensor) else x for x in inputs]
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
        if any(isinstance(o, np.generic) for o in outs):  # full reductions give NumPy scalars
            outs = _scalars_as_arrays(fn, outs)
        if not record:
            results = [Tensor._make(o, None, 0) for o in outs]
            return tuple(results) if impl.multi_output else results[0]
        results = [Tensor._make(o, fn, i) for i, o in enumerate(outs)]
        fn.attach(inputs, results)
        if impl is not cls:  # a kernel: keep what replaying its reference needs
            fn.replay = (arrays, kwargs, [(x, x._version[0]) for x in inputs if is_tensor(x)])
        return tuple(results) if impl.multi_output else results[0]

    def attach(self, inputs, results) -> None:
        """Make this op the graph node of ``results``, with an edge per input."""
        edges, in_meta = [], []
        for x in inputs:
            if is_tensor(x) and x.requires_grad:
                edges.append((x._node, x._out_index) if x._node is not None else x)
                in_meta.append((x.array.shape, x.array.dtype))
            else:
                edges.append(None)
                in_meta.append(None)
        self.edges, self.in_meta = edges, in_meta
        self.n_out = len(results)
        self.out_meta = [(r.array.shape, r.array.dtype) for r in results]
        self.retained = self.hooks = None
        self.released = False
        self.checks = ()
        if "saved" in self.__dict__:
            self.checks = _guard_saved(self, inputs, results)
            self.links = saved_links(self.saved, inputs, [r.array for r in results])


def _scalars_as_arrays(fn: Op, outs) -> tuple:
    """0-d arrays for NumPy-scalar outputs, in the saved arrays too (they stay the outputs)."""
    new = tuple(np.asarray(o) if isinstance(o, np.generic) else o for o in outs)
    saved = fn.__dict__.get("saved")
    if saved is not None:
        swap = {id(o): n for o, n in zip(outs, new) if o is not n}
        fn.saved = tuple(swap.get(id(s), s) for s in saved)
    return new


def saved_links(saved, inputs, outs) -> tuple:
    """Where each saved array came from: ``(0, k)`` input k, ``(1, j)`` output j, or None
    (a constant), so that a differentiable backward can reconnect it to the graph."""
    arrays = [x.array if is_tensor(x) else x for x in inputs]
    links = []
    for s in saved:
        link = None
        if hasattr(s, "dtype"):
            link = next(((0, k) for k, a in enumerate(arrays) if a is s), None)
            if link is None:
                link = next(((1, j) for j, o in enumerate(outs) if o is s), None)
        links.append(link)
    return tuple(links)


def _guard_saved(fn: Op, inputs, results) -> list:
    """Version checks for every tensor whose memory a saved array shares; copies of saved
    arrays that share the memory of a plain-array input (nothing else would see it change)."""
    checks, saved, copied = [], list(fn.saved), False
    for i, s in enumerate(saved):
        if not hasattr(s, "dtype") or not getattr(s, "ndim", 0):
            continue  # None, Python scalars and 0-d arrays cannot be changed behind our back
        for t in (*inputs, *results):
            if is_tensor(t):
                if shares_memory(s, t.array) and all(c[0] is not t for c in checks):
                    checks.append((t, t._version[0]))
            elif hasattr(t, "dtype") and getattr(t, "ndim", 0) and shares_memory(s, t):
                saved[i], copied = s.copy(), True
                break
    if copied:
        fn.saved = tuple(saved)
    return checks


def check_versions(fn: Op, checks=None) -> None:
    for t, v in fn.checks if checks is None else checks:
        if t._version[0] != v:
            raise RuntimeError(
                f"a tensor of shape {tuple(t.shape)} needed by the backward of {fn.name} was "
                f"modified in place after it was saved (version {v} -> {t._version[0]}); "
                "use an out-of-place op (x = x + y) instead of x += y or x[...] = ..."
            )
