"""Training diagnostics: which parameters get a gradient, gradient norms, update/weight ratios.

Used by `gpt-train --diagnose` and reusable elsewhere (e.g. `gpt-explain`). Everything reads
parameter arrays (NumPy or CuPy), computes in float64 on the host and returns plain Python
floats and strings, so results go straight into JSON.

    rows = grad_report(model)        # after loss.backward()
    bad = dead_params(model)         # the rows whose gradient is missing, zero or non-finite
    before = snapshot(model); optimizer.step()
    ratios = update_ratios(before, snapshot(model))   # ||ΔW|| / ||W|| per layer
    plot_metrics(records, "loss.png")                  # metrics.jsonl records as a figure
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable

import numpy as np

from tensorgrad import nn, to_numpy

from .store.checkpoint import atomic_write_bytes

OK, NO_GRAD, ZERO, NON_FINITE = "ok", "no grad", "zero", "non-finite"


def _sumsq(a) -> float:
    """Σ a² in float64 (no overflow for large float32 values; inf/nan pass through)."""
    a = to_numpy(a).astype(np.float64, copy=False)
    return float(np.dot(a.ravel(), a.ravel()))


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: 'transformer.h.3.attn.c_attn.weight' -> 'h.3',
    'transformer.wte.weight' -> 'wte', 'transformer.ln_f.bias' -> 'ln_f', 'lm_head.weight'
    -> 'lm_head'. Names of other models lose their last component ('fc.weight' -> 'fc')."""
    m = re.match(r"(?:transformer\.)?(h\.\d+|wte|wpe|ln_f)\.", name)
    if m:
        return m.group(1)
    return name.rsplit(".", 1)[0] if "." in name else name


def _grouped(sq: dict[str, float], group: Callable[[str], str] | None) -> dict[str, float]:
    """sqrt of the summed squares per group, in first-seen order."""
    out: dict[str, float] = {}
    for name, s in sq.items():
        key = group(name) if group else name
        out[key] = out.get(key, 0.0) + s
    return {k: math.sqrt(v) for k, v in out.items()}


def grad_status(norm: float | None) -> str:
    """A gradient's status from its norm (None: no gradient): 'ok', 'no grad', 'zero' or
    'non-finite'. The one place that decides it, for --diagnose and gpt-explain alike."""
    if norm is None:
        return NO_GRAD
    return OK if math.isfinite(norm) and norm > 0 else (ZERO if norm == 0 else NON_FINITE)


def grad_report(model: nn.Module) -> list[dict]:
    """One row per parameter (a tied matrix once): name, shape, grad_norm (None when the
    parameter has no gradient) and status: 'ok', 'no grad', 'zero' or 'non-finite'."""
    rows = []
    for name, p in model.named_parameters():
        norm = None if p.grad is None else math.sqrt(_sumsq(p.grad.array))
        status = grad_status(norm)
        rows.append({"name": name, "shape": list(p.shape), "grad_norm": norm, "status": status})
    return rows


def dead_params(model: nn.Module) -> list[dict]:
    """The rows of grad_report whose gradient is missing, exactly zero or not finite."""
    return [r for r in grad_report(model) if r["status"] != OK]


def format_report(rows: list[dict]) -> str:
    """A fixed-width table of grad_report rows, one line each."""
    width = max((len(r["name"]) for r in rows), default=4)
    lines = []
    for r in rows:
        norm = "-" if r["grad_norm"] is None else f"{r['grad_norm']:.3e}"
        shape = "x".join(map(str, r["shape"]))
        lines.append(f"{r['name']:<{width}}  {shape:>12}  {norm:>10}  {r['status']}")
    return "\n".join(lines)


def grad_norms(model: nn.Module, group: Callable[[str], str] | None = layer_of) -> dict[str, float]:
    """L2 norm of the gradients per group (default: per layer, see layer_of; None: per
    parameter). Parameters without a gradient are left out."""
    sq = {n: _sumsq(p.grad.array) for n, p in model.named_parameters() if p.grad is not None}
    return _grouped(sq, group)


def snapshot(model: nn.Module) -> dict[str, np.ndarray]:
    """Host copies of every parameter (a tied matrix once), name -> array."""
    return {n: np.array(to_numpy(p.array), copy=True) for n, p in model.named_parameters()}


def update_ratios(
    before: dict, after: dict, group: Callable[[str], str] | None = layer_of
) -> dict[str, float]:
    """||W_after - W_before|| / ||W_before|| per group (per parameter with group=None).

    A healthy Adam run sits around 1e-3 per step; far below means the layer barely learns,
    far above that it is being thrashed. A group whose weights are all zero gets inf (or 0.0
    when it did not move either).
    """
    d_sq: dict[str, float] = {}
    w_sq: dict[str, float] = {}
    for name, w0 in before.items():
        if name not in after:
            continue
        w0 = to_numpy(w0).astype(np.float64)
        d = to_numpy(after[name]).astype(np.float64) - w0
        key = group(name) if group else name
        d_sq[key] = d_sq.get(key, 0.0) + float(np.dot(d.ravel(), d.ravel()))
        w_sq[key] = w_sq.get(key, 0.0) + float(np.dot(w0.ravel(), w0.ravel()))
    out = {}
    for k, dsq in d_sq.items():
        dn, wn = math.sqrt(dsq), math.sqrt(w_sq[k])
        out[k] = dn / wn if wn > 0 else (math.inf if dn > 0 else 0.0)
    return out


def plot_metrics(records: list[dict], path) -> bool:
    """loss.png from metrics.jsonl records: train/val loss, and with diag records also
    per-layer update/weight ratios and gradient norms. Written atomically (Agg backend);
    returns False (writing nothing) when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend, no GUI
    except ImportError:
        return False
    steps = [(r["iter"], r["loss"]) for r in records if r.get("loss") is not None]
    evals = [r for r in records if "val_loss" in r]
    diags = [r for r in records if "diag" in r]
    n = 3 if diags else 1
    fig = Figure(figsize=(8, 3.2 * n))
    axes = fig.subplots(n, 1, squeeze=False)
    ax = axes[0][0]
    if steps:
        ax.plot(*zip(*steps), lw=0.6, alpha=0.4, color="C0", label="train (per step)")
    if evals:
        ax.plot(
            [r["iter"] for r in evals],
            [r["train_loss"] for r in evals],
            "o-",
            color="C0",
            label="train (eval)",
        )
        ax.plot(
            [r["iter"] for r in evals],
            [r["val_loss"] for r in evals],
            "o-",
            color="C1",
            label="val (eval)",
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy loss")
    ax.legend()
    ax.grid(alpha=0.3)
    for ax, key, label in (
        (
            (axes[-2][0], "update_ratio", "update / weight  ||ΔW||/||W||"),
            (axes[-1][0], "grad_norm", "gradient norm"),
        )
        if diags
        else ()
    ):
        layers = list(diags[-1]["diag"][key])
        for layer in layers:
            pts = [(r["iter"], r["diag"][key].get(layer)) for r in diags]
            pts = [(i, v) for i, v in pts if v]
            if pts:
                ax.plot(*zip(*pts), "o-", ms=3, label=layer)
        ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=4)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    atomic_write_bytes(path, buf.getvalue())
    return True
