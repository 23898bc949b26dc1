"""nanoGPT's CPU recipe end to end, gpt-train against the same loop in PyTorch eager.

    python -m benchmarks.recipe [--max-iters 2000] [--threads N] [--no-torch]

The recipe (nanoGPT's README, "I only have a macbook"): a 4-layer, 4-head, 128-wide
character model, block 64, batch 12, 2000 iterations, lr 1e-3 -> 1e-4 with 100 warmup steps,
beta2 0.99, no dropout, evaluated every 250 steps on 20 batches. Unlike nanoGPT's run the
model has biases (gpt's GPT-2 layout) and the built-in corpus gives 86 character ids (its
shakespeare_char has 65). Both frameworks train on the built-in corpus joined into one file
and prepared once by gpt's data pipeline (so data preparation is timed by neither), draw the
same batches from the same samplers, and start from the same weights (PyTorch copies the
identically seeded tensorgrad model). tensorgrad runs as the real `gpt-train` command in its
own process, after a one-step warm-up run (so numba compilation is not timed); PyTorch runs
the same loop in another process (lr schedule, AdamW groups, gradient clipping, evaluation, a
torch.save of model and optimizer at every evaluation). Each runs as a library user gets
it (tensorgrad tunes glibc's malloc at import; PyTorch keeps glibc's defaults).

Reported per framework: the process's wall time and the steps alone (sum of per-step times:
batch, forward, loss.item(), backward, clipping, AdamW step), and the final val loss. The
processes' other work differs: gpt-train also writes fsync'd safetensors checkpoints (and the
best model again), a metrics line per step and loss.png at each evaluation; the PyTorch process
imports tensorgrad to build the initial weights. Results go to
benchmarks/results/recipe-<date>-<time>.json with the machine and versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import BLAS_ENV_VARS

ROOT = Path(__file__).resolve().parent.parent


def recipe_argv(data: str, out_dir: str, max_iters: int) -> list[str]:
    return [
        *("--data", data, "--n-layer", "4", "--n-head", "4", "--n-embd", "128"),
        *("--block-size", "64", "--batch-size", "12", "--max-iters", str(max_iters)),
        *("--lr", "1e-3", "--min-lr", "1e-4", "--warmup-iters", "100", "--beta2", "0.99"),
        *("--dropout", "0", "--eval-interval", "250", "--eval-iters", "20"),
        *("--out-dir", out_dir, "--no-sample", "--overwrite"),
    ]


def write_corpus(path: Path) -> None:
    from gpt.data import read_shakespeare

    path.write_text("\n".join(text for _, text in read_shakespeare()), encoding="utf-8")


KEEP_BLAS_ENV = [False]  # --keep-blas-env


def _thread_env(n: int) -> dict:
    env = dict(os.environ)  # (GPT_CACHE_DIR: the run's own data cache, set by main)
    if not KEEP_BLAS_ENV[0]:  # as benchmarks.run: no forced OpenBLAS core type (README)
        for k in BLAS_ENV_VARS:
            env.pop(k, None)
    env.update(OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_tensorgrad(argv: list[str], out_dir: Path, threads: int) -> dict:
    """gpt-train itself, in its own process; its metrics.jsonl gives the loop's timings."""
    from gpt.train import resolve_config

    cmd = [sys.executable, "-c", "import sys; from gpt.train import main; sys.exit(main())"]
    t = time.perf_counter()
    done = subprocess.run(
        [*cmd, *argv], env=_thread_env(threads), capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t
    if done.returncode:
        sys.exit(f"gpt-train failed ({done.returncode}):\n{done.stderr[-2000:]}")
    c = resolve_config(argv)[0]
    tokens = c.batch_size * c.block_size * c.grad_accum
    steps_s, val = 0.0, None
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "tokens_per_s" in r:
            steps_s += tokens / r["tokens_per_s"]  # gpt-train's per-step time
        if r.get("val_loss") is not None:
            val = r["val_loss"]
    return {"process_s": wall, "steps_s": steps_s, "val_loss": val}


def torch_worker(argv: list[str], threads: int) -> dict:
    """The same run in PyTorch eager: gpt's config, data, samplers and schedule."""
    import numpy as np
    import torch

    import tensorgrad as tg
    from gpt.data import BatchSampler
    from gpt.model import GPT
    from gpt.optim import cosine_lr
    from gpt.train import load_data, resolve_config
    from gpt.train.config import model_overrides

    from .common import set_threads
    from .torch_gpt import TorchGPT, load_tensorgrad_state

    set_threads(threads, torch_too=True)
    c, _, _ = resolve_config(argv)
    data_dir, meta, tok = load_data(c)
    from gpt.config import GPTConfig

    cfg = GPTConfig.from_preset(c.preset, vocab_size=tok.vocab_size, **model_overrides(c))
    tg.manual_seed(c.seed)  # as gpt-train: the same initial weights
    model = TorchGPT(cfg)
    load_tensorgrad_state(model, GPT(cfg))
    opt = model.configure_optimizers(c.weight_decay, c.lr, (c.beta1, c.beta2))
    T, B = cfg.block_size, c.batch_size
    train = BatchSampler(data_dir, "train", T, B, seed=c.seed)
    evals = {
        "train": BatchSampler(data_dir, "train", T, B, seed=c.seed + 2),
        "val": BatchSampler(data_dir, "val", T, B, seed=c.seed + 1),
    }
    out = Path(c.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def batch(s):
        x, y = s.next_batch()
        return torch.from_numpy(x), torch.from_numpy(y)

    @torch.no_grad()
    def estimate():
        model.eval()
        res = {k: float(np.mean([model(*batch(s))[1].item() for _ in range(c.eval_iters)]))
               for k, s in evals.items()}  # fmt: skip
        model.train()
        return res

    steps_s, val, losses = 0.0, None, []
    t0 = time.perf_counter()
    it = 0
    while True:
        if it % c.eval_interval == 0 or it == c.max_iters:
            val = estimate()["val"]
            if it > 0:
                torch.save(
                    {"model": model.state_dict(), "optim": opt.state_dict()}, out / "ckpt.pt"
                )
        if it >= c.max_iters:
            break
        ts = time.perf_counter()
        lr = cosine_lr(it, c.warmup_iters, c.lr_decay_iters or c.max_iters, c.lr, c.min_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        _, loss = model(*batch(train))
        losses.append(loss.item())
        loss.backward()
        if c.grad_clip > 0:  # 0 = off, as in gpt-train
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps_s += time.perf_counter() - ts
        it += 1
    return {
        "torch": torch.__version__,
        "loop_s": time.perf_counter() - t0,
        "steps_s": steps_s,
        "val_loss": val,
        "last_loss": losses[-1] if losses else math.nan,
    }


def run_torch(argv: list[str], threads: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.recipe",
                "--torch-worker",
                json.dumps(argv),
                f.name,
                "--threads",
                str(threads),
            ],  # fmt: skip
            env=_thread_env(threads),
            cwd=ROOT,
            check=True,
        )
        wall = time.perf_counter() - t
        res = json.loads(Path(f.name).read_text())
    return {"process_s": wall, **res}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument(
        "--keep-blas-env", action="store_true", help=f"keep {' and '.join(BLAS_ENV_VARS)}"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--torch-worker", nargs=2, metavar=("ARGV_JSON", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    KEEP_BLAS_ENV[0] = args.keep_blas_env
    if args.torch_worker:
        res = torch_worker(json.loads(args.torch_worker[0]), args.threads)
        Path(args.torch_worker[1]).write_text(json.dumps(res))
        return 0

    import numpy as np

    from gpt.train import load_data, resolve_config

    from . import machine
    from .common import git_commit

    with tempfile.TemporaryDirectory(prefix="tg-recipe-") as tmp:
        corpus = Path(tmp) / "shakespeare.txt"
        write_corpus(corpus)  # (from the usual cache, where the corpus was downloaded)
        os.environ["GPT_CACHE_DIR"] = str(Path(tmp) / "cache")  # prepared data: gone after
        tg_argv = recipe_argv(str(corpus), str(Path(tmp) / "tg"), args.max_iters)
        load_data(resolve_config(tg_argv)[0])  # prepared once, outside both timings
        warm = recipe_argv(str(corpus), str(Path(tmp) / "warm-up"), 1)
        run_tensorgrad([*warm, "--eval-iters", "1"], Path(tmp) / "warm-up", args.threads)
        results = {"tensorgrad": run_tensorgrad(tg_argv, Path(tmp) / "tg", args.threads)}
        if not args.no_torch:
            torch_argv = recipe_argv(str(corpus), str(Path(tmp) / "torch"), args.max_iters)
            results["torch"] = run_torch(torch_argv, args.threads)
    m = machine.describe()
    report = {
        "meta": {
            "machine": m,
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "threads": args.threads,
            "max_iters": args.max_iters,
            "blas_env_removed": {
                k: os.environ[k]
                for k in BLAS_ENV_VARS
                if k in os.environ and not args.keep_blas_env
            },
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "git_commit": git_commit(),
            "recipe": recipe_argv("<built-in corpus as one file>", "<tmp>", args.max_iters),
        },
        "results": results,
    }
    print(f"# nanoGPT's CPU recipe, {args.max_iters} iterations, {args.threads} threads")
    print(machine.summary(m))
    print("| | process s | steps s | val loss |\n|---|---|---|---|")
    for fw, r in results.items():
        print(f"| {fw} | {r['process_s']:.1f} | {r['steps_s']:.1f} | {r['val_loss']:.4f} |")
    if "torch" in results:
        a, b = results["tensorgrad"], results["torch"]
        print(
            f"tensorgrad / torch: steps {a['steps_s'] / b['steps_s']:.2f}, process "
            f"{a['process_s'] / b['process_s']:.2f}; val loss difference "
            f"{a['val_loss'] - b['val_loss']:+.4f}"
        )
        report["ratios"] = {
            "steps": a["steps_s"] / b["steps_s"],
            "process": a["process_s"] / b["process_s"],
            "val_loss_diff": a["val_loss"] - b["val_loss"],
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"recipe-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
