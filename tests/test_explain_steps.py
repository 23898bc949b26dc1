"""gpt-explain --steps: weights followed across training steps, as JSON, text, PNG and HTML."""

import itertools
import json
import re
import sys

import pytest

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.explain import explain, main, prompt_tokenizer
from gpt.explain.render.steps import render_steps_html, render_steps_text
from gpt.explain.steps import Session, follow_steps
from gpt.model import GPT

PROMPT = "The capital of France is Paris"


def tiny(tok):
    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))


@pytest.fixture(scope="module")
def tok():
    return prompt_tokenizer(PROMPT)


@pytest.fixture(scope="module")
def trace(tok):
    return follow_steps(tiny(tok), tok, PROMPT, 6)


def test_the_followed_weights_obey_adamw_step_after_step(trace):
    steps = trace["steps"]
    assert [s["step"] for s in steps] == list(range(1, 7))
    assert [f["label"] for f in trace["followed"]] == ["W_Q", "W_K", "W_V"]
    for k in range(3):
        col = [s["followed"][k] for s in steps]
        m = v = 0.0
        for a, b in itertools.pairwise(col):
            assert b["value"] == a["new_value"]  # the next step starts where this one ended
        for e in col:
            m, v = 0.9 * m + 0.1 * e["grad"], 0.95 * v + 0.05 * e["grad"] ** 2
            assert e["m"] == pytest.approx(m, rel=1e-4) and e["v"] == pytest.approx(v, rel=1e-4)
            assert e["update"] == pytest.approx(e["new_value"] - e["value"])


def test_the_loss_falls_and_matches_one_explained_step(trace, tok):
    losses = [s["loss"] for s in trace["steps"]]
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert trace["final_loss"] < losses[-1]
    assert losses[0] == explain(tiny(tok), tok, PROMPT)["loss"]["value"]


def test_snapshots_of_the_followed_head(trace):
    snaps = trace["snapshots"]
    assert [s["step"] for s in snaps] == [1, 3, 4, 6]
    for s in snaps:
        assert (s["layer"], s["head"]) == (0, 0) and len(s["weights"]) == 5
        assert all(abs(sum(row) - 1) < 1e-6 for row in s["weights"])


def test_a_session_stepped_by_hand_gives_the_same_numbers(trace, tok):
    s = Session(tiny(tok), tok, PROMPT, checks=0)
    for _ in range(3):
        s.step(lens=False)
    assert s.trace()["steps"] == trace["steps"][:3]


def test_followed_weight_by_name(tok):
    t = follow_steps(
        tiny(tok), tok, PROMPT, 2, layer=1, follow=[("fc", "transformer.h.1.mlp.c_fc.weight", 3, 5)]
    )
    assert t["followed"] == [
        {"label": "fc", "param": "transformer.h.1.mlp.c_fc.weight", "index": [3, 5]}
    ]
    with pytest.raises(ValueError, match="steps must be in 1..1000"):
        follow_steps(tiny(tok), tok, PROMPT, 1001)


def test_text_and_html(trace):
    text = render_steps_text(trace, "plots: wrote x.png")
    assert "== W_Q[" in text and "after the last step" in text and "plots: wrote" in text
    assert text.count("== attention of block 0 head 0 at step") == 4
    page = render_steps_html(trace)
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert page.count('<svg class="chart"') == 1 + 3 * 3
    assert page.count('<svg class="heatmap"') == 4
    assert not re.search(r"""(src|href)\s*=\s*["']?(?!#)""", page)


def test_cli_steps_json_and_html(tmp_path, capsys):
    assert main(["--steps", "3", "--format", "json", "--follow", "W_O:1,2"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert len(t["steps"]) == 3 and t["followed"][0]["param"].endswith("h.0.attn.c_proj.weight")
    assert t["source"].startswith("fresh")
    page = tmp_path / "s.html"
    assert main(["--steps", "2", "--format", "html", "-o", str(page)]) == 0
    assert "2 training steps" in page.read_text()


def test_cli_steps_text_writes_png_plots(tmp_path, capsys):
    pytest.importorskip(
        "matplotlib", reason="matplotlib is not installed: pip install -e '.[plot]'"
    )
    png = tmp_path / "steps.png"
    assert main(["--steps", "3", "--plot", str(png)]) == 0
    assert f"plots: wrote {png}" in capsys.readouterr().out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_without_matplotlib_the_plots_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    png = tmp_path / "steps.png"
    assert main(["--steps", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "plots: not drawn, matplotlib is not installed" in out and "== W_Q[" in out
    assert not png.exists()


def test_steps_on_a_training_run(tmp_path, tok, capsys):
    from gpt.store import run_checkpoint

    model = tiny(tok)
    run_checkpoint.save(
        tmp_path,
        {"iter": 0, "model_config": model.config.to_dict(), "tokenizer": tok.to_dict()},
        model,
    )
    assert (
        main(["--out-dir", str(tmp_path), "--which", "latest", "--steps", "2", "--format", "json"])
        == 0
    )
    t = json.loads(capsys.readouterr().out)
    assert t["source"].startswith("trained run")
    assert [s["loss"] for s in t["steps"]] == [
        s["loss"] for s in follow_steps(tiny(tok), tok, PROMPT, 2)["steps"]
    ]
