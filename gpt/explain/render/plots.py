"""PNG plots of a ``gpt-explain --steps`` trace (matplotlib, a default dependency).

``save_steps_png(trace, path)`` draws the loss, and per followed weight its value, gradient
with Adam's m, and update over the steps, then the followed head's attention at the snapshot
steps, into one PNG. Without matplotlib it writes nothing and returns a one-line message.
"""

from __future__ import annotations

import numpy as np

INSTALL = "pip install matplotlib"


def save_steps_png(t: dict, path) -> str:
    """Write the plots; return the one line that says where they went (or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return f"plots: not drawn, matplotlib is not installed ({INSTALL})"
    steps = t["steps"]
    xs = [s["step"] for s in steps]
    nf, ns = len(t["followed"]), len(t["snapshots"])
    cols = 3 if ns <= 3 else 6  # a multiple of the 3 columns above, for tight_layout
    fig = plt.figure(figsize=(3.2 * cols, 2.6 * (2 + nf)))
    ax = fig.add_subplot(2 + nf, 1, 1)
    ax.plot(xs, [s["loss"] for s in steps], color="#3e7cb1")
    ax.set_title(f"loss on the prompt, lr {t['lr']:g}")
    ax.set_xlabel("step")
    for k, f in enumerate(t["followed"]):
        col = [s["followed"][k] for s in steps]
        name = f"{f['label']}[{f['index'][0]}, {f['index'][1]}]"
        series = (
            ("value w", [e["value"] for e in col]),
            ("gradient g, Adam's m", None),
            ("update Δw", [e["update"] for e in col]),
        )
        for c, (title, ys) in enumerate(series):
            a = fig.add_subplot(2 + nf, 3, 3 * (k + 1) + c + 1)
            if ys is None:
                a.plot(xs, [np.nan if e["grad"] is None else e["grad"] for e in col], label="g")
                a.plot(xs, [e["m"] for e in col], label="m")
                a.legend(fontsize=7)
            else:
                a.plot(xs, ys)
            a.set_title(f"{name}: {title}", fontsize=9)
            a.tick_params(labelsize=7)
    for k, sn in enumerate(t["snapshots"][:cols]):
        a = fig.add_subplot(2 + nf, cols, (1 + nf) * cols + k + 1)
        w = np.array(sn["weights"])
        a.imshow(np.where(np.tril(np.ones_like(w, bool)), w, np.nan), cmap="Blues", vmin=0, vmax=1)
        a.set_title(f"block {sn['layer']} head {sn['head']}, step {sn['step']}", fontsize=9)
        a.set_xticks([])
        a.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return f"plots: wrote {path}"
