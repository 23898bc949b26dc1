"""Where a tensorgrad training step spends its time: python -m benchmarks.profile [--shape S].

Wraps every Op subclass's forward and backward (in this process only; tensorgrad's
files are untouched) and reports, per op and input shapes: calls per step, milliseconds per
step, the bytes it keeps for backward, and whether any float64 array appears. Also times the
tape walk's own work (gradient accumulation), the AdamW step, and optionally prints cProfile's
top functions by cumulative time. Runs with the same BLAS environment as benchmarks.run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

from .common import BLAS_ENV_VARS, SHAPES


def _subclasses(cls):
    for c in cls.__subclasses__():
        yield c
        yield from _subclasses(c)


def _nbytes(v) -> int:
    if hasattr(v, "nbytes") and hasattr(v, "dtype"):
        return int(v.nbytes)
    if isinstance(v, (tuple, list)):
        return sum(_nbytes(x) for x in v)
    return 0


def _arrays(v):
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        yield v
    elif isinstance(v, (tuple, list)):
        for x in v:
            yield from _arrays(x)


class OpProfiler:
    """Per-(op, phase, shapes) call counts, seconds, saved bytes and float64 sightings."""

    def __init__(self):
        self.time = defaultdict(float)
        self.calls = defaultdict(int)
        self.saved = defaultdict(int)
        self.f64 = defaultdict(int)
        self.patched = []
        self.depth = 0
        self.exclude = set()  # ids of parameter arrays: saving a weight costs no memory
        self.seen = set()  # arrays already counted this step

    def install(self):
        import importlib

        from tensorgrad import autograd
        from tensorgrad.autograd import engine

        importlib.import_module("tensorgrad.nn.functional")  # defines the fused Ops
        for cls in {c for c in _subclasses(autograd.Op)}:
            if cls.holds_graph:  # a compiled forward's Replay: its steps are the ops, timed
                continue  # each (timed as one, the Replay hid every op inside it)
            for phase in ("forward", "backward"):
                if phase in cls.__dict__:
                    orig = cls.__dict__[phase]
                    setattr(cls, phase, self._wrap(cls.__name__, phase, orig))
                    self.patched.append((cls, phase, orig))
        orig_acc = engine._accumulate

        def acc(a, b):
            t = time.perf_counter()
            r = orig_acc(a, b)
            key = ("(tape) gradient accumulation a+b", "backward", _shape_key([b]))
            self.time[key] += time.perf_counter() - t
            self.calls[key] += 1
            return r

        engine._accumulate = acc
        self.patched.append((engine, "_accumulate", orig_acc))
        orig_leaf = engine.accumulate_grad  # the per-leaf step the engine hands the walk

        def leaf(handed, t, g):
            first = t.grad is None
            s = time.perf_counter()
            orig_leaf(handed, t, g)
            key = (
                "(tape) leaf .grad " + ("store" if first else "accumulate"),
                "backward",
                _shape_key([g]),
            )
            self.time[key] += time.perf_counter() - s
            self.calls[key] += 1

        engine.accumulate_grad = leaf
        self.patched.append((engine, "accumulate_grad", orig_leaf))

    def uninstall(self):
        for obj, name, orig in reversed(self.patched):
            setattr(obj, name, orig)

    def _wrap(self, name, phase, fn):
        prof = self

        def wrapped(self_, *args, **kw):
            if prof.depth:  # a forward calling its parent class's forward: count once
                return fn(self_, *args, **kw)
            prof.depth += 1
            t = time.perf_counter()
            try:
                out = fn(self_, *args, **kw)
            finally:
                prof.depth -= 1
            dt = time.perf_counter() - t
            key = (type(self_).__name__, phase, _shape_key(args))
            prof.time[key] += dt
            prof.calls[key] += 1
            outs = out if isinstance(out, tuple) else (out,)
            if any(a.dtype == "float64" for a in _arrays(outs)) or any(
                a.dtype == "float64" for a in _arrays(args)
            ):
                prof.f64[key] += 1
            if phase == "forward":
                for v in vars(self_).values():
                    for a in _arrays(v):
                        while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
                            a = a.base  # count the memory a view keeps alive, once
                        if id(a) not in prof.exclude and id(a) not in prof.seen:
                            prof.seen.add(id(a))
                            prof.saved[key] += int(a.nbytes)
            return out

        return wrapped

    def reset(self):
        for d in (self.time, self.calls, self.saved, self.f64):
            d.clear()
        self.seen.clear()


def _shape_key(args) -> str:
    parts = []
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            parts.append(
                "x".join(map(str, a.shape)) + ("" if a.dtype == "float32" else f":{a.dtype}")
            )
    return " ".join(parts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.profile", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--shape", default="gpt2-124M", choices=list(SHAPES))
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 2 warm-up steps)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--cprofile", action="store_true", help="also print cProfile's top functions")
    ap.add_argument("--keep-blas-env", action="store_true")
    args = ap.parse_args(argv)
    if not args.keep_blas_env and any(k in os.environ for k in BLAS_ENV_VARS):
        env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV_VARS}
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.profile", *sys.argv[1:]], env)

    os.environ["TG_NUM_THREADS"] = str(args.threads)  # tensorgrad's elementwise pool
    import numpy as np

    from . import tasks
    from .common import blas_info, gpt_config, peak_growth, set_threads

    set_threads(args.threads, torch_too=False)
    L, H, C, T, B, V = SHAPES[args.shape]
    model, opt, _ = tasks._build(tasks.TG, gpt_config(args.shape, T, T))
    x, y = tasks._batch(B, T, V)
    phase_t = defaultdict(list)

    def step():
        t0 = time.perf_counter()
        _, loss = model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        opt.zero_grad()
        phase_t["forward"].append(t1 - t0)
        phase_t["backward (whole tape walk)"].append(t2 - t1)
        phase_t["AdamW step"].append(t3 - t2)
        phase_t["total"].append(time.perf_counter() - t0)

    step()
    step()
    phase_t.clear()
    prof = OpProfiler()
    prof.exclude = {id(p.array) for p in model.parameters()}
    prof.install()
    for _ in range(args.steps):
        prof.seen.clear()
        step()
    prof.seen.clear()
    mem = peak_growth(step)  # one more step, for the memory figures (also profiled)
    prof.uninstall()
    n = args.steps + 1
    blas = ", ".join(f"{b['internal_api']} {b['architecture']}" for b in blas_info())
    print(
        f"# tensorgrad step profile: {args.shape} (L={L}, H={H}, C={C}, B={B}, T={T}, V={V}),"
        f" {args.threads} threads, BLAS {blas}, {n} steps\n"
    )
    tot = np.median(phase_t["total"])
    print("| phase | ms/step (median) |\n|---|---|")
    for k, v in phase_t.items():
        print(f"| {k} | {np.median(v) * 1e3:.1f} |")
    op_total = sum(prof.time.values()) / n
    print(
        f"\nTime inside op forward/backward + accumulation: {op_total * 1e3:.0f} ms/step of "
        f"{tot * 1e3:.0f} (the rest: Python glue, tape bookkeeping, AdamW).\n"
    )
    rows = sorted(prof.time, key=prof.time.get, reverse=True)
    print("| op | phase | input shapes | calls/step | ms/step | % step | saved for bwd MB/step |")
    print("|---|---|---|---|---|---|---|")
    for k in rows[: args.top]:
        print(
            f"| {k[0]} | {k[1]} | {k[2]} | {prof.calls[k] / n:.0f} | {prof.time[k] / n * 1e3:.1f} "
            f"| {100 * prof.time[k] / n / tot:.1f} | "
            f"{prof.saved[k] / n / 2**20:.1f} |"
            if prof.saved[k]
            else f"| {k[0]} | {k[1]} | {k[2]} | {prof.calls[k] / n:.0f} | {prof.time[k] / n * 1e3:.1f} "
            f"| {100 * prof.time[k] / n / tot:.1f} | |"
        )
    by_op = defaultdict(float)
    for k, v in prof.time.items():
        by_op[(k[0], k[1])] += v
    print("\n| op | phase | ms/step (all shapes) |\n|---|---|---|")
    for k in sorted(by_op, key=by_op.get, reverse=True)[: args.top]:
        print(f"| {k[0]} | {k[1]} | {by_op[k] / n * 1e3:.1f} |")
    saved = defaultdict(int)
    for k, v in prof.saved.items():
        saved[k[0]] += v
    total_saved = sum(saved.values()) / n
    print(
        f"\nArrays kept alive for backward (parameters excluded, each array and the base of "
        f"each view counted once, under the first op that saved it): {total_saved / 2**20:.0f} "
        "MB per step; by op:"
    )
    print("\n| op | MB/step |\n|---|---|")
    for k in sorted(saved, key=saved.get, reverse=True)[:12]:
        print(f"| {k} | {saved[k] / n / 2**20:.1f} |")
    print(
        f"\nResident set: peak growth over one step {mem['peak_growth_mb']:.0f} MB "
        f"(RSS before {mem['rss_before_mb']:.0f} MB; params+grads+moments included there)."
    )
    f64 = {k: v for k, v in prof.f64.items()}
    print(
        "\nfloat64 arrays: "
        + (
            "none seen"
            if not f64
            else "; ".join(f"{k[0]}.{k[1]} {k[2]} ({v // n}/step)" for k, v in f64.items())
        )
    )
    if args.cprofile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        step()
        pr.disable()
        print("\ncProfile, one step, top functions by cumulative time:\n```")
        pstats.Stats(pr, stream=sys.stdout).sort_stats("cumulative").print_stats(args.top)
        print("```\ncProfile, top functions by own time:\n```")
        pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)
        print("```")


if __name__ == "__main__":
    main()
