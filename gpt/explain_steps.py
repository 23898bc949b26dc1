"""gpt-explain across steps: a model trained on one prompt, chosen weights followed step by step.

``Session`` holds a model, its tokenizer, a prompt and one AdamW optimizer kept across steps;
``Session.step()`` runs one explained training step (``gpt.explain.explain`` with that
optimizer, so Adam's moments carry over) and appends to the session's history the loss, and
for every followed weight its value, gradient, moments m and v, and update. The served page
(gpt.explain_serve) steps a Session one click at a time; ``follow_steps`` runs N steps at once
for ``gpt-explain --steps N``. Both give the same numbers for the same model, prompt and
settings: the history is the same code.

``trace()`` is the JSON-able record: the steps, the followed weights, and the attention map of
the followed head at a few steps (``snapshots``). ``render_steps_text`` and
``render_steps_html`` draw it as tables and charts (inline SVG; PNG plots are in
gpt.explain_plots).
"""

from __future__ import annotations

import numpy as np

import tensorgrad as tg
from tensorgrad import device_of, to_device

from .explain import MAX_TOKENS, explain, prompt_ids
from .explain_forward import host
from .explain_html import _CSS, _e, _heatmap
from .explain_text import _matrix

STEPS_LIMIT = 1000  # the most steps --steps takes: the history stays a few hundred kB
SNAPSHOTS = 4  # attention maps kept across a run of steps


class Session:
    """One model trained step by step on a prompt, with the followed weights' history."""

    def __init__(
        self,
        model,
        tokenizer,
        prompt: str,
        layer: int = 0,
        head: int = 0,
        position: int | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        seed: int = 0,
        max_tokens: int = MAX_TOKENS,
        follow=None,
        checks: int = 2,
    ):
        self.model, self.tokenizer, self.prompt = model, tokenizer, prompt
        self.layer, self.head, self.position = layer, head, position
        self.seed, self.max_tokens, self.checks, self.follow = seed, max_tokens, checks, follow
        self.lr, self.weight_decay = lr, weight_decay
        self.opt = model.configure_optimizers(weight_decay, lr, (0.9, 0.95))
        self.history, self.snapshots, self.report = [], [], None

    def step(
        self,
        prompt: str | None = None,
        layer: int | None = None,
        head: int | None = None,
        position: int | None = None,
        snapshot: bool = True,
        checks: int | None = None,
        lens: bool = True,
    ) -> dict:
        """One explained training step; returns its report (``gpt.explain.explain``)."""
        prompt = self.prompt if prompt is None else prompt
        layer = self.layer if layer is None else int(layer)
        head = self.head if head is None else int(head)
        position = self.position if position is None else int(position)
        r = explain(
            self.model,
            self.tokenizer,
            prompt,
            layer=layer,
            heads=[head],
            position=position,
            seed=self.seed,
            max_tokens=self.max_tokens,
            checks=self.checks if checks is None else checks,
            lens=lens,
            optimizer=self.opt,
            follow=self.follow,
        )
        # kept only once the step ran: a refused setting leaves the session as it was
        self.prompt, self.layer, self.head, self.position = prompt, layer, head, position
        if self.follow is None:  # fixed at the first step: the history follows the same weights
            self.follow = [(f["label"], f["param"], *f["index"]) for f in r["followed"]]
        n = len(self.history) + 1
        lc = r.get("loss_change") or {}
        self.history.append(
            {
                "step": n,
                "loss": r["loss"]["value"],
                "loss_after": lc.get("loss_after"),
                "predicted_change": lc.get("predicted"),
                "measured_change": lc.get("measured"),
                "tokens": len(r["tokens"]["ids"]),
                "followed": [
                    {k: f[k] for k in ("label", "value", "grad", "m", "v", "update", "new_value")}
                    for f in r["followed"]
                ],
            }
        )
        if snapshot:
            h = r["attention"]["heads"][0]
            self.snapshots.append(
                {
                    "step": n,
                    "layer": self.layer,
                    "head": h["head"],
                    "weights": h["weights"],
                    "labels": r["tokens"]["text"][:-1],
                }
            )
        r["step"] = n
        self.report = r
        return r

    def loss_now(self) -> float:
        """The loss on the prompt with the current weights (no step, dropout off)."""
        cfg = self.model.config
        ids, _ = prompt_ids(self.tokenizer, self.prompt, cfg.block_size, self.max_tokens)
        dev = device_of(self.model.transformer.wte.weight.data)
        was = self.model.training
        self.model.eval()
        try:
            with tg.no_grad():
                _, loss = self.model(
                    to_device(np.asarray([ids[:-1]]), dev), to_device(np.asarray([ids[1:]]), dev)
                )
        finally:
            self.model.train(was)
        return float(host(loss))

    def trace(self) -> dict:
        c = self.model.config
        followed = [
            {"label": lb, "param": n, "index": [i, j]} for lb, n, i, j in (self.follow or [])
        ]
        return {
            "prompt": self.prompt,
            "layer": self.layer,
            "head": self.head,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "config": c.to_dict(),
            "followed": followed,
            "steps": self.history,
            "snapshots": self.snapshots,
        }


def follow_steps(
    model,
    tokenizer,
    prompt: str,
    steps: int,
    layer: int = 0,
    head: int = 0,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    seed: int = 0,
    max_tokens: int = MAX_TOKENS,
    follow=None,
    snapshots: int = SNAPSHOTS,
) -> dict:
    """``steps`` training steps on ``prompt``; the trace, with the loss after the last step."""
    if not 1 <= steps <= STEPS_LIMIT:
        raise ValueError(f"steps must be in 1..{STEPS_LIMIT}, got {steps}")
    s = Session(
        model,
        tokenizer,
        prompt,
        layer,
        head,
        lr=lr,
        weight_decay=weight_decay,
        seed=seed,
        max_tokens=max_tokens,
        follow=follow,
        checks=0,
    )
    at = {round(x) for x in np.linspace(1, steps, min(steps, snapshots))}
    for k in range(1, steps + 1):
        s.step(snapshot=k in at, lens=False)
    t = s.trace()
    t["final_loss"] = s.loss_now()
    t["notes"] = s.report["notes"]
    return t


# ----------------------------------------------------------------------------- text
def render_steps_text(t: dict, plot_note: str | None = None) -> str:
    """The trace as a terminal listing: the loss, then one table per followed weight."""
    steps = t["steps"]
    out = [
        (
            f'gpt-explain --steps {len(steps)}: training on "{t["prompt"]}", lr {t["lr"]:g}, '
            f"weight decay {t['weight_decay']:g}; block {t['layer']}, head {t['head']}"
        )
    ]
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
        _matrix(out, sn["weights"], sn["labels"], lambda v: f"{v:.4f}", mask)
    if plot_note:
        out += ["", plot_note]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- HTML
def line_chart(xs, series, title: str, width: int = 340, height: int = 150) -> str:
    """An inline SVG line chart of ``series`` (label -> values over ``xs``)."""
    colors = ("#3e7cb1", "#d64545", "#2f9e44", "#f08c00")
    vals = [v for ys in series.values() for v in ys if v is not None]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1e-12
    x0, x1 = (xs[0], xs[-1]) if len(xs) > 1 else (0, 1)
    pad = 34

    def px(x):
        return pad + (x - x0) / (x1 - x0 or 1) * (width - pad - 8)

    def py(y):
        return height - 18 - (y - lo) / (hi - lo) * (height - 36)

    out = [
        (
            f'<svg class="chart" width="{width}" height="{height}" role="img" '
            f'aria-label="{_e(title)}"><text x="{pad}" y="12" font-size="11">{_e(title)}</text>'
        ),
        (
            f'<text x="2" y="{py(hi) + 4:.1f}" font-size="9">{hi:.3g}</text>'
            f'<text x="2" y="{py(lo) + 4:.1f}" font-size="9">{lo:.3g}</text>'
        ),
        (
            f'<line x1="{pad}" y1="{height - 18}" x2="{width - 8}" y2="{height - 18}" '
            'stroke="#9aa5b1"/>'
        ),
    ]
    for k, (label, ys) in enumerate(series.items()):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        c = colors[k % len(colors)]
        out.append(
            f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{pts}">'
            f"<title>{_e(label)}</title></polyline>"
        )
        out.append(
            f'<text x="{pad + 80 * k}" y="{height - 4}" font-size="10" fill="{c}">'
            f"{_e(label)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def render_steps_html(t: dict) -> str:
    """The trace as one self-contained page: charts, tables and the attention snapshots."""
    steps = t["steps"]
    xs = [s["step"] for s in steps]
    p = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        (
            f"<title>gpt-explain --steps: {_e(t['prompt'])}</title><style>{_CSS}</style></head>"
            f"<body><h1>{len(steps)} training steps on &ldquo;{_e(t['prompt'])}&rdquo;</h1>"
        ),
        f'<p class="meta">lr {t["lr"]:g}, weight decay {t["weight_decay"]:g}; followed: '
        + ", ".join(_e(f"{f['label']}[{f['index'][0]}, {f['index'][1]}]") for f in t["followed"])
        + f" of block {t['layer']}.</p>",
    ]
    p += [f'<p class="note">{_e(n)}</p>' for n in t.get("notes", [])]
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
        svg = _heatmap(
            sn["weights"], mask, sn["labels"], f"step {sn['step']}", uid=f"s{sn['step']}"
        )
        p.append(
            f"<figure>{svg}<figcaption>block {sn['layer']} head {sn['head']}, step "
            f"{sn['step']}</figcaption></figure>"
        )
    p.append("</div><h2>Every step</h2><table><tr><th>step</th><th>loss</th>")
    p += [
        f"<th>{_e(f['label'])} w</th><th>g</th><th>m</th><th>v</th><th>Δw</th>"
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
