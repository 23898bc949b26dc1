"""The numba CPU kernels (tensorgrad.kernels.cpu_numba) against their reference ops.

Each case runs a kernel's forward and backward on float32 arrays and the reference
Function (under ``reference_only()``) on float64 copies of the same arrays, with the same
upstream gradient, and compares the two: forward and every gradient within
``atol·max(1, max|ref|) + rtol·|ref|`` (stated per op; NaN must match NaN). Kernels that
also take float64 (LayerNorm, AdamW) are held to 1e-12 there. Every case also checks that
the kernel keeps no more memory for backward than the reference run on the same float32
arrays (the bytes of the distinct arrays a Function holds after forward). Skipped without
numba.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

numba = pytest.importorskip("numba", reason="numba is not installed: pip install numba")

from helpers import assert_close, recomputed_bytes

from tensorgrad import kernels
from tensorgrad.kernels import cpu_blas
from tensorgrad.kernels import cpu_numba as K
from tensorgrad.kernels import cpu_numba_adamw as KW
from tensorgrad.kernels import cpu_numba_attention as KA
from tensorgrad.kernels import numba_math as M
from tensorgrad.kernels.numba_math import (
    EXP_LO,
    EXP_ULP,
    exp32_array,
    exp32_nonpos_array,
    rdot,
    rdot2dev,
    rmax,
    rsqdev,
    rsum,
)
from tensorgrad.ops import nn as R
from tensorgrad.optim import adamw_update

TOL = {  # (atol, rtol) of float32 kernels against the float64 reference
    "softmax": (2e-6, 1e-5),
    "log_softmax": (4e-6, 1e-5),
    "cross_entropy": (4e-6, 1e-5),
    "layer_norm": (4e-6, 1e-5),
    "gelu": (2e-6, 1e-5),
    "attention": (4e-6, 1e-5),
}


# ----------------------------------------------------------------------------- helpers


def kept_bytes(fn) -> int:
    """Bytes of the distinct arrays (views count as their base) a Function holds."""
    seen, total = set(), 0

    def walk(v):
        nonlocal total
        if isinstance(v, np.ndarray):
            base = v
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
        elif isinstance(v, (tuple, list)):
            for u in v:
                walk(u)

    for v in vars(fn).values():
        walk(v)
    return total


def run(cls, arrays, kw, g=None, seed=1):
    """(Function, forward output, gradients tuple, upstream gradient) of one fwd + bwd."""
    fn = cls()
    # copies (a kernel must not write its inputs), but strided views stay views
    y = fn.forward(
        *[a.copy() if isinstance(a, np.ndarray) and a.flags.c_contiguous else a for a in arrays],
        **kw,
    )
    if g is None:
        g = np.random.default_rng(seed).standard_normal(np.shape(y))
    grads = fn.backward(np.asarray(g, dtype=y.dtype))
    return fn, y, grads if isinstance(grads, tuple) else (grads,), g


def check(op, ref, ker, arrays, kw=None, tol=None, slack=0):
    """Kernel (float32 inputs as given) against the reference on float64 copies, and the
    kernel's kept memory against the reference's on the same float32 inputs (+ slack)."""
    kw = kw or {}
    atol, rtol = tol or TOL[op]
    shapes = ", ".join(str(np.shape(a)) for a in arrays if a is not None)
    kfn, y, grads, g = run(ker, arrays, kw)
    wide = [
        a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
        for a in arrays
    ]
    with kernels.reference_only():
        _, ry, rgrads, _ = run(ref, wide, kw, g)
        rfn32 = run(ref, arrays, kw, g)[0]
    assert y.dtype == arrays[0].dtype, f"{op} on ({shapes}): dtype {y.dtype}"
    scale = max(1.0, float(np.max(np.abs(ry), where=~np.isnan(ry), initial=0)))
    assert_close(y, ry, atol * scale, rtol, what=f"{op} forward on ({shapes}) {kw}")
    # (today's functional.CrossEntropy returns gx alone; core v2 returns (gx, None))
    rgrads = rgrads + (None,) * (len(grads) - len(rgrads))
    assert len(grads) == len(rgrads), f"{op}: {len(grads)} gradients, expected {len(rgrads)}"
    for i, (a, b) in enumerate(zip(grads, rgrads)):
        if b is None:
            assert a is None, f"{op}: gradient {i} should be None"
            continue
        scale = max(1.0, float(np.max(np.abs(b), where=~np.isnan(b), initial=0)))
        assert_close(a, b, atol * scale, rtol, what=f"{op} gradient {i} on ({shapes}) {kw}")
    kb, rb = kept_bytes(kfn), kept_bytes(rfn32) + recomputed_bytes(op, arrays)
    assert kb <= rb + slack, f"{op} on ({shapes}): kernel keeps {kb} bytes, reference {rb}"
    return y


def f32(shape, lo=-3.0, hi=3.0):
    return hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, width=32))


rows_cols = st.tuples(st.integers(1, 6), st.integers(1, 70))


# ----------------------------------------------------------------------------- exp32


def test_exp32_ulp_bound():
    g = np.random.default_rng(0)
    x = np.concatenate(
        [
            g.uniform(-87.3, 88.7, 2_000_000),
            g.uniform(-1, 1, 500_000),
            [0.0, -0.0, 1e-30, -1e-30, 88.72, -87.33],
        ]
    ).astype(np.float32)
    got = np.empty_like(x)
    exp32_array(x, got)
    want = np.exp(x.astype(np.float64))
    ulp = np.abs(got - want) / np.spacing(want.astype(np.float32)).astype(np.float64)
    k = int(np.argmax(ulp))
    assert ulp[k] <= EXP_ULP, f"exp32({x[k]!r}) = {got[k]!r}, exact {want[k]!r}: {ulp[k]} ulp"


def test_exp32_nonpos_is_exp32_bit_for_bit_where_x_is_not_positive():
    g = np.random.default_rng(1)
    x = np.concatenate(
        [-g.exponential(8.0, 1_000_000), [0.0, -0.0, -1e-30, EXP_LO, -87.34, -88, -1e4, -np.inf]]
    ).astype(np.float32)
    x = np.append(x, np.float32(np.nan))
    want, got = np.empty_like(x), np.empty_like(x)
    exp32_array(x, want)
    exp32_nonpos_array(x, got)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_exp32_special_values():
    x = np.array([np.inf, -np.inf, np.nan, 89.0, 1e4, -1e4, EXP_LO - 1, -88.0], np.float32)
    got = np.empty_like(x)
    exp32_array(x, got)
    assert got[0] == np.inf and got[1] == 0 and np.isnan(got[2]) and got[3] == np.inf
    assert got[4] == np.inf and got[5] == 0 and got[6] == 0
    assert got[7] < 1.2e-38  # flushed (NumPy: a subnormal)


@given(
    st.lists(
        st.floats(width=32) | st.sampled_from([0.0, -0.0, np.inf, -np.inf, 3e38, -3e38, 1e-45]),
        max_size=40,
    )
)
def test_rmax_is_max_through_bits(v):
    x = np.array(v, np.float32)
    got = rmax(x)
    if np.isnan(x).any():  # a NaN is either returned or skipped; the row's sum carries it
        assert np.isnan(got) or got == np.max(x[~np.isnan(x)], initial=-np.inf)
        return
    assert got == np.max(x, initial=-np.inf)
    if got == 0:  # +0 where x holds one, else -0
        assert np.signbit(got) == (not ((x == 0) & ~np.signbit(x)).any())


@numba.njit(error_model="numpy", fastmath={"contract"})
def _row_sums(a, b, c, m):
    return (rsum(a), rdot(a, b), rsqdev(a, m), *rdot2dev(a, b, c, m))


def _in_order(n, dt, term):
    """numba_math's row-sum order, one element at a time in Python: UNROLL partial sums of W
    lanes over whole blocks, leftover vectors into the first, pairwise, lanes halved, tail."""
    W, U, zero = M.LANE_BYTES // np.dtype(dt).itemsize, M.UNROLL, dt(0)
    acc = [[zero] * W for _ in range(U)]
    j = 0
    for _ in range(n // (U * W)):
        for u in range(U):
            acc[u] = [term(j + k, acc[u][k]) for k in range(W)]
            j += W
    while j + W <= n:
        acc[0] = [term(j + k, acc[0][k]) for k in range(W)]
        j += W
    tail = zero
    for i in range(j, n):
        tail = term(i, tail)
    v = [(p + q) + (r + s) for p, q, r, s in zip(*acc)]
    while len(v) > 1:
        v = [v[k] + v[k + len(v) // 2] for k in range(len(v) // 2)]
    return v[0] + tail


@pytest.mark.parametrize("dts", [("f4", "f4"), ("f8", "f8"), ("f4", "f8")])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 100, 129, 200])
def test_row_sums_add_in_the_order_their_code_states(n, dts):
    """rsum, rdot, rsqdev, rdot2dev: vector code in a fixed order (no reassociation, so that a
    kernel compiled in the process and one loaded from numba's cache agree: issue 49), the
    same bits as that order computed one element at a time; a float32 row with a float64
    one sums in float64."""
    from fractions import Fraction

    g = np.random.default_rng(n)
    a, c = (g.standard_normal(n).astype(dts[0]) for _ in range(2))
    b = g.standard_normal(n).astype(dts[1])
    dt = np.result_type(a, b).type
    m = dt(0.3)

    def fma(x, y, z):  # x·y + z rounded once, to the nearest of z's type (ties to even)
        t, exact = type(z), Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        near = t(float(exact))  # (through float64: a float32 may be one off, so look around)
        around = [np.nextafter(near, t(-np.inf)), near, np.nextafter(near, t(np.inf))]
        odd = {np.float32: np.int32, np.float64: np.int64}[t]
        return min(around, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(odd)) & 1))

    A, B, C = a.astype(dt), b.astype(dt), c.astype(dt)
    ta = a.dtype.type  # rsum and rsqdev see a alone (and m in a's dtype)
    want = (
        _in_order(n, ta, lambda j, s: s + a[j]),
        _in_order(n, dt, lambda j, s: fma(A[j], B[j], s)),
        _in_order(n, ta, lambda j, s: fma(a[j] - ta(m), a[j] - ta(m), s)),
        _in_order(n, dt, lambda j, s: s + A[j] * B[j]),
        _in_order(n, dt, lambda j, s: fma(A[j] * B[j], C[j] - m, s)),
    )
    got = _row_sums(a, b, c, m)
    assert [float(x) for x in got] == [float(x) for x in want]
    AB = A @ B
    exact = (np.sum(A, dtype=np.float64), AB, ((A - m) ** 2).sum(), AB, (A * B * (C - m)).sum())
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * max(1, n))


# ----------------------------------------------------------------------------- softmax family


@given(rows_cols.flatmap(lambda s: f32(s)))
def test_softmax(x):
    check("softmax", R.Softmax, K.NumbaSoftmax, [x])
    check("log_softmax", R.LogSoftmax, K.NumbaLogSoftmax, [x])


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (3, 1), (2, 3, 4, 33)])
def test_softmax_shapes(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    check("softmax", R.Softmax, K.NumbaSoftmax, [x])
    check("log_softmax", R.LogSoftmax, K.NumbaLogSoftmax, [x])


def test_softmax_large_logits():
    x = np.array([[1e4, -1e4, 0, 1e4 - 1], [-1e4, -1e4 + 3, -1e4, -1e4]], np.float32)
    check("softmax", R.Softmax, K.NumbaSoftmax, [x])
    check("log_softmax", R.LogSoftmax, K.NumbaLogSoftmax, [x])


def test_softmax_nan_and_all_minus_inf_rows_are_nan():
    x = np.array([[-np.inf, -np.inf, 0], [0, np.nan, 1], [0, 1, 2]], np.float32)
    for cls in (K.NumbaSoftmax, K.NumbaLogSoftmax):
        y = cls().forward(x[1:] if cls is K.NumbaLogSoftmax else x)
        assert np.isnan(y[-2]).all() and np.isfinite(y[-1]).all(), cls.__name__
    assert np.isnan(K.NumbaSoftmax().forward(x[:1, :2])).all()  # as the reference: 0/0


# ----------------------------------------------------------------------------- cross-entropy


@given(
    rows_cols.flatmap(
        lambda s: st.tuples(
            f32(s, -8, 8),
            hnp.arrays(np.int64, s[0], elements=st.integers(-1, s[1] - 1)),
            st.sampled_from(["mean", "sum", "none"]),
        )
    )
)
def test_cross_entropy(args):
    x, t, reduction = args
    t = np.where(t < 0, -100, t)  # some rows ignored
    # the kernel keeps one float64 logsumexp per row and int32 targets (-1: ignored); the
    # reference (core v2) keeps int64 targets and a bool mask: at most 8 bytes per row more
    check(
        "cross_entropy",
        R.CrossEntropy,
        K.NumbaCrossEntropy,
        [x, t],
        {"reduction": reduction},
        slack=8 * x.shape[0],
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_edges(reduction):
    kw = {"reduction": reduction}
    one = np.array([[0.5]], np.float32)
    check("cross_entropy", R.CrossEntropy, K.NumbaCrossEntropy, [one, np.array([0])], kw, slack=8)
    big = np.array([[1e4, -1e4, 0, 1e4 - 2], [-1e4, 3, -1e4, 0]], np.float32)
    check(
        "cross_entropy", R.CrossEntropy, K.NumbaCrossEntropy, [big, np.array([3, 0])], kw, slack=16
    )
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    check(
        "cross_entropy",
        R.CrossEntropy,
        K.NumbaCrossEntropy,
        [x, np.array([-100, -100, -100, -100])],
        kw,
        slack=32,
    )  # all ignored: NaN mean
    check(
        "cross_entropy",
        R.CrossEntropy,
        K.NumbaCrossEntropy,
        [x, np.array([1, 5, 5, 6])],
        dict(kw, ignore_index=5),
        slack=32,
    )


@pytest.mark.parametrize("bad", [7, -1, 100])
def test_cross_entropy_out_of_range(bad):
    x = np.zeros((2, 7), np.float32)
    with pytest.raises(IndexError, match="out of range"):
        K.NumbaCrossEntropy().forward(x, np.array([0, bad]))


# ----------------------------------------------------------------------------- layer norm


@given(
    st.tuples(
        st.integers(1, 5),
        st.integers(1, 70),
        st.booleans(),
        st.booleans(),
        st.sampled_from([np.float32, np.float64]),
    ).flatmap(lambda a: st.tuples(f32((a[0], a[1])), f32((a[1],)), st.just(a)))
)
def test_layer_norm(args):
    x, w, (_, c, has_w, has_b, dtype) = args
    # well-conditioned variance: neighbours at least 2 apart (x is in [-3, 3]); with a step of
    # 2 two columns could coincide, and float32 LayerNorm of a near-constant row is
    # ill-conditioned by nature (its gradient is a cancellation of much larger terms)
    x = x + np.float32(8) * np.arange(c, dtype=np.float32)
    w = w if has_w else None
    b = (w + 1 if has_w else np.ones(c, np.float32)) if has_b else None
    if dtype == np.float64:
        arrays = [a if a is None else a.astype(np.float64) for a in (x, w, b)]
        check("layer_norm", R.LayerNorm, K.NumbaLayerNorm, arrays, tol=(1e-12, 1e-12))
    else:
        check("layer_norm", R.LayerNorm, K.NumbaLayerNorm, [x, w, b])


@pytest.mark.parametrize(
    "shape,nd", [((1, 1), 1), ((1, 768), 1), ((2, 3, 5), 2), ((3, 40), 1), ((37, 50), 1)]
)
def test_layer_norm_shapes(shape, nd):
    g = np.random.default_rng(0)
    x = g.standard_normal(shape).astype(np.float32)
    w = g.standard_normal(shape[len(shape) - nd :]).astype(np.float32)
    check("layer_norm", R.LayerNorm, K.NumbaLayerNorm, [x, w, w * 0.5], {"nd": nd})


# ----------------------------------------------------------------------------- GELU


@given(
    st.tuples(st.integers(1, 3), st.integers(1, 40)).flatmap(lambda s: f32(s, -12, 12)),
    st.sampled_from(["tanh", "none"]),
)
def test_gelu(x, approximate):
    check("gelu", R.Gelu, K.NumbaGelu, [x], {"approximate": approximate})


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_extremes(approximate):
    """Far out in the negative tail GELU is -0 with gradient 0 (while e^(-2u) was capped at
    e^80, the tanh form gave x·1.8e-35, a gradient of -3864 at -1e13); where x³ overflows the
    reference still has them, and 1 at +1e13."""
    x = np.array([[0, -0.0, 1e-8, -1e-8, 30, -30, 1e4, -1e4, 5, -5]], np.float32)
    tails = np.array([[-1e13, -1e6, -100, -40, -10, 1e13]], np.float32)
    check("gelu", R.Gelu, K.NumbaGelu, [x], {"approximate": approximate})
    with np.errstate(over="ignore"):  # (the reference's float32 run: x³ overflows to inf)
        check("gelu", R.Gelu, K.NumbaGelu, [tails], {"approximate": approximate})


# ----------------------------------------------------------------------------- attention


@given(
    st.tuples(
        st.integers(1, 2),
        st.integers(1, 3),
        st.integers(1, 40),
        st.integers(1, 40),
        st.integers(1, 16),
        st.integers(1, 9),
        st.booleans(),
        st.sampled_from([None, 0.3]),
    )
)
def test_attention(dims):
    B, H, L, S, E, Ev, causal, scale = dims
    g = np.random.default_rng(L * 100 + S)
    q = g.standard_normal((B, H, L, E)).astype(np.float32)
    k = g.standard_normal((B, H, S, E)).astype(np.float32)
    v = g.standard_normal((B, H, S, Ev)).astype(np.float32)
    assume(KA._attn_when(q, k, v, None))  # S > Ev: else the reference keeps less
    check(
        "attention",
        R.Attention,
        KA.NumbaFlashAttention,
        [q, k, v, None],
        {"is_causal": causal, "scale": scale},
    )


@pytest.mark.parametrize("L,S", [(1, 5), (5, 9), (9, 5), (70, 70), (3, 200)])
def test_attention_causal_shapes(L, S, monkeypatch):
    monkeypatch.setattr(KA, "STRIP_BYTES", 16 * 4 * S * 2)  # several strips even when small
    g = np.random.default_rng(0)
    q, k = g.standard_normal((2, L, 8)), g.standard_normal((2, S, 8))
    v = g.standard_normal((2, S, 4))
    y = check(
        "attention",
        R.Attention,
        KA.NumbaFlashAttention,
        [a.astype(np.float32) for a in (q, k, v)] + [None],
        {"is_causal": True},
    )
    if L > S:  # the first L - S queries see no key: zeros, as the reference
        assert not y[:, : L - S].any()


def two_threads(monkeypatch) -> int:
    """Let the kernels run on 2 threads (numba's pool at 2, TG_KERNEL_THREADS, default every
    core, set to 2) and return numba's thread count before; skip, saying so, where the machine
    has fewer than 2 cores or numba threads."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (cores or 1) < 2:
        pytest.skip(
            f"runs the kernels on 2 threads, so needs 2 cores; this machine has {cores} "
            "(run it where 2 or more are free to this process)"
        )
    if numba.config.NUMBA_NUM_THREADS < 2:
        n = numba.config.NUMBA_NUM_THREADS
        pytest.skip(f"needs NUMBA_NUM_THREADS >= 2 (it is {n}): unset it or set it to 2 or more")
    monkeypatch.setenv("TG_KERNEL_THREADS", "2")
    prev = numba.get_num_threads()
    numba.set_num_threads(2)
    return prev


@pytest.mark.parametrize("mode", ["heads", "rows"])
def test_attention_thread_modes(mode, monkeypatch):
    prev = two_threads(monkeypatch)
    monkeypatch.setattr(KA, "THREADS_OVER", mode)
    monkeypatch.setattr(KA, "PARALLEL_MIN", 0)  # threads even for this small case
    monkeypatch.setattr(K, "PARALLEL_MIN", 0)
    monkeypatch.setattr(KA, "STRIP_BYTES", 16 * 4 * 40 * 3)  # several strips
    if mode == "heads" and cpu_blas.blas_threads() is None:
        pytest.skip("NumPy's BLAS is no OpenBLAS whose thread count can be set: no 'heads'")
    before, blas = cpu_blas.blas_threads(), []  # OpenBLAS's count in each strip
    strip = KA.strip_forward

    def recorded_strip(*args):
        blas.append(cpu_blas.blas_threads())
        strip(*args)

    monkeypatch.setattr(KA, "strip_forward", recorded_strip)
    serial, parallel = [], []  # (thread, numba threads) per driver call
    for name in ("PROBS", "PROBS_AGAIN", "DSCORES"):
        drivers = getattr(KA, name)
        calls = [parallel, serial]
        monkeypatch.setattr(KA, name, tuple(wrap_driver(f, c) for f, c in zip(drivers, calls)))
    try:
        g = np.random.default_rng(0)
        q, k, v = (g.standard_normal((3, 40, 8)).astype(np.float32) for _ in range(3))
        check(
            "attention", R.Attention, KA.NumbaFlashAttention, [q, k, v, None], {"is_causal": True}
        )
    finally:
        numba.set_num_threads(prev)
    assert cpu_blas.blas_threads() == before  # given back
    if mode == "heads":  # each strip on one OpenBLAS thread, whatever the kernels' count
        assert blas and set(blas) == {1}, f"'heads': OpenBLAS ran strips on {set(blas)} threads"
    if mode == "heads":  # the heads split over 2 Python threads, each running serial drivers
        threads = {t for t, _ in serial}
        assert serial and not parallel and len(threads) >= 2, (
            f"'heads': {len(serial)} serial driver calls on {len(threads)} thread(s), "
            f"{len(parallel)} parallel ones: the heads were not split over threads"
        )
    else:  # one call over all heads, each driver on numba's pool of 2 threads
        counts = {n for _, n in parallel}
        assert parallel and not serial and counts == {2}, (
            f"'rows': {len(parallel)} parallel driver calls on numba thread counts {counts}, "
            f"{len(serial)} serial ones: expected numba's pool of 2 threads"
        )


def wrap_driver(f, calls):
    """f, recording (Python thread, numba's thread count there) in calls before each call."""

    def recorded(*args):
        calls.append((threading.get_ident(), numba.get_num_threads()))
        return f(*args)

    return recorded


def test_attention_head_views():
    # the model's q, k, v are (B, nh, T, hs) transposes of one (B, T, 3C) projection
    g = np.random.default_rng(0)
    qkv = g.standard_normal((2, 24, 3 * 4 * 8)).astype(np.float32)
    q, k, v = (
        qkv[..., i * 32 : (i + 1) * 32].reshape(2, 24, 4, 8).transpose(0, 2, 1, 3) for i in range(3)
    )
    assert KA._attn_when(q, k, v, None)
    check("attention", R.Attention, KA.NumbaFlashAttention, [q, k, v, None], {"is_causal": True})


def test_attention_keeps_o_of_t():
    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((1, 2, 256, 16)).astype(np.float32) for _ in range(3))
    fn = KA.NumbaFlashAttention()
    fn.forward(q, k, v, None, is_causal=True)
    assert kept_bytes(fn) <= 5 * q.nbytes  # q, k, v, o and lse: no (L, S) scores


# ----------------------------------------------------------------------------- AdamW


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw(dtype, tol, wd):
    g = np.random.default_rng(0)
    a = [g.standard_normal(40_000).astype(dtype) for _ in range(3)] + [
        g.random(40_000).astype(dtype)
    ]
    b = [x.copy() for x in a]
    for step in (1, 2, 10):
        kw = {"lr": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": wd, "step": step}
        adamw_update(*a, **kw)
        KW.numba_adamw_update(*b, **kw)
        for name, x, y in zip("xgmv", a, b):
            assert_close(y, x, tol, tol, what=f"adamw {name} step {step}")


def test_adamw_with_and_without_the_pool_agree_bit_for_bit():
    # parameters below PARALLEL_MIN elements take the serial loop, larger ones the pool's:
    # the same update either way (a model's parameters may sit on both sides)
    g = np.random.default_rng(1)
    a = [g.standard_normal(KW.PARALLEL_MIN + 77).astype(np.float32) for _ in range(3)]
    a.append(g.random(a[0].size).astype(np.float32))
    b = [x.copy() for x in a]
    f32 = np.float32
    hp = (f32(0.999), f32(0.9), f32(0.1), f32(0.95), f32(0.05), f32(0.3), f32(1e-8), f32(1e-3))
    KW._adamw(*a, *hp)
    KW._adamw_serial(*b, *hp)
    for name, x, y in zip("xgmv", a, b):
        np.testing.assert_array_equal(y, x, err_msg=f"adamw {name}")


# ----------------------------------------------------------------------------- registry


def test_registered_names():
    names = {k.name for k in kernels.registered()}
    for n in ("softmax", "log_softmax", "cross_entropy", "layer_norm", "gelu", "flash_attention"):
        assert f"cpu.numba.{n}" in names

    # AdamW picks the one-pass numba update first (a contiguous gradient), else the chunked one
    # (asked of the registry in pick's order, so it holds under TG_KERNELS=0 too)
    def first(*args):
        return next(
            k.impl for k in kernels.registered("adamw", "cpu") if k.when is None or k.when(*args)
        )

    x = np.zeros(10, np.float32)
    assert first(x, x, x, x) is KW.numba_adamw_update
    g = np.zeros(20, np.float32)[::2]
    assert first(x, g, x, x).__name__ == "chunked_adamw_update"


def pick_impl(op, *args, **kw):
    ks = [k for k in kernels.registered(op, "cpu") if k.name.startswith("cpu.numba.")]
    assert len(ks) == 1
    return ks[0].when(*args, **kw)


def test_predicates_refuse_what_kernels_do_not_handle():
    x32 = np.zeros((4, 5), np.float32)
    assert pick_impl("softmax", x32, dim=-1) and pick_impl("softmax", x32, dim=1)
    assert not pick_impl("softmax", x32, dim=0)
    assert not pick_impl("softmax", x32.astype(np.float64))
    assert not pick_impl("softmax", x32.T)  # not contiguous
    assert not pick_impl("softmax", np.zeros((0, 5), np.float32))
    assert pick_impl("cross_entropy", x32, np.zeros(4, np.int64))
    assert not pick_impl("cross_entropy", np.zeros((2, 2, 5), np.float32), np.zeros(2, int))
    assert pick_impl("layer_norm", x32, None, None) and pick_impl(
        "layer_norm", x32 * 1.0, np.ones(5, np.float32), None
    )
    assert not pick_impl("layer_norm", x32, np.ones(5), None)  # dtypes differ
    assert not pick_impl("gelu", x32.astype(np.float16))
    q = np.zeros((1, 2, 5, 4), np.float32)
    assert pick_impl("attention", q, q, q, None, is_causal=True)
    assert not pick_impl("attention", q, q, q, np.ones((3, 3), bool))
    assert not pick_impl("attention", q, q, q, None, dropout_p=0.1)
    assert not pick_impl("attention", q, q[0], q[0], None)  # broadcast batch dims
    assert not pick_impl("attention", q, q[..., :4, :], q, None)  # S = 4 <= Ev = 4
    v = np.zeros(3, np.float32)  # the AdamW kernel is not registered (the chunked one wins)
    assert KW._adamw_when(v, v, v, v) and not KW._adamw_when(v, v[:2], v, v)


def test_apply_records_and_backpropagates():
    import tensorgrad as tg

    x = tg.tensor(
        np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32), requires_grad=True
    )
    K.NumbaLayerNorm.apply(K.NumbaSoftmax.apply(x, dim=-1), None, None, nd=1).sum().backward()
    assert x.grad is not None and x.grad.shape == (3, 8) and np.isfinite(x.grad.numpy()).all()


def test_sizes_above_parallel_min(monkeypatch):
    # the tests above are small and run on one thread (threads_for); these take numba's pool
    # of 2 threads: every kernel call is recorded with numba's thread count inside it
    prev = two_threads(monkeypatch)
    ran, real_run = [], K.run_kernel
    for module in (K, KW):
        monkeypatch.setattr(
            module,
            "run_kernel",
            lambda kernel, size, *a: real_run(wrap_driver(kernel, ran), size, *a),
        )
    try:
        sizes_above_parallel_min()
    finally:
        numba.set_num_threads(prev)
    counts = sorted(n for _, n in ran)
    assert counts == [2] * 11, f"numba thread counts of the 11 kernel calls: {counts}"


def sizes_above_parallel_min():
    """Each kernel on 128 Ki elements against its reference."""
    g = np.random.default_rng(0)
    x = g.standard_normal((64, 2 * K.PARALLEL_MIN // 64)).astype(np.float32)
    check("softmax", R.Softmax, K.NumbaSoftmax, [x])
    check("log_softmax", R.LogSoftmax, K.NumbaLogSoftmax, [x])
    t = g.integers(0, x.shape[1], 64)
    t[::7] = -100
    check("cross_entropy", R.CrossEntropy, K.NumbaCrossEntropy, [x, t], slack=8 * 64)
    check("layer_norm", R.LayerNorm, K.NumbaLayerNorm, [x, x[0], x[1]])
    check("gelu", R.Gelu, K.NumbaGelu, [x], {"approximate": "tanh"})
    a = [g.standard_normal(x.size).astype(np.float32) for _ in range(3)] + [g.random(x.size)]
    a[3] = a[3].astype(np.float32)
    b = [y.copy() for y in a]
    hp = {"lr": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1, "step": 5}
    adamw_update(*a, **hp)
    KW.numba_adamw_update(*b, **hp)
    for name, want, got in zip("xgmv", a, b):
        assert_close(got, want, 1e-6, 1e-6, what=f"adamw {name}")


def test_every_cpu_kernel_compiles_with_numpys_error_model():
    # Python's error model checks every division for zero, which keeps LLVM from vectorising
    # the loop (the tanh GELU's forward ran 4x slower); NumPy's gives IEEE inf/NaN, as the
    # reference ops do
    from numba.core.registry import CPUDispatcher

    from tensorgrad.kernels import (
        cpu_numba_attention,
        cpu_numba_block,
        cpu_numba_embedding,
        numba_math,
    )

    found = []
    for module in (K, KW, cpu_numba_attention, cpu_numba_block, cpu_numba_embedding, numba_math):
        for name, f in vars(module).items():
            if isinstance(f, CPUDispatcher):
                found.append((module.__name__, name, f.targetoptions.get("error_model")))
    assert len(found) > 20
    assert all(model == "numpy" for *_, model in found), [f for f in found if f[2] != "numpy"]
    x = np.array([1.0, -1.0, 0.0], np.float32)
    y = np.empty_like(x)
    K._softmax_fwd(np.zeros((1, 3), np.float32), y.reshape(1, 3))  # runs, no ZeroDivisionError
    assert np.allclose(y, 1 / 3)


def test_the_kernel_pool_starts_passive_and_leaves_the_environment_as_it_was(monkeypatch):
    seen = []
    monkeypatch.setattr(
        K.numba, "get_num_threads", lambda: seen.append(os.environ.get("OMP_WAIT_POLICY")) or 1
    )
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    K._start_pool()
    assert seen == ["PASSIVE"] and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice is kept
    K._start_pool()
    assert seen[-1] == "ACTIVE" and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_kernel_threads_default_to_every_usable_core(monkeypatch):
    from tensorgrad.kernels.threads import GOVERNOR

    monkeypatch.delenv("TG_KERNEL_THREADS", raising=False)
    monkeypatch.setattr(GOVERNOR, "kernels", None)  # (a compiled test's calls may have set it)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    assert K.kernel_threads() == cores
    monkeypatch.setattr(GOVERNOR, "kernels", 1)  # the thread governor's choice, measured
    assert K.kernel_threads() == 1
    monkeypatch.setenv("TG_KERNEL_THREADS", "2")  # the user's, above it
    assert K.kernel_threads() == 2
