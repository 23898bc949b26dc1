"""What a run shows and records: the progress bar, metrics.jsonl, loss.png, --diagnose."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from tensorgrad import kernels
from tensorgrad.compiler import CompileWarning, compiled_forward
from tensorgrad.kernels import threads

from .. import diagnostics as diag
from ..store.checkpoint import atomic_write_bytes
from .state import jsonable


def first_step_why(device: str) -> str:
    """Why a first step is slow: what this process compiled, and what it loaded."""
    if device != "cpu":
        return "warming up"
    n = kernels.compile_counts()
    if n["compiled"]:
        return (
            f"{n['compiled']} CPU kernels compiled and cached ({n['loaded']} loaded from the "
            "cache): later runs load them"
        )
    made = f", {n['generated']} generated for this model compiled" if n["generated"] else ""
    return f"the CPU kernels came from the cache ({n['loaded']} loaded){made}"


class Metrics:
    """metrics.jsonl, one JSON object a line, plus the in-memory history for loss.png."""

    def __init__(self, path: Path, keep_until: int | None):
        """keep_until: on resume, drop records newer than the checkpoint's iteration (a run
        killed between checkpoints logged steps that the resumed run will redo)."""
        self.path = path
        self.records: list[dict] = []
        if keep_until is not None and path.exists():
            for line in path.read_text("utf-8").splitlines():
                try:
                    r = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # a line cut short by a kill
                if not isinstance(r, dict) or not isinstance(r.get("iter", 0), int):
                    continue  # not ours (edited by hand)
                if r.get("iter", 0) < keep_until or ("val_loss" in r and r["iter"] == keep_until):
                    self.records.append(r)
        text = "".join(json.dumps(r) + "\n" for r in self.records)
        atomic_write_bytes(path, text.encode())
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def log(self, **record) -> None:
        record = jsonable(record)
        self.records.append(record)
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


SLOW_FIRST_STEP_S = 2.0  # a first step slower than this is explained in one line


class Progress:
    """The tqdm bar of the loop, and the lines written above it (on stderr)."""

    def __init__(self, r):
        from tqdm import tqdm

        self.r, self.warned_plot, self.first = r, False, True
        warnings.filterwarnings("ignore", category=CompileWarning)  # said by compiled() below
        self.compile_said = compiled_forward(getattr(r, "model", None)) is None
        self.bar = tqdm(
            total=r.c.max_iters,
            initial=r.state.iter,
            desc="train",
            unit="it",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def write(self, line: str) -> None:
        self.bar.write(line, file=sys.stderr)

    def step(self, loss: float, lr: float, tokens_per_s: float, dt: float) -> None:
        if self.first:  # this process's first step: compiles kernels, warms caches
            self.first = False
            if dt > SLOW_FIRST_STEP_S:
                self.write(f"first step took {dt:.1f} s: " + first_step_why(self.r.c.device))
            self.bar.unpause()  # the rate and ETA count from after the first step
        if not self.compile_said:
            self.compiled()
        chose = threads.choice()  # the thread counts measured over the compiled steps
        if chose:
            self.write(chose)
        self.bar.update(1)
        self.bar.set_postfix(
            loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}", refresh=False
        )

    def compiled(self) -> None:
        """Once the model's forward has compiled (its second training step), say what."""
        s = compiled_forward(self.r.model).summary()
        if not (s["compiled"] or s["eager"]):
            return
        self.compile_said = True
        if s["compiled"]:
            made = [f"{n} {what}" for what, n in s["patterns"][-1].items()]
            if s["fused"][-1]:
                made.append(f"{s['fused'][-1]} elementwise runs as generated kernels")
            self.write(
                f"compiled: the model's forward, {s['ops'][-1]} traced ops, replays as "
                f"{s['steps'][-1]} steps"
                + (f" ({'; '.join(made)})" if made else "")
                + f"; traced and planned in {s['trace_s']:.1f} s, in the second step"
            )
        for reason in s["eager"]:
            self.write(f"not compiled: the model's forward runs eagerly: {reason}")

    def plot(self) -> None:
        """Redraw loss.png (rank 0), or say once how to get it without matplotlib."""
        r = self.r
        if not r.ddp.is_main or diag.plot_metrics(r.metrics.records, r.out / "loss.png"):
            return
        if not self.warned_plot:
            self.warned_plot = True
            self.write(
                "loss.png skipped: matplotlib is not installed (pip install matplotlib); "
                "`gpt-plot OUT_DIR` draws it from metrics.jsonl"
            )

    def close(self) -> None:
        self.bar.close()


class Diagnose:
    """--diagnose: at the first step, which parameters get no usable gradient; at every
    evaluation step, per-layer gradient norms and update/weight ratios (to metrics.jsonl)."""

    def __init__(self, r, progress: Progress, start: int):
        self.r, self.progress, self.start = r, progress, start
        self.gnorms = self.before = None

    def after_backward(self, it: int) -> None:
        c, model = self.r.c, self.r.model
        if not c.diagnose:
            return
        if it == self.start:
            report = diag.grad_report(model)
            bad = [row for row in report if row["status"] != diag.OK]
            self.progress.write(
                f"DIAGNOSE: {len(bad)} of {len(report)} parameters get no usable "
                f"gradient at iter {it}:\n{diag.format_report(bad)}"
                if bad
                else f"DIAGNOSE: all {len(report)} parameters get a finite, nonzero "
                f"gradient at iter {it}"
            )
        self.gnorms = diag.grad_norms(model) if it % c.eval_interval == 0 else None

    def before_step(self) -> None:
        self.before = diag.snapshot(self.r.model) if self.gnorms is not None else None

    def after_step(self, it: int) -> None:
        if self.gnorms is not None:
            ratios = diag.update_ratios(self.before, diag.snapshot(self.r.model))
            self.r.metrics.log(iter=it, diag={"grad_norm": self.gnorms, "update_ratio": ratios})
