"""Start-up: `import tensorgrad` and the first training steps, cold and warm.

    python -m benchmarks.startup [--shape char-small] [--threads N]

Each figure is a fresh Python process. "cold" runs with an empty numba cache directory
(NUMBA_CACHE_DIR), as the first run after `pip install` does: numba compiles every kernel a
step uses on first call. "warm" runs again with the cache that the cold run filled. The
"references only" row runs with TG_KERNELS=0 (no compiled kernels, nothing to compile).
Python's own bytecode cache is warm in every row. Reported: seconds for `import tensorgrad`,
for `import gpt` and building the model, for the first training step, and for the second.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import SHAPES

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import tensorgrad as tg
t1 = time.perf_counter()
from benchmarks.common import gpt_config
from gpt.model import GPT
cfg = gpt_config(sys.argv[1])
tg.manual_seed(0)
model = GPT(cfg)
opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
import numpy as np
g = np.random.default_rng(0)
B, T = int(sys.argv[3]), cfg.block_size
x = g.integers(0, cfg.vocab_size, (B, T)); y = g.integers(0, cfg.vocab_size, (B, T))
t2 = time.perf_counter()
steps = []
for _ in range(2):
    ts = time.perf_counter()
    _, loss = model(tg.tensor(x), tg.tensor(y))
    loss.backward()
    opt.step()
    opt.zero_grad()
    loss.item()
    steps.append(time.perf_counter() - ts)
print(json.dumps({"import_tensorgrad_s": t1 - t0, "build_s": t2 - t1,
                  "first_step_s": steps[0], "second_step_s": steps[1]}))
"""


def child(shape: str, threads: int, env: dict) -> dict:
    """One fresh process: its timings. Threads through the environment (BLAS and numba read
    it at start), so the child needs nothing beyond tensorgrad and gpt."""
    B = SHAPES[shape][4]
    n = str(threads)
    threads_env = {"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "NUMBA_NUM_THREADS": n}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, shape, n, str(B)],
        env={**os.environ, **threads_env, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="char-small", choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="tg-numba-cache-") as cache:
        env = {"NUMBA_CACHE_DIR": cache}
        rows["cold (empty numba cache)"] = child(args.shape, args.threads, env)
        rows["warm (cache filled)"] = child(args.shape, args.threads, env)
    rows["references only (TG_KERNELS=0)"] = child(args.shape, args.threads, {"TG_KERNELS": "0"})
    print(f"# start-up, {args.shape}, {args.threads} threads (seconds, one process each)")
    print("| run | import tensorgrad | import gpt + build | first step | second step |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['import_tensorgrad_s']:.2f} | {r['build_s']:.2f} | "
            f"{r['first_step_s']:.2f} | {r['second_step_s']:.3f} |"
        )
    from . import machine
    from .common import git_commit

    stamp = dt.datetime.now()
    report = {
        "meta": {
            "machine": machine.describe(),
            "date": stamp.isoformat(timespec="seconds"),
            "shape": args.shape,
            "threads": args.threads,
            "python": sys.version.split()[0],
            "git_commit": git_commit(),
        },
        "results": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"startup-{stamp:%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
