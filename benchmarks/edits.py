"""Edited GPTs through gpt-train's default path (compiled), against the stock one.

    python -m benchmarks.edits [--shapes char-small,baby] [--reps 7]

A learner's edits to gpt/model.py (ReLU or SiLU in the MLP, RMSNorm for LayerNorm, GPT-J's
parallel attention + MLP block) trace other ops than the stock block, so compile does not
emit the fused block kernel for them: they run as written, each op with its own kernel,
replayed without per-op Python. This prints each edited step's time over the compiled stock
step's (issue 33's target: <= 1.15), and the stock step eager (--no-compile) for scale. The
edits are made at class level, as editing model.py does; each configuration runs in this
process one after another, a median of --reps steps after the two traced ones.
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


def step_ms(shape: str, patches: list, compiled: bool, reps: int) -> float:
    import tensorgrad as tg
    from gpt import model as gm

    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        L, H, C, T, B, V = SHAPES[shape]
        tg.manual_seed(0)
        model = gm.GPT(gpt_config(shape, T, T))
        if compiled:
            tg.compile(model)
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
        g = np.random.default_rng(0)
        x, y = g.integers(0, V, (B, T)), g.integers(0, V, (B, T))
        times = []
        for _ in range(reps + 2):  # the first two steps trace
            t0 = time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        return float(np.median(times[2:])) * 1e3
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="char-small,baby")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    edits, rows = _edits(), []
    print(summary(describe()))
    print("| shape | model | ms/step | / compiled stock |")
    print("|---|---|---|---|")
    for shape in a.shapes.split(","):
        stock = step_ms(shape, [], True, a.reps)
        eager = step_ms(shape, [], False, a.reps)
        print(f"| {shape} | stock, compiled | {stock:.1f} | 1.00 |")
        print(f"| {shape} | stock, --no-compile | {eager:.1f} | {eager / stock:.2f} |")
        rows += [dict(shape=shape, model="stock", compiled=True, ms=stock)]
        rows += [dict(shape=shape, model="stock", compiled=False, ms=eager)]
        for name, patches in edits.items():
            if name == "stock":
                continue
            ms = step_ms(shape, patches, True, a.reps)
            print(f"| {shape} | {name}, compiled | {ms:.1f} | {ms / stock:.2f} |")
            rows.append(dict(shape=shape, model=name, compiled=True, ms=ms, ratio=ms / stock))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": describe(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
