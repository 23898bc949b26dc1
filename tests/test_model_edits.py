"""An edit to gpt/model.py trains as written, eagerly and through tensorgrad.compile.

A learner's first experiment is to change the GPT: ReLU for GELU in ``MLP.forward``, another
scale in the attention, SiLU, a parallel attention+MLP block, post-LN, RMSNorm. Such an edit
is made at class level (editing the file changes the class), so these tests patch the class,
never an instance. model.py holds no kernel dispatch: what runs is its code, op by op, and
compile fuses by the traced graph's pattern, so an edited block does not match the stock
block's pattern and runs as written. Each edit is checked three ways on the same weights and
batches: 5 AdamW steps compiled give the losses and weights of 5 eager steps; the first
step's gradients equal the edited math written out in the test (``reference_step``); and they
differ from the unedited model's (so the edit is one that matters).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from gpt import model as gm
from gpt.config import GPTConfig
from tensorgrad import nn
from tensorgrad.compiler import compiled_forward

CFG = dict(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=16)


def relu_mlp(self, x):
    return self.dropout(self.c_proj(F.relu(self.c_fc(x))))


def relu2_mlp(self, x):
    return self.dropout(self.c_proj(F.relu(self.c_fc(x)) ** 2))


def silu_mlp(self, x):
    return self.dropout(self.c_proj(F.silu(self.c_fc(x))))


def hot_attention(self, x, mask=None, cache=None, layer=0):
    """The stock attention with scores at temperature 0.5 (twice the usual scale)."""
    B, T, C = x.shape
    nh, hs = self.n_head, C // self.n_head
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, nh, hs).transpose(1, 2)
    v = v.view(B, T, nh, hs).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=2.0 / math.sqrt(hs))
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return self.resid_dropout(self.c_proj(y))


def parallel_block(self, x, mask=None, cache=None, layer=0):
    """GPT-J's block: attention and MLP side by side on one LayerNorm."""
    h = self.ln_1(x)
    return x + self.attn(h, mask, cache, layer) + self.mlp(h)


def post_ln_block(self, x, mask=None, cache=None, layer=0):
    """The original transformer's order: the LayerNorm after each residual add."""
    x = self.ln_1(x + self.attn(x, mask, cache, layer))
    return self.ln_2(x + self.mlp(x))


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5, bias=True):
        super().__init__()
        self.weight, self.eps = nn.Parameter(tg.ones(C)), eps

    def forward(self, x):
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


EDITS = {
    "relu": [(gm.MLP, "forward", relu_mlp)],
    "relu2": [(gm.MLP, "forward", relu2_mlp)],
    "silu": [(gm.MLP, "forward", silu_mlp)],
    "temperature": [(gm.CausalSelfAttention, "forward", hot_attention)],
    "parallel": [(gm.Block, "forward", parallel_block)],
    "post-LN": [(gm.Block, "forward", post_ln_block)],
    "RMSNorm": [(gm.nn, "LayerNorm", RMSNorm)],
}


def steps(compiled: bool, n: int = 5):
    """Losses of n AdamW steps, the first step's gradients, the final weights, the model."""
    tg.manual_seed(0)
    model = gm.GPT(GPTConfig(**CFG))
    if compiled:
        tg.compile(model)
    opt = model.configure_optimizers(0.1, 1e-2)
    g, losses, first = np.random.default_rng(0), [], None
    for _ in range(n):
        idx = g.integers(0, CFG["vocab_size"], (3, CFG["block_size"]))
        _, loss = model(idx, np.roll(idx, -1, axis=1))
        opt.zero_grad()
        loss.backward()
        if first is None:
            first = {  # (an unused parameter, ln_2 of the parallel block, gets no gradient)
                name: np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy().copy()
                for name, p in model.named_parameters()
            }
        opt.step()
        losses.append(loss.item())
    weights = {name: p.detach().numpy() for name, p in model.named_parameters()}
    return losses, first, weights, model


def max_rel_diff(a: dict, b: dict) -> float:
    return max(float(np.abs(a[n] - b[n]).max() / (np.abs(b[n]).max() + 1e-12)) for n in a)


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_an_edit_trains_as_written_eager_and_compiled(monkeypatch, edit):
    stock = steps(compiled=True)
    for owner, name, value in EDITS[edit]:
        monkeypatch.setattr(owner, name, value)
    eager = steps(compiled=False)
    compiled = steps(compiled=True)
    np.testing.assert_allclose(compiled[0], eager[0], rtol=2e-4)
    assert max_rel_diff(compiled[1], eager[1]) < 1e-3
    assert max_rel_diff(compiled[2], eager[2]) < 1e-3
    assert max_rel_diff(eager[1], stock[1]) > 1e-3, "the edit should change the gradients"
    plan = [
        s.impl.__name__
        for vs in compiled_forward(compiled[3]).entries.values()
        for v in vs
        if v.graph is not None
        for s in v.graph.plan
    ]
    assert "NumbaGPT2Block" not in plan  # an edited block is not the stock block's pattern


def test_the_edited_math_is_what_trains(monkeypatch):
    """ReLU in the MLP: the first step's gradients equal those of the GPT written out here
    with ReLU (eager modules of the stock model, the MLP by hand)."""
    monkeypatch.setattr(gm.MLP, "forward", relu_mlp)
    _, got, _, _ = steps(compiled=True, n=3)

    monkeypatch.undo()
    tg.manual_seed(0)
    model = gm.GPT(GPTConfig(**CFG))
    idx = np.random.default_rng(0).integers(0, CFG["vocab_size"], (3, CFG["block_size"]))
    tr = model.transformer
    x = tr.wte(idx) + tr.wpe(np.arange(CFG["block_size"])[None])
    for b in tr.h:
        x = x + b.attn(b.ln_1(x))
        x = x + b.mlp.c_proj(F.relu(b.mlp.c_fc(b.ln_2(x))))
    logits = F.linear(tr.ln_f(x), tr.wte.weight)
    loss = F.cross_entropy(logits.view(-1, CFG["vocab_size"]), np.roll(idx, -1, axis=1).ravel())
    loss.backward()
    want = {name: p.grad.numpy() for name, p in model.named_parameters()}
    assert max_rel_diff(got, want) < 1e-4


def test_the_stock_model_compiles_to_the_fused_block():
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    if not tg.kernels.is_enabled():
        pytest.skip("TG_KERNELS=0: reference ops only (unset TG_KERNELS to run it)")
    _, _, _, model = steps(compiled=True, n=3)
    entries = compiled_forward(model).entries.values()
    plan = [s.impl.__name__ for vs in entries for v in vs if v.graph for s in v.graph.plan]
    assert plan.count("NumbaGPT2Block") == CFG["n_layer"]
