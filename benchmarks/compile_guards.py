"""What tensorgrad.compile's guards cost per call: the signature (with the module's part kept
while nothing it reads changed) and the check of the Python state the forward read, on
gpt/model.py's GPT compiled at gpt2-124M's depth and width (12 blocks) and at gpt-nano.

    python -m benchmarks.compile_guards            # prints a table and the machine
    python -m benchmarks.compile_guards --json out.json

Each figure is the median of 5 rounds of 2,000 calls of the guard code alone (no forward);
``walk`` is the module tree walked afresh (what every call paid before the signature was kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

SHAPES = {  # (n_layer, n_head, n_embd, vocab)
    "gpt2-124M": (12, 12, 768, 50304),
    "gpt-nano": (3, 3, 48, 64),
}


def per_call_us(fn, n: int = 2000, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def measure(shape: str) -> dict:
    import tensorgrad as tg
    from gpt.config import GPTConfig
    from gpt.model import GPT
    from tensorgrad.autograd.graph import is_grad_enabled
    from tensorgrad.compiler import compiled_forward
    from tensorgrad.compiler.guards import ModuleState, signature

    L, H, C, V = SHAPES[shape]
    model = GPT(GPTConfig(n_layer=L, n_head=H, n_embd=C, vocab_size=V, block_size=64))
    tg.compile(model)
    idx = tg.tensor(np.zeros((1, 8), dtype=np.int64))
    for _ in range(3):
        model(idx, idx)
    cf = compiled_forward(model)
    (variant,) = [v for vs in cf.entries.values() for v in vs if v.state == "ready"]
    args = (idx, idx)
    kept = per_call_us(
        lambda: cf.entries.get(signature(args, {}, model, is_grad_enabled(), cf.state)[0])
    )
    walk = per_call_us(lambda: signature(args, {}, model, is_grad_enabled(), ModuleState()), 200)
    state = per_call_us(variant.guards.changed)
    return {
        "shape": shape,
        "signature_us": round(kept, 2),
        "state_guards_us": round(state, 2),
        "guard_total_us": round(kept + state, 2),
        "state_items_each_call": len(variant.guards.items),
        "state_items_when_a_module_changed": len(variant.guards.settled),
        "walk_afresh_us": round(walk, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    from benchmarks.machine import describe, summary

    rows = [measure(s) for s in SHAPES]
    print(summary(describe()))
    print(
        f"{'shape':>10} {'signature':>10} {'state':>8} {'total':>8} {'items':>6} {'walk':>8}  (µs)"
    )
    for r in rows:
        print(
            f"{r['shape']:>10} {r['signature_us']:>10.2f} {r['state_guards_us']:>8.2f} "
            f"{r['guard_total_us']:>8.2f} {r['state_items_each_call']:>6} {r['walk_afresh_us']:>8.1f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": describe(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
