"""bfloat16 on the CPU: one GPT training step (forward, backward, AdamW) in float32 and under
``autocast("cpu", dtype=bfloat16)``, in tensorgrad and (where installed) PyTorch, each in
its own process; the median of ``--reps`` repetitions (docs/training.md, "bfloat16"). The
four processes take turns ``--rounds`` times and each keeps its median round: on a shared
machine one round can run at half speed.

    python -m benchmarks.bf16                      # char-small (gpt-train's model), B=12, T=64
    python -m benchmarks.bf16 --shape baby --reps 3 --rounds 1

Prints a Markdown table: step time, its ratio to the framework's float32 step, the step-0
loss and its distance from the float32 loss, the process's peak resident set (the framework
included), and how many cores other processes kept busy (the most in a kept repetition of
the kept round).
PyTorch's twin (torch_gpt.py) uses its fused attention, so its bfloat16 loss differs from
tensorgrad's a little more than the model as written would (tests/test_bfloat16.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .common import NOISY_CORES, SHAPES, cpu_model, gpt_config, measure, proc_status


def step_fn(framework: str, mode: str, shape: str):
    """(one training step, the step-0 loss) for a seeded GPT of ``shape``."""
    import numpy as np

    import tensorgrad as tg
    from gpt.model import GPT

    cfg = gpt_config(shape)
    B, T = SHAPES[shape][4], SHAPES[shape][3]
    rng = np.random.default_rng(0)
    idx, tgt = (rng.integers(0, cfg.vocab_size, (B, T)) for _ in range(2))
    tg.manual_seed(0)
    model = GPT(cfg)
    if framework == "torch":
        import torch

        from .torch_gpt import TorchGPT, load_tensorgrad_state

        lib, twin = torch, TorchGPT(cfg)
        load_tensorgrad_state(twin, model)
        model = twin
    else:
        lib = tg
    x, y = lib.tensor(idx), lib.tensor(tgt)
    opt = model.configure_optimizers(0.1, 1e-3)

    def step():
        with lib.autocast("cpu", dtype=lib.bfloat16, enabled=mode == "bf16"):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, step()


def worker(framework: str, mode: str, shape: str, reps: int) -> None:
    step, loss0 = step_fn(framework, mode, shape)
    r = measure(step, reps, warmup=2)
    r["peak_mb"] = proc_status()["VmHWM"]  # the process's peak: model, steps, the framework
    quiet = [t for t, c in zip(r["times_s"], r["others_cores"]) if c <= NOISY_CORES]
    r["kept_s"] = quiet if len(quiet) == r["reps_used"] else r["times_s"]
    print(json.dumps({"loss0": loss0, **r}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="char-small", choices=sorted(SHAPES))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker, a.shape, a.reps)
    try:
        import torch  # noqa: F401

        frameworks = ["tensorgrad", "torch"]
    except ImportError:
        frameworks = ["tensorgrad"]
    runs = {(fw, mode): [] for fw in frameworks for mode in ("fp32", "bf16")}
    for _ in range(a.rounds):
        for fw, mode in runs:
            cmd = [sys.executable, "-m", "benchmarks.bf16", "--shape", a.shape]
            cmd += ["--reps", str(a.reps), "--worker", fw, mode]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[fw, mode].append(json.loads(out))
    print(f"{cpu_model()}, shape {a.shape}, median of {a.reps} in the median of {a.rounds}\n")
    head = "| framework | mode | step | vs float32 | step-0 loss | vs float32 | peak memory |"
    print(head + " others' cores |\n" + "|---" * 8 + "|")
    for fw in frameworks:
        base = None
        for mode in ("fp32", "bf16"):
            rounds = sorted(runs[fw, mode], key=lambda r: r["median_s"])
            r = rounds[len(rounds) // 2]
            base = base or r
            busy = max(c for c, t in zip(r["others_cores"], r["times_s"]) if t in r["kept_s"])
            print(
                f"| {fw} | {mode} | {r['median_s'] * 1e3:.1f} ms | "
                f"{r['median_s'] / base['median_s']:.2f}x | {r['loss0']:.6f} | "
                f"{r['loss0'] - base['loss0']:+.1e} | {r['peak_mb']:.0f} MiB | up to {busy:.2f} |"
            )


if __name__ == "__main__":
    main()
