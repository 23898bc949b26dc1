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

Also here: the errors a node's backward can meet (``RELEASED_MSG``, ``check_versions``, and
``explain_grads``, the gradient contract's explanation of a breach).

Imports: contextlib, numpy, threading, ..devices, ..kernels.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from .. import devices as _devices
from .. import kernels as _kernels
from ..devices import BFLOAT16, get_array_module, shares_memory


class _GradMode(threading.local):
    enabled = True  # the class attribute is each new thread's default: recording on
    retain_graph = False  # whether the backward running now keeps the graph (a node that
    # holds a whole graph, compile's Replay, releases its parts as it goes unless so)
    autocast = None  # the CPU autocast block running in this thread (tensorgrad.amp.autocast)


class retaining(contextlib.ContextDecorator):
    """``with retaining(flag):`` the backward inside keeps (True) or releases the graph."""

    def __init__(self, flag: bool):
        self.flag = bool(flag)

    def __enter__(self):
        self.prev, _state.retain_graph = _state.retain_graph, self.flag

    def __exit__(self, *exc):
        _state.retain_graph = self.prev
        return False


_state = _GradMode()


def is_grad_enabled() -> bool:
    return _state.enabled


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
        if isinstance(x, _tensor_type):  # (is_tensor(x), inlined: every backward asks)
            return _tensor_xp
    return get_array_module(*xs)


def unbroadcast(g, shape: tuple):
    """Sum a broadcast gradient back down to ``shape`` (NumPy broadcasting rules)."""
    if g.shape == shape:  # the usual case, asked before any conversion
        return g
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

# What the layers over the tape add to an op as it runs, each list filled by those layers
# (the tape names none of them). ``apply_hooks``: called after every op's forward, as
# hook(reference Op class, the instance that ran (a kernel's, or the reference's; None for a
# Function), inputs, kwargs, output Tensors); empty unless something watches the ops, so the
# hot path pays one truthiness test. ``kernel_hooks``: called for each node a kernel made, as
# hook(node, inputs, their arrays, kwargs), off the hot path (reference ops never reach it).
apply_hooks: list = []
kernel_hooks: list = []


class _Watch(threading.local):
    """Per thread: how deep in ``unobserved()`` blocks it is (``autograd/observe.py`` reads
    it), and the compile traces running in it, innermost last, which Python state changes (a
    module attribute set, a hook registered, a reseed) are reported to."""

    hidden = 0
    traces: tuple = ()


watch = _Watch()
# Bumped by every change a compiled forward's signature reads from modules and parameters (a
# module attribute set or deleted, a buffer registered, a hook added or removed, train/eval, a
# parameter's requires_grad, a tensor's memory swapped for another shape or dtype, or any
# memory of a tensor that requires grad): while it stands still, the last signature holds.
model_epoch = [0]


def note_value_read(x, what: str) -> None:
    """Library code that computes from a tensor's values outside any op (a loss's mask of
    kept targets): a compile trace of this thread that holds ``x`` as a value runs eagerly."""
    for trace in watch.traces:
        if trace.traced(x):
            trace.fail(f"it computes {what} from a traced tensor's values, which no op records")


def note_effect(what: str, tensor=None) -> None:
    """Tell the compile traces running in this thread of an effect their replay would skip
    (``what``: "it sets Block.last_h"; ``tensor``: the one it changes, when a change to a
    tensor outside the trace is none of its business); each then runs its forward eagerly."""
    for trace in watch.traces:
        trace.effect(what, tensor)


def note_view(tensor) -> None:
    """Tell the compile traces running in this thread that ``tensor``, an op's output, now
    shares its base's version counter (it is a view): its version so far is the base's, which
    earlier writes to the base moved, not a write to it."""
    for trace in watch.traces:
        trace.rebase(tensor)


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
    takes_none = False  # backward takes None for an output that got no gradient (no zeros made)
    holds_graph = False  # releases the parts its backward ran itself (compile's Replay)
    op: str | None = None  # the registry's name for this op (reference Ops only)
    in_float32 = True  # bfloat16 inputs are computed in float32 (False: ops that move values)

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
        # the hot path of every op: small arrays spend more time here than in the arithmetic,
        # so it reads slots (x._array, x._requires_grad) rather than the Tensor properties, in
        # one loop over the inputs
        if _state.autocast is not None:  # in a CPU autocast block: PyTorch's op lists
            inputs = _state.autocast.cast_inputs(cls, inputs)
        Tensor = _tensor_type
        arrays, needs, bf16 = [], [], False
        for x in inputs:
            if isinstance(x, Tensor):
                arrays.append(x._array)
                needs.append(x._requires_grad)
                bf16 = bf16 or x._array.dtype is BFLOAT16
            else:
                arrays.append(x)
                needs.append(False)
        if bf16 and cls.in_float32:
            return in_float32(cls, inputs, kwargs)
        if _devices._multi:  # a GPU (or stand-in) module is loaded: no mixing devices
            _devices.check_same_device(cls.__name__.lower(), arrays)
        impl = cls
        if cls.op is not None and arrays and hasattr(arrays[0], "dtype"):
            impl = _kernels.pick(cls.op, _devices.device_of(arrays[0]), *arrays, **kwargs) or cls
        fn = impl()
        fn.reference = cls
        record = True in needs and _state.enabled  # (is_grad_enabled(), inlined)
        fn.needs_input_grad = tuple(needs) if record else (False,) * len(inputs)
        out = fn.forward(*arrays, **kwargs)
        if impl.multi_output:
            outs = out
            if any(isinstance(o, np.generic) for o in outs):  # full reductions give scalars
                outs = _scalars_as_arrays(fn, outs)
        elif isinstance(out, np.generic):
            outs = _scalars_as_arrays(fn, (out,))
        else:
            outs = (out,)
        node = fn if record else None
        if impl.multi_output:
            results = [Tensor._make(o, node, i if record else 0) for i, o in enumerate(outs)]
        else:
            results = [Tensor._make(outs[0], node, 0)]
        if record:
            fn.attach(inputs, results, arrays)
            if impl is not cls:  # a kernel's node (create_graph keeps how to rerun its reference)
                for hook in kernel_hooks:
                    hook(fn, inputs, arrays, kwargs)
        if apply_hooks:  # something watches the ops (record_ops, tensorgrad.compile's trace)
            for hook in apply_hooks:
                hook(cls, fn, inputs, kwargs, results)
        return tuple(results) if impl.multi_output else results[0]

    def attach(self, inputs, results, arrays=None) -> None:
        """Make this op the graph node of ``results``, with an edge per input (``arrays``:
        the inputs' arrays, when the caller has them already)."""
        Tensor = _tensor_type
        edges, in_meta = [], []
        for x in inputs:
            if isinstance(x, Tensor) and x._requires_grad:
                node = x._node
                edges.append(x if node is None else (node, x._out_index))
                a = x._array
                in_meta.append((a.shape, a.dtype))
            else:
                edges.append(None)
                in_meta.append(None)
        self.edges, self.in_meta = edges, in_meta
        self.n_out = len(results)
        self.out_meta = out_meta = []
        for r in results:
            out_meta.append((r._array.shape, r._array.dtype))
        self.retained = self.hooks = None
        self.released = False
        self.checks = ()
        if "saved" in self.__dict__:
            if arrays is None:
                arrays = [x._array if isinstance(x, Tensor) else x for x in inputs]
            self.checks, self.links = _guard_saved(self, inputs, results, arrays)


def in_float32(cls, inputs, kwargs):
    """``cls`` on bfloat16 tensors as PyTorch's CPU kernels compute it: in float32, each
    floating result rounded once to bfloat16 when the first floating input is bfloat16
    (layer_norm of bfloat16 with float32 weights is bfloat16; binary ops have promoted their
    operands before). The casts are recorded ops, so gradients are computed in float32 too
    and rounded to each input's dtype."""
    if watch.traces:  # (a compile trace would record the float32 ops, not this rule)
        note_effect("it computes on bfloat16 tensors, which compile does not trace")
    Tensor, first = _tensor_type, None
    up = list(inputs)
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and (x._array.dtype is BFLOAT16 or x._array.dtype.kind == "f"):
            first = x._array.dtype if first is None else first
            up[i] = x.float() if x._array.dtype is BFLOAT16 else x
    block, _state.autocast = _state.autocast, None  # (the op's autocast cast is done)
    try:
        out = cls.apply(*up, **kwargs)
    finally:
        _state.autocast = block
    if first is not BFLOAT16:
        return out
    outs = out if isinstance(out, tuple) else (out,)
    down = [o.to(BFLOAT16) if o._array.dtype.kind == "f" else o for o in outs]
    return tuple(down) if isinstance(out, tuple) else down[0]


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


def _guard_saved(fn: Op, inputs, results, arrays) -> tuple:
    """(checks, links) for fn's saved arrays, in one pass over them (it runs for every op).

    checks: a version check (its counter, the version, its shape) for every tensor whose
    memory a saved array shares; a saved array that shares the memory of a plain-array
    input is copied instead (nothing else would see it change). links: ``saved_links`` of
    the saved arrays (after those copies)."""
    fast = _guard_saved_inputs(fn, inputs, results, arrays)
    if fast is not None:
        return fast
    Tensor = _tensor_type
    # every input, then every output: (its tensor or None, its array, its link, whether it
    # is a NumPy array that allocated its own memory, not a view of another's)
    ndarray = np.ndarray
    candidates = []
    for k, x in enumerate(inputs):
        a = arrays[k]
        owns = type(a) is ndarray and a.base is None
        candidates.append((x if isinstance(x, Tensor) else None, a, (0, k), owns))
    for j, r in enumerate(results):
        a = r._array
        candidates.append((r, a, (1, j), type(a) is ndarray and a.base is None))
    # an array that owns its memory shares it only with itself and with views: candidates
    # that own theirs are found by id, so an op saving many inputs (a compiled graph's
    # Replay saves every parameter) does not compare every pair
    owners: dict = {}
    views = []
    for c, (_, a, _, owns) in enumerate(candidates):
        if owns:
            owners.setdefault(id(a), []).append(c)
        else:
            views.append(c)
    checks, checked, links, saved, copied = [], set(), [], list(fn.saved), False
    for i, s in enumerate(saved):
        link = None
        if not hasattr(s, "dtype"):  # None, Python scalars: no link, nothing to guard
            links.append(link)
            continue
        # 0-d arrays cannot be changed behind our back: they only need their link
        guard = getattr(s, "ndim", 0)
        s_owns = type(s) is ndarray and s.base is None
        if s_owns:
            near = owners.get(id(s), [])
            near = sorted(near + views) if views else near
        else:
            near = range(len(candidates))
        for c in near:
            t, a, where, owns = candidates[c]
            if link is None and a is s:
                link = where  # the first input (else output) that is this very array
            if not guard or (t is None and not (hasattr(a, "dtype") and getattr(a, "ndim", 0))):
                continue  # nothing to guard, or an input that holds no memory (a number, a key)
            # two arrays that each own their memory share it only when they are one array:
            # decided here without a call, as this runs for every op
            shared = a is s or (not (s_owns and owns) and shares_memory(s, a))
            if t is None:
                if shared:
                    saved[i], copied, link = s.copy(), True, None  # a copy is no input
                    break
            elif shared and id(t) not in checked:
                # the tensor's version counter, not the tensor: a saved output would
                # otherwise hold its node, a cycle that only the cyclic GC frees (a
                # softmax output of 12.6 MB, dropped unused, stayed until gc ran)
                checks.append((t._version, t._version[0], a.shape))
                checked.add(id(t))
        links.append(link)
    if copied:
        fn.saved = tuple(saved)
    return checks, tuple(links)


def _guard_saved_inputs(fn: Op, inputs, results, arrays):
    """_guard_saved in one quick pass where fn saved exactly its inputs' arrays (Replay saves
    every parameter), each a distinct NumPy array owning its memory and none an output: each
    then shares memory with its own input only. None where that does not hold."""
    saved, ids = fn.saved, {id(a) for a in arrays}
    if len(saved) != len(arrays) or len(ids) != len(arrays):
        return None
    for s, a in zip(saved, arrays):
        if s is not a or type(a) is not np.ndarray or a.base is not None:
            return None
    if any(id(r._array) in ids for r in results):
        return None
    checks, links, copies = [], [], {}
    for k, (x, a) in enumerate(zip(inputs, arrays)):
        tensor = isinstance(x, _tensor_type)
        if a.ndim and tensor:
            checks.append((x._version, x._version[0], a.shape))
        elif a.ndim:  # a plain array's memory: copied
            copies[k] = a.copy()
        links.append(None if k in copies else (0, k))
    if copies:
        fn.saved = tuple(copies.get(k, s) for k, s in enumerate(saved))
    return checks, tuple(links)


def version_counter(t) -> list:
    """The counter an in-place write to t's memory bumps (a one-element list, shared with t's
    views): held, it tells later whether t was written, without keeping t alive."""
    return t._version


def check_versions(fn: Op, checks=None) -> None:
    for version, v, shape in fn.checks if checks is None else checks:
        if version[0] != v:
            raise RuntimeError(
                f"a tensor of shape {tuple(shape)} needed by the backward of {fn.name} was "
                f"modified in place after it was saved (version {v} -> {version[0]}); "
                "use an out-of-place op (x = x + y) instead of x += y or x[...] = ..."
            )


def explain_grads(fn: Op, gxs) -> None:
    """The gradient contract's slow pass (``walk.check_grads`` runs it when its fast pass
    meets a None or a mismatch): raise the error that explains the breach, or return when
    the None is allowed."""
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
