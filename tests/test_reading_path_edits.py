"""Every line of the README's reading path in gpt/model.py trains as it reads.

For each row of the reading path that points into gpt/model.py, the test edits the line the
row names, as a learner would edit the file: the edited source is loaded as a module and its
classes' methods replace the stock classes' (a class-level edit, never an instance's). Then
three things must follow the edit alike:
- eagerly, the model's loss and gradients change (the line runs, it is not in a branch
  training does not take);
- compiled, as gpt-train runs it (``tensorgrad.compile``), three AdamW steps give the eager
  edited model's losses and weights (no kernel stands in for the edited line);
- gpt-explain reports the edited model's own loss, to the last bit.
A row without an edit here fails, so a new row of the reading path gets one.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
from gpt import model as gm
from gpt.config import GPTConfig
from gpt.explain import explain, prompt_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is Paris"
ROW = re.compile(r"^\| (.+?) \| .+? \| \[gpt/model\.py:(\d+)-(\d+)\]\(gpt/model\.py#L\d+-L\d+\) \|")

EDITS = {  # stage -> (text on the row's lines, its edit): each changes what the line computes
    "embeddings": ("+ self.transformer.wpe(pos)", "+ 0.5 * self.transformer.wpe(pos)"),
    "Q, K, V": ("q, k, v = self.c_attn(x)", "k, q, v = self.c_attn(x)"),
    "heads": (
        "q = q.view(B, T, nh, hs).transpose(1, 2)",
        "q = q.view(B, T, nh, hs).transpose(1, 2) * 1.5",
    ),
    "scores": ("(1.0 / math.sqrt(hs))", "(0.5 / math.sqrt(hs))"),
    "mask": ('float("-inf")', "-2.0"),
    "softmax": ("F.softmax(att, dim=-1)", "F.softmax(att, dim=-1) * 0.9"),
    "attention output": ("y = att @ v", "y = att @ v + 0.1 * v"),
    "output projection": ("self.c_proj(y))", "self.c_proj(y) * 0.5)"),
    "LayerNorm": ("self.attn(self.ln_1(x)", "self.attn(self.ln_1(x) * 1.5"),
    "residual": ("x = x + self.attn(", "x = x + 0.5 * self.attn("),
    "MLP": ("self.c_proj(self.gelu(self.c_fc(x)))", "self.c_proj(self.gelu(self.c_fc(x)) * 0.5)"),
    "logits": ("F.linear(x, self.unembedding)", "F.linear(x, self.unembedding) * 0.5"),
    "cross-entropy": ("loss = F.cross_entropy(", "loss = 2.0 * F.cross_entropy("),
}


def rows() -> list[tuple]:
    text = (ROOT / "README.md").read_text("utf-8").splitlines()
    return [(m[1], int(m[2]), int(m[3])) for m in map(ROW.match, text) if m]


def edited_module(stage: str, a: int, b: int):
    """gpt/model.py with the row's lines edited, loaded as a module of the gpt package."""
    old, new = EDITS[stage]
    lines = (ROOT / "gpt" / "model.py").read_text("utf-8").splitlines(keepends=True)
    span = "".join(lines[a - 1 : b])
    assert span.count(old) == 1, f"{stage}: lines {a}-{b} should hold {old!r} once"
    source = "".join(lines[: a - 1]) + span.replace(old, new) + "".join(lines[b:])
    spec = importlib.util.spec_from_loader("gpt._edited_model", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "gpt"
    sys.modules["gpt._edited_model"] = module
    try:
        exec(compile(source, str(ROOT / "gpt" / "model.py"), "exec"), module.__dict__)
    finally:
        del sys.modules["gpt._edited_model"]
    return module


def edit_classes(monkeypatch, module) -> None:
    """The edited methods of the module's classes onto gpt.model's classes (class level)."""
    patched = []
    for name, cls in vars(gm).items():
        edited = getattr(module, name, None)
        if isinstance(cls, type) and cls.__module__ == gm.__name__ and edited is not None:
            for attr, value in vars(edited).items():
                code = getattr(value, "__code__", None)
                if code is not None and code != vars(cls)[attr].__code__:
                    monkeypatch.setattr(cls, attr, value)
                    patched.append(f"{name}.{attr}")
    assert len(patched) == 1, patched


@pytest.fixture(scope="module")
def tok():
    return prompt_tokenizer(PROMPT)


def tiny(tok):
    tg.manual_seed(0)
    return gm.GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))


def batches(tok, n=3):
    g = np.random.default_rng(0)
    idx = [g.integers(0, tok.vocab_size, (2, 16)) for _ in range(n)]
    return [(i, np.roll(i, -1, axis=1)) for i in idx]


def train(model, data):
    """Losses of AdamW steps on ``data``, the first step's gradients, the final weights."""
    opt = model.configure_optimizers(0.1, 1e-2)
    losses, first = [], None
    for idx, tgt in data:
        _, loss = model(idx, tgt)
        opt.zero_grad()
        loss.backward()
        if first is None:
            first = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, first, {n: p.detach().numpy() for n, p in model.named_parameters()}


def rel(a: dict, b: dict) -> float:
    return max(float(np.abs(a[n] - b[n]).max() / (np.abs(b[n]).max() + 1e-12)) for n in a)


def own_loss(model, tok) -> float:
    ids = tok.encode(PROMPT)
    model.eval()
    with tg.no_grad():
        _, loss = model(np.asarray([ids[:-1]]), np.asarray([ids[1:]]))
    model.train()
    return float(loss.item())


def test_every_model_row_of_the_reading_path_has_an_edit():
    stages = [r[0] for r in rows()]
    assert len(stages) >= 10, "the README's reading path rows into gpt/model.py do not parse"
    assert sorted(stages) == sorted(EDITS), "each row into gpt/model.py needs an edit here"


@pytest.fixture(scope="module")
def stock(tok):
    data = batches(tok)
    return data, train(tiny(tok), data), own_loss(tiny(tok), tok)


@pytest.mark.parametrize("stage, a, b", rows(), ids=[r[0] for r in rows()])
def test_an_edit_of_the_line_trains_and_explains_as_written(stock, tok, monkeypatch, stage, a, b):
    data, stock_run, stock_loss = stock
    edit_classes(monkeypatch, edited_module(stage, a, b))
    eager = train(tiny(tok), data)
    assert rel(eager[1], stock_run[1]) > 1e-3, f"{stage}: the edited line does not run eagerly"
    compiled = tiny(tok)
    tg.compile(compiled)
    got = train(compiled, data)
    np.testing.assert_allclose(got[0], eager[0], rtol=2e-4, err_msg=stage)
    assert rel(got[1], eager[1]) < 1e-3, f"{stage}: compiled gradients are not the edit's"
    assert rel(got[2], eager[2]) < 5e-3, (
        f"{stage}: compiled training is not the edit's"
    )  # (AdamW: rounding)
    want = own_loss(tiny(tok), tok)
    assert want != stock_loss
    r = explain(tiny(tok), tok, PROMPT, checks=0, lens=False)
    assert r["loss"]["value"] == want, f"{stage}: gpt-explain does not show the edit"
