"""gpt-explain shows the model's own forward: an edit to gpt/model.py shows in the report.

The edits are made at class level, as editing model.py does (the tests patch the class, never an
instance). Each stage is a tensor the model's forward made (gpt.explain.record: forward hooks and
an op observer), so the loss explain reports is the model's own, to the last bit, and a stage
the edit changed shows what ran: its values, its name and formula, the statement that ran it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from gpt import model as gm
from gpt.config import GPTConfig
from gpt.explain import explain, prompt_tokenizer, render_html, render_text
from gpt.model import GPT

PROMPT = "The capital of France is Paris"


def relu_mlp(self, x):
    return self.dropout(self.c_proj(F.relu(self.c_fc(x))))


def scaled_attention(scale):
    """CausalSelfAttention.forward's explicit path with the scores scaled by ``scale``·1/√hs."""

    def forward(self, x, mask=None, cache=None, layer=0):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (scale / math.sqrt(hs))
        att = att.masked_fill(~tg.Tensor(np.tril(np.ones((T, T), dtype=bool))), float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    return forward


def cooled_attention(self, x, mask=None, cache=None, layer=0):
    """The temperature on a line of its own, the mask and softmax in one statement."""
    B, T, C = x.shape
    nh, hs = self.n_head, C // self.n_head
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, nh, hs).transpose(1, 2)
    v = v.view(B, T, nh, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    att = att / 2.0  # temperature 2
    allowed = tg.Tensor(np.tril(np.ones((T, T), dtype=bool)))
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    return self.resid_dropout(self.c_proj(y))


@pytest.fixture(scope="module")
def tok():
    return prompt_tokenizer(PROMPT)


def tiny(tok):
    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))


def stage(r, key):
    return next(s for s in r["stages"] if s["key"] == key)


def model_loss(model, tok) -> float:
    """The model's own loss on the prompt, its code as written."""
    ids = tok.encode(PROMPT)
    model.eval()
    with tg.no_grad():
        _, loss = model(np.asarray([ids[:-1]]), np.asarray([ids[1:]]))
    return float(loss.item())


def explained(model, tok):
    want = model_loss(model, tok)  # before explain's step changes the weights
    r = explain(model, tok, PROMPT, checks=0, lens=False)
    assert r["loss"]["value"] == want  # the model's own forward: exactly its loss
    json.loads(json.dumps(r, allow_nan=False))
    assert render_text(r, full=True) and render_html(r)  # every renderer takes what ran
    return r


def test_the_reported_loss_is_the_models_own(tok):
    explained(tiny(tok), tok)


def test_explain_leaves_the_model_as_it_was(tok):
    model = tiny(tok)
    explain(model, tok, PROMPT, checks=0)
    assert not any(m.has_forward_hooks() for m in model.modules())


def test_relu_for_gelu_in_mlp_forward_shows(tok, monkeypatch):
    monkeypatch.setattr(gm.MLP, "forward", relu_mlp)
    r = explained(tiny(tok), tok)
    act, fc = stage(r, "h0.gelu"), stage(r, "h0.fc")
    assert act["name"] == "relu" and act["formula"] == "max(0, x)" and act["ops"] == ["Relu"]
    fc_t, act_t = (np.array(s["tensor"]["values"], dtype=float) for s in (fc, act))
    np.testing.assert_array_equal(act_t, np.maximum(fc_t, 0.0))  # relu of c_fc's output
    assert act["values"] == [max(v, 0.0) for v in fc["values"]]
    file, line, _, code = act["where"][0]
    assert file == "tests/test_explain_edits.py" and "F.relu(self.c_fc(x))" in code
    assert relu_mlp.__code__.co_firstlineno < line
    assert stage(r, "h0.mlp_proj")["formula"].startswith("relu · W_proj")
    text = render_text(r, full=True)
    assert "relu" in text and "max(0, x)" in text and "GELU(c_fc)" not in text


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_an_attention_scale_edit_shows_in_the_scores(tok, monkeypatch, scale):
    monkeypatch.setattr(gm.CausalSelfAttention, "forward", scaled_attention(scale))
    r = explained(tiny(tok), tok)
    q, k, s = (
        np.array(stage(r, f"h0.{n}")["tensor"]["values"], dtype=float)
        for n in ("q_heads", "k_heads", "scores")
    )
    hs = r["dims"]["hs"]
    np.testing.assert_allclose(s, q @ k.T * scale / math.sqrt(hs), rtol=1e-5, atol=1e-7)
    sc = stage(r, "h0.scores")
    assert "/ √hs" not in sc["formula"] and "scale / math.sqrt(hs)" in sc["formula"]
    assert sc["name"] == "scores"  # (the stage keeps its name; its formula is the code)
    assert sc["where"][0][0] == "tests/test_explain_edits.py"
    seen = np.tril(np.ones(s.shape, bool))  # the report's attention scores: the same tensor
    np.testing.assert_allclose(
        np.array(r["attention"]["heads"][0]["scores"], dtype=float)[seen], s[seen], rtol=1e-5
    )  # the slice keeps 6 digits


def test_a_new_statement_adds_a_stage_and_a_merged_one_takes_its_place(tok, monkeypatch):
    monkeypatch.setattr(gm.CausalSelfAttention, "forward", cooled_attention)
    r = explained(tiny(tok), tok)
    keys = [s["key"] for s in r["stages"] if s["block"] == 0]
    assert keys.index("h0.scores") < keys.index("h0.div") < keys.index("h0.att")
    assert "h0.masked" not in keys  # masked and softmax in one statement: one stage
    div = stage(r, "h0.div")
    assert div["name"] == "div" and div["formula"] == "att = att / 2.0  # temperature 2"
    np.testing.assert_allclose(
        np.array(div["tensor"]["values"], dtype=float),
        np.array(stage(r, "h0.scores")["tensor"]["values"], dtype=float) / 2.0,
        rtol=1e-5,
    )
    assert stage(r, "h0.scores")["formula"].startswith("q · kᵀ / √hs")
