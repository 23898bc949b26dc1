"""gpt-explain's terminal listing: ``render_text(report)`` for a report of ``gpt.explain``.

Section by section as the report runs (tokens, forward stages, attention matrices, next
token, loss terms, gradients with their finite-difference checks and the embedding split,
AdamW, the predicted and measured loss change, the logit lens, the head ablation), in
fixed-width columns within 100: masked attention cells print as ``·``, and parameters the
loss never reached are flagged with ``!!!``. ``full=False`` (what ``gpt-explain`` prints
unless ``--full``) gives a summary: long tables cut to their first rows, one line per forward
stage, one attention head. The number and token formatters and the AdamW-by-hand lines live in ``fmt.py``, shared
with the HTML page.
"""

from __future__ import annotations

import numpy as np

from ...diagnostics import OK
from .fmt import (
    capped,
    element_lines,
    fit,
    fmt_g,
    fmt_shape,
    fmt_token,
    fmt_value,
    matrix_lines,
)

BRIEF_ROWS = 5  # rows of each long table without --full


def render_text(r: dict, full: bool = True) -> str:
    """The report as a terminal listing, section by section, within 100 columns. full=False:
    the summary gpt-explain prints by default (about 150 lines): long tables cut to their
    first rows, one line per forward stage, one attention head."""
    n = None if full else BRIEF_ROWS
    prompt = r["prompt"] if full or len(r["prompt"]) <= 60 else r["prompt"][:59] + "…"
    d, c, shown = r["dims"], r["config"], r["shown"]
    L, pos, T = shown["layer"], shown["position"], d["T"]
    labels = r["tokens"]["text"][:-1]
    out = [
        f'gpt-explain: one training step on "{prompt}"',
        (
            f"model: n_layer {c['n_layer']}, n_head {c['n_head']}, n_embd {c['n_embd']}, "
            f"block_size {c['block_size']}, vocab {c['vocab_size']}: {c['n_params']:,} "
            f"parameters; {r['tokenizer']['kind']} tokenizer, seed {r['seed']}"
        ),
    ]
    if "source" in r:
        out.insert(1, f"source: {r['source']}")
    if "optimizer" in r:  # the step's AdamW: the run's next step, or what was assumed
        out.insert(2 if "source" in r else 1, f"optimizer: {r['optimizer']['line']}")
    out += [f"note: {n}" for n in r["notes"]]
    out += [
        "",
        "== 1. tokens " + "=" * 60,
        f"ids {r['tokens']['ids']}  ({len(r['tokens']['ids'])} tokens)",
        "inputs x = tokens[:-1], targets y = tokens[1:]: every position predicts the next",
        "   t  input              -> target",
    ]
    pairs = [
        f"  {p['position']:>2}  {p['input_id']:>6} {fmt_token(p['input'], 11)} -> "
        f"{p['target_id']:>6} {fmt_token(p['target'])}"
        for p in r["pairs"]
    ]
    out += capped(pairs, n, "positions")
    out += [
        "",
        "== 2. forward " + "=" * 59,
        "B=1 T={T} C={C} nh={nh} hs={hs} V={V}; values at position t={p} ({tok}), head "
        "{h}; ‖∂L/∂·‖ is the stage's gradient after backward".format(
            **d, p=pos, tok=fmt_token(labels[pos]), h=shown["heads"][0]
        )
        if full
        else "B=1 T={T} C={C} nh={nh} hs={hs} V={V} (--full: each stage's values and "
        "gradient)".format(**d),
    ]
    summary_done = False
    for st in r["stages"]:
        if st["key"] == "ln_f" and not summary_done:
            out += _block_summaries(r, skip=L)
            summary_done = True
        if st["key"] == f"h{L}.ln_1":
            out += _block_summaries(r, upto=L)
            out.append(f"-- block {L} (in full) --")
        shape = fmt_shape(st["shape"], st["axes"])
        if not full:  # one line: the stage, its formula, its shape
            out.append(f"{st['name']:<19} {st['formula']:<52} {shape}")
            continue
        vals = " ".join(fmt_value(v) for v in st["values"][: T if "T" in st["axes"][-1:] else 4])
        out.append(f"{st['name']:<19} {st['formula']}")
        out.append(f"    {shape:<24} {st['at']:<14} {vals}   ‖∂L/∂·‖ {fmt_g(st['grad_norm'])}")
        for file, first, last, code in (st.get("where") or [])[:1]:  # the model's statement
            lines = f"{first}-{last}" if last != first else f"{first}"
            out.append(f"    computed in {file}:{lines}: {code}")
    out += _attention_text(r, labels, full)
    nt = r["next_token"]
    out += [
        "",
        f"== 4. next token after {fmt_token(nt['input'])} (t={nt['position']}): top "
        f"{len(nt['top'])} of {d['V']} " + "=" * 20,
    ]
    out += [
        f"  {k + 1}. {fmt_token(e['token'], 14)} id {e['id']:>6}  p = {e['prob']:.5f}"
        + ("   <- target" if e["id"] == nt["target_id"] else "")
        for k, e in enumerate(nt["top"])
    ]
    lo = r["loss"]
    out += [
        "",
        "== 5. loss: cross-entropy, one term -log p(target) per position " + "=" * 8,
        "   t  target          p(target)   -log p",
    ]
    terms = [
        f"  {t['position']:>2}  {fmt_token(t['target'], 14)} {t['prob']:10.6f} {t['loss']:9.4f}"
        for t in lo["terms"]
    ]
    out += capped(terms, n, "positions")
    out.append(
        f"  loss = mean of the {T} terms = {lo['value']:.6f} (recomputed "
        f"{lo['mean_of_terms']:.6f}; model(idx, targets): {lo['model_forward']:.6f})"
    )
    out += _gradients_text(r, n) + _checks_text(r, n) + _adamw_text(r, n) + _change_text(r)
    out += _lens_text(r) + _ablation_text(r)
    return "\n".join(fit(out)) + "\n"


def _block_summaries(r, upto=None, skip=None):
    rows = [
        b
        for b in r["blocks"]
        if (upto is None or b["block"] < upto) and b["block"] != skip and not b["full"]
    ]
    return [
        f"-- block {b['block']} (summary): rms in {b['rms_in']:.4f}, + attention "
        f"{b['rms_attn']:.4f}, + MLP {b['rms_mlp']:.4f}, rms out {b['rms_out']:.4f}; "
        f"‖∂L/∂out‖ {fmt_g(b['grad_norm_out'])}"
        for b in rows
    ]


def _attention_text(r, labels, full: bool):
    a, T = r["attention"], r["dims"]["T"]
    n = None if full else BRIEF_ROWS
    out = ["", f"== 3. attention of block {a['layer']} " + "=" * 44]
    if full:
        out.append("causal mask (0 = may attend, -inf = the future):")
        matrix_lines(
            out,
            [[0.0 if m else None for m in row] for row in r["causal_mask"]],
            labels,
            lambda v: "0" if v is not None else "-inf",
        )
    else:
        out.append("causal mask: query t may attend to keys s <= t; s > t (the future) is -inf")
    for h in a["heads"] if full else a["heads"][:1]:
        w = np.asarray(h["weights"])
        sums = w.sum(axis=1)
        upper = w[np.triu_indices(T, k=1)]
        out.append(
            f"head {h['head']}: softmax(scores + mask); rows = query t, columns = key s, · = masked"
        )
        matrix_lines(out, h["weights"], labels, lambda v: f"{v:.4f}", r["causal_mask"], n)
        out.append(
            f"    rows sum to 1 (max |sum - 1| = {np.abs(sums - 1).max():.1e}); "
            f"{upper.size} entries above the diagonal, "
            + ("all exactly 0" if not upper.any() else "NOT ALL ZERO")
        )
    return out


def _gradients_text(r, n):
    out = ["", "== 6. backward: ‖∂L/∂w‖ for every parameter (c_attn.weight as W_Q, W_K, W_V) ==="]
    if r["no_gradient"]:
        out.append(
            f"!!! {len(r['no_gradient'])} parameter(s) got NO GRADIENT: the loss never "
            "reached them (cut from the graph?)"
        )
        out += [f"!!!   {e['name']}: {e['status']}" for e in r["no_gradient"]]
    width = max(len(g["name"]) for g in r["gradients"])
    out.append(f"  {'parameter':<{width}} {'shape':>10} {'‖w‖':>10} {'‖∂L/∂w‖':>10}")
    rows = []
    # without --full: the flagged parameters first, so that a cut table still shows them
    for g in sorted(r["gradients"], key=lambda g: g["status"] == OK) if n else r["gradients"]:
        flag = "" if g["status"] == OK else f"   <-- !!! {g['status'].upper()}"
        rows.append(
            f"  {g['name']:<{width}} {'x'.join(map(str, g['shape'])):>10} "
            f"{g['weight_norm']:>10.4g} {fmt_g(g['grad_norm']):>10}{flag}"
        )
    return out + capped(rows, n, "parameters")


def _adamw_text(r, n):
    a = r["adamw"]
    out = [
        "",
        (
            f"== 7. AdamW step: lr {a['lr']:g}, betas {tuple(a['betas'])}, eps {a['eps']:g}, "
            f"weight decay {a['weight_decay']:g} on matrices ==="
        ),
    ]
    if a.get("grad_clip"):
        c = a["clip_scale"]
        out.append(
            f"  gradient norm {a['grad_norm']:.6g}, clipped to {a['grad_clip']:g}: "
            + (f"every gradient times c = {c:.6g}" if c < 1 else "within it, unchanged")
        )
    width = max(len(p["name"]) for p in a["params"])
    out.append(f"  {'parameter':<{width}} {'‖Δw‖':>10} {'‖Δw‖/‖w‖':>10}")
    rows = []
    for p in a["params"]:
        extra = "   (skipped: no gradient)" if p["skipped"] else ""
        rows.append(
            f"  {p['name']:<{width}} {p['update_norm']:>10.3g} {fmt_g(p['ratio']):>10}" + extra
        )
    return out + capped(rows, n, "parameters") + [""] + element_lines(a["element"])


def _checks_text(r, n):
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
        # without --full: the disagreeing elements first, so that a cut table still shows them
        rows = [
            (
                f"  {e['label'] + str(e['index']):<24} {_e6(e['grad']):>14} "
                f"{_e6(e['fd']):>14} {fmt_g(e['rel_err']):>9}  "
                f"{'agree' if e['agree'] else '!!! DISAGREE'}"
            )
            for e in (sorted(fd, key=lambda e: e["agree"]) if n else fd)
        ]
        out += capped(rows, n, "elements")
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
        rows = [
            f"  {fmt_token(w['token'], 16)} {w['logits_norm']:>14.4g} {w['lookup_norm']:>14.4g} "
            f"{w['total_norm']:>10.4g}"
            for w in es["rows"]
        ]
        out += capped(rows, n, "tokens")
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
            f"  measured / predicted = {fmt_g(c['ratio'])}; the rest, {c['second_order']:+.2e}, "
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
        f"== 9. logit lens at t={t} (after {fmt_token(nt['input'])}, target "
        f"{fmt_token(nt['target'])}): ln_f(x)·Eᵀ read after each block " + "=" * 4,
        f"  {'read after':<12} {'lens loss':>9} {'p(target)':>10}  top {lens['top_k']}",
    ]
    for lay in lens["layers"]:
        q = lay["positions"][t]
        top = ", ".join(f"{fmt_token(e['token'])} {e['prob']:.3f}" for e in q["top"])
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
