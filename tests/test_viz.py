"""tg.viz.to_dot: DOT text of recorded graphs, block collapsing, and rendering with Graphviz."""

import re
import shutil

import numpy as np
import pytest

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.model import GPT
from tensorgrad import nn, viz


def node_labels(dot: str) -> list[str]:
    return re.findall(r'^\s+\w+ \[label="((?:[^"\\]|\\.)*)"', dot, flags=re.M)


@pytest.fixture(scope="module")
def gpt_loss():
    tg.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny"))
    idx = np.array([[1, 2, 3, 4, 5]])
    _, loss = model(idx, idx)
    return model, loss


def test_small_expression_names_ops_shapes_and_dtype():
    x = tg.randn(2, 3, requires_grad=True)
    w = tg.randn(3, 4, requires_grad=True)
    dot = tg.viz.to_dot((x @ w).tanh().sum())
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    labels = node_labels(dot)
    for op, shape in (("MatMul", "(2, 4)"), ("Tanh", "(2, 4)"), ("Sum", "()")):
        assert any(lab.startswith(op) and shape in lab and "float32" in lab for lab in labels), op
    assert sum(lab.startswith("input") for lab in labels) == 2  # x and w, unnamed leaves
    assert "input\\n(2, 3) float32" in dot and "input\\n(3, 4) float32" in dot
    assert dot.count("->") == 4  # x, w -> MatMul -> Tanh -> Sum


def test_parameters_are_named_from_a_module_or_a_dict():
    lin = nn.Linear(3, 4)
    y = lin(tg.randn(2, 3)).sum()
    dot = viz.to_dot(y, params=lin)
    assert '"weight\\n(4, 3) float32"' in dot and '"bias\\n(4,) float32"' in dot
    dot = viz.to_dot(y, params={"W_out": lin.weight})
    assert "W_out\\n(4, 3)" in dot and "input\\n(4,)" in dot  # bias not in the dict


def test_multi_output_edges_are_labelled_and_leaves_alone_work():
    x = tg.randn(4, 6, requires_grad=True)
    a, b = x.split(3, dim=1)
    dot = viz.to_dot((a * b).sum())
    assert "Split" in dot and 'label="out 0"' in dot and 'label="out 1"' in dot
    assert "input\\n(4, 6) float32" in viz.to_dot(x)


def test_deep_graph_does_not_recurse():
    x = tg.ones(2, requires_grad=True)
    y = x
    for _ in range(5000):
        y = y + 1.0
    assert viz.to_dot(y).count("Add") == 5000


def test_graph_survives_backward():
    x = tg.randn(3, requires_grad=True)
    y = (x * x).sum()
    y.backward()
    assert "Mul" in viz.to_dot(y)


def test_gpt_collapses_to_one_node_per_block(gpt_loss):
    model, loss = gpt_loss
    n = model.config.n_layer
    dot = viz.to_dot(loss, params=model)
    labels = node_labels(dot)
    blocks = [lab for lab in labels if lab.startswith("block ")]
    assert sorted(lab.split("\\n")[0] for lab in blocks) == [f"block {i}" for i in range(n)]
    assert all("12 parameters" in lab for lab in blocks)
    assert "block0 -> block1" in dot
    # before and after the blocks stay expanded: embeddings, ln_f, the tied head, the loss
    for name in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"):
        assert name in dot
    assert "transformer.h.0" not in dot
    assert any(lab.startswith("CrossEntropy") for lab in labels)

    full = viz.to_dot(loss, params=model, expand=True)
    full_labels = node_labels(full)
    assert not any(lab.startswith("block ") for lab in full_labels)
    assert len(full_labels) > len(labels) + 20
    assert "transformer.h.1.attn.c_attn.weight\\n(48, 16) float32" in full


def test_dot_path_writes_text(tmp_path, gpt_loss):
    model, loss = gpt_loss
    dot = viz.to_dot(loss, params=model, path=tmp_path / "g.dot")
    assert (tmp_path / "g.dot").read_text() == dot


@pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz `dot` is not installed (apt-get install graphviz)"
)
@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".png", b"\x89PNG")])
def test_render_with_graphviz(tmp_path, gpt_loss, suffix, magic):
    model, loss = gpt_loss
    out = tmp_path / f"graph{suffix}"
    viz.to_dot(loss, params=model, path=out)
    assert out.read_bytes().startswith(magic)
    assert (tmp_path / "graph.dot").exists()


def test_missing_dot_binary_is_a_clear_error(tmp_path, monkeypatch, gpt_loss):
    model, loss = gpt_loss
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install graphviz / brew install graphviz"):
        viz.to_dot(loss, params=model, path=tmp_path / "graph.svg")
    assert (tmp_path / "graph.dot").read_text().startswith("digraph")  # the text is still there
    assert not (tmp_path / "graph.svg").exists()


def test_unknown_suffix(tmp_path):
    x = tg.randn(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"\.svg"):
        viz.to_dot(x * 2, path=tmp_path / "graph.jpg")
