"""The fused CUDA kernels, checked on the CPU: compiled with nvcc, run under emulation.

``cuda_emulation.install`` registers the CUDA kernels for CPU float32 arrays, running the real
CUDA C of ``tensorgrad/cuda/kernels.py`` and ``tensorgrad/cuda/flash.py`` compiled by g++ (each
CUDA thread an OS thread), with NumPy standing in for CuPy in the kernels' Python wrappers.
So the kernel code, the wrappers' shapes/strides/grids, and the autograd wiring are all
exercised here, each fused op against its NumPy twin. tests/test_cuda.py repeats the
comparisons on a real GPU.
Also: a NumPy model of the flash-attention tiling, and the cuBLAS GEMM argument plan
against a NumPy emulation of column-major strided batched GEMM.
"""

from __future__ import annotations

import shutil

import cuda_emulation as ce
import numpy as np
import pytest
from test_backend_dispatch import comparable

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad.cuda import flash as FA
from tensorgrad.cuda import kernels as K

needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ to emulate CUDA (apt-get install g++)"
)
needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None,
    reason="needs nvcc, the CUDA toolkit's compiler (CI has none; install the CUDA toolkit); "
    "the g++ emulation tests still run the kernels",
)

rng = np.random.default_rng(0)


def R(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# ----------------------------------------------------------------------------- nvcc


@needs_nvcc
@pytest.mark.parametrize(
    "what", ["rows", "flash8", "flash64", "flash80", "flash128", "elementwise"]
)
def test_nvcc_compiles(what):
    if what == "rows":
        src = K.rows_source()
    elif what.startswith("flash"):
        src = FA.flash_source(int(what[5:]))
    else:
        scalars = ("decay", "b1", "omb1", "b2", "omb2", "bc2", "eps", "step", "ncls")
        src = "".join(
            ce.elementwise_source(n, *spec, scalars=scalars, cuda=True)
            for n, spec in K.ELEMENTWISE.items()
        )
    report = ce.nvcc_check(src)
    for line in report.splitlines():
        if "smem" in line:
            smem = int(line.split("bytes smem")[0].split(",")[-1])
            assert smem <= 48 * 1024, f"{what}: {smem} bytes of static shared memory"


# ----------------------------------------------------------------------------- fused vs twin


@pytest.fixture
def emulated(monkeypatch):
    ce.install(monkeypatch)


def run(fn, arrays, grad=True):
    """Forward output and input gradients (weighted sum of the output) as NumPy arrays."""
    ts = [
        tg.tensor(a.copy(), dtype=a.dtype, requires_grad=grad and a.dtype.kind == "f")
        for a in arrays
    ]
    out = fn(*ts)
    w = np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype)
    (out * tg.tensor(w)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]


def qkv_strided(B, T, H, E):
    """q, k, v as the model makes them: (B, H, T, E) views of one (B, T, 3·H·E) array."""
    x = R(B, T, 3 * H * E)
    return [
        x[..., i * H * E : (i + 1) * H * E].reshape(B, T, H, E).transpose(0, 2, 1, 3)
        for i in range(3)
    ]


def sdpa(causal, scale=None):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


FUSED = [
    ("layer_norm", lambda x, w, b: F.layer_norm(x, 37, w, b), [R(5, 37), R(37), R(37)]),
    (
        "layer_norm_many_rows",
        lambda x, w, b: F.layer_norm(x, 40, w, b),
        [R(40, 40), R(40), R(40)],
    ),  # 3 row blocks (of 16 here) x 2 column blocks of partials
    ("layer_norm_2d_no_bias", lambda x, w: F.layer_norm(x, (3, 50), w), [R(2, 3, 50), R(3, 50)]),
    ("layer_norm_no_affine", lambda x: F.layer_norm(x, 300), [R(3, 300)]),
    ("gelu_tanh", lambda x: F.gelu(x, "tanh"), [R(7, 9, lo=-6, hi=6)]),
    ("gelu_erf", lambda x: F.gelu(x), [R(7, 9, lo=-6, hi=6)]),
    ("softmax", lambda x: F.softmax(x, dim=-1), [R(4, 3, 300, lo=-30, hi=30)]),
    ("softmax_masked", lambda x: F.softmax(x.masked_fill(x > 1.0, float("-inf")), -1), [R(6, 5)]),
    (
        "cross_entropy",
        lambda x, t: F.cross_entropy(x, t, ignore_index=2),
        [R(6, 1500, lo=-8, hi=8), np.array([0, 2, 1499, 7, 2, 100])],
    ),
    (
        "cross_entropy_sum",
        lambda x, t: F.cross_entropy(x, t, reduction="sum"),
        [R(3, 40), np.array([0, 39, 5])],
    ),
    (
        "cross_entropy_none",
        lambda x, t: F.cross_entropy(x, t, reduction="none"),
        [R(3, 40), np.array([0, 39, 5])],
    ),
    ("embedding", lambda w, i: F.embedding(i, w), [R(9, 20), rng.integers(0, 9, (4, 7))]),
    ("attention_causal", sdpa(True), [R(2, 3, 70, 64) for _ in range(3)]),
    ("attention_full", sdpa(False), [R(2, 2, 33, 64) for _ in range(3)]),
    ("attention_one_query", sdpa(True), [R(1, 2, 1, 16) for _ in range(3)]),
    ("attention_hs8_strided", sdpa(True), qkv_strided(2, 19, 2, 8)),
    ("attention_hs80", sdpa(True), [R(1, 2, 37, 80) for _ in range(3)]),
    ("attention_hs128", sdpa(False, scale=0.3), [R(1, 1, 20, 128) for _ in range(3)]),
    ("attention_causal_L_lt_S", sdpa(True), [R(1, 2, 5, 16), R(1, 2, 37, 16), R(1, 2, 37, 16)]),
    ("attention_causal_L_gt_S", sdpa(True), [R(1, 1, 40, 8), R(1, 1, 9, 8), R(1, 1, 9, 8)]),
    ("attention_broadcast_kv", sdpa(False), [R(2, 3, 10, 16), R(1, 3, 12, 16), R(2, 1, 12, 16)]),
    ("attention_3d", sdpa(True), [R(3, 21, 24) for _ in range(3)]),
]


@needs_gxx
@pytest.mark.parametrize("name, fn, arrays", FUSED, ids=[c[0] for c in FUSED])
def test_fused_kernel_matches_numpy_twin(monkeypatch, name, fn, arrays):
    want, want_grads = run(fn, arrays)
    ce.install(monkeypatch)
    monkeypatch.setattr(K, "LN_ROWS_PER_BLOCK", 16)
    got, got_grads = run(fn, arrays)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"{name} forward")
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        if w is None:
            assert g is None, f"{name}: input {i}"
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5, err_msg=f"{name} grad {i}")


@needs_gxx
def test_fused_branches_really_ran(emulated, monkeypatch):
    calls = []
    for name in (
        "gelu_forward",
        "layer_norm_backward",
        "flash_attention_backward",
        "cross_entropy_backward",
        "embedding_backward",
    ):
        module = FA if name.startswith("flash") else K
        orig = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _o=orig, _n=name, **kw: calls.append(_n) or _o(*a, **kw)
        )
    run(lambda x, w, b: F.gelu(F.layer_norm(x, 8, w, b), "tanh"), [R(3, 8), R(8), R(8)])
    run(sdpa(True), [R(1, 2, 5, 8) for _ in range(3)])
    run(lambda x, t: F.cross_entropy(x, t), [R(3, 5), np.array([1, 2, 3])])
    run(lambda w, i: F.embedding(i, w), [R(4, 3), np.array([1, 1, 3])])
    assert sorted(set(calls)) == sorted(
        [
            "gelu_forward",
            "layer_norm_backward",
            "flash_attention_backward",
            "cross_entropy_backward",
            "embedding_backward",
        ]
    )


@needs_gxx
def test_flash_lse_and_empty_rows(emulated):
    q, k, v = R(1, 1, 6, 8), R(1, 1, 2, 8), R(1, 1, 2, 8)
    o, lse = FA.flash_attention_forward(q, k, v, True, 0.5)
    s = (q[0, 0] @ k[0, 0].T) * 0.5
    allowed = np.tril(np.ones((6, 2), bool), k=2 - 6)
    for i in range(6):
        if allowed[i].any():
            ref = np.log(np.exp(s[i][allowed[i]]).sum())
            np.testing.assert_allclose(lse[0, 0, i], ref, rtol=1e-5)
        else:  # a query that sees no key: zero output, +inf logsumexp
            assert lse[0, 0, i] == np.inf and not o[0, 0, i].any()


@needs_gxx
@pytest.mark.parametrize("wd, step", [(0.0, 1), (0.1, 7)])
def test_adamw_kernel_is_bitwise_numpy(monkeypatch, wd, step):
    from tensorgrad.optim import adamw_update

    x, g = R(1000), R(1000)
    m, v = R(1000) * 0.1, R(1000, lo=0, hi=0.01)
    hp = {"lr": 3e-4, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": wd, "step": step}
    want = [a.copy() for a in (x, m, v)]
    adamw_update(want[0], g, want[1], want[2], **hp)  # the reference
    ce.install(monkeypatch)
    got = [a.copy() for a in (x, m, v)]
    K.adamw_update(got[0], g, got[1], got[2], **hp)  # the fused kernel
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)  # the same float32 operations: the same bits


@needs_gxx
def test_tiny_gpt_steps_with_fused_kernels(monkeypatch):
    from gpt.config import GPTConfig
    from gpt.model import GPT

    def steps():
        tg.manual_seed(0)
        model = GPT(GPTConfig.from_preset("tiny"))
        opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
        data = np.random.default_rng(5).integers(0, 32, size=(2, 9))
        losses = []
        for _ in range(2):
            _, loss = model(data[:, :-1], data[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return model, losses

    ref_model, ref_losses = steps()
    ce.install(monkeypatch)
    model, losses = steps()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for (n, p), (_, q) in zip(ref_model.named_parameters(), model.named_parameters()):
        np.testing.assert_allclose(
            comparable(n, q.detach().numpy()),
            comparable(n, p.detach().numpy()),
            rtol=1e-4,
            atol=1e-4,
            err_msg=n,
        )


# ----------------------------------------------------------------------------- the tiling


def flash_tiles(q, k, v, causal, scale, BR, BC):
    """The kernels' algorithm in NumPy for one head: forward by query tiles with an online
    softmax in log2 units, backward by key tiles (dk, dv) and by query tiles (dq)."""
    L, S = q.shape[0], k.shape[0]
    off, sl2 = S - L, scale * np.log2(np.e)

    def scores(i0, i1, j0, j1):
        s = (q[i0:i1] @ k[j0:j1].T) * sl2
        if causal:
            s = np.where(np.arange(j0, j1)[None] <= np.arange(i0, i1)[:, None] + off, s, -np.inf)
        return s

    o, lse = np.zeros_like(q), np.full(L, np.inf)
    for i0 in range(0, L, BR):
        i1 = min(L, i0 + BR)
        m, l, acc = np.full(i1 - i0, -np.inf), np.zeros(i1 - i0), np.zeros((i1 - i0, q.shape[1]))
        for j0 in range(0, min(S, i1 + off) if causal else S, BC):
            s = scores(i0, i1, j0, min(S, j0 + BC))
            mnew = np.maximum(m, s.max(axis=1))
            mref = np.where(mnew == -np.inf, 0.0, mnew)
            p, alpha = np.exp2(s - mref[:, None]), np.exp2(m - mref)
            l, m = l * alpha + p.sum(axis=1), mnew
            acc = acc * alpha[:, None] + p @ v[j0 : j0 + BC]
        seen = l > 0
        o[i0:i1] = np.where(seen[:, None], acc / np.where(seen, l, 1)[:, None], 0)
        lse[i0:i1] = np.where(seen, (m + np.log2(np.where(seen, l, 1))) / np.log2(np.e), np.inf)
    return o, lse


@pytest.mark.parametrize(
    "L, S, causal",
    [(70, 70, True), (70, 70, False), (5, 37, True), (40, 9, True), (1, 1, True), (33, 64, False)],
)
def test_flash_tiling_in_numpy(L, S, causal):
    q, k, v = (rng.standard_normal((n, 16)) for n in (L, S, S))
    o, lse = flash_tiles(q, k, v, causal, 0.25, BR=16, BC=8)
    s = (q @ k.T) * 0.25
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool), k=S - L), s, -np.inf)
    seen = np.isfinite(s).any(axis=1)
    m = np.where(seen, s.max(axis=1), 0)
    p = np.exp(s - m[:, None])
    want = np.where(seen[:, None], (p / np.where(seen, p.sum(1), 1)[:, None]) @ v, 0)
    np.testing.assert_allclose(o, want, atol=1e-12)
    np.testing.assert_allclose(
        lse[seen], (m + np.log(np.where(seen, p.sum(1), 1)))[seen], rtol=1e-12
    )
    assert np.all(lse[~seen] == np.inf)


# ----------------------------------------------------------------------------- GEMM plan


def emulate_gemm(plan, xbuf, ybuf):
    """cublasGemmStridedBatchedEx as cuBLAS reads the raw buffers: column-major matrices
    with leading dimensions, one stride per batch step; C = op(A)·op(B) is m x n."""

    def op_mat(buf, op, ld, stride, rows, cols, b):
        r, c = (rows, cols) if op == K.CUBLAS_OP_N else (cols, rows)  # as stored
        stored = buf[b * stride + np.arange(r)[:, None] + ld * np.arange(c)[None, :]]
        return stored if op == K.CUBLAS_OP_N else stored.T

    m, n, k = plan["m"], plan["n"], plan["k"]
    out = np.zeros(plan["count"] * plan["stride_c"])
    for b in range(plan["count"]):
        A = op_mat(ybuf, plan["op_a"], plan["lda"], plan["stride_a"], m, k, b)
        B = op_mat(xbuf, plan["op_b"], plan["ldb"], plan["stride_b"], k, n, b)
        C = A.astype(np.float64) @ B.astype(np.float64)
        cols = b * plan["stride_c"] + np.arange(m)[:, None] + plan["ldc"] * np.arange(n)[None]
        out[cols] = C
    return out.reshape(plan["batch"] + (n, m))  # row-major (M, N) = column-major (N, M)


def _view_of_buffer(shape, strides, seed):
    """A float32 view with the given element strides over a random buffer (and the buffer)."""
    need = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    buf = np.random.default_rng(seed).standard_normal(need).astype(np.float32)
    return np.lib.stride_tricks.as_strided(buf, shape=shape, strides=[s * 4 for s in strides]), buf


GEMMS = [
    ("2d", (5, 3), (3, 1), (3, 4), (4, 1)),
    ("w_transposed", (6, 3), (3, 1), (3, 4), (1, 3)),  # x @ w.T, w (4, 3) row-major
    ("x_transposed", (5, 3), (1, 5), (3, 4), (4, 1)),  # g.T @ x
    ("batched", (2, 5, 3), (15, 3, 1), (2, 3, 4), (12, 4, 1)),
    ("broadcast_y", (2, 5, 3), (15, 3, 1), (3, 4), (4, 1)),
    ("broadcast_x", (5, 3), (3, 1), (2, 3, 4), (12, 4, 1)),
    ("padded_rows", (5, 3), (7, 1), (3, 4), (6, 1)),  # slices of wider arrays: ld > cols
    ("4d", (2, 3, 4, 5), (60, 20, 5, 1), (2, 3, 5, 2), (30, 10, 2, 1)),
]


@pytest.mark.parametrize("name, xs, xst, ys, yst", GEMMS, ids=[g[0] for g in GEMMS])
def test_gemm_plan(name, xs, xst, ys, yst):
    (x, xbuf), (y, ybuf) = _view_of_buffer(xs, xst, 1), _view_of_buffer(ys, yst, 2)
    plan = K.gemm_plan(x.shape, xst, y.shape, yst)
    assert plan is not None, name
    got = emulate_gemm(plan, xbuf, ybuf)
    want = np.matmul(x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=name)


def test_gemm_plan_refuses_what_cublas_cannot_read():
    assert K.gemm_plan((4, 3), (6, 2), (3, 2), (2, 1)) is None  # neither row- nor col-major
    # batch dims that no single stride walks: (2, 3) batch over a (3, 2)-ordered buffer
    assert K.gemm_plan((2, 3, 2, 2), (4, 8, 2, 1), (2, 2), (2, 1)) is None
