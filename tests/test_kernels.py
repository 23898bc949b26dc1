"""The kernel registry test: every registered kernel against its reference op.

A kernel is tested by being registered: for each kernel of ``tensorgrad.kernels`` on the
'cpu' device (and on 'cuda' where a GPU and CuPy are present: the GPU check runs this file)
and each case of its op that its predicate accepts, the forward output, the
gradient of every input, their dtypes, and the memory the op keeps for backward are
compared with the reference op run on the same inputs. An op registered without cases
here fails ``test_every_registered_op_has_cases``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import recomputed_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorgrad as tg
from tensorgrad import kernels
from tensorgrad.autograd import Op
from tensorgrad.ops.nn import Embedding, Gelu, Softmax
from tensorgrad.optim import adamw_foreach, adamw_update

# the ops with cases here, each against the reference the registry names (kernels.REFERENCES)
OPS = ("softmax", "log_softmax", "cross_entropy", "layer_norm", "add_layer_norm", "gelu")
REFERENCE = {op: kernels.reference(op) for op in (*OPS, "embedding", "attention")}
# (relative, absolute) tolerance per dtype: kernels reorder float32 sums
TOL = {np.float32: (2e-5, 2e-6), np.float64: (1e-12, 1e-13)}


def _r(rng, *shape, scale=1.0, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def cases(op: str, dtype=np.float32, seed: int = 0):
    """(label, positional arrays, keywords) for one op; arrays of float dtype get gradients."""
    r = np.random.default_rng(seed)
    R = lambda *s, scale=1.0: _r(r, *s, scale=scale, dtype=dtype)  # noqa: E731
    if op in ("softmax", "log_softmax"):
        return [
            ("rows", (R(7, 33),), {"dim": -1}),
            ("one_col", (R(4, 1),), {"dim": -1}),
            ("3d", (R(2, 3, 300, scale=30),), {"dim": 2}),
            ("dim0", (R(5, 6),), {"dim": 0}),
            ("huge_logits", (R(3, 8, scale=1e4),), {"dim": -1}),
        ]
    if op == "cross_entropy":
        t = np.array([0, 3, 49, 7, 3, 1])
        return [
            ("mean", (R(6, 50), t), {}),
            ("ignore", (R(6, 50), t), {"ignore_index": 3}),
            ("sum", (R(6, 50, scale=1e4), t), {"reduction": "sum"}),
            ("none", (R(6, 50), t), {"reduction": "none"}),
            ("one_row", (R(1, 5), np.array([4])), {}),
        ]
    if op == "layer_norm":
        return [
            ("affine", (R(5, 37), R(37), R(37)), {}),
            ("no_bias", (R(2, 3, 16), R(16), None), {}),
            ("no_affine", (R(4, 9), None, None), {}),
            ("two_dims", (R(2, 3, 5), R(3, 5), R(3, 5)), {"nd": 2}),
            ("one_row_far_from_0", (R(1, 64) + 100, R(64), R(64)), {}),
        ]
    if op == "add_layer_norm":  # (tensorgrad.compile makes it of x + a, then LayerNorm)
        return [
            ("affine", (R(5, 37), R(5, 37), R(37), R(37)), {}),
            ("no_affine", (R(2, 3, 16), R(2, 3, 16), None, None), {}),
            ("two_dims", (R(2, 3, 5), R(2, 3, 5), R(3, 5), R(3, 5)), {"nd": 2}),
            ("far_from_0", (R(3, 64) + 100, R(3, 64), R(64), R(64)), {"eps": 1e-3}),
        ]
    if op == "gelu":
        return [
            ("tanh", (R(7, 9, scale=3),), {"approximate": "tanh"}),
            ("erf", (R(7, 9, scale=3),), {"approximate": "none"}),
            ("big", (R(3, 50000),), {"approximate": "tanh"}),
        ]
    if op == "embedding":
        return [
            ("repeats", (R(9, 5), np.array([[0, 4, 0], [8, 8, 2]])), {}),
            ("one", (R(3, 2), np.array([1])), {}),
        ]
    if op == "attention":
        causal_kw = {"is_causal": True}
        mask = r.random((5, 7)) > 0.4
        mask[1] = False  # a query that sees no key: zeros
        return [
            ("causal", (R(2, 3, 8, 4), R(2, 3, 8, 4), R(2, 3, 8, 4), None), causal_kw),
            ("full", (R(2, 5, 4), R(2, 7, 4), R(2, 7, 4), None), {}),
            ("L<S causal", (R(1, 2, 3, 4), R(1, 2, 9, 4), R(1, 2, 9, 4), None), causal_kw),
            ("bool_mask", (R(1, 5, 4), R(1, 7, 4), R(1, 7, 4), mask), {}),
            ("additive", (R(2, 4, 4), R(2, 4, 4), R(2, 4, 4), R(4, 4)), {"scale": 0.3}),
            ("broadcast_kv", (R(2, 3, 6, 4), R(1, 3, 6, 4), R(2, 1, 6, 4), None), causal_kw),
        ]
    return []


def _as_tensors(arrays, device):
    """Float arrays become tensors that require grad; int / bool arrays move to the device."""

    def one(a):
        if not isinstance(a, np.ndarray):
            return a
        if a.dtype.kind != "f":
            return tg.to_device(a.copy(), device)
        return tg.tensor(a.copy(), dtype=a.dtype, device=device, requires_grad=True)

    return [one(a) for a in arrays]


def _kept_bytes(fn: Op, inputs) -> int:
    """Bytes of the arrays an op keeps for backward, not counting its inputs' own memory."""
    ins = [t.array for t in inputs if isinstance(t, tg.Tensor)]

    def arrays(v):
        if hasattr(v, "nbytes") and hasattr(v, "dtype"):
            yield v
        elif isinstance(v, (tuple, list)):
            for x in v:
                yield from arrays(x)

    def shares(a, x):
        return tg.get_array_module(a).may_share_memory(a, x)

    return sum(
        a.nbytes
        for key, v in fn.__dict__.items()
        if key != "replay"  # the input arrays themselves, to replay the reference if need be
        for a in arrays(v)
        if not any(shares(a, x) for x in ins)
    )


def run(ref, arrays, kw, device="cpu", g_seed=1):
    """Output, input gradients and kept bytes of ``ref.apply`` (whatever implementation runs)."""
    ts = _as_tensors(arrays, device)
    outs = ref.apply(*ts, **kw)
    outs = outs if isinstance(outs, tuple) else (outs,)
    kept = _kept_bytes(outs[0]._node, ts)
    rng = np.random.default_rng(g_seed)
    loss = 0
    for out in outs:  # a weighted sum of every output
        w = rng.standard_normal(out.shape).astype(out.dtype)
        loss = loss + (out * tg.tensor(w, device=device)).sum()
    loss.backward()
    out = outs[0] if len(outs) == 1 else tg.cat([o.reshape(-1) for o in outs])
    return (
        out,
        [t.grad if isinstance(t, tg.Tensor) else None for t in ts],
        kept,
        type(outs[0]._node),
    )


def check_kernel(name: str, op: str, label: str, arrays, kw, device="cpu"):
    ref = REFERENCE[op]
    with kernels.reference_only():
        want, want_g, want_kept, want_impl = run(ref, arrays, kw, device)
    with kernels.only(name):
        got, got_g, got_kept, impl = run(ref, arrays, kw, device)
    assert want_impl is ref
    what = f"{name} on {op} case {label!r}"
    assert impl is not ref, f"{what}: the kernel did not run"
    dt = arrays[0].dtype.type
    rtol, atol = TOL[dt]
    scale = max(1.0, float(np.abs(want.detach().numpy()).max(initial=0)))
    assert got.dtype == want.dtype, f"{what}: output dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(
        got.detach().numpy(),
        want.detach().numpy(),
        rtol=rtol,
        atol=atol * scale,
        err_msg=f"{what}: forward",
    )
    for i, (g, w) in enumerate(zip(got_g, want_g)):
        if w is None:
            assert g is None, f"{what}: input {i} got a gradient the reference does not give"
            continue
        assert g is not None and g.dtype == w.dtype, f"{what}: input {i} gradient dtype"
        gs = max(1.0, float(np.abs(w.detach().numpy()).max(initial=0)))
        np.testing.assert_allclose(
            g.detach().numpy(),
            w.detach().numpy(),
            rtol=10 * rtol,
            atol=10 * atol * gs,
            err_msg=f"{what}: gradient of input {i}",
        )
    assert got_kept <= want_kept + recomputed_bytes(op, arrays), (
        f"{what}: keeps {got_kept} bytes for backward, the reference {want_kept} (and "
        f"recomputes {recomputed_bytes(op, arrays)})"
    )


CPU = [k for k in kernels.registered(device="cpu") if k.op in REFERENCE]
CUDA = [
    pytest.param(k, marks=pytest.mark.cuda, id=k.name)
    for k in kernels.registered(device="cuda")
    if k.op in REFERENCE
]


def test_every_registered_op_has_cases():
    for k in kernels.registered():
        # gpt2_block's reference is a composition, not one Op: tests/test_kernels_block.py
        known = ("adamw", "adamw_foreach", "matmul", "gpt2_block")
        assert k.op in REFERENCE or k.op in known, f"{k.name}: no cases for {k.op}"
        if k.op in REFERENCE:
            assert cases(k.op), f"{k.name}: no cases for {k.op}"


# kernels whose predicates take float32 only (numba's exp32 and float32 accumulators):
# at float64 they skip, saying so; every other kernel must run cases at both dtypes
FLOAT32_ONLY = {
    "cpu.numba.softmax",
    "cpu.numba.log_softmax",
    "cpu.numba.cross_entropy",
    "cpu.numba.gelu",
    "cpu.numba.flash_attention",
}


@pytest.mark.parametrize("kernel", CPU, ids=[k.name for k in CPU])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_matches_reference(kernel, dtype):
    if dtype == np.float64 and kernel.name in FLOAT32_ONLY:
        for label, arrays, kw in cases(kernel.op, dtype):  # still true of its predicate?
            assert not kernel.when(*arrays, **kw), f"{kernel.name} takes float64 {label}"
        # nothing to install: by design (its predicate refuses float64, asserted above)
        pytest.skip(f"{kernel.name} takes float32 only, by design: no float64 row to compare")
    ran = 0
    for label, arrays, kw in cases(kernel.op, dtype):
        if kernel.when is None or kernel.when(*arrays, **kw):
            check_kernel(kernel.name, kernel.op, label, arrays, kw)
            ran += 1
    what = np.dtype(dtype).name
    assert ran, f"{kernel.name}: its predicate accepted none of the {what} {kernel.op} cases"


@pytest.mark.parametrize("kernel", CUDA)
def test_cuda_kernel_matches_reference(kernel):
    if not tg.cuda.is_available():
        pytest.skip(tg.cuda.unavailable_reason())
    ran = 0
    for label, arrays, kw in cases(kernel.op, np.float32):
        on_gpu = [tg.to_device(a, "cuda") if isinstance(a, np.ndarray) else a for a in arrays]
        if kernel.when is None or kernel.when(*on_gpu, **kw):
            check_kernel(kernel.name, kernel.op, label, arrays, kw, device="cuda")
            ran += 1
    assert ran, f"{kernel.name}: its predicate accepted none of the {kernel.op} cases"


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_row_kernels_on_drawn_shapes(rows, cols, seed):
    r = np.random.default_rng(seed)
    x = (r.standard_normal((rows, cols)) * 3).astype(np.float32)
    w, b = r.standard_normal(cols).astype(np.float32), r.standard_normal(cols).astype(np.float32)
    t = r.integers(0, cols, rows)
    drawn = {
        "softmax": ((x,), {"dim": -1}),
        "log_softmax": ((x,), {"dim": -1}),
        "layer_norm": ((x, w, b), {}),
        "add_layer_norm": ((x, x[::-1].copy(), w, b), {}),
        "gelu": ((x,), {"approximate": "tanh"}),
        "cross_entropy": ((x, t), {}),
        "embedding": ((x, r.integers(0, rows, 7)), {}),
    }
    for k in CPU:
        if k.op in drawn:
            arrays, kw = drawn[k.op]
            if k.when is None or k.when(*arrays, **kw):
                check_kernel(k.name, k.op, f"drawn ({rows}, {cols})", arrays, kw)


@pytest.mark.parametrize("seed", range(12))
def test_layer_norm_kernel_over_one_feature(seed):
    """A LayerNorm over one feature has x̂ = 0 and an input gradient of exactly 0; a float32
    kernel whose ĝ - mean(ĝ) is contracted into an FMA leaves g·w's rounding error times
    1/sqrt(eps) there (hypothesis drew it once in a third of seeds: a fixed case now)."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal((34, 1)) * 3).astype(np.float32)
    w, b = r.standard_normal(1).astype(np.float32), r.standard_normal(1).astype(np.float32)
    for k in CPU:
        if k.op == "layer_norm" and (k.when is None or k.when(x, w, b)):
            check_kernel(k.name, k.op, f"one feature, seed {seed}", (x, w, b), {})


ADAMW = [k for k in kernels.registered("adamw", "cpu")]


@pytest.mark.parametrize("kernel", ADAMW, ids=[k.name for k in ADAMW])
@pytest.mark.parametrize("wd, step, n", [(0.0, 1, 10), (0.1, 7, 300_001)])
def test_adamw_kernel_matches_reference(kernel, wd, step, n):
    r = np.random.default_rng(step)
    x, g = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
    m, v = x * 0.1, np.abs(g) * 0.01
    hp = {"lr": 3e-4, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": wd, "step": step}
    want = [a.copy() for a in (x, m, v)]
    adamw_update(want[0], g, want[1], want[2], **hp)
    got = [a.copy() for a in (x, m, v)]
    assert kernel.when(*got[:1], g, *got[1:])
    kernel.impl(got[0], g, got[1], got[2], **hp)
    for a, b, name in zip(got, want, ("param", "exp_avg", "exp_avg_sq")):
        # float32 rounding: a kernel may keep intermediates in float64 (numba does)
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7, err_msg=f"{kernel.name}: {name}")


FOREACH = [k for k in kernels.registered("adamw_foreach", "cpu")]


@pytest.mark.parametrize("kernel", FOREACH, ids=[k.name for k in FOREACH])
def test_adamw_foreach_kernel_matches_reference(kernel):
    """A list longer than one compiled batch, mixed dtypes, sizes from one element to past
    the threaded kernel's threshold, a transposed gradient, each with its own keywords."""
    r = np.random.default_rng(0)
    shapes = [(1,), (3, 4), (0,), (7,), (300_001,)] + [(i + 2,) for i in range(20)] + [(5, 3)]
    xs, gs, hyper = [], [], []
    for i, shape in enumerate(shapes):
        dt = np.float64 if i % 3 == 1 else np.float32
        xs.append(r.standard_normal(shape).astype(dt))
        g = r.standard_normal(shape[::-1]).astype(dt)
        gs.append(g.T if len(shape) == 2 and i % 2 else g.reshape(shape))
        hyper.append({"lr": 1e-3 * (i + 1), "b1": 0.9, "b2": 0.95 + 0.001 * (i % 4),
                      "eps": 1e-8, "wd": 0.1 * (i % 2), "step": 1 + i % 5})  # fmt: skip
    ms = [x * 0.1 for x in xs]
    vs = [np.abs(g) * 0.01 + 0 * x for g, x in zip(gs, xs)]
    vs = [np.ascontiguousarray(v) for v in vs]
    want = [[a.copy() for a in arrays] for arrays in (xs, ms, vs)]
    adamw_foreach(want[0], gs, want[1], want[2], hyper)
    got = [[a.copy() for a in arrays] for arrays in (xs, ms, vs)]
    assert kernel.when(got[0], gs, got[1], got[2], hyper)
    kernel.impl(got[0], gs, got[1], got[2], hyper)
    for a_list, b_list, name in zip(got, want, ("param", "exp_avg", "exp_avg_sq")):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            np.testing.assert_allclose(
                a, b, rtol=2e-5, atol=1e-7, err_msg=f"{kernel.name}: {name} {i} {shapes[i]}"
            )


def test_adamw_foreach_kernel_declines_what_it_cannot_update_in_place():
    (kernel,) = FOREACH
    x = np.zeros((4, 3), np.float32)
    ok = [x], [np.ones_like(x)], [np.zeros_like(x)], [np.zeros_like(x)], [{}]
    assert kernel.when(*ok)
    assert not kernel.when([x], [np.ones_like(x)], [np.zeros((3, 4), np.float32).T], ok[3], [{}])
    assert not kernel.when([x], [np.ones(12, np.float32)], ok[2], ok[3], [{}])
    assert not kernel.when([x], [np.ones_like(x, np.float64)], ok[2], ok[3], [{}])
    assert not kernel.when([x.astype(np.float16)], *ok[1:])


def test_embedding_kernels_refuse_a_bad_id_as_the_reference_does():
    w = np.zeros((5, 2), np.float32)
    for bad, message in ((np.array([0, 5]), "index 5 "), (np.array([[-1, 2]]), "index -1 ")):
        for impl in [Embedding] + [k.impl for k in CPU if k.op == "embedding"]:
            with pytest.raises(IndexError, match=f"embedding: {message}is out of range for 5"):
                impl().forward(w, bad)


# ----------------------------------------------------------------------------- the registry


def test_a_wrong_kernel_is_caught(monkeypatch):
    """A kernel whose gradient is off by a factor fails the registry check."""
    monkeypatch.setattr(kernels, "_registry", {k: list(v) for k, v in kernels._registry.items()})

    @kernels.register(
        "softmax", "cpu", name="test.wrong_softmax", when=lambda x, dim=-1: dim in (-1, x.ndim - 1)
    )
    class WrongSoftmax(Op):
        def forward(self, x, dim=-1):
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            y = e / e.sum(axis=-1, keepdims=True)
            self.save(y)
            return y

        def backward(self, g):
            (y,) = self.saved
            return 2 * y * (g - (g * y).sum(axis=-1, keepdims=True))  # wrong: twice too big

    label, arrays, kw = cases("softmax")[0]
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_kernel("test.wrong_softmax", "softmax", label, arrays, kw)


def test_a_kernel_that_keeps_more_is_caught(monkeypatch):
    monkeypatch.setattr(kernels, "_registry", {k: list(v) for k, v in kernels._registry.items()})

    @kernels.register("gelu", "cpu", name="test.greedy_gelu")
    class GreedyGelu(Gelu):
        op = None

        def forward(self, x, approximate="tanh"):
            y = super().forward(x, approximate)
            self.save(x, x * 1.0, x * 2.0)  # keeps two activations it does not need
            return y

        def backward(self, g):
            self.saved = self.saved[:1]
            return super().backward(g)

    label, arrays, kw = cases("gelu")[0]
    with pytest.raises(AssertionError, match="keeps .* bytes for backward"):
        check_kernel("test.greedy_gelu", "gelu", label, arrays, kw)


def test_switches_and_listing(monkeypatch):
    monkeypatch.setattr(kernels, "_enabled", True)  # also under TG_KERNELS=0
    names = [k.name for k in kernels.registered()]
    assert "cpu.chunked.softmax" in names and "cuda.flash_attention" in names
    x = tg.randn(3, 4, requires_grad=True)
    assert type(tg.nn.functional.softmax(x)._node) is not Softmax  # a kernel ran
    with kernels.reference_only():
        assert type(tg.nn.functional.softmax(x)._node) is Softmax
    kernels.set_enabled(False, ["softmax"])
    try:
        assert not kernels.is_enabled("softmax")
        assert type(tg.nn.functional.softmax(x)._node) is Softmax
    finally:
        kernels.set_enabled(True, ["softmax"])
    assert type(tg.nn.functional.softmax(x)._node) is not Softmax
    with pytest.raises(ValueError, match="unknown kernels"):
        kernels.set_enabled(False, ["no_such_kernel"])
    for wrong in ("softmax", "cpu.numba.softmx"):  # an op's name, a typo: not silently none
        with pytest.raises(ValueError, match="unknown kernel"), kernels.only(wrong):
            pass
    with pytest.raises(ValueError, match="already registered"):
        kernels.register("softmax", "cpu", name="cpu.chunked.softmax")(object)


# ----------------------------------------------------------------------------- the registry


def test_every_kernel_names_a_reference_beside_the_registry():
    """kernels.REFERENCES maps each op to its reference; a kernel of an op without one is
    refused at registration, so every kernel has an oracle."""
    for k in kernels.registered():
        assert kernels.reference(k.op) is not None, k.name
    with pytest.raises(ValueError, match="no reference for op 'no_such_op'"):
        kernels.register("no_such_op", "cpu", name="test.nothing")(object)


def specs(arrays) -> list:
    """Each array as a kernels.Spec: its shape, dtype and layout, and no values."""
    return [
        kernels.Spec(a.shape, a.dtype, a.flags.c_contiguous) if isinstance(a, np.ndarray) else a
        for a in arrays
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_which_answers_from_shapes_dtypes_and_layouts_alone(dtype, monkeypatch):
    """kernels.which(op, ...) names what Op.apply runs, and it answers the same from Specs:
    a condition reads shapes, dtypes and layouts, never values (one that did fails here)."""
    monkeypatch.setattr(kernels, "_enabled", True)  # (also under TG_KERNELS=0)
    impl_of = {k.name: k.impl for k in kernels.registered()}
    strided = np.zeros((4, 6), dtype)[:, ::2]
    extra = [("softmax", "strided", (strided,), {"dim": -1})]
    checked = 0
    for op, label, arrays, kw in [(o, *c) for o in OPS for c in cases(o, dtype)] + extra:
        picked = kernels.pick(op, "cpu", *arrays, **kw)
        for args in (arrays, specs(arrays)):
            name = kernels.which(op, *args, **kw)
            got = None if name == "reference" else impl_of[name]
            assert got is picked, f"{op} {label}: which says {name}, apply runs {picked}"
        checked += picked is not None
    assert checked > 10
    x = tg.randn(3, 8)
    assert kernels.which("softmax", x, dim=-1) == kernels.which(
        "softmax", kernels.Spec((3, 8)), dim=-1
    )
    with kernels.reference_only():
        assert kernels.which("softmax", x, dim=-1) == "reference"
    # the device is the first argument's, as Op.apply takes it
    on_gpu = kernels.Spec((4, 8), device="cuda")
    assert kernels.which("softmax", on_gpu, dim=-1) == "cuda.softmax"


def test_priority_decides_not_the_order_of_registration(monkeypatch):
    """The kernel of highest priority that applies runs, whichever was registered first."""
    monkeypatch.setattr(kernels, "_enabled", True)
    monkeypatch.setattr(kernels, "_registry", {k: list(v) for k, v in kernels._registry.items()})

    class High(Softmax):
        pass

    class Low(Softmax):
        pass

    kernels.register("softmax", "cpu", name="test.high", priority=99, takes="any")(High)
    kernels.register("softmax", "cpu", name="test.low", priority=-1, takes="any")(Low)
    assert kernels.which("softmax", kernels.Spec((2, 3)), dim=-1) == "test.high"
    assert [k.name for k in kernels.registered("softmax", "cpu")][0] == "test.high"
    assert [k.name for k in kernels.registered("softmax", "cpu")][-1] == "test.low"


def test_the_docs_print_the_table_the_registry_makes():
    """docs/internals.md holds kernels.table('cpu') as the code generates it."""
    pytest.importorskip("numba", reason="the table lists the numba kernels: pip install numba")
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "internals.md").read_text("utf-8")
    table = kernels.table("cpu")
    assert table.count("\n") > 15
    assert table in page, "docs/internals.md: paste kernels.table('cpu') again:\n" + table


NO_NUMBA = """
import json, sys
sys.modules["numba"] = None  # as where numba has no wheel, or is uninstalled
import numpy as np
import tensorgrad as tg
from tensorgrad import kernels
from gpt.model import GPT, GPTConfig

x = tg.randn(4, 8, requires_grad=True)
(tg.nn.functional.softmax(x, dim=-1) ** 2).sum().backward()
model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8))
idx = tg.randint(0, 11, (2, 8))
eager = model(idx, idx)[1]
step = tg.compile(model)
losses = [float(step(idx, idx)[1]) for _ in range(3)]
print(json.dumps({
    "softmax": kernels.which("softmax", x, dim=-1),
    "tiers": sorted({k.name.rsplit(".", 1)[0] for k in kernels.registered(device="cpu")}),
    "finite": bool(np.isfinite(x.grad.numpy()).all()),
    "compiled_is_eager": all(loss == float(eager) for loss in losses),
}))
"""


def test_without_numba_the_numpy_tier_runs():
    """Without numba nothing numba-made is registered and the NumPy tier (cpu_chunked.py) is
    what runs: an op, its gradient, and a compiled GPT step equal to the eager one."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "TG_KERNELS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", NO_NUMBA], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "softmax": "cpu.chunked.softmax",
        "tiers": ["cpu.chunked", "cpu.inplace", "cpu.sorted"],
        "finite": True,
        "compiled_is_eager": True,
    }
