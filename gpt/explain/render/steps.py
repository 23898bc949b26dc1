"""``render_steps_text`` and ``render_steps_html``: a ``gpt-explain --steps`` trace (see
gpt.explain.steps) as tables and charts (inline SVG; PNG plots are in plots.py)."""

from __future__ import annotations

from .fmt import matrix_lines
from .svg import CSS, escape, heatmap, line_chart


def render_steps_text(t: dict, plot_note: str | None = None) -> str:
    """The trace as a terminal listing: the loss, then one table per followed weight."""
    steps = t["steps"]
    out = [
        (
            f'gpt-explain --steps {len(steps)}: training on "{t["prompt"]}", lr {t["lr"]:g}, '
            f"weight decay {t['weight_decay']:g}; block {t['layer']}, head {t['head']}"
        )
    ]
    if "optimizer" in t:
        out.append(f"optimizer: {t['optimizer']['line']}")
    out += [f"note: {n}" for n in t.get("notes", [])]
    out += ["", "== loss (before each step's update) " + "=" * 36, "  step       loss     change"]
    prev = None
    for s in steps:
        ch = "" if prev is None else f"{s['loss'] - prev:+10.6f}"
        out.append(f"  {s['step']:>4} {s['loss']:10.6f} {ch}")
        prev = s["loss"]
    if "final_loss" in t:
        out.append(f"  after the last step: {t['final_loss']:.6f}")
    for k, f in enumerate(t["followed"]):
        i, j = f["index"]
        out += [
            "",
            f"== {f['label']}[{i}, {j}] = {f['param']}[{i}, {j}] " + "=" * 12,
            "  step        w             g = ∂L/∂w      m (Adam)       v (Adam)       Δw",
        ]
        for s in steps:
            e = s["followed"][k]
            g = "-" if e["grad"] is None else f"{e['grad']:+.6e}"
            out.append(
                f"  {s['step']:>4} {e['value']:+.8f} {g:>14} {e['m']:+.6e} "
                f"{e['v']:.6e} {e['update']:+.3e}"
            )
    for sn in t["snapshots"]:
        out += [
            "",
            f"== attention of block {sn['layer']} head {sn['head']} at step {sn['step']}"
            " (· = masked) " + "=" * 8,
        ]
        T = len(sn["weights"])
        mask = [[j <= i for j in range(T)] for i in range(T)]
        matrix_lines(out, sn["weights"], sn["labels"], lambda v: f"{v:.4f}", mask)
    if plot_note:
        out += ["", plot_note]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- HTML
def render_steps_html(t: dict) -> str:
    """The trace as one self-contained page: charts, tables and the attention snapshots."""
    steps = t["steps"]
    xs = [s["step"] for s in steps]
    p = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        (
            f"<title>gpt-explain --steps: {escape(t['prompt'])}</title><style>{CSS}</style></head>"
            f"<body><h1>{len(steps)} training steps on &ldquo;{escape(t['prompt'])}&rdquo;</h1>"
        ),
        f'<p class="meta">lr {t["lr"]:g}, weight decay {t["weight_decay"]:g}; followed: '
        + ", ".join(
            escape(f"{f['label']}[{f['index'][0]}, {f['index'][1]}]") for f in t["followed"]
        )
        + f" of block {t['layer']}.</p>",
    ]
    if "optimizer" in t:
        p.append(f'<p class="meta">optimizer: {escape(t["optimizer"]["line"])}</p>')
    p += [f'<p class="note">{escape(n)}</p>' for n in t.get("notes", [])]
    p.append('<h2>Loss and followed weights</h2><div class="thumbs">')
    p.append(line_chart(xs, {"loss": [s["loss"] for s in steps]}, "loss (before each update)"))
    for k, f in enumerate(t["followed"]):
        name = f"{f['label']}[{f['index'][0]}, {f['index'][1]}]"
        col = [s["followed"][k] for s in steps]
        p.append(line_chart(xs, {"w": [e["value"] for e in col]}, f"{name}: value w"))
        p.append(
            line_chart(
                xs,
                {"g": [e["grad"] for e in col], "m": [e["m"] for e in col]},
                f"{name}: gradient g and Adam's m",
            )
        )
        p.append(line_chart(xs, {"Δw": [e["update"] for e in col]}, f"{name}: update Δw"))
    p.append('</div><h2>Attention of the followed head</h2><div class="heads">')
    for sn in t["snapshots"]:
        T = len(sn["weights"])
        mask = [[j <= i for j in range(T)] for i in range(T)]
        svg = heatmap(sn["weights"], mask, sn["labels"], f"step {sn['step']}", uid=f"s{sn['step']}")
        p.append(
            f"<figure>{svg}<figcaption>block {sn['layer']} head {sn['head']}, step "
            f"{sn['step']}</figcaption></figure>"
        )
    p.append("</div><h2>Every step</h2><table><tr><th>step</th><th>loss</th>")
    p += [
        f"<th>{escape(f['label'])} w</th><th>g</th><th>m</th><th>v</th><th>Δw</th>"
        for f in t["followed"]
    ]
    p.append("</tr>")
    for s in steps:
        cells = "".join(
            f"<td>{e['value']:+.6f}</td><td>{_g(e['grad'])}</td><td>{e['m']:+.3e}"
            f"</td><td>{e['v']:.3e}</td><td>{e['update']:+.3e}</td>"
            for e in s["followed"]
        )
        p.append(f"<tr><td>{s['step']}</td><td>{s['loss']:.6f}</td>{cells}</tr>")
    p.append("</table></body></html>\n")
    return "\n".join(p)


def _g(x) -> str:
    return "-" if x is None else f"{x:+.3e}"
