"""The step as a story (gpt.explain.render.story): the stage diagram shared by the static page
and the served one shows the report's numbers, escapes what the prompt brings, and points at
code that is where it says. ``check_story`` is used on the served page in headless Chromium
too (tests/test_explain_serve.py)."""

import re
from pathlib import Path

import pytest

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.explain import explain, prompt_tokenizer, render_html
from gpt.explain.render.fmt import fmt_value
from gpt.explain.render.story import render_story
from gpt.explain.where import WHERE, where
from gpt.model import GPT

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is Paris"


def _float(v: str):
    return None if v == "" else float(v)


def _floats(pattern: str, html: str) -> list:
    """Every match of pattern as a number (a tuple of numbers for several groups)."""
    return [tuple(map(_float, m)) if isinstance(m, tuple) else _float(m)
            for m in re.findall(pattern, html, re.S)]  # fmt: skip


def _stage_chunks(html: str) -> dict:
    """data-key -> the markup of that stage's <li>."""
    parts = re.split(r'<li class="stage" data-key="([^"]+)"', html)
    return dict(zip(parts[1::2], parts[2::2]))


def check_story(html: str, r: dict) -> None:
    """The story in ``html`` (a page or the DOM Chromium shows) holds report ``r``'s numbers."""
    assert re.search(r'<section class="story" data-step="\d+"', html), "no story on the page"
    chunks = _stage_chunks(html)
    for st in r["stages"]:  # forward: each stage's values at the position; backward: its ‖∂L/∂·‖
        chunk = chunks[st["key"]]
        shown = re.findall(r'class="v" data-value="([^"]+)">([^<]+)<', chunk)
        assert [float(v) for v, _ in shown] == st["values"], st["key"]
        assert [t for _, t in shown] == [fmt_value(v).strip() for v in st["values"]], st["key"]
        g = _floats(r'class="g" data-value="([^"]*)"', chunk.split("</summary>")[0])
        assert g == [st["grad_norm"]], st["key"]
        assert all(f"{f}:{a}" in chunk for f, a, _, _ in st["where"]), st["key"]
    assert html.count('class="tensormap"') == len(r["stages"]) + 2  # + attention before/after
    hg = _floats(r'<tr class="hg".*?data-value="([^"]+)".*?data-value="([^"]+)"', html)
    assert hg[: len(r["head_gradients"])] == [
        (h["weight_norm"], h["grad_norm"]) for h in r["head_gradients"]
    ]
    es = r["embedding_split"]
    assert _floats(r'class="split-logits" data-value="([^"]+)"', html)[0] == es["logits_norm"]
    assert _floats(r'class="split-lookup" data-value="([^"]+)"', html)[0] == es["lookup_norm"]
    adam = _floats(r'<tr class="adam"' + r'.*?data-value="([^"]+)"' * 6, html)
    keys = ("value", "grad", "m", "v", "update", "new_value")
    assert adam == [tuple(f[k] for k in keys) for f in r["followed"]]
    fd = _floats(r'<tr class="fdx">.*?data-value="([^"]+)".*?data-value="([^"]+)"', html)
    assert fd == [(e["grad"], e["fd"]) for e in r["finite_differences"]]
    lc = r["loss_change"]
    for k in ("predicted", "measured", "ratio"):
        assert _floats(rf'class="{k}" data-value="([^"]+)"', html) == [lc[k]], k
    assert "DISAGREE" not in html
    ba = _floats(r'<tr class="ba".*?data-value="([^"]+)".*?data-value="([^"]+)"', html)
    assert ba == [(e["before"], e["after"]) for e in r["after"]["next_token"]]
    assert _floats(r'class="loss-after" data-value="([^"]+)"', html) == [r["after"]["loss"]]


def tiny(tok):
    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))


@pytest.fixture(scope="module")
def report():
    tok = prompt_tokenizer(PROMPT)
    return explain(tiny(tok), tok, PROMPT, heads=[0])


def test_the_static_page_tells_the_story_with_the_reports_numbers(report):
    page = render_html(report)
    assert render_story(report) in page  # the one drawing code
    check_story(page, report)


def test_the_story_escapes_what_the_prompt_brings():
    prompt = 'x <img src=x onerror="alert(1)"> </section><script>alert(2)</script> & y'
    tok = prompt_tokenizer(prompt, kind="char")
    story = render_story(explain(tiny(tok), tok, prompt, heads=[0], checks=0))
    assert "<img" not in story and "<script" not in story and "onerror=" not in story
    assert story.count("<section") == story.count("</section>") == 1
    assert "&lt;" in story


def test_the_step_after_the_update_is_the_next_steps_start(report):
    tok = prompt_tokenizer(PROMPT)
    model = tiny(tok)
    explain(model, tok, PROMPT, heads=[0])
    again = explain(model, tok, PROMPT, heads=[0])
    assert report["after"]["loss"] == again["loss"]["value"]
    assert report["after"]["attention"] == again["attention"]["heads"][0]["weights"]
    assert report["after"]["loss"] == pytest.approx(report["loss_change"]["loss_after"], 1e-5)


def holds(file: str, a: int, b: int, code: str) -> bool:
    """Whether lines a..b of the file hold the code (whitespace as the report joins lines)."""
    lines = (ROOT / file).read_text("utf-8").splitlines()[a - 1 : b]
    return code in " ".join(line.strip() for line in lines)


def test_every_code_location_holds_the_code_it_names():
    assert {"backward", "wqkv_grad", "embedding_grad", "adamw"} <= set(WHERE)
    for stage in WHERE:
        places = where(stage)
        assert len(places) == len(WHERE[stage]), f"{stage}: a definition was not found"
        for file, a, b, code in places:
            assert (ROOT / file).is_file(), f"{stage}: {file} does not exist"
            assert holds(file, a, b, code), f"{stage}: {file}:{a}-{b} should hold `{code}`"


def test_every_stage_names_the_statement_of_the_model_that_computed_it(report):
    for st in report["stages"]:
        assert st["where"], st["key"]
        for file, a, b, code in st["where"]:
            assert holds(file, a, b, code), (st["key"], file, a, b, code)
    model = (ROOT / "gpt/model.py").read_text("utf-8").splitlines()
    first = {s["key"]: s["where"][0] for s in report["stages"]}
    assert first["h0.att"][0] == "gpt/model.py"
    assert "F.softmax(att" in model[first["h0.att"][1] - 1]
    assert "masked_fill" in model[first["h0.masked"][1] - 1]
    assert "self.c_attn(x).split" in model[first["h0.q"][1] - 1]
    assert first["probs"][3] == "class Softmax"  # explain's own, not the model's: the op
    loss = report["loss"]["where"][0]
    assert loss[0] == "gpt/model.py" and "F.cross_entropy(" in loss[3]
