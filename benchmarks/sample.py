"""What a sampled token costs once the context is longer than block_size.

With learned absolute positions, each token past the block runs the model on the whole
window of the last block_size tokens (nanoGPT's sample loop does the same): the positions of
every token in it shift by one, so no cached key or value can be reused. Each way below runs
in its own process (one framework's thread pool at a time, default threads, as a library
user runs it), on the same weights (the preset at random init, seed 0), batch 1, greedy; the
figure is the median time per token over ``--tokens`` tokens past the block, after warm-up.

- ``tensorgrad compiled``: ``model.generate_stream`` on a ``tg.compile``d model, as gpt-sample
  runs it (the window, of one shape, replays compiled);
- ``tensorgrad eager``: the same, not compiled (a library user's ``model.generate``);
- ``tensorgrad before``: what gpt/model.py did before 2026-12-07, each token a forward of
  the window that refilled a fresh KV cache, eagerly;
- ``torch eager``: nanoGPT's loop in PyTorch (crop to block_size, forward, last logits), the
  model of benchmarks/torch_gpt.py with tensorgrad's weights (skipped without torch).

    python -m benchmarks.sample [--shape char-small] [--tokens 64]

Writes benchmarks/results/sample-<date>.json with the machine (CPU, SIMD flags, both GEMM
peaks). ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE``, when set, are measured kept and removed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("tensorgrad compiled", "tensorgrad eager", "tensorgrad before", "torch eager")


def tg_model(shape: str):
    import tensorgrad as tg
    from gpt.config import GPTConfig
    from gpt.model import GPT

    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset(shape, vocab_size=65))


def worker(way: str, shape: str, tokens: int) -> dict:
    """Per-token seconds past the block for one way (run in a fresh process)."""
    import tensorgrad as tg

    model = tg_model(shape)
    bs = model.config.block_size
    prompt = np.random.default_rng(1).integers(0, 65, (1, bs), dtype=np.int64)  # a full block
    if way == "torch eager":
        import torch

        from benchmarks.torch_gpt import TorchGPT, load_tensorgrad_state

        tm = TorchGPT(model.config)
        load_tensorgrad_state(tm, model)
        tm.eval()
        stream = tm.generate_stream(torch.from_numpy(prompt), tokens + 4, use_cache=False)
    elif way == "tensorgrad before":
        from gpt.model import KVCache

        model.eval()

        def refill():
            ctx = prompt
            for _ in range(tokens + 4):
                cache = KVCache(model.config, 1, np, np.float32)
                with tg.no_grad():
                    logits, _ = model(ctx[:, -bs:], cache=cache)
                nxt = logits.numpy()[:, -1].argmax(-1)
                ctx = np.concatenate([ctx, nxt[:, None]], axis=1)
                yield nxt

        stream = refill()
    else:
        from gpt.sample import quiet_cache_steps

        if way == "tensorgrad compiled":
            tg.compile(model)  # as gpt-sample does
        stream = quiet_cache_steps(model.generate_stream)(prompt, tokens + 4, temperature=0.0)
    times, t0 = [], time.perf_counter()
    for i, _ in enumerate(stream):
        t1 = time.perf_counter()
        if i >= 4:  # after warm-up (the compiled model traces on its second call)
            times.append(t1 - t0)
        t0 = t1
    return {"way": way, "per_token_s": float(np.median(times)), "tokens": len(times)}


def run_way(way: str, shape: str, tokens: int, env: dict) -> dict | None:
    code = (
        "import json, sys; from benchmarks.sample import worker; "
        f"print(json.dumps(worker({way!r}, {shape!r}, {tokens})))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if p.returncode != 0:
        if "No module named 'torch'" in p.stderr:
            return None
        raise RuntimeError(f"{way}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from benchmarks import machine
    from benchmarks.common import BLAS_ENV_VARS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="char-small", help="a gpt preset (default char-small)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens past the block, per way")
    args = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    envs = {"as set": env}
    if any(k in env for k in BLAS_ENV_VARS):
        envs["BLAS variables removed"] = {k: v for k, v in env.items() if k not in BLAS_ENV_VARS}
    d = machine.describe()
    d["gemm"] = machine.measured_peaks()
    print(machine.summary(d))
    for fw, r in d["gemm"].items():
        if r is not None:
            print(f"{fw} float32 GEMM peak: {r['peak_gflops']:.0f} GFLOP/s")
    results = {}
    for name, e in envs.items():
        rows = [r for r in (run_way(w, args.shape, args.tokens, e) for w in WAYS) if r]
        base = next(r["per_token_s"] for r in rows if r["way"] == "tensorgrad compiled")
        print(f"\n{args.shape}, one token past block_size ({name}):")
        for r in rows:
            r["vs_compiled"] = r["per_token_s"] / base
            print(
                f"  {r['way']:<20} {r['per_token_s'] * 1e3:7.2f} ms/token "
                f"{1 / r['per_token_s']:7.1f} tokens/s  ({r['vs_compiled']:.2f}x compiled's time)"
            )
        results[name] = rows
    out = ROOT / "benchmarks" / "results" / f"sample-{datetime.date.today():%Y%m%d}.json"
    load = os.getloadavg()  # (the machine's load over the last minute, 5 and 15)
    print(f"load average during the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    report = {"machine": d, "shape": args.shape, "load_average": load, "results": results}
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
