"""The fused GPT-2 block kernel against its reference, the composition of ops.

For every kernel registered for op 'gpt2_block' and several (B, T, C, n_head) shapes, the
output of ``tensorgrad.functional.gpt2_block`` and the gradient of the input and of each of
the 12 parameters are compared with ``gpt2_block_reference`` (the kernels of the composed ops
switched off too), at float32 tolerances. Also: where the kernel must not run (float64,
missing biases, the erf GELU) the reference does; create_graph differentiates through it;
and gpt's Block uses it only when no dropout, mask, cache or hook is in play.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.functional as F
from tensorgrad import kernels

BLOCK = [k for k in kernels.registered("gpt2_block", "cpu")]
# (B, T, C, n_head): tiny, odd sizes, three heads, T over one query strip (several strips)
SHAPES = [(2, 5, 8, 2), (3, 17, 32, 4), (1, 70, 48, 3), (2, 300, 16, 1)]


def block_arrays(B, T, C, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,)]
    shapes += [(4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    params = []
    for name, s in zip(F.GPT2_BLOCK_PARAMS, shapes):
        a = r.standard_normal(s) * (0.3 if len(s) == 2 else 0.5)
        params.append(a + (1.0 if name.startswith("ln_") and name.endswith("weight") else 0.0))
    x = r.standard_normal((B, T, C))
    return x.astype(dtype), [p.astype(dtype) for p in params]


def run_block(x, params, n_head, **kw):
    """Output, the 13 gradients, and the graph node's type of one gpt2_block call."""
    xt = tg.tensor(x.copy(), dtype=x.dtype, requires_grad=True)
    pt = [
        None if p is None else tg.tensor(p.copy(), dtype=p.dtype, requires_grad=True)
        for p in params
    ]
    out = F.gpt2_block(xt, pt, n_head, **kw)
    w = np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype)
    (out * tg.tensor(w)).sum().backward()
    grads = [xt.grad] + [None if p is None else p.grad for p in pt]
    return out, grads, type(out._node).__name__


def test_block_kernel_is_registered():
    assert [k.name for k in BLOCK] == ["cpu.numba.gpt2_block"]


@pytest.mark.parametrize("kernel", BLOCK, ids=[k.name for k in BLOCK])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_block_kernel_matches_the_composition(kernel, shape):
    B, T, C, nh = shape
    x, params = block_arrays(B, T, C)
    assert kernel.when(x, *params, n_head=nh)
    with kernels.reference_only():
        want, want_g, want_node = run_block(x, params, nh)
    with kernels.only(kernel.name):
        got, got_g, got_node = run_block(x, params, nh)
    assert want_node != got_node == kernel.impl.__name__, "the kernel did not run"
    what = f"{kernel.name} at (B, T, C, nh) = {shape}"
    assert got.dtype == np.float32
    scale = max(1.0, float(np.abs(want.detach().numpy()).max()))
    np.testing.assert_allclose(
        got.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=what
    )
    for name, g, w in zip(("x", *F.GPT2_BLOCK_PARAMS), got_g, want_g):
        assert g is not None and g.dtype == np.float32, f"{what}: no float32 gradient of {name}"
        scale = max(1.0, float(np.abs(w.detach().numpy()).max()))
        np.testing.assert_allclose(
            g.detach().numpy(),
            w.detach().numpy(),
            rtol=1e-4,
            atol=1e-5 * scale,
            err_msg=f"{what}: grad of {name}",
        )


@pytest.mark.parametrize("case", ["float64", "no_biases", "erf_gelu", "odd_heads"])
def test_the_reference_runs_where_the_kernel_does_not_apply(case):
    x, params = block_arrays(2, 6, 12, np.float64 if case == "float64" else np.float32)
    kw, nh = {}, 3
    if case == "no_biases":
        params = [None if n.endswith("bias") else p for n, p in zip(F.GPT2_BLOCK_PARAMS, params)]
    if case == "erf_gelu":
        kw["approximate"] = "none"
    if case == "odd_heads":
        with pytest.raises(ValueError, match="divisible by n_head=5"):
            run_block(x, params, 5)
        return
    got, got_g, node = run_block(x, params, nh, **kw)
    with kernels.reference_only():
        want, want_g, _ = run_block(x, params, nh, **kw)
    assert node == "Add"  # the composition's last op, not the fused kernel
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    for g, w, p in zip(got_g, want_g, [x, *params]):
        assert (g is None) == (p is None)


NEEDS_KERNELS = pytest.mark.skipif(
    not kernels.is_enabled(), reason="TG_KERNELS=0: reference ops only (the other run checks it)"
)


@NEEDS_KERNELS
def test_create_graph_through_the_block_matches_the_reference():
    x, params = block_arrays(2, 7, 8)

    def second_order():
        xt = tg.tensor(x.copy(), requires_grad=True)
        pt = [tg.tensor(p.copy(), requires_grad=True) for p in params]
        out = F.gpt2_block(xt, pt, 2)
        (gx,) = tg.autograd.grad((out * out).sum(), [xt], create_graph=True)
        (gx * gx).sum().backward()
        return type(out._node).__name__, [xt.grad.detach().numpy()] + [
            p.grad.detach().numpy() for p in pt
        ]

    node, got = second_order()
    with kernels.reference_only():
        _, want = second_order()
    assert node == "NumbaGPT2Block"
    for name, g, w in zip(("x", *F.GPT2_BLOCK_PARAMS), got, want):
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale, err_msg=name)


@NEEDS_KERNELS
def test_gpt_block_fuses_only_when_nothing_else_is_in_play():
    from gpt.config import GPTConfig
    from gpt.model import GPT

    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.1)
    model = GPT(cfg)
    block = model.transformer.h[0]
    x = tg.randn(2, 8, 16, requires_grad=True)
    assert type(block(x)._node).__name__ != "NumbaGPT2Block"  # dropout in training
    model.eval()
    assert type(block(x)._node).__name__ == "NumbaGPT2Block"
    mask = np.ones((2, 1, 8, 8), bool)
    assert type(block(x, mask)._node).__name__ != "NumbaGPT2Block"  # a padding mask
    seen = []
    handle = block.mlp.c_fc.register_forward_hook(lambda m, args, out: seen.append(out))
    block(x)
    assert len(seen) == 1  # a hook on a submodule: the modules run, and call it
    handle.remove()
    assert type(block(x)._node).__name__ == "NumbaGPT2Block"
    original = block.attn.c_proj.forward
    block.attn.c_proj.forward = lambda y: original(y * 0.0)  # a patched forward is honoured
    np.testing.assert_allclose(
        block(x).detach().numpy(), (x + block.mlp(block.ln_2(x))).detach().numpy(), 1e-5, 1e-5
    )
    del block.attn.c_proj.forward

    class Adapter(tg.nn.Linear):  # a replaced submodule (e.g. LoRA) runs its own forward
        def forward(self, y):
            return super().forward(y) * 2.0

    block.mlp.c_fc = Adapter(16, 64)
    assert type(block(x)._node).__name__ != "NumbaGPT2Block"
    block.mlp.c_fc = tg.nn.Linear(16, 64)
    assert type(block(x)._node).__name__ == "NumbaGPT2Block"
    block.attn.fused = False
    assert type(block(x)._node).__name__ != "NumbaGPT2Block"


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
    reference silently (right numbers, slow step): name the kernels a step must use."""
    pytest.importorskip("numba")
    from gpt.model import GPT, GPTConfig

    names, ran, pick = {id(k.impl): k.name for k in kernels.registered()}, set(), kernels.pick

    def recording_pick(*args, **kwargs):
        impl = pick(*args, **kwargs)
        if impl is not None:
            ran.add(names[id(impl)])
        return impl

    monkeypatch.setattr(kernels, "pick", recording_pick)
    cfg = GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=dropout)
    gpt = GPT(cfg)
    idx = np.random.default_rng(0).integers(0, 11, (2, 16))
    gpt(idx, idx)[1].backward()
    tg.optim.AdamW(gpt.parameters()).step()
    assert want <= ran, f"missing {sorted(want - ran)}; ran {sorted(ran)}"
