"""Small tensors, eager: makemore's MLP step and a 64-op elementwise chain, tensorgrad vs PyTorch.

    python -m benchmarks.small [--rounds 3] [--reps 15] [--blas-env both] [--same-process]

On arrays of a few thousand elements a step is dozens of ops whose arithmetic takes a
microsecond or two each, so what is measured is the per-op cost of the framework: the
dispatch, the tape node, the checks and the walk. Two cases, written once for both
frameworks (``lib`` is ``tensorgrad`` or ``torch``):

- **mlp**: the step of makemore's MLP (the "Zero to Hero" part 2/3 lectures): block_size 3,
  n_embd 10, hidden 200, batch 32, vocabulary 27. A minibatch drawn with ``randint``,
  ``emb = C[Xb]``, ``h = tanh(emb.view(-1, 30) @ W1 + b1)``, ``logits = h @ W2 + b2``,
  ``F.cross_entropy``, ``p.grad = None`` for each parameter, ``loss.backward()``, and the
  lecture's manual SGD update ``p.data += -lr * p.grad`` under ``no_grad``.
- **chain**: 64 elementwise ops (mul and sub by tensors, add / mul / div by scalars, tanh,
  exp, add of the input) on (32, 64) float32 tensors that require grad, ``.sum()``, then
  backward.

Each framework runs in its own fresh process, as a library user runs it: nothing is tuned
(no thread settings; tensorgrad's import-time defaults only; ``--threads n`` opts in to n
threads for both). The processes alternate over ``--rounds`` rounds (tensorgrad, torch,
tensorgrad, ...) so that a change in the machine's load hits both; a figure is the median
over rounds of each round's median ms per step (``benchmarks.common.measure``: repetitions
during which other processes were busy are retried). ``--same-process`` runs both in one
process instead, taking turns each repetition, and adds the median of the per-turn ratios
(steadier on a shared machine, whose load changes between processes).
``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` are removed from the children's environment as
``benchmarks.run`` does; ``--blas-env both`` also runs tensorgrad with them as given (a forced
Haswell core type doubles NumPy's time for these small GEMMs). Before timing, both frameworks compute the loss of a fixed batch from the same
weights; the report shows both. JSON (every round, machine description) goes to
``benchmarks/results/small-<date>-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import BLAS_ENV_VARS, NOISY_CORES, _cpu_jiffies, measure, others_cores

ROOT = Path(__file__).resolve().parent.parent
TG, TORCH = "tensorgrad", "torch"
CASES = ("mlp", "chain")
VOCAB, BLOCK, N_EMBD, HIDDEN, BATCH = 27, 3, 10, 200, 32
N_EXAMPLES = 2000  # the minibatches are drawn from this many (context, next character) pairs


def _lib(fw: str):
    """The framework module and its functional namespace."""
    if fw == TORCH:
        import torch
        import torch.nn.functional as F

        return torch, F
    import tensorgrad
    import tensorgrad.nn.functional as F

    return tensorgrad, F


# ----------------------------------------------------------------------------- the cases
def mlp_case(fw: str):
    """(step, check): one makemore MLP training step, and the loss of a fixed batch."""
    lib, F = _lib(fw)
    g = np.random.default_rng(42)
    X = lib.tensor(g.integers(0, VOCAB, (N_EXAMPLES, BLOCK)))  # int64 contexts
    Y = lib.tensor(g.integers(0, VOCAB, (N_EXAMPLES,)))
    fan_in = BLOCK * N_EMBD

    def param(shape, scale):
        return lib.tensor((g.standard_normal(shape) * scale).astype(np.float32))

    # part 3's initialisation: tanh neither saturated nor linear
    C = param((VOCAB, N_EMBD), 1.0)
    W1 = param((fan_in, HIDDEN), (5 / 3) / fan_in**0.5)
    b1 = param((HIDDEN,), 0.01)
    W2 = param((HIDDEN, VOCAB), 0.01)
    b2 = param((VOCAB,), 0.0)
    parameters = [C, W1, b1, W2, b2]
    for p in parameters:
        p.requires_grad = True
    lr = 0.1

    def forward(Xb, Yb):
        emb = C[Xb]  # (B, block, n_embd)
        h = lib.tanh(emb.view(-1, fan_in) @ W1 + b1)  # (B, hidden)
        logits = h @ W2 + b2  # (B, vocab)
        return F.cross_entropy(logits, Yb)

    def step():
        ix = lib.randint(0, X.shape[0], (BATCH,))
        loss = forward(X[ix], Y[ix])
        for p in parameters:
            p.grad = None
        loss.backward()
        with lib.no_grad():
            for p in parameters:
                p.data += -lr * p.grad

    def check() -> float:
        with lib.no_grad():
            return float(forward(X[:BATCH], Y[:BATCH]).item())

    return step, check


def chain_case(fw: str):
    """(step, check): 64 elementwise ops on (32, 64) float32 tensors, .sum(), backward."""
    lib, _ = _lib(fw)
    g = np.random.default_rng(0)
    x, a, b = (
        lib.tensor(g.standard_normal((32, 64)).astype(np.float32), requires_grad=True)
        for _ in range(3)
    )

    def forward():
        y = x
        for _ in range(8):  # 8 ops a round, 8 rounds
            y = y * a
            y = y + 0.5
            y = y.tanh()
            y = y - b
            y = y / 4.0  # in [-1.3, 1.3] for |b| < 4: exp stays small
            y = y.exp()
            y = y * 0.5
            y = y + x
        return y.sum()

    def step():
        loss = forward()
        for p in (x, a, b):
            p.grad = None
        loss.backward()

    def check() -> float:
        return float(forward().item())

    return step, check


CASE_FNS = {"mlp": mlp_case, "chain": chain_case}


def child(fw: str, reps: int, min_rep_s: float, threads: int | None) -> dict:
    """This process's measurements of every case with one framework, or with both taking
    turns (``fw == "both"``)."""
    fws = [TG, TORCH] if fw == "both" else [fw]
    if threads and TORCH in fws:  # opt-in only (--threads; BLAS reads it from the environment)
        import torch

        torch.set_num_threads(threads)
    out = {f: {} for f in fws}
    for name, case in CASE_FNS.items():
        steps = {}
        for f in fws:
            step, check = case(f)
            out[f][name] = {"check": check()}  # before any update: the same weights in both
            steps[f] = step
        if len(fws) == 1:
            out[fw][name].update(measure(steps[fw], reps, warmup=3, min_rep_s=min_rep_s))
        else:
            for f, m in taking_turns(steps, reps, min_rep_s).items():
                out[f][name].update(m)
    for f in fws:
        out[f]["versions"] = {"numpy": np.__version__}
        if f == TORCH:
            import torch

            out[f]["versions"]["torch"] = torch.__version__
            out[f]["torch_threads"] = torch.get_num_threads()
    return out


TURNS = 10  # turns per repetition: short ones pair the frameworks under the same load


def taking_turns(steps: dict, reps: int, min_rep_s: float) -> dict:
    """Seconds per step of each framework in one process, the frameworks taking ``TURNS``
    short turns each in every repetition, so that the machine's load changes alike for both.
    Per framework the fields of benchmarks.common.measure, over the quiet repetitions when
    at least half are (others busy below NOISY_CORES), else over all; plus each repetition's
    ratio to the last framework's (the reference) over the same turns."""
    inner = {}
    for f, step in steps.items():  # warm-up, and enough calls for ~min_rep_s a repetition
        for _ in range(3):
            step()
        t = time.perf_counter()
        step()
        per_call = max(time.perf_counter() - t, 1e-7)
        inner[f] = max(1, min(10_000, int(min_rep_s / TURNS / per_call)))
    runs = {f: [] for f in steps}  # (wall, cpu, others' cores) per repetition
    for _ in range(reps):
        gc.collect()
        wall, cpu = dict.fromkeys(steps, 0.0), dict.fromkeys(steps, 0.0)
        j0, t0 = _cpu_jiffies(), time.perf_counter()
        for _ in range(TURNS):
            for f, step in steps.items():
                c, t = time.process_time(), time.perf_counter()
                for _ in range(inner[f]):
                    step()
                wall[f] += time.perf_counter() - t
                cpu[f] += time.process_time() - c
        others = others_cores(j0, _cpu_jiffies(), time.perf_counter() - t0)
        for f in steps:
            n = TURNS * inner[f]
            runs[f].append((wall[f] / n, cpu[f] / n, others))
    quiet = [i for i, r in enumerate(next(iter(runs.values()))) if r[2] <= NOISY_CORES]
    used = quiet if len(quiet) >= max(1, (reps + 1) // 2) else range(reps)
    last = list(steps)[-1]
    out = {}
    for f, rs in runs.items():
        u = [rs[i] for i in used]
        out[f] = {
            "median_s": statistics.median(r[0] for r in u),
            "min_s": min(r[0] for r in u),
            "cpu_s": statistics.median(r[1] for r in u),
            "times_s": [r[0] for r in rs],
            "others_cores": [round(r[2], 2) for r in rs],
            "reps_used": len(u),
            "reps_noisy": reps - len(quiet),
            "inner": inner[f],
            "ratio_to_last": [rs[i][0] / runs[last][i][0] for i in used],
        }
    return out


# ----------------------------------------------------------------------------- the run
def _spawn(fw: str, args, env: dict) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.small", "--child", fw]
        + ["--reps", str(args.reps), "--min-rep-s", str(args.min_rep_s)]
        + (["--threads", str(args.threads)] if args.threads else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if p.returncode != 0:
        raise RuntimeError(f"{fw} child failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _have_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def summarize(rounds: dict) -> dict:
    """Per label and case: the median over rounds of the wall and CPU seconds per step,
    whether a round's median had to include repetitions during which others were busy, and
    (frameworks taking turns in one process) the median of the per-turn ratios to torch."""
    out = {}
    for label, rs in rounds.items():
        out[label] = {}
        for c in CASES:
            ms = [r[c] for r in rs]
            paired = [x for m in ms for x in m.get("ratio_to_last", ())]
            out[label][c] = {
                "wall_s": statistics.median(m["median_s"] for m in ms),
                "cpu_s": statistics.median(m["cpu_s"] for m in ms),
                "noisy": any(m["reps_noisy"] and m["reps_used"] == len(m["times_s"]) for m in ms),
                "paired_ratio": statistics.median(paired) if paired else None,
            }
    return out


def report(summary: dict, rounds: dict, args, removed: dict, machine: dict, stamp) -> str:
    from .machine import summary as machine_summary

    tuned = f"{args.threads} threads for both (--threads)" if args.threads else "untuned"
    how = (
        "both frameworks in one process, taking turns each repetition"
        if args.same_process
        else "each framework in its own process"
    )
    lines = [
        f"# Small tensors, eager: tensorgrad vs PyTorch ({stamp:%Y-%m-%d %H:%M})\n",
        machine_summary(machine),
        f"\nPython {sys.version.split()[0]}, NumPy {np.__version__}; {how}, {tuned}; "
        f"{args.rounds} round(s) of {args.reps} repetitions; ms per step (wall, and this "
        "process's CPU time: all its threads), the median over rounds of each round's median; "
        "`*`: a round's median includes repetitions during which other processes kept more "
        "than 0.25 cores busy"
        + (
            "; paired: the median over repetitions of tensorgrad/torch in the same turn"
            if args.same_process
            else ""
        )
        + ". Removed from the children's environment: "
        f"{', '.join(f'{k}={v}' for k, v in removed.items()) or 'nothing (none set)'}"
        + (" (except the 'as given' row)" if args.blas_env == "both" and removed else "")
        + ".\n",
        "| case | framework | wall ms | CPU ms | tg/torch wall | tg/torch CPU | paired | check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in CASES:
        ref = summary.get(TORCH, {}).get(c)
        for label, fw_rounds in rounds.items():
            m = summary[label][c]
            ratios = ["-", "-"]
            if ref and label != TORCH:
                ratios = [f"{m[k] / ref[k]:.2f}" for k in ("wall_s", "cpu_s")]
            paired = (
                "-" if m["paired_ratio"] is None or label == TORCH else f"{m['paired_ratio']:.2f}"
            )
            lines.append(
                f"| {c} | {label} | {m['wall_s'] * 1e3:.3f}{'*' if m['noisy'] else ''} | "
                f"{m['cpu_s'] * 1e3:.3f} | {ratios[0]} | {ratios[1]} | {paired} | "
                f"{fw_rounds[0][c]['check']:.6g} |"
            )
    lines.append(
        "\nmlp: makemore's MLP step (block 3, n_embd 10, hidden 200, batch 32, vocab 27, "
        "cross_entropy, manual SGD under no_grad). chain: 64 elementwise ops on (32, 64) "
        "float32, sum, backward. check: the loss of a fixed batch (mlp) and the chain's sum, "
        "from the same weights in both frameworks."
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.small", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating processes per framework")
    ap.add_argument("--reps", type=int, default=15, help="repetitions per case and process")
    ap.add_argument("--min-rep-s", type=float, default=0.2, help="seconds per repetition")
    ap.add_argument(
        "--blas-env",
        choices=("removed", "given", "both"),
        default="removed",
        help=f"{' and '.join(BLAS_ENV_VARS)} for the children: removed (as benchmarks.run), "
        "as given, or both (tensorgrad twice)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="opt-in: BLAS, OpenMP and torch threads (default: untouched, as a user runs)",
    )
    ap.add_argument(
        "--same-process",
        action="store_true",
        help="run both frameworks in one process, taking turns each repetition (steadier "
        "ratios on a busy machine; the two libraries' thread pools share the process)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--child", choices=(TG, TORCH, "both"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.reps, args.min_rep_s, args.threads)))
        return 0

    given = dict(os.environ)
    given["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), given.get("PYTHONPATH")]))
    removed = {k: given[k] for k in BLAS_ENV_VARS if k in given}
    stripped = {k: v for k, v in given.items() if k not in BLAS_ENV_VARS}
    env = given if args.blas_env == "given" else stripped
    torch_too = _have_torch()
    runs = []  # ({framework: label}, child argument, environment)
    if args.same_process and torch_too:
        runs.append(({TG: TG, TORCH: TORCH}, "both", env))
    else:
        runs.append(({TG: TG}, TG, env))
    if args.blas_env == "both" and removed:
        runs.append(({TG: f"{TG} (BLAS env as given)"}, TG, given))
    if torch_too and not args.same_process:
        runs.append(({TORCH: TORCH}, TORCH, env))
    if args.threads:  # read by OpenBLAS, OpenMP and MKL when they start
        n = str(args.threads)
        pools = {"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        runs = [(labels, fw, {**e, **pools}) for labels, fw, e in runs]
    rounds = {label: [] for labels, _, _ in runs for label in labels.values()}
    for r in range(args.rounds):
        for labels, fw, e in runs:
            print(f"round {r + 1}/{args.rounds}: {fw}", file=sys.stderr, flush=True)
            res = _spawn(fw, args, e)
            for f, label in labels.items():
                rounds[label].append(res[f])

    from .common import git_commit
    from .machine import describe

    summary, machine, stamp = summarize(rounds), describe(), dt.datetime.now()
    if args.blas_env == "given":
        removed = {}
    text = report(summary, rounds, args, removed, machine, stamp)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"small-{stamp:%Y%m%d-%H%M%S}.json"
    meta = {
        "machine": machine,
        "date": stamp.isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "python": sys.version.split()[0],
        "git_commit": git_commit(),
        "blas_env_removed": removed,
        "threads": args.threads,
        "same_process": args.same_process,
        "loadavg": os.getloadavg(),
    }
    report_json = {"meta": meta, "summary": summary, "rounds": rounds, "markdown": text}
    path.write_text(json.dumps(report_json, indent=1))
    print(f"\nWrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
