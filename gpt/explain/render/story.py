"""One training step as a story: the stage diagram of a gpt-explain report, as an HTML fragment.

``render_story(report)`` draws the forward stages top to bottom (formula, shape, the picked
position's values), each opening to its tensor as a heat map (a 2-D slice: batch 0, the picked
head, axes titled, a colour scale) and to the statement of the model's code that computed it
(the report's ``where``, found as the forward ran) and the op's own class. Beside each stage, the gradient norm arriving there in the backward pass;
under the loss, the backward pass reaching the weights (W_Q, W_K, W_V, W_O of the picked head,
the tied embedding's two parts), AdamW on the followed weights, the evidence (finite
differences, predicted against measured loss change) and the step's effect (attention and
next-token probabilities before and after). The static page (gpt.explain.render.html) and the
served page (gpt.explain.serve) both show this fragment: one drawing code. Every string from
the report (tokens, the prompt) is escaped; the fragment holds no script.
"""

from __future__ import annotations

import math

from ..arrays import SLICE_ROWS
from ..where import where
from .fmt import fmt_g, fmt_shape, fmt_token, fmt_value
from .svg import escape, matrix_map

GROUPS = {
    "emb": "#fde68a",
    "norm": "#fecaca",
    "attn": "#bfdbfe",
    "mlp": "#bbf7d0",
    "res": "#e9d5ff",
    "head": "#fed7aa",
    "block": "#e5e7eb",
}
AXES = {
    "T": "position t",
    "C": "feature c",
    "3C": "q | k | v feature",
    "4C": "MLP feature",
    "hs": "feature of the head",
    "V": "token id",
}
CSS = """
.story .diagram{list-style:none;padding:0;margin:6px 0;max-width:1100px}
.story .stage{border:1px solid #9aa5b1;border-radius:6px;margin:0 0 14px;position:relative}
.story .stage+.stage:before{content:"↓";position:absolute;top:-15px;left:40px;color:#52606d;
font-size:12px;line-height:14px}
.story summary{cursor:pointer;padding:3px 8px;display:grid;gap:2px 12px;
grid-template-columns:150px 1fr 270px;align-items:baseline}
.story .name{font-weight:bold}.story .formula{color:#334e68}
.story .shape,.story .vals,.story .at{font:12px ui-monospace,Menlo,Consolas,monospace}
.story .vals{grid-column:1/3;color:#1f2933}.story .grad{text-align:right;color:#7c2d12}
.story .gbar{display:inline-block;height:8px;background:#c2410c;margin-left:4px}
.story .inside{padding:6px 10px;background:#fff;border-top:1px solid #d0d7de}
.story .where{font-size:12px;color:#52606d}.story .plain{max-width:900px}
.story table{border-collapse:collapse;font-size:12.5px;margin:4px 0}
.story td,.story th{padding:2px 8px;text-align:right;border-bottom:1px solid #eef1f4}
.story td.l,.story th.l{text-align:left}.story .skip{color:#7c3aed;font-size:12px}
"""


def _group(key: str) -> str:
    k = key.split(".")[-1]
    if k in ("tok_emb", "pos_emb", "x"):
        return "emb"
    if k.startswith("ln"):
        return "norm"
    if k.startswith("resid"):
        return "res"
    if k in ("fc", "gelu", "mlp_proj"):
        return "mlp"
    return "head" if k in ("logits", "probs", "loss") else "attn"


def _short(x) -> str:
    return fmt_value(x).strip()


def _num(x, fmt=".4g", cls: str = "") -> str:
    """A shown number (``fmt``: a format spec or a function) with its exact value alongside
    (data-value), for readers and for tests."""
    value = "" if x is None else repr(float(x))
    shown = "-" if x is None else fmt(x) if callable(fmt) else format(x, fmt)
    return f'<span class="{cls}" data-value="{value}">{escape(shown)}</span>'


def _where_html(places, label: str = "computed in") -> str:
    return "".join(
        f'<div class="where">{label} <code>{escape(f)}:{a}'
        + (f"-{b}" if b != a else "")
        + f"</code>: <code>{escape(code)}</code></div>"
        for f, a, b, code in places
    )


def _stage_where(st) -> str:
    """The statement of the model's code that computed the stage, the classes of its ops (the
    formula and its backward), and the ops as they ran (a kernel's name when one did)."""
    places = st.get("where") or []
    ran = st.get("ops") or []
    return (
        _where_html(places[:1])
        + _where_html(places[1:], "the op, forward and backward:")
        + (f'<div class="where">ran: <code>{escape(", ".join(ran))}</code></div>' if ran else "")
    )


def _gbar(g, lo: float, hi: float) -> str:
    """A bar on a log scale between the smallest and largest gradient norm of the diagram."""
    if not g or g <= 0:
        return ""
    frac = 1.0 if hi <= lo else (math.log10(g) - lo) / (hi - lo)
    return f'<i class="gbar" style="width:{4 + 90 * frac:.0f}px"></i>'


def _tensor_map(r, st) -> str:
    t = st.get("tensor")
    if not t:
        return ""
    tt = t["rows"] == t["cols"] == "T"
    rows, cols = ("query t", "key s") if tt else (AXES.get(t["rows"]), AXES.get(t["cols"]))
    n, m = len(t["values"]), len(t["values"][0]) if t["values"] else 0
    cut = (
        ""
        if [n, m] == t["shape"]
        else f" (the first {n} × {m} of {t['shape'][0]} × {t['shape'][1]})"
    )
    head = f", head {r['shown']['heads'][0]}" if "nh" in st["axes"] else ""
    labels = r["tokens"]["text"][:-1]
    svg = matrix_map(
        t["values"], rows or t["rows"], cols or t["cols"], labels, st["name"],
        prob=st["key"].endswith(".att"), uid=st["key"].replace(".", "-"),
    )  # fmt: skip
    return f'<div class="where">the tensor, batch 0{head}{escape(cut)}:</div>{svg}'


def _stage_li(r, st, lo, hi, extra: str = "") -> str:
    key, t = st["key"], r["shown"]["position"]
    vals = " ".join(_num(v, _short, "v") for v in st["values"])
    g = st.get("grad_norm")
    skip = ""
    if key.endswith("resid_1") or key.endswith("resid_2"):
        skip = '<span class="skip">⊕ the skip connection: the block input added back</span>'
    opened = " open" if key.endswith(".att") else ""
    at = f' at t={t}: <span class="at">{escape(st["at"])}</span>' if st["at"] else " ="
    return (
        f'<li class="stage" data-key="{escape(key)}" style="background:{GROUPS[_group(key)]}">'
        f"<details{opened}><summary>"
        f'<span class="name">{escape(st["name"])}</span>'
        f'<span class="formula">{escape(st["formula"])} {skip}</span>'
        f'<span class="grad" title="the gradient norm arriving here in the backward pass">'
        f"↑ ‖∂L/∂·‖ {_num(g, fmt_g, 'g')}{_gbar(g, lo, hi)}</span>"
        f'<span class="vals"><span class="shape">{escape(fmt_shape(st["shape"], st["axes"]))}'
        f"</span>{at} {vals}</span>"
        f'</summary><div class="inside">{_tensor_map(r, st)}{extra}'
        f"{_stage_where(st)}</div></details></li>"
    )


def _block_li(b) -> str:
    return (
        f'<li class="stage" data-key="b{b["block"]}" style="background:{GROUPS["block"]}">'
        f'<details><summary><span class="name">block {b["block"]}</span><span class="formula">'
        "x + attention(ln_1(x)), then + MLP(ln_2(x)); summarised (pick it to see it whole)</span>"
        f'<span class="grad">↑ ‖∂L/∂out‖ {_num(b["grad_norm_out"], fmt_g, "g")}'
        f'</span><span class="vals">rms in {b["rms_in"]:.4f}, out {b["rms_out"]:.4f}</span>'
        "</summary></details></li>"
    )


def _head_grads_table(r) -> str:
    rows = "".join(
        f'<tr class="hg" data-label="{h["label"]}"><td class="l">{h["label"]} of head {h["head"]}'
        f"</td><td>{'×'.join(map(str, h['shape']))}</td><td>{_num(h['weight_norm'])}</td>"
        f"<td>{_num(h['grad_norm'], fmt_g)}</td></tr>"
        for h in r.get("head_gradients", [])
    )
    return (
        "<table><tr><th class='l'>weights</th><th>shape</th><th>‖W‖</th><th>‖∂L/∂W‖</th></tr>"
        f"{rows}</table>{_where_html(where('wqkv_grad'))}"
    )


def _split_text(r) -> str:
    es = r.get("embedding_split") or {}
    if not es.get("tied"):
        return ""
    return (
        "<p>The token embedding E is used twice, as the input lookup E[x] and as the output "
        "matrix of the logits H·Eᵀ, so its gradient has two parts: "
        f"‖from the logits‖ = {_num(es['logits_norm'], '.4g', 'split-logits')}, ‖from the "
        f"lookup‖ = {_num(es['lookup_norm'], '.4g', 'split-lookup')}; they sum to E's gradient "
        f"(norm {_num(es['total_norm'])}, largest difference {es['max_abs_diff']:.1e}).</p>"
        f"{_where_html(where('embedding_grad'))}"
    )


def _extra(r, key: str) -> str:
    """What a stage opens to beyond its tensor: the weights its gradient reaches."""
    if key.endswith(".qkv"):
        return "<p>The gradient reaches the picked head's weights here:</p>" + _head_grads_table(r)
    if key in ("tok_emb", "logits"):
        return _split_text(r)
    return ""


def _diagram(r) -> str:
    L = r["shown"]["layer"]
    grads = [s["grad_norm"] for s in r["stages"] if s.get("grad_norm")]
    lo, hi = (math.log10(min(grads)), math.log10(max(grads))) if grads else (0.0, 0.0)
    out = ['<ol class="diagram" aria-label="the stages of one training step">']
    for st in r["stages"]:
        if st["key"] == f"h{L}.ln_1":
            out += [_block_li(b) for b in r["blocks"] if b["block"] < L]
        if st["key"] == "ln_f":
            out += [_block_li(b) for b in r["blocks"] if b["block"] > L]
        out.append(_stage_li(r, st, lo, hi, _extra(r, st["key"])))
    lo_ = r["loss"]
    loss = {
        "key": "loss",
        "name": "loss",
        "formula": "mean over positions of -log p(target): the backward pass starts here, "
        "∂L/∂L = 1",
        "shape": [],
        "axes": [],
        "at": "",
        "values": [lo_["value"]],
        "grad_norm": 1.0,
        "where": lo_.get("where") or [],
    }
    out += [_stage_li(r, loss, lo, hi), "</ol>"]
    return "".join(out)


def _adamw(r) -> str:
    ad = r["adamw"]
    b1, b2 = ad["betas"]
    rows = "".join(
        f'<tr class="adam" data-label="{escape(f["label"])}"><td class="l">{escape(f["label"])}'
        f"{f['index']}</td><td>{_num(f['value'], '+.6f')}</td>"
        f"<td>{_num(f['grad'], fmt_g)}</td><td>{_num(f['m'], '.3e')}</td>"
        f"<td>{_num(f['v'], '.3e')}</td><td>{_num(f['update'], '+.3e')}"
        f"</td><td>{_num(f['new_value'], '+.6f')}</td></tr>"
        for f in r.get("followed", [])
    )
    return (
        "<h3>AdamW moves the weights</h3><p class='plain'>Each weight keeps two running "
        f"averages of its gradient g: m = β1·m + (1−β1)·g (the direction, β1 = {b1:g}) and "
        f"v = β2·v + (1−β2)·g² (the size, β2 = {b2:g}). The update is −lr·m̂/(√v̂ + ε) with "
        "both bias-corrected, plus a pull toward 0 (weight decay "
        f"{ad['weight_decay']:g}); lr = {ad['lr']:g}. Dividing by √v makes every step about "
        "lr long, whatever the gradient's size: tiny gradients move weights as much as big ones."
        " The weights followed (the largest gradient of W_Q, W_K, W_V in the picked head at the "
        "session's first step):</p><table><tr><th class='l'>weight</th><th>w before</th>"
        f"<th>g</th><th>m</th><th>v</th><th>Δw</th><th>w after</th></tr>{rows}</table>"
        f"{_where_html(where('adamw'))}"
    )


def _evidence(r) -> str:
    fd, c = r.get("finite_differences") or [], r.get("loss_change")
    if not fd and not c:
        return "<h3>Evidence</h3><p>The float64 checks are off for this step.</p>"
    rows = "".join(
        f'<tr class="fdx"><td class="l">{escape(e["label"])}{e["index"]}</td>'
        f"<td>{_num(e['grad'], '+.6e')}</td><td>{_num(e['fd'], '+.6e')}"
        f"</td><td>{e['rel_err']:.1e}</td><td>{'agree' if e['agree'] else 'DISAGREE'}</td></tr>"
        for e in fd
    )
    out = (
        "<h3>Evidence: each number computed a second way</h3><p class='plain'>The tape's "
        "gradient (float32, as training computes it) against the slope measured by nudging "
        "the weight both ways in a float64 copy of the model, (L(w+h) − L(w−h))/2h:</p><table>"
        "<tr><th class='l'>weight</th><th>tape ∂L/∂w</th><th>finite difference</th>"
        f"<th>rel. error</th><th></th></tr>{rows}</table>"
        f"{_where_html(where('finite_differences'))}"
    )
    if c:
        out += (
            "<p class='plain'>The gradient also predicts what the whole update does to the "
            f"loss: ΔL ≈ Σ g·Δw = {_num(c['predicted'], '+.4e', 'predicted')}"
            f"; measured in float64, ΔL = {_num(c['measured'], '+.4e', 'measured')}"
            f", a ratio measured / predicted of {_num(c['ratio'], fmt_g, 'ratio')}. "
            "<b>What the ratio means:</b> near 1, the step was short enough that the loss "
            "surface is the straight slope the gradient describes; the further from 1, the more "
            "the surface curved under the step (the rest is second order in lr).</p>"
            f"{_where_html(where('loss_change'))}"
        )
    return out


def _before_after(r) -> str:
    a = r.get("after")
    if not a:
        return ""
    labels, k = r["tokens"]["text"][:-1][:SLICE_ROWS], SLICE_ROWS
    h = r["attention"]["heads"][0]
    maps = "".join(
        f"<figure>{matrix_map([row[:k] for row in w[:k]], 'query t', 'key s', labels, title, True, uid)}"
        f"<figcaption>{title}</figcaption></figure>"
        for w, title, uid in (
            (h["weights"], "before the step", "att-before"),
            (a["attention"], "after the step", "att-after"),
        )
    )
    nt = r["next_token"]
    rows = "".join(
        f'<tr class="ba" data-id="{e["id"]}"><td class="l">{escape(fmt_token(e["token"]))}'
        f"{' ← target' if e['id'] == nt['target_id'] else ''}</td>"
        f"<td>{_num(e['before'], '.5f')}</td>"
        f"<td>{_num(e['after'], '.5f')}</td></tr>"
        for e in a["next_token"]
    )
    return (
        "<h3>Before and after the step</h3><p class='plain'>The same prompt through the updated"
        f" weights: the loss went from {_num(r['loss']['value'], '.6f')} "
        f"to {_num(a['loss'], '.6f', 'loss-after')}. Block {r['shown']['layer']}, "
        f"head {h['head']}'s attention:</p><div style='display:flex;gap:18px;flex-wrap:wrap'>"
        f"{maps}</div><p>The next token at t={nt['position']} (after "
        f"{escape(fmt_token(nt['input']))}):</p><table><tr><th class='l'>token</th>"
        f"<th>p before</th><th>p after</th></tr>{rows}</table>"
    )


def render_story(r: dict) -> str:
    """The report's step as an HTML fragment (with its own <style>, no script): the stage
    diagram forward and backward, AdamW, the evidence, before and after."""
    sh, T = r["shown"], r["dims"]["T"]
    return (
        f'<section class="story" data-step="{r.get("step", 1)}"><style>{CSS}</style>'
        f"<h2>One training step on the prompt, stage by stage</h2><p class='plain'>The "
        f"{T} input tokens go in at the top; at every position t the model is scored on the "
        "probability it gives the next token of the prompt (the target), and the loss is the "
        "mean of −log p(target). <b>Forward</b> runs down the stages (each shows its formula, "
        f"its shape and a few values at position t = {sh['position']}; click one to open its "
        f"tensor and the code that computes it; block {sh['layer']}, head {sh['heads'][0]} in "
        "full). <b>Backward</b> runs back up: the right-hand column is the size of the gradient "
        "‖∂L/∂·‖ arriving at each stage. Then AdamW moves every weight a little against its "
        "gradient. Training on this prompt alone, with nothing else to stay good at, the loss "
        "falls within a few steps: the model memorises the prompt.</p>"
        f"{_diagram(r)}<h3>Backward: the gradient reaches the weights</h3>"
        f"{_head_grads_table(r)}{_split_text(r)}{_where_html(where('backward'))}"
        f"{_adamw(r)}{_evidence(r)}{_before_after(r)}</section>"
    )
