"""The GEMM floor of a GPT training step: its matrix products alone, against the real step.

    python -m benchmarks.floor                 # char-small and baby, 5 repetitions (~2 min)
    python -m benchmarks.floor --shapes baby --reps 3 --threads 1 --detail

The floor sums, over the step's matrix products, the median time of each (timed alone,
``np.matmul(a, b, out=c)`` on preallocated float32 arrays, NumPy's BLAS) times how often the
step runs it. Per layer: c_attn (BT×C · C×3C), scores q·kᵀ and att·v as full T×T products
batched over B·n_head, attn c_proj (BT×C · C×C), mlp c_fc (BT×C · C×4C), mlp c_proj (BT×4C ·
4C×C); then lm_head (BT×C · C×V); and per product two of backward: dx = dy·W, dW = dyᵀ·x
for y = x·Wᵀ; dq = dS·k, dk = dSᵀ·q, dP = dY·vᵀ, dv = Pᵀ·dY. Weights are (out, in) as in
nn.Linear, so Wᵀ, dyᵀ and kᵀ are transposed views (BLAS trans flags, no copy); the heads are
contiguous (B·H, T, hs) arrays, not the fused block kernel's strided views of the (B, T, 3C)
projection. A layer's product is timed once, counted n_layer times, its operands in cache.

Threads: nothing is set by default (as a user runs it), but tensorgrad's governor runs the
step's products on every core or on one (on a busy machine a product split over two threads
waits for the one not scheduled), so each product is timed at OpenBLAS's pool size and at
1 and the faster kept: a floor for either choice; both sums are shown. ``--threads N`` pins
BLAS and tensorgrad at N (benchmarks.common.set_threads).

The step, timed after the products in the same process (tensorgrad imported first, so its
BLAS and malloc tuning hold for both), is benchmarks.tasks.train("tensorgrad", ...): the
compiled GPT, forward + backward + AdamW. Beyond the floor it does all that is not a GEMM
(LayerNorm, GELU, softmax, cross-entropy, embedding, AdamW, Python), and its attention kernel
skips most of the causal upper triangle and may recompute the probabilities in backward.

FLOPs: against GPT.estimate_flops_per_token(T)·B·T = (6·N + 12·L·H·Q·T)·B·T. The attention
term is the floor's exactly; 6·N counts every non-embedding parameter, but the biases and
LayerNorm weights (the 1-D parameters) are in no GEMM: floor = estimate − 6·B·T·(1-D
parameters), to the FLOP (tests/test_benchmarks.py).

Output: a Markdown table (``*``: a median including repetitions during which other processes
kept more than 0.25 cores busy; ``--detail`` adds every product) and
``benchmarks/results/floor-<date>-<time>.json`` (each product at each thread count, the step).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .common import SHAPES, gpt_config, measure

RESULTS = Path(__file__).resolve().parent / "results"
MIN_REP_S = 0.05  # a product's repetition loops it for at least this long


class Gemm(NamedTuple):
    """count × (batch × (m×k · k×n)); ta / tb: the operand is a transposed view."""

    name: str
    count: int
    batch: int
    m: int
    k: int
    n: int
    ta: bool = False
    tb: bool = False
    bwd: bool = False  # a gradient's product

    @property
    def flops(self) -> int:
        return 2 * self.count * self.batch * self.m * self.k * self.n

    def text(self) -> str:
        a, b = f"{self.m}×{self.k}{'ᵀ' * self.ta}", f"{self.k}×{self.n}{'ᵀ' * self.tb}"
        return (f"{self.batch} × " if self.batch > 1 else "") + f"{a} · {b}"


def _linear(name: str, count: int, rows: int, fan_in: int, fan_out: int) -> list[Gemm]:
    """y = x·Wᵀ (W is (out, in)), then dx = dy·W and dW = dyᵀ·x."""
    return [
        Gemm(name, count, 1, rows, fan_in, fan_out, tb=True),
        Gemm(name + " dx", count, 1, rows, fan_out, fan_in, bwd=True),
        Gemm(name + " dW", count, 1, fan_out, rows, fan_in, ta=True, bwd=True),
    ]


def gemms(shape: str) -> list[Gemm]:
    """Every matrix product of one training step of ``shape``, forward and backward."""
    L, H, C, T, B, V = SHAPES[shape]
    BT, BH, hs = B * T, B * H, C // H
    out = _linear("attn c_attn", L, BT, C, 3 * C)
    out += [
        Gemm("attn q·kᵀ", L, BH, T, hs, T, tb=True),
        Gemm("attn q·kᵀ dq", L, BH, T, T, hs, bwd=True),  # dS·k
        Gemm("attn q·kᵀ dk", L, BH, T, T, hs, ta=True, bwd=True),  # dSᵀ·q
        Gemm("attn att·v", L, BH, T, T, hs),
        Gemm("attn att·v datt", L, BH, T, hs, T, tb=True, bwd=True),  # dY·vᵀ
        Gemm("attn att·v dv", L, BH, T, T, hs, ta=True, bwd=True),  # Pᵀ·dY
    ]
    out += _linear("attn c_proj", L, BT, C, C)
    out += _linear("mlp c_fc", L, BT, C, 4 * C)
    out += _linear("mlp c_proj", L, BT, 4 * C, C)
    return out + _linear("lm_head", 1, BT, C, V)


def _operand(g, batch: int, rows: int, cols: int, transposed: bool) -> np.ndarray:
    """A float32 rows×cols operand (stacked when batch > 1), a transposed view if asked."""
    shape = (cols, rows) if transposed else (rows, cols)
    a = g.standard_normal(((batch,) if batch > 1 else ()) + shape, dtype=np.float32)
    return a.swapaxes(-1, -2) if transposed else a


def _governor() -> str:
    """The OpenBLAS/kernels threads tensorgrad's governor ran the step's last calls on."""
    from tensorgrad.kernels.threads import GOVERNOR as g

    if g.pinned:
        return f"pinned {g.pinned}"
    if g.phase != "run":  # still trying settings: the timed steps ran under several
        return f"{g.phase} ({g.i}/{len(g.schedule)})" if g.phase == "measure" else g.phase
    return "/".join(str(x if x is not None else "-") for x in g.kept)


def time_gemm(p: Gemm, reps: int, min_rep_s: float, counts: list) -> dict:
    """The product's median at each OpenBLAS thread count in ``counts``; the fastest kept."""
    from tensorgrad.kernels.cpu_blas import set_blas_threads

    g = np.random.default_rng(0)
    a = _operand(g, p.batch, p.m, p.k, p.ta)
    b = _operand(g, p.batch, p.k, p.n, p.tb)
    c = np.empty(((p.batch,) if p.batch > 1 else ()) + (p.m, p.n), np.float32)
    by = {}
    for n in counts:
        if len(counts) > 1:
            set_blas_threads(n)  # (counts has two where the pool's size could be read)
        by[n] = measure(lambda: np.matmul(a, b, out=c), reps, warmup=1, min_rep_s=min_rep_s)
    n = min(by, key=lambda n: by[n]["median_s"])
    by_n = {k: m["median_s"] for k, m in by.items()}
    info = dict(name=p.name, shape=p.text(), count=p.count, flops=p.flops, bwd=p.bwd)
    return dict(by[n], **info, threads=n, median_by_threads=by_n)


def _noisy(m: dict) -> bool:
    """Whether the median includes repetitions that other processes disturbed."""
    return m["reps_noisy"] > 0 and m["reps_used"] > len(m["times_s"]) - m["reps_noisy"]


def estimate_and_vectors(shape: str) -> tuple[float, int]:
    """(estimate_flops_per_token(T)·B·T, the count of 1-D parameters: biases, LayerNorms)."""
    import tensorgrad as tg
    from gpt.model import GPT

    _, _, _, T, B, _ = SHAPES[shape]
    tg.manual_seed(0)
    model = GPT(gpt_config(shape, T, T))
    vectors = sum(p.numel() for p in model.parameters() if len(p.shape) == 1)
    return model.estimate_flops_per_token(T) * B * T, vectors


def run_shape(shape: str, reps: int, min_rep_s: float, counts: list) -> dict:
    from tensorgrad.kernels.cpu_blas import set_blas_threads

    from .tasks import train

    _, _, _, T, B, _ = SHAPES[shape]
    products = [time_gemm(p, reps, min_rep_s, counts) for p in gemms(shape)]
    if len(counts) > 1:
        set_blas_threads(max(counts))  # the pool as it was: the step's governor starts from it
    estimate, vectors = estimate_and_vectors(shape)
    from tensorgrad.kernels.threads import GOVERNOR, ROUNDS, WARMUP

    # the governor's own measuring (its first calls) is not timed: it has chosen by then
    settle = 0 if GOVERNOR.pinned else WARMUP + 1 + ROUNDS * len(GOVERNOR.settings())
    step = dict(train("tensorgrad", shape, reps, settle), governor=_governor())

    def total(n=None, bwd=(False, True)) -> float:  # seconds: fastest, or at n threads
        pick = (lambda r: r["median_s"]) if n is None else (lambda r: r["median_by_threads"][n])
        return sum(pick(r) * r["count"] for r in products if r["bwd"] in bwd)

    return {
        "shape": shape,
        "floor_s": total(),
        "floor_fwd_s": total(bwd=(False,)),
        "floor_by_threads_s": {n: total(n) for n in counts},
        "floor_noisy": any(_noisy(r) for r in products),
        "step_s": step["median_s"],
        "step_noisy": _noisy(step),
        "floor_flops": sum(r["flops"] for r in products),
        "estimate_flops": estimate,
        "one_d_params": vectors,
        "non_gemm_flops": 6 * B * T * vectors,
        "products": products,
        "step": step,
    }


def report(results: list[dict]) -> str:
    rows = [
        "| shape | floor ms | floor ms by BLAS threads | step ms | step / floor | floor fwd / bwd "
        "ms | step fwd / bwd / AdamW ms | step's threads | floor GFLOP | estimate GFLOP | "
        "estimate − floor | 6·B·T·(1-D params) |",
        "|---|---:|---|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        s, fwd, ms = r["step"], r["floor_fwd_s"], lambda x: f"{1e3 * x:.2f}"
        by = ", ".join(f"{n}: {ms(t)}" for n, t in r["floor_by_threads_s"].items())
        rows.append(
            f"| {r['shape']} | {ms(r['floor_s'])}{'*' * r['floor_noisy']} | {by} | "
            f"{ms(r['step_s'])}{'*' * r['step_noisy']} | {r['step_s'] / r['floor_s']:.2f} | "
            f"{ms(fwd)} / {ms(r['floor_s'] - fwd)} | {ms(s['fwd_s'])} / {ms(s['bwd_s'])} / "
            f"{ms(s['opt_s'])} | {s['governor']} | {r['floor_flops'] / 1e9:.4f} | "
            f"{r['estimate_flops'] / 1e9:.4f} | {r['estimate_flops'] - r['floor_flops']:,.0f} | "
            f"{r['non_gemm_flops']:,} |"
        )
    return "\n".join(rows)


def detail(r: dict) -> str:
    rows = [
        f"| {r['shape']}: product | shape | count | ms each | threads | ms × count | GFLOP/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for p in r["products"]:
        t = p["median_s"]
        rows.append(
            f"| {p['name']} | {p['shape']} | {p['count']} | {1e3 * t:.3f}{'*' * _noisy(p)} | "
            f"{p['threads']} | {1e3 * t * p['count']:.2f} | {p['flops'] / p['count'] / t / 1e9:.1f} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.floor", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--shapes", default="char-small,baby", help="comma-separated SHAPES names")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per product and step")
    ap.add_argument(
        "--threads", type=int, help="opt-in: BLAS and tensorgrad threads (default: untouched)"
    )
    ap.add_argument("--detail", action="store_true", help="also print every product's time")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    if any(s not in SHAPES for s in shapes):
        ap.error(f"--shapes: choose from {', '.join(SHAPES)}")
    import tensorgrad  # noqa: F401 - its BLAS-wait and malloc tuning, before any timing

    if args.threads:
        from .common import set_threads

        set_threads(args.threads, torch_too=False)
    from tensorgrad.kernels.cpu_blas import blas_threads

    pool = blas_threads()  # the pool's size (None where it cannot be read)
    counts = [args.threads or pool] if args.threads or not pool or pool == 1 else [pool, 1]
    stamp, results = dt.datetime.now(), []
    for shape in shapes:
        print(f"{shape}: products at {counts} BLAS threads, then the step", file=sys.stderr)
        results.append(run_shape(shape, args.reps, MIN_REP_S, counts))
    text = report(results)
    print(text)
    for r in results if args.detail else ():
        print("\n" + detail(r))

    from .common import git_commit, worker_info
    from .machine import describe, summary

    machine = describe()
    print("\n" + summary(machine))
    try:
        worker = worker_info(torch_too=False)
    except ImportError as e:  # threadpoolctl (pip install -e ".[bench]")
        worker = {"numpy": np.__version__, "blas": None, "error": str(e)}
    meta = dict(machine=machine, worker=worker, date=stamp.isoformat(timespec="seconds"))
    meta.update(argv=sys.argv[1:], python=sys.version.split()[0], git_commit=git_commit())
    meta.update(threads=args.threads, blas_threads_tried=counts, loadavg=os.getloadavg())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"floor-{stamp:%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps({"meta": meta, "results": results, "markdown": text}, indent=1))
    print(f"\nWrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
