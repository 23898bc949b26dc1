"""bfloat16: ``tensorgrad.bfloat16`` is a tensor dtype stored through ml_dtypes. Rounding is
PyTorch's bit for bit (checked on 10^6 float32 patterns against a NumPy reference written
here), promotion is PyTorch's, each op computes in float32 and rounds once, gradients flow
through casts, and CPU autocast runs matmul / linear / attention in bfloat16 and the losses in
float32. Where torch is installed the same programs run in PyTorch and are compared."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.compiler import CompileWarning

pytest.importorskip("ml_dtypes", reason="pip install ml_dtypes (a default dependency)")
TORCH = "torch is not installed: pip install -e '.[bench]' (or pip install torch==2.13.0)"
EDGES = [
    *(0x00000000, 0x80000000, 0x7F800000, 0xFF800000),  # ±0, ±inf
    *(0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF),  # NaNs (payload low only)
    *(0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF),  # float32 max overflows; a tie at max
    *(0x00000001, 0x00007FFF, 0x00008000, 0x00018000, 0x00008001, 0x007FFFFF, 0x80000001),
    *(0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF),  # ties to even, just above, just below
]


def rne_reference(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 bit patterns: round to nearest, ties to even, on the upper 16
    bits (NaN patterns are meaningless here: they only have to stay NaN)."""
    u = bits.astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def patterns(n: int = 10**6) -> np.ndarray:
    drawn = np.random.default_rng(0).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.array(EDGES, np.uint32), drawn])


def bits(t) -> np.ndarray:
    """The bfloat16 bits of a tensorgrad or torch tensor."""
    if isinstance(t, tg.Tensor):
        return t.array.view(np.uint16)
    import torch

    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def bf16(a):
    return tg.tensor(np.asarray(a, np.float32)).to(tg.bfloat16)


def _compare_bits(got, want, what):
    diff = np.flatnonzero(got != want)
    assert not diff.size, (
        f"{what}: {diff.size} of {got.size} differ, first at {diff[0]}: "
        f"{got.flat[diff[0]]:#06x} != {want.flat[diff[0]]:#06x}"
    )


# ----------------------------------------------------------------------------- rounding


def test_rounding_is_round_to_nearest_even_on_a_million_float32_patterns():
    b = patterns()
    f = b.view(np.float32)
    nan = np.isnan(f)
    with np.errstate(invalid="ignore"):  # (a signaling NaN raises the invalid flag)
        for t in (tg.tensor(f).to(tg.bfloat16), tg.tensor(f, dtype=tg.bfloat16)):
            got = bits(t)
            _compare_bits(got[~nan], rne_reference(b)[~nan], "float32 -> bfloat16")
            assert np.isnan(t.float().array[nan]).all(), "a NaN did not stay NaN"
            back = t.float().array.view(np.uint32)  # bfloat16 -> float32 is exact
            np.testing.assert_array_equal(back, got.astype(np.uint32) << 16)
    assert bits(bf16([3.4e38, -3.4e38])).tolist() == [0x7F80, 0xFF80]  # overflow to ±inf


def test_rounding_matches_torch_bit_for_bit():
    torch = pytest.importorskip("torch", reason=TORCH)
    b = patterns()
    f = b.view(np.float32)
    nan = np.isnan(f)
    with np.errstate(invalid="ignore"):
        got = bits(tg.tensor(f).bfloat16())
    want = bits(torch.from_numpy(f.copy()).bfloat16())
    _compare_bits(got[~nan], want[~nan], "tensorgrad against torch")
    # NaN stays NaN in both (its bits differ: torch's vector path writes 0xFFFF)
    assert ((got[nan] & 0x7F80) == 0x7F80).all() and (got[nan] & 0x7F).all()


def test_a_float64_rounds_through_float32_as_in_pytorch():
    v = 1.00390625 + 1e-12  # just above a tie of bfloat16; float32 rounds it onto the tie
    got = [
        tg.tensor([v], dtype=tg.bfloat16),
        tg.tensor(np.array([v])).bfloat16(),
        tg.tensor([2**30 + 2**22 + 1]).bfloat16(),  # an int64 too
    ]
    # then ties to even go down; rounded directly, each would go up (1.0078125, 2**30 + 2**23)
    assert [t.float().item() for t in got] == [1.0, 1.0, 2.0**30]


# ----------------------------------------------------------------------------- the dtype


def test_bfloat16_is_a_tensor_dtype_as_in_pytorch():
    x = tg.tensor([1.0, 2.5, -0.1, 1e-3], dtype=tg.bfloat16)
    assert x.dtype == tg.bfloat16 and x.dtype == "torch.bfloat16"
    assert repr(tg.bfloat16) == "torch.bfloat16"
    assert tg.bfloat16.is_floating_point and x.is_floating_point() and x.element_size() == 2
    assert tg.finfo(tg.bfloat16).eps == 2**-7 and tg.finfo(tg.bfloat16).bits == 16
    assert repr(x) == (
        "tensor([ 1.0000e+00,  2.5000e+00, -1.0010e-01,  9.9945e-04],\n       dtype=torch.bfloat16)"
    )
    assert repr(tg.tensor(3.14159, dtype=tg.bfloat16)) == "tensor(3.1406, dtype=torch.bfloat16)"
    assert x[2].item() == -0.10009765625 and type(x[2].item()) is float
    assert x.tolist() == [1.0, 2.5, -0.10009765625, 0.00099945068359375]
    assert x.float().dtype == tg.float32 and x.bfloat16() is x
    with pytest.raises(TypeError, match="^Got unsupported ScalarType BFloat16$"):
        x.numpy()  # as PyTorch: NumPy has no bfloat16 (.float().numpy() has the values)
    assert tg.randn(3, dtype=tg.bfloat16).dtype == tg.bfloat16
    assert tg.zeros(2).to(dtype=tg.bfloat16).dtype == tg.bfloat16


def test_a_module_casts_to_bfloat16_and_back():
    m = nn.Linear(3, 2).bfloat16()
    assert {p.dtype for p in m.parameters()} == {tg.bfloat16}
    assert m(tg.ones(1, 3).bfloat16()).dtype == tg.bfloat16
    m.to(tg.float32)
    assert {p.dtype for p in m.parameters()} == {tg.float32}


def test_views_and_in_place_writes_keep_bfloat16_memory():
    x = bf16(np.arange(6.0))
    v = x.view(2, 3)[1]  # a view: shares x's memory
    v += 0.5  # computed in float32, rounded, written through
    x[0] = 1.25
    assert x.dtype == tg.bfloat16 and x.float().tolist() == [1.25, 1, 2, 3.5, 4.5, 5.5]


@pytest.mark.parametrize(
    ("name", "program", "dtype"),
    [
        ("bf16 + bf16", lambda L, b: b + b, "bfloat16"),
        ("bf16 + float32", lambda L, b: b + L.ones(4), "float32"),
        ("bf16 + python float", lambda L, b: b + 0.5, "bfloat16"),
        ("bf16 * int", lambda L, b: b * 3, "bfloat16"),
        ("bf16 + float16", lambda L, b: b + L.ones(4, dtype=L.float16), "float32"),
        ("bf16 + float64", lambda L, b: b + L.ones(4, dtype=L.float64), "float64"),
        ("int64 + bf16", lambda L, b: L.arange(4) + b, "bfloat16"),
        ("bool + bf16", lambda L, b: L.ones(4, dtype=L.bool) + b, "bfloat16"),
        ("bf16 + 0-d float32", lambda L, b: b + L.tensor(2.0), "bfloat16"),
        ("bf16 / int tensor", lambda L, b: b / L.arange(1, 5), "bfloat16"),
        ("bf16 > 0", lambda L, b: b > 0, "bool"),
        ("result_type", lambda L, b: L.empty(0, dtype=L.result_type(b, 1.0)), "bfloat16"),
    ],
)
def test_type_promotion_is_pytorchs(name, program, dtype):
    b = tg.tensor([1.0, -2.0, 3.0, 0.5]).bfloat16()
    assert str(program(tg, b).dtype) == f"torch.{dtype}", name
    try:  # and PyTorch agrees, where installed
        import torch
    except ImportError:
        return
    tb = torch.tensor([1.0, -2.0, 3.0, 0.5]).bfloat16()
    assert str(program(torch, tb).dtype) == f"torch.{dtype}", name


def test_an_op_of_mixed_inputs_takes_its_first_floating_inputs_dtype():
    x = tg.tensor(A[:3, :8]).bfloat16()
    # layer_norm of bfloat16 with float32 weights is bfloat16 in PyTorch; binary ops promote
    assert F.layer_norm(x, (8,), tg.ones(8), tg.zeros(8)).dtype == tg.bfloat16
    assert tg.where(x > 0, x, tg.ones(3, 8)).dtype == tg.float32
    assert x.maximum(tg.ones(3, 8)).dtype == tg.float32


# ----------------------------------------------------------------------------- ops


def _rounded(a32: np.ndarray) -> np.ndarray:
    """float32 results rounded once to bfloat16 bits, by the reference above."""
    return rne_reference(np.ascontiguousarray(a32, np.float32).view(np.uint32))


RNG = np.random.default_rng(1)
A = RNG.standard_normal((64, 96)).astype(np.float32)
B = RNG.standard_normal((64, 96)).astype(np.float32)
W = RNG.standard_normal((96, 48)).astype(np.float32)
A16, B16, W16 = (bf16(a).float().array for a in (A, B, W))  # their bfloat16 values

OPS = [  # (name, on tensorgrad, on torch, the float32 NumPy formula on the bfloat16 values)
    ("add", lambda x, y, w: x + y, None, lambda: A16 + B16),
    ("mul", lambda x, y, w: x * y, None, lambda: A16 * B16),
    ("exp", lambda x, y, w: x.exp(), None, lambda: np.exp(A16)),
    ("matmul", lambda x, y, w: x @ w, None, lambda: A16 @ W16),  # float32 accumulation
    ("sum", lambda x, y, w: x.sum(), None, lambda: A16.sum()),
    ("sum(0)", lambda x, y, w: x.sum(0), None, lambda: A16.sum(0)),
    ("softmax", lambda x, y, w: F.softmax(x, -1), lambda x, y, w: x.softmax(-1), None),
    ("x * 0.1", lambda x, y, w: x * 0.1, None, lambda: A16 * np.float32(0.1)),
    # PyTorch's add kernel rounds the number to bfloat16 first (its mul does not)
    ("x + 0.1", lambda x, y, w: x + 0.1, None, lambda: A16 + np.float32(0.10009765625)),
]


@pytest.mark.parametrize(("name", "f", "_", "ref"), [o for o in OPS if o[3]], ids=lambda v: v)
def test_an_op_computes_in_float32_and_rounds_once(name, f, _, ref):
    got = f(bf16(A), bf16(B), bf16(W))
    assert got.dtype == tg.bfloat16, name
    _compare_bits(bits(got).ravel(), _rounded(ref()).ravel(), name)


def test_a_long_sum_accumulates_in_float32():
    ones = tg.ones(4096, dtype=tg.bfloat16)
    assert ones.sum().item() == 4096.0  # a bfloat16 accumulator stops at 256
    assert ones.mean().item() == 1.0 and ones.reshape(64, 64).sum(0).float().tolist() == [64] * 64
    w = tg.ones(96, 48, dtype=tg.bfloat16)
    assert ((tg.ones(8, 96, dtype=tg.bfloat16) @ w).float().numpy() == 96).all()


@pytest.mark.parametrize(("name", "f", "g", "_"), OPS, ids=lambda v: v)
def test_an_op_matches_torch_bit_for_bit(name, f, g, _):
    torch = pytest.importorskip("torch", reason=TORCH)
    g = g or f
    got = f(bf16(A), bf16(B), bf16(W))
    want = g(*(torch.from_numpy(a.copy()).bfloat16() for a in (A, B, W)))
    assert want.dtype == torch.bfloat16
    _compare_bits(bits(got).ravel(), bits(want).ravel(), name)


def test_matmul_matches_torch_for_long_rows():
    torch = pytest.importorskip("torch", reason=TORCH)
    for k in (8, 1000):
        x = RNG.standard_normal((32, k)).astype(np.float32)
        y = RNG.standard_normal((k, 16)).astype(np.float32)
        got = bf16(x) @ bf16(y)
        want = torch.from_numpy(x).bfloat16() @ torch.from_numpy(y).bfloat16()
        _compare_bits(bits(got).ravel(), bits(want).ravel(), f"matmul over {k}")


# ----------------------------------------------------------------------------- gradients


def test_the_gradient_of_a_cast_is_cast_back():
    x = tg.tensor([0.1, 0.2, 0.3], requires_grad=True)
    w = tg.tensor([1.5, -2.0, 0.3]).bfloat16()
    (x.to(tg.bfloat16) * w).float().sum().backward()
    assert x.grad.dtype == tg.float32 and x.grad.tolist() == w.float().tolist()
    p = tg.ones(3, dtype=tg.bfloat16, requires_grad=True)
    (p.float() * 2).sum().backward()
    assert p.grad.dtype == tg.bfloat16 and p.grad.float().tolist() == [2.0] * 3


def test_a_broadcast_gradient_is_summed_in_float32():
    b = tg.zeros(4, dtype=tg.bfloat16, requires_grad=True)
    (tg.ones(1000, 4, dtype=tg.bfloat16) + b).float().sum().backward()
    assert b.grad.dtype == tg.bfloat16 and b.grad.float().tolist() == [1000.0] * 4


def _grad_program(L, F_, x, w):
    h = x.to(L.bfloat16) @ w.to(L.bfloat16)  # (8, 4) bfloat16
    y = F_.softmax(h * 0.5, -1).exp().sum(-1).float()
    return (y * y).sum()


def test_gradients_match_torch_within_bfloat16_rounding():
    torch = pytest.importorskip("torch", reason=TORCH)
    x0 = RNG.standard_normal((8, 16)).astype(np.float32)
    w0 = RNG.standard_normal((16, 4)).astype(np.float32)
    x, w = tg.tensor(x0, requires_grad=True), tg.tensor(w0, requires_grad=True)
    tx, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    loss = _grad_program(tg, F, x, w)
    tloss = _grad_program(torch, torch.nn.functional, tx, tw)
    loss.backward()
    tloss.backward()
    assert loss.item() == tloss.item()  # the forward is bit for bit
    for got, want in ((x.grad, tx.grad), (w.grad, tw.grad)):
        want = want.numpy()  # float32: a few bfloat16 roundings in the backward may differ
        np.testing.assert_allclose(got.numpy(), want, atol=8 * 2**-8 * np.abs(want).max())


# ----------------------------------------------------------------------------- autocast


def test_autocast_casts_pytorchs_cpu_list_and_nothing_else():
    x, w, b = tg.randn(4, 8), tg.randn(8, 8), tg.randn(8)
    t = tg.tensor([1, 2, 3, 4])
    with tg.autocast("cpu", dtype=tg.bfloat16):
        low = [x @ w, x.mm(w), F.linear(x, w, b), nn.Linear(8, 8)(x), tg.bmm(x[None], w[None])]
        low.append(F.scaled_dot_product_attention(x[None], x[None], x[None], is_causal=True))
        logits = x @ w
        logp = F.log_softmax(logits, -1)
        fp32 = [
            F.cross_entropy(logits, t),
            F.mse_loss(logits, x),
            logits.prod(),
            F.nll_loss(logp, t),
        ]
        kept = [F.softmax(x, -1), x.exp(), logits.exp(), x + logits, F.layer_norm(x, (8,))]
        f64 = x.double() @ w.double()
        with tg.autocast("cpu", enabled=False):
            off = x @ w
    assert [o.dtype for o in low] == [tg.bfloat16] * 6
    assert [o.dtype for o in fp32] == [tg.float32] * 4
    assert [o.dtype for o in kept] == [tg.float32, tg.float32, tg.bfloat16, tg.float32, tg.float32]
    assert f64.dtype == tg.float64 and off.dtype == tg.float32 and (x @ w).dtype == tg.float32
    np.testing.assert_array_equal(low[0].float().numpy(), (x.bfloat16() @ w.bfloat16()).float())


def test_autocast_gradients_reach_float32_weights_as_float32():
    lin = nn.Linear(8, 3)
    with tg.autocast("cpu"):
        loss = F.cross_entropy(lin(tg.randn(5, 8)), tg.tensor([0, 1, 2, 0, 1]))
    loss.backward()
    assert loss.dtype == tg.float32 and lin.weight.grad.dtype == tg.float32
    assert lin.bias.grad.dtype == tg.float32 and lin.weight.dtype == tg.float32


def test_autocast_float16_and_unsupported_dtypes_as_pytorch():
    x = tg.randn(2, 2)
    with tg.autocast("cpu", dtype=tg.float16):
        assert (x @ x).dtype == tg.float16
    with pytest.warns(UserWarning, match="CPU Autocast only supports dtypes of torch.bfloat16"):
        block = tg.autocast("cpu", dtype=tg.float32)
    with block:
        assert (x @ x).dtype == tg.float32


def test_autocast_is_per_thread():
    seen = []
    with tg.autocast("cpu"):
        t = threading.Thread(target=lambda: seen.append((tg.ones(2, 2) @ tg.ones(2, 2)).dtype))
        t.start()
        t.join()
    assert seen == [tg.float32]


@pytest.mark.parametrize("lib", ["tensorgrad", "torch"])
def test_autocast_dtypes_are_torchs(lib):
    if lib == "torch":
        L = pytest.importorskip("torch", reason=TORCH)
        import torch.nn.functional as F_
    else:
        L, F_ = tg, F
    x, w, t = L.ones(4, 8), L.ones(8, 8), L.tensor([1, 2, 3, 4])
    with L.autocast("cpu", dtype=L.bfloat16):
        h = x @ w
        out = [h, F_.softmax(h, -1), F_.cross_entropy(h, t), h + x, F_.gelu(h), h.sum()]
    assert [str(o.dtype)[6:] for o in out] == [
        *("bfloat16", "bfloat16", "float32", "float32", "bfloat16", "bfloat16"),
    ]


def test_a_gpt_step_under_autocast_matches_torch(monkeypatch):
    """gpt/model.py's forward and backward under CPU autocast against PyTorch's, with the
    twin's attention written as the model writes it (PyTorch's fused attention kernel keeps
    the scores in float32, so it differs by ~1e-5 in the loss)."""
    torch = pytest.importorskip("torch", reason=TORCH)
    from benchmarks import torch_gpt
    from gpt.config import GPTConfig
    from gpt.model import GPT

    def as_written(self, x, cache=None, layer=0):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = (a.view(B, T, nh, hs).transpose(1, 2) for a in self.c_attn(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    monkeypatch.setattr(torch_gpt.CausalSelfAttention, "forward", as_written)
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=64)
    tg.manual_seed(0)
    model = GPT(cfg)
    twin = torch_gpt.TorchGPT(cfg)
    torch_gpt.load_tensorgrad_state(twin, model)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, 64, (4, 32)), rng.integers(0, 64, (4, 32))
    with tg.autocast("cpu", dtype=tg.bfloat16):
        logits, loss = model(tg.tensor(idx), tg.tensor(tgt))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tlogits, tloss = twin(torch.tensor(idx), torch.tensor(tgt))
    assert logits.dtype == tg.bfloat16 and tlogits.dtype == torch.bfloat16
    assert loss.dtype == tg.float32 and abs(loss.item() - tloss.item()) < 1e-5
    loss.backward()
    tloss.backward()
    theirs = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        want = theirs[name].grad.numpy()
        assert p.grad.dtype == tg.float32
        np.testing.assert_allclose(
            p.grad.numpy(), want, atol=0.03 * np.abs(want).max(), err_msg=name
        )


# ----------------------------------------------------------------------------- compile, install


def test_compile_runs_bfloat16_eagerly_and_says_so():
    tg.manual_seed(0)
    m = nn.Linear(4, 4).bfloat16()
    c = tg.compile(nn.Linear(4, 4).bfloat16())
    c.load_state_dict(m.state_dict())
    x = tg.randn(3, 4).bfloat16()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = c(x)
    assert any(
        issubclass(w.category, CompileWarning) and "bfloat16" in str(w.message) for w in seen
    )
    np.testing.assert_array_equal(bits(got), bits(m(x)))


def test_without_ml_dtypes_bfloat16_says_how_to_install_it():
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import tensorgrad as tg\n"
        "print(repr(tg.bfloat16))\n"
        "for f in (lambda: tg.zeros(2, dtype=tg.bfloat16), lambda: tg.ones(2).bfloat16()):\n"
        "    try:\n"
        "        f()\n"
        "    except TypeError as e:\n"
        "        print(e)\n"
        "with tg.autocast('cpu'):\n"
        "    try:\n"
        "        tg.ones(2, 2) @ tg.ones(2, 2)\n"
        "    except TypeError as e:\n"
        "        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "tensorgrad.bfloat16"
    said = "tensorgrad.bfloat16 tensors need ml_dtypes (NumPy's bfloat16): pip install ml_dtypes"
    assert lines[1:] == [said] * 3


def test_view_as_int16_gives_the_bits_as_llm_c_writes_them():
    """llm.c's write_bf16: ``t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()``."""
    x = tg.tensor(np.array([[1.0, -2.5, 3.1415927, 65504.0]], np.float32))
    bits = x.to(tg.bfloat16).view(tg.int16)
    assert bits.dtype == tg.int16 and bits.shape == (1, 4)
    want = (x.numpy().view(np.uint32) + 0x7FFF + ((x.numpy().view(np.uint32) >> 16) & 1)) >> 16
    np.testing.assert_array_equal(bits.numpy().view(np.uint16), want.astype(np.uint16))
    assert x.view(tg.int32).shape == (1, 4) and x.view(tg.int16).shape == (1, 8)
    with pytest.raises(RuntimeError, match="contiguous"):
        tg.randn(2, 3).t().view(tg.int16)


def test_save_and_load_keep_bfloat16_as_safetensors_bf16(tmp_path):
    import json

    x = tg.randn(3, 5).to(tg.bfloat16)
    tg.save({"w": x, "f": tg.ones(2)}, tmp_path / "ck.pt")
    back = tg.load(tmp_path / "ck.pt")
    assert back["w"].dtype == tg.bfloat16 and back["f"].dtype == tg.float32
    np.testing.assert_array_equal(back["w"].view(tg.int16).numpy(), x.view(tg.int16).numpy())
    raw = (tmp_path / "ck.pt").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16", "F32"}


def test_tied_weights_are_saved_once_and_load_shared(tmp_path):
    """A state dict naming one tensor twice (GPT-2's wte and lm_head) stores its bytes once,
    as torch.save does; the loaded entries share their memory. Distinct scalars stay
    distinct (a temporary array's id is never taken for another's)."""
    w = tg.randn(64, 32)
    tg.save({"wte": w, "lm_head": w, "a": np.float32(1.0), "b": np.float32(2.0)}, tmp_path / "t")
    assert (tmp_path / "t").stat().st_size < 64 * 32 * 4 * 1.5
    back = tg.load(tmp_path / "t")
    assert np.shares_memory(back["wte"].array, back["lm_head"].array)
    np.testing.assert_array_equal(back["wte"].numpy(), w.numpy())
    assert (back["a"], back["b"]) == (1.0, 2.0)
