"""gpt-explain's evidence: each number it shows checked by a second, independent computation."""

import threading

import numpy as np
import pytest

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.explain import explain, prompt_tokenizer
from gpt.explain.checks import finite_differences, float64_copy
from gpt.explain.record import Call, record
from gpt.explain.stages import stages
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


def batch(tok):
    ids = tok.encode(PROMPT)
    return np.asarray([ids[:-1]]), np.asarray([ids[1:]])


def test_finite_differences_agree_with_the_tape(report):
    fd = report["finite_differences"]
    labels = {e["label"] for e in fd}
    assert labels == {"W_Q", "W_K", "W_V", "W_O", "E (wte)"}
    for e in fd:
        assert e["agree"], e
        assert e["grad"] == pytest.approx(e["fd"], rel=1e-3, abs=1e-8), e
    # the element worked through AdamW by hand is among the checked ones
    el = report["adamw"]["element"]
    assert any(e["label"] == "W_Q" and e["index"] == [el["row"], el["col"]] for e in fd)
    # W_Q, W_K, W_V elements come from the rows of the shown head (head 0: rows 0..hs-1)
    hs, C = report["dims"]["hs"], report["dims"]["C"]
    for e in fd:
        if e["label"] == "W_K":
            assert C <= e["index"][0] < C + hs


def test_a_wrong_gradient_is_flagged(tok):
    model = tiny(tok)
    idx, targets = batch(tok)
    model.eval()
    model.zero_grad()
    _, loss = model(idx, targets)
    loss.backward()
    w = model.transformer.h[0].attn.c_attn.weight
    w.grad.data[2 * 16 :] *= 1.1  # W_V's gradient 10% too large
    rows = finite_differences(model, float64_copy(model), idx, targets, 0, 0, n=2)
    verdict = {e["label"]: e["agree"] for e in rows}
    assert verdict["W_V"] is False and verdict["W_Q"] and verdict["E (wte)"]


def test_predicted_and_measured_loss_change_agree_to_first_order(tok):
    errs = {}
    for lr in (1e-3, 1e-4):
        c = explain(tiny(tok), tok, PROMPT, lr=lr, lens=False)["loss_change"]
        assert c["predicted"] < 0 and c["measured"] < 0  # the step lowers the loss
        assert c["measured"] == pytest.approx(c["loss_after"] - c["loss_before"])
        errs[lr] = abs(c["measured"] - c["predicted"])
        if lr == 1e-4:
            assert c["measured"] == pytest.approx(c["predicted"], rel=0.02)
    # the rest is second order: ten times smaller a step, about a hundred times smaller a gap
    assert errs[1e-4] < 0.03 * errs[1e-3]


def test_measured_loss_is_the_loss_of_the_updated_model(tok):
    model = tiny(tok)
    c = explain(model, tok, PROMPT)["loss_change"]
    idx, targets = batch(tok)
    model.eval()
    with tg.no_grad():
        _, loss = model(idx, targets)
    assert float(loss.item()) == pytest.approx(c["loss_after"], rel=1e-6)


def test_the_embedding_split_sums_to_the_total(report, tok):
    es = report["embedding_split"]
    assert es["tied"] and es["max_abs_diff"] < 1e-6 and es["rel_diff"] < 1e-5
    assert es["sum_norm"] == pytest.approx(es["total_norm"], rel=1e-6)
    inputs = set(tok.encode(PROMPT)[:-1])
    assert {r["id"] for r in report["embedding_split"]["rows"]} == inputs
    # independently: untie the model with lm_head = a copy of E; then lm_head's gradient is the
    # logits part and E's gradient the lookup part
    model = tiny(tok, tie_weights=False)
    tied = tiny(tok)
    model.load_state_dict(
        {**tied.state_dict(), "lm_head.weight": tied.transformer.wte.weight.detach().numpy().copy()}
    )
    idx, targets = batch(tok)
    model.eval()
    _, loss = model(idx, targets)
    loss.backward()
    assert es["logits_norm"] == pytest.approx(
        np.linalg.norm(model.lm_head.weight.grad.numpy()), rel=1e-5
    )
    assert es["lookup_norm"] == pytest.approx(
        np.linalg.norm(model.transformer.wte.weight.grad.numpy()), rel=1e-5
    )


def test_untied_model_has_no_split(tok):
    r = explain(tiny(tok, tie_weights=False), tok, PROMPT, checks=0, lens=False)
    assert r["embedding_split"] == {"tied": False} and r["loss_change"] is None


def zeroed_head_loss(model, idx, targets, layer, head):
    """The model's own (fused) forward with one head's slice of W_O's input zeroed."""
    proj = model.transformer.h[layer].attn.c_proj
    hs = model.config.n_embd // model.config.n_head
    keep = np.ones(model.config.n_embd, np.float32)
    keep[head * hs : (head + 1) * hs] = 0
    original = proj.forward
    proj.forward = lambda y: original(y * tg.Tensor(keep))
    try:
        with tg.no_grad():
            _, loss = model(idx, targets)
    finally:
        proj.forward = original
    return float(loss.item())


def test_ablating_a_head_changes_the_loss_by_the_reported_delta(report, tok):
    model = tiny(tok)
    model.eval()
    idx, targets = batch(tok)
    a = report["ablation"]
    assert a["loss"] == report["loss"]["value"]
    for layer, row in enumerate(a["delta"]):
        for head, delta in enumerate(row):
            ablated = zeroed_head_loss(model, idx, targets, layer, head)
            assert ablated - a["loss"] == pytest.approx(delta, rel=1e-3, abs=1e-6)
            assert delta != 0
    m = a["most_important"]
    assert abs(m["delta"]) == max(abs(d) for row in a["delta"] for d in row)


def test_logit_lens_reads_the_residual_stream(report, tok):
    lens = report["lens"]["layers"]
    assert [entry["after"] for entry in lens] == ["embeddings", "block 0", "block 1"]
    # after the last block the lens is the model's own prediction
    assert lens[-1]["loss"] == pytest.approx(report["loss"]["value"], rel=1e-6)
    for t, term in enumerate(report["loss"]["terms"]):
        assert lens[-1]["positions"][t]["target_prob"] == pytest.approx(term["prob"], rel=1e-5)
    # after block 0: the model's block 0 (its own forward), then ln_f and H·Eᵀ
    model = tiny(tok)
    model.eval()
    idx, _ = batch(tok)
    tr = model.transformer
    with tg.no_grad():
        x = tr.wte(idx) + tr.wpe(np.arange(idx.shape[1])[None, :])
        x = tr.h[0](x)
        logits = tr.ln_f(x) @ tr.wte.weight.T
    lg = logits.detach().numpy()[0].astype(np.float64)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = tok.encode(PROMPT)
    for t, q in enumerate(lens[1]["positions"]):
        assert q["target_prob"] == pytest.approx(p[t, ids[t + 1]], rel=1e-5)
        assert q["top"][0]["id"] == int(np.argmax(p[t]))
    assert lens[1]["loss"] == pytest.approx(-np.mean(np.log(p[np.arange(5), ids[1:]])), rel=1e-5)


def test_recorded_forward_is_the_models(tok):
    model = tiny(tok)
    model.eval()
    idx, targets = batch(tok)
    root, _, loss = record(model, idx, targets)
    atts = stages(root, model, 0).atts
    with tg.no_grad():
        _, want = model(idx, targets)  # the fused attention: the same math, other rounding
    assert float(loss.item()) == pytest.approx(float(want.item()), rel=1e-6)
    assert len(atts) == 2


def shape_of(call: Call):
    """A recorded call as nested tuples: its name, its ops, its events (children's calls, and
    each group of its own ops with the statement that ran them)."""
    events = tuple(
        shape_of(e) if isinstance(e, Call) else ("ops", tuple(op.ran for op in e.ops), e.place)
        for e in call.events
    )
    return (call.name, call.leaf, tuple(op.ran for op in call.ops), events)


def test_ops_another_thread_runs_during_the_recorded_forward_are_not_recorded(tok):
    """The op observer and the hooks are process-wide: while the forward is recorded another
    thread runs ops and calls one of the model's own modules (joined before the forward goes
    on: no timing involved). None of it is recorded: the tree is the one recorded alone."""
    model = tiny(tok)
    model.eval()
    idx, targets = batch(tok)
    alone = shape_of(record(model, idx, targets)[0])
    ran = []

    def elsewhere():
        x = tg.randn(1, 2, model.config.n_embd)
        ran.append(model.transformer.ln_f((x * 2.0).exp()).sum())

    def meanwhile(module, args):
        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()

    handle = model.transformer.h[0].mlp.register_forward_pre_hook(meanwhile)
    try:
        beside = shape_of(record(model, idx, targets)[0])
    finally:
        handle.remove()
    assert len(ran) == 1  # the other thread's ops ran during the recorded forward
    assert beside == alone


def test_followed_weights_and_a_carried_optimizer(tok):
    model = tiny(tok)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    r1 = explain(model, tok, PROMPT, optimizer=opt, checks=0, lens=False)
    follow = [(f["label"], f["param"], *f["index"]) for f in r1["followed"]]
    assert [f[0] for f in follow] == ["W_Q", "W_K", "W_V"]
    r2 = explain(model, tok, PROMPT, optimizer=opt, follow=follow, checks=0, lens=False)
    for a, b in zip(r1["followed"], r2["followed"]):
        assert b["step"] == 2 and b["value"] == a["new_value"]
        assert b["m_prev"] == a["m"] and b["v_prev"] == a["v"]
        assert b["m"] == pytest.approx(0.9 * a["m"] + 0.1 * b["grad"], rel=1e-5)
        assert b["update"] == pytest.approx(b["new_value"] - b["value"])
    e = r2["adamw"]["element"]
    assert e["step"] == 2 and e["m"] == pytest.approx(0.9 * e["m_prev"] + 0.1 * e["grad"], rel=1e-5)
    assert e["formula_new"] == pytest.approx(e["new_weight"], abs=1e-9)
    assert r2["loss"]["value"] < r1["loss"]["value"]
    with pytest.raises(ValueError, match="not a matrix element"):
        explain(model, tok, PROMPT, follow=[("x", "transformer.wte.weight", 9999, 0)])
