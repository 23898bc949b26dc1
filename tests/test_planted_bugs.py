"""tensorgrad.compile's guards and two-trace check, each held to eager mode (issue 53).

A compiled forward must compute what the eager one computes on every call: outputs, their
dtype and requires_grad, and the gradients of every input and parameter (None where eager
mode gives None). Each guard component (a tensor's shape, dtype, contiguity and
requires_grad, a plain argument's value, a keyword's name, grad mode, a submodule's training
flag, a parameter's requires_grad and identity, a buffer's identity) gets a sequence of calls
that changes only it, each value traced and replayed first; the signature limit is held
exact; a constant array of the forward is compared by value. Each was seen failing with its
component dropped from the signature (contiguity: with the kernels on, where softmax's needs
C order), the limit off by one either way, or constants compared by shape and dtype only.
Identities are the exception: replay reads the live tensors afresh, so the id in the guard
changes no result (an equivalent mutant).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.compiler import MAX_SIGNATURES, CompileWarning, compiled_forward


def twins(make):
    """The same module twice (equal weights): one to compile, one to run eagerly."""
    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    return tg.compile(a), b


def outcome(model, inputs, kwargs, seed=0):
    """(output, its dtype, whether it requires grad, parameter gradients by name, input
    gradients) of one call and a backward of sum(out * w) for a fixed random w."""
    for p in model.parameters():
        p.grad = None
    xs = [tg.tensor(a, requires_grad=rg) if rg else tg.Tensor(a) for a, rg in inputs]
    out = model(*xs, **kwargs)
    w = np.random.default_rng(seed).standard_normal(out.shape).astype(out.dtype)
    if out.requires_grad:
        (out * tg.tensor(w)).sum().backward()
    grads = {n: None if p.grad is None else p.grad.numpy() for n, p in model.named_parameters()}
    return (
        out.detach().numpy(),
        out.dtype,
        out.requires_grad,
        grads,
        [None if x.grad is None else x.grad.numpy() for x in xs],
    )


def assert_same(got, want, what):
    (go, gd, gr, gp, gx), (wo, wd, wr, wp, wx) = got, want
    assert (gd, gr) == (wd, wr), f"{what}: dtype/requires_grad {(gd, gr)}, eager {(wd, wr)}"
    np.testing.assert_allclose(go, wo, rtol=1e-6, atol=1e-6, err_msg=f"{what}: output")
    assert gp.keys() == wp.keys(), what
    for name in wp:
        assert (gp[name] is None) == (wp[name] is None), (
            f"{what}: {name}.grad is {'None' if gp[name] is None else 'set'}, eager mode's "
            f"{'None' if wp[name] is None else 'set'}"
        )
        if wp[name] is not None:
            np.testing.assert_allclose(gp[name], wp[name], rtol=1e-6, atol=1e-6, err_msg=name)
    for i, (a, b) in enumerate(zip(gx, wx)):
        assert (a is None) == (b is None), f"{what}: input {i}'s .grad differs from eager mode's"
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"input {i}")


# ----------------------------------------------------------------------------- every guard


class Triples(nn.Module):
    """A child whose forward branches on its own training flag."""

    def forward(self, y):
        return y * 3.0 if self.training else y


class Guarded(nn.Module):
    """Ops that read every kind of thing a guard covers, no two elementwise ones in a row
    (nothing to fuse: no kernel to build for each new signature)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inner = Triples()
        self.register_buffer("shift", tg.tensor(np.linspace(-1, 1, 4).astype(np.float32)))

    def forward(self, x, k=2.0, mode="add", s=1.0):
        # (softmax: its CPU kernel takes C-contiguous float32 arrays only)
        y = self.inner(self.lin(F.softmax(x.float(), dim=-1))) @ self.lin.weight
        y = (y * k) @ (self.lin.weight * s)
        return y + self.shift if mode == "add" else y - self.shift


def _arr(shape=(3, 4), dtype=np.float32, order="C", seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.asfortranarray(a) if order == "F" else a


def _swap(models, on, attr, owner, make):
    """owner(m).attr is a spare tensor (made once per model, the same values in both) when on,
    else the original one."""
    for m in models:
        spare = m.__dict__.setdefault("spares", {})
        if attr not in spare:
            spare[attr] = (getattr(owner(m), attr), make())
        setattr(owner(m), attr, spare[attr][1 if on else 0])


def _new_weight(models, on):
    w = np.random.default_rng(7).standard_normal((4, 4)).astype(np.float32)
    _swap(models, on, "weight", lambda m: m.lin, lambda: nn.Parameter(tg.tensor(w)))


def _new_shift(models, on):
    _swap(models, on, "shift", lambda m: m, lambda: tg.tensor(np.full(4, 0.5, np.float32)))


def _freeze(models, on):
    for m in models:
        m.lin.weight.requires_grad = not on


def _inner_eval(models, on):
    for m in models:
        m.inner.train(not on)


# name -> (inputs, kwargs, context) of a call that changes only that component (changed=True)
# from the base call (changed=False); the context's setup runs on both twins
VARIATIONS = {
    "input shape": lambda c, ms: ([(_arr((5, 4) if c else (3, 4)), False)], {}, None),
    "input dtype": lambda c, ms: ([(_arr(dtype=np.float64 if c else np.float32), False)], {}, None),
    "input contiguity": lambda c, ms: (
        [(_arr((2, 3, 4), order="F" if c else "C"), False)],
        {},
        None,
    ),
    "input requires_grad": lambda c, ms: ([(_arr(), c)], {}, None),
    "plain argument": lambda c, ms: ([(_arr(), False)], {"k": 5.0 if c else 2.0}, None),
    "string argument": lambda c, ms: ([(_arr(), False)], {"mode": "sub" if c else "add"}, None),
    "a keyword's name": lambda c, ms: ([(_arr(), False)], {"s" if c else "k": 5.0}, None),
    "grad mode": lambda c, ms: ([(_arr(), True)], {}, tg.no_grad() if c else None),
    "a submodule's training flag": lambda c, ms: ([(_arr(), False)], {}, _inner_eval(ms, c)),
    "a parameter's requires_grad": lambda c, ms: ([(_arr(), True)], {}, _freeze(ms, c)),
    "a parameter replaced": lambda c, ms: ([(_arr(), False)], {}, _new_weight(ms, c)),
    "a buffer replaced": lambda c, ms: ([(_arr(), False)], {}, _new_shift(ms, c)),
}


@pytest.mark.parametrize("first", ["base", "changed"])
@pytest.mark.parametrize("name", list(VARIATIONS))
def test_a_call_that_changes_one_guard_component_computes_what_eager_mode_does(name, first):
    """Calls of one kind (traced, then replayed), of the other, then of the first again, each
    kind first: every call equals eager mode's. A component left out of the signature
    replays a graph traced for another value of it (a parameter's gradient that stays None,
    a constant of the wrong value)."""
    compiled, eager = twins(Guarded)
    vary = VARIATIONS[name]
    a = first == "changed"
    for i, changed in enumerate([a] * 3 + [not a] * 3 + [a] * 2):
        inputs, kwargs, ctx = vary(changed, (compiled, eager))
        if not hasattr(ctx, "__enter__"):
            ctx = contextlib.nullcontext()
        with ctx:
            got = outcome(compiled, inputs, kwargs, seed=i)
            want = outcome(eager, inputs, kwargs, seed=i)
        assert_same(got, want, f"{name}, call {i} ({'changed' if changed else 'base'})")
    assert compiled_forward(compiled).summary()["compiled"] >= 1  # (it did replay)


# ----------------------------------------------------------------------------- requires_grad


@given(frozen=st.lists(st.sampled_from(["none", "weight", "bias", "both"]), min_size=4, max_size=8))
@example(frozen=["none", "none", "weight", "weight", "weight", "none", "none", "none"])
@example(frozen=["weight", "weight", "weight", "none", "none"])
def test_freezing_and_unfreezing_parameters_gives_eager_gradients(frozen):
    """Freeze and unfreeze parameters between calls (as fine-tuning does): every call's
    gradients are eager mode's, a frozen parameter's None, an unfrozen one's back."""
    compiled, eager = twins(Guarded)
    for i, which in enumerate(frozen):
        for m in (compiled, eager):
            m.lin.weight.requires_grad = which not in ("weight", "both")
            m.lin.bias.requires_grad = which not in ("bias", "both")
        inputs = [(_arr(seed=i), False)]
        assert_same(outcome(compiled, inputs, {}, i), outcome(eager, inputs, {}, i), f"call {i}")


@given(needs=st.lists(st.booleans(), min_size=4, max_size=8))
@example(needs=[False, False, False, True, True])
@example(needs=[True, True, True, False, True])
def test_an_input_gets_its_gradient_whether_or_not_it_was_traced_with_one(needs):
    """An input traced without requires_grad, then passed with it (and back), gets its .grad
    on every call that asks for one, as in eager mode."""

    def f(x, w):
        return (x @ w).tanh() @ w

    w = tg.tensor(_arr((4, 4), seed=9), requires_grad=True)
    compiled = tg.compile(f)
    for i, rg in enumerate(needs):
        a = _arr(seed=i)
        got = tg.tensor(a, requires_grad=True) if rg else tg.Tensor(a)
        want = tg.tensor(a, requires_grad=True) if rg else tg.Tensor(a)
        w.grad = None
        compiled(got, w).sum().backward()
        gw = w.grad.numpy()
        w.grad = None
        f(want, w).sum().backward()
        np.testing.assert_allclose(gw, w.grad.numpy(), rtol=1e-6, atol=1e-6)
        assert (got.grad is None) == (want.grad is None), f"call {i}: x.grad is {got.grad}"
        if rg:
            np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- the limit


def test_the_signature_limit_is_exact():
    """MAX_SIGNATURES signatures compile (the last of them too); the one after runs eagerly,
    saying so once, and still computes what eager mode does."""

    def f(x):
        return x @ x.T

    compiled = tg.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)  # none while under the limit
        for n in range(1, MAX_SIGNATURES + 1):
            for _ in range(3):
                x = tg.Tensor(_arr((n, 3), seed=n))
                np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=1e-6)
    s = compiled.summary()
    assert s["compiled"] == MAX_SIGNATURES and s["eager"] == [], s
    with pytest.warns(CompileWarning, match="signature") as said:
        for _ in range(3):
            x = tg.Tensor(_arr((MAX_SIGNATURES + 1, 3)))
            np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=1e-6)
    assert len([w for w in said if issubclass(w.category, CompileWarning)]) == 1
    assert compiled.summary()["compiled"] == MAX_SIGNATURES


# ----------------------------------------------------------------------------- constants


class Dealer:
    """Deals the next value at each call: state no guard can see (an object's attributes are
    guarded, but this one's position lives in a C iterator), changed without an attribute set
    (an iterator read in a forward runs it eagerly by itself: this is a callable)."""

    def __init__(self, ks):
        self._it = iter(list(ks))

    def __call__(self):
        return next(self._it)


class ScalesByACounter(nn.Module):
    """Multiplies by np.full(3, k) with k dealt at each call."""

    def __init__(self, ks):
        super().__init__()
        self.lin, self.ks = nn.Linear(3, 3), Dealer(ks)

    def forward(self, x):
        return self.lin(x) * np.full(3, self.ks(), np.float32)


@given(
    start=st.sampled_from([1.0, 3.0, -2.0]),
    steps=st.lists(st.sampled_from([-3.0, 1.0, 2.0, 3.0]), min_size=3, max_size=7),
)
@example(start=3.0, steps=[3.0, 3.0, 3.0])  # 3, 6, 9, 12
def test_a_constant_array_that_changes_every_call_runs_eagerly(start, steps):
    """k changes on every call (read from a counter): its two traces differ in a constant's
    value only, so the forward runs eagerly and every call equals eager mode's (a check by
    shape and dtype alone replays the first k)."""
    ks = [start]
    for d in steps:
        ks.append(ks[-1] + d)
    compiled, eager = twins(lambda: ScalesByACounter(ks))
    with pytest.warns(CompileWarning, match="constants changed"):
        for i, k in enumerate(ks):
            inputs = [(_arr((2, 3), seed=i), False)]
            assert_same(outcome(compiled, inputs, {}, i), outcome(eager, inputs, {}, i), f"k={k}")
    assert compiled_forward(compiled).summary()["compiled"] == 0


def test_a_constant_array_equal_in_value_still_compiles():
    """A new array each call, of the same value: compared by value, the graph is replayed."""
    compiled, eager = twins(lambda: ScalesByACounter([3.0] * 5))
    for i in range(5):
        inputs = [(_arr((2, 3), seed=i), False)]
        assert_same(outcome(compiled, inputs, {}, i), outcome(eager, inputs, {}, i), f"call {i}")
    assert compiled_forward(compiled).summary()["compiled"] == 1
