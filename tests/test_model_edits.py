"""An edit to gpt/model.py trains as written.

A learner's first experiment is to change the GPT: ReLU for GELU in ``MLP.forward``, another
scale in the attention. Such an edit is made at class level (editing the file changes the
class), so these tests patch the class, never an instance. The model's fused block
(F.gpt2_block) states the stock block a second time; it may stand in for a block only when it
computes what the block's code says, which ``gpt.model.fused_matches_code`` checks. Each edit
here is checked against the code as written with no fused op at all (``fusable`` patched to
say no): the loss and every parameter's gradient must be those, and must differ from the
unedited model's (so that the edit is one that matters).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.functional as F
from gpt import model as gm
from gpt.config import GPTConfig

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
    att = (q @ k.transpose(-2, -1)) * (2.0 / math.sqrt(hs))
    allowed = tg.Tensor(np.tril(np.ones((T, T), dtype=bool)))
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    return self.resid_dropout(self.c_proj(y))


EDITS = {
    "MLP relu": (gm.MLP, relu_mlp),
    "MLP relu2": (gm.MLP, relu2_mlp),
    "MLP silu": (gm.MLP, silu_mlp),
    "attention temperature": (gm.CausalSelfAttention, hot_attention),
}


def step_grads(seed: int = 0):
    """Loss and parameter gradients of one training forward/backward of a fresh model."""
    tg.manual_seed(seed)
    model = gm.GPT(GPTConfig(**CFG))
    idx = np.random.default_rng(seed).integers(0, CFG["vocab_size"], (3, CFG["block_size"]))
    _, loss = model(idx, idx)
    loss.backward()
    return float(loss.item()), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def assert_same(a, b, rtol=1e-5, atol=1e-6):
    (la, ga), (lb, gb) = a, b
    assert la == pytest.approx(lb, rel=rtol)
    for name in ga:
        np.testing.assert_allclose(ga[name], gb[name], rtol=rtol, atol=atol, err_msg=name)


def max_rel_diff(a, b) -> float:
    return max(
        float(np.abs(a[1][n] - b[1][n]).max() / (np.abs(b[1][n]).max() + 1e-12)) for n in a[1]
    )


@pytest.fixture
def fresh_checks(monkeypatch):
    """A clean record of which codes were checked, and of the lines said."""
    monkeypatch.setattr(gm, "_fusion_checked", {})
    monkeypatch.setattr(gm, "FUSION_NOTES", [])


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_a_class_level_edit_trains_as_written(monkeypatch, fresh_checks, edit):
    stock = step_grads()
    cls, forward = EDITS[edit]
    monkeypatch.setattr(cls, "forward", forward)
    with pytest.warns(gm.UnfusedBlockWarning, match="runs as written"):
        got = step_grads()
    with monkeypatch.context() as m:
        m.setattr(gm, "fusable", lambda block: False)  # the code as written, nothing fused
        written = step_grads()
    assert_same(got, written)
    assert max_rel_diff(written, stock) > 1e-3, "the edit should change the gradients"
    assert len(gm.FUSION_NOTES) == 1 and "Block" in gm.FUSION_NOTES[0]


def test_the_stock_block_still_runs_fused(fresh_checks):
    """The check passes for the unedited code, so the fused op runs (one graph node)."""
    pytest.importorskip("numba")
    tg.manual_seed(0)
    block = gm.Block(GPTConfig(**CFG))
    x = tg.randn(2, 8, 16, requires_grad=True)
    out = block(x)
    assert gm.FUSION_NOTES == []
    assert list(gm._fusion_checked.values()) == [True]
    if os.environ.get("TG_KERNELS") != "0":
        assert type(out._node).__name__ == "NumbaGPT2Block"


def test_an_edit_after_the_first_check_is_checked_again(monkeypatch, fresh_checks):
    """The check is per code: editing the class after a model ran re-checks it."""
    stock = step_grads()
    monkeypatch.setattr(gm.MLP, "forward", relu_mlp)
    with pytest.warns(gm.UnfusedBlockWarning):
        edited = step_grads()
    assert max_rel_diff(edited, stock) > 1e-2
    assert sorted(gm._fusion_checked.values()) == [False, True]


def test_a_block_setting_the_fused_op_ignores_is_seen(monkeypatch, fresh_checks):
    """ln_2 with another eps than ln_1: the fused op takes one eps, so the code runs as written."""
    tg.manual_seed(0)
    block = gm.Block(GPTConfig(**CFG))
    block.ln_2.eps = 0.5
    x = tg.randn(2, 8, 16, requires_grad=True)
    with pytest.warns(gm.UnfusedBlockWarning):
        got = block(x)
    monkeypatch.setattr(gm, "fusable", lambda block: False)
    np.testing.assert_allclose(
        got.detach().numpy(), block(x).detach().numpy(), rtol=1e-6, atol=1e-6
    )
