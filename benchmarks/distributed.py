"""Data-parallel training step: N ranks x 1 BLAS thread against 1 rank x N threads.

    pip install -e ".[mpi]"
    python -m benchmarks.distributed                      # gpt2-124M, 2 ranks vs 1 rank
    python -m benchmarks.distributed --shape char-small --steps 3     # a quick check
    python -m benchmarks.distributed --ranks 2 --batch 4 --block 256 --threads 2

Each configuration runs in its own processes: `1 rank` is one process with N BLAS threads,
`N ranks` is `mpiexec -n N` with one thread per rank. Both take the same global batch (--batch
sequences of --block tokens, split evenly over the ranks) through forward, backward, the
gradient all-reduce (tensorgrad.distributed.DataParallel, 4 MB float32 buckets) and AdamW.
Reported per step (median over --steps after one warm-up): the step time, the time inside
the all-reduces (it includes waiting for the slower rank), that as a share of the step, the
same all-reduces alone (no compute around them: the pure communication cost), the payload
(gradients + one flag per parameter, float32) and the bytes a ring all-reduce moves per rank,
2(N-1)/N x payload. Markdown on stdout; JSON in benchmarks/results/distributed-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def worker(a) -> None:
    import numpy as np

    import tensorgrad as tg
    import tensorgrad.distributed as dist
    from gpt.model import GPT

    from .common import gpt_config

    n = dist.init()
    r = dist.rank()
    if a.batch % n:
        raise SystemExit(f"--batch {a.batch} does not split over {n} ranks")
    cfg = gpt_config(a.shape, T=a.block, block_size=a.block)
    tg.manual_seed(0)
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
    ddp = dist.DataParallel(model.parameters(), bucket_mb=a.bucket_mb)  # broadcasts rank 0's
    rows = a.batch // n
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, (a.batch, a.block + 1))
    x, y = data[r * rows : (r + 1) * rows, :-1], data[r * rows : (r + 1) * rows, 1:]  # this rank's
    steps, comm = [], []
    for i in range(1 + a.steps):
        dist.barrier()
        t0, c0 = time.perf_counter(), ddp.comm_seconds
        _, loss = model(x, y)
        ddp.backward(loss)
        opt.step()
        opt.zero_grad()
        dt = time.perf_counter() - t0
        if i:  # the first step warms up
            steps.append(dt)
            comm.append(ddp.comm_seconds - c0)
    payload = ddp.comm_bytes // max(1, ddp.reductions)
    pure = []
    for _ in range(a.steps if n > 1 else 0):  # the same bucketed all-reduces, nothing around
        dist.barrier()
        c0 = ddp.comm_seconds
        ddp.reduce_gradients()
        pure.append(ddp.comm_seconds - c0)
    mine = {"step_s": steps, "allreduce_s": comm, "pure_allreduce_s": pure}
    everyone = dist.all_gather_json(mine)
    if r == 0:
        params = sum(p.array.size for p in ddp.params)
        out = {
            "ranks": n,
            "threads": a.threads,
            "shape": a.shape,
            "batch": a.batch,
            "block": a.block,
            "params": params,
            "buckets": len(ddp.buckets),
            "payload_bytes": payload if n > 1 else 4 * (params + len(ddp.params)),
            "per_rank": everyone,
        }
        Path(a.out).write_text(json.dumps(out, indent=1))


def _median(xs):
    return statistics.median(xs) if xs else 0.0


def summarize(res: dict) -> dict:
    n = res["ranks"]
    # a step ends when the slowest rank's does: take the max over ranks, then the median
    step = _median([max(s) for s in zip(*[p["step_s"] for p in res["per_rank"]])])
    comm = _median([max(s) for s in zip(*[p["allreduce_s"] for p in res["per_rank"]])])
    pure = [p["pure_allreduce_s"] for p in res["per_rank"]]
    pure = _median([max(s) for s in zip(*pure)]) if pure and pure[0] else 0.0
    ring = 2 * (n - 1) / n * res["payload_bytes"]
    return {
        "config": f"{n} rank{'s' if n > 1 else ''} x {res['threads']} thread"
        f"{'s' if res['threads'] > 1 else ''}",
        "step_s": step,
        "tokens_per_s": res["batch"] * res["block"] / step,
        "allreduce_s": comm,
        "share": comm / step,
        "pure_allreduce_s": pure,
        "payload_mb": res["payload_bytes"] / 1e6,
        "ring_mb_per_rank": ring / 1e6,
    }


def run_config(a, ranks: int, threads: int, out: Path) -> dict:
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.distributed",
        "--worker",
        "--out",
        str(out),
        "--shape",
        a.shape,
        "--batch",
        str(a.batch),
        "--block",
        str(a.block),
        "--steps",
        str(a.steps),
        "--bucket-mb",
        str(a.bucket_mb),
        "--threads",
        str(threads),
    ]
    if ranks > 1:
        exe = Path(sys.executable).parent / "mpiexec"
        exe = str(exe) if exe.exists() else shutil.which("mpiexec")
        if exe is None:
            raise SystemExit('mpiexec not found: pip install -e ".[mpi]"')
        cmd = [exe, "-n", str(ranks), *cmd]
    print(
        f"running {ranks} rank(s) x {threads} thread(s): {' '.join(cmd[:4])} ...", file=sys.stderr
    )
    subprocess.run(cmd, env=env, check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.read_text())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.distributed", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--shape", default="gpt2-124M", help="benchmarks.common.SHAPES name")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS threads of the 1-rank run (default --ranks); ranks get 1 each",
    )
    ap.add_argument("--batch", type=int, default=2, help="global sequences per step")
    ap.add_argument("--block", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a)
        return
    threads = a.threads or a.ranks
    with tempfile.TemporaryDirectory() as tmp:
        raw = [
            run_config(a, 1, threads, Path(tmp) / "one.json"),
            run_config(a, a.ranks, 1, Path(tmp) / "many.json"),
        ]
    rows = [summarize(r) for r in raw]
    print(
        f"\n{a.shape}, global batch {a.batch} x {a.block} tokens, {raw[0]['params']:,} "
        f"parameters, {raw[1]['buckets']} buckets of <= {a.bucket_mb:g} MB\n"
    )
    print(
        "| config | step s | tokens/s | all-reduce s/step | share | all-reduce alone s "
        "| payload MB/step | ring MB/rank/step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in rows:
        print(
            f"| {s['config']} | {s['step_s']:.3f} | {s['tokens_per_s']:,.0f} | "
            f"{s['allreduce_s']:.3f} | {s['share']:.1%} | {s['pure_allreduce_s']:.3f} | "
            f"{s['payload_mb']:.1f} | {s['ring_mb_per_rank']:.1f} |"
        )
    print(
        f"\nspeed-up of {rows[1]['config']} over {rows[0]['config']}: "
        f"{rows[0]['step_s'] / rows[1]['step_s']:.2f}x"
    )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"distributed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(a), "summary": rows, "raw": raw}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
