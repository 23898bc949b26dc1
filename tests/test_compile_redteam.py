"""Red-team cases for tensorgrad.compile: forwards a user could write whose compiled result
must equal the eager one (outputs and every gradient, over several calls, with state changed
after the second call), or run eagerly with a CompileWarning. A review's attacks: each was
either handled already or found a silent difference that is fixed now (its test says which).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import random
import re
import threading
import types
import warnings

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.compiler import CompileWarning, compiled_forward

CALLS = 6


# ----------------------------------------------------------------------------- harness
def _run(fn, params, x, *extra):
    """fn(x, *extra)'s tensor outputs and the gradients of sum(out * w) for params and x."""
    for t in [*params, x]:
        t.grad = None
    out = fn(x, *extra)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = None
    for o in outs:
        if isinstance(o, tg.Tensor) and o.requires_grad:
            w = np.linspace(-1, 1, o.numel(), dtype=np.float32).reshape(o.shape)
            term = (o * tg.tensor(w)).sum()
            loss = term if loss is None else loss + term
    if loss is not None:
        loss.backward()
    grads = [None if t.grad is None else t.grad.numpy().copy() for t in [*params, x]]
    return [o.detach().numpy().copy() for o in outs if isinstance(o, tg.Tensor)], grads


def _same(got, want, what):
    assert len(got[0]) == len(want[0]) and len(got[1]) == len(want[1]), what
    for a, b in zip(got[0], want[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=what)
    for k, (a, b) in enumerate(zip(got[1], want[1])):
        assert (a is None) == (b is None), f"{what}: gradient {k} is None on one side only"
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{what}, grad {k}")


def compare(
    eager, compiled, change=None, calls=CALLS, shape=(3, 4), seed=None, extra=(), runs_eagerly=None
):
    """eager and compiled agree over ``calls`` calls; ``change(k)`` runs before call k.
    ``shape`` may be a function of k; ``seed(k)`` reseeds before each side's call.
    ``runs_eagerly``: the reason (a regex) compile must give, in a CompileWarning, for running
    the compiled side eagerly; every CompileWarning the calls raise must match it, and without
    it they must raise none."""
    with expect_eager(runs_eagerly) as said:
        _compare(eager, compiled, change, calls, shape, seed, extra)
    return said


@contextlib.contextmanager
def expect_eager(reason=None, maybe=False):
    """The block raises CompileWarnings (at least one) that all match ``reason``, a regex;
    with ``reason=None``, none; with ``maybe=True``, none or only those (a race that some runs
    lose). Yields a list that then holds their lines. Other warnings pass on to the caller's
    filters."""
    said: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield said
    said += [str(w.message) for w in seen if issubclass(w.category, CompileWarning)]
    for w in seen:
        if not issubclass(w.category, CompileWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if reason is None:
        assert not said, f"compile ran eagerly where it should compile: {said}"
    else:
        assert said or maybe, f"no CompileWarning; expected one saying {reason!r}"
        other = [s for s in said if not re.search(reason, s)]
        assert not other, f"CompileWarnings other than {reason!r}: {other}"


def _compare(eager, compiled, change, calls, shape, seed, extra):
    p_e = list(eager.parameters()) if isinstance(eager, nn.Module) else []
    p_c = list(compiled.parameters()) if isinstance(compiled, nn.Module) else []
    rng = np.random.default_rng(0)
    for k in range(calls):
        if change is not None:
            change(k)
        a = rng.standard_normal(shape(k) if callable(shape) else shape).astype(np.float32)
        x_e, x_c = tg.tensor(a, requires_grad=True), tg.tensor(a, requires_grad=True)
        if seed is not None:
            seed(k)
        want = _run(eager, p_e, x_e, *extra)
        if seed is not None:
            seed(k)
        got = _run(compiled, p_c, x_c, *extra)
        _same(got, want, f"call {k}")


def twins(make):
    """An eager module and a compiled deep copy of it (equal weights)."""
    eager = make()
    return eager, tg.compile(copy.deepcopy(eager))


def both(*mods):
    """change(k) helper: apply f(m, k) to each module."""

    def wrap(f):
        return lambda k: [f(m, k) for m in mods]

    return wrap


# ----------------------------------------------------------------------------- module state
class GetattrScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.scale = nn.Linear(4, 4), 1.0

    def forward(self, x):
        return self.lin(x) * getattr(self, "scale")  # noqa: B009  (the name in a string)


def test_an_attribute_read_through_getattr_with_a_string():
    e, c = twins(GetattrScale)
    compare(e, c, both(e, c)(lambda m, k: setattr(m, "scale", 1.0 if k < 3 else 3.0)))


class DictScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.cfg = {"scale": 1.0, "act": {"slope": 0.1}}

    def forward(self, x):
        return self.lin(x) * self.cfg["scale"] * self.cfg["act"]["slope"]


def test_a_dict_attribute_changed_in_place():
    e, c = twins(DictScale)
    compare(e, c, both(e, c)(lambda m, k: m.cfg.__setitem__("scale", 1.0 if k < 3 else 2.0)))


def test_a_nested_dict_attribute_changed_in_place():
    e, c = twins(DictScale)
    compare(e, c, both(e, c)(lambda m, k: m.cfg["act"].__setitem__("slope", 0.1 if k < 3 else 0.7)))


@dataclasses.dataclass
class Inner:
    scale: float = 1.0


@dataclasses.dataclass
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)


class NestedConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.config = nn.Linear(4, 4), Outer()

    def forward(self, x):
        return self.lin(x) * self.config.inner.scale


def test_a_nested_config_field_changed_in_place():
    e, c = twins(NestedConfig)
    compare(e, c, both(e, c)(lambda m, k: setattr(m.config.inner, "scale", 1.0 if k < 3 else 4.0)))


@dataclasses.dataclass(slots=True)
class SlotsConfig:
    scale: float = 1.0


class WithSlotsConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.config = nn.Linear(4, 4), SlotsConfig()

    def forward(self, x):
        return self.lin(x) * self.config.scale


def test_a_slots_dataclass_config_changed_in_place():
    e, c = twins(WithSlotsConfig)
    compare(e, c, both(e, c)(lambda m, k: setattr(m.config, "scale", 1.0 if k < 3 else 4.0)))


class NumpyScales(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scales = np.ones(2, dtype=np.float32)

    def forward(self, x):
        return self.lin(x) * self.scales[0]


def test_a_numpy_array_attribute_changed_in_place():
    e, c = twins(NumpyScales)
    compare(e, c, both(e, c)(lambda m, k: m.scales.__setitem__(0, 1.0 if k < 3 else 5.0)))


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.scale = nn.Linear(4, 4), 1.0

    def forward(self, x):
        return self.lin(x) * self.scale


def test_an_attribute_written_through_the_instance_dict():
    e, c = twins(Plain)
    x = tg.tensor(np.ones((3, 4), dtype=np.float32))  # (one batch, evaluated at each setting)
    for k in range(CALLS):
        for m in (e, c):
            vars(m).update(scale=1.0 if k < 3 else 2.0)
        np.testing.assert_allclose(c(x).detach().numpy(), e(x).detach().numpy(), rtol=1e-6)


class WithProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self._temperature = nn.Linear(4, 4), 1.0

    @property
    def inv_temperature(self):
        return 1.0 / self._temperature

    def forward(self, x):
        return self.lin(x) * self.inv_temperature


def test_a_property_over_a_private_attribute():
    e, c = twins(WithProperty)
    compare(e, c, both(e, c)(lambda m, k: setattr(m, "_temperature", 1.0 if k < 3 else 0.5)))


class Picks(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 3)])
        self.which = 0

    def forward(self, x):
        return self.heads[self.which](x).tanh()


def test_a_submodule_picked_by_an_int_attribute():
    e, c = twins(Picks)
    compare(e, c, both(e, c)(lambda m, k: setattr(m, "which", [0, 0, 0, 1, 2, 0][k])))


class DictOfActs(nn.Module):
    """Activations in a plain dict (not a ModuleDict): not registered submodules."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.acts = {"softmax": nn.Softmax(dim=-1)}

    def forward(self, x):
        return self.acts["softmax"](self.lin(x))


def test_a_setting_of_a_module_kept_in_a_plain_dict():
    e, c = twins(DictOfActs)
    compare(
        e,
        c,
        both(e, c)(lambda m, k: setattr(m.acts["softmax"], "dim", -1 if k < 3 else 0)),
    )


# ----------------------------------------------------------------------------- Python state
ACT = nn.Dropout(0.0)
SCALE = 1.0
cfgmod = types.ModuleType("redteam_cfg")  # as `import config` then `config.SCALE`
cfgmod.SCALE = 1.0


class Settings:
    scale = 1.0


class ReadsModuleAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * cfgmod.SCALE


def test_an_attribute_of_an_imported_config_module():
    e, c = twins(ReadsModuleAttr)
    try:
        compare(e, c, lambda k: setattr(cfgmod, "SCALE", 1.0 if k < 3 else 3.0))
    finally:
        cfgmod.SCALE = 1.0


class ReadsClassAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * Settings.scale


def test_a_class_attribute_of_a_plain_settings_class():
    e, c = twins(ReadsClassAttr)
    try:
        compare(e, c, lambda k: setattr(Settings, "scale", 1.0 if k < 3 else 3.0))
    finally:
        Settings.scale = 1.0


class UsesFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return F.gelu(self.lin(x))


def test_a_monkeypatched_library_function():
    e, c = twins(UsesFunctional)
    original = F.gelu
    try:

        def change(k):
            F.gelu = original if k < 3 else (lambda x, approximate="none": F.relu(x))

        compare(e, c, change)
    finally:
        F.gelu = original


class GlobalModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return ACT(self.lin(x))


def test_a_setting_of_a_module_held_in_a_global():
    e, c = twins(GlobalModule)
    try:
        compare(
            e,
            c,
            lambda k: setattr(ACT, "p", 0.0 if k < 3 else 0.5),
            seed=lambda k: tg.manual_seed(50 + k),
        )
    finally:
        ACT.p = 0.0


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Child(Base):
    def forward(self, x):
        return super().forward(x).tanh()


def test_a_patched_base_class_method_reached_through_super():
    e, c = twins(Child)
    original = Base.forward
    try:

        def change(k):
            Base.forward = original if k < 3 else (lambda self, x: self.lin(x) * 2.0)

        compare(e, c, change)
    finally:
        Base.forward = original


TABLE = {"scale": 1.0}


@functools.lru_cache(maxsize=128)
def cached_scale():
    return TABLE["scale"]


def test_an_lru_cached_helper_cleared_after_a_change():
    # (the helper runs only in the first trace; the second hits the cache)
    def f(x):
        return x * cached_scale()

    def change(k):
        TABLE["scale"] = 1.0 if k < 3 else 3.0
        cached_scale.cache_clear()

    cached_scale.cache_clear()
    try:
        compare(f, tg.compile(f), change)
    finally:
        TABLE["scale"] = 1.0
        cached_scale.cache_clear()


DEFAULTS = {"scale": 1.0}


def _with_default(x, opts=DEFAULTS):
    return x * opts["scale"]


def test_a_mutable_default_argument_changed_in_place():
    try:
        compare(
            _with_default,
            tg.compile(_with_default),
            lambda k: DEFAULTS.__setitem__("scale", 1.0 if k < 3 else 2.0),
        )
    finally:
        DEFAULTS["scale"] = 1.0


SCALE_VAR = contextvars.ContextVar("scale", default=1.0)


def test_a_context_variable():
    def f(x):
        return x * SCALE_VAR.get()

    tokens = []

    def change(k):
        if k == 3:
            tokens.append(SCALE_VAR.set(2.0))

    try:
        compare(f, tg.compile(f), change)
    finally:
        for t in tokens:
            SCALE_VAR.reset(t)


# ----------------------------------------------------------------------------- effects
class LayerDrop(nn.Module):
    """Stochastic depth with Python's random module (as several model zoos write it)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        for blk in self.blocks:
            if self.training and random.random() < 0.5:
                continue  # the layer is dropped
            x = blk(x).tanh()
        return x


def test_layerdrop_with_pythons_random_module():
    e, c = twins(LayerDrop)
    # seeds whose first two draws keep both layers, as one run in four does
    seeds = []
    s = 0
    while len(seeds) < CALLS:
        random.seed(s)
        keep = all(random.random() >= 0.5 for _ in range(2))
        if len(seeds) < 2 and keep or len(seeds) >= 2 and not keep:
            seeds.append(s)
        s += 1
    compare(
        e,
        c,
        seed=lambda k: random.seed(seeds[k]),
        runs_eagerly="it reads random, a random generator other than tensorgrad's",
    )


class Counts(nn.Module):
    """Counts its calls in a dict (warm-up for the first three)."""

    def __init__(self):
        super().__init__()
        self.lin, self.state = nn.Linear(4, 4), {"calls": 0}

    def forward(self, x):
        self.state["calls"] += 1
        warm = 1.0 if self.state["calls"] <= 3 else 0.5
        return self.lin(x) * warm


def test_a_counter_in_a_dict_attribute_incremented_by_the_forward():
    e, c = twins(Counts)
    compare(
        e, c, runs_eagerly="it changes Python state that it reads: Counts.state changed in place"
    )


N_CALLS = 0


def _counted(x):
    global N_CALLS
    N_CALLS += 1
    return x * (1.0 if N_CALLS % 4 else -1.0)


def test_a_global_counter_incremented_by_the_forward():
    global N_CALLS
    N_CALLS = 0
    compiled = tg.compile(_counted)
    want, got = [], []
    with expect_eager(r"it changes Python state that it reads: the global \S+\.N_CALLS changed"):
        for k in range(CALLS):
            x = tg.tensor(np.full(3, k + 1.0, dtype=np.float32))
            got.append(compiled(x).numpy())
    N_CALLS = 0
    for k in range(CALLS):
        x = tg.tensor(np.full(3, k + 1.0, dtype=np.float32))
        want.append(_counted(x).numpy())
    np.testing.assert_array_equal(np.array(got), np.array(want))


class Scheduled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.schedule = iter([1.0, 1.0, 1.0, 0.5, 0.25, 0.125, 0.1, 0.1])

    def forward(self, x):
        return self.lin(x) * next(self.schedule)


def test_a_schedule_read_with_next_from_an_iterator():
    e, c = twins(Scheduled)
    compare(e, c, runs_eagerly="it reads Scheduled.schedule, an iterator")


# ----------------------------------------------------------------------------- globals
GLOBAL_W = tg.tensor(np.ones(4, dtype=np.float32))
GLOBAL_ARR32 = np.ones(4, dtype=np.float32)
GLOBAL_ARR64 = np.ones(4, dtype=np.float64)


def test_a_global_tensor_changed_in_place_and_reassigned():
    global GLOBAL_W
    saved = GLOBAL_W

    def f(x):
        return x * GLOBAL_W

    def change(k):
        global GLOBAL_W
        if k == 3:
            GLOBAL_W.mul_(2.0)
        if k == 4:
            GLOBAL_W = tg.tensor(np.full(4, 3.0, dtype=np.float32))
        if k == 5:
            GLOBAL_W.data = np.full(4, 5.0, dtype=np.float32)

    try:
        compare(f, tg.compile(f), change)
    finally:
        GLOBAL_W = saved


def test_a_global_float32_array_changed_in_place():
    def f(x):
        return x * GLOBAL_ARR32

    try:
        compare(f, tg.compile(f), lambda k: GLOBAL_ARR32.fill(1.0 if k < 3 else 2.0))
    finally:
        GLOBAL_ARR32.fill(1.0)


ARRAY_READ = r"it reads a tensor's array \(\.array, as_array\) in Python"


def test_a_global_array_copied_by_tg_tensor_in_the_forward_changed_in_place():
    def f(x):  # (runs eagerly: tg.tensor reads the array for its caller)
        return x * tg.tensor(GLOBAL_ARR64, dtype=tg.float32)

    try:
        change = lambda k: GLOBAL_ARR64.fill(1.0 if k < 3 else 2.0)  # noqa: E731
        compare(f, tg.compile(f), change, runs_eagerly=ARRAY_READ)
    finally:
        GLOBAL_ARR64.fill(1.0)


def test_a_global_array_cast_by_as_tensor_in_the_forward_changed_in_place():
    def f(x):
        return x * tg.as_tensor(GLOBAL_ARR64, dtype=tg.float32)

    try:
        compare(f, tg.compile(f), lambda k: GLOBAL_ARR64.fill(1.0 if k < 3 else 2.0))
    finally:
        GLOBAL_ARR64.fill(1.0)


def test_a_tensor_captured_by_a_closure_changed_in_place():
    bias = tg.zeros(4)

    def f(x):
        return (x + bias).tanh()

    compare(f, tg.compile(f), lambda k: bias.add_(0.5) if k >= 3 else None)


# ----------------------------------------------------------------------------- functions
def test_a_compiled_function_calling_a_parameter_free_module_switched_to_eval():
    drop = nn.Dropout(0.5)

    def f(x):
        return drop(x * 2.0)

    def change(k):
        drop.train(k < 3)

    compare(f, tg.compile(f), change, seed=lambda k: tg.manual_seed(70 + k))


def test_a_compiled_function_calling_a_module_whose_setting_changes():
    act = nn.Softmax(dim=-1)

    def f(x):
        return act(x * 2.0)

    compare(f, tg.compile(f), lambda k: setattr(act, "dim", -1 if k < 3 else 0))


def test_a_compiled_function_calling_a_frozen_model_reloaded():
    teacher = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    teacher.requires_grad_(False)
    other = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def f(x):
        return teacher(x) * x

    def change(k):
        if k == 3:
            teacher.load_state_dict(other.state_dict())
        if k == 4:
            with tg.no_grad():
                for p in teacher.parameters():
                    p.mul_(0.5)  # an EMA-style update in place

    compare(f, tg.compile(f), change)


# ----------------------------------------------------------------------------- nesting
class Scaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.scale = nn.Linear(4, 4), 1.0

    def forward(self, x):
        return self.lin(x) * self.scale


class Parent(nn.Module):
    def __init__(self):
        super().__init__()
        self.child, self.out = Scaler(), nn.Linear(4, 4)

    def forward(self, x):
        return self.out(self.child(x).tanh())


def test_a_compiled_child_inside_a_compiled_parent():
    eager = Parent()
    compiled = copy.deepcopy(eager)
    tg.compile(compiled.child)
    tg.compile(compiled)
    compare(
        eager,
        compiled,
        both(eager.child, compiled.child)(lambda m, k: setattr(m, "scale", 1.0 if k < 3 else 2.0)),
    )


def test_a_compiled_child_warmed_up_alone_then_used_by_a_compiled_parent():
    eager = Parent()
    compiled = copy.deepcopy(eager)
    tg.compile(compiled.child)
    for _ in range(3):  # the child alone, as an earlier stage of a script would run it
        compiled.child(tg.randn(3, 4, requires_grad=True))
    tg.compile(compiled)
    compare(
        eager,
        compiled,
        both(eager.child, compiled.child)(lambda m, k: setattr(m, "scale", 1.0 if k < 3 else 2.0)),
    )


SCALE2 = 1.0


def _inner(x):
    return x * SCALE2


def test_a_compiled_function_calling_a_warmed_up_compiled_function():
    global SCALE2
    inner = tg.compile(_inner)
    for _ in range(3):
        inner(tg.randn(3, 4, requires_grad=True))

    def outer(x):
        return inner(x).tanh()

    def eager(x):
        return _inner(x).tanh()

    try:
        compare(
            eager,
            tg.compile(outer),
            lambda k: globals().__setitem__("SCALE2", 1.0 if k < 3 else 3.0),
        )
    finally:
        SCALE2 = 1.0


# ----------------------------------------------------------------------------- the tape
class TanhOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).tanh()


def test_an_output_written_in_place_before_backward_raises_as_in_eager():
    e, c = twins(TanhOut)
    for k in range(4):
        x = tg.randn(3, 4, requires_grad=True)
        y = e(x)
        y.mul_(2.0)
        with pytest.raises(RuntimeError):
            y.sum().backward()
        y = c(x)
        y.mul_(2.0)
        with pytest.raises(RuntimeError):
            y.sum().backward()


class NoGradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        with tg.no_grad():
            norm = (h * h).sum(-1, keepdim=True).sqrt() + 1.0
        return h / norm


def test_no_grad_inside_the_forward():
    e, c = twins(NoGradInside)
    compare(e, c)


class InPlaceIntermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        h.mul_(2.0)
        return h.add_(1.0).tanh()


def test_in_place_ops_on_intermediates_run_eagerly_and_agree():
    e, c = twins(InPlaceIntermediate)
    compare(e, c, runs_eagerly="it writes into a tensor in place")


class KwargsOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, *, scale=1.0, bias=None):
        h = self.lin(x) * scale
        return h if bias is None else h + bias


def test_kwargs_only_and_default_arguments():
    e, c = twins(KwargsOnly)
    b = tg.randn(4)
    calls = [{}, {}, {}, {"scale": 2.0}, {"bias": b}, {"scale": 2.0, "bias": b}, {}]
    for k, kw in enumerate(calls):
        x = tg.randn(3, 4, requires_grad=True)
        x2 = tg.tensor(x.detach().numpy(), requires_grad=True)
        _same(
            _run(lambda t, kw=kw: c(t, **kw), list(c.parameters()), x2),
            _run(lambda t, kw=kw: e(t, **kw), list(e.parameters()), x),
            f"call {k}",
        )


# ----------------------------------------------------------------------------- parameters
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.drop(F.gelu(self.a(x))))


def test_freeze_unfreeze_eval_train_and_a_replaced_parameter():
    def make():
        tg.manual_seed(3)
        return MLP()

    e, c = twins(make)

    def change(m, k):
        if k == 3:
            m.a.requires_grad_(False)
        if k == 4:
            m.a.requires_grad_(True)
            m.eval()
        if k == 5:
            m.train()
            m.b.weight = nn.Parameter(tg.tensor(np.full((4, 8), 0.1, dtype=np.float32)))
        if k == 6:
            m.b.bias = None

    compare(e, c, both(e, c)(change), calls=8, seed=lambda k: tg.manual_seed(10 + k))


def test_optimizer_steps_between_calls_are_picked_up():
    def make():
        tg.manual_seed(4)
        return MLP()

    e, c = twins(make)
    opts = [tg.optim.AdamW(m.parameters(), lr=0.05) for m in (e, c)]
    rng = np.random.default_rng(1)
    for k in range(CALLS):
        a = rng.standard_normal((3, 4)).astype(np.float32)
        res = []
        for m, opt in zip((e, c), opts):
            tg.manual_seed(20 + k)
            res.append(_run(m, list(m.parameters()), tg.tensor(a, requires_grad=True)))
            opt.step()
        _same(res[1], res[0], f"call {k}")


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(4, 4, bias=False)
        self.head = nn.Linear(4, 4, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("shift", tg.zeros(4))

    def forward(self, x):
        return self.head(self.emb(x).tanh()) + self.shift


def test_tied_weights_untied_and_buffers_updated_between_calls():
    e, c = twins(Tied)

    def change(m, k):
        if k == 3:
            m.shift.add_(1.0)  # in place
        if k == 4:
            m.shift = tg.full((4,), -2.0)  # replaced
        if k == 5:
            m.head.weight = nn.Parameter(m.emb.weight.detach().clone())  # untied

    compare(e, c, both(e, c)(change), calls=7)


class Plain2(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mask = tg.ones(4)  # a plain tensor attribute, not a buffer

    def forward(self, x):
        return self.lin(x) * self.mask


def test_a_plain_tensor_attribute_changed_in_place_swapped_and_reassigned():
    e, c = twins(Plain2)

    def change(m, k):
        if k == 3:
            m.mask.mul_(2.0)
        if k == 4:
            m.mask.data = np.full(4, 3.0, dtype=np.float32)
        if k == 5:
            m.mask = tg.full((4,), -1.0)

    compare(e, c, both(e, c)(change))


def test_python_floats_derived_from_shapes():
    def f(x):
        n, d = x.shape
        return (x * d**-0.5).softmax(-1) * (1.0 / n)

    compiled = tg.compile(f)
    for shape in [(3, 4), (3, 4), (3, 4), (5, 4), (3, 8), (5, 4)]:
        compare(f, compiled, calls=1, shape=shape)


def test_dropout_masks_match_eager_with_the_same_seed():
    def make():
        tg.manual_seed(5)
        return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 4), nn.Dropout(0.2))

    e, c = twins(make)
    compare(e, c, calls=8, seed=lambda k: tg.manual_seed(30 + k))


class TanhOutFloat(TanhOut):
    def forward(self, x):
        return super().forward(x).float()  # (bfloat16 under CPU autocast: .numpy() refuses it)


def test_autocast_on_the_cpu_is_guarded_and_runs_eagerly():
    """CPU autocast runs linear in bfloat16 (tests/test_bfloat16.py): a forward compiled
    outside a block is not replayed inside one, where it runs eagerly and says why."""
    e, c = twins(TanhOutFloat)
    compare(e, c, calls=2)
    with tg.autocast("cpu"):
        compare(e, c, calls=3, runs_eagerly="bfloat16")
    compare(e, c, calls=3)


def test_second_order_gradients_of_a_compiled_function_with_a_closure():
    w = tg.tensor(np.linspace(0.5, 1.5, 4, dtype=np.float32))

    def f(x):
        return (x * w).tanh().pow(2)

    g = tg.compile(f)
    for k in range(5):
        a = np.random.default_rng(k).standard_normal((3, 4)).astype(np.float32)
        res = []
        for fn in (f, g):
            x = tg.tensor(a, requires_grad=True)
            (gx,) = tg.autograd.grad(fn(x).sum(), [x], create_graph=True)
            (ggx,) = tg.autograd.grad(gx.pow(2).sum(), [x])
            res.append((gx.detach().numpy(), ggx.numpy()))
        for u, v in zip(*res):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- layouts
@pytest.mark.parametrize(
    "view", [lambda a: a[:, ::-1], lambda a: a[::2]], ids=["reversed", "strided"]
)
def test_non_contiguous_inputs_of_another_layout_after_the_trace(view):
    def f(x):
        return (x * 2.0 + 1.0).tanh() * x

    g = tg.compile(f)
    base = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    for k in range(CALLS):
        a = base.T if k < 3 else view(base)  # traced transposed, then another layout
        a = a[:, :4] if a.shape[1] > 4 else a
        a = a[:4]
        x_e = tg.tensor(np.array(a), requires_grad=True)
        x_c = tg.as_tensor(a)
        x_c.requires_grad_(True)
        _same(_run(g, [], x_c), _run(f, [], x_e), f"call {k}")


# ----------------------------------------------------------------------------- threads
def test_threads_calling_one_compiled_module_in_replay():
    def make():
        tg.manual_seed(6)
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    e, c = twins(make)
    for _ in range(3):
        c(tg.randn(4, 8, requires_grad=True)).sum().backward()
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(20):
                a = rng.standard_normal((4, 8)).astype(np.float32)
                x_e, x_c = tg.tensor(a, requires_grad=True), tg.tensor(a, requires_grad=True)
                ye, yc = e(x_e), c(x_c)
                ye.pow(2).sum().backward()
                yc.pow(2).sum().backward()
                np.testing.assert_allclose(yc.detach().numpy(), ye.detach().numpy(), rtol=1e-5)
                np.testing.assert_allclose(x_c.grad.numpy(), x_e.grad.numpy(), rtol=1e-5, atol=1e-6)
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(repr(err))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert compiled_forward(c).summary()["compiled"] == 1


# ----------------------------------------------------------------------------- exceptions
class SafeEmbed(nn.Module):
    """Falls back to an unknown-token row when an id is out of range."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 4)

    def forward(self, ids):
        try:
            return self.emb(ids)
        except (IndexError, ValueError):
            return self.emb(ids.clamp(0, 4))


def test_an_exception_caught_inside_the_forward():
    e, c = twins(SafeEmbed)
    with expect_eager(None):  # (an id out of range fails the replay: that call runs eagerly)
        for k, row in enumerate([[1, 2], [3, 4], [0, 1], [7, 2], [1, 9], [2, 2]]):
            ids = tg.tensor(np.array([row]))
            got = c(ids).detach().numpy()
            np.testing.assert_allclose(got, e(ids).detach().numpy(), err_msg=f"call {k}")


# ----------------------------------------------------------------------------- more module state
class Long(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 100)
        self.class_weights = [1.0] * 100  # (more than 64 items)

    def forward(self, x):
        return self.lin(x) * tg.tensor(self.class_weights, dtype=tg.float32)


def test_a_long_list_attribute_changed_in_place():
    e, c = twins(Long)
    compare(e, c, both(e, c)(lambda m, k: m.class_weights.__setitem__(5, 1.0 if k < 3 else 9.0)))


class ReluGelu(nn.GELU):
    def forward(self, x):
        return F.relu(x)


def test_a_submodule_class_swapped_in_place():
    e, c = twins(lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()))

    def change(m, k):
        if k == 3:
            m[1].__class__ = ReluGelu

    compare(e, c, both(e, c)(change))


def test_blocks_appended_and_removed_between_calls():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x).tanh()
            return x

    e, c = twins(Stack)
    extra = nn.Linear(4, 4)

    def change(m, k):
        if k == 3:
            m.blocks.append(copy.deepcopy(extra))
        if k == 5:
            m.blocks = nn.ModuleList([m.blocks[1]])

    compare(e, c, both(e, c)(change), calls=7)


# ----------------------------------------------------------------------------- requires_grad later
def test_a_closure_tensor_made_trainable_after_the_trace():
    temp = tg.ones(4)

    def f(x):
        return x * temp

    g = tg.compile(f)
    with expect_eager(UNTRACKED_GRAD):
        for k in range(CALLS):
            if k == 3:
                temp.requires_grad_(True)
            x = tg.randn(3, 4)
            got = []
            for fn in (f, g):
                temp.grad = None
                y = fn(x)
                if y.requires_grad:
                    y.sum().backward()
                got.append(None if temp.grad is None else temp.grad.numpy().copy())
            assert (got[0] is None) == (got[1] is None), f"call {k}: {got}"


UNTRACKED_GRAD = re.escape(
    "it uses a tensor that requires grad and is neither an input, a parameter nor a buffer "
    "(pass it as an argument, or compile the module that holds it"
)


class Temperature(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.temp = tg.ones(4)  # a plain tensor attribute (not a Parameter)

    def forward(self, x):
        return self.lin(x) * self.temp


def test_a_tensor_attribute_made_trainable_after_the_trace():
    e, c = twins(Temperature)
    with expect_eager(UNTRACKED_GRAD):
        for k in range(CALLS):
            if k == 3:
                e.temp.requires_grad_(True)
                c.temp.requires_grad_(True)
            x = tg.randn(3, 4)
            got = []
            for m in (e, c):
                m.temp.grad = None
                m(x).sum().backward()
                got.append(None if m.temp.grad is None else m.temp.grad.numpy().copy())
            assert (got[0] is None) == (got[1] is None), f"call {k}: {got}"


# ----------------------------------------------------------------------------- outputs, backward
class ActorCritic(nn.Module):
    def __init__(self, detach=False):
        super().__init__()
        self.actor, self.critic, self.detach = nn.Linear(4, 2), nn.Linear(4, 1), detach

    def forward(self, x):
        v = self.critic(x)
        return self.actor(x).tanh(), v.detach() if self.detach else v


@pytest.mark.parametrize("detach", [False, True], ids=["unused", "detached"])
def test_backward_through_one_of_two_heads(detach):
    e, c = twins(lambda: ActorCritic(detach))
    for k in range(4):
        x = tg.randn(3, 4)
        got = []
        for m in (e, c):
            for p in m.parameters():
                p.grad = None
            a, _ = m(x)
            a.sum().backward()
            got.append([None if p.grad is None else p.grad.numpy() for p in m.parameters()])
        for u, v in zip(*got):
            assert (u is None) == (v is None)
            if u is not None:
                np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-6)


class Energy(nn.Module):
    """A force field: forces are minus the gradient of the energy (create_graph inside)."""

    def __init__(self, bias):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1, bias=bias))

    def forward(self, pos):
        (g,) = tg.autograd.grad(self.net(pos).sum(), [pos], create_graph=True)
        return -g


def _forces(bias):
    e, c = twins(lambda: Energy(bias))
    for k in range(5):
        a = np.random.default_rng(k).standard_normal((5, 3)).astype(np.float32)
        res = []
        for m in (e, c):
            for p in m.parameters():
                p.grad = None
            pos = tg.tensor(a, requires_grad=True)
            f = m(pos)
            (f * f).sum().backward()
            grads = [None if p.grad is None else p.grad.numpy() for p in m.parameters()]
            res.append((f.detach().numpy(), grads, pos.grad.numpy()))
        np.testing.assert_allclose(res[1][0], res[0][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res[1][2], res[0][2], rtol=1e-5, atol=1e-6)
        for u, v in zip(res[0][1], res[1][1]):
            assert (u is None) == (v is None)
            if u is not None:
                np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-5)


def test_autograd_grad_with_create_graph_inside_the_forward():
    _forces(bias=False)


def test_autograd_grad_inside_the_forward_with_a_parameter_it_does_not_reach():
    _forces(bias=True)


class Retains(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        h.retain_grad()  # (to read the activation's gradient after backward: saliency)
        return self.b(h.tanh()), h


def test_retain_grad_inside_the_forward():
    e, c = twins(Retains)
    with expect_eager(r"it calls retain_grad\(\) \(replay would not keep the gradient\)"):
        for k in range(4):
            x = tg.randn(3, 4)
            got = []
            for m in (e, c):
                y, h = m(x)
                y.sum().backward()
                got.append(h.grad)
            assert got[1] is not None, f"call {k}"
            np.testing.assert_allclose(got[1].numpy(), got[0].numpy(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- copies
def test_deepcopy_of_a_compiled_module():
    m = tg.compile(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    for _ in range(3):
        m(tg.randn(3, 4))
    ema = copy.deepcopy(m)
    x = tg.randn(3, 4)
    np.testing.assert_allclose(ema(x).detach().numpy(), m(x).detach().numpy(), rtol=1e-6)


def test_a_compiled_function_with_a_frozen_momentum_encoder_updated_through_data():
    query = nn.Linear(4, 4)
    key = copy.deepcopy(query)
    key.requires_grad_(False)  # MoCo's key encoder: updated by momentum, not by gradients

    def keys(x):
        return key(x).tanh()

    def change(k):
        if k >= 3:  # MoCo's update: param_k.data = param_k.data * m + param_q.data * (1 - m)
            for pk, pq in zip(key.parameters(), query.parameters()):
                pk.data = pk.data * 0.5 + pq.data * 0.5 + 0.1

    compare(keys, tg.compile(keys), change)


class Forces(nn.Module):
    """Forces at inference: the energy's gradient, taken inside the forward."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, pos):
        pos = pos.detach().requires_grad_(True)
        (g,) = tg.autograd.grad(self.net(pos).sum(), [pos])
        return -g


SETS_REQUIRES_GRAD = r"it sets requires_grad on a traced tensor \(replay would not\)"


def test_a_gradient_taken_inside_the_forward_after_a_warm_up_on_one_example():
    e, c = twins(Forces)
    example = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    with expect_eager(SETS_REQUIRES_GRAD):
        for _ in range(2):  # warm-up on one example input
            c(tg.tensor(example))
        for k in range(4):
            a = np.random.default_rng(k + 1).standard_normal((5, 3)).astype(np.float32)
            np.testing.assert_allclose(
                c(tg.tensor(a)).numpy(), e(tg.tensor(a)).numpy(), rtol=1e-5, atol=1e-6
            )


def test_a_gradient_taken_inside_the_forward_on_two_different_inputs_runs_eagerly():
    e, c = twins(Forces)
    with expect_eager(SETS_REQUIRES_GRAD):
        for k in range(5):
            a = np.random.default_rng(k).standard_normal((5, 3)).astype(np.float32)
            np.testing.assert_allclose(
                c(tg.tensor(a)).numpy(), e(tg.tensor(a)).numpy(), rtol=1e-5, atol=1e-6
            )


def test_siamese_calls_before_one_backward():
    def make():
        tg.manual_seed(8)
        return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))

    e, c = twins(make)
    for k in range(5):
        a, b = tg.randn(3, 4), tg.randn(3, 4)
        got = []
        for m in (e, c):
            for p in m.parameters():
                p.grad = None
            d = m(a) - m(b)
            (d * d).sum().backward()
            got.append([p.grad.numpy() for p in m.parameters()])
        for u, v in zip(*got):
            np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-6, err_msg=f"call {k}")


def test_hooks_added_after_the_trace_run():
    e, c = twins(lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)))

    def change(m, k):
        if k == 3:
            m[1].register_forward_hook(lambda mod, args, out: out * 2.0)
        if k == 4:
            for p in m.parameters():
                p.register_hook(lambda g: g.clamp(-0.05, 0.05))

    compare(
        e,
        c,
        both(e, c)(change),
        runs_eagerly=r"Tanh has forward hooks \(they run only in eager mode\)",
    )


def test_a_non_leaf_input_passes_its_gradient_upstream():
    def make():
        tg.manual_seed(9)
        return nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    pre_e, body_e = make(), make()
    pre_c, body_c = copy.deepcopy(pre_e), tg.compile(copy.deepcopy(body_e))
    for k in range(5):
        a = np.random.default_rng(k).standard_normal((3, 4)).astype(np.float32)
        got = []
        for pre, body in ((pre_e, body_e), (pre_c, body_c)):
            for p in [*pre.parameters(), *body.parameters()]:
                p.grad = None
            body(pre(tg.tensor(a))).pow(2).sum().backward()
            got.append([p.grad.numpy() for p in [*pre.parameters(), *body.parameters()]])
        for u, v in zip(*got):
            np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-6, err_msg=f"call {k}")
