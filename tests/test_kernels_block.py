"""The fused GPT-2 block kernel against the block written op by op, and where compile emits it.

No model calls the kernel: ``tensorgrad.compile`` emits it where a traced forward holds the
stock block's ops (``compiler/patterns.py``). Here, for several (B, T, C, n_head) shapes, its
output and the gradient of the input and of each of the 12 parameters are compared with
``block_by_ops`` (the block written with tensorgrad's ops, their kernels switched off), at
float32 tolerances; its predicate declines what it does not compute; and a compiled GPT runs
it for the stock block only.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import kernels
from tensorgrad.compiler import CompileWarning
from tensorgrad.kernels.cpu_gpt2_block import GPT2_BLOCK_PARAMS

BLOCK = [k for k in kernels.registered("gpt2_block", "cpu")]
# (B, T, C, n_head): tiny, odd sizes, three heads, T over one query strip (several strips);
# T <= SHORT_T (8) runs the attention head by head: one position, gpt-nano's heads of 16;
# T <= 2·head size in one strip keeps the forward's probabilities: (2, 12, 32, 2)
SHAPES = [(2, 5, 8, 2), (3, 1, 8, 2), (4, 8, 48, 3), (3, 17, 32, 4), (1, 70, 48, 3)]
SHAPES += [(2, 300, 16, 1), (2, 12, 32, 2)]


def block_arrays(B, T, C, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,)]
    shapes += [(4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    params = []
    for name, s in zip(GPT2_BLOCK_PARAMS, shapes):
        a = r.standard_normal(s) * (0.3 if len(s) == 2 else 0.5)
        params.append(a + (1.0 if name.startswith("ln_") and name.endswith("weight") else 0.0))
    x = r.standard_normal((B, T, C))
    return x.astype(dtype), [p.astype(dtype) for p in params]


def block_by_ops(x, params, n_head, eps=1e-5, approximate="tanh"):
    """The test's oracle: x + attn(ln_1(x)), then + mlp(ln_2(x)), causal, op by op."""
    ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mlp_w, mlp_b = params
    B, T, C = x.shape
    nh, hs = n_head, C // n_head
    q, k, v = F.linear(F.layer_norm(x, C, ln1_w, ln1_b, eps), attn_w, attn_b).split(C, dim=2)
    q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(y.transpose(1, 2).contiguous().view(B, T, C), proj_w, proj_b)
    h = F.gelu(F.linear(F.layer_norm(x, C, ln2_w, ln2_b, eps), fc_w, fc_b), approximate)
    return x + F.linear(h, mlp_w, mlp_b)


def run_block(x, params, n_head, kernel=None, **kw):
    """Output and the 13 gradients of the kernel (or of block_by_ops) on copies of the arrays."""
    xt = tg.tensor(x.copy(), dtype=x.dtype, requires_grad=True)
    pt = [tg.tensor(p.copy(), dtype=p.dtype, requires_grad=True) for p in params]
    if kernel is None:
        with kernels.reference_only():
            out = block_by_ops(xt, pt, n_head, **kw)
    else:
        out = kernel.impl.apply(xt, *pt, n_head=n_head, **kw)
    w = np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype)
    (out * tg.tensor(w)).sum().backward()
    return out, [xt.grad] + [p.grad for p in pt]


def test_block_kernel_is_registered():
    assert [k.name for k in BLOCK] == ["cpu.numba.gpt2_block"]


@pytest.mark.parametrize("kernel", BLOCK, ids=[k.name for k in BLOCK])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_block_kernel_matches_the_composition(kernel, shape, approximate):
    B, T, C, nh = shape
    x, params = block_arrays(B, T, C)
    assert kernel.when(x, *params, n_head=nh, approximate=approximate)
    want, want_g = run_block(x, params, nh, approximate=approximate)
    got, got_g = run_block(x, params, nh, kernel, approximate=approximate)
    what = f"{kernel.name} at (B, T, C, nh) = {shape}, GELU {approximate}"
    assert got.dtype == np.float32
    scale = max(1.0, float(np.abs(want.detach().numpy()).max()))
    np.testing.assert_allclose(
        got.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=what
    )
    for name, g, w in zip(("x", *GPT2_BLOCK_PARAMS), got_g, want_g):
        assert g is not None and g.dtype == np.float32, f"{what}: no float32 gradient of {name}"
        scale = max(1.0, float(np.abs(w.detach().numpy()).max()))
        np.testing.assert_allclose(
            g.detach().numpy(),
            w.detach().numpy(),
            rtol=1e-4,
            atol=1e-5 * scale,
            err_msg=f"{what}: grad of {name}",
        )


@pytest.mark.parametrize("nh", [4, 2])
def test_the_block_keeps_no_gelu_output_for_its_backward(nh):
    """What the block holds until its backward, per row of C: h1, qkv (3C), y, x1, h2 and f
    (4C), 11·C floats, plus the row statistics. GELU(f) (another 4·C) is recomputed in the
    backward's GELU pass: at gpt2-124M, T = 1024, that is 151 MB less at the peak. The
    attention keeps a logsumexp per query, or its (T, T) probabilities per head where they
    are at most twice its output (T <= 2·head size, one strip: 2 heads of 8 here)."""
    B, T, C = 2, 9, 16
    x, params = block_arrays(B, T, C)
    (kernel,) = BLOCK
    xt = tg.tensor(x, requires_grad=True)
    out = kernel.impl.apply(xt, *[tg.tensor(p, requires_grad=True) for p in params], n_head=nh)
    held = sum(a.size for a in out._node.acts)
    rows = B * T
    attention = B * nh * T * (T if T <= 2 * C // nh else 1)  # probabilities, or lse
    assert held == rows * 11 * C + 4 * rows + attention, held  # (m1, r1, m2, r2)


@pytest.mark.parametrize("case", ["float64", "no_biases", "other_gelu", "odd_heads"])
def test_the_kernel_declines_what_it_does_not_compute(case):
    """compile then leaves the block's ops as they are (tests/test_compile.py)."""
    x, params = block_arrays(2, 6, 12, np.float64 if case == "float64" else np.float32)
    kw, nh = {}, 3
    if case == "no_biases":
        params = [None if n.endswith("bias") else p for n, p in zip(GPT2_BLOCK_PARAMS, params)]
    if case == "other_gelu":  # (the tanh form and the exact one, "none", it computes)
        kw["approximate"] = "sigmoid"
    if case == "odd_heads":
        nh = 5
    assert [k.when(x, *params, n_head=nh, **kw) for k in BLOCK] == [False] * len(BLOCK)


NEEDS_KERNELS = pytest.mark.skipif(
    not kernels.is_enabled(),
    reason="TG_KERNELS=0: reference ops only (the run without TG_KERNELS=0 checks it)",
)


def compiled_kernels(model, steps=3, **data) -> list[str]:
    """The steps a compiled model replays, after ``steps`` training steps."""
    from tensorgrad.compiler import compiled_forward

    tg.compile(model)
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    for _ in range(steps):
        model(idx, idx, **data)[1].backward()
    entries = compiled_forward(model).entries.values()
    ready = [v.graph for vs in entries for v in vs if v.state == "ready"]
    return [s.impl.__name__ for g in ready for s in g.plan]


def gpt(**over):
    from gpt.config import GPTConfig
    from gpt.model import GPT

    cfg = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)
    return GPT(GPTConfig(**{**cfg, **over}))


@NEEDS_KERNELS
def test_compile_emits_the_block_kernel_for_the_stock_block_only(monkeypatch):
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    from gpt import model as gm

    assert compiled_kernels(gpt()).count("NumbaGPT2Block") == 2
    assert "NumbaGPT2Block" not in compiled_kernels(gpt(dropout=0.1))  # dropout in training
    assert compiled_kernels(gpt(gelu="none")).count("NumbaGPT2Block") == 2  # the exact GELU
    # a document mask: GPT._masks computes it from the ids in NumPy, so the forward runs eagerly
    with pytest.warns(CompileWarning, match=r"GPT.forward runs eagerly: it reads a tensor's array"):
        assert "NumbaGPT2Block" not in compiled_kernels(gpt(), doc_sep=3)

    class Adapter(tg.nn.Linear):  # a replaced submodule (e.g. LoRA) runs its own forward
        def forward(self, y):
            return super().forward(y) * 2.0

    model = gpt()
    model.transformer.h[0].mlp.c_fc = Adapter(16, 64)
    assert compiled_kernels(model).count("NumbaGPT2Block") == 1  # the other block still

    monkeypatch.setattr(gm.MLP, "forward", lambda self, x: self.c_proj(F.relu(self.c_fc(x))))
    assert "NumbaGPT2Block" not in compiled_kernels(gpt())  # an edit to model.py


@NEEDS_KERNELS
@pytest.mark.parametrize(
    ("dropout", "want"),
    [
        (0.0, {"cpu.numba.gpt2_block", "cpu.numba.layer_norm", "cpu.numba.cross_entropy"}),
        (0.1, {"cpu.inplace.attention", "cpu.numba.gelu", "cpu.numba.layer_norm"}),
    ],
)
def test_a_gpt_training_step_runs_its_cpu_kernels(monkeypatch, dropout, want):
    """A predicate that stops accepting what the model passes would fall back to the
    reference silently (right numbers, slow step): name the kernels gpt-train's step (a
    compiled model) must use."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")

    names, ran, pick = {id(k.impl): k.name for k in kernels.registered()}, set(), kernels.pick

    def recording_pick(*args, **kwargs):
        impl = pick(*args, **kwargs)
        if impl is not None:
            ran.add(names[id(impl)])
        return impl

    monkeypatch.setattr(kernels, "pick", recording_pick)
    model = gpt(dropout=dropout, block_size=16)
    compiled_kernels(model)
    tg.optim.AdamW(model.parameters()).step()
    assert want <= ran, f"missing {sorted(want - ran)}; ran {sorted(ran)}"
