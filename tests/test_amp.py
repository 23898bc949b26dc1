"""The names a PyTorch training script reaches for outside the model (issue 28): GradScaler
by its semantics in float16 on the CPU (a skipped step on overflow, backoff, growth after the
interval, state_dict), autocast, backends.*.allow_tf32, tensorgrad.cuda's helpers without a
GPU, bfloat16, compile."""

import warnings

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.amp as amp
from tensorgrad.cuda import get_matmul_precision, set_matmul_precision

no_gpu = pytest.mark.skipif(
    tg.cuda.is_available(), reason="checks the behaviour without a GPU: run where CuPy finds none"
)
# NumPy warns where a float16 product overflows to inf (PyTorch does not): the tests that
# overflow on purpose assert that warning where it arises
OVERFLOW = "overflow encountered"


@pytest.fixture(autouse=True)
def _precision():
    before = get_matmul_precision()
    yield
    set_matmul_precision(before)


def half_step(scaler, opt, w, x):
    """One float16 step: loss = sum(w * x), scaled, backward, step, update."""
    opt.zero_grad()
    scaler.scale((w * x).sum()).backward()
    out = scaler.step(opt)
    scaler.update()
    return out


def half_param(values):
    return tg.tensor(np.asarray(values, np.float16), requires_grad=True)


def test_scaled_gradients_are_unscaled_before_the_step():
    w = half_param([1.0, 2.0])
    opt = tg.optim.SGD([w], lr=0.5)
    scaler = amp.GradScaler("cpu", init_scale=1024.0)
    opt.zero_grad()
    loss = scaler.scale((w * tg.tensor(np.float16([0.25, 0.5]))).sum())
    assert loss.dtype == np.float16 and float(loss.item()) == 1024.0 * 1.25
    loss.backward()
    scaler.unscale_(opt)
    np.testing.assert_array_equal(w.grad.numpy(), np.float16([0.25, 0.5]))
    scaler.step(opt)
    scaler.update()
    np.testing.assert_array_equal(w.detach().numpy(), np.float16([0.875, 1.75]))
    assert scaler.get_scale() == 1024.0


def test_overflow_skips_the_step_and_halves_the_scale():
    w = half_param([1.0])
    opt = tg.optim.SGD([w], lr=0.1)
    scaler = amp.GradScaler("cpu", init_scale=2.0**16)
    x = tg.tensor(np.float16([1.5]))  # grad 1.5 * 65536 overflows float16 (max 65504)
    with pytest.warns(RuntimeWarning, match=OVERFLOW):
        half_step(scaler, opt, w, x)
    assert w.detach().numpy()[0] == 1.0  # the step was skipped
    assert scaler.get_scale() == 2.0**15
    half_step(scaler, opt, w, x)  # 1.5 * 32768 fits: this one steps
    assert w.detach().numpy()[0] == np.float16(1.0 - 0.1 * 1.5)
    assert scaler.get_scale() == 2.0**15


def test_nan_gradient_skips_the_step():
    w = half_param([1.0, 1.0])
    opt = tg.optim.SGD([w], lr=0.1)
    scaler = amp.GradScaler("cpu", init_scale=4.0)
    half_step(scaler, opt, w, tg.tensor(np.float16([np.nan, 1.0])))
    np.testing.assert_array_equal(w.detach().numpy(), [1.0, 1.0])
    assert scaler.get_scale() == 2.0


def test_growth_after_interval_clean_steps_and_reset_by_overflow():
    w = half_param([1.0])
    opt = tg.optim.SGD([w], lr=0.0)
    scaler = amp.GradScaler("cpu", init_scale=8.0, growth_interval=3, growth_factor=2.0)
    ok, bad = tg.tensor(np.float16([1.0])), tg.tensor(np.float16([np.inf]))
    scales = []
    for x in (ok, ok, ok, ok, ok, ok, bad, ok, ok, ok):
        half_step(scaler, opt, w, x)
        scales.append(scaler.get_scale())
    assert scales == [8, 8, 16, 16, 16, 32, 16, 16, 16, 32]


def test_misuse_errors():
    w = half_param([1.0])
    opt = tg.optim.SGD([w], lr=0.1)
    scaler = amp.GradScaler("cpu")
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    with pytest.warns(RuntimeWarning, match=OVERFLOW):  # 1.0 * 65536 (the default scale)
        scaler.scale((w * 1.0).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(ValueError, match="backoff_factor"):
        amp.GradScaler("cpu", backoff_factor=1.5)


def test_state_dict_round_trip_through_save(tmp_path):
    scaler = amp.GradScaler("cpu", init_scale=512.0, growth_interval=7)
    scaler._growth_tracker = 3
    tg.save({"scaler": scaler.state_dict()}, tmp_path / "s.pt")
    other = amp.GradScaler("cpu")
    other.load_state_dict(tg.load(tmp_path / "s.pt")["scaler"])
    assert other.state_dict() == scaler.state_dict()
    assert other.get_scale() == 512.0 and other.get_growth_interval() == 7
    with pytest.raises(RuntimeError, match="empty"):
        other.load_state_dict({})


def test_disabled_scaler_is_a_pass_through():
    w = half_param([1.0])
    opt = tg.optim.SGD([w], lr=0.5)
    scaler = amp.GradScaler("cpu", enabled=False)
    loss = (w * 2.0).sum()
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert w.detach().numpy()[0] == 0.0 and scaler.state_dict() == {}
    with pytest.raises(RuntimeError, match="disabled"):
        scaler.load_state_dict({"scale": 1.0})


@no_gpu
def test_cuda_scaler_and_autocast_disable_themselves_without_a_gpu():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        s = tg.cuda.amp.GradScaler()
    assert not s.is_enabled()
    with pytest.warns(UserWarning, match="CUDA is not available"):
        ctx = tg.amp.autocast(device_type="cuda", dtype=tg.bfloat16)
    with ctx:
        assert get_matmul_precision() == "highest"


def test_autocast_on_the_cpu_casts_matmuls_and_leaves_gpu_precision_alone():
    x = tg.randn(3, 4)
    with tg.autocast("cpu", dtype=tg.bfloat16):
        y = x @ x.T
        assert get_matmul_precision() == "highest"
    assert y.dtype == tg.bfloat16 and (x @ x.T).dtype == np.float32  # (tests/test_bfloat16.py)


def test_autocast_on_cuda_sets_matmul_precision_for_the_block(monkeypatch):
    monkeypatch.setattr(amp, "cuda_available", lambda: True)  # the mapping, without a GPU
    set_matmul_precision("tf32")
    with tg.amp.autocast(device_type="cuda", dtype=tg.bfloat16):
        assert get_matmul_precision() == "bf16"
    assert get_matmul_precision() == "tf32"

    @tg.autocast("cuda")
    def inside():
        return get_matmul_precision()

    assert inside() == "bf16" and get_matmul_precision() == "tf32"
    with pytest.raises(ValueError, match="float16 is not supported on cuda"):
        tg.amp.autocast("cuda", dtype=tg.float16)


def test_backends_allow_tf32_is_the_matmul_precision():
    set_matmul_precision("highest")
    assert tg.backends.cuda.matmul.allow_tf32 is False
    tg.backends.cuda.matmul.allow_tf32 = True
    assert get_matmul_precision() == "tf32" and tg.backends.cuda.matmul.allow_tf32
    tg.backends.cuda.matmul.allow_tf32 = False
    assert get_matmul_precision() == "highest"
    set_matmul_precision("bf16")
    tg.backends.cuda.matmul.allow_tf32 = True  # does not lower bf16 back to tf32
    assert get_matmul_precision() == "bf16"
    tg.backends.cudnn.allow_tf32 = True
    assert tg.backends.cudnn.allow_tf32 is True


@no_gpu
def test_cuda_helpers_without_a_gpu():
    assert tg.cuda.is_bf16_supported() is False and tg.cuda.device_count() == 0
    tg.cuda.synchronize()
    tg.cuda.manual_seed_all(5)
    tg.cuda.manual_seed(5)
    with pytest.raises(RuntimeError, match="set_device"):
        tg.cuda.set_device("cuda:0")


def test_cuda_manual_seed_seeds_only_the_gpu_generator():
    from tensorgrad.devices import generators

    tg.manual_seed(1)
    a = tg.rand(3).numpy()
    tg.manual_seed(1)
    tg.cuda.manual_seed(99)
    assert generators.cuda_seed == 99 and generators.seed == 1
    np.testing.assert_array_equal(tg.rand(3).numpy(), a)  # the CPU stream is untouched
    tg.manual_seed(2)
    assert generators.cuda_seed == 2


def test_compile_returns_the_model_compiled_in_place():
    """As torch.compile: the same module back (state_dict keys unchanged), any mode accepted;
    tests/test_compile.py checks what it does."""
    m = tg.nn.Linear(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tg.compile(m) is m
        assert tg.compile(m, mode="max-autotune") is m
    assert list(m.state_dict()) == ["weight", "bias"]


def test_nanogpt_checkpoint_dict_round_trips_through_save_and_load(tmp_path):
    model = tg.nn.Sequential(tg.nn.Linear(3, 4), tg.nn.LayerNorm(4))
    opt = tg.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(tg.randn(2, 3)).sum().backward()
    opt.step()
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "model_args": dict(n_layer=4, n_head=4, bias=False, vocab_size=None, dropout=0.0),
        "iter_num": 250,
        "best_val_loss": tg.tensor([2.5, 2.25]).mean(),
        "config": {"out_dir": "out", "compile": False, "learning_rate": 1e-3},
    }
    tg.save(ckpt, tmp_path / "ckpt.pt")
    back = tg.load(tmp_path / "ckpt.pt", map_location="cpu")
    assert back["model_args"] == ckpt["model_args"] and back["config"] == ckpt["config"]
    assert back["iter_num"] == 250 and float(back["best_val_loss"]) == 2.375
    fresh = tg.nn.Sequential(tg.nn.Linear(3, 4), tg.nn.LayerNorm(4))
    fresh.load_state_dict(back["model"])
    opt2 = tg.optim.AdamW(fresh.parameters(), lr=1e-3, betas=(0.9, 0.95))
    opt2.load_state_dict(back["optimizer"])
    for p, q in zip(model.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
