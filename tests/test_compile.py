"""tensorgrad.compile: trace, guards, replay, fall back (docs/compile.md).

A compiled forward must give what the eager one gives, outputs and gradients, call after
call; a change of signature (shape, train/eval, grad mode) traces again; a forward that a list
of ops cannot replay runs eagerly, saying why in one line.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.compiler import CompileWarning, compiled_forward


def twins(make):
    """The same module twice (equal weights): one to compile, one to run eagerly."""
    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    return a, b


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 6), nn.LayerNorm(6))


def run(model, x, seed):
    """Output and parameter gradients of sum(out * w) for a fixed random w."""
    for p in model.parameters():
        p.grad = None
    out = model(x)
    w = tg.tensor(np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32))
    run.node = type(out._node).__name__
    (out * w).sum().backward()
    return out.detach().numpy(), [p.grad.numpy() for p in model.parameters()]


def assert_close(a, b, tol=1e-6):
    np.testing.assert_allclose(a[0], b[0], rtol=tol, atol=tol)
    for ga, gb in zip(a[1], b[1]):
        np.testing.assert_allclose(ga, gb, rtol=tol, atol=tol)


def node(t) -> str:
    return type(t._node).__name__


def test_replayed_calls_equal_eager_ones():
    compiled, eager = twins(mlp)
    tg.compile(compiled)
    names = []
    for i in range(5):
        x = tg.randn(4, 6)
        assert_close(run(compiled, x, i), run(eager, x, i))
        names.append(node(compiled(x)))
    assert names == ["Replay"] * 5  # the traced calls too: they return the graph's replay
    s = compiled_forward(compiled).summary()
    assert s["compiled"] == 1 and s["ops"] == [4] and s["eager"] == []


def test_guards_retrace_on_shape_train_eval_and_no_grad():
    compiled, eager = twins(lambda: nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.0), nn.Tanh()))
    tg.compile(compiled)
    for shape in [(4, 6), (4, 6), (4, 6), (3, 6), (3, 6), (3, 6)]:
        x = tg.randn(*shape)
        assert_close(run(compiled, x, 0), run(eager, x, 0))
    compiled.eval(), eager.eval()
    for _ in range(3):
        x = tg.randn(3, 6)
        assert_close(run(compiled, x, 0), run(eager, x, 0))
    with tg.no_grad():
        for _ in range(3):
            y = compiled(x)
            assert not y.requires_grad
            np.testing.assert_array_equal(y.numpy(), eager(x).numpy())
    assert compiled_forward(compiled).summary()["compiled"] == 4  # 2 shapes, eval, no_grad


class ReadsAValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if y.sum().item() > 0 else y * -1  # Python decides on the data


class DerivesAnArray(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        keep = tg.Tensor(x.array > 0)  # computed outside the ops, from the input's values
        return self.lin(x).masked_fill(keep, 0.0)


class CountsCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(3, 3), 0

    def forward(self, x):
        self.calls += 1  # Python state the guards do not see: a new constant every call
        return self.lin(x) * float(self.calls % 3 + 1)


class DrawsNoise(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) + tg.randn(*x.shape)


class Cube(tg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


class UsesAFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return Cube.apply(self.lin(x))


class RunningMean(nn.Module):
    """Keeps a running mean of its input in a buffer, as BatchNorm's statistics."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("mean", tg.zeros(3))

    def forward(self, x):
        with tg.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.lin(x - self.mean)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (ReadsAValue, "reads a tensor's value in Python"),
        (DerivesAnArray, "reads a tensor's array"),
        (DrawsNoise, "draws random numbers outside an op"),
        (UsesAFunction, "autograd.Function"),
        (RunningMean, "writes into a tensor in place"),
    ],
    ids=["item", "derived array", "randn", "Function", "running stats"],
)
def test_what_cannot_be_replayed_runs_eagerly_saying_why(make, why):
    compiled, eager = twins(make)
    tg.compile(compiled)
    with pytest.warns(CompileWarning, match=why) as said:
        for i in range(4):
            x = tg.randn(5, 3)
            tg.manual_seed(i)
            a = run(compiled, x, i)
            assert run.node != "Replay"
            tg.manual_seed(i)
            assert_close(a, run(eager, x, i))
    lines = [str(w.message) for w in said if issubclass(w.category, CompileWarning)]
    assert len(lines) == 1 and lines[0].startswith("tensorgrad.compile: ")
    assert compiled_forward(compiled).summary()["compiled"] == 0


def test_a_forward_that_sets_a_module_attribute_runs_eagerly():
    m = tg.compile(CountsCalls())
    with pytest.warns(CompileWarning, match="it sets CountsCalls.calls"):
        for i in range(1, 6):
            x = tg.randn(2, 3)
            with tg.no_grad():
                want = (m.lin(x) * float((i % 3) + 1)).numpy()
            np.testing.assert_allclose(m(x).detach().numpy(), want, rtol=1e-6)


def test_a_forward_that_draws_from_numpys_generator_runs_eagerly():
    noise = np.random.default_rng(0)  # NumPy's own generator: the trace cannot see its draws
    scales = []

    def f(x):
        scales.append(noise.random())
        return x * scales[-1]

    g = tg.compile(f)
    with pytest.warns(CompileWarning, match="a random generator other than tensorgrad's"):
        for _ in range(4):
            x = tg.randn(2, 3)
            np.testing.assert_allclose(g(x).numpy(), x.numpy() * scales[-1], rtol=1e-6)


def test_a_graph_that_changes_with_no_guard_changing_runs_eagerly():
    counter, expected = itertools.count(1), itertools.count(1)  # (no guard sees a position)
    deal = counter.__next__  # (a bound method: an iterator read by name runs eagerly)

    def f(x):
        return x * float(deal())

    g = tg.compile(f)
    with pytest.warns(CompileWarning, match="changed between two calls"):
        for _ in range(4):
            x = tg.randn(2, 3)
            np.testing.assert_allclose(g(x).numpy(), x.numpy() * next(expected), rtol=1e-6)


def test_hooks_on_a_submodule_keep_it_eager():
    compiled, _ = twins(mlp)
    seen = []
    compiled[1].register_forward_hook(lambda m, i, o: seen.append(1))
    tg.compile(compiled)
    with pytest.warns(CompileWarning, match="forward hooks"):
        for _ in range(4):
            compiled(tg.randn(2, 6))
    assert len(seen) == 4  # the hook ran every call


def test_fullgraph_raises_instead_of_falling_back():
    m = tg.compile(ReadsAValue(), fullgraph=True)
    with pytest.raises(RuntimeError, match="reads a tensor's value"):
        m(tg.randn(2, 3))


def test_dropout_draws_a_new_mask_each_replayed_call():
    m = tg.compile(nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5)))
    x = tg.randn(16, 8)
    outs = [m(x) for _ in range(5)]
    assert node(outs[-1]) == "Replay"
    zero = [o.detach().numpy() == 0 for o in outs[2:]]
    assert not np.array_equal(zero[0], zero[1])
    assert 0.35 < zero[0].mean() < 0.65


def test_create_graph_through_a_compiled_module_matches_eager():
    """A gradient penalty: d/dw of |dL/dx|², through the replayed graph."""
    compiled, eager = twins(mlp)
    tg.compile(compiled)

    def penalty(model, x):
        x = x.detach().requires_grad_()
        (gx,) = tg.autograd.grad(model(x).pow(2).sum(), [x], create_graph=True)
        for p in model.parameters():
            p.grad = None
        (gx * gx).sum().backward()
        return gx.detach().numpy(), [p.grad.numpy() for p in model.parameters()]

    for i in range(4):
        x = tg.randn(3, 6)
        assert_close(penalty(compiled, x), penalty(eager, x), tol=1e-5)
    assert compiled_forward(compiled).summary()["compiled"] == 1


def test_backward_through_a_replay_releases_as_it_goes_or_retains_when_asked():
    """Each replayed op's saved state goes once its backward has run (as the eager walk
    releases each node, so activations are freed as gradients come); retain_graph=True keeps
    them for a second backward, and a second backward without it says why it cannot run."""
    f = tg.compile(lambda x, w: ((x @ w).tanh() @ w).sum())
    w = tg.randn(8, 8, requires_grad=True)
    for _ in range(3):
        x = tg.randn(4, 8, requires_grad=True)
        y = f(x, w)
    replay = y._node
    assert type(replay).__name__ == "Replay"
    y.backward(retain_graph=True)
    g1 = w.grad.numpy().copy()
    assert all(fn is not None for fn in replay.fns)
    y.backward()  # the retained graph runs again and adds the same gradient
    np.testing.assert_allclose(w.grad.numpy(), 2 * g1, rtol=1e-6)
    y2 = f(x, w)
    r2 = y2._node
    y2.backward()
    assert "fns" not in r2.__dict__ or all(fn is None for fn in r2.fns)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y2.backward()


def test_a_compiled_function():
    @tg.compile
    def f(x, w):
        return F.gelu(x @ w).sum(dim=-1)

    w = tg.randn(4, 3, requires_grad=True)
    for _ in range(4):
        x = tg.randn(2, 4)
        y = f(x, w)
        (gw,) = tg.autograd.grad(y.sum(), [w])
        w2 = w.detach().requires_grad_()
        (gw2,) = tg.autograd.grad(F.gelu(x @ w2).sum(dim=-1).sum(), [w2])
        np.testing.assert_allclose(gw.numpy(), gw2.numpy(), rtol=1e-6)
    assert node(y) == "Replay"


def test_an_inplace_change_before_backward_is_caught_as_in_eager_mode():
    m = tg.compile(nn.Linear(3, 3))
    for _ in range(3):
        y = m(tg.randn(2, 3))
    assert node(y) == "Replay"
    with tg.no_grad():
        m.weight.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        y.sum().backward()


# ---------------------------------------------------------------------- the GPT


def gpt_pair(**over):
    from gpt.config import GPTConfig
    from gpt.model import GPT

    cfg = GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16, **over)
    tg.manual_seed(0)
    a = GPT(cfg)
    tg.manual_seed(0)
    return a, GPT(cfg)


def adamw_steps(model, n=5):
    opt = model.configure_optimizers(0.1, 1e-2)
    g, losses = np.random.default_rng(0), []
    for _ in range(n):
        idx = g.integers(0, 11, (3, 16))
        _, loss = model(idx, np.roll(idx, -1, axis=1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_compiled_gpt_trains_as_the_eager_one(dropout):
    compiled, eager = gpt_pair(dropout=dropout)
    tg.compile(compiled)
    tg.manual_seed(1)
    got = adamw_steps(compiled)
    tg.manual_seed(1)
    want = adamw_steps(eager)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)  # (the fused block vs the ops:
    for name in want[1]:  # float32 rounding, which AdamW's normalised steps carry over)
        w = want[1][name]
        assert np.abs(got[1][name] - w).max() <= 1e-3 * np.abs(w).max(), name
    assert compiled_forward(compiled).summary()["compiled"] == 1


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)"
)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_gpts_written_attention_compiles_to_one_attention_op(dropout):
    """gpt/model.py writes its attention out (scores, mask, softmax, dropout, ·v): compiled, it
    is one attention op (CausalAttention, with its dropout CausalAttentionDropout: the same
    draws from the generator, the same masks), which the block pattern reads at dropout 0."""
    compiled, eager = gpt_pair(dropout=dropout)
    tg.compile(compiled)
    tg.manual_seed(1)
    got = adamw_steps(compiled)
    tg.manual_seed(1)
    want = adamw_steps(eager)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for name in want[1]:
        w = want[1][name]
        assert np.abs(got[1][name] - w).max() <= 1e-3 * np.abs(w).max(), name
    s = compiled_forward(compiled).summary()
    if dropout:
        assert s["patterns"][-1]["causal attentions with dropout as one attention op"] == 2
    else:
        assert s["patterns"][-1] == {"GPT-2 blocks as the fused block kernel": 2}, s["patterns"]


# (class-level edits of the GPT, compiled and eager: tests/test_model_edits.py)


# ---------------------------------------------------------------------- fusion

UNARY = {
    "Exp": lambda t: t.exp(),
    "Log": lambda t: (t * t + 1.0).log(),
    "Sqrt": lambda t: (t * t + 1.0).sqrt(),
    "Tanh": lambda t: t.tanh(),
    "Sigmoid": lambda t: t.sigmoid(),
    "Relu": F.relu,
    "Neg": lambda t: -t,
    "Gelu": lambda t: F.gelu(t, approximate="tanh"),
    "Gelu:none": F.gelu,
    "Pow": lambda t: t**3,
    "Div": lambda t: t / (t * t + 2.0),
    "Sub": lambda t: 2.5 - t,
}


def fused_names(f) -> list[str]:
    (entry,) = [("ready", v.graph) for vs in f.entries.values() for v in vs if v.state == "ready"]
    return [s.impl.__name__ for s in entry[1].plan]


@pytest.mark.skipif(
    not tg.kernels.is_enabled(),
    reason="TG_KERNELS=0: nothing is fused (unset TG_KERNELS to run it)",
)
@pytest.mark.parametrize("rule", sorted(UNARY))
@pytest.mark.parametrize("n", [7, 40_000], ids=["serial", "parallel"])
def test_each_fusion_rule_matches_its_reference_op(rule, n):
    """Each rule of codegen.RULES, in a run with a bias add and a scale (float64: tight), forward
    and the gradients of the input and the (broadcast) bias, against the ops one by one."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    op = UNARY[rule]

    def run_(x, b):
        return op(x + b) * 1.5

    f = tg.compile(run_)
    rng = np.random.default_rng(0)
    b = tg.tensor(rng.standard_normal(7), requires_grad=True)
    for _ in range(3):
        x = tg.tensor(rng.standard_normal((n // 7, 7)), requires_grad=True)
        w = tg.tensor(rng.standard_normal((n // 7, 7)))
        y = f(x, b)
        got = [y.detach().numpy(), *(g.numpy() for g in tg.autograd.grad((y * w).sum(), [x, b]))]
        y2 = run_(x, b)
        want = [y2.detach().numpy(), *(g.numpy() for g in tg.autograd.grad((y2 * w).sum(), [x, b]))]
        for a, c in zip(got, want):
            np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12, err_msg=rule)
    assert len(fused_names(f)) == 1 and fused_names(f)[0].startswith("Fused[add+")


@pytest.mark.skipif(
    not tg.kernels.is_enabled(),
    reason="TG_KERNELS=0: nothing is fused (unset TG_KERNELS to run it)",
)
def test_the_fused_gelu_in_the_far_tails_is_the_reference():
    """Far in GELU's negative tail e^(-2u) is inf: the fused kernel (formulas.gelu_tanh, as
    every CPU kernel) gives -0 and a zero gradient there, as the ops do. With e^(-2u) capped
    at e^80 it gave x·1.8e-35: -1.8e65 at x = -1e100, float64."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")

    def run_(x, b):
        return F.gelu(x + b, approximate="tanh") * 1.5

    f = tg.compile(run_)
    tails = np.array([-1e100, -1e13, -50.0, -10.0, 0.0, 10.0, 1e13, 1e100])
    b = tg.zeros(8, dtype=tg.float64, requires_grad=True)
    for _ in range(3):
        x = tg.tensor(tails, requires_grad=True)
        got = [f(x, b), *tg.autograd.grad(f(x, b).sum(), [x, b])]
        want = [run_(x, b), *tg.autograd.grad(run_(x, b).sum(), [x, b])]
        for a, c in zip(got, want):
            np.testing.assert_allclose(
                a.detach().numpy(), c.detach().numpy(), rtol=1e-10, atol=1e-30
            )
    assert fused_names(f)[0].startswith("Fused[add+gelu")


@pytest.mark.skipif(
    not tg.kernels.is_enabled(),
    reason="TG_KERNELS=0: nothing is fused (unset TG_KERNELS to run it)",
)
def test_a_long_chain_is_one_kernel_and_keeps_float32():
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")

    def chain(x, b):
        y = F.gelu(x + b)
        y = y * 0.5 + x
        y = y.tanh() * y.sigmoid() + F.relu(y) ** 2
        return (y.exp() - 1.0) / 3.0, y  # an intermediate is an output too

    f = tg.compile(chain)
    b = tg.randn(64, requires_grad=True)
    for _ in range(3):
        x = tg.randn(32, 64, requires_grad=True)
        (y, mid) = f(x, b)
        loss = (y * y).sum() + mid.sum()
        got = [y, mid, *tg.autograd.grad(loss, [x, b])]
        x2, b2 = x.detach().requires_grad_(), b.detach().requires_grad_()
        (y2, mid2) = chain(x2, b2)
        want = [y2, mid2, *tg.autograd.grad((y2 * y2).sum() + mid2.sum(), [x2, b2])]
        for a, c in zip(got, want):
            assert a.dtype == tg.float32
            np.testing.assert_allclose(a.detach().numpy(), c.detach().numpy(), rtol=2e-5, atol=1e-5)
    assert fused_names(f) == ["Fused[add+gelu+mul+add+tanh+sigmoid+mul+relu+pow+add+exp+sub+div]"]


@pytest.mark.skipif(
    not tg.kernels.is_enabled(),
    reason="TG_KERNELS=0: nothing is fused (unset TG_KERNELS to run it)",
)
@pytest.mark.parametrize("n", [6, 40_000], ids=["serial", "parallel"])
def test_a_row_value_broadcast_back_over_its_row_fuses(n):
    """RMSNorm as a learner writes it: the (rows, 1) scale joins the run that multiplies x by
    it and by the weight, read once per row; its gradient is summed over the row."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")

    def rmsnorm(x, w):
        return x * (x.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * w

    f = tg.compile(rmsnorm)
    rng = np.random.default_rng(0)
    w = tg.tensor(rng.standard_normal(8), requires_grad=True)
    for _ in range(3):
        x = tg.tensor(rng.standard_normal((2, n // 2, 8)), requires_grad=True)
        gy = tg.tensor(rng.standard_normal((2, n // 2, 8)))
        y = f(x, w)
        got = [y.detach().numpy(), *(g.numpy() for g in tg.autograd.grad((y * gy).sum(), [x, w]))]
        y2 = rmsnorm(x, w)
        want = [
            y2.detach().numpy(),
            *(g.numpy() for g in tg.autograd.grad((y2 * gy).sum(), [x, w])),
        ]
        for a, c in zip(got, want):
            np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12)
    assert fused_names(f) == ["Fused[pow+mean+add+sqrt+pow+mul+mul]"], fused_names(f)


ROW_PROGRAMS = {
    # (function of x (rows, C), w (C,), s (rows, 1), u (T, C), v (B, 1, 1)), what fuses
    "residual rmsnorm": lambda x, w, s, u, v: (
        (h := x + u) * (h * h).mean(-1, keepdim=True).add(1e-5).rsqrt() * w
    ),
    "softmax by hand": lambda x, w, s, u, v: (e := (x * w).exp()) / e.sum(-1, keepdim=True),
    "layernorm by hand": lambda x, w, s, u, v: (
        (d := x - x.mean(-1, keepdim=True)) * (d * d).mean(-1, keepdim=True).add(1e-5).rsqrt() * w
    ),
    "row input and row output": lambda x, w, s, u, v: (
        (t := (x.tanh() * s).sum(-1, keepdim=True).sigmoid()),
        x * t * v + u,
    ),
    "reduction of an input": lambda x, w, s, u, v: x.mean(-1, keepdim=True) * x - x * w,
    "rows read before the reduction": lambda x, w, s, u, v: (
        (x * s + v).pow(2).sum(-1, keepdim=True).sqrt()
    ),
}


@pytest.mark.skipif(
    not tg.kernels.is_enabled(),
    reason="TG_KERNELS=0: nothing is fused (unset TG_KERNELS to run it)",
)
@pytest.mark.parametrize("B,T", [(2, 3), (4, 320)], ids=["serial", "parallel"])
@pytest.mark.parametrize("name", sorted(ROW_PROGRAMS))
def test_a_row_program_matches_the_ops(name, B, T):
    """Elementwise steps, a keepdim reduction over the last axis, steps on its (rows, 1)
    value and steps after it that read it per row: one generated kernel each way (float64,
    tight), its value and every input's gradient against the ops one by one. Inputs read
    whole, per column (C,), per row (B, T, 1), per (T, C) and per batch (B, 1, 1)."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    fn, C = ROW_PROGRAMS[name], 32
    f = tg.compile(fn)
    rng = np.random.default_rng(0)

    def arg(*shape):
        return tg.tensor(rng.standard_normal(shape), requires_grad=True)

    for _ in range(3):
        args = [arg(B, T, C), arg(C), arg(B, T, 1), arg(T, C), arg(B, 1, 1)]
        out = f(*args)
        outs = out if isinstance(out, tuple) else (out,)
        ws = [tg.tensor(rng.standard_normal(o.shape)) for o in outs]
        loss = sum((o * w).sum() for o, w in zip(outs, ws))
        got = [o.detach().numpy() for o in outs] + [
            g.numpy()
            for g in tg.autograd.grad(loss, args, allow_unused=True, materialize_grads=True)
        ]
        want_out = fn(*args)
        want_outs = want_out if isinstance(want_out, tuple) else (want_out,)
        loss2 = sum((o * w).sum() for o, w in zip(want_outs, ws))
        want = [o.detach().numpy() for o in want_outs] + [
            g.numpy()
            for g in tg.autograd.grad(loss2, args, allow_unused=True, materialize_grads=True)
        ]
        for k, (a, c) in enumerate(zip(got, want)):
            np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12, err_msg=f"{name}: {k}")
    fused = [n for n in fused_names(f) if n.startswith("Fused[")]
    assert any("mean" in n or "sum" in n for n in fused), fused_names(f)


def test_nothing_is_fused_with_the_kernels_off(monkeypatch):
    monkeypatch.setattr(tg.kernels, "is_enabled", lambda name=None: False)
    f = tg.compile(lambda x: (x * 2.0).tanh() + 1.0)
    for _ in range(3):
        y = f(tg.randn(4, 4, requires_grad=True))
    assert node(y) == "Replay" and fused_names(f) == ["Mul", "Tanh", "Add"]


# ---------------------------------------------------------------------- the gradient contract


class WrongShapeGrad(tg.autograd.Op):
    """An op whose backward breaks the contract (a gradient of the wrong shape)."""

    def forward(self, x):
        return x * 2

    def backward(self, g):
        return g.sum(0)


def test_a_wrong_gradient_raises_in_a_replayed_graph_as_in_eager_mode():
    f = tg.compile(lambda x: WrongShapeGrad.apply(x * 1.5).sum())
    for _ in range(3):
        x = tg.randn(3, 4, requires_grad=True)
        with pytest.raises(RuntimeError, match="WrongShapeGrad.backward returned a gradient"):
            f(x).backward()


def test_a_comparison_of_traced_values_is_an_op_and_replays_even_with_the_same_inputs():
    """x > 0 is an op (Compare, no gradient): with the same input in both traced calls the
    third call still computes its own mask, not the first call's (it used to be computed off
    the tape, and the forward ran eagerly)."""
    f = tg.compile(lambda x: (x * 2).masked_fill(x > 0, 0.0))
    x = tg.randn(5)
    f(x), f(x)
    y = tg.randn(5)
    np.testing.assert_array_equal(f(y).numpy(), (y * 2).masked_fill(y > 0, 0.0).numpy())
    assert f.summary()["compiled"] == 1 and f.summary()["eager"] == []


# each: a forward using a comparison (or logic) of its traced inputs; b is float64 0-d, an
# int64 vector or a bool vector, so that PyTorch's type promotion decides the compared dtype
COMPARING = {
    "lt": lambda a, b: a.masked_fill(a < b, 0.0),
    "le-reflected": lambda a, b: a.masked_fill(0.25 >= a, 0.0),
    "eq-0d-float64": lambda a, b: a.masked_fill(a.round(decimals=1) == b, 7.0),
    "ne-int": lambda a, b: a * (a.long() != b.long()).float(),
    "int-lt-half": lambda a, b: a * (b.long() < 0.5),
    "gt-ge-and": lambda a, b: a.masked_fill((a > b) & (a >= -0.5), 0.0),
    "or-xor-invert": lambda a, b: a.masked_fill(((a > 0) | (b > 0)) ^ ~(a < 1), -1.0),
    "int-bitwise": lambda a, b: a * ((b.long() & 1) | (b.long() ^ 2)).float(),
    "logical": lambda a, b: a.masked_fill(a.logical_and(b).logical_or(a.logical_not()), 2.0),
    "logical-xor": lambda a, b: a.masked_fill(a.logical_xor(b > 0), 2.0),
    "isnan-isinf-isfinite": lambda a, b: a.masked_fill(
        (a / b).isnan() | (a / b).isinf() | ~(a / b).isfinite(), 3.0
    ),
    "where": lambda a, b: tg.where(a > b, a, b * 2),
    "returned-mask": lambda a, b: (a * 2, a > b),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (0 / 0, 1 / 0: the isnan case)
@pytest.mark.parametrize("name", sorted(COMPARING))
def test_comparisons_of_traced_values_replay_as_eager_mode_computes_them(name):
    """Compiled equals eager, outputs (the masks' dtypes too) and gradients, over four calls:
    the first two with one input, the next two with others (a replay reuses no mask)."""
    fn = COMPARING[name]
    f = tg.compile(fn)
    g = np.random.default_rng(7)
    first = g.standard_normal((3, 5)).round(1)
    for call in range(4):
        a = first if call < 2 else g.standard_normal((3, 5)).round(1)
        b = np.float64(0.3) if name == "eq-0d-float64" else g.standard_normal(5).round(1) * 3
        if name == "isnan-isinf-isfinite":
            b = np.where(g.random(5) < 0.4, 0.0, b)  # 0/0 and x/0
        got, want = [], []
        for fun, out in ((f, got), (fn, want)):
            x = tg.tensor(a.astype(np.float32), requires_grad=True)
            y = tg.tensor(b, requires_grad=name != "int-lt-half" and np.ndim(b) > 0)
            r = fun(x, y)
            rs = r if isinstance(r, tuple) else (r,)
            rs[0].float().sum().backward() if rs[0].requires_grad else None
            grads = [t.grad.numpy() if t.grad is not None else None for t in (x, y)]
            out.append(([(o.dtype, o.detach().numpy()) for o in rs], grads))
        ((go, gg),), ((wo, wg),) = got, want
        for (gd, ga), (wd, wa) in zip(go, wo):
            assert gd == wd, (name, call)
            np.testing.assert_array_equal(ga, wa, err_msg=f"{name}, call {call}")
        for gx, wx in zip(gg, wg):
            assert (gx is None) == (wx is None), (name, call)
            if wx is not None:
                np.testing.assert_allclose(gx, wx, rtol=1e-6, err_msg=f"{name}, call {call}")
    assert f.summary()["compiled"] == 1 and f.summary()["eager"] == [], f.summary()


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (lambda x, i: x[:, i] * 2, "indexes with a traced tensor inside a tuple"),
        (lambda x, i: x[:, (x[0] > 0).long()] * 2, "indexes with a traced tensor inside a tuple"),
        (lambda x, i: x[x > 0] * 2, "boolean mask of a traced tensor"),
    ],
    ids=["input-in-tuple-key", "computed-in-tuple-key", "bool-mask"],
)
def test_an_index_a_graph_cannot_replay_runs_eagerly(fn, reason):
    """x[:, idx] with idx traced would keep the trace's indices (the two traced calls may
    agree); x[mask] has a shape that depends on the mask's values: both run eagerly."""
    f = tg.compile(fn)
    x, i = tg.randn(3, 4), tg.tensor([0, 2])
    with pytest.warns(CompileWarning, match=reason):
        f(x, i), f(x, i)
    y, j = tg.randn(3, 4), tg.tensor([1, 3])
    np.testing.assert_array_equal(f(y, j).numpy(), fn(y, j).numpy())


def test_a_parameter_read_only_where_no_gradient_flows_gets_none_as_in_eager_mode():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.limit = nn.Linear(3, 3), nn.Parameter(tg.ones(3))

        def forward(self, x):
            return self.lin(x) * self.limit.detach()  # its value, with no gradient

    compiled, eager = twins(Gate)
    tg.compile(compiled)
    for _ in range(3):
        x = tg.randn(4, 3)
        for m in (compiled, eager):
            m.zero_grad()
            m(x).sum().backward()
        assert compiled.limit.grad is None and eager.limit.grad is None
        np.testing.assert_allclose(compiled.lin.weight.grad.numpy(), eager.lin.weight.grad.numpy())
    assert compiled_forward(compiled).summary()["compiled"] == 1


@pytest.mark.parametrize(
    "mask_of",
    [lambda x: tg.tensor(tg.as_array(x) > 0), lambda x: tg.tensor(x) > 0],
    ids=["as_array", "tg.tensor"],
)
def test_an_array_taken_through_a_conversion_runs_eagerly(mask_of):
    """as_array(t) and tg.tensor(t) hand the caller a traced tensor's values: what the caller
    computes from them the trace cannot see (a mask from the input, here)."""
    f = tg.compile(lambda x: (x * 2).masked_fill(mask_of(x), 0.0))
    x = tg.randn(5)
    with pytest.warns(CompileWarning, match="reads a tensor's array"):
        f(x), f(x)
    y = tg.randn(5)
    np.testing.assert_array_equal(f(y).numpy(), (y * 2).masked_fill(y > 0, 0.0).numpy())


@pytest.mark.parametrize("as_tensor", [False, True], ids=["array ids", "tensor ids"])
@pytest.mark.parametrize("masks", ["doc_sep", "attention_mask"])
def test_a_compiled_gpt_builds_its_masks_from_each_calls_ids(masks, as_tensor):
    """The GPT builds attention masks from the token ids in Python: with the same ids in both
    traced calls a replay would reuse the first call's masks, so the forward runs eagerly."""
    compiled, eager = gpt_pair(dropout=0.0)
    tg.compile(compiled)
    g = np.random.default_rng(0)
    same = g.integers(0, 11, (2, 16))
    calls = [(same, 16), (same, 16), (g.integers(0, 11, (2, 16)), 9), (same[::-1], 12)]
    with pytest.warns(CompileWarning, match="reads a tensor's array"):
        for idx, n in calls:
            idx = tg.tensor(idx) if as_tensor else idx
            if masks == "doc_sep":
                kw = {"doc_sep": 3}
            else:
                kw = {"attention_mask": tg.tensor(np.arange(16)[None].repeat(2, 0) < n).long()}
            got = compiled(idx, **kw)[0].detach().numpy()
            want = eager(idx, **kw)[0].detach().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert compiled_forward(compiled).summary()["compiled"] == 0


@pytest.mark.parametrize(
    ("f", "why"),
    [
        (lambda x: x * x.all().float(), "all of a traced tensor"),
        (lambda x: x * x.any().float(), "any of a traced tensor"),
        (lambda x: x * float(x.equal(x.abs())), "value in Python \\(equal\\)"),
        (lambda x: x * float(x.allclose(x.abs())), "value in Python \\(allclose\\)"),
        (lambda x: x * x.new_tensor(x), "reads a tensor's array"),
    ],
    ids=["all", "any", "equal", "allclose", "new_tensor"],
)
def test_reductions_to_a_truth_value_and_new_tensor_run_eagerly(f, why):
    """x.all(), x.equal(y), x.new_tensor(x): computed off the tape or read in Python; with
    the same input in both traced calls a replay would reuse the first call's answer."""
    g = tg.compile(f)
    x = tg.tensor([1.0, 2.0])
    with pytest.warns(CompileWarning, match=why):
        g(x), g(x)
    y = tg.tensor([0.0, -2.0])
    np.testing.assert_array_equal(g(y).numpy(), f(y).numpy())


def test_a_compiled_function_inside_another_leaves_tensor_as_it_was():
    inner = tg.compile(lambda x: x * 2)
    outer = tg.compile(lambda x: inner(x) + 1)
    before = dict(vars(tg.Tensor))
    for _ in range(3):
        np.testing.assert_array_equal(outer(tg.tensor([1.0, 2.0])).numpy(), [3.0, 5.0])
    assert dict(vars(tg.Tensor)) == before
    assert "get" not in vars(tg.devices.generators)


def test_an_output_no_gradient_reaches_costs_no_zeros_of_its_shape():
    """A compiled forward returning (logits, loss), as the GPT does: loss.backward() reaches the
    logits through the loss only, so the Replay node gets no gradient for its logits output.
    It takes None there: zeros of the logits' shape, added to the real gradient, were a
    (B, T, vocab) array more at the backward's peak (206 MB for gpt2-124M at T = 1024)."""
    import tracemalloc

    f = tg.compile(lambda x, w: (x @ w, (x @ w[:, :8]).tanh().mean()))
    w = tg.randn(64, 4096, requires_grad=True)
    x = tg.randn(256, 64)
    for _ in range(3):
        big, loss = f(x, w)
    assert type(loss._node).__name__ == "Replay"
    nbytes = big.detach().numpy().nbytes  # 4 MB
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        loss.backward()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < nbytes / 2, peak / nbytes  # w's gradient (1 MB), not zeros of x @ w
    w2 = w.detach().requires_grad_()
    (x @ w2[:, :8]).tanh().mean().backward()
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), rtol=1e-5)
    (gx,) = tg.autograd.grad(f(x, w)[1], [w], create_graph=True)  # the recorded path too
    np.testing.assert_allclose(gx.detach().numpy(), w2.grad.numpy(), rtol=1e-5)


@pytest.mark.skipif(
    not tg.kernels.is_enabled(),
    reason="TG_KERNELS=0: nothing is fused (unset TG_KERNELS to run it)",
)
def test_a_row_step_with_an_array_constant_ends_the_row_program():
    """A row program's steps on the (rows, 1) value read row values and numbers only: a (1,)
    array constant there is read per element, so that step starts a new run instead."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    c = np.array([2.0], np.float32)

    def fn(x):
        return (x.pow(2).mean(-1, keepdim=True) * tg.as_tensor(c) + 1.0).sqrt() * x

    f = tg.compile(fn)
    for _ in range(3):
        x = tg.randn(4, 8, requires_grad=True)
        y = f(x)
        (g,) = tg.autograd.grad(y.sum(), [x])
    x2 = x.detach().requires_grad_()
    y2 = fn(x2)
    (g2,) = tg.autograd.grad(y2.sum(), [x2])
    np.testing.assert_allclose(y.detach().numpy(), y2.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(g.numpy(), g2.numpy(), rtol=1e-5, atol=1e-6)
    assert fused_names(f)[0] == "Fused[pow+mean]", fused_names(f)


# ---------------------------------------------------------------------- composite: attention


def written_attention(allowed, scale):
    """Causal attention as a learner writes it out (as gpt/model.py does)."""

    def f(q, k, v):
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~tg.Tensor(allowed), float("-inf"))
        return F.softmax(att, dim=-1) @ v

    return f


def attention_run(f, arrays, w):
    ts = [tg.tensor(a.copy(), dtype=a.dtype, requires_grad=True) for a in arrays]
    out = f(*ts)
    (out * tg.tensor(w)).sum().backward()
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)"
)
@pytest.mark.parametrize(
    "dtype, L, hs, kernel",
    [(np.float64, 7, 4, "InplaceAttention"), (np.float32, 24, 8, "NumbaFlashAttention")],
)
def test_attention_written_out_runs_as_one_attention_op(dtype, L, hs, kernel):
    g = np.random.default_rng(0)
    arrays = [g.standard_normal((2, 3, L, hs)).astype(dtype) for _ in range(3)]
    w = g.standard_normal((2, 3, L, hs)).astype(dtype)
    allowed = np.tril(np.ones((L, L), dtype=bool))
    f = written_attention(allowed, 0.37)
    want = attention_run(f, arrays, w)
    c = tg.compile(f)
    for _ in range(3):  # two traces, then replays
        got = attention_run(c, arrays, w)
    names = fused_names(c)
    assert kernel in names and "MatMul" not in names and "NumbaSoftmax" not in names, names
    assert sum(v.state == "ready" for vs in c.entries.values() for v in vs) == 1
    assert c.summary()["patterns"] == [{"causal attentions as one attention op": 1}]
    tol = 1e-10 if dtype == np.float64 else 2e-5
    for name, a, b in zip(("out", "q", "k", "v"), got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)


def attention_reading_its_inside(which):
    """Written-out causal attention whose window is not closed: ``·s`` reads the scores made
    inside it where ``·v`` stands; ``+ p.sum()`` reads the probabilities after it."""
    allowed = ~tg.Tensor(np.tril(np.ones((6, 6), dtype=bool)))

    def f(q, k, v):
        s = q @ k.transpose(-2, -1)
        p = F.softmax((s * 0.5).masked_fill(allowed, float("-inf")), dim=-1)
        return p @ s + v if which == "scores-as-v" else p @ v + p.sum()

    return f


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)"
)
@pytest.mark.parametrize("which", ["scores-as-v", "probabilities-read-after"])
def test_attention_whose_window_reads_its_inside_runs_as_written(which):
    g = np.random.default_rng(3)
    arrays = [g.standard_normal((1, 2, 6, 6)) for _ in range(3)]
    w = g.standard_normal((1, 2, 6, 6))
    f = attention_reading_its_inside(which)
    want = attention_run(f, arrays, w)
    c = tg.compile(f)
    for _ in range(3):
        got = attention_run(c, arrays, w)
    assert "MatMul" in fused_names(c) and c.summary()["patterns"] == [{}]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)"
)
def test_attention_written_out_for_fewer_queries_than_keys_matches_the_bottom_right_mask():
    """L < S (a query block after a KV cache): the mask that matches is ``causal_mask(L, S)``,
    aligned to the bottom right."""
    g = np.random.default_rng(4)
    q, kv = g.standard_normal((1, 2, 3, 4)), [g.standard_normal((1, 2, 7, 4)) for _ in range(2)]
    w = g.standard_normal((1, 2, 3, 4))
    f = written_attention(np.tril(np.ones((3, 7), dtype=bool), k=4), 0.5)
    want = attention_run(f, [q, *kv], w)
    c = tg.compile(f)
    for _ in range(3):
        got = attention_run(c, [q, *kv], w)
    assert "MatMul" not in fused_names(c), fused_names(c)
    assert c.summary()["patterns"] == [{"causal attentions as one attention op": 1}]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "allowed",
    [
        np.tril(np.ones((6, 6), dtype=bool), k=-1) | np.eye(6, dtype=bool)[::-1],  # not causal
        np.tril(np.ones((6, 6), dtype=bool)) & ~np.tril(np.ones((6, 6), dtype=bool), k=-3),
    ],
    ids=["other-mask", "sliding-window"],
)
def test_attention_written_out_with_another_mask_runs_as_written(allowed):
    g = np.random.default_rng(1)
    arrays = [g.standard_normal((1, 2, 6, 4)) for _ in range(3)]
    w = g.standard_normal((1, 2, 6, 4))
    f = written_attention(allowed, 0.5)
    want = attention_run(f, arrays, w)
    c = tg.compile(f)
    for _ in range(3):
        got = attention_run(c, arrays, w)
    assert "MatMul" in fused_names(c) and c.summary()["patterns"] == [{}]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- composite: add + LayerNorm


def residual_then_norm(x, a, w, b):
    s = x + a  # the residual stream: read again after the LayerNorm
    return F.layer_norm(s, (x.shape[-1],), w, b).relu() * 3 + s


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)"
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("a_shape", [(2, 5, 8), (5, 8)])
def test_a_residual_add_then_layer_norm_runs_as_one_kernel(dtype, a_shape):
    """x + a, then LayerNorm of the sum: one AddLayerNorm kernel, both outputs used; an add
    that broadcasts (an embedding's positions) runs as written."""
    g = np.random.default_rng(5)
    arrays = [g.standard_normal(s).astype(dtype) for s in ((2, 5, 8), a_shape, (8,), (8,))]
    w = g.standard_normal((2, 5, 8)).astype(dtype)

    def run(f):
        ts = [tg.tensor(a.copy(), dtype=dtype, requires_grad=True) for a in arrays]
        out = f(*ts)
        (out * tg.tensor(w)).sum().backward()
        return [out.detach().numpy()] + [t.grad.numpy() for t in ts]

    want = run(residual_then_norm)
    c = tg.compile(residual_then_norm)
    for _ in range(3):
        got = run(c)
    fused = a_shape == (2, 5, 8)
    assert ("NumbaAddLayerNorm" in fused_names(c)) == fused, fused_names(c)
    label = "residual adds with their LayerNorm as one kernel"
    assert c.summary()["patterns"] == [{label: 1} if fused else {}]
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for a, b in zip(got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)"
)
def test_an_edited_gpt_compiles_its_residual_adds_with_their_layer_norms():
    """A ReLU-edited GPT does not match the stock block; each of its residual adds that a
    LayerNorm reads (ln_2 in every block, the next block's ln_1, ln_f) becomes one kernel."""
    from gpt.model import GPT, MLP, GPTConfig

    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    tg.manual_seed(0)
    model = GPT(cfg)
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))

    def relu_forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)))

    orig = MLP.forward
    MLP.forward = relu_forward
    try:
        c = tg.compile(model)
        for _ in range(3):
            _, loss = c(tg.tensor(idx), tg.tensor(idx))
            loss.backward()
        summary = compiled_forward(c).summary()
        assert summary["patterns"], summary["eager"]
        patterns = summary["patterns"][-1]
    finally:
        MLP.forward = orig
    assert patterns.get("residual adds with their LayerNorm as one kernel") == 4, patterns
    assert "GPT-2 blocks as the fused block kernel" not in patterns
