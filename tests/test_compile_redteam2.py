"""A second red team for tensorgrad.compile: forwards a user could write whose compiled result
must equal the eager one (outputs and every gradient, over several calls, with Python state
changed after the second call), or run eagerly with a CompileWarning naming why; never crash
where eager mode works. The cases of tests/test_compile_redteam.py are not repeated here.

Its 20 findings (silent differences and crashes) are fixed; their tests and the attacks that
compile handled from the start stay, so that it stays so.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import os
import pickle
import threading
import typing
from collections import OrderedDict, defaultdict, deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_compile_redteam import (  # noqa: E402
    CALLS,
    _run,
    _same,
    both,
    compare,
    expect_eager,
    twins,
)

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.compiler import CompileWarning, compiled_forward


# ----------------------------------------------------------------------------- harness
# (the first red team's: each side's outputs and every gradient, call after call)
def at(k0, f):
    """change(m, k) that runs f(m) before call k0 only."""
    return lambda m, k: f(m) if k == k0 else None


def _grads(m):
    return [None if p.grad is None else p.grad.numpy().copy() for p in m.parameters()]


def _same_list(got, want, what=""):
    assert len(got) == len(want), what
    for k, (a, b) in enumerate(zip(got, want)):
        assert (a is None) == (b is None), f"{what} {k}"
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{what} {k}")


class Lin(nn.Module):
    """A Linear; subclasses add the Python state their forward reads."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)


# ============================================================================= findings
# ----------------------------------------------------------------------------- callables
class Temperature:
    """A plain callable object holding a setting (a schedule, a temperature)."""

    def __init__(self, t=1.0):
        self.t = t

    def __call__(self, x):
        return x / self.t

    def apply(self, x):
        return x / self.t


class CallableAttr(Lin):
    def __init__(self):
        super().__init__()
        self.temp = Temperature()

    def forward(self, x):
        return self.temp(self.lin(x))


class BoundMethodAttr(Lin):
    def __init__(self):
        super().__init__()
        self.scale = Temperature().apply  # a bound method of a plain object

    def forward(self, x):
        return self.scale(self.lin(x))


class PartialAttr(Lin):
    def __init__(self):
        super().__init__()
        self.act = functools.partial(F.leaky_relu, negative_slope=0.1)

    def forward(self, x):
        return self.act(self.lin(x))


GLOBAL_TEMP = Temperature()


def _global_temp(x):
    return GLOBAL_TEMP(x.tanh())


def _callable_case(where):
    """(eager, compiled, change) for a callable object's setting changed before call 3."""
    if where == "module attribute":
        e, c = twins(CallableAttr)
        return e, c, both(e, c)(at(3, lambda m: setattr(m.temp, "t", 4.0)))
    if where == "bound method":
        e, c = twins(BoundMethodAttr)
        return e, c, both(e, c)(at(3, lambda m: setattr(m.scale.__self__, "t", 4.0)))
    if where == "partial keywords":
        e, c = twins(PartialAttr)
        return e, c, both(e, c)(at(3, lambda m: m.act.keywords.update(negative_slope=0.5)))
    if where == "global":

        def change(k):
            GLOBAL_TEMP.t = 1.0 if k < 3 else 4.0

        return _global_temp, tg.compile(_global_temp), change
    temp = Temperature()  # a closure variable

    def f(x):
        return temp(x.tanh())

    return f, tg.compile(f), lambda k: setattr(temp, "t", 1.0 if k < 3 else 4.0)


@pytest.mark.parametrize(
    "where", ["module attribute", "bound method", "partial keywords", "global", "closure"]
)
def test_a_setting_of_a_callable_object_changed_after_the_trace(where):
    eager, compiled, change = _callable_case(where)
    try:
        compare(eager, compiled, change)
    finally:
        GLOBAL_TEMP.t = 1.0


# ----------------------------------------------------------------------------- containers
class SlotsConfig:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale


class SlotsScaled(Lin):
    def __init__(self):
        super().__init__()
        self.cfg = SlotsConfig(1.0)

    def forward(self, x):
        return self.lin(x) * self.cfg.scale


def test_a_slots_config_object_changed_in_place():
    e, c = twins(SlotsScaled)
    compare(e, c, both(e, c)(at(3, lambda m: setattr(m.cfg, "scale", 3.0))))


class Act:
    alpha = 1.0


class ClassHeld(Lin):
    def __init__(self):
        super().__init__()
        self.kind = Act  # a strategy class kept on the module

    def forward(self, x):
        return self.lin(x) * self.kind.alpha


def test_a_class_attribute_of_a_class_held_in_a_module_attribute():
    e, c = twins(ClassHeld)

    def change(k):
        Act.alpha = 1.0 if k < 3 else 5.0

    try:
        compare(e, c, change)
    finally:
        Act.alpha = 1.0


class DeepConfig(Lin):
    def __init__(self):
        super().__init__()
        self.hp = {"model": {"head": {"out": {"scale": 1.0}}}}

    def forward(self, x):
        return self.lin(x) * self.hp["model"]["head"]["out"]["scale"]


def test_a_config_nested_four_levels_changed_in_place():
    e, c = twins(DeepConfig)
    compare(e, c, both(e, c)(at(3, lambda m: m.hp["model"]["head"]["out"].update(scale=3.0))))


class ImageNetWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1000)
        self.class_weights = [1.0] * 1000  # one per ImageNet class

    def forward(self, x):
        return self.lin(x) * tg.tensor(self.class_weights, dtype=tg.float32)


def test_a_list_of_1000_class_weights_changed_in_place():
    e, c = twins(ImageNetWeights)
    compare(e, c, both(e, c)(at(3, lambda m: m.class_weights.__setitem__(5, 9.0))), calls=5)


class History(Lin):
    def __init__(self):
        super().__init__()
        self.hist = deque([1.0], maxlen=3)  # a moving average of a scale

    def forward(self, x):
        return self.lin(x) * (sum(self.hist) / len(self.hist))


def test_a_deque_attribute_appended_to():
    e, c = twins(History)
    compare(e, c, both(e, c)(at(3, lambda m: m.hist.append(4.0))))


class DefaultTemperature(Lin):
    def forward(self, x):
        return self.lin(x) * getattr(self, "temperature", 1.0)


def test_a_class_default_set_after_the_trace_read_through_getattr():
    e, c = twins(DefaultTemperature)

    def change(k):
        if k == 3:
            DefaultTemperature.temperature = 3.0

    try:
        compare(e, c, change)
    finally:
        if "temperature" in vars(DefaultTemperature):
            del DefaultTemperature.temperature


# ----------------------------------------------------------------------------- the tape
class StopGradient(nn.Module):
    """The decoder trains on a fresh leaf: no gradient reaches the encoder."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        z = self.enc(x).detach().requires_grad_()
        return self.dec(z)


SETS_REQUIRES_GRAD = r"it sets requires_grad on a traced tensor \(replay would not\)"


def test_detach_then_requires_grad_on_an_intermediate_stops_the_gradient():
    e, c = twins(StopGradient)
    compare(e, c, runs_eagerly=SETS_REQUIRES_GRAD)


class ForcesGrad(Lin):
    def forward(self, x):
        with tg.enable_grad():
            return self.lin(x).tanh()


def test_enable_grad_inside_a_forward_called_under_no_grad():
    e, c = twins(ForcesGrad)
    with expect_eager(r"it turns grad mode on inside a call made under no_grad \(enable_grad\)"):
        for k in range(4):
            x = tg.randn(3, 4)
            got = []
            for m in (e, c):
                m.zero_grad()
                with tg.no_grad():
                    y = m(x)
                y.sum().backward()
                got.append(_grads(m))
            _same_list(got[1], got[0], f"call {k}")


class PINN(nn.Module):
    """A physics-informed net: the forward marks its coordinates for du/dx."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        x.requires_grad_(True)
        return self.net(x)


def test_requires_grad_set_on_the_input_inside_the_forward():
    e, c = twins(PINN)
    with expect_eager(SETS_REQUIRES_GRAD):
        for k in range(4):
            a = np.random.default_rng(k).standard_normal((5, 2)).astype(np.float32)
            got = []
            for m in (e, c):
                x = tg.tensor(a)
                u = m(x)
                (du,) = tg.autograd.grad(u.sum(), [x])
                got.append(du.numpy())
            np.testing.assert_allclose(got[1], got[0], rtol=1e-5, atol=1e-6)


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        self.critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, obs):
        return self.actor(obs), self.critic(obs)


def test_two_heads_backpropagated_one_after_the_other():
    e, c = twins(ActorCritic)
    for k in range(4):
        obs = tg.randn(3, 4)
        got = []
        for m in (e, c):
            m.zero_grad()
            logits, value = m(obs)
            logits.pow(2).mean().backward()  # the actor's loss (its own optimizer)
            value.pow(2).mean().backward()  # then the critic's
            got.append(_grads(m))
        _same_list(got[1], got[0], f"call {k}")


class LeafAware(Lin):
    def forward(self, x):
        return self.lin(x if x.grad_fn is None else x.tanh())


def test_a_branch_on_whether_the_input_is_a_leaf():
    e, c = twins(LeafAware)
    rng = np.random.default_rng(0)
    for k in range(CALLS):
        a = rng.standard_normal((3, 4)).astype(np.float32)
        x_e, x_c = tg.tensor(a, requires_grad=True), tg.tensor(a, requires_grad=True)
        if k >= 3:  # from now on, the output of an upstream op
            x_e, x_c = x_e * 1.0, x_c * 1.0
        np.testing.assert_allclose(
            c(x_c).detach().numpy(), e(x_e).detach().numpy(), rtol=1e-5, err_msg=f"call {k}"
        )


# ----------------------------------------------------------------------------- arguments
class Features(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, **feats):
        return self.lin(tg.cat(list(feats.values()), dim=-1))


def test_keyword_arguments_given_in_another_order():
    e, c = twins(Features)
    rng = np.random.default_rng(0)
    for k in range(CALLS):
        vals = {n: rng.standard_normal((3, 4)).astype(np.float32) for n in "ab"}
        order = "ab" if k < 3 else "ba"
        want = e(**{n: tg.tensor(vals[n]) for n in order})
        got = c(**{n: tg.tensor(vals[n]) for n in order})
        np.testing.assert_allclose(
            got.detach().numpy(), want.detach().numpy(), rtol=1e-5, err_msg=f"call {k}"
        )


class Collects(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, feats: list):
        h = self.a(x).tanh()
        feats.append(h)  # the caller collects intermediate features
        return self.b(h)


def test_a_list_argument_that_the_forward_appends_to():
    e, c = twins(Collects)
    with expect_eager(r"it changes a list or dict argument in place \(replay would not\)"):
        for k in range(5):
            x = tg.randn(3, 4)
            fe, fc = [], []
            e(x, fe)
            c(x, fc)
            assert len(fc) == len(fe), f"call {k}: {len(fc)} features, eagerly {len(fe)}"
            np.testing.assert_allclose(fc[0].detach().numpy(), fe[0].detach().numpy(), rtol=1e-5)


class Cast(Lin):
    def forward(self, x, dtype=None):
        h = self.lin(x)
        return h if dtype is None else h.to(dtype)


def test_a_dtype_argument():
    e, c = twins(Cast)
    for k, dt in enumerate([tg.float64, tg.float64, tg.float64, tg.float32, tg.float64]):
        x = tg.randn(3, 4)
        want, got = e(x, dtype=dt), c(x, dtype=dt)
        assert got.dtype == want.dtype, f"call {k}"
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5)


# ----------------------------------------------------------------------------- two-trace check
POOL = ThreadPoolExecutor(2)


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        fa, fb = POOL.submit(self.a, x), POOL.submit(self.b, x)  # branches in parallel
        return fa.result().tanh() + fb.result()


def test_branches_in_a_thread_pool_after_two_identical_warm_up_calls():
    e, c = twins(TwoBranches)
    for m in (e, c):
        m.requires_grad_(False)
    warm = tg.randn(3, 4)
    e(warm)  # (the pool's threads started: their first matmul may round differently)
    with expect_eager(r"it runs ops on its tensors in another thread \(a thread pool\)"):
        for k in range(5):
            x = warm if k < 2 else tg.randn(3, 4)
            want = e(x).numpy()
            got = c(x).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"call {k}")


class Gather(Lin):
    def forward(self, h, idx):
        return self.lin(h).index_select(0, idx)


def test_index_select_by_an_id_argument_after_two_identical_warm_up_calls():
    e, c = twins(Gather)
    rng = np.random.default_rng(0)
    for k in range(5):
        a = rng.standard_normal((5, 4)).astype(np.float32)
        ids = np.array([0, 1, 2]) if k < 2 else rng.integers(0, 5, 3)
        x_e, x_c = tg.tensor(a, requires_grad=True), tg.tensor(a, requires_grad=True)
        _same(
            _run(c, list(c.parameters()), x_c, tg.tensor(ids)),
            _run(e, list(e.parameters()), x_e, tg.tensor(ids)),
            f"call {k}",
        )


# ----------------------------------------------------------------------------- outputs, objects
class Output(dict):
    """A ModelOutput-like dict: keyword construction, attribute access."""

    def __init__(self, **kw):
        super().__init__(**kw)

    def __getattr__(self, k):
        return self[k]


class Pair(tuple):
    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))


class Losses(Lin):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        h = self.lin(x)
        l2, l1 = h.pow(2).mean(), h.abs().mean()
        if self.kind == "defaultdict":
            out = defaultdict(float)
            out["l2"] += l2
            out["l1"] += l1
            return out
        if self.kind == "dict subclass":
            return Output(l2=l2, l1=l1)
        return Pair(l2, l1)


@pytest.mark.parametrize("kind", ["defaultdict", "dict subclass", "tuple subclass"])
def test_output_containers_that_cannot_be_rebuilt_from_their_items(kind):
    e, c = twins(lambda: Losses(kind))
    with expect_eager(r"it returns a \w+, which cannot be rebuilt from its items"):
        for k in range(4):
            x = tg.randn(3, 4)
            want, got = e(x), c(x)
            assert type(got) is type(want)
            keys = list(want) if isinstance(want, dict) else range(2)
            for key in keys:
                np.testing.assert_allclose(
                    got[key].detach().numpy(), want[key].detach().numpy(), rtol=1e-5
                )


def test_pickling_a_compiled_module():
    e, c = twins(lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    for _ in range(3):
        c(tg.randn(3, 4))
    pickle.loads(pickle.dumps(e))  # eagerly: fine
    d = pickle.loads(pickle.dumps(c))
    x = tg.randn(3, 4)
    np.testing.assert_allclose(d(x).detach().numpy(), e(x).detach().numpy(), rtol=1e-5)


def test_a_print_in_the_forward():
    def f(x):
        h = (x * 2.0).tanh()
        print("h", tuple(h.shape))
        return h * x

    g = tg.compile(f)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), expect_eager(r"f calls print \(replay would not print\)"):
        for _ in range(5):
            g(tg.randn(3, 4))
    assert out.getvalue().count("h (3, 4)") == 5


# ============================================================================= handled
# ----------------------------------------------------------------------------- masks, indices
def test_where_and_masked_fill_with_traced_conditions_replay():
    def f(x):
        y = tg.where(x > 0, x * 2.0, x.exp() - 1.0)
        return y.masked_fill(x > 0.3, -1.0).softmax(-1)

    g = tg.compile(f)
    compare(f, g)
    assert g.summary()["compiled"] == 1


@pytest.mark.parametrize(
    "f, reason",
    [
        (lambda x: x[x > 0].sum() * x, "boolean mask"),
        (lambda x: x * (x > 0).nonzero().shape[0], "nonzero"),
        (lambda x: x * x.max(-1)[1].unsqueeze(-1).float(), "argmax"),
        (lambda x: x.sort(-1)[0] * 2.0, "argsort"),
    ],
    ids=["x[x > 0]", "nonzero", "max(dim) indices", "sort"],
)
def test_data_dependent_selections_run_eagerly(f, reason):
    compare(f, tg.compile(f), runs_eagerly=reason)


def test_index_select_by_varying_ids_replays_them():
    e, c = twins(Gather)
    rng = np.random.default_rng(0)
    for k in range(5):
        a = rng.standard_normal((5, 4)).astype(np.float32)
        ids = tg.tensor(rng.integers(0, 5, 3))
        np.testing.assert_allclose(
            c(tg.tensor(a), ids).detach().numpy(), e(tg.tensor(a), ids).detach().numpy()
        )
    assert compiled_forward(c).summary()["compiled"] == 1  # (the ids are a graph value)


# ----------------------------------------------------------------------------- module state
class Repeats(Lin):
    def __init__(self):
        super().__init__()
        self.n, self.k = 2, 3

    def forward(self, x):
        h = self.lin(x)
        for _ in range(self.n):
            h = h.tanh() + x
        h = tg.cat([h] * self.n, dim=-1)
        return h * 2.0 if x.shape[0] > self.k else h


def test_loop_counts_list_lengths_and_shape_tests_from_attributes():
    e, c = twins(Repeats)

    def change(m, k):
        m.n = {3: 3, 5: 1}.get(k, m.n)
        m.k = 1 if k >= 4 else 3

    compare(e, c, both(e, c)(change), calls=7)


class BufferScale(Lin):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.register_buffer("temp", tg.tensor(1.0))

    def forward(self, x):
        t = self.temp.item() if self.how == "item" else self.temp
        return self.lin(x) / t


@pytest.mark.parametrize("how", ["item", "op"])
def test_a_buffer_read_by_item_or_by_an_op_and_written_in_place(how):
    e, c = twins(lambda: BufferScale(how))

    def change(m, k):
        if k == 3:
            m.temp.fill_(2.0)
        if k == 4:
            m.temp.copy_(tg.tensor(0.5))

    item = r"reads a tensor's value in Python \(item\)"  # one line when it reads the value
    said = compare(e, c, both(e, c)(change), runs_eagerly=item if how == "item" else None)
    assert len(said) == (how == "item")


class FloatOfTensor(Lin):
    def __init__(self):
        super().__init__()
        self.t = tg.tensor(2.0)  # a plain tensor attribute used as a Python number

    def forward(self, x):
        return self.lin(x) * float(self.t)


FLOAT_OF = r"it reads a tensor's value in Python \(__float__\)"


def test_a_tensor_attribute_used_as_a_python_float_runs_eagerly():
    e, c = twins(FloatOfTensor)
    compare(e, c, both(e, c)(at(3, lambda m: m.t.fill_(3.0))), runs_eagerly=FLOAT_OF)


class Derived(Lin):
    def __init__(self):
        super().__init__()
        self.d, self.heads, self.base = 4, 1, 1.0

    @property
    def scale(self):
        return (self.d // self.heads) ** -0.5

    @functools.cached_property
    def gain(self):
        return self.base * 2

    def forward(self, x):
        return self.lin(x) * self.scale * self.gain


def test_a_property_and_a_cached_property_computed_from_attributes():
    e, c = twins(Derived)

    def change(m, k):
        if k == 3:
            m.heads = 4
        if k == 4:
            m.base = 3.0
            vars(m).pop("gain", None)  # the cache invalidated, as its docs say

    compare(e, c, both(e, c)(change))


class LazyCenter(Lin):
    def forward(self, x):
        if "center" not in self._buffers:
            self.register_buffer("center", x.detach().mean(0))
        return self.lin(x - self.center)


def test_a_buffer_registered_lazily_by_the_first_call():
    e, c = twins(LazyCenter)
    compare(e, c, runs_eagerly="it registers the buffer LazyCenter.center")
    assert compiled_forward(c).summary()["compiled"] == 1  # compiled once the buffer exists


class Casts(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)
        self.register_buffer("s", tg.ones(4))

    def forward(self, x):
        return self.b(F.gelu(self.a(x.to(self.a.weight.dtype)))) * self.s


def test_double_and_float_between_calls():
    e, c = twins(Casts)

    def change(m, k):
        if k == 3:
            m.double()
        if k == 5:
            m.float()

    compare(e, c, both(e, c)(change), calls=7)


class CachedMask(Lin):
    _cache: dict = {}  # a class-level cache of masks by length

    def mask(self, n):
        if n not in self._cache:
            self._cache[n] = tg.tril(tg.ones(n, n))
        return self._cache[n]

    def forward(self, x):
        return self.mask(x.shape[0]) @ self.lin(x)


def test_a_class_level_mask_cache():
    e, c = twins(CachedMask)
    compare(e, c, shape=lambda k: (3 + k % 2, 4), calls=8)


class EnvActivation(Lin):
    def forward(self, x):
        h = self.lin(x)
        return F.gelu(h) if os.environ.get("RT2_ACT", "gelu") == "gelu" else F.relu(h)


def test_an_environment_variable_that_picks_a_branch():
    e, c = twins(EnvActivation)

    def change(k):
        if k == 3:
            os.environ["RT2_ACT"] = "relu"

    try:
        compare(e, c, change)
    finally:
        os.environ.pop("RT2_ACT", None)


class Recursive(Lin):
    def __init__(self):
        super().__init__()
        self.depth, self.w = 2, [1.0, 0.5]

    def go(self, x, d):
        return x if d == 0 else self.go(self.lin(x).tanh(), d - 1)

    def weights(self):
        yield from self.w

    def forward(self, x):
        return self.go(x, self.depth) * sum(w for w in self.weights())


def test_recursion_and_a_generator_over_a_list_attribute():
    e, c = twins(Recursive)

    def change(m, k):
        if k == 3:
            m.depth = 4
        if k == 4:
            m.w[1] = -2.0

    compare(e, c, both(e, c)(change))


# ----------------------------------------------------------------------------- modules
class Tiable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.b(self.a(x).tanh())


def test_weights_tied_and_a_transposed_weight_swapped_in_after_the_trace():
    e, c = twins(Tiable)

    def change(m, k):
        if k == 3:
            m.b.weight = m.a.weight
        if k == 4:
            m.b.weight = nn.Parameter(m.a.weight.detach().clone())
            m.b.weight.data = np.asfortranarray(m.b.weight.detach().numpy())

    compare(e, c, both(e, c)(change))


def test_a_hook_added_to_a_submodule_after_the_trace_runs_eagerly():
    e, c = twins(Tiable)
    change = both(e, c)(at(3, lambda m: m.a.register_forward_hook(lambda mod, i, o: o * 2.0)))
    compare(e, c, change, runs_eagerly=r"Linear has forward hooks \(they run only in eager mode\)")


def _dropout_mlp():
    tg.manual_seed(2)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.GELU(), nn.Linear(8, 4))


def test_eval_and_train_toggled_every_call_and_the_generator_state_after_each():
    e, c = twins(_dropout_mlp)
    for k in range(8):
        a = np.random.default_rng(k).standard_normal((3, 4)).astype(np.float32)
        res = []
        for m in (e, c):
            m.train(k % 2 == 0)
            tg.manual_seed(100 + k)
            out = _run(m, list(m.parameters()), tg.tensor(a, requires_grad=True))
            res.append((out, tg.rand(4).numpy()))  # what the data pipeline draws next
        _same(res[1][0], res[0][0], f"call {k}")
        np.testing.assert_array_equal(res[1][1], res[0][1], err_msg=f"generator after {k}")


class NoGradForward(Lin):
    @tg.no_grad()
    def forward(self, x):
        return self.lin(x).tanh()


def test_a_no_grad_decorated_forward():
    e, c = twins(NoGradForward)
    compare(e, c)


class ReturnsInputs(Lin):
    def forward(self, x):
        return [x, self.lin(x), self.lin.weight, x.detach()]


def test_a_list_output_holding_the_input_and_a_parameter():
    e, c = twins(ReturnsInputs)
    compare(e, c)
    x = tg.randn(3, 4)
    out = c(x)
    assert out[0] is x and out[2] is c.lin.weight


class UsesFunction(Lin):
    class Double(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def forward(self, x):
        return self.Double.apply(self.lin(x))


def test_a_user_autograd_function_runs_eagerly():
    e, c = twins(UsesFunction)
    compare(e, c, runs_eagerly=r"it calls a user-defined autograd.Function \(Double\)")


# ----------------------------------------------------------------------------- arguments
class Optional(Lin):
    def forward(self, x, mask=None, act="tanh"):
        h = self.lin(x)
        if mask is not None:
            h = h.masked_fill(mask, 0.0)
        return getattr(h, act)()


def test_optional_tensor_and_string_arguments():
    e, c = twins(Optional)
    rng = np.random.default_rng(0)
    calls = [(0, "tanh")] * 3 + [(1, "tanh"), (1, "sigmoid"), (0, "sigmoid"), (1, "relu")]
    for k, (masked, act) in enumerate(calls):
        a = rng.standard_normal((3, 4)).astype(np.float32)
        mask = tg.tensor(a > 0.5) if masked else None
        x_e, x_c = tg.tensor(a, requires_grad=True), tg.tensor(a, requires_grad=True)
        _same(
            _run(lambda t, m=mask, a=act: c(t, m, act=a), list(c.parameters()), x_c),
            _run(lambda t, m=mask, a=act: e(t, m, act=a), list(e.parameters()), x_e),
            f"call {k}",
        )


SHAPES = r"its inputs changed signature 8 times \(shapes every call\?\)"


def test_fourteen_batch_sizes_run_eagerly_after_eight_traces():
    def f(x):
        return (x * 2.0).tanh().sum(0)

    shape = lambda k: (k + 1, 4)  # noqa: E731
    compare(f, tg.compile(f), calls=14, shape=shape, runs_eagerly=SHAPES)


class RaisesOnMode(Lin):
    def forward(self, x, mode):
        if mode == "bad":
            raise ValueError("bad mode")
        return self.lin(x)


def test_an_exception_raised_for_some_arguments_only():
    e, c = twins(RaisesOnMode)
    for k, mode in enumerate(["ok", "bad", "ok", "bad", "ok", "ok", "bad", "ok"]):
        x = tg.full((3, 4), float(k))
        if mode == "bad":
            with pytest.raises(ValueError, match="bad mode"):
                c(x, mode)
        else:
            np.testing.assert_allclose(
                c(x, mode).detach().numpy(), e(x, mode).detach().numpy(), rtol=1e-5
            )


# ----------------------------------------------------------------------------- backward
def _mlp():
    tg.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 4))


@pytest.mark.parametrize("one_backward", [False, True], ids=["per micro-batch", "summed"])
def test_gradient_accumulation_over_micro_batches(one_backward):
    e, c = twins(_mlp)
    rng = np.random.default_rng(0)
    for step in range(4):
        xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
        got = []
        for m in (e, c):
            m.zero_grad()
            losses = [m(tg.tensor(a)).pow(2).mean() / 3 for a in xs]
            if one_backward:
                sum(losses).backward()
            else:
                for loss in losses:
                    loss.backward()
            got.append(_grads(m))
        _same_list(got[1], got[0], f"step {step}")


def test_retain_graph_backward_three_times():
    e, c = twins(_mlp)
    for k in range(5):
        a = np.random.default_rng(k).standard_normal((3, 4)).astype(np.float32)
        got = []
        for m in (e, c):
            m.zero_grad()
            x = tg.tensor(a, requires_grad=True)
            loss = m(x).tanh().pow(2).sum()
            loss.backward(retain_graph=True)
            loss.backward(retain_graph=True)
            (loss * 2.0).backward()
            got.append([*_grads(m), x.grad.numpy()])
        _same_list(got[1], got[0], f"call {k}")


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.ih, self.hh = nn.Linear(4, 5), nn.Linear(5, 5)

    def forward(self, x, h):
        return (self.ih(x) + self.hh(h)).tanh()


@pytest.mark.parametrize("truncated", [False, True], ids=["full", "truncated"])
def test_a_compiled_cell_unrolled_on_its_own_outputs(truncated):
    e, c = twins(Cell)
    xs = [np.random.default_rng(k).standard_normal((2, 4)).astype(np.float32) for k in range(7)]
    got = []
    for m in (e, c):
        m.zero_grad()
        h0 = tg.zeros(2, 5, requires_grad=True)
        h, loss, seen = h0, None, []
        for t, a in enumerate(xs):
            h = m(tg.tensor(a), h)
            term = (h * (t + 1)).sum()
            if truncated:  # backward per step, the state detached
                term.backward()
                seen += _grads(m)
                h = h.detach()
            else:
                loss = term if loss is None else loss + term
        if not truncated:
            loss.backward()
            seen += [*_grads(m), h0.grad.numpy()]
        got.append(seen)
    _same_list(got[1], got[0])


def test_threads_with_different_batch_sizes():
    e, c = twins(_mlp)
    errors = []

    def work(n):
        try:
            rng = np.random.default_rng(n)
            for _ in range(6):
                a = rng.standard_normal((n, 4)).astype(np.float32)
                x_e, x_c = tg.tensor(a, requires_grad=True), tg.tensor(a, requires_grad=True)
                y_e, y_c = e(x_e), c(x_c)
                y_e.pow(2).sum().backward()
                y_c.pow(2).sum().backward()
                np.testing.assert_allclose(y_c.detach().numpy(), y_e.detach().numpy(), rtol=1e-5)
                np.testing.assert_allclose(x_c.grad.numpy(), x_e.grad.numpy(), rtol=1e-5, atol=1e-6)
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(repr(err))

    threads = [threading.Thread(target=work, args=(n,)) for n in (2, 3, 5)]
    # Each thread traces its own batch size, at the same time as the others: a trace that sees
    # another thread's ops on the shared parameters gives up (the forward then runs eagerly,
    # saying so) in most runs on 2 cores, and compiles in the others.
    with expect_eager(r"it runs ops on its tensors in another thread", maybe=True):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


# ----------------------------------------------------------------------------- randomness
class OwnGenerator(Lin):
    def __init__(self):
        super().__init__()
        self.gen = tg.Generator().manual_seed(0)

    def forward(self, x):
        return self.lin(x) + 0.1 * tg.randn(*x.shape, generator=self.gen)


OUTSIDE_AN_OP = r"it draws random numbers outside an op \(tg.randn or the like\)"


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: lambda x: x * tg.randint(0, 3, x.shape).float(), OUTSIDE_AN_OP),
        (lambda: lambda x: x[tg.randperm(x.shape[0])], OUTSIDE_AN_OP),
        (lambda: lambda x: x * (tg.rand_like(x) > 0.5), OUTSIDE_AN_OP),
        (OwnGenerator, "it reads np.random, a random generator other than tensorgrad's"),
    ],
    ids=["randint", "randperm", "rand_like", "a tg.Generator of its own"],
)
def test_random_draws_in_the_forward_run_eagerly(make, reason):
    f = make()
    g = tg.compile(copy.deepcopy(f)) if isinstance(f, nn.Module) else tg.compile(f)
    compare(f, g, seed=lambda k: tg.manual_seed(k), runs_eagerly=reason)


def test_a_global_dict_the_forward_writes_runs_eagerly():
    acts: dict = {}

    def f(x):
        h = (x * 2.0).tanh()
        acts["h"] = h
        return h * x

    g = tg.compile(f)
    with pytest.warns(CompileWarning, match="changes Python state"):
        for k in range(5):
            x = tg.randn(3, 4)
            g(x)
            np.testing.assert_allclose(acts["h"].detach().numpy(), (x * 2.0).tanh().numpy())


# ----------------------------------------------------------------------------- outputs
class Named(typing.NamedTuple):
    logits: object
    loss: object = None


@dataclasses.dataclass
class WithPostInit:
    logits: object
    scale: float = 1.0
    scaled: object = dataclasses.field(init=False)

    def __post_init__(self):
        self.scaled = self.logits * self.scale


class Structured(Lin):
    def forward(self, x):
        h = self.lin(x)
        return Named(h, h.sum()), WithPostInit(h, 2.0), OrderedDict(a=h.tanh())


def test_named_tuple_dataclass_post_init_and_ordered_dict_outputs():
    e, c = twins(Structured)
    for k in range(4):
        x = tg.randn(3, 4)
        got = []
        for m in (e, c):
            m.zero_grad()
            n, d, o = m(x)
            (n.loss + d.scaled.sum() + o["a"].sum()).backward()
            got.append([n.logits.detach().numpy(), d.scaled.detach().numpy(), *_grads(m)])
        _same_list(got[1], got[0], f"call {k}")


@pytest.mark.parametrize(
    "f",
    [
        lambda x, y: ((x * y + 1.0).sigmoid() * 2.0 - y) * x,
        lambda x, y: (x * y).exp() / (x * y).exp().sum(-1, keepdim=True) + y,
    ],
    ids=["elementwise", "row program"],
)
@pytest.mark.parametrize(
    "shapes",
    [((2, 3, 4), (3, 1)), ((3, 1), (1, 4))],
    ids=str,
)
def test_fused_runs_over_middle_and_outer_broadcasts(f, shapes):
    g = tg.compile(f)
    for k in range(4):
        rng = np.random.default_rng(k)
        arrs = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in shapes]
        res = []
        for fn in (f, g):
            xs = [tg.tensor(a, requires_grad=True) for a in arrs]
            y = fn(*xs)
            (y * y).sum().backward()
            res.append([y.detach().numpy(), *(t.grad.numpy() for t in xs)])
        _same_list(res[1], res[0], f"call {k}")
