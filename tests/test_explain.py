"""gpt-explain: the numbers of one explained training step, the renderers and the CLI."""

import json
import math
import re
import shutil
import subprocess

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from gpt.config import GPTConfig
from gpt.explain import explain, main, prompt_tokenizer, render_html, render_text
from gpt.model import GPT

PROMPT = "The capital of France is Paris"


def tiny(tok, **overrides):
    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size, **overrides))


@pytest.fixture(scope="module")
def tok():
    return prompt_tokenizer(PROMPT)


@pytest.fixture(scope="module")
def report(tok):
    return explain(tiny(tok), tok, PROMPT)


def stage(report, key):
    return next(s for s in report["stages"] if s["key"] == key)


def test_tokens_and_pairs(report, tok):
    ids = tok.encode(PROMPT)
    assert report["tokens"]["ids"] == ids and len(ids) == 6  # one token per word
    assert [p["input_id"] for p in report["pairs"]] == ids[:-1]
    assert [p["target_id"] for p in report["pairs"]] == ids[1:]
    assert report["pairs"][-1]["target"] == " Paris"


def test_stage_shapes_have_named_axes(report):
    d = report["dims"]
    B, T, C, nh, hs, V = (d[k] for k in ("B", "T", "C", "nh", "hs", "V"))
    want = {
        "tok_emb": (B, T, C),
        "pos_emb": (1, T, C),
        "h0.ln_1": (B, T, C),
        "h0.qkv": (B, T, 3 * C),
        "h0.q": (B, T, C),
        "h0.k_heads": (B, nh, T, hs),
        "h0.scores": (B, nh, T, T),
        "h0.masked": (B, nh, T, T),
        "h0.att": (B, nh, T, T),
        "h0.att_out": (B, nh, T, hs),
        "h0.merged": (B, T, C),
        "h0.attn_proj": (B, T, C),
        "h0.resid_1": (B, T, C),
        "h0.fc": (B, T, 4 * C),
        "h0.gelu": (B, T, 4 * C),
        "h0.resid_2": (B, T, C),
        "ln_f": (B, T, C),
        "logits": (B, T, V),
        "probs": (B, T, V),
    }
    for key, shape in want.items():
        st = stage(report, key)
        assert tuple(st["shape"]) == shape, key
        assert len(st["axes"]) == len(shape) and st["values"], key
    assert stage(report, "h0.scores")["axes"] == ["B", "nh", "T", "T"]
    assert not any(s["key"].startswith("h1.") for s in report["stages"])  # block 1: summary
    assert [b["full"] for b in report["blocks"]] == [True, False]
    # every stage the loss depends on got a gradient (probs is not on the loss's path)
    assert all(s["grad_norm"] for s in report["stages"] if s["key"] != "probs")


def test_stage_values_are_the_real_tensors(report, tok):
    model = tiny(tok)  # the same weights as the report's model before its step
    ids, t = report["tokens"]["ids"], report["shown"]["position"]
    wte, wpe = (
        model.transformer.wte.weight.detach().numpy(),
        model.transformer.wpe.weight.detach().numpy(),
    )
    np.testing.assert_allclose(stage(report, "tok_emb")["values"], wte[ids[t], :4], rtol=1e-6)
    np.testing.assert_allclose(
        stage(report, "x")["values"], wte[ids[t], :4] + wpe[t, :4], rtol=1e-5
    )


def test_attention_rows_sum_to_one_and_the_future_is_exactly_zero(report):
    T = report["dims"]["T"]
    mask = np.array(report["causal_mask"])
    assert (mask == np.tril(np.ones((T, T), bool))).all()
    mats = [h["weights"] for h in report["attention"]["heads"]]
    mats += [w for layer in report["attention_all"] for w in layer]
    assert len(mats) == 2 + 2 * 2
    for w in map(np.array, mats):
        assert w.shape == (T, T)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)
        assert (w[~mask] == 0.0).all()  # exactly, not approximately
        assert (w[mask] > 0).all()
    for h in report["attention"]["heads"]:
        ms = np.array(h["masked_scores"], dtype=object)
        assert all(v is None for v in ms[~mask]) and all(v is not None for v in ms[mask])
        # softmax of the printed scores gives the printed weights
        s = np.where(mask, np.array(h["scores"], dtype=float), -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        np.testing.assert_allclose(p / p.sum(1, keepdims=True), h["weights"], atol=1e-6)


def test_top5_sorted_probabilities(report):
    for pred in report["predictions"]:
        probs = [e["prob"] for e in pred["top"]]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True)
        assert 0 < min(probs) and max(probs) <= 1 and sum(probs) <= 1 + 1e-9
    nt = report["next_token"]
    assert nt["position"] == report["dims"]["T"] - 1 and nt["target"] == " Paris"


def test_loss_is_the_mean_of_its_terms(report):
    lo = report["loss"]
    terms = [t["loss"] for t in lo["terms"]]
    assert len(terms) == report["dims"]["T"]
    assert lo["value"] == pytest.approx(np.mean(terms), rel=1e-5)
    assert lo["value"] == pytest.approx(lo["model_forward"], rel=1e-5)  # re-run == model
    for t in lo["terms"]:
        assert t["loss"] == pytest.approx(-math.log(t["prob"]), rel=1e-9)
    assert lo["value"] == pytest.approx(math.log(report["dims"]["V"]), rel=0.05)  # fresh model


def adamw_new(w, g, lr, wd, b1, b2, eps, t):
    m, v = (1 - b1) * g, (1 - b2) * g * g  # from zero moments
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return w * (1 - lr * wd) - lr * m_hat / (math.sqrt(v_hat) + eps)


def test_wq_element_follows_the_adamw_formula(report):
    e = report["adamw"]["element"]
    assert e["matrix"] == "W_Q" and e["step"] == 1 and not e["skipped"]
    new = adamw_new(
        e["weight"],
        e["grad"],
        e["lr"],
        e["weight_decay"],
        e["beta1"],
        e["beta2"],
        e["eps"],
        e["step"],
    )
    assert e["new_weight"] == pytest.approx(new, abs=1e-9)  # float32 optimizer vs float64
    assert e["formula_new"] == pytest.approx(new, abs=1e-10)  # m, v: the float32 moments
    assert e["m"] == pytest.approx((1 - e["beta1"]) * e["grad"], rel=1e-6)
    assert e["v"] == pytest.approx((1 - e["beta2"]) * e["grad"] ** 2, rel=1e-5)
    assert abs(e["new_weight"] - e["weight"]) == pytest.approx(e["lr"], rel=0.01)
    # the default element is W_Q's largest gradient
    g = next(r for r in report["gradients"] if r["name"].endswith("h.0.attn.c_attn.weight[W_Q]"))
    assert g["status"] == "ok" and abs(e["grad"]) <= g["grad_norm"]


def test_wq_element_from_the_printed_text(report):
    text = render_text(report)
    e = report["adamw"]["element"]

    def num(label):
        return float(re.search(rf"^  {re.escape(label)}\s+= ([-+0-9.e]+)", text, re.M).group(1))

    hyper = re.search(
        r"lr = ([\d.e-]+), β1 = ([\d.]+), β2 = ([\d.]+), ε = ([\d.e-]+), "
        r"weight decay λ = ([\d.]+), step t = (\d+)",
        text,
    )
    lr, b1, b2, eps, wd, t = (float(x) for x in hyper.groups())
    new = adamw_new(num("w"), num("g = ∂L/∂w"), lr, wd, b1, b2, eps, int(t))
    printed = float(re.search(r"new w = .* = ([-+0-9.]+)", text).group(1))
    assert printed == pytest.approx(new, abs=2e-10)
    assert printed == pytest.approx(e["new_weight"], abs=1e-9)


def test_gradients_and_update_ratios(report):
    rows = {r["name"]: r for r in report["gradients"]}
    for part in ("W_Q", "W_K", "W_V"):
        r = rows[f"transformer.h.0.attn.c_attn.weight[{part}]"]
        assert r["shape"] == [16, 16] and r["status"] == "ok"
    assert "transformer.h.0.attn.c_attn.weight" not in rows  # shown as its three slices
    assert report["no_gradient"] == []
    for p in report["adamw"]["params"]:
        assert not p["skipped"] and p["update_norm"] > 0
        if p["ratio"] is not None:
            assert p["ratio"] == pytest.approx(p["update_norm"] / p["weight_norm"])


def cut_bias(model):
    """Block 0's c_fc stops using its bias: the bias is cut from the graph (grad None)."""
    fc = model.transformer.h[0].mlp.c_fc
    fc.forward = lambda x: F.linear(x, fc.weight)
    return "transformer.h.0.mlp.c_fc.bias", "no grad"


def zero_attention(model):
    """Block 1's attention output is multiplied by 0: its parameters get all-zero gradients."""
    proj = model.transformer.h[1].attn.c_proj
    proj.forward = lambda x: F.linear(x, proj.weight, proj.bias) * 0.0
    return "transformer.h.1.attn.c_proj.weight", "zero"


@pytest.mark.parametrize("cut", [cut_bias, zero_attention])
def test_a_parameter_cut_from_the_graph_is_flagged(tok, cut):
    model = tiny(tok)
    name, status = cut(model)
    r = explain(model, tok, PROMPT)
    flagged = {e["name"]: e["status"] for e in r["no_gradient"]}
    assert flagged.get(name) == status
    assert "transformer.wte.weight" not in flagged
    text = render_text(r)
    assert "NO GRADIENT" in text and re.search(rf"{re.escape(name)}.*!!! {status.upper()}", text)
    page = render_html(r)
    assert 'class="alarm"' in page and name in page
    if status == "no grad":  # AdamW skips a parameter without a gradient
        upd = next(p for p in r["adamw"]["params"] if p["name"] == name)
        assert upd["skipped"] and upd["update_norm"] == 0


def test_one_position_leaves_w_q_and_w_k_without_gradient(tok):
    # softmax over a single key is constantly 1: nothing flows back into q or k
    r = explain(tiny(tok), tok, "The capital")
    assert r["dims"]["T"] == 1 and any("W_Q and W_K" in n for n in r["notes"])
    flagged = {e["name"]: e["status"] for e in r["no_gradient"]}
    for i in range(2):
        for part in ("W_Q", "W_K"):
            assert flagged[f"transformer.h.{i}.attn.c_attn.weight[{part}]"] == "zero"
        assert f"transformer.h.{i}.attn.c_attn.weight[W_V]" not in flagged


def test_dropout_is_off_during_the_step(tok):
    model = tiny(tok, dropout=0.5)
    r = explain(model, tok, PROMPT)
    assert any("dropout" in n for n in r["notes"]) and model.training  # mode restored
    for w in r["attention_all"][1]:
        np.testing.assert_allclose(np.sum(w, axis=1), 1.0, atol=1e-6)
    assert r["loss"]["value"] == pytest.approx(r["loss"]["model_forward"], rel=1e-5)


def test_options_choose_layer_heads_position_and_element(tok):
    r = explain(tiny(tok), tok, PROMPT, layer=1, heads=[1], position=2, element=(3, 5), lr=1e-2)
    assert r["shown"] == {"layer": 1, "heads": [1], "position": 2}
    assert any(s["key"] == "h1.att" for s in r["stages"])
    assert not any(s["key"].startswith("h0.") for s in r["stages"])
    assert [h["head"] for h in r["attention"]["heads"]] == [1]
    assert stage(r, "h1.scores")["at"] == "[0, 1, 2, :]"
    assert stage(r, "h1.masked")["values"][3:] == [None, None]  # keys after t=2: -inf
    assert r["next_token"]["position"] == 2 and r["next_token"]["target"] == " France"
    e = r["adamw"]["element"]
    assert (e["layer"], e["row"], e["col"], e["lr"]) == (1, 3, 5, 1e-2)


def test_bad_arguments(tok):
    model = tiny(tok)
    with pytest.raises(ValueError, match="at least 2"):
        explain(model, tok, "The")
    with pytest.raises(ValueError, match="layer"):
        explain(model, tok, PROMPT, layer=5)
    with pytest.raises(ValueError, match="position"):
        explain(model, tok, PROMPT, position=9)


def test_json_round_trip(report):
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text) == report
    for key in ("stages", "attention", "gradients", "adamw", "loss", "next_token"):
        assert key in report


def test_html_is_one_self_contained_page(report):
    page = render_html(report)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(?!#)""", page)  # nothing to fetch
    assert "<link" not in page and "<script" not in page and "@import" not in page
    T, heads = report["dims"]["T"], len(report["attention"]["heads"])
    n_maps = heads + sum(len(layer) for layer in report["attention_all"])
    assert page.count('<svg class="heatmap"') == n_maps
    assert page.count('class="cell masked"') == n_maps * T * (T - 1) // 2
    assert page.count('class="cell"') == n_maps * T * (T + 1) // 2
    assert 'class="diagram"' in page and "W_Q" in page


def test_cli_text(capsys):
    assert main(["--prompt", PROMPT, "--format", "text"]) == 0
    out = capsys.readouterr().out
    for name in (
        "token embedding",
        "position embedding",
        "embedding sum",
        "ln_1",
        "c_attn",
        "q heads",
        "scores",
        "masked scores",
        "attention weights",
        "attention output",
        "merged heads",
        "c_proj (W_O)",
        "residual 1",
        "ln_2",
        "MLP c_fc",
        "GELU",
        "MLP c_proj",
        "residual 2",
        "block 1 (summary)",
        "ln_f",
        "logits",
        "probabilities",
        "next token",
        "loss",
        "W_Q",
        "W_K",
        "W_V",
        "AdamW",
        "new w =",
    ):
        assert name in out, name
    assert "all exactly 0" in out


def test_cli_json_html_graph_and_char_tokenizer(tmp_path, capsys):
    assert main(["--format", "json", "--tokenizer", "char", "--seed", "3"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokenizer"]["kind"] == "char" and r["dims"]["T"] == len(PROMPT) - 1
    assert r["config"]["block_size"] >= len(PROMPT) - 1
    page = tmp_path / "x.html"
    assert main(["--format", "html", "-o", str(page), "--graph", str(tmp_path / "g.dot")]) == 0
    assert page.read_text().count('<svg class="heatmap"') == 6
    assert (tmp_path / "g.dot").read_text().startswith("digraph")
    assert main(["--layer", "7"]) == 2
    assert "layer 7" in capsys.readouterr().err


def test_init_from_a_gpt2_directory(tmp_path, tok, capsys):
    from safetensors.numpy import save_file

    model = tiny(tok)
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    weights = {
        k.removeprefix("transformer."): np.ascontiguousarray(v.T if k.endswith(conv1d) else v)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(weights, tmp_path / "model.safetensors")
    c = model.config
    (tmp_path / "config.json").write_text(
        json.dumps(
            dict(
                n_layer=c.n_layer,
                n_head=c.n_head,
                n_embd=c.n_embd,
                n_positions=c.block_size,
                vocab_size=c.vocab_size,
            )
        )
    )
    tok.save(tmp_path)
    assert main(["--init-from", str(tmp_path), "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["source"].startswith("GPT-2 checkpoint")
    expect = explain(tiny(tok), tok, PROMPT)
    assert r["loss"]["value"] == pytest.approx(expect["loss"]["value"], rel=1e-6)


def test_out_dir_of_a_training_run(tmp_path, tok, capsys):
    from gpt.store import run_checkpoint

    model = tiny(tok)
    run_checkpoint.save(
        tmp_path,
        {"iter": 0, "model_config": model.config.to_dict(), "tokenizer": tok.to_dict()},
        model,
    )
    assert main(["--out-dir", str(tmp_path), "--which", "latest", "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["source"].startswith("trained run")
    assert r["loss"]["value"] == pytest.approx(
        explain(tiny(tok), tok, PROMPT)["loss"]["value"], rel=1e-6
    )


def _browser():
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(
    _browser() is None,
    reason="no headless Chromium/Chrome on this machine (apt-get install chromium)",
)
def test_html_renders_in_headless_chromium(tmp_path, report):
    page = tmp_path / "explain.html"
    page.write_text(render_html(report), encoding="utf-8")
    flags = [
        _browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    shot = tmp_path / "x.png"
    run = subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
        capture_output=True,
        timeout=60,
    )
    assert shot.exists(), run.stderr.decode(errors="replace")[-2000:]
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000  # a blank page is a few kB
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1200, 900)
    dom = subprocess.run(
        [*flags, "--dump-dom", page.as_uri()], capture_output=True, timeout=60
    ).stdout.decode()
    assert dom.count('class="heatmap"') == 6 and "One training step" in dom
