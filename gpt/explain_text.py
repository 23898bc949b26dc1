"""gpt-explain's terminal listing: ``render_text(report)`` for a report of ``gpt.explain``.

Section by section as the report runs (tokens, forward stages, attention matrices, next
token, loss terms, gradients with their finite-difference checks and the embedding split,
AdamW, the predicted and measured loss change, the logit lens, the head ablation), in
fixed-width columns; masked attention cells print as
``·``, and parameters the loss never reached are flagged with ``!!!``. The small number and
token formatters here (``_f``, ``_g``, ``_tok``, ``_shape``) and the AdamW-by-hand lines
(``_element_text``) are shared with the HTML page in ``gpt.explain_html``.
"""

from __future__ import annotations

import numpy as np

from .diagnostics import OK


def _f(x) -> str:
    """A value, signed, 4 decimals (scientific when tiny); None is a masked -inf."""
    if x is None:
        return "  -inf "
    return f"{x:+.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:+.1e}"


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _tok(s: str, width: int = 0) -> str:
    r = repr(s)
    return (r[: width - 1] + "…" if width and len(r) > width else r).ljust(width)


def _shape(shape, axes) -> str:
    return "(" + ", ".join(map(str, shape)) + ") " + ",".join(axes)


def _matrix(lines, rows, labels, fmt, masked=None):
    w = 9
    lines.append(" " * 16 + "".join(_tok(s, w - 1)[: w - 1].rjust(w) for s in labels))
    for i, row in enumerate(rows):
        cells = [
            "·".rjust(w) if masked is not None and not masked[i][j] else fmt(v).rjust(w)
            for j, v in enumerate(row)
        ]
        lines.append(f"  {i:>2} {_tok(labels[i], 11)}" + "".join(cells))


def render_text(r: dict) -> str:
    """The report as a terminal listing, section by section."""
    d, c, shown = r["dims"], r["config"], r["shown"]
    L, pos, T = shown["layer"], shown["position"], d["T"]
    labels = r["tokens"]["text"][:-1]
    out = [
        f'gpt-explain: one training step on "{r["prompt"]}"',
        (
            f"model: n_layer={c['n_layer']} n_head={c['n_head']} n_embd={c['n_embd']} "
            f"block_size={c['block_size']} vocab_size={c['vocab_size']}, "
            f"{c['n_params']:,} parameters; {r['tokenizer']['kind']} tokenizer; seed {r['seed']}"
        ),
    ]
    if "source" in r:
        out.insert(1, f"source: {r['source']}")
    out += [f"note: {n}" for n in r["notes"]]
    out += [
        "",
        "== 1. tokens " + "=" * 60,
        f"ids {r['tokens']['ids']}  ({len(r['tokens']['ids'])} tokens)",
        "inputs x = tokens[:-1], targets y = tokens[1:]: every position predicts the next",
        "   t  input              -> target",
    ]
    out += [
        f"  {p['position']:>2}  {p['input_id']:>6} {_tok(p['input'], 11)} -> "
        f"{p['target_id']:>6} {_tok(p['target'])}"
        for p in r["pairs"]
    ]
    out += [
        "",
        "== 2. forward " + "=" * 59,
        "B=1 T={T} C={C} nh={nh} hs={hs} V={V}; values at position t={p} ({tok}), head "
        "{h}; ‖∂L/∂·‖ is the stage's gradient after backward".format(
            **d, p=pos, tok=_tok(labels[pos]), h=shown["heads"][0]
        ),
    ]
    summary_done = False
    for st in r["stages"]:
        if st["key"] == "ln_f" and not summary_done:
            out += _block_summaries(r, skip=L)
            summary_done = True
        if st["key"] == f"h{L}.ln_1":
            out += _block_summaries(r, upto=L)
            out.append(f"-- block {L} (in full) --")
        vals = " ".join(_f(v) for v in st["values"][: T if "T" in st["axes"][-1:] else 4])
        out.append(f"{st['name']:<19} {st['formula']}")
        out.append(
            f"    {_shape(st['shape'], st['axes']):<24} {st['at']:<14} {vals}"
            f"   ‖∂L/∂·‖ {_g(st['grad_norm'])}"
        )
    out += _attention_text(r, labels)
    nt = r["next_token"]
    out += [
        "",
        f"== 4. next token after {_tok(nt['input'])} (t={nt['position']}): top "
        f"{len(nt['top'])} of {d['V']} " + "=" * 20,
    ]
    out += [
        f"  {k + 1}. {_tok(e['token'], 14)} id {e['id']:>6}  p = {e['prob']:.5f}"
        + ("   <- target" if e["id"] == nt["target_id"] else "")
        for k, e in enumerate(nt["top"])
    ]
    lo = r["loss"]
    out += [
        "",
        "== 5. loss: cross-entropy, one term -log p(target) per position " + "=" * 8,
        "   t  target          p(target)   -log p",
    ]
    out += [
        f"  {t['position']:>2}  {_tok(t['target'], 14)} {t['prob']:10.6f} {t['loss']:9.4f}"
        for t in lo["terms"]
    ]
    out.append(
        f"  loss = mean of the {T} terms = {lo['value']:.6f}  (mean recomputed "
        f"{lo['mean_of_terms']:.6f}; model(idx, targets) gives {lo['model_forward']:.6f})"
    )
    out += _gradients_text(r) + _checks_text(r) + _adamw_text(r) + _change_text(r)
    out += _lens_text(r) + _ablation_text(r)
    return "\n".join(out) + "\n"


def _block_summaries(r, upto=None, skip=None):
    rows = [
        b
        for b in r["blocks"]
        if (upto is None or b["block"] < upto) and b["block"] != skip and not b["full"]
    ]
    return [
        f"-- block {b['block']} (summary): rms in {b['rms_in']:.4f}, + attention "
        f"{b['rms_attn']:.4f}, + MLP {b['rms_mlp']:.4f}, rms out {b['rms_out']:.4f}; "
        f"‖∂L/∂out‖ {_g(b['grad_norm_out'])}"
        for b in rows
    ]


def _attention_text(r, labels):
    a, T = r["attention"], r["dims"]["T"]
    out = [
        "",
        f"== 3. attention of block {a['layer']} " + "=" * 44,
        "causal mask (0 = may attend, -inf = the future):",
    ]
    _matrix(
        out,
        [[0.0 if m else None for m in row] for row in r["causal_mask"]],
        labels,
        lambda v: "0" if v is not None else "-inf",
    )
    for h in a["heads"]:
        w = np.asarray(h["weights"])
        sums = w.sum(axis=1)
        upper = w[np.triu_indices(T, k=1)]
        out.append(
            f"head {h['head']}: softmax(q·kᵀ/√hs + mask); rows = query t, columns = key s,"
            f" · = masked"
        )
        _matrix(out, h["weights"], labels, lambda v: f"{v:.4f}", r["causal_mask"])
        out.append(
            f"    rows sum to 1 (max |sum - 1| = {np.abs(sums - 1).max():.1e}); "
            f"{upper.size} entries above the diagonal, "
            + ("all exactly 0" if not upper.any() else "NOT ALL ZERO")
        )
    return out


def _gradients_text(r):
    out = ["", "== 6. backward: ‖∂L/∂w‖ for every parameter (c_attn.weight as W_Q, W_K, W_V) ==="]
    if r["no_gradient"]:
        out.append(
            f"!!! {len(r['no_gradient'])} parameter(s) got NO GRADIENT: the loss never "
            "reached them (cut from the graph?)"
        )
        out += [f"!!!   {e['name']}: {e['status']}" for e in r["no_gradient"]]
    width = max(len(g["name"]) for g in r["gradients"])
    out.append(f"  {'parameter':<{width}} {'shape':>10} {'‖w‖':>10} {'‖∂L/∂w‖':>10}")
    for g in r["gradients"]:
        flag = "" if g["status"] == OK else f"   <-- !!! {g['status'].upper()}"
        out.append(
            f"  {g['name']:<{width}} {'x'.join(map(str, g['shape'])):>10} "
            f"{g['weight_norm']:>10.4g} {_g(g['grad_norm']):>10}{flag}"
        )
    return out


def _adamw_text(r):
    a = r["adamw"]
    out = [
        "",
        (
            f"== 7. AdamW step: lr {a['lr']:g}, betas {tuple(a['betas'])}, eps {a['eps']:g}, "
            f"weight decay {a['weight_decay']:g} on matrices ==="
        ),
    ]
    width = max(len(p["name"]) for p in a["params"])
    out.append(f"  {'parameter':<{width}} {'‖Δw‖':>10} {'‖Δw‖/‖w‖':>10}")
    for p in a["params"]:
        extra = "   (skipped: no gradient)" if p["skipped"] else ""
        out.append(f"  {p['name']:<{width}} {p['update_norm']:>10.3g} {_g(p['ratio']):>10}" + extra)
    return out + [""] + _element_text(a["element"])


def _element_text(e):
    """The AdamW update of one W_Q element, every number of the formula on its own line."""
    out = [
        f"== 8. one weight by hand: W_Q[{e['row']}, {e['col']}] of block {e['layer']} " + "=" * 20,
        (
            f"  = c_attn.weight[{e['row']}, {e['col']}]: query feature {e['row']} (head "
            f"{e['head']}, dim {e['head_dim']}) from input feature {e['col']}"
        ),
    ]
    if e.get("skipped"):
        return out + [
            (
                f"  w = {e['weight']:.10f} got no gradient: AdamW skips it "
                f"(new value {e['new_weight']:.10f})"
            )
        ]
    out += [
        f"  w                         = {e['weight']:+.10f}",
        f"  g = ∂L/∂w                 = {e['grad']:+.6e}",
        (
            f"  lr = {e['lr']:g}, β1 = {e['beta1']:g}, β2 = {e['beta2']:g}, ε = {e['eps']:g}, "
            f"weight decay λ = {e['weight_decay']:g}, step t = {e['step']}"
        ),
        f"  m = β1·m + (1-β1)·g       = {e['m']:+.6e}   "
        + ("(m starts at 0)" if e["step"] == 1 else f"(m was {e['m_prev']:+.6e})"),
        f"  v = β2·v + (1-β2)·g²      = {e['v']:.6e}   "
        + ("(v starts at 0)" if e["step"] == 1 else f"(v was {e['v_prev']:.6e})"),
        f"  m̂ = m / (1-β1^t)          = {e['m_hat']:+.6e}   (1-β1^t = {e['bias_correction1']:.6g})",
        f"  v̂ = v / (1-β2^t)          = {e['v_hat']:.6e}   (1-β2^t = {e['bias_correction2']:.6g})",
        f"  w·(1 - lr·λ)              = {e['decayed']:+.10f}   (decoupled weight decay)",
        f"  lr · m̂ / (√v̂ + ε)         = {e['update']:+.10f}",
        (
            f"  new w = w·(1-lr·λ) - lr·m̂/(√v̂+ε) = {e['formula_new']:+.10f}   "
            f"(the optimizer wrote {e['new_weight']:+.10f})"
        ),
        f"  plain SGD, w - lr·g, would give {e['sgd_new']:+.10f}: Adam's first step moves every",
        "  weight by about lr whatever the size of its gradient (m̂/√v̂ = sign(g) at t = 1)",
    ]
    return out


def _checks_text(r):
    fd, es = r.get("finite_differences") or [], r.get("embedding_split") or {}
    out = []
    if fd:
        bad = sum(not e["agree"] for e in fd)
        out += [
            "",
            (
                "== 6b. evidence: tape gradient (float32) vs float64 central difference "
                "(L(w+h) - L(w-h))/2h =="
            ),
            f"  {'element':<24} {'∂L/∂w (tape)':>14} {'finite diff.':>14} {'rel. err':>9}",
        ]
        out += [
            (
                f"  {e['label'] + str(e['index']):<24} {_e6(e['grad']):>14} "
                f"{_e6(e['fd']):>14} {_g(e['rel_err']):>9}  "
                f"{'agree' if e['agree'] else '!!! DISAGREE'}"
            )
            for e in fd
        ]
        out.append(f"  {len(fd) - bad} of {len(fd)} agree" + (f"; !!! {bad} DO NOT" if bad else ""))
    if es.get("tied"):
        out += [
            "",
            ("== 6c. the tied embedding E gets its gradient twice: logits H·Eᵀ and lookup E[x] =="),
            (
                f"  ‖from the logits‖ {es['logits_norm']:.6g} + ‖from the lookup‖ "
                f"{es['lookup_norm']:.6g}: ‖sum‖ {es['sum_norm']:.6g}, ‖E.grad‖ "
                f"{es['total_norm']:.6g}, max |sum - E.grad| = {es['max_abs_diff']:.1e}"
            ),
            f"  {'token':<16} {'‖logits part‖':>14} {'‖lookup part‖':>14} {'‖total‖':>10}",
        ]
        out += [
            f"  {_tok(w['token'], 16)} {w['logits_norm']:>14.4g} {w['lookup_norm']:>14.4g} "
            f"{w['total_norm']:>10.4g}"
            for w in es["rows"]
        ]
        out.append("  (rows of tokens that are not inputs get only the logits part)")
    return out


def _e6(x) -> str:
    return "-" if x is None else f"{x:+.6e}"


def _change_text(r):
    c = r.get("loss_change")
    if not c:
        return []
    return [
        "",
        "== 8b. did the update do what the gradient promised? " + "=" * 18,
        f"  predicted to first order: ΔL ≈ Σ g·Δw = {c['predicted']:+.6e}",
        (
            f"  measured (float64): L after {c['loss_after']:.8f} - L before "
            f"{c['loss_before']:.8f} = {c['measured']:+.6e}"
        ),
        (
            f"  measured / predicted = {_g(c['ratio'])}; the rest, {c['second_order']:+.2e}, "
            "is the second-order term (shrinks as lr²)"
        ),
        "  largest contributions g·Δw: "
        + ", ".join(f"{t['param']} {t['g_dw']:+.2e}" for t in c["top"][:3]),
    ]


def _lens_text(r):
    lens = r.get("lens")
    if not lens:
        return []
    t = r["shown"]["position"]
    nt = r["predictions"][t]
    out = [
        "",
        f"== 9. logit lens at t={t} (after {_tok(nt['input'])}, target "
        f"{_tok(nt['target'])}): ln_f(x)·Eᵀ read after each block " + "=" * 4,
        f"  {'read after':<12} {'lens loss':>9} {'p(target)':>10}  top {lens['top_k']}",
    ]
    for lay in lens["layers"]:
        q = lay["positions"][t]
        top = ", ".join(f"{_tok(e['token'])} {e['prob']:.3f}" for e in q["top"])
        out.append(f"  {lay['after']:<12} {lay['loss']:9.4f} {q['target_prob']:10.6f}  {top}")
    return out


def _ablation_text(r):
    a = r.get("ablation")
    if not a:
        return []
    nh = len(a["delta"][0])
    out = [
        "",
        (f"== 10. head ablation: Δloss when one head's output is zeroed (loss {a['loss']:.6f}) =="),
        "  block " + "".join(f"{'head ' + str(h):>12}" for h in range(nh)),
    ]
    out += [f"  {i:>5} " + "".join(f"{d:>+12.3e}" for d in row) for i, row in enumerate(a["delta"])]
    m = a["most_important"]
    out.append(
        f"  the loss leans most on block {m['layer']} head {m['head']} (Δloss {m['delta']:+.3e})"
    )
    return out
