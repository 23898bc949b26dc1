"""Guards: what a compiled call's result depends on, checked before every replay.

Two parts, as torch.compile's guards have them:

- **The signature** (``signature``), made afresh at every call and used as a dict key: the
  shapes, dtypes, devices, contiguity and ``requires_grad`` of the call's tensors and arrays,
  which of them share memory (``f(x, x)`` is another call than ``f(a, b)``), its plain
  arguments, grad mode, and for a module every submodule (the object itself: a swapped one,
  even of the same type, is another signature), its ``training`` flag and hooks, and each
  parameter's and buffer's identity, shape, dtype and ``requires_grad``.
- **The Python state the forward read** (``StateGuards``), listed once per trace. The trace
  knows which Python functions ran (``sys.setprofile`` during the traced call), and each
  function's code object names the globals and attributes it can read (``co_names``) and its
  closure cells (``co_freevars``). Guarded: those globals; those closure cells; the
  attributes of that name on every module of the tree (``self.scale``, ``nn.LayerNorm.eps``,
  ``nn.Dropout.p``, ``nn.GELU.approximate``), on the module classes (a class attribute, a
  patched method) and an instance's ``forward`` (an instance-patched one). A value is guarded
  by identity, and when that fails by equality (a plain value reassigned to an equal one), and
  for a list, dict, set or a plain object (a config dataclass) by a copy of its plain fields.

Code of tensorgrad's internals (ops, kernels, the tape), of NumPy and numba and of the standard
library is not listed: what it reads is recorded as ops and kernels, or never changes.

Imports: argparse, collections, contextvars, dis, functools, gc, random, sys, types, numpy, ..autograd, ..devices, ..tensor, ..types.
"""

from __future__ import annotations

import argparse
import collections
import collections.abc
import contextvars
import dis
import functools
import gc
import random
import sys
import types

import numpy as np

from ..autograd.graph import model_epoch
from ..devices import device_of
from ..tensor import Tensor
from ..types import is_dtype

TENSOR = "(tensor)"  # the key of a constant tensor's guard: its memory and requires_grad
MISSING = object()  # a name that was absent when traced (a later global would shadow a builtin)
SMALL = 4096  # a container of at most this many items is guarded by a copy of them
# internals of a Module's __dict__ that the signature covers (or that hold no model state)
_MODULE_KEYS = {"_parameters", "_modules", "_buffers", "_non_persistent", "training"}
_MODULE_KEYS |= {"_forward_pre_hooks", "_forward_hooks", "_made_in_trace"}
# packages whose code reads nothing a user changes between calls (or records it as ops)
_INTERNAL = ("tensorgrad.autograd", "tensorgrad.ops", "tensorgrad.kernels", "tensorgrad.compiler")
_INTERNAL += ("tensorgrad.tensor", "tensorgrad.devices", "tensorgrad.indexing", "tensorgrad.types")
_INTERNAL += ("tensorgrad.printing", "tensorgrad.factory", "tensorgrad.nn.module", "numpy")
_INTERNAL += ("numba", "llvmlite", "scipy")
# tools that run Python beside a forward, not in it (gc callbacks, progress bars, debuggers)
_INTERNAL += ("hypothesis", "_pytest", "pytest", "pluggy", "coverage", "tqdm", "IPython")
_INTERNAL += ("ipykernel", "debugpy", "_pydevd", "pydevd")
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


class Uncompilable(Exception):
    """This call cannot be compiled (its reason is the message)."""


# ----------------------------------------------------------------------------- the signature
class ModuleState:
    """A compiled module's part of the signature, kept while ``model_epoch`` stands still (no
    module attribute, hook, training flag or parameter meta changed since it was read)."""

    def __init__(self):
        self.epoch = None  # model_epoch when read
        self.token = 0  # stands for the state read: equal states, one token
        self.live: list = []  # its parameters and buffers
        self.where: dict = {}  # id(array) -> index in live (aliasing)
        self.error: str | None = None  # why it cannot be compiled (forward hooks)
        self.tokens: dict = {}  # state read -> token (so train(); train() keeps the token)
        self.count = 0


def signature(args, kwargs, module, grad_enabled: bool, state: ModuleState | None = None):
    """(key, live): the call's guard as a hashable tuple, and the tensors and arrays it reads
    afresh at every call (inputs first, then the module's parameters and buffers)."""
    parts, live, where = [grad_enabled], [], {}
    for a in args:
        _argument(a, parts, live, where)
    for k in kwargs:  # (in the call's order: a forward may read them so, **feats)
        parts.append(k)
        _argument(kwargs[k], parts, live, where)
    if module is not None:
        state = state or ModuleState()
        if state.epoch != model_epoch[0]:
            _read_module(module, state)
        if state.error is not None:
            raise Uncompilable(state.error)
        n = len(live)
        for i, k in where.items():  # an input that is a parameter's memory
            j = state.where.get(i)
            if j is not None:
                parts.append(("alias", k, n + j))
        parts.append(state.token)
        live.extend(state.live)
    return tuple(parts), live


def _read_module(module, state: ModuleState) -> None:
    epoch = model_epoch[0]
    parts, live, where = [], [], {}
    try:
        _module_signature(module, parts, live, where)
        state.error = None
    except Uncompilable as e:
        state.error = str(e)
    key = tuple(parts)
    token = state.tokens.get(key)
    if token is None:
        if len(state.tokens) >= 64:  # states that never come back: forget them (tokens
            state.tokens.clear()  # are never reused, so no old key can match a new state)
        state.count += 1
        token = state.tokens[key] = state.count
    state.epoch, state.token, state.live, state.where = epoch, token, live, where


def _shared(a, parts: list, live: list, where: dict) -> None:
    """Note which earlier live value ``a`` shares its array with (aliasing is a guard)."""
    k = where.setdefault(id(a), len(live) - 1)
    if k != len(live) - 1:
        parts.append(("alias", k))


def _argument(x, parts: list, live: list, where: dict) -> None:
    if isinstance(x, Tensor):
        live.append(x)
        a = x.array
        meta = (a.shape, a.dtype, device_of(a), x.requires_grad, _contiguous(a), x.is_leaf)
        parts.append(("T", *meta))
        _shared(a, parts, live, where)
    elif isinstance(x, (np.dtype, type)) or is_dtype(x):  # dtype=tg.float64, np.float64
        parts.append(("dtype", str(x)))
    elif hasattr(x, "dtype") and hasattr(x, "shape") and not isinstance(x, np.generic):
        live.append(x)
        parts.append(("A", x.shape, x.dtype, device_of(x), _contiguous(x)))
        _shared(x, parts, live, where)
    elif isinstance(x, (tuple, list)):
        parts.append((type(x), len(x)))
        for y in x:
            _argument(y, parts, live, where)
    elif is_plain(x):
        parts.append((type(x), x))
    else:
        raise Uncompilable(f"an argument is a {type(x).__name__}, not a tensor or plain value")


def _contiguous(a) -> bool:
    flags = getattr(a, "flags", None)
    return bool(flags is not None and flags.c_contiguous)


def _module_signature(root, parts: list, live: list, where: dict) -> None:
    """Each submodule (the object), its training flag and each parameter's and buffer's (id,
    shape, dtype, requires_grad, aliasing): one walk of the tree, every module and tensor once
    (a shared one at its first place), in a fixed order. Raises Uncompilable where a submodule
    has forward hooks."""
    seen, stack = set(), [root]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        d = m.__dict__  # (read directly, not through properties)
        if m is not root and (d.get("_forward_pre_hooks") or d.get("_forward_hooks")):
            raise Uncompilable(
                f"{type(m).__name__} has forward hooks (they run only in eager mode)"
            )
        parts.append(m)  # the module itself: kept alive by the key, compared by identity
        parts.append(type(m))  # (m.__class__ = Other)
        parts.append(d["training"])
        for t in (*d["_parameters"].values(), *d["_buffers"].values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                live.append(t)
                a = t.array
                parts.append((id(t), a.shape, a.dtype, t.requires_grad))
                _shared(a, parts, live, where)
        stack.extend(reversed(d["_modules"].values()))


def modules_of(root) -> list:
    """Every module of the tree, each once."""
    out, seen, stack = [], set(), [root]
    while stack:
        m = stack.pop()
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
            stack.extend(m.__dict__["_modules"].values())
    return out


def is_plain(x) -> bool:
    return x is None or isinstance(x, (bool, int, float, complex, str, bytes, np.generic))


# ----------------------------------------------------------------------------- Python state
def guarded_code(frame) -> bool:
    """Whether the Python state this frame's code reads is guarded: user code and the layers
    (tensorgrad.nn, its functional), not tensorgrad's internals, NumPy or the stdlib."""
    name = frame.f_globals.get("__name__") or ""
    code = frame.f_code
    if code.co_name == "<module>" or code.co_filename.startswith("<"):
        return False  # a module imported on first use, generated code (a namedtuple's __new__)
    return not (name.startswith(_INTERNAL) or name.partition(".")[0] in _STDLIB)


_GENERATORS = (random.Random, np.random.Generator, np.random.RandomState)
_DICTS = (dict, types.MappingProxyType)  # containers read with .get


class StateGuards:
    """The Python values a trace read, each with the value it had: ``holds()`` before a
    replay, ``changed()`` names the first one that does not. ``reason``: why the forward
    cannot be replayed whatever the state (it reads a foreign random generator)."""

    def __init__(self):
        self.reason: str | None = None
        self.strings: set = set()  # names spelled as strings (getattr(self, "t", 1.0))
        self.items: list = []  # [label, container, key, expected, copy-or-MISSING]
        self.settled: list = []  # module attributes that were absent: checked when
        # model_epoch moved
        self.epoch = model_epoch[0]
        self._seen: set = set()

    def add(self, label: str, container, key, module: bool = False, owner=None) -> None:
        """Guard ``container[key]`` (a dict: globals, a module's __dict__, a class's; or a
        cell, key None) at the value it has now (``module``: a module's __dict__; ``owner``:
        what the container belongs to, when it is made afresh at each reading: a class)."""
        ident = (id(container if owner is None else owner), key)
        if ident in self._seen:
            return
        self._fast = None  # (made again from items at the next check)
        self._seen.add(ident)
        value = _read(container, key)
        item = [label, container, key, value, _copy(value)]
        # a module attribute that is absent (no instance forward, no shadowing attribute)
        # can appear only through setattr, which bumps model_epoch: checked when it moved;
        # a present one is checked every call (vars(m).update(...) bypasses setattr)
        gated = module and value is MISSING
        (self.settled if gated else self.items).append(item)

    def holds(self) -> bool:
        return self.changed() is None

    def changed(self) -> str | None:
        epoch = model_epoch[0]
        fast = self.__dict__.get("_fast")
        if fast is None:  # (dict entries held by identity: one tight loop, no calls)
            quick = [type(c) in _DICTS and it[4] is MISSING for it in self.items for c in it[1:2]]
            fast = self._fast = [(c, k, v) for (_, c, k, v, _), q in zip(self.items, quick) if q]
            self._rest = [it for it, q in zip(self.items, quick) if not q]
        for container, key, expected in fast:
            if container.get(key, MISSING) is not expected:
                what = self._check(self.items)  # which, and an equal value reassigned
                self._fast = None  # (expected values may have been updated)
                break
        else:
            what = self._check(self._rest)
        if what is None and epoch != self.epoch:
            what = self._check(self.settled)
            if what is None:
                self.epoch = epoch
        return what

    @staticmethod
    def _check(items) -> str | None:
        for item in items:
            label, container, key, expected, copy = item
            value = _read(container, key)
            if value is expected:
                if copy is MISSING or _copy(value) == copy:
                    continue
                return f"{label} changed in place"
            if type(value) is type(expected) and is_plain(value) and value == expected:
                item[3] = value  # an equal value reassigned: the same state
                continue
            return f"{label} changed ({_show(expected)} -> {_show(value)})"
        return None


def _read(container, key):
    if type(key) is tuple:  # ("attr", name): a function's __defaults__; ("ctx",): a ContextVar
        if key[0] == "ctx":
            return container.get(MISSING)
        return getattr(container, key[1], MISSING)
    if key is TENSOR:  # a constant tensor: its memory, while it needs no gradient
        return container.array if not container.requires_grad else MISSING
    if key is None:  # a closure cell
        try:
            return container.cell_contents
        except ValueError:
            return MISSING
    return container.get(key, MISSING)


def _copy(value, depth: int = 4):
    """A copy of a container's, a plain object's or a small NumPy array's contents (nested
    ones too, ``depth`` levels down), or MISSING where the value is guarded by identity alone
    (a plain value, a function, a class, a module, a large container)."""
    if is_plain(value) or value is MISSING:
        return MISSING
    if isinstance(value, np.ndarray):
        if value.size > 4096 or value.dtype.hasobject:
            return MISSING
        return ("array", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        if isinstance(value, tuple) and all(is_plain(v) for v in value):
            return MISSING  # immutable: identity or equality says it all
        return [_item(v, depth) for v in value] if len(value) <= SMALL else MISSING
    if isinstance(value, (dict, collections.abc.Mapping)):  # (os.environ too)
        return {k: _item(v, depth) for k, v in value.items()} if len(value) <= SMALL else MISSING
    if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)):
        return MISSING
    if isinstance(value, Tensor):
        return ("tensor", id(value.array), value.requires_grad)  # t.data = ..., requires_grad_
    if isinstance(value, functools.partial):  # its arguments (partial(F.leaky_relu, ...))
        return ("partial", id(value.func), _item(value.args, depth), _item(value.keywords, depth))
    if isinstance(value, types.MethodType):  # a bound method: the state of its object
        return ("method", id(value.__func__), _item(value.__self__, depth))
    if getattr(type(value), "guard_by_identity", False) or _library_object(value):
        return MISSING  # compile's own forward; a library's object (tg.float, a dispatcher)
    dataclass_fields = getattr(type(value), "__dataclass_fields__", None)
    if dataclass_fields is not None:  # (with __slots__ too)
        fields = {name: getattr(value, name, MISSING) for name in dataclass_fields}
    else:
        fields = getattr(value, "__dict__", None)
        slots = [n for k in type(value).__mro__ for n in _names(getattr(k, "__slots__", ()))]
        if not isinstance(fields, dict) and slots:  # a plain class with __slots__
            fields = {n: getattr(value, n, MISSING) for n in slots}
        if not isinstance(fields, dict) or "_parameters" in fields:  # (a module: its own guards)
            return MISSING
    return {k: _item(v, depth) for k, v in fields.items()} if len(fields) <= SMALL else MISSING


def _library_object(value) -> bool:
    """An object of tensorgrad's internals, NumPy, numba or the standard library (a dtype, a
    numba dispatcher): guarded by identity (its state is its library's, and may change as it
    caches); the standard library's namespaces (a config) are guarded by their fields."""
    if isinstance(value, (types.SimpleNamespace, argparse.Namespace)):
        return False
    name = getattr(type(value), "__module__", "") or ""
    return name.startswith(_INTERNAL) or name.partition(".")[0] in _STDLIB


def _names(slots) -> list:
    return [slots] if isinstance(slots, str) else list(slots)


def _item(v, depth: int):
    if is_plain(v):
        return v
    inner = _copy(v, depth - 1) if depth > 0 else MISSING
    return ("id", id(v)) if inner is MISSING else ("copy", id(v), inner)


def _show(v) -> str:
    if v is MISSING:
        return "absent"
    r = repr(v) if is_plain(v) else f"a {type(v).__name__}"
    return r if len(r) <= 40 else r[:37] + "..."


def state_guards(tracer, root, fn) -> StateGuards:
    """The guards of the Python state that a trace's code can read: the globals its code
    objects name (and, for a Python module or a class among them, the attributes of names the
    code spells: ``config.SCALE``, ``F.gelu``), their closure cells, and on every module of
    the tree (and every module whose method ran, for a compiled function) the attributes of
    those names; and the constant tensors it read (a later requires_grad_() or .data)."""
    g = StateGuards()
    names: set = set()
    codes, more = dict(tracer.codes), {}
    while codes:  # (more: the code of a cached helper the traces did not run: lru_cache)
        code, glob = codes.popitem()
        _code_guards(g, code, glob, names, more)
        for c, gl in more.items():
            if c not in tracer.codes:
                codes.setdefault(c, gl)
                tracer.codes[c] = gl
        more.clear()
    _closure_and_roots(g, tracer, root, fn, names)
    return g


def _code_guards(g: StateGuards, code, glob: dict, names: set, more: dict) -> None:
    """The globals (and their attributes) and closure cells one code object can read."""
    names.update(code.co_names)
    strings = [c for c in code.co_consts if _identifier(c)]  # (getattr(self, "scale"))
    names.update(strings)
    g.strings.update(strings)
    where = glob.get("__name__", "?")
    if "print" in code.co_names and "print" not in glob and _loads_global(code, "print"):
        g.reason = g.reason or f"{code.co_name} calls print (replay would not print)"
    for name in code.co_names:
        if name not in glob or name.startswith("__"):
            continue
        g.add(f"the global {where}.{name}", glob, name)
        value = glob[name]
        _value_extras(g, value, name, more)
        if isinstance(value, (types.ModuleType, type)) and "_parameters" not in vars(value):
            attrs = vars(value)
            for attr in code.co_names:
                if attr in attrs and not attr.startswith("__"):
                    g.add(f"{name}.{attr}", attrs, attr, owner=value)
            if value is np and "random" in code.co_names and _reads(code, "np", "random"):
                g.reason = g.reason or _foreign_random(np.random, f"{name}.random")
    if code.co_freevars:
        for f in _functions_of(code):
            for name, cell in zip(code.co_freevars, f.__closure__ or ()):
                g.add(f"the closure variable {name} of {f.__qualname__}", cell, None)
                _value_extras(g, _read(cell, None), name, more)


def _value_extras(g: StateGuards, value, name: str, more: dict) -> None:
    """What a value read by name brings with it: a function's mutable defaults, a cached
    helper's own code (lru_cache: the traces may not have run it), a ContextVar's value; or
    the reason it cannot be replayed at all (a foreign generator, an iterator)."""
    g.reason = g.reason or _foreign_random(value, name) or _iterator(value, name)
    wrapped = getattr(value, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType) and hasattr(value, "cache_clear"):
        more.setdefault(wrapped.__code__, wrapped.__globals__)
        value = wrapped
    if isinstance(value, types.FunctionType) and value.__defaults__:
        if any(_copy(v) is not MISSING for v in value.__defaults__):
            g.add(f"the defaults of {value.__qualname__}", value, ("attr", "__defaults__"))
    if isinstance(value, contextvars.ContextVar):
        g.add(f"the context variable {name}", value, ("ctx",))


def _iterator(value, name: str) -> str | None:
    """A reason to run eagerly when the forward reads an iterator (next(self.schedule)):
    replay would neither advance it nor read its next value."""
    if hasattr(type(value), "__next__") and not hasattr(value, "write"):  # (not a file)
        return f"it reads {name}, an iterator (replay would not advance it)"
    return None


def _closure_and_roots(g: StateGuards, tracer, root, fn, names: set) -> None:
    """The compiled function's closure, the constant tensors the trace read, and on every
    module of the tree (and every module whose method ran) the attributes the code names."""
    fn = getattr(fn, "__func__", fn)  # a bound method's function
    code = getattr(fn, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", ()) or ()):
        g.add(f"the closure variable {name} of {fn.__qualname__}", cell, None)
        _value_extras(g, _read(cell, None), name, {})
    if isinstance(fn, types.FunctionType) and fn.__defaults__:
        _value_extras(g, fn, fn.__qualname__, {})
    for t in tracer.constants:
        g.add(f"a constant tensor it read ({tuple(t.shape)})", t, TENSOR)
    tree = [] if root is None else modules_of(root)
    seen = {id(m) for m in tree}  # (the signature has their training flags)
    outside = [m for top in tracer.modules.values() for m in modules_of(top) if id(m) not in seen]
    classes: dict = {}
    extra: dict = {}  # modules outside the compiled tree, each once
    for m in outside:
        extra.setdefault(id(m), m)
    for m in [*tree, *extra.values()]:
        d, cls = m.__dict__, type(m)
        if id(m) in extra:  # a module outside the compiled tree: its training flag too
            g.add(f"{cls.__name__}.training", d, "training", module=True)
        for name in d:
            if name in names and name not in _MODULE_KEYS and not _registered(d, name):
                if m is root and name == "forward":
                    continue  # compile's own
                g.add(f"{cls.__name__}.{name}", d, name, module=True)
                g.reason = g.reason or _iterator(d[name], f"{cls.__name__}.{name}")
                held = d[name]  # a class or a Python module held by the module (self.kind)
                if isinstance(held, (type, types.ModuleType)) and "_parameters" not in vars(held):
                    for attr in names & vars(held).keys():
                        if not attr.startswith("__"):
                            g.add(f"{name}.{attr}", vars(held), attr, owner=held)
        if m is not root:  # (the root's forward is compile's own)
            g.add(f"{cls.__name__}.forward (instance)", d, "forward", module=True)
        classes.setdefault(cls, []).append(d)
    for cls, dicts in classes.items():  # class attributes and methods read through self
        for name in g.strings:  # getattr(self, "t", default): a class attribute set later
            if not any(name in k.__dict__ for k in cls.__mro__) and not name.startswith("__"):
                g.add(f"{cls.__name__}.{name} (absent)", cls.__dict__, name, owner=cls)
        for name in sorted(n for n in names | {"forward"} if not n.startswith("__")):
            for klass in cls.__mro__[:-1]:  # (not object); super() reaches the later ones
                if name in klass.__dict__:
                    value = klass.__dict__[name]
                    g.add(f"{klass.__name__}.{name}", klass.__dict__, name, owner=klass)
                    _value_extras(g, value, f"{klass.__name__}.{name}", {})
                    if not callable(value) and not isinstance(value, property):
                        for d in dicts:  # a later instance attribute would shadow it
                            g.add(f"{cls.__name__}.{name} (instance)", d, name, True)


def _reads(code, name: str, attr: str) -> bool:
    """Whether ``code`` reads the global ``name``'s attribute ``attr`` (``np.random``)."""
    last = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == attr and last == name:
            return True
        last = ins.argval if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") else None
    return False


def _loads_global(code, name: str) -> bool:
    return any(i.opname == "LOAD_GLOBAL" and i.argval == name for i in dis.get_instructions(code))


def _identifier(c) -> bool:
    return isinstance(c, str) and c.isidentifier()


def _foreign_random(value, name: str) -> str | None:
    """A reason to run eagerly when ``value`` is Python's or NumPy's random generator: draws
    from them are invisible to the trace, so a replay would repeat the traced ones."""
    if value is random or value is np.random or isinstance(value, _GENERATORS):
        return (
            f"it reads {name}, a random generator other than tensorgrad's (replay would repeat "
            "its traced draws; use tg.rand or F.dropout)"
        )
    return None


def _functions_of(code) -> list:
    """The live functions whose code is ``code`` (a closure's cells are found through them)."""
    return [
        f for f in gc.get_referrers(code) if type(f) is types.FunctionType and f.__code__ is code
    ]


def _registered(d: dict, name: str) -> bool:
    return name in d["_parameters"] or name in d["_buffers"] or name in d["_modules"]
