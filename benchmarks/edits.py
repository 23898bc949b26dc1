"""Edited GPTs through gpt-train's default path (compiled), against the stock one.

    python -m benchmarks.edits [--shapes char-small,baby] [--reps 7]

A learner's edits to gpt/model.py (ReLU or SiLU in the MLP, RMSNorm for LayerNorm, GPT-J's
parallel attention + MLP block) trace other ops than the stock block, so compile does not
emit the fused block kernel for them: they run as written, each op with its own kernel,
replayed without per-op Python. This prints each edited step's time over the compiled stock
step's (issue 33's target: <= 1.15), and the stock step eager (--no-compile) for scale. The
edits are made at class level, as editing model.py does, for each step of that model only.
All models are built in this process and take their steps in turn, one each per round
(sequential runs drifted 20-40% apart on a shared 2-core machine); a figure is the median
of --reps steps after the two traced ones.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from .common import SHAPES, gpt_config
from .machine import describe, summary


def _edits():
    import tensorgrad as tg
    import tensorgrad.nn.functional as F
    from gpt import model as gm
    from tensorgrad import nn

    class RMSNorm(nn.Module):
        def __init__(self, C, eps=1e-5, bias=True):
            super().__init__()
            self.weight, self.eps = nn.Parameter(tg.ones(C)), eps

        def forward(self, x):
            return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight

    def relu(self, x):
        return self.dropout(self.c_proj(F.relu(self.c_fc(x))))

    def silu(self, x):
        return self.dropout(self.c_proj(F.silu(self.c_fc(x))))

    def parallel(self, x, mask=None, cache=None, layer=0):
        h = self.ln_1(x)
        return x + self.attn(h, mask, cache, layer) + self.mlp(h)

    return {
        "stock": [],
        "relu": [(gm.MLP, "forward", relu)],
        "silu": [(gm.MLP, "forward", silu)],
        "rmsnorm": [(gm.nn, "LayerNorm", RMSNorm)],
        "parallel": [(gm.Block, "forward", parallel)],
    }


def _patched(patches: list, fn):
    """fn() with the class-level patches made, and undone after."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        return fn()
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def steps_ms(shape: str, configs: dict, reps: int) -> dict:
    """{name: median ms per training step} for configs {name: (patches, compiled)}: every
    model built first, then their steps taken in turn, one each per round, so that a change
    in the machine's load reaches all of them alike (the first two steps of each trace)."""
    import tensorgrad as tg
    from gpt import model as gm

    L, H, C, T, B, V = SHAPES[shape]
    g = np.random.default_rng(0)
    x, y = g.integers(0, V, (B, T)), g.integers(0, V, (B, T))
    runs = {}
    for name, (patches, compiled) in configs.items():

        def build(compiled=compiled):
            tg.manual_seed(0)
            model = gm.GPT(gpt_config(shape, T, T))
            if compiled:
                tg.compile(model)
            return model, model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))

        runs[name] = _patched(patches, build)

    def step(name):
        model, opt = runs[name]

        def run():
            t0 = time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return time.perf_counter() - t0

        return _patched(configs[name][0], run)

    times = {name: [] for name in configs}
    for r in range(reps + 2):
        for name in configs:
            t = step(name)
            if r >= 2:
                times[name].append(t)
    return {name: float(np.median(ts)) * 1e3 for name, ts in times.items()}


def step_ms(shape: str, patches: list, compiled: bool, reps: int) -> float:
    """One configuration's median ms per step (steps_ms with it alone)."""
    return steps_ms(shape, {"one": (patches, compiled)}, reps)["one"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="char-small,baby")
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    edits, rows = _edits(), []
    print(summary(describe()))
    print("| shape | model | ms/step | / compiled stock |")
    print("|---|---|---|---|")
    for shape in a.shapes.split(","):
        # (model, compiled) -> its class-level patches
        configs = {(n, True): p for n, p in edits.items()} | {("stock", False): []}
        ms = steps_ms(shape, {k: (p, k[1]) for k, p in configs.items()}, a.reps)
        stock = ms[("stock", True)]
        for (name, compiled), t in ms.items():
            label = f"{name}, {'compiled' if compiled else '--no-compile'}"
            print(f"| {shape} | {label} | {t:.1f} | {t / stock:.2f} |")
            rows.append(dict(shape=shape, model=name, compiled=compiled, ms=t, ratio=t / stock))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": describe(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
