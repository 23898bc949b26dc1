"""gpt-plot OUT_DIR: draw OUT_DIR/loss.png from the run's metrics.jsonl (needs matplotlib).

gpt-train draws loss.png at every evaluation when matplotlib is installed; this redraws
it afterwards (after ``pip install matplotlib``, or for a run copied from elsewhere).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import diagnostics as diag

EXIT_ERROR, EXIT_USAGE = 1, 2


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; a torn last line (a killed run) is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict):
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
    if not diag.plot_metrics(records, out):
        print(
            "gpt-plot: error: matplotlib is not installed: pip install matplotlib",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(f"wrote {out} ({len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
