"""gpt-explain's HTML page: ``render_html(report)`` for a report of ``gpt.explain``.

One self-contained page (inline CSS and SVG, nothing fetched, no script): the tokens, then the
step as a story (gpt.explain.render.story: the stage diagram forward and backward, AdamW, the
evidence, before and after; the served page shows the same fragment), the blocks, each head's
attention matrix as an SVG heat map (masked cells hatched), thumbnails of every block and
head, the next-token bars, the loss terms, gradients and AdamW tables with the parameters the
loss never reached in red, the one W_Q weight worked by hand, the embedding split per token
row, the logit lens and the head ablation. Number formatting is shared with the terminal listing in
``gpt.explain.render.fmt``.
"""

from __future__ import annotations

from ...diagnostics import OK
from .fmt import element_lines, fmt_g, fmt_token
from .story import render_story
from .svg import CSS, escape, heatmap


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
    if "optimizer" in r:
        p.append(f'<p class="meta">optimizer: {escape(r["optimizer"]["line"])}</p>')
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
    """2. the step as a story (the stage diagram, shared with the served page), the blocks."""
    return [
        render_story(r),
        "<h2>Every block: the residual stream's size</h2><table><tr><th>block</th>"
        "<th>rms in</th><th>+ attention</th><th>+ MLP</th><th>rms out</th><th>‖∂L/∂out‖</th></tr>",
        *(
            f"<tr><td>{b['block']}{' (full)' if b['full'] else ''}</td><td>{b['rms_in']:.4f}</td>"
            f"<td>{b['rms_attn']:.4f}</td><td>{b['rms_mlp']:.4f}</td><td>{b['rms_out']:.4f}</td>"
            f"<td>{fmt_g(b['grad_norm_out'])}</td></tr>"
            for b in r["blocks"]
        ),
        "</table>",
    ]


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
    """The tied embedding's gradient per token row (the step's evidence is in the story)."""
    p = []
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
    return p


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
