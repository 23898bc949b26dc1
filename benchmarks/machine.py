"""What the benchmark machine is: CPU model, family / model numbers, SIMD, cores, a peak estimate.

``describe()`` reads /proc/cpuinfo and /sys (no measurement) for the report header and the
JSON; ``python -m benchmarks.machine [--threads n]`` prints it with both frameworks'
measured float32 GEMM peaks (NumPy here, torch in its own process so that the two thread
pools never meet).

The theoretical float32 peak is an *estimate*: cores × FLOP/cycle × clock, with FLOP/cycle
taken from the widest SIMD the CPU reports and an assumed number of FMA pipes (two on
every x86 core since Haswell / Zen 1; AVX-512 as two 512-bit pipes on Intel server
cores, as 256-bit halves on Zen 4 / 5), and the clock from cpufreq's maximum, else the
"cpu MHz" the kernel reports (a VM often shows the nominal clock; turbo is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "sme",
    "bf16",
    "i8mm",
)


def _cpuinfo() -> list[dict]:
    """/proc/cpuinfo as one dict per logical CPU."""
    cpus, cur = [], {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if cur:
                        cpus.append(cur)
                    cur = {}
                    continue
                k, _, v = line.partition(":")
                cur[k.strip()] = v.strip()
    except OSError:
        return []
    if cur:
        cpus.append(cur)
    return cpus


def _max_mhz() -> tuple[float | None, str]:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read()) / 1000, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    for c in _cpuinfo():
        if "cpu MHz" in c:
            return float(c["cpu MHz"]), "/proc/cpuinfo cpu MHz (current or nominal, no turbo)"
    return None, "unknown"


def flops_per_cycle(flags: set, vendor: str, family: int | None, model_name: str) -> tuple:
    """(float32 FLOP per cycle per core, the assumption it rests on)."""
    if "avx512f" in flags:
        if vendor == "AuthenticAMD":  # Zen 4 / 5 client: 512-bit ops on 256-bit pipes
            return 32, "AVX-512 on two 256-bit FMA pipes (Zen 4 style): 2×8×2"
        one_pipe = any(s in model_name for s in ("Silver", "Bronze"))
        if one_pipe:
            return 32, "AVX-512, one 512-bit FMA pipe (Xeon Silver/Bronze): 1×16×2"
        return 64, "AVX-512, two 512-bit FMA pipes: 2×16×2"
    if "avx2" in flags and "fma" in flags:
        return 32, "AVX2, two 256-bit FMA pipes: 2×8×2"
    if "avx" in flags:
        return 16, "AVX without FMA: one 8-wide add + one 8-wide multiply"
    if "asimd" in flags or platform.machine() in ("aarch64", "arm64"):
        if "sve" in flags:
            return 32, "SVE, assumed 2×256-bit FMA pipes (Neoverse V1 style): 2×8×2"
        return 16, "NEON, assumed two 128-bit FMA pipes: 2×4×2"
    return 8, "SSE: one 4-wide add + one 4-wide multiply"


def describe() -> dict:
    """CPU model, family / model / stepping, SIMD flags, cores, clock and the peak estimate."""
    cpus = _cpuinfo()
    c0 = cpus[0] if cpus else {}
    flags = set((c0.get("flags") or c0.get("Features") or "").split())
    vendor = c0.get("vendor_id", c0.get("CPU implementer", ""))
    name = c0.get("model name") or c0.get("Hardware") or platform.processor() or "unknown"

    def num(key):
        v = c0.get(key)
        try:
            return int(v, 0)
        except (TypeError, ValueError):
            return None

    physical = {(c.get("physical id"), c.get("core id")) for c in cpus if "core id" in c}
    logical = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = logical
    cores = len(physical) or logical
    cores = min(cores, usable) if usable else cores
    mhz, clock_src = _max_mhz()
    fpc, assumption = flops_per_cycle(flags, vendor, num("cpu family"), name)
    peak = cores * fpc * mhz / 1000 if mhz else None
    return {
        "model_name": name,
        "vendor": vendor,
        "family": num("cpu family"),
        "model": num("model"),
        "stepping": num("stepping"),
        "arm_part": c0.get("CPU part"),
        "machine": platform.machine(),
        "simd": [f for f in SIMD_FLAGS if f in flags],
        "hypervisor": "hypervisor" in flags,
        "logical_cores": logical,
        "physical_cores": len(physical) or None,
        "usable_cores": usable,
        "clock_mhz": mhz,
        "clock_source": clock_src,
        "fp32_flops_per_cycle": fpc,
        "fp32_peak_assumption": assumption,
        "fp32_peak_gflops_estimate": peak,
        "peak_cores": cores,
    }


def summary(d: dict) -> str:
    """One Markdown sentence for a report header."""
    fam = (
        f"family {d['family']} model {d['model']} stepping {d['stepping']}"
        if d["family"] is not None
        else (f"part {d['arm_part']}" if d["arm_part"] else "")
    )
    peak = d["fp32_peak_gflops_estimate"]
    return (
        f"CPU: {d['model_name']} ({d['vendor']} {fam}{', VM' if d['hypervisor'] else ''}); "
        f"SIMD {' '.join(d['simd']) or '-'}; {d['logical_cores']} logical / "
        f"{d['physical_cores'] or '?'} physical cores ({d['usable_cores']} usable). "
        f"Theoretical float32 peak, an estimate: {d['peak_cores']} cores × "
        f"{d['fp32_flops_per_cycle']} FLOP/cycle ({d['fp32_peak_assumption']}) × "
        f"{(d['clock_mhz'] or 0) / 1000:.2f} GHz ({d['clock_source']}) = "
        + (f"**{peak:.0f} GFLOP/s**." if peak else "unknown.")
    )


# ----------------------------------------------------------------------------- GEMM peaks
def gemm_peak(fw: str, sizes=(1024, 2048), reps: int = 5, threads: int | None = None) -> dict:
    """Best float32 n×n @ n×n GFLOP/s per n (best repetition: load only slows a GEMM)."""
    import numpy as np

    if threads:
        from threadpoolctl import threadpool_limits

        limits = threadpool_limits(limits=threads)  # noqa: F841 - kept alive for the calls
    out = {}
    for n in sizes:
        g = np.random.default_rng(0)
        a, b = (g.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        if fw == "torch":
            import torch

            if threads:
                torch.set_num_threads(threads)
            a, b = torch.from_numpy(a), torch.from_numpy(b)
        a @ b  # warm-up: thread pools start, pages fault in
        best = min(_timed(lambda a=a, b=b: a @ b) for _ in range(reps))
        out[str(n)] = 2 * n**3 / best / 1e9
    return {"gflops": out, "peak_gflops": max(out.values())}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measured_peaks(threads: int | None = None, sizes=(1024, 2048), reps: int = 5) -> dict:
    """NumPy's and (when installed) torch's GEMM peaks, torch in a separate process."""
    res = {"numpy": gemm_peak("numpy", sizes, reps, threads)}
    code = (
        f"import json, benchmarks.machine as m; "
        f"print(json.dumps(m.gemm_peak('torch', {tuple(sizes)!r}, {reps}, {threads!r})))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    res["torch"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="BLAS / torch threads (default: all)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    d = describe()
    d["gemm"] = measured_peaks(args.threads, reps=args.reps)
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(summary(d))
    peak = d["fp32_peak_gflops_estimate"]
    for fw, r in d["gemm"].items():
        if r is None:
            print(f"{fw}: not installed")
            continue
        share = f" ({100 * r['peak_gflops'] / peak:.0f}% of the estimate)" if peak else ""
        sizes = ", ".join(f"n={n}: {v:.0f}" for n, v in r["gflops"].items())
        print(f"{fw} float32 GEMM peak: {r['peak_gflops']:.0f} GFLOP/s{share} [{sizes}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
