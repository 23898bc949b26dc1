"""GPU benchmark: fused kernels vs their twins, GPT training steps, PyTorch side by side.

    PYTHONPATH=. python -m benchmarks.gpu_bench [--out DIR] [--budget SECONDS]

(benchmarks/gpu_check.sh runs it after the GPU tests.) Offline, nothing installed. Sections:

  env          GPU, CuPy, CUDA and torch versions
  matmul       a large float32 GEMM in each matmul precision (measured TFLOPS)
  kernels      each fused kernel against its NumPy-style twin run on CuPy: error, ms, speedup
  tiny         a few `tiny` GPT steps on the GPU and on the CPU: the same losses
  gpt2         gpt2 (124M), B=8, T=1024 training steps (forward, backward, AdamW): tokens/s and
               MFU for tensorgrad (each matmul precision, and without fused kernels) and for
               PyTorch eager with TF32 off, from the same initial weights and batch
  attention    attention forward+backward memory and time against T: flash kernel, batched
               GEMM path, torch SDPA (B=1, 12 heads, head size 64)

MFU = tokens/s x model FLOPs per token (gpt.model.estimate_flops_per_token) / peak, with the
peak taken as the H200's dense FP32 rate, PEAK_FP32 = 67 TFLOPS (the measured float32 GEMM
rate is reported next to it). Results go to DIR/gpu_bench.json and DIR/gpu_bench.md (DIR:
--out, else $OUT, else benchmarks/results); every section records its error, if any, and the
others still run. Sections that would overrun --budget are skipped (and say so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback
from pathlib import Path

import numpy as np

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import devices
from tensorgrad.cuda.ops import MATMUL_PRECISIONS
from tensorgrad.ops import linalg

PEAK_FP32 = 67e12  # H200 SXM dense FP32 (non-tensor-core), FLOP/s
# sizes (GPT-2 124M); a smoke test on the CPU shrinks them
MODEL, B, T, VOCAB, EMBD, HEADS = "gpt2", 8, 1024, 50257, 768, 12
MATMUL_N, ADAMW_N, ATTN_TS = 8192, 50_000_000, (512, 1024, 2048, 4096, 8192)


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def sync():
    devices.require_cupy().cuda.Device().synchronize()


def timed(fn, reps: int, warmup: int = 1, torch_sync=False) -> float:
    """Seconds per call of fn, after warmup calls, with the device synchronised around."""
    import importlib

    done = importlib.import_module("torch").cuda.synchronize if torch_sync else sync
    for _ in range(warmup):
        fn()
    done()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    done()
    return (time.perf_counter() - t0) / reps


def pool_bytes() -> int:
    return devices.require_cupy().get_default_memory_pool().total_bytes()


def free_pool():
    cp = devices.require_cupy()
    cp.get_default_memory_pool().free_all_blocks()


# ----------------------------------------------------------------------------- sections


def section_env(budget):
    cp = devices.require_cupy()
    props = cp.cuda.runtime.getDeviceProperties(0)
    out = {
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "sm_count": props["multiProcessorCount"],
        "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "peak_fp32_tflops_assumed": PEAK_FP32 / 1e12,
    }
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.cuda.is_available()
    except ImportError:
        out["torch"] = None
    return out


def section_matmul(budget):
    cp = devices.require_cupy()
    n = MATMUL_N
    r = cp.random.default_rng(0)
    a = r.standard_normal((n, n), dtype=cp.float32)
    b = r.standard_normal((n, n), dtype=cp.float32)
    rows = []
    for precision in MATMUL_PRECISIONS:
        tg.cuda.set_matmul_precision(precision)
        try:
            s = timed(lambda: linalg.matmul(a, b), reps=5)
        finally:
            tg.cuda.set_matmul_precision("highest")
        rows.append({"precision": precision, "n": n, "ms": s * 1e3, "tflops": 2 * n**3 / s / 1e12})
    return rows


def _op_inputs(r):
    V, C = VOCAB, EMBD
    N = B * T
    f = np.float32
    return {
        "gelu_tanh": (lambda x: F.gelu(x, "tanh"), [r.standard_normal((N, 4 * C)).astype(f)]),
        "layer_norm": (
            lambda x, w, b: F.layer_norm(x, C, w, b),
            [r.standard_normal((N, C)).astype(f), r.random(C).astype(f), r.random(C).astype(f)],
        ),
        "softmax": (lambda x: F.softmax(x, -1), [r.standard_normal((N, 1024)).astype(f)]),
        "cross_entropy": (
            lambda x, t: F.cross_entropy(x, t),
            [r.standard_normal((N, V)).astype(f), r.integers(0, V, N)],
        ),
        "embedding": (
            lambda w, i: F.embedding(i, w),
            [(r.standard_normal((V, C)) * 0.02).astype(f), r.integers(0, V, (B, T))],
        ),
        "attention": (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            [r.standard_normal((B, HEADS, T, C // HEADS)).astype(f) for _ in range(3)],
        ),
    }


def section_kernels(budget):
    rows = []
    r = np.random.default_rng(0)
    for name, (fn, arrays) in _op_inputs(r).items():
        if budget.left() < 20:
            rows.append({"kernel": name, "skipped": "time budget"})
            continue
        ts = [
            tg.tensor(a, dtype=a.dtype, device="cuda", requires_grad=a.dtype.kind == "f")
            for a in arrays
        ]

        gout = {}  # one random upstream gradient for both runs (ones would sum softmax to 0)

        def run(fn=fn, ts=ts, gout=gout):
            for t in ts:
                t.grad = None
            out = fn(*ts)
            if out.ndim and "g" not in gout:
                gout["g"] = tg.randn(*out.shape, device="cuda")
            out.backward(gout.get("g"))
            return out

        res, secs = {}, {}
        for fused in (True, False):
            tg.kernels.set_enabled(fused)
            try:
                out = run()
                res[fused] = [out.numpy()] + [t.grad.numpy() for t in ts if t.grad is not None]
                del out
                secs[fused] = timed(run, reps=3)
            finally:
                tg.kernels.set_enabled(True)
            free_pool()
        err = max(
            float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
            for a, b in zip(res[True], res[False])
        )
        rows.append(
            {
                "kernel": name + " (fwd+bwd)",
                "max_rel_err_vs_twin": err,
                "fused_ms": secs[True] * 1e3,
                "twin_ms": secs[False] * 1e3,
                "speedup": secs[False] / secs[True],
            }
        )
        del ts, res
        free_pool()
    # AdamW over 50M parameters: kernel vs the NumPy-style update on CuPy
    from gpt import optim

    cp = devices.require_cupy()
    n = ADAMW_N
    x, g, m = (cp.asarray(r.standard_normal(n).astype(np.float32)) for _ in range(3))
    v = cp.asarray(r.random(n).astype(np.float32) * 1e-2)
    hp = {"lr": 6e-4, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1, "step": 3}
    outs, times = {}, {}
    for fused in (True, False):
        tg.kernels.set_enabled(fused)
        try:
            xs, ms, vs = x.copy(), m.copy(), v.copy()
            optim.adamw_update(xs, g, ms, vs, **hp)
            outs[fused] = xs
            times[fused] = timed(lambda a=(xs, g, ms, vs): optim.adamw_update(*a, **hp), reps=3)
        finally:
            tg.kernels.set_enabled(True)
    ulps = int(
        cp.abs(
            outs[True].view(cp.int32).astype(cp.int64) - outs[False].view(cp.int32).astype(cp.int64)
        ).max()
    )
    rows.append(
        {
            "kernel": f"adamw ({n / 1e6:g}M params)",
            "max_ulp_vs_twin": ulps,
            "fused_ms": times[True] * 1e3,
            "twin_ms": times[False] * 1e3,
            "speedup": times[False] / times[True],
        }
    )
    del x, g, m, v, outs
    free_pool()
    return rows


def _gpt_batch(V, rng):
    data = rng.integers(0, V, size=(B, T + 1))
    return data[:, :-1], data[:, 1:]


def section_tiny(budget):
    from gpt.config import GPTConfig
    from gpt.model import GPT

    data = np.random.default_rng(1).integers(0, 32, size=(4, 17))
    losses = {}
    for dev in ("cpu", "cuda"):
        tg.manual_seed(0)
        model = GPT(GPTConfig.from_preset("tiny")).to(dev)
        opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
        x, y = devices.to_device(data[:, :-1], dev), devices.to_device(data[:, 1:], dev)
        losses[dev] = []
        for _ in range(5):
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[dev].append(loss.item())
    return {
        "losses_cpu": losses["cpu"],
        "losses_gpu": losses["cuda"],
        "max_abs_diff": max(abs(a - b) for a, b in zip(losses["cpu"], losses["cuda"])),
    }


def _tg_steps(model, opt, x, y, warmup, reps):
    first = []

    def step():
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not first:
            first.append(loss.item())

    s = timed(step, reps=reps, warmup=warmup)
    return s, first[0]


def section_gpt2(budget, steps=4, warmup=2):
    from gpt.config import GPTConfig
    from gpt.model import GPT

    cfg = GPTConfig.from_preset(MODEL)
    tg.manual_seed(0)
    model = GPT(cfg)  # float32 init on the host, then moved: the same weights everywhere
    flops = model.estimate_flops_per_token(T)
    x_np, y_np = _gpt_batch(cfg.vocab_size, np.random.default_rng(0))
    rows = []
    result = {"flops_per_token": flops, "B": B, "T": T, "rows": rows}
    torch_model = None
    try:
        import torch

        from benchmarks.gpu_torch_gpt import from_tensorgrad

        if torch.cuda.is_available():
            torch_model = from_tensorgrad(model, "cuda")  # copies the initial weights
    except ImportError as e:
        result["torch_skipped"] = f"torch unavailable: {e}"
    model.to("cuda")
    x, y = devices.to_device(x_np, "cuda"), devices.to_device(y_np, "cuda")
    variants = [
        ("tensorgrad", "highest", True),
        ("tensorgrad", "tf32", True),
        ("tensorgrad", "bf16", True),
        ("tensorgrad (no fused kernels)", "highest", False),
    ]
    for name, precision, fused in variants:
        if budget.left() < 60:
            rows.append({"framework": name, "precision": precision, "skipped": "time budget"})
            continue
        tg.cuda.set_matmul_precision(precision)
        tg.kernels.set_enabled(fused)
        try:
            opt = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4)
            s, first = _tg_steps(model, opt, x, y, warmup, steps)
            rows.append(_row(name, precision, s, flops, first_loss=first, mem=pool_bytes()))
            del opt
        except Exception as e:  # noqa: BLE001  (record and go on)
            rows.append({"framework": name, "precision": precision, "error": repr(e)})
        finally:
            tg.cuda.set_matmul_precision("highest")
            tg.kernels.set_enabled(True)
        free_pool()
    del model
    free_pool()
    if torch_model is not None and budget.left() > 30:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        opt = torch_model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4)
        xt, yt = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).cuda()
        first = []

        def step():
            _, loss = torch_model(xt, yt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not first:
                first.append(loss.item())

        torch.cuda.reset_peak_memory_stats()
        s = timed(step, reps=steps, warmup=warmup, torch_sync=True)
        rows.append(
            _row(
                "pytorch eager",
                "highest (TF32 off)",
                s,
                flops,
                first_loss=first[0],
                mem=torch.cuda.max_memory_allocated(),
            )
        )
        del torch_model, opt
        torch.cuda.empty_cache()
    by = {(r["framework"], r["precision"]): r for r in rows if "tokens_per_s" in r}
    tg_row, pt_row = (
        by.get(("tensorgrad", "highest")),
        by.get(("pytorch eager", "highest (TF32 off)")),
    )
    if tg_row and pt_row:
        result["tensorgrad_over_pytorch"] = tg_row["tokens_per_s"] / pt_row["tokens_per_s"]
        result["first_loss_diff"] = abs(tg_row["first_loss"] - pt_row["first_loss"])
    return result


def _row(name, precision, s, flops, first_loss, mem):
    tps = B * T / s
    return {
        "framework": name,
        "precision": precision,
        "ms_per_step": s * 1e3,
        "tokens_per_s": tps,
        "mfu_vs_fp32_peak": tps * flops / PEAK_FP32,
        "achieved_tflops": tps * flops / 1e12,
        "first_loss": first_loss,
        "peak_mem_gib": mem / 2**30,
    }


def section_attention(budget):
    rows = []
    r = np.random.default_rng(0)
    for Tq in ATTN_TS:
        if budget.left() < 15:
            rows.append({"T": Tq, "skipped": "time budget"})
            continue
        arrays = [
            r.standard_normal((1, HEADS, Tq, EMBD // HEADS)).astype(np.float32) for _ in range(3)
        ]
        row = {"T": Tq}
        for mode in ("flash", "gemm"):
            tg.kernels.set_enabled(mode == "flash", ["attention"])
            try:
                free_pool()
                ts = [tg.tensor(a, device="cuda", requires_grad=True) for a in arrays]
                base = pool_bytes()

                def run(ts=ts):
                    out = F.scaled_dot_product_attention(*ts, is_causal=True)
                    out.backward(tg.ones(out.shape, device="cuda"))
                    for t in ts:
                        t.grad = None

                run()
                sync()
                row[f"{mode}_mem_mib"] = (pool_bytes() - base) / 2**20
                row[f"{mode}_ms"] = timed(run, reps=3, warmup=0) * 1e3
                del ts
            except Exception as e:  # noqa: BLE001
                row[f"{mode}_error"] = repr(e)
            finally:
                tg.kernels.set_enabled(True)
        try:
            import torch
            import torch.nn.functional as TF

            if torch.cuda.is_available():
                q, k, v = (torch.tensor(a, device="cuda", requires_grad=True) for a in arrays)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()

                def trun(q=q, k=k, v=v):
                    out = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
                    out.backward(torch.ones_like(out))
                    q.grad = k.grad = v.grad = None

                trun()
                torch.cuda.synchronize()
                row["torch_sdpa_mem_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                row["torch_sdpa_ms"] = timed(trun, reps=3, warmup=0, torch_sync=True) * 1e3
                del q, k, v
                torch.cuda.empty_cache()
        except ImportError:
            pass
        rows.append(row)
        free_pool()
    return rows


SECTIONS = [
    ("env", section_env, 0),
    ("matmul", section_matmul, 10),
    ("kernels", section_kernels, 40),
    ("tiny", section_tiny, 10),
    ("gpt2", section_gpt2, 90),
    ("attention", section_attention, 20),
]


# ----------------------------------------------------------------------------- report


def _table(rows, cols):
    rows = [r for r in rows if isinstance(r, dict)]
    if not rows:
        return ""
    cols = [c for c in cols if any(c in r for r in rows)]
    extra = sorted({k for r in rows for k in r} - set(cols))
    cols += [c for c in extra if c in ("skipped", "error")]

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def markdown(results: dict) -> str:
    out = ["# tensorgrad GPU check", ""]
    env = results.get("env", {})
    if isinstance(env, dict):
        out += [", ".join(f"{k}: {v}" for k, v in env.items()), ""]
    if isinstance(results.get("matmul"), list):
        out += [
            f"## float32 GEMM ({MATMUL_N}³)",
            _table(results["matmul"], ["precision", "ms", "tflops"]),
            "",
        ]
    if isinstance(results.get("kernels"), list):
        out += [
            f"## fused kernels vs NumPy-style twins on CuPy ({MODEL} shapes, B·T = {B * T})",
            _table(
                results["kernels"],
                [
                    "kernel",
                    "max_rel_err_vs_twin",
                    "max_ulp_vs_twin",
                    "fused_ms",
                    "twin_ms",
                    "speedup",
                ],
            ),
            "",
        ]
    if isinstance(results.get("tiny"), dict):
        t = results["tiny"]
        out += [f"## tiny GPT, 5 steps: max |loss GPU - loss CPU| = {t['max_abs_diff']:.2e}", ""]
    g = results.get("gpt2")
    if isinstance(g, dict):
        peak = f"{PEAK_FP32 / 1e12:.0f} TFLOPS FP32"
        out += [
            f"## {MODEL} training step, B={B}, T={T} (MFU vs {peak})",
            _table(
                g["rows"],
                [
                    "framework",
                    "precision",
                    "ms_per_step",
                    "tokens_per_s",
                    "achieved_tflops",
                    "mfu_vs_fp32_peak",
                    "peak_mem_gib",
                    "first_loss",
                ],
            ),
        ]
        if "tensorgrad_over_pytorch" in g:
            out.append(
                f"\ntensorgrad / PyTorch tokens/s (float32, TF32 off): "
                f"{g['tensorgrad_over_pytorch']:.3f}; first-step loss difference "
                f"{g['first_loss_diff']:.2e}"
            )
        out.append("")
    if isinstance(results.get("attention"), list):
        out += [
            f"## causal attention forward+backward, B=1, {HEADS} heads, head size {EMBD // HEADS}",
            _table(
                results["attention"],
                [
                    "T",
                    "flash_mem_mib",
                    "gemm_mem_mib",
                    "torch_sdpa_mem_mib",
                    "flash_ms",
                    "gemm_ms",
                    "torch_sdpa_ms",
                ],
            ),
            "",
        ]
    for name, v in results.items():
        if isinstance(v, dict) and "error" in v and name != "gpt2":
            out += [f"**{name} failed**: {v['error'].splitlines()[-1]}", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default=None, help="results folder (default $OUT or benchmarks/results)"
    )
    ap.add_argument("--budget", type=float, default=280, help="seconds for all sections")
    ap.add_argument("--sections", default=",".join(s[0] for s in SECTIONS))
    args = ap.parse_args(argv)
    out_dir = Path(args.out or os.environ.get("OUT") or "benchmarks/results")
    out_dir.mkdir(parents=True, exist_ok=True)
    if not devices.cuda_available():
        print(f"gpu_bench: no GPU ({devices.cuda_error()}); nothing to do")
        return 1
    budget = Budget(args.budget)
    results, failed = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}, False
    wanted = args.sections.split(",")
    for name, fn, need in SECTIONS:
        if name not in wanted:
            continue
        if budget.left() < need:
            results[name] = {"skipped": f"time budget ({budget.left():.0f} s left)"}
            continue
        t0 = time.perf_counter()
        print(f"[gpu_bench] {name} ...", flush=True)
        try:
            results[name] = fn(budget)
        except Exception:  # noqa: BLE001  (record it; the other sections still run)
            results[name] = {"error": traceback.format_exc()}
            failed = True
            print(results[name]["error"], flush=True)
        print(f"[gpu_bench] {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
        (out_dir / "gpu_bench.json").write_text(json.dumps(results, indent=2, default=str))
    md = markdown(results)
    (out_dir / "gpu_bench.md").write_text(md + "\n")
    print(md)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
