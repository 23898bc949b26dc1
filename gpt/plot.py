"""gpt-plot OUT_DIR: draw OUT_DIR/loss.png from the run's metrics.jsonl (needs matplotlib).

gpt-train draws loss.png at every evaluation when matplotlib is installed; this redraws
it afterwards (after ``pip install matplotlib``, or for a run copied from elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
from pathlib import Path

from . import diagnostics as diag

EXIT_ERROR, EXIT_USAGE = 1, 2
DIAG_KEYS = ("update_ratio", "grad_norm")  # the diag tables plot_metrics draws


MAX_LINE_BYTES = 1 << 20  # a longer line is skipped unread (gpt-train's rows are < 10 kB)
MAX_ROWS = 50_000  # rows kept of each kind (steps, evaluations); more are thinned evenly
MAX_KEPT_BYTES = 64 << 20  # JSON kept of each kind, the same way


def _number(v) -> float | None:
    """v as a finite float, or None (not a number, a bool, or too big for a float)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int of 400 digits
        return None
    return f if math.isfinite(f) else None


def _drawable(r) -> dict | None:
    """What diagnostics.plot_metrics draws from one record, each value a finite number: the
    step loss, the evaluation's pair of losses, the diag tables; None if nothing is left."""
    it = _number(r.get("iter")) if isinstance(r, dict) else None
    if it is None:
        return None
    out = {"iter": r["iter"] if abs(it) < 2**53 else it}
    if _number(r.get("loss")) is not None:
        out["loss"] = _number(r["loss"])
    train, val = _number(r.get("train_loss")), _number(r.get("val_loss"))
    if train is not None and val is not None:
        out["train_loss"], out["val_loss"] = train, val
    diag = r.get("diag")
    if isinstance(diag, dict) and all(isinstance(diag.get(k), dict) for k in DIAG_KEYS):
        out["diag"] = {
            k: {str(n): _number(v) for n, v in diag[k].items() if _number(v) is not None}
            for k in DIAG_KEYS
        }
    return out if len(out) > 1 else None


def _lines(f):
    """The lines of a binary file, each at most MAX_LINE_BYTES; longer ones (a NUL tail left
    by a crash, a hand edit) are skipped a bounded piece at a time."""
    while line := f.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = f.readline(MAX_LINE_BYTES)
            continue
        yield line


class _Thinned:
    """At most MAX_ROWS rows (and MAX_KEPT_BYTES of their JSON), evenly spread over all those
    offered: past the bound every other one is dropped and only every 2nd, 4th... is taken."""

    def __init__(self):
        self.rows, self.stride, self.offered, self.size = [], 1, 0, 0

    def offer(self, seq: int, r: dict, size: int) -> None:
        self.offered += 1
        if (self.offered - 1) % self.stride == 0:
            self.rows.append((seq, r, size))
            self.size += size
        while len(self.rows) >= MAX_ROWS or self.size > MAX_KEPT_BYTES:
            self.rows, self.stride = self.rows[::2], self.stride * 2
            self.size = sum(n for *_, n in self.rows)


def read_metrics(path: Path) -> list[dict]:
    """The drawable records of a metrics.jsonl, in bounded memory: a torn last line (a killed
    run), a line that is not a JSON object (or nested too deeply, or too long) and values that
    are not finite numbers are skipped; a huge file keeps an even sample of its rows, and
    its last."""
    kinds, last, seq = {"step": _Thinned(), "eval": _Thinned()}, None, 0
    with open(path, "rb") as f:
        for line in _lines(f):
            try:
                r = _drawable(json.loads(line.decode("utf-8", "replace")))
            except (ValueError, RecursionError):  # bad JSON, or an int of 5000 digits
                continue
            if r is not None:
                seq += 1
                kind = "eval" if "val_loss" in r or "diag" in r else "step"
                kinds[kind].offer(seq, r, len(line))
                last = (seq, r, len(line))
    rows = sorted(kinds["step"].rows + kinds["eval"].rows, key=lambda x: x[0])
    if last is not None and (not rows or rows[-1][0] != last[0]):
        rows.append(last)
    return [r for _, r, _ in rows]


def _not_a_file(p: Path, must_exist: bool) -> str | None:
    """Why p cannot be read (metrics.jsonl, must_exist) or replaced (the PNG), or None; the
    message starts with 'm' or 'o' (which of the two) and is one line."""
    tag = "m" if must_exist else "o"
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        if must_exist:
            return f"m{p} does not exist (is {p.parent} a gpt-train --out-dir?)"
        return None
    except NotADirectoryError:
        return f"{tag}{p}: a part of it before {p.name} is a file, not a directory"
    except OSError as e:
        return f"{tag}{_cut(str(p))}: {e.strerror or e}"
    if stat.S_ISDIR(mode) and not must_exist:
        return f"o{p} is a directory; pass --output FILE.png to write elsewhere"
    if not stat.S_ISREG(mode):
        return f"{tag}{p} is not a regular file (a directory, device or pipe); left as it is"
    return None


def _cut(s: str) -> str:
    return s if len(s) <= 100 else f"{s[:80]}... ({len(s)} characters)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpt-plot", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", metavar="OUT_DIR", help="a gpt-train --out-dir")
    ap.add_argument("--output", metavar="PNG", help="where to write (default OUT_DIR/loss.png)")
    a = ap.parse_args(argv)
    metrics = Path(a.out_dir) / "metrics.jsonl"
    out = Path(a.output) if a.output else Path(a.out_dir) / "loss.png"
    problem = _not_a_file(metrics, must_exist=True) or _not_a_file(out, must_exist=False)
    if problem:
        what = "--output " if a.output and problem[0] == "o" else ""
        print(f"gpt-plot: error: {what}{problem[1:]}", file=sys.stderr)
        return EXIT_USAGE
    try:
        records = read_metrics(metrics)
    except OSError as e:
        print(f"gpt-plot: error: cannot read {metrics}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    if not records:
        print(f"gpt-plot: error: {metrics} holds no records yet", file=sys.stderr)
        return EXIT_ERROR
    try:
        drawn = diag.plot_metrics(records, out)
    except OSError as e:
        print(f"gpt-plot: error: cannot write {_cut(str(out))}: {e.strerror or e}", file=sys.stderr)
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
