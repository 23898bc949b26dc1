"""tensorgrad against PyTorch eager, side by side: python -m benchmarks.run [--quick] [--only ...].

Every measurement runs in a fresh worker process (benchmarks.worker), one framework at a
time, with the same number of threads for NumPy's BLAS and torch. Prints Markdown tables,
writes benchmarks/results/bench-<date>-<time>.json and PNG plots next to it. Without torch
the tensorgrad columns still print and the ratio columns show '-'.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import BLAS_ENV_VARS, SHAPES, blas_info, cpu_model, git_commit

TG, TORCH = "tensorgrad", "torch"
ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("train", "ops", "memory", "scaling", "generate")
# glibc keeps freed arrays up to 32 MiB in its heap and up to 1 GiB of free heap: the settings
# tensorgrad applies at import (tune_cpu_malloc; TG_MALLOC_TUNING=0 turns it off)
MALLOC_TUNED = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}
MALLOC_SUFFIX = "+malloc"  # the other malloc setting than the framework's default
FLOPS_FORMULA = (
    "6·N + 12·L·H·Q·T per token (N non-embedding params, L layers, H heads, Q head size)"
)


def plan(args) -> dict:
    """What to measure: the full run, or --quick (fewer lengths, repetitions and tokens)."""
    if args.quick:
        return dict(
            reps=args.reps or 2,
            op_reps=args.reps or 2,
            min_rep_s=0.02,
            malloc_variant=False,
            gemm_sizes=[2048],
            scale_Ts=[64, 256],
            gen_contexts=[64, 256],
            n_new=4,
            gen_rounds=1,
        )
    return dict(
        reps=args.reps or 5,
        op_reps=args.reps or 5,
        min_rep_s=0.1,
        malloc_variant=True,
        gemm_sizes=[2048, 4096],
        scale_Ts=[64, 128, 256, 512, 1024],
        gen_contexts=[64, 128, 256, 512],
        n_new=8,
        gen_rounds=2,
    )


def median_round(results: list):
    """Of one framework's rounds (worker processes taking turns with the other's), the one
    with the median time, holding every round's median as ``rounds_s``; None if all failed."""
    ok = sorted((r for r in results if r), key=lambda r: r["median_s"])
    if not ok:
        return None
    return dict(ok[(len(ok) - 1) // 2], rounds_s=[r and r["median_s"] for r in results])


# ----------------------------------------------------------------------------- workers
class Runner:
    """Starts one worker process per measurement and keeps its result (or its error)."""

    def __init__(self, args, env: dict):
        self.args, self.env, self.errors, self.infos = args, env, [], {}
        self.t0 = time.perf_counter()
        self.wait_left = float(args.wait_budget)
        self.waits = []  # (label, seconds waited, other processes' cores when starting)

    def wait_quiet(self, label: str) -> None:
        """Hold the next worker back while other processes keep the CPUs busy (up to the
        run's --wait-budget seconds in all)."""
        from .common import NOISY_CORES, _cpu_jiffies

        waited = 0.0
        while True:
            j0 = _cpu_jiffies()
            time.sleep(0.5)
            busy = (_cpu_jiffies()[0] - j0[0]) / os.sysconf("SC_CLK_TCK") / 0.5
            if busy <= NOISY_CORES or self.wait_left <= 0:
                break
            waited += 0.5
            self.wait_left -= 0.5
        self.waits.append((label, waited, round(busy, 2)))

    def __call__(self, task: str, fw: str, env: dict | None = None, tag: str = "", **kw):
        default_env = env is None
        spec = dict(task=task, fw=fw, threads=self.args.threads, **kw)
        label = f"{task} {fw} " + " ".join(f"{k}={v}" for k, v in kw.items() if k != "reps")
        label += f" ({tag})" if tag else ""
        self.wait_quiet(label)
        w = self.waits[-1]
        print(
            f"[{time.perf_counter() - self.t0:6.0f} s] {label}"
            + (f"  (waited {w[1]:.0f} s for a quieter machine)" if w[1] else "")
            + (f"  (other processes busy: {w[2]:.1f} cores)" if w[2] > 0.25 else ""),
            file=sys.stderr,
            flush=True,
        )
        env = dict(env or self.env)
        if fw == TORCH:
            # the torch worker imports tensorgrad to seed its weights: keep tensorgrad's
            # malloc tuning out of torch's process unless asked for
            env.setdefault("TG_MALLOC_TUNING", "0")
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        try:
            p = subprocess.run(
                [sys.executable, "-m", "benchmarks.worker", json.dumps(spec), out],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=self.args.timeout,
            )
            if p.returncode != 0:
                raise RuntimeError(
                    p.stderr.strip().splitlines()[-1] if p.stderr else f"exit code {p.returncode}"
                )
            with open(out) as f:
                res = json.load(f)
        except Exception as e:  # noqa: BLE001 - one failed measurement must not end the run
            msg = f"{label}: {type(e).__name__}: {e}"
            print(f"    failed: {msg}", file=sys.stderr, flush=True)
            self.errors.append(msg)
            return None
        finally:
            os.unlink(out)
        if default_env or fw not in self.infos:
            self.infos[fw] = res["info"]
        return res["result"]


def have_torch() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except ValueError:
        return False


# ----------------------------------------------------------------------------- formatting
def fmt(x, digits=1, unit=""):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if abs(x) >= 100:
        return f"{x:,.0f}{unit}"
    return f"{x:.{digits}f}{unit}"


def noisy(m) -> str:
    """'*' when the median had to include repetitions during which other processes were busy."""
    if not isinstance(m, dict) or "times_s" not in m:
        return ""
    return "*" if m["reps_noisy"] and m["reps_used"] == len(m["times_s"]) else ""


def ratio(a, b):
    return "-" if a is None or b is None or not b else f"{a / b:.2f}"


def ms(v, digits=1) -> str:
    """Seconds as milliseconds."""
    return fmt(None if v is None else v * 1e3, digits)


def table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def get(d, *keys):
    for k in keys:
        if d is None:
            return None
        d = d.get(k) if isinstance(d, dict) else None
    return d


# ----------------------------------------------------------------------------- report
def report(R: dict) -> str:
    m, out = R["meta"], []
    n = m["threads"]
    out.append(f"# tensorgrad vs PyTorch eager ({m['date']})\n")
    out.append(
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['mem_gib']:.0f} GiB; "
        f"Python {m['python']}, NumPy {m['numpy']}, torch {m['torch'] or 'not installed'}. "
        f"Threads: **{n}** for both (threadpoolctl for NumPy's BLAS, torch.set_num_threads; "
        f"tensorgrad's elementwise pool: TG_NUM_THREADS={m.get('tg_threads') or 'default (1)'}). "
        f"float32 everywhere. Figures: median of {m['plan']['reps']} repetitions after warm-up."
    )
    if m.get("machine"):
        from .machine import summary

        out.append("\n" + summary(m["machine"]))
    wb = get(R, "workers", TG, "blas") or []
    kern = ", ".join(
        f"{b['internal_api']} {b['version']} kernel {b['architecture']}"
        for b in wb
        if b.get("internal_api") == "openblas"
    )
    out.append(f"\nNumPy BLAS in the workers: {kern or '-'}.")
    if m["blas_env_removed"]:
        given = get(R, "gemm", "env_as_given", "peak_gflops")
        n0 = get(R, "gemm", "env_as_given", "n")
        now = get(R, "gemm", TG, str(n0), "min_s")
        now = now and 2 * n0**3 / now / 1e9
        out.append(
            f"The workers run with {', '.join(f'{k}={v}' for k, v in m['blas_env_removed'].items())} "
            f"removed from their environment: with them NumPy's OpenBLAS uses the "
            f"{m['parent_blas_kernel']} kernel ({fmt(given)} GFLOP/s at n={n0}) instead of "
            f"{next((b['architecture'] for b in wb if b.get('internal_api') == 'openblas'), '?')} "
            f"({fmt(now)} GFLOP/s). "
            "Tests and other commands are unaffected (--keep-blas-env keeps them)."
        )
    peak = get(R, "gemm", TG, "peak_gflops")
    tpeak = get(R, "gemm", TORCH, "peak_gflops")
    out.append(
        f"\nfloat32 GEMM peak (best repetition of n×n @ n×n, n in {m['plan']['gemm_sizes']}): "
        f"NumPy **{fmt(peak)} "
        f"GFLOP/s**, torch {fmt(tpeak)} GFLOP/s"
        + (
            f" ({fmt(100 * peak / est)}% and {fmt(tpeak and 100 * tpeak / est)}% of the "
            "estimated peak)"
            if (est := get(m, "machine", "fp32_peak_gflops_estimate")) and peak
            else ""
        )
        + ". MFU = model FLOPs per step / step time / "
        f"NumPy peak, with model FLOPs = ({FLOPS_FORMULA})·B·T (gpt.model.GPT."
        "estimate_flops_per_token)."
    )
    noise = m.get("noise")
    if noise:
        out.append(
            f"\nOther processes kept a median of {noise['median_cores']:.2f} cores busy during "
            f"the timed repetitions; {noise['noisy_pct']:.0f}% of repetitions ran with more "
            f"than {noise['threshold']} cores busy elsewhere (retried, and left out of the "
            "median when enough quiet ones exist). A figure marked * includes such "
            "repetitions."
        )

    tr = R.get("train")
    if tr:
        rows, rows2 = [], []
        for shape, d in tr.items():
            a, b = d.get(TG), d.get(TORCH)
            L, H, C, T, B, V = SHAPES[shape]
            ta, tb = get(a, "median_s"), get(b, "median_s")
            flops = (get(a, "flops_per_token") or get(b, "flops_per_token") or 0) * B * T
            mfa = None if ta is None or not peak else 100 * flops / ta / (peak * 1e9)
            mfb = None if tb is None or not peak else 100 * flops / tb / (peak * 1e9)
            dl = None if a is None or b is None else abs(a["loss0"] - b["loss0"])
            dl1 = None if a is None or b is None else abs(a["loss1"] - b["loss1"])
            rows.append(
                [
                    shape,
                    f"{L}/{H}/{C}, V={V}",
                    f"{B}×{T}",
                    ms(ta) + noisy(a),
                    ms(tb) + noisy(b),
                    ratio(ta, tb),
                    fmt(ta and B * T / ta),
                    fmt(tb and B * T / tb),
                    fmt(mfa, 1, "%"),
                    fmt(mfb, 1, "%"),
                    f"{get(a, 'loss0') or get(b, 'loss0'):.4f}" if (a or b) else "-",
                    "-" if dl is None else f"{dl:.1e}",
                    "-" if dl1 is None else f"{dl1:.1e}",
                ]
            )
            rows2.append(
                [
                    shape,
                    ms(get(a, "fwd_s")),
                    ms(get(b, "fwd_s")),
                    ms(get(a, "bwd_s")),
                    ms(get(b, "bwd_s")),
                    ms(get(a, "opt_s")),
                    ms(get(b, "opt_s")),
                    ratio(get(a, "fwd_s"), get(b, "fwd_s")),
                    ratio(get(a, "bwd_s"), get(b, "bwd_s")),
                    ratio(get(a, "opt_s"), get(b, "opt_s")),
                ]
            )
        out.append("\n## 1-2. Training step (forward + backward + AdamW), MFU\n")
        out.append(
            table(
                [
                    "model",
                    "L/H/C",
                    "B×T",
                    "tg ms/step",
                    "torch ms/step",
                    "tg/torch",
                    "tg tok/s",
                    "torch tok/s",
                    "tg MFU",
                    "torch MFU",
                    "loss step 0",
                    "|Δloss| 0",
                    "|Δloss| 1",
                ],
                rows,
            )
        )
        if any(MALLOC_SUFFIX in k for d in tr.values() for k in d):
            tg_tunes = get(R, "workers", TG, "tg_malloc_tuned")
            rows3 = []
            for shape, d in tr.items():
                a_t, a_g = (
                    (d.get(TG), d.get(TG + MALLOC_SUFFIX))
                    if tg_tunes
                    else (d.get(TG + MALLOC_SUFFIX), d.get(TG))
                )
                b_g, b_t = d.get(TORCH), d.get(TORCH + MALLOC_SUFFIX)
                t = {
                    k: get(r, "median_s")
                    for k, r in (("ag", a_g), ("at", a_t), ("bg", b_g), ("bt", b_t))
                }
                rows3.append(
                    [
                        shape,
                        ms(t["ag"]) + noisy(a_g),
                        ms(t["at"]) + noisy(a_t),
                        ratio(t["at"], t["ag"]),
                        ms(t["bg"]) + noisy(b_g),
                        ms(t["bt"]) + noisy(b_t),
                        ratio(t["bt"], t["bg"]),
                        ratio(t["ag"], t["bg"]),
                        ratio(t["at"], t["bt"]),
                    ]
                )
            env_txt = " ".join(f"{k}={v}" for k, v in MALLOC_TUNED.items())
            out.append(
                "\nglibc malloc: by default it hands freed arrays above a dynamic threshold back "
                "to the OS, and the next step page-faults them in again. *Tuned* keeps arrays up "
                f"to 32 MiB and 1 GiB of free heap ({env_txt}; tensorgrad "
                f"{'applies this at import' if tg_tunes else 'does not tune malloc here'}"
                "; TG_MALLOC_TUNING=0 gives it glibc's default):\n"
            )
            out.append(
                table(
                    [
                        "model",
                        "tg glibc default",
                        "tg tuned",
                        "tuned/default",
                        "torch glibc default",
                        "torch tuned",
                        "tuned/default",
                        "tg/torch, both default",
                        "tg/torch, both tuned",
                    ],
                    rows3,
                )
            )
        out.append(
            "\n|Δloss| 0 and 1: the two frameworks' losses at the first step and after "
            "one AdamW step, from the same weights and batch."
        )
        many = {k: d for k, d in tr.items() if len(get(d.get(TG), "rounds_s") or []) > 1}
        for shape, d in many.items():
            each = ", ".join(
                f"{fw} " + " / ".join(ms(t) for t in d[fw]["rounds_s"])
                for fw in (TG, TORCH)
                if d.get(fw)
            )
            out.append(f"\nRounds, {shape} (ms, taking turns): {each}; the table shows the median.")
        out.append("\nPhases of the step (ms, medians):\n")
        out.append(
            table(
                [
                    "model",
                    "tg fwd",
                    "torch fwd",
                    "tg bwd",
                    "torch bwd",
                    "tg AdamW",
                    "torch AdamW",
                    "fwd ratio",
                    "bwd ratio",
                    "AdamW ratio",
                ],
                rows2,
            )
        )

    ops = R.get("ops")
    if ops:
        a, b = ops.get(TG) or {}, ops.get(TORCH) or {}
        rows = []
        for name in dict.fromkeys([*a, *b]):
            x, y = a.get(name), b.get(name)
            xf, yf = get(x, "fwd", "median_s"), get(y, "fwd", "median_s")
            xb, yb = get(x, "fwd_bwd", "median_s"), get(y, "fwd_bwd", "median_s")
            rows.append(
                [
                    name,
                    (x or y)["shape"],
                    ms(xf, 2) + noisy(get(x, "fwd")),
                    ms(yf, 2) + noisy(get(y, "fwd")),
                    ratio(xf, yf),
                    ms(xb, 2) + noisy(get(x, "fwd_bwd")),
                    ms(yb, 2) + noisy(get(y, "fwd_bwd")),
                    ratio(xb, yb),
                ]
            )
        out.append("\n## 3. Single ops, forward and forward + backward (ms per call)\n")
        out.append(
            table(
                [
                    "op",
                    "shape",
                    "tg fwd",
                    "torch fwd",
                    "fwd ratio",
                    "tg fwd+bwd",
                    "torch fwd+bwd",
                    "fwd+bwd ratio",
                ],
                rows,
            )
        )
        out.append(
            "\n(adamw step: one optimizer step over gpt2-124M's parameters, "
            "torch.optim.AdamW with its default implementation on CPU.)"
        )

    mem = R.get("memory")
    if mem:
        a, b = mem.get(TG), mem.get(TORCH)
        key = f"{SHAPES['gpt2-124M'][4]}x{SHAPES['gpt2-124M'][3]}"
        sa, sb = get(a, "steps", key), get(b, "steps", key)
        rows = []
        for label, k in [
            ("params + AdamW moments (RSS before the step)", None),
            ("peak growth during the step", "peak_growth_mb"),
            ("peak growth, first step (allocates AdamW moments)", "first_peak_growth_mb"),
            ("process peak above the imports", "peak_above_import_mb"),
        ]:
            if k is None:
                va = sa and sa["rss_before_mb"] - a["rss_import_mb"]
                vb = sb and sb["rss_before_mb"] - b["rss_import_mb"]
            else:
                va, vb = get(sa, k), get(sb, k)
            rows.append([label, fmt(va), fmt(vb), ratio(va, vb)])
        out.append(
            f"\n## 4a. Memory of one gpt2-124M training step (B×T = {key.replace('x', '×')}), MB\n"
        )
        out.append(table(["", "tensorgrad", "torch", "tg/torch"], rows))
        out.append(
            "\nResident set (VmRSS/VmHWM from /proc/self/status; the high-water mark is reset "
            "before the step), one process per framework running with "
            "MALLOC_MMAP_THRESHOLD_=65536 so freed arrays return to the OS. 'Peak growth' is "
            "activations + gradients + temporaries on top of parameters and AdamW state."
        )

    sc = R.get("scaling")
    if sc:
        a, b = sc.get(TG) or {}, sc.get(TORCH) or {}
        ma, mb = get(mem, TG, "steps") or {}, get(mem, TORCH, "steps") or {}
        rows = []
        for T in m["plan"]["scale_Ts"]:
            x, y = a.get(str(T)), b.get(str(T))
            ta, tb = get(x, "median_s"), get(y, "median_s")
            pa, pb = get(ma, f"1x{T}", "peak_growth_mb"), get(mb, f"1x{T}", "peak_growth_mb")
            rows.append(
                [
                    T,
                    fmt(ta and ta * 1e3) + noisy(x),
                    fmt(tb and tb * 1e3) + noisy(y),
                    ratio(ta, tb),
                    fmt(ta and T / ta),
                    fmt(tb and T / tb),
                    fmt(pa),
                    fmt(pb),
                    ratio(pa, pb),
                ]
            )
        out.append(
            f"\n## 4b. Scaling with sequence length: gpt2-124M, B=1, block_size "
            f"{max(m['plan']['scale_Ts'])}\n"
        )
        out.append(
            table(
                [
                    "T",
                    "tg ms/step",
                    "torch ms/step",
                    "tg/torch",
                    "tg tok/s",
                    "torch tok/s",
                    "tg step MB",
                    "torch step MB",
                    "MB ratio",
                ],
                rows,
            )
        )

    gen = R.get("generate")
    if gen:
        a, b = gen.get(TG) or {}, gen.get(TORCH) or {}
        rows = []
        for c in m["plan"]["gen_contexts"]:
            ac, an = get(a, f"{c}/cache", "tokens_per_s"), get(a, f"{c}/nocache", "tokens_per_s")
            bc, bn = get(b, f"{c}/cache", "tokens_per_s"), get(b, f"{c}/nocache", "tokens_per_s")
            rows.append(
                [
                    c,
                    fmt(ac),
                    fmt(an),
                    ratio(ac, an),
                    fmt(bc),
                    fmt(bn),
                    ratio(bc, bn),
                    ratio(bc, ac),
                    ms(get(a, f"{c}/cache", "prefill_s")),
                    ms(get(b, f"{c}/cache", "prefill_s")),
                ]
            )
        out.append(
            f"\n## 5. Generation: gpt2-124M, batch 1, greedy, {m['plan']['n_new']} new "
            f"tokens after a prompt of `context` tokens, {m['plan']['gen_rounds']} round(s) "
            "(decode tokens/s: median over the later tokens; prefill: the first token, "
            "best round)\n"
        )
        out.append(
            table(
                [
                    "context",
                    "tg cached",
                    "tg uncached",
                    "tg speedup",
                    "torch cached",
                    "torch uncached",
                    "torch speedup",
                    "tg/torch time (cached)",
                    "tg prefill ms",
                    "torch prefill ms",
                ],
                rows,
            )
        )
        c = max(m["plan"]["gen_contexts"])
        ac, an = get(a, f"{c}/cache", "tokens_per_s"), get(a, f"{c}/nocache", "tokens_per_s")
        if ac and an:
            out.append(
                f"\nKV cache speedup at context {c}: tensorgrad **{ac / an:.1f}×**"
                + (
                    f", torch {get(b, f'{c}/cache', 'tokens_per_s') / get(b, f'{c}/nocache', 'tokens_per_s'):.1f}×"
                    if get(b, f"{c}/nocache", "tokens_per_s")
                    else ""
                )
                + "."
            )

    if R.get("errors"):
        out.append("\n## Errors\n")
        out += [f"- {e}" for e in R["errors"]]
    out.append(
        f"\nTotal time {m['wall_s']:.0f} s. Ratios are tensorgrad/PyTorch (lower is "
        "better for tensorgrad)."
    )
    return "\n".join(out)


# ----------------------------------------------------------------------------- plots
def plots(R: dict, stem: Path) -> list:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    except ImportError:
        return []

    def axes(ax, xs):
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
        if ax.get_yscale() == "log":
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend()

    files = []
    sc, mem = R.get("scaling"), R.get("memory")
    if sc or mem:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for fw, style in ((TG, "o-"), (TORCH, "s--")):
            d = get(sc, fw) or {}
            Ts = [int(t) for t in d]
            if Ts:
                ax1.plot(Ts, [d[str(t)]["median_s"] * 1e3 for t in Ts], style, label=fw)
            steps = get(mem, fw, "steps") or {}
            pts = sorted((v["T"], v["peak_growth_mb"]) for v in steps.values() if v["B"] == 1)
            if pts:
                ax2.plot(*zip(*pts), style, label=fw)
        if not (ax1.get_lines() or ax2.get_lines()):  # no lengths measured: no empty plot
            plt.close(fig)
            sc = mem = None
    if sc or mem:
        for ax, title, yl in (
            (ax1, "training step time", "ms / step"),
            (ax2, "memory of one training step", "peak RSS growth, MB"),
        ):
            ax.set(
                xscale="log",
                yscale="log" if ax is ax1 else "linear",
                xlabel="sequence length T",
                ylabel=yl,
                title=f"gpt2-124M, B=1: {title}",
            )
            axes(ax, R["meta"]["plan"]["scale_Ts"])
        fig.tight_layout()
        files.append(stem.with_name(stem.name + "-scaling.png"))
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    gen = R.get("generate")
    if gen:
        fig, ax = plt.subplots(figsize=(6, 4))
        for fw, mk, color in ((TG, "o", "C0"), (TORCH, "s", "C1")):
            d = gen.get(fw) or {}
            for k, ls in (("cache", "-"), ("nocache", "--")):
                pts = sorted(
                    (v["context"], v["tokens_per_s"])
                    for v in d.values()
                    if v["use_cache"] == (k == "cache")
                )
                if pts:
                    ax.plot(
                        *zip(*pts),
                        mk + ls,
                        color=color,
                        label=f"{fw}, {'KV cache' if k == 'cache' else 'no cache'}",
                    )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="context (prompt tokens)",
            ylabel="decode tokens / s",
            title="gpt2-124M generation, batch 1",
        )
        axes(ax, R["meta"]["plan"]["gen_contexts"])
        fig.tight_layout()
        files.append(stem.with_name(stem.name + "-generate.png"))
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    return files


# ----------------------------------------------------------------------------- main
def machine_meta(args) -> dict:
    import numpy as np

    try:
        import psutil

        physical, mem = psutil.cpu_count(logical=False), psutil.virtual_memory().total
    except ImportError:
        physical, mem = None, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        commit = git_commit() or ""
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "tensorgrad", "gpt"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )
    except OSError:
        commit, dirty = None, None
    torch_version = None
    if have_torch() and not args.no_torch:
        import torch

        torch_version = torch.__version__
    parent_blas = blas_info()
    from .machine import describe

    return dict(
        machine=describe(),
        date=dt.datetime.now().isoformat(timespec="seconds"),
        cpu=cpu_model(),
        logical_cores=os.cpu_count(),
        physical_cores=physical,
        mem_gib=mem / 2**30,
        threads=args.threads,
        tg_threads=args.tg_threads,
        python=platform.python_version(),
        platform=platform.platform(),
        numpy=np.__version__,
        torch=torch_version,
        git_commit=commit,
        git_dirty_tensorgrad_gpt=dirty,
        argv=sys.argv[1:],
        loadavg_start=os.getloadavg(),
        parent_blas=parent_blas,
        parent_blas_kernel=next(
            (b["architecture"] for b in parent_blas if b["internal_api"] == "openblas"), None
        ),
    )


def noise_summary(R: dict) -> dict | None:
    cores = []

    def walk(d):
        if isinstance(d, dict):
            if "others_cores" in d and isinstance(d["others_cores"], list):
                cores.extend(d["others_cores"])
            for v in d.values():
                walk(v)

    for k in SECTIONS:
        walk(R.get(k))
    if not cores:
        return None
    from .common import NOISY_CORES

    return dict(
        median_cores=statistics.median(cores),
        threshold=NOISY_CORES,
        noisy_pct=100 * sum(c > NOISY_CORES for c in cores) / len(cores),
        n=len(cores),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="a ~2 minute run: fewer lengths and reps")
    ap.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections out of {','.join(SECTIONS)}",
    )
    ap.add_argument("--reps", type=int, default=None, help="repetitions per figure (5; quick 2-3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads per framework")
    ap.add_argument(
        "--tg-threads",
        type=int,
        default=None,
        help="TG_NUM_THREADS for tensorgrad's elementwise passes (default: "
        "tensorgrad's own default, 1)",
    )
    ap.add_argument("--shapes", default=",".join(SHAPES), help="training-step models")
    ap.add_argument("--no-torch", action="store_true", help="tensorgrad only")
    ap.add_argument(
        "--keep-blas-env",
        action="store_true",
        help=f"keep {' and '.join(BLAS_ENV_VARS)} for the workers",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument(
        "--wait-budget",
        type=float,
        default=None,
        help="seconds in all to wait for other processes to go quiet before "
        "starting workers (120; quick 0)",
    )
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per worker process")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="training steps: this many worker processes per framework, taking turns; each "
        "figure is the round with the median time (a VM's speed can differ between processes)",
    )
    args = ap.parse_args(argv)
    if args.wait_budget is None:
        args.wait_budget = 0 if args.quick else 120
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"unknown sections {bad}; choose from {SECTIONS}")
    P = plan(args)
    t_start = time.perf_counter()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if args.tg_threads is not None:  # else tensorgrad's default: its chunked passes inline
        env["TG_NUM_THREADS"] = str(args.tg_threads)
    removed = {}
    if not args.keep_blas_env:
        removed = {k: env.pop(k) for k in BLAS_ENV_VARS if k in env}
    meta = machine_meta(args)
    meta.update(plan=P, sections=only, blas_env_removed=removed)
    fws = [TG] + ([TORCH] if meta["torch"] else [])
    run = Runner(args, env)
    from .common import _cpu_jiffies

    j0 = _cpu_jiffies()
    time.sleep(1.0)
    meta["others_cores_at_start"] = busy = (_cpu_jiffies()[0] - j0[0]) / os.sysconf("SC_CLK_TCK")
    if busy > 0.5 and args.threads > 1:
        print(
            f"warning: other processes keep {busy:.1f} cores busy; {args.threads}-thread BLAS "
            "and OpenMP pools slow down many times over when a core is taken (try --threads 1)",
            file=sys.stderr,
        )
    R = {"meta": meta}

    # GEMM peak, always: MFU needs it
    R["gemm"] = {}
    for fw in fws:
        r = run("gemm", fw, sizes=P["gemm_sizes"], reps=P["op_reps"])
        if r:
            # the best repetition: background load can only slow a GEMM down
            R["gemm"][fw] = dict(
                r, peak_gflops=max(2 * int(n) ** 3 / v["min_s"] / 1e9 for n, v in r.items())
            )
    if removed:  # document what the removed variables cost NumPy
        given = dict(env, **removed)
        r = run(
            "gemm",
            TG,
            env=given,
            tag="BLAS env as given",
            sizes=P["gemm_sizes"][:1],
            reps=P["op_reps"],
        )
        if r:
            n = P["gemm_sizes"][0]
            R["gemm"]["env_as_given"] = dict(
                r[str(n)], env=removed, n=n, peak_gflops=2 * n**3 / r[str(n)]["min_s"] / 1e9
            )

    if "train" in only:
        R["train"] = {}
        other_malloc = {
            TG: (dict(env, TG_MALLOC_TUNING="0"), "glibc's default malloc"),
            TORCH: (dict(env, **MALLOC_TUNED), "tuned malloc"),
        }
        for shape in [s for s in args.shapes.split(",") if s]:
            turns = [
                [run("train", fw, shape=shape, reps=P["reps"]) for fw in fws]
                for _ in range(max(1, args.rounds))
            ]
            R["train"][shape] = {
                fw: median_round([t[i] for t in turns]) for i, fw in enumerate(fws)
            }
            if P["malloc_variant"]:
                for fw in fws:
                    e, tag = other_malloc[fw]
                    R["train"][shape][fw + MALLOC_SUFFIX] = run(
                        "train", fw, env=e, tag=tag, shape=shape, reps=P["reps"]
                    )
    if "ops" in only:
        R["ops"] = {fw: run("ops", fw, reps=P["op_reps"], min_rep_s=P["min_rep_s"]) for fw in fws}
    if "memory" in only:
        menv = dict(env, MALLOC_MMAP_THRESHOLD_="65536")
        T, B = SHAPES["gpt2-124M"][3:5]
        configs = [(B, T)] + (
            [(1, t) for t in P["scale_Ts"]] if "scaling" in only and not args.quick else []
        )
        R["memory"] = {
            fw: run(
                "memory",
                fw,
                env=menv,
                tag="MALLOC_MMAP_THRESHOLD_=65536",
                shape="gpt2-124M",
                configs=configs,
            )
            for fw in fws
        }
    if "scaling" in only:
        R["scaling"] = {
            fw: run(
                "scaling", fw, shape="gpt2-124M", B=1, Ts=P["scale_Ts"], reps=max(2, P["reps"] - 2)
            )
            for fw in fws
        }
    if "generate" in only:
        R["generate"] = {
            fw: run(
                "generate", fw, contexts=P["gen_contexts"], n_new=P["n_new"], rounds=P["gen_rounds"]
            )
            for fw in fws
        }

    R["workers"] = run.infos
    meta["waits"] = run.waits
    R["errors"] = run.errors
    meta["loadavg_end"] = os.getloadavg()
    meta["wall_s"] = time.perf_counter() - t_start
    meta["noise"] = noise_summary(R)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    stem = outdir / f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}"
    files = plots(R, stem)
    meta["plots"] = [str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f) for f in files]
    text = report(R)
    R["markdown"] = text
    with open(stem.with_suffix(".json"), "w") as f:
        json.dump(R, f, indent=1, default=str)
    print(text)
    print(f"\nWrote {stem.with_suffix('.json')}" + "".join(f", {f}" for f in files))
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
