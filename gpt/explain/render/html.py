"""gpt-explain's HTML page: ``render_html(report)`` for a report of ``gpt.explain``.

One self-contained page (inline CSS and SVG, nothing fetched, no script): the tokens, an SVG
flow chart of the forward stages with the residual skips, a table of every stage, each head's
attention matrix as an SVG heat map (masked cells hatched), thumbnails of every block and
head, the next-token bars, the loss terms, gradients and AdamW tables with the parameters the
loss never reached in red, the one W_Q weight worked by hand, then the evidence (finite
differences, the embedding split, the predicted and measured loss change), the logit lens and
the head ablation. Number formatting is shared with the terminal listing in
``gpt.explain.render.fmt``.
"""

from __future__ import annotations

from ...diagnostics import OK
from .fmt import element_lines, fmt_g, fmt_shape, fmt_token, fmt_value
from .svg import CSS, escape, heatmap

_GROUPS = {
    "emb": "#fde68a",
    "norm": "#fecaca",
    "attn": "#bfdbfe",
    "mlp": "#bbf7d0",
    "res": "#e9d5ff",
    "head": "#fed7aa",
    "block": "#e5e7eb",
}


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
    return "head" if k in ("logits", "probs") else "attn"


def _diagram(r) -> str:
    """The stages top to bottom as an SVG flow chart; the residual adds get skip arrows."""
    L = r["shown"]["layer"]
    boxes = []  # (key, title, subtitle, group)
    for st in r["stages"]:
        if st["key"] == f"h{L}.ln_1":
            boxes += [
                (f"b{b['block']}", f"block {b['block']}", "attention + MLP, summarised", "block")
                for b in r["blocks"]
                if b["block"] < L
            ]
        if st["key"] == "ln_f":
            boxes += [
                (f"b{b['block']}", f"block {b['block']}", "attention + MLP, summarised", "block")
                for b in r["blocks"]
                if b["block"] > L
            ]
        boxes.append(
            (
                st["key"],
                st["name"],
                "("
                + ", ".join(
                    f"{a}={n}" if a not in "1" else "1" for a, n in zip(st["axes"], st["shape"])
                )
                + ")",
                _group(st["key"]),
            )
        )
    boxes.append(("loss", "loss", f"cross-entropy = {r['loss']['value']:.4f}", "head"))
    bw, bh, gap, x0 = 300, 36, 14, 70
    height = len(boxes) * (bh + gap) + 10
    y_of = {key: 8 + k * (bh + gap) for k, (key, *_) in enumerate(boxes)}
    out = [
        (
            f'<svg class="diagram" width="{x0 + bw + 330}" height="{height}" role="img" '
            'aria-label="stages of the forward pass">'
        ),
        (
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#52606d"/></marker>'
            "</defs>"
        ),
    ]
    formulas = {st["key"]: st["formula"] for st in r["stages"]}
    for k, (key, title, sub, grp) in enumerate(boxes):
        y = y_of[key]
        if k:
            out.append(
                f'<line x1="{x0 + bw / 2}" y1="{y - gap}" x2="{x0 + bw / 2}" y2="{y}" '
                'stroke="#52606d" marker-end="url(#arrow)"/>'
            )
        out.append(
            f'<rect x="{x0}" y="{y}" width="{bw}" height="{bh}" rx="6" '
            f'fill="{_GROUPS[grp]}" stroke="#7b8794"><title>{escape(formulas.get(key, sub))}'
            f"</title></rect>"
        )
        out.append(
            f'<text x="{x0 + 10}" y="{y + 15}" font-size="12" font-weight="bold">'
            f'{escape(title)}</text><text x="{x0 + 10}" y="{y + 29}" font-size="11" '
            f'fill="#334e68">{escape(sub)}</text>'
        )
        if key in formulas:
            out.append(
                f'<text x="{x0 + bw + 12}" y="{y + 22}" font-size="11" fill="#52606d">'
                f"{escape(formulas[key])}</text>"
            )
    # skip connections: block input -> residual 1, residual 1 -> residual 2
    before_ln1 = boxes[[b[0] for b in boxes].index(f"h{L}.ln_1") - 1][0]
    for src, dst in ((before_ln1, f"h{L}.resid_1"), (f"h{L}.resid_1", f"h{L}.resid_2")):
        y1, y2 = y_of[src] + bh / 2, y_of[dst] + bh / 2
        out.append(
            f'<path d="M{x0},{y1} C{x0 - 60},{y1} {x0 - 60},{y2} {x0},{y2}" fill="none" '
            'stroke="#7c3aed" stroke-width="1.5" marker-end="url(#arrow)"/>'
        )
    out.append("</svg>")
    return "".join(out)


def render_html(r: dict) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG, nothing fetched)."""
    d, c = r["dims"], r["config"]
    T = d["T"]
    p = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>gpt-explain: {escape(r['prompt'])}</title><style>{CSS}</style></head><body>",
        f"<h1>One training step on &ldquo;{escape(r['prompt'])}&rdquo;</h1>",
        (
            f'<p class="meta">{escape(r.get("source", "GPT"))}: n_layer={c["n_layer"]}, '
            f"n_head={c['n_head']}, n_embd={c['n_embd']}, vocab_size={c['vocab_size']} "
            f"({c['n_params']:,} parameters), {escape(r['tokenizer']['kind'])} tokenizer, seed "
            f"{r['seed']}. B=1, T={T}, C={d['C']}, nh={d['nh']}, hs={d['hs']}, V={d['V']}.</p>"
        ),
    ]
    p += [f'<p class="note">{escape(n)}</p>' for n in r["notes"]]
    if r["no_gradient"]:
        p.append(
            f'<div class="alarm">{len(r["no_gradient"])} parameter(s) received NO '
            "GRADIENT: "
            + ", ".join(escape(f"{e['name']} ({e['status']})") for e in r["no_gradient"])
            + "</div>"
        )
    p += _tokens_html(r) + _forward_html(r) + _attention_html(r) + _prediction_html(r)
    p += _backward_html(r) + _evidence_html(r) + _lens_html(r)
    p.append("</body></html>\n")
    return "\n".join(p)


def _tokens_html(r) -> list[str]:
    """1. the tokens and the (input, target) pairs."""
    p = []
    p.append("<h2>1. Tokens: inputs and targets</h2><div>")
    p += [
        f'<span class="chip">{escape(fmt_token(s))}<small>{i}</small></span>'
        for i, s in zip(r["tokens"]["ids"], r["tokens"]["text"])
    ]
    p.append(
        '</div><table><tr><th>t</th><th class="l">input x<sub>t</sub></th>'
        '<th class="l">target y<sub>t</sub> = x<sub>t+1</sub></th></tr>'
    )
    p += [
        f'<tr><td>{q["position"]}</td><td class="l mono">{q["input_id"]} {escape(fmt_token(q["input"]))}'
        f'</td><td class="l mono">{q["target_id"]} {escape(fmt_token(q["target"]))}</td></tr>'
        for q in r["pairs"]
    ]
    p.append("</table>")
    return p


def _forward_html(r) -> list[str]:
    """2. the forward pass: the diagram, every stage, the blocks."""
    shown = r["shown"]
    p = []
    p.append(
        f"<h2>2. The forward pass, block {shown['layer']} in full</h2>"
        f'<div class="layout"><div>{_diagram(r)}</div></div>'
    )
    p.append(
        f'<table><tr><th class="l">stage</th><th class="l">formula</th><th>shape</th>'
        f'<th class="l">values at t={shown["position"]}, head {shown["heads"][0]}</th>'
        "<th>‖∂L/∂·‖</th></tr>"
    )
    for st in r["stages"]:
        vals = " ".join(fmt_value(v) for v in st["values"])
        p.append(
            f'<tr><td class="l">{escape(st["name"])}</td><td class="l">{escape(st["formula"])}</td>'
            f'<td class="mono">{escape(fmt_shape(st["shape"], st["axes"]))}</td><td class="l mono">'
            f"{escape(st['at'])} {escape(vals)}</td><td>{fmt_g(st['grad_norm'])}</td></tr>"
        )
    p.append(
        "</table><table><tr><th>block</th><th>rms in</th><th>+ attention</th>"
        "<th>+ MLP</th><th>rms out</th><th>‖∂L/∂out‖</th></tr>"
    )
    p += [
        f"<tr><td>{b['block']}{' (full)' if b['full'] else ''}</td><td>{b['rms_in']:.4f}</td>"
        f"<td>{b['rms_attn']:.4f}</td><td>{b['rms_mlp']:.4f}</td><td>{b['rms_out']:.4f}</td>"
        f"<td>{fmt_g(b['grad_norm_out'])}</td></tr>"
        for b in r["blocks"]
    ]
    p.append("</table>")
    return p


def _attention_html(r) -> list[str]:
    """3. the attention maps of the shown block, then of every block."""
    labels, T = r["tokens"]["text"][:-1], r["dims"]["T"]
    p = []
    a = r["attention"]
    p.append(
        f"<h2>3. Attention weights of block {a['layer']}</h2><p>Rows are queries t, columns "
        "keys s; hatched cells are the future (masked to -inf before the softmax, so their "
        'weight is exactly 0); every row sums to 1.</p><div class="heads">'
    )
    for h in a["heads"]:
        n = h["head"]
        svg = heatmap(h["weights"], r["causal_mask"], labels, f"head {n}", uid=f"h{n}")
        p.append(f"<figure>{svg}<figcaption>head {n}</figcaption></figure>")
    p.append('</div><h3>Every block and head</h3><div class="thumbs">')
    small = max(3, min(10, 80 // T))
    for li, layer_att in enumerate(r["attention_all"]):
        for hi, w in enumerate(layer_att):
            svg = heatmap(
                w, r["causal_mask"], labels, f"block {li} head {hi}", cell=small, uid=f"a{li}_{hi}"
            )
            p.append(f"<figure>{svg}<figcaption>b{li} h{hi}</figcaption></figure>")
    p.append("</div>")
    return p


def _prediction_html(r) -> list[str]:
    """4. and 5. the next-token probabilities and the loss terms."""
    p = []
    nt = r["next_token"]
    p.append(
        f"<h2>4. Next token after {escape(fmt_token(nt['input']))} (t={nt['position']})</h2><table>"
        '<tr><th class="l">token</th><th>id</th><th>p</th><th class="l"></th></tr>'
    )
    top = max(e["prob"] for e in nt["top"])
    p += [
        f'<tr><td class="l mono">{escape(fmt_token(e["token"]))}</td><td>{e["id"]}</td>'
        f'<td>{e["prob"]:.5f}</td><td class="l"><span class="bar" style="width:'
        f'{200 * e["prob"] / top:.0f}px"></span>{" target" if e["id"] == nt["target_id"] else ""}'
        "</td></tr>"
        for e in nt["top"]
    ]
    lo = r["loss"]
    p.append(
        f"</table><h2>5. Loss = mean of -log p(target) = {lo['value']:.6f}</h2><table>"
        '<tr><th>t</th><th class="l">target</th><th>p(target)</th><th>-log p</th></tr>'
    )
    p += [
        f'<tr><td>{t["position"]}</td><td class="l mono">{escape(fmt_token(t["target"]))}</td>'
        f"<td>{t['prob']:.6f}</td><td>{t['loss']:.4f}</td></tr>"
        for t in lo["terms"]
    ]
    p.append(f"</table><p>model(idx, targets) gives {lo['model_forward']:.6f}.</p>")
    return p


def _backward_html(r) -> list[str]:
    """6. to 8. the gradients, the AdamW step and one weight by hand."""
    p = []
    p.append(
        '<h2>6. Backward: ‖∂L/∂w‖ per parameter</h2><table><tr><th class="l">parameter'
        '</th><th>shape</th><th>‖w‖</th><th>‖∂L/∂w‖</th><th class="l">status</th></tr>'
    )
    p += [
        f'<tr class="{"bad" if g["status"] != OK else ""}"><td class="l mono">{escape(g["name"])}'
        f"</td><td>{'×'.join(map(str, g['shape']))}</td><td>{g['weight_norm']:.4g}</td>"
        f'<td>{fmt_g(g["grad_norm"])}</td><td class="l">{escape(g["status"])}</td></tr>'
        for g in r["gradients"]
    ]
    ad = r["adamw"]
    p.append(
        f"</table><h2>7. AdamW step (lr {ad['lr']:g}, betas {tuple(ad['betas'])}, "
        f'weight decay {ad["weight_decay"]:g})</h2><table><tr><th class="l">parameter'
        "</th><th>‖Δw‖</th><th>‖Δw‖/‖w‖</th></tr>"
    )
    p += [
        f'<tr class="{"bad" if q["skipped"] else ""}"><td class="l mono">{escape(q["name"])}</td>'
        f"<td>{q['update_norm']:.3g}</td><td>{fmt_g(q['ratio'])}</td></tr>"
        for q in ad["params"]
    ]
    p.append("</table>")
    calc = "\n".join(element_lines(ad["element"])[1:])  # the h2 above is the title
    p.append(f'<h2>8. One weight of W_Q by hand</h2><pre class="mono">{escape(calc)}</pre>')
    return p


def _evidence_html(r) -> list[str]:
    p = []
    fd = r.get("finite_differences") or []
    if fd:
        p.append(
            "<h2>Evidence: tape gradients against float64 finite differences</h2><table>"
            '<tr><th class="l">element</th><th>∂L/∂w (tape, float32)</th>'
            "<th>(L(w+h) - L(w-h))/2h (float64)</th><th>rel. error</th><th></th></tr>"
        )
        p += [
            f'<tr class="{"" if e["agree"] else "bad"}"><td class="l mono">{escape(e["label"])}'
            f"{e['index']}</td><td>{escape(_f6(e['grad']))}</td><td>{escape(_f6(e['fd']))}</td>"
            f"<td>{fmt_g(e['rel_err'])}</td><td>{'agree' if e['agree'] else 'DISAGREE'}</td></tr>"
            for e in fd
        ]
        p.append("</table>")
    es = r.get("embedding_split") or {}
    if es.get("tied"):
        p.append(
            "<h2>The tied embedding's gradient: from the logits + from the lookup</h2>"
            f"<p>‖from the logits H·Eᵀ‖ = {es['logits_norm']:.6g}, ‖from the lookup E[x]‖ = "
            f"{es['lookup_norm']:.6g}; their sum has norm {es['sum_norm']:.6g}, E's gradient "
            f"{es['total_norm']:.6g}; max |sum − E.grad| = {es['max_abs_diff']:.1e}.</p>"
            '<table><tr><th class="l">token row</th><th>‖logits part‖</th>'
            "<th>‖lookup part‖</th><th>‖total‖</th></tr>"
        )
        p += [
            f'<tr><td class="l mono">{escape(fmt_token(w["token"]))}</td><td>{w["logits_norm"]:.4g}</td>'
            f"<td>{w['lookup_norm']:.4g}</td><td>{w['total_norm']:.4g}</td></tr>"
            for w in es["rows"]
        ]
        p.append("</table>")
    c = r.get("loss_change")
    if c:
        p.append(
            "<h2>Did the update do what the gradient promised?</h2>"
            f"<p>Predicted to first order, ΔL ≈ Σ g·Δw = <b>{c['predicted']:+.6e}</b>; "
            f"measured in float64, L after − L before = {c['loss_after']:.8f} − "
            f"{c['loss_before']:.8f} = <b>{c['measured']:+.6e}</b> (ratio "
            f"{fmt_g(c['ratio'])}; the rest is second order in lr).</p>"
        )
    return p


def _f6(x) -> str:
    return "-" if x is None else f"{x:+.6e}"


def _lens_html(r) -> list[str]:
    p, lens, a = [], r.get("lens"), r.get("ablation")
    t = r["shown"]["position"]
    if lens:
        nt = r["predictions"][t]
        p.append(
            f"<h2>Logit lens at t={t} (after {escape(fmt_token(nt['input']))}, target "
            f"{escape(fmt_token(nt['target']))})</h2><p>The residual stream after each block, read "
            "through ln_f and the unembedding as if the model ended there.</p><table>"
            '<tr><th class="l">read after</th><th>lens loss</th><th>p(target)</th>'
            '<th class="l">top tokens</th></tr>'
        )
        for lay in lens["layers"]:
            q = lay["positions"][t]
            top = ", ".join(f"{fmt_token(e['token'])} {e['prob']:.3f}" for e in q["top"])
            p.append(
                f'<tr><td class="l">{escape(lay["after"])}</td><td>{lay["loss"]:.4f}</td>'
                f'<td>{q["target_prob"]:.5f}</td><td class="l mono">{escape(top)}</td></tr>'
            )
        p.append("</table>")
    if a:
        p.append(
            f"<h2>Head ablation: Δloss when one head's output is zeroed (loss "
            f"{a['loss']:.6f})</h2><table><tr><th>block \\ head</th>"
            + "".join(f"<th>{h}</th>" for h in range(len(a["delta"][0])))
            + "</tr>"
        )
        p += [
            f"<tr><td>{i}</td>" + "".join(f"<td>{d:+.3e}</td>" for d in row) + "</tr>"
            for i, row in enumerate(a["delta"])
        ]
        p.append("</table>")
    return p
