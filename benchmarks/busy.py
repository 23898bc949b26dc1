"""A training step on a busy CPU: the thread governor against fixed thread counts and PyTorch.

    python -m benchmarks.busy [--shape char-small] [--steps 120] [--skip 30] [--rounds 3]
                              [--busy 1] [--no-torch]

``--busy`` processes spin a plain Python loop for the whole run (a laptop compiling in the
background, a notebook beside a browser). Under that load each configuration runs in a fresh
process, ``--skip`` + ``--steps`` compiled training steps (forward, backward, AdamW), and the
processes alternate over ``--rounds`` rounds, so a change in the machine hits them all:

- **tensorgrad**: as a user runs it (the governor measures its thread counts over the first
  steps: tensorgrad/kernels/threads.py);
- **tensorgrad TG_THREADS=1** and **TG_THREADS=<cores>**: the two fixed settings;
- **torch**: PyTorch eager from the same weights, its defaults (when it is installed).

A figure is the median over rounds of each process's median step after the first ``--skip``
steps (the same for every configuration; the governor decides within them). The report gives
each as ms and as a ratio to the best fixed setting and to PyTorch, with the CPU, both GEMM
peaks (``--no-peaks`` skips them) and the load average. ``OPENBLAS_CORETYPE`` /
``OPENBLAS_L2_SIZE`` are removed from the children's environment (benchmarks.run's rule).
JSON goes to ``benchmarks/results/busy-<date>-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import BLAS_ENV_VARS, SHAPES, gpt_config

ROOT = Path(__file__).resolve().parents[1]
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def worker(fw: str, shape: str, n: int, out: str) -> None:
    """n training steps in this process; their seconds (and the governor's line) to out."""
    from .tasks import TORCH, _build, _stepper

    L, H, C, T, B, V = SHAPES[shape]
    model, opt, _ = _build(fw, gpt_config(shape, T, T))
    step = _stepper(fw, model, opt, B, T, V)
    times, said = [], []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        if fw != TORCH:
            from tensorgrad.kernels import threads

            line = threads.choice()
            if line:
                said.append((len(times), line))
    Path(out).write_text(json.dumps({"times_s": times, "governor": said}))


CONFIGS = {  # label -> (framework, extra environment)
    "tensorgrad": ("tensorgrad", {}),
    "tensorgrad TG_THREADS=1": ("tensorgrad", {"TG_THREADS": "1"}),
    f"tensorgrad TG_THREADS={CORES}": ("tensorgrad", {"TG_THREADS": str(CORES)}),
    "torch": ("torch", {}),
}


def run_one(label: str, args) -> dict:
    fw, extra = CONFIGS[label]
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV_VARS and k != "TG_THREADS"}
    env.update(extra, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        spec = [fw, args.shape, str(args.skip + args.steps), out]
        subprocess.run(
            [sys.executable, "-m", "benchmarks.busy", "--worker", *spec],
            env=env,
            cwd=ROOT,
            check=True,
            timeout=1800,
        )
        res = json.loads(Path(out).read_text())
    res["median_s"] = statistics.median(res["times_s"][args.skip :])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="char-small", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--skip", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes (0: none)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-peaks", action="store_true")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        fw, shape, n, out = args.worker
        worker(fw, shape, int(n), out)
        return 0
    from . import machine

    labels = [k for k in CONFIGS if not (args.no_torch and k == "torch")]
    if "torch" in labels:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: comparing tensorgrad's settings only")
            labels.remove("torch")
    desc = machine.describe()
    peaks = None if args.no_peaks else machine.measured_peaks()
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    rounds: dict = {k: [] for k in labels}
    load = []
    try:
        time.sleep(1.0)
        for r in range(args.rounds):
            for label in labels:
                res = run_one(label, args)
                rounds[label].append(res)
                load.append(os.getloadavg()[0])
                print(f"round {r + 1} {label}: {res['median_s'] * 1e3:.1f} ms/step", flush=True)
    finally:
        for p in spinners:
            p.kill()
    med = {k: statistics.median(x["median_s"] for x in v) for k, v in rounds.items()}
    fixed = [k for k in med if "TG_THREADS" in k]
    best = min(fixed, key=med.get)
    print(f"\n{machine.summary(desc)}")
    if peaks:
        print(f"GEMM peaks (GFLOP/s): {json.dumps(peaks)}")
    print(
        f"{args.shape} training step, {args.busy} busy-loop process(es) on {CORES} usable "
        f"cores; load average during the runs {min(load):.1f}-{max(load):.1f}; medians of "
        f"{args.rounds} rounds of {args.steps} steps after {args.skip}\n"
    )
    print(
        f"| configuration | ms/step | / best fixed ({best}) |"
        + (" / torch |" if "torch" in med else "")
    )
    print("|---|---|---|" + ("---|" if "torch" in med else ""))
    for k, v in med.items():
        row = f"| {k} | {v * 1e3:.1f} | {v / med[best]:.2f} |"
        if "torch" in med:
            row += f" {v / med['torch']:.2f} |"
        print(row)
    said = [line for res in rounds["tensorgrad"] for _, line in res["governor"]]
    for line in said[:3]:
        print(f"governor: {line}")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = ROOT / "benchmarks" / "results" / f"busy-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": desc,
                "gemm_peaks": peaks,
                "load_average": load,
                "median_s": med,
                "rounds": {k: [x["median_s"] for x in v] for k, v in rounds.items()},
                "governor": said,
                "blas_env_removed": {k: os.environ[k] for k in BLAS_ENV_VARS if k in os.environ},
            },
            indent=1,
        )
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
