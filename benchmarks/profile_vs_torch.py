"""Where each framework's training step goes, side by side: python -m benchmarks.profile_vs_torch

    python -m benchmarks.profile_vs_torch [--shape baby] [--steps 5] [--threads N]

One process per framework (as benchmarks.run), the same model and weights, the same batch.
tensorgrad's step is timed per op with benchmarks.profile's wrappers around every Function's
forward and backward; PyTorch's with torch.profiler (each aten op's self CPU time). Both are
grouped into the same categories: the GEMMs of the Linear layers, attention (tensorgrad's
kernel, including its own batched matmuls; PyTorch's flash SDPA), GELU, LayerNorm,
cross-entropy, embedding, the AdamW step, and the rest (step time minus all of those: views,
copies, residual adds, the tape or autograd engine, Python). Also the unprofiled step time
(median of --steps steps), since profiling adds its own overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import SHAPES

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = (
    "fused GPT-2 blocks",
    "GEMMs (Linear)",
    "attention",
    "GELU",
    "LayerNorm",
    "cross-entropy",
    "embedding",
)
ADAMW, REST = "AdamW step", "rest (views, copies, adds, autograd, Python)"

# substrings of tensorgrad Function names / PyTorch aten op names, per category
_TG = {
    "fused GPT-2 blocks": ("GPT2Block",),  # everything inside a block, when its kernel runs
    "GEMMs (Linear)": ("Linear", "MatMul", "Matmul"),
    "attention": ("Attention",),
    "GELU": ("Gelu",),
    "LayerNorm": ("LayerNorm",),
    "cross-entropy": ("CrossEntropy", "LogSoftmax"),
    "embedding": ("Embedding",),
}
_TORCH = {
    "fused GPT-2 blocks": (),
    "GEMMs (Linear)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention": ("scaled_dot_product",),
    "GELU": ("gelu",),
    "LayerNorm": ("layer_norm",),
    "cross-entropy": ("log_softmax", "nll_loss", "cross_entropy"),
    "embedding": ("embedding", "index_select", "index_add"),
}


def category(name: str, table: dict) -> str | None:
    for cat, keys in table.items():
        if any(k in name for k in keys):
            return cat
    return None


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def worker(fw: str, shape: str, steps: int, threads: int) -> dict:
    from . import tasks
    from .common import gpt_config, set_threads

    set_threads(threads, torch_too=fw == tasks.TORCH)
    L, H, C, T, B, V = SHAPES[shape]
    model, opt, _ = tasks._build(fw, gpt_config(shape, T, T))
    x, y = tasks._batch(B, T, V)
    if fw == tasks.TORCH:
        import torch

        x, y = torch.from_numpy(x), torch.from_numpy(y)
    opt_s = []

    def step():
        _, loss = model(x, y)
        loss.backward()
        t = time.perf_counter()
        opt.step()
        opt_s.append(time.perf_counter() - t)
        opt.zero_grad()

    def timed(n):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            step()
            out.append(time.perf_counter() - t)
        return out

    timed(2)  # warm-up
    plain = _median(timed(steps))
    opt_s.clear()
    cats = dict.fromkeys(CATEGORIES, 0.0)
    if fw == tasks.TG:
        from .profile import OpProfiler

        prof = OpProfiler()
        prof.install()
        profiled = sum(timed(steps))
        prof.uninstall()
        for (name, _phase, _shapes), s in prof.time.items():
            cat = category(name, _TG)
            if cat:
                cats[cat] += s
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as p:
            profiled = sum(timed(steps))
        for ev in p.key_averages():
            cat = None if ev.key.startswith("Optimizer.") else category(ev.key, _TORCH)
            if cat:
                cats[cat] += ev.self_cpu_time_total / 1e6
    out = {k: v / steps for k, v in cats.items()}
    out[ADAMW] = sum(opt_s) / steps
    out[REST] = profiled / steps - sum(out.values())
    return {"step_s": plain, "profiled_step_s": profiled / steps, "categories": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="baby", choices=list(SHAPES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        res = worker(args.worker, args.shape, args.steps, args.threads)
        Path(args.out_json).write_text(json.dumps(res))
        return 0
    results = {}
    for fw in ("tensorgrad", "torch"):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.profile_vs_torch",
                    "--worker",
                    fw,
                    "--out-json",
                    f.name,
                    "--shape",
                    args.shape,
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                ],  # fmt: skip
                cwd=ROOT,
                env={**os.environ, "TG_MALLOC_TUNING": "1" if fw == "tensorgrad" else "0"},
                check=True,
            )
            results[fw] = json.loads(Path(f.name).read_text())
    a, b = results["tensorgrad"], results["torch"]
    L, H, C, T, B, V = SHAPES[args.shape]
    print(
        f"# {args.shape} (L={L}, H={H}, C={C}, B={B}, T={T}, V={V}), {args.threads} threads, "
        f"ms per step, {args.steps} profiled steps each"
    )
    print("| | tensorgrad | PyTorch | ratio |\n|---|---|---|---|")
    print(
        f"| step, unprofiled (median) | {a['step_s'] * 1e3:.1f} | {b['step_s'] * 1e3:.1f} | "
        f"{a['step_s'] / b['step_s']:.2f} |"
    )
    print(
        f"| step, profiled | {a['profiled_step_s'] * 1e3:.1f} | {b['profiled_step_s'] * 1e3:.1f}"
        f" | {a['profiled_step_s'] / b['profiled_step_s']:.2f} |"
    )
    for k in (*CATEGORIES, ADAMW, REST):
        x, y = a["categories"][k] * 1e3, b["categories"][k] * 1e3
        print(
            f"| {k} | {x:.1f} | {y:.1f} | {x / y:.2f} |"
            if y > 0
            else f"| {k} | {x:.1f} | {y:.1f} | - |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
