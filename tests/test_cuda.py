"""GPU checks: every op on the GPU against the CPU, each fused CUDA kernel against its NumPy
twin, matmul precisions, a tiny GPT trained on both devices, seeded repeatability and
checkpoints across devices. Skipped (with the reason) without CuPy or an NVIDIA GPU.

    python -m pytest -m cuda tests/test_cuda.py

The op cases are those of test_backend_dispatch (run there through a CPU fake of the GPU
module) and test_cuda_kernels_emulated (run there on emulated kernels).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import devices
from tensorgrad.ops import linalg

pytestmark = pytest.mark.cuda

if not devices.cuda_available():
    pytest.skip(
        f"needs CuPy and an NVIDIA GPU ({devices.cuda_error()}); pip install -e '.[cuda]'",
        allow_module_level=True,
    )

cp = devices.require_cupy()

from test_backend_dispatch import CASES, comparable
from test_cuda_kernels_emulated import FUSED

from tensorgrad.cuda import kernels as K


@pytest.fixture(params=[True, False], ids=["fused", "unfused"])
def fused(request):
    tg.kernels.set_enabled(request.param)
    yield request.param
    tg.kernels.set_enabled(True)


@pytest.fixture(autouse=True)
def _highest():
    tg.cuda.set_matmul_precision("highest")
    yield
    tg.cuda.set_matmul_precision("highest")


def run(fn, arrays, device):
    """Forward output and input gradients of a weighted sum of the output, on the host."""
    ts = [
        tg.tensor(
            np.array(a),
            dtype=np.asarray(a).dtype,
            device=device,
            requires_grad=np.asarray(a).dtype.kind == "f",
        )
        for a in arrays
    ]
    out = fn(*ts)
    assert out.device == device
    w = np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype)
    (out * tg.tensor(w, device=device)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]


def assert_same(name, got, want, rtol=1e-4, atol=1e-5, grad_atol=1e-4):
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol, err_msg=f"{name} forward")
    for i, (g, w) in enumerate(zip(got[1], want[1])):
        if w is None:
            assert g is None, f"{name}: input {i} has a gradient on one device only"
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=grad_atol, err_msg=f"{name} grad {i}")


# ----------------------------------------------------------------------------- devices


def test_device_api():
    x = tg.randn(3, 4, requires_grad=True)
    y = x.to("cuda")
    assert y.device == "cuda" and isinstance(y.array, cp.ndarray) and y.cuda() is y
    assert x.cuda().device == "cuda" and y.cpu().device == "cpu"
    assert isinstance(y.detach().numpy(), np.ndarray)
    np.testing.assert_array_equal(y.detach().numpy(), x.detach().numpy())
    (y * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 3, np.float32))
    for t in (
        tg.zeros(2, device="cuda"),
        tg.arange(3, device="cuda"),
        tg.randn(2, device="cuda"),
        tg.rand(2, device="cuda"),
        tg.randint(0, 3, (2,), device="cuda"),
        tg.full((2,), 1.0, device="cuda"),
    ):
        assert isinstance(t.array, cp.ndarray)
    lin = tg.nn.Linear(4, 2).cuda()
    assert all(isinstance(p.array, cp.ndarray) for p in lin.parameters())
    with pytest.raises(RuntimeError, match="cuda and cpu|cpu and cuda"):
        lin(tg.ones(1, 4))


# ----------------------------------------------------------------------------- every op


@pytest.mark.parametrize("name, fn, arrays, expect", CASES, ids=[c[0] for c in CASES])
def test_op_on_gpu_matches_cpu(fused, name, fn, arrays, expect):
    assert_same(name, run(fn, arrays, "cuda"), run(fn, arrays, "cpu"))


@pytest.mark.parametrize("name, fn, arrays", FUSED, ids=[c[0] for c in FUSED])
def test_fused_kernel_matches_twin(name, fn, arrays):
    got = run(fn, arrays, "cuda")
    tg.kernels.set_enabled(False)
    try:
        twin = run(fn, arrays, "cuda")  # the NumPy-style code on CuPy
    finally:
        tg.kernels.set_enabled(True)
    assert_same(name + " vs twin on GPU", got, twin)
    assert_same(name + " vs CPU", got, run(fn, arrays, "cpu"))


def test_dropout_on_gpu(fused):
    x = tg.ones(200, 100, device="cuda", requires_grad=True)
    y = F.dropout(x, 0.3)
    y.sum().backward()
    a = y.detach().numpy()
    assert abs((a == 0).mean() - 0.3) < 0.02
    np.testing.assert_allclose(a[a != 0], 1 / 0.7, rtol=1e-6)
    np.testing.assert_array_equal(x.grad.numpy(), a)


# ----------------------------------------------------------------------------- kernels at size


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 127, 200, 1024])
@pytest.mark.parametrize("hs", [16, 64, 80, 128])
def test_flash_attention_vs_gemm_path(causal, T, hs):
    r = np.random.default_rng(T * hs)
    arrays = [r.standard_normal((2, 3, T, hs)).astype(np.float32) for _ in range(3)]

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    got = run(fn, arrays, "cuda")
    tg.kernels.set_enabled(False, ["attention"])
    try:
        want = run(fn, arrays, "cuda")
    finally:
        tg.kernels.set_enabled(True)
    assert_same(f"flash T={T} hs={hs} causal={causal}", got, want, atol=2e-5, grad_atol=2e-4)


@pytest.mark.parametrize("L, S", [(1, 300), (100, 300), (300, 100)])
def test_flash_attention_causal_offsets(L, S):
    r = np.random.default_rng(L)
    arrays = [r.standard_normal((1, 4, n, 64)).astype(np.float32) for n in (L, S, S)]

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    assert_same(
        f"flash L={L} S={S}",
        run(fn, arrays, "cuda"),
        run(fn, arrays, "cpu"),
        atol=2e-5,
        grad_atol=2e-4,
    )


def test_cross_entropy_large_vocab():
    r = np.random.default_rng(0)
    x = (r.standard_normal((64, 50257)) * 3).astype(np.float32)
    t = r.integers(0, 50257, 64)
    t[5] = -1
    fn = lambda a, b: F.cross_entropy(a, b, ignore_index=-1)
    assert_same(
        "cross_entropy V=50257",
        run(fn, [x, t], "cuda"),
        run(fn, [x, t], "cpu"),
        atol=1e-6,
        grad_atol=1e-8,
    )


def test_adamw_kernel_matches_cpu_bits():
    from tensorgrad.optim import adamw_update

    r = np.random.default_rng(0)
    x, g, m = (r.standard_normal(100_000).astype(np.float32) for _ in range(3))
    v = r.random(100_000).astype(np.float32) * 1e-2
    hp = {"lr": 6e-4, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1, "step": 5}
    host = [a.copy() for a in (x, m, v)]
    adamw_update(host[0], g, host[1], host[2], **hp)
    dev = [cp.asarray(a) for a in (x, m, v)]
    adamw_update(dev[0], cp.asarray(g), dev[1], dev[2], **hp)
    for name, a, b in zip("xmv", dev, host):
        a = cp.asnumpy(a)
        ulps = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1, f"adamw {name}: {int((ulps > 0).sum())} elements differ"


def test_embedding_backward_is_deterministic():
    r = np.random.default_rng(0)
    idx = r.integers(0, 50, (8, 1024))  # many repeats of each id
    g = cp.asarray(r.standard_normal((8, 1024, 64)).astype(np.float32))
    a = K.embedding_backward(cp.asarray(idx), g, (50, 64))
    b = K.embedding_backward(cp.asarray(idx), g, (50, 64))
    assert bool((a == b).all())
    want = np.zeros((50, 64))
    np.add.at(want, idx.reshape(-1), cp.asnumpy(g).reshape(-1, 64).astype(np.float64))
    np.testing.assert_allclose(cp.asnumpy(a), want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- precision


@pytest.mark.parametrize("precision, tol", [("tf32", 5e-3), ("bf16", 3e-2)])
def test_matmul_precision(precision, tol):
    r = np.random.default_rng(0)
    cases = [((256, 512), (512, 384)), ((4, 128, 64), (64, 96)), ((3, 1, 64, 32), (1, 5, 32, 16))]
    for xs, ys in cases:
        x, y = r.standard_normal(xs).astype(np.float32), r.standard_normal(ys).astype(np.float32)
        want = np.matmul(x.astype(np.float64), y.astype(np.float64))
        tg.cuda.set_matmul_precision(precision)
        got = cp.asnumpy(linalg.matmul(cp.asarray(x), cp.asarray(y)))
        y_t = cp.ascontiguousarray(cp.asarray(y).swapaxes(-1, -2)).swapaxes(-1, -2)  # col-major
        w_t = cp.asnumpy(linalg.matmul(cp.asarray(x), y_t))
        tg.cuda.set_matmul_precision("highest")
        exact = cp.asnumpy(linalg.matmul(cp.asarray(x), cp.asarray(y)))
        scale = np.abs(want).max()
        assert np.abs(got - want).max() / scale < tol, (precision, xs, ys)
        np.testing.assert_allclose(w_t, got, rtol=1e-6, atol=1e-6 * scale)  # op T == op N
        assert np.abs(exact - want).max() / scale < 1e-5
        if xs == (256, 512):
            assert np.abs(got - want).max() > np.abs(exact - want).max()  # the mode took effect
    # a whole linear layer under each mode still trains in float32 storage
    tg.cuda.set_matmul_precision(precision)
    lin = tg.nn.Linear(64, 32).cuda()
    out = lin(tg.randn(8, 64, device="cuda"))
    out.sum().backward()
    assert out.dtype == np.float32 and lin.weight.grad.dtype == np.float32


# ----------------------------------------------------------------------------- GPT


def _train(device, steps=2, dropout=0.0, seed=0):
    from gpt.config import GPTConfig
    from gpt.model import GPT

    tg.manual_seed(seed)
    model = GPT(GPTConfig.from_preset("tiny", dropout=dropout)).to(device)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    data = np.random.default_rng(5).integers(0, 32, size=(4, 17))
    x, y = devices.to_device(data[:, :-1], device), devices.to_device(data[:, 1:], device)
    losses = []
    for _ in range(steps):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


def test_tiny_gpt_training_gpu_vs_cpu(fused):
    cpu_model, _, cpu_losses = _train("cpu")
    gpu_model, _, gpu_losses = _train("cuda")
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-5)
    for (n, p), (_, q) in zip(cpu_model.named_parameters(), gpu_model.named_parameters()):
        assert isinstance(q.array, cp.ndarray), n
        np.testing.assert_allclose(
            comparable(n, q.detach().numpy()),
            comparable(n, p.detach().numpy()),
            rtol=1e-4,
            atol=1e-4,
            err_msg=n,
        )


def test_seeded_gpu_runs_repeat():
    tg.manual_seed(123)
    a = tg.randn(1000, device="cuda").detach().numpy()
    tg.manual_seed(123)
    np.testing.assert_array_equal(tg.randn(1000, device="cuda").detach().numpy(), a)
    m1, _, l1 = _train("cuda", steps=3, dropout=0.1, seed=7)
    m2, _, l2 = _train("cuda", steps=3, dropout=0.1, seed=7)
    assert l1 == l2
    for (n, p), (_, q) in zip(m1.named_parameters(), m2.named_parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=n)


def test_checkpoint_saved_on_gpu_loads_on_cpu(tmp_path):
    from gpt.config import GPTConfig
    from gpt.model import GPT
    from gpt.store.checkpoint import load_arrays, save_arrays

    gpu_model, opt, _ = _train("cuda")
    save_arrays(tmp_path / "model.safetensors", gpu_model.state_dict())
    cpu_model = GPT(GPTConfig.from_preset("tiny"))
    cpu_model.load_state_dict(load_arrays(tmp_path / "model.safetensors"))
    for (n, p), (_, q) in zip(cpu_model.named_parameters(), gpu_model.named_parameters()):
        assert isinstance(p.array, np.ndarray)
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=n)
    sd = opt.state_dict()
    cpu_opt = cpu_model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    cpu_opt.load_state_dict(sd)  # moments move to the parameters' device
    assert all(isinstance(s["exp_avg"], np.ndarray) for s in cpu_opt.state.values())
