"""tensorgrad.compile never replays a stale graph: whatever the forward read is guarded, or the
forward runs eagerly with one line (docs/compile.md: "Guards", "When it runs eagerly").

Each case runs a compiled and an eager copy of one forward (equal weights) for several calls,
changing one piece of Python state between calls (an attribute, a global, a closure variable,
a submodule's setting, a swapped submodule, a patched forward, aliasing), and compares the
outputs and every gradient. A case that cannot be guarded must warn with its reason instead.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import namedtuple

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.compiler import CompileWarning, compiled_forward

CALLS = 6


def outputs_and_grads(fn, params, inputs):
    """fn(*inputs)'s output(s) and the gradient of sum(out * w) (a fixed w) for every input
    and parameter that requires grad."""
    for t in [*params, *inputs]:
        if isinstance(t, tg.Tensor):
            t.grad = None
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum(
        (o * tg.tensor(np.linspace(-1, 1, o.numel(), dtype=np.float32).reshape(o.shape))).sum()
        for o in outs
        if isinstance(o, tg.Tensor) and o.requires_grad
    )
    if isinstance(loss, tg.Tensor):
        loss.backward()
    grads = [
        None if t.grad is None else t.grad.numpy().copy()
        for t in [*params, *inputs]
        if isinstance(t, tg.Tensor) and t.requires_grad
    ]
    return [o.detach().numpy().copy() for o in outs if isinstance(o, tg.Tensor)], grads


def assert_same(a, b, what=""):
    assert len(a[0]) == len(b[0]) and len(a[1]) == len(b[1]), what
    for x, y in zip(a[0], b[0]):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=what)
    for x, y in zip(a[1], b[1]):
        assert (x is None) == (y is None), what
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=what)


def agree(make, change, shape=(3, 4), calls=CALLS, warns=None):
    """A compiled and an eager copy of make() (a module) agree over ``calls`` calls, with
    ``change(module, k)`` applied to both before call k. ``warns``: the reason the compiled
    one must give for running eagerly (None: it must say nothing)."""
    eager = make()
    compiled = copy.deepcopy(eager)
    tg.compile(compiled)
    with _warnings(warns):
        for k in range(calls):
            change(eager, k)
            change(compiled, k)
            x = tg.randn(*shape, requires_grad=True)
            x2 = tg.tensor(x.detach().numpy(), requires_grad=True)
            tg.manual_seed(1000 + k)  # the same draws in both (dropout)
            want = outputs_and_grads(eager, list(eager.parameters()), [x])
            tg.manual_seed(1000 + k)
            got = outputs_and_grads(compiled, list(compiled.parameters()), [x2])
            assert_same(got, want, f"call {k}")
    return compiled


class _warnings:
    def __init__(self, match):
        self.match = match

    def __enter__(self):
        import warnings

        self.ctx = warnings.catch_warnings(record=True)
        self.rec = self.ctx.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)
        if exc[0] is not None:
            return False
        said = [str(w.message) for w in self.rec if issubclass(w.category, CompileWarning)]
        if self.match is None:
            assert not said, said
        else:
            assert any(self.match in s for s in said), (self.match, said)
        return False


# ----------------------------------------------------------------------------- module state
class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale, self.width, self.relu = 1.0, 4, False

    def forward(self, x):
        h = self.lin(x)[:, : self.width] * self.scale
        return F.relu(h) if self.relu else h


@pytest.mark.parametrize(
    "attr, values",
    [("scale", [1.0, 1.0, 1.0, 0.5, 0.5, 2.0]), ("width", [4, 4, 4, 2, 2, 3])],
)
def test_a_plain_attribute_changed_after_the_second_call_is_read_again(attr, values):
    agree(Scaled, lambda m, k: setattr(m, attr, values[k]))


def test_a_bool_attribute_that_picks_a_branch_is_guarded():
    agree(Scaled, lambda m, k: setattr(m, "relu", k >= 3))


def test_flipping_back_and_forth_reuses_each_graph():
    m = agree(Scaled, lambda m, k: setattr(m, "relu", k % 2 == 1), calls=8)
    assert compiled_forward(m).summary()["compiled"] == 2


@pytest.mark.parametrize(
    "make, change",
    [
        (lambda: nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), ("1", "eps", 10.0)),
        (lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()), ("1", "approximate", "tanh")),
        (lambda: nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=-1)), ("1", "dim", 0)),
    ],
)
def test_a_submodule_setting_changed_later_is_read_again(make, change):
    idx, attr, value = change

    def change_it(m, k):
        if k == 3:
            setattr(m[int(idx)], attr, value)

    agree(make, change_it)


def test_dropout_p_set_mid_run_trains_with_it():
    def make():
        tg.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))

    def change(m, k):
        if k == 3:
            m[1].p = 0.5

    agree(make, change)


def test_a_swapped_parameter_free_submodule_runs():
    def change(m, k):
        if k == 3:
            setattr(m, "1", nn.ReLU())

    agree(lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()), change)


def test_a_swapped_submodule_of_the_same_type_with_another_setting_runs():
    def change(m, k):
        if k == 3:
            setattr(m, "1", nn.GELU(approximate="tanh"))

    agree(lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()), change)


def test_an_instance_patched_forward_runs():
    def change(m, k):
        if k == 3:
            m[1].forward = lambda x: x * 3.0

    agree(lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()), change)


class WithClassScale(nn.Module):
    gain = 1.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.gain


def test_a_class_attribute_changed_later_is_read_again():
    def change(m, k):
        WithClassScale.gain = 1.0 if k < 3 else 3.0

    try:
        agree(WithClassScale, change)
    finally:
        WithClassScale.gain = 1.0


@dataclasses.dataclass
class Config:
    scale: float = 1.0


class WithConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.config, self.lin = Config(), nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.config.scale


def test_a_field_of_a_config_object_changed_in_place_is_read_again():
    agree(WithConfig, lambda m, k: setattr(m.config, "scale", 1.0 if k < 3 else 0.25))


# ----------------------------------------------------------------------------- globals, closures
SCALE = 1.0
SIZES = [4]


class ReadsGlobals(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return _helper(self.lin(x))[:, : SIZES[0]]


def _helper(h):  # a function that runs before any op of its own: its globals count too
    return h * SCALE


def test_a_global_read_by_a_helper_changed_later_is_read_again():
    global SCALE
    try:
        agree(ReadsGlobals, lambda m, k: globals().__setitem__("SCALE", 1.0 if k < 3 else 4.0))
    finally:
        SCALE = 1.0


def test_a_global_list_changed_in_place_is_read_again():
    try:
        agree(ReadsGlobals, lambda m, k: SIZES.__setitem__(0, 4 if k < 3 else 2))
    finally:
        SIZES[0] = 4


def test_a_closure_variable_changed_later_is_read_again():
    scale = 1.0

    def f(x):
        return x * scale + 1.0

    g = tg.compile(f)
    for k in range(CALLS):
        scale = 1.0 if k < 3 else 5.0  # noqa: F841  (read by f through its cell)
        x = tg.randn(3, requires_grad=True)
        y = g(x)
        np.testing.assert_allclose(y.detach().numpy(), x.detach().numpy() * scale + 1, rtol=1e-6)
        y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), np.full(3, scale), rtol=1e-6)


def test_a_state_that_changes_every_call_runs_eagerly_with_its_name():
    global SCALE
    try:
        agree(
            ReadsGlobals,
            lambda m, k: globals().__setitem__("SCALE", float(k)),
            calls=12,
            warns="SCALE changed",
        )
    finally:
        SCALE = 1.0


# ----------------------------------------------------------------------------- aliasing
def test_a_forward_traced_with_one_tensor_twice_then_called_with_two():
    g = tg.compile(lambda a, b: a * 2.0 + b)
    x = tg.randn(3)
    for _ in range(3):
        g(x, x)
    a, b = tg.randn(3), tg.randn(3)
    np.testing.assert_allclose(g(a, b).numpy(), a.numpy() * 2 + b.numpy(), rtol=1e-6)


def test_a_parameter_passed_as_the_input_then_another_tensor():
    lin = nn.Linear(4, 4)
    m = tg.compile(nn.Sequential(lin))
    eager = nn.Sequential(lin)
    for _ in range(3):
        m(lin.weight)
    x = tg.randn(4, 4, requires_grad=True)  # (the same signature but for the aliasing)
    np.testing.assert_allclose(m(x).detach().numpy(), eager(x).detach().numpy(), rtol=1e-6)


# ----------------------------------------------------------------------------- value reads
@pytest.mark.parametrize(
    "route",
    [
        lambda x: x.gather(-1, x.topk(2).indices),
        lambda x: x.sort().values[:, :2],
        lambda x: x.gather(-1, x.argsort()[:, :2]),
        lambda x: x * x.unique()[:1],
        lambda x: x * x.histogram(4).bin_edges[1],
    ],
    ids=["topk", "sort", "argsort", "unique", "histogram"],
)
def test_ops_whose_indices_come_from_values_never_freeze(route):
    g = tg.compile(route)
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.warns(CompileWarning, match="of a traced tensor, which no op records"):
        g(tg.tensor(base))
    for k in range(CALLS):
        x = tg.tensor(base if k < 3 else base[:, ::-1] * 2 + 1, requires_grad=True)
        x2 = tg.tensor(x.detach().numpy(), requires_grad=True)
        got = outputs_and_grads(g, [], [x])
        want = outputs_and_grads(route, [], [x2])
        assert_same(got, want, f"call {k}")


def test_embedding_padding_rows_get_no_gradient_after_the_trace():
    def make():
        return nn.Embedding(6, 3, padding_idx=0)

    eager = make()
    compiled = copy.deepcopy(eager)
    tg.compile(compiled)
    for k in range(CALLS):
        ids = tg.tensor(np.array([[1, 2, 3]]) if k < 3 else np.array([[0, 2, 0]]))
        for m in (eager, compiled):
            m.weight.grad = None
            (m(ids) * 2.0).sum().backward()
        np.testing.assert_array_equal(compiled.weight.grad.numpy(), eager.weight.grad.numpy())
    assert compiled_forward(compiled).summary()["compiled"] == 1


# ----------------------------------------------------------------------------- outputs
def test_a_constant_tensor_output_is_a_fresh_tensor_each_call():
    g = tg.compile(lambda x: (x * 2.0, tg.zeros(3)))
    for _ in range(4):
        y, z = g(tg.randn(3))
        assert isinstance(z, tg.Tensor)
        np.testing.assert_array_equal(z.numpy(), np.zeros(3))
        z.add_(1.0)  # a caller that fills it sees a fresh one next time


def test_a_returned_buffer_is_the_buffer_itself():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", tg.zeros(3))

        def forward(self, x):
            return x * 2.0, self.buf

    m = tg.compile(M())
    for _ in range(4):
        _, b = m(tg.randn(3))
        assert b is m.buf


Pair = namedtuple("Pair", ["y", "z"])


@dataclasses.dataclass
class Out:
    y: tg.Tensor
    n: int = 0


@pytest.mark.parametrize(
    "wrap",
    [lambda y: Pair(y, y * 2.0), lambda y: Out(y, 3), lambda y: {"y": y, "z": [y, 1]}],
    ids=["namedtuple", "dataclass", "dict"],
)
def test_structured_outputs(wrap):
    g = tg.compile(lambda x: wrap(x * 2.0))
    for _ in range(4):
        x = tg.randn(3)
        got, want = g(x), wrap(x * 2.0)
        assert type(got) is type(want)
        a, b = got, want
        if isinstance(got, Pair):
            a, b = got.z, want.z
        elif isinstance(got, Out):
            assert got.n == 3
            a, b = got.y, want.y
        else:
            assert got["z"][1] == 1
            a, b = got["z"][0], want["z"][0]
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    assert g.summary()["compiled"] == 1  # replayed, not run eagerly


def test_a_random_draw_just_before_return_is_flagged():
    def f(x):
        y = x * 2.0
        _ = tg.randn(3)
        return y

    g = tg.compile(f)
    with pytest.warns(CompileWarning, match="random numbers outside an op"):
        for _ in range(3):
            g(tg.randn(3))


# ----------------------------------------------------------------------------- effects
class Keeps(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        self.last_h = h
        return h * 2.0


class Clips(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.lin.weight.data = self.lin.weight.data.clamp(-0.1, 0.1)
        return self.lin(x)


class Hooks(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.seen = nn.Linear(4, 4), []

    def forward(self, x):
        h = self.lin(x)
        h.register_hook(lambda g: self.seen.append(1))
        return h


class Reseeds(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        tg.manual_seed(0)
        return F.dropout(self.lin(x), 0.5)


@pytest.mark.parametrize(
    "make, reason",
    [
        (Keeps, "it sets Keeps.last_h"),
        (Clips, "it assigns a tensor's .data"),
        (Hooks, "gradient hook"),
        (Reseeds, "reseeds"),
    ],
)
def test_a_forward_with_an_effect_runs_eagerly_with_its_line(make, reason):
    agree(make, lambda m, k: None, warns=reason)


def test_an_effect_keeps_working_on_every_call():
    m = tg.compile(Keeps())
    with pytest.warns(CompileWarning, match="it sets Keeps.last_h"):
        m(tg.randn(3, 4))
    for _ in range(4):
        x = tg.randn(3, 4)
        m(x)
        np.testing.assert_allclose(m.last_h.detach().numpy(), m.lin(x).detach().numpy())


def test_a_module_made_inside_the_forward_is_not_an_effect():
    class MakesGelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return nn.GELU()(self.lin(x))

    agree(MakesGelu, lambda m, k: None)


def test_a_raise_on_a_later_call_still_raises():
    class Limit(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.limit = nn.Linear(4, 4), 10

        def forward(self, x):
            if x.shape[0] > self.limit:
                raise ValueError("too long")
            return self.lin(x)

    m = tg.compile(Limit())
    for _ in range(3):
        m(tg.randn(3, 4))
    m.limit = 2
    with pytest.raises(ValueError, match="too long"):
        m(tg.randn(3, 4))


# ----------------------------------------------------------------------------- second order
def test_create_graph_through_dropout_differentiates_the_same_mask():
    def make():
        tg.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Dropout(0.5))

    eager = make()
    compiled = copy.deepcopy(eager)
    tg.compile(compiled)
    for k in range(4):
        x = tg.randn(2, 4)
        got = []
        for m in (eager, compiled):
            tg.manual_seed(100 + k)
            xi = tg.tensor(x.detach().numpy(), requires_grad=True)
            y = m(xi)
            (g,) = tg.autograd.grad(y.pow(2).sum(), [xi], create_graph=True)
            (gg,) = tg.autograd.grad(g.pow(2).sum(), [xi])
            got.append((y.detach().numpy(), g.detach().numpy(), gg.numpy()))
        for a, b in zip(*got):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- threads
def test_two_threads_tracing_at_once_agree_with_eager_and_leave_nothing_patched():
    before = {n: v for n, v in vars(tg.Tensor).items()}
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(15):  # a fresh module each time: the threads trace all along
                m = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
                eager = copy.deepcopy(m)
                tg.compile(m)
                for _ in range(3):
                    x = tg.tensor(rng.standard_normal((4, 8)).astype(np.float32))
                    y = m(x)
                    assert y.tolist() is not None  # a value read outside the trace
                    np.testing.assert_allclose(
                        y.detach().numpy(), eager(x).detach().numpy(), rtol=1e-5, atol=1e-6
                    )
                assert compiled_forward(m).summary()["compiled"] == 1
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {n: v for n, v in vars(tg.Tensor).items()} == before


def test_nothing_stays_patched_after_a_forward_raises_while_traced():
    before = dict(vars(tg.Tensor))

    def f(x):
        raise RuntimeError("boom")

    g = tg.compile(f)
    with pytest.raises(RuntimeError, match="boom"):
        g(tg.randn(2))
    assert dict(vars(tg.Tensor)) == before


def test_another_threads_ops_do_not_enter_a_trace():
    started, go_on = threading.Event(), threading.Event()

    def other():
        started.set()
        while not go_on.is_set():
            tg.randn(3) * 2.0 + 1.0  # eager ops in another thread, during the trace

    def f(x):
        go_on.wait(0)  # (no wait: the other thread runs beside the whole trace)
        return x * 3.0

    t = threading.Thread(target=other)
    t.start()
    started.wait()
    try:
        g = tg.compile(f)
        with _warnings(None):
            for _ in range(4):
                x = tg.randn(3)
                np.testing.assert_allclose(g(x).numpy(), x.numpy() * 3.0, rtol=1e-6)
        assert compiled_forward  # (the graph has one op)
        (v,) = [v for vs in g.entries.values() for v in vs if v.state == "ready"]
        assert len(v.graph.steps) == 1
    finally:
        go_on.set()
        t.join()


# ----------------------------------------------------------------------------- fullgraph
@pytest.mark.parametrize("make", [Keeps, Clips, Hooks, Reseeds])
def test_fullgraph_raises_for_each_fallback_reason(make):
    m = tg.compile(make(), fullgraph=True)
    with pytest.raises(RuntimeError, match="runs eagerly"):
        for _ in range(3):
            m(tg.randn(3, 4))


def test_compile_refuses_options_it_would_ignore():
    with pytest.raises(ValueError, match="backend"):
        tg.compile(nn.Linear(2, 2), backend="cudagraphs")
    with pytest.raises(ValueError, match="options"):
        tg.compile(nn.Linear(2, 2), options={"trace.enabled": True})
    for mode in (None, "default", "reduce-overhead", "max-autotune"):
        tg.compile(nn.Linear(2, 2), mode=mode)


@pytest.mark.parametrize(
    "loss",
    [
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=0),
        lambda x, t: F.nll_loss(F.log_softmax(x, -1), t, weight=tg.ones(5), ignore_index=0),
        lambda x, t: (x * F.one_hot(t, 5)).sum(),
    ],
    ids=["label_smoothing", "nll_weight", "one_hot"],
)
def test_losses_that_mask_targets_by_value_never_freeze_the_mask(loss):
    """The first two calls' targets hold no ignored id; later ones do: the mask of kept
    targets must follow them (a loss computing it in NumPy runs eagerly, with its line)."""
    g = tg.compile(loss)
    rng = np.random.default_rng(0)
    with _warnings("traced tensor's values"):
        for k in range(CALLS):
            x = tg.tensor(rng.standard_normal((4, 5)).astype(np.float32), requires_grad=True)
            t = tg.tensor(np.array([1, 2, 3, 4]) if k < 2 else np.array([0, 2, 0, 4]))
            x2 = tg.tensor(x.detach().numpy(), requires_grad=True)
            assert_same(outputs_and_grads(g, [], [x, t]), outputs_and_grads(loss, [], [x2, t]))
