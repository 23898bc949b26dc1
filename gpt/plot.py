"""gpt-plot OUT_DIR: draw OUT_DIR/loss.png from the run's metrics.jsonl (needs matplotlib).

gpt-train draws loss.png at every evaluation when matplotlib is installed; this redraws
it afterwards (after ``pip install matplotlib``, or for a run copied from elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from . import diagnostics as diag

EXIT_ERROR, EXIT_USAGE = 1, 2
DIAG_KEYS = ("update_ratio", "grad_norm")  # the diag tables plot_metrics draws


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _drawable(r) -> dict | None:
    """What diagnostics.plot_metrics draws from one record, each value a finite number: the
    step loss, the evaluation's pair of losses, the diag tables; None if nothing is left."""
    if not isinstance(r, dict) or not _number(r.get("iter")):
        return None
    out = {"iter": r["iter"]}
    if _number(r.get("loss")):
        out["loss"] = r["loss"]
    if _number(r.get("train_loss")) and _number(r.get("val_loss")):
        out["train_loss"], out["val_loss"] = r["train_loss"], r["val_loss"]
    diag = r.get("diag")
    if isinstance(diag, dict) and all(isinstance(diag.get(k), dict) for k in DIAG_KEYS):
        out["diag"] = {k: {str(n): v for n, v in diag[k].items() if _number(v)} for k in DIAG_KEYS}
    return out if len(out) > 1 else None


def read_metrics(path: Path) -> list[dict]:
    """The drawable records of a metrics.jsonl: a torn last line (a killed run), a line that is
    not a JSON object (or nested too deeply to read) and values that are not numbers are
    skipped."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = _drawable(json.loads(line))
            except (ValueError, RecursionError):  # bad JSON, or an int of 5000 digits
                continue
            if r is not None:
                records.append(r)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpt-plot", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", metavar="OUT_DIR", help="a gpt-train --out-dir")
    ap.add_argument("--output", metavar="PNG", help="where to write (default OUT_DIR/loss.png)")
    a = ap.parse_args(argv)
    metrics = Path(a.out_dir) / "metrics.jsonl"
    if not metrics.is_file():
        print(
            f"gpt-plot: error: {metrics} does not exist (is {a.out_dir} a gpt-train --out-dir?)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    records = read_metrics(metrics)
    if not records:
        print(f"gpt-plot: error: {metrics} holds no records yet", file=sys.stderr)
        return EXIT_ERROR
    out = Path(a.output) if a.output else Path(a.out_dir) / "loss.png"
    if out.is_dir():
        print(
            f"gpt-plot: error: {out} is a directory; pass --output FILE.png to write elsewhere",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        drawn = diag.plot_metrics(records, out)
    except OSError as e:
        print(f"gpt-plot: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    if not drawn:
        print(
            "gpt-plot: error: matplotlib is not installed: pip install matplotlib",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(f"wrote {out} ({len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
