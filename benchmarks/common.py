"""What every benchmark worker shares: shapes, thread limits, timing, memory, machine info.

Timing: each figure is the median of ``reps`` repetitions after warm-up. The machine may be
shared, so every repetition also records how many cores *other* processes kept busy while it
ran (from /proc/stat minus this process's own CPU time); repetitions during which others used
more than ``NOISY_CORES`` are retried (at most ``reps`` extra) and left out of the median when
enough quiet ones exist. Memory: resident-set size and its high-water mark from
/proc/self/status; the mark is reset before a step by writing 5 to /proc/self/clear_refs.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time

# name -> (n_layer, n_head, n_embd, T, B, vocab_size)
SHAPES = {  # (n_layer, n_head, n_embd, T, B, vocab)
    "gpt-nano": (3, 3, 48, 6, 64, 10),  # minGPT's adder: per-op Python is the whole cost
    "char-small": (4, 4, 128, 64, 12, 65),
    "baby": (6, 6, 384, 256, 8, 65),
    "gpt2-124M": (12, 12, 768, 256, 2, 50304),
}
NOISY_CORES = 0.25  # other processes' busy cores above which a repetition counts as noisy
BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def gpt_config(shape: str, T: int | None = None, block_size: int | None = None):
    from gpt.config import GPTConfig

    L, H, C, T0, _, V = SHAPES[shape]
    T = T or T0
    return GPTConfig(
        block_size=block_size or max(T, 64),
        vocab_size=V,
        n_layer=L,
        n_head=H,
        n_embd=C,
        dropout=0.0,
        bias=True,
        gelu="tanh",
        tie_weights=True,
    )


def set_threads(n: int, torch_too: bool) -> None:
    """Limit NumPy's BLAS (threadpoolctl) and, when asked, torch's intra-op pool to n;
    tensorgrad's thread governor is pinned at n (benchmarks.busy measures it)."""
    from threadpoolctl import threadpool_limits

    global _limits
    _limits = threadpool_limits(limits=n)  # kept alive so that the limit holds
    if not torch_too:  # tensorgrad's numba kernels (and attention's head threads) use numba's
        import tensorgrad  # (first: its kernels start numba's pool passive, as in a user's
        # process; numba.set_num_threads before it would start it spinning)

        tensorgrad.set_num_threads(n)  # n threads, as asked: the governor measures not
        try:
            import numba

            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        except ImportError:
            pass
    if torch_too:
        import torch

        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass


# ----------------------------------------------------------------------------- CPU accounting
def _cpu_jiffies():
    """(busy jiffies of the whole machine, CPU jiffies of this process)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v) - v[3] - v[4]  # minus idle and iowait
    with open("/proc/self/stat") as f:
        s = f.read().rsplit(")", 1)[1].split()
    return busy, int(s[11]) + int(s[12])  # utime + stime


def others_cores(j0, j1, seconds: float) -> float:
    """Cores kept busy by other processes between two _cpu_jiffies() snapshots."""
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((j1[0] - j0[0]) - (j1[1] - j0[1])) / hz / max(seconds, 1e-9))


def measure(fn, reps: int, warmup: int = 1, min_rep_s: float = 0.0, setup=None) -> dict:
    """Median seconds per call of ``fn`` over quiet repetitions (see module docstring).

    Also cpu_s: the median CPU time of this process per call (all threads, spinning
    included); with one thread it is what the wall time would be on an idle machine.

    A repetition loops fn() enough times to last about ``min_rep_s`` (calibrated in warm-up);
    ``setup`` (untimed) runs before each repetition.
    """
    inner = 1
    for _ in range(max(warmup, 1 if min_rep_s else 0)):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        if min_rep_s:
            inner = max(inner, min(10_000, int(min_rep_s / max(dt, 1e-7)) + 1))
    runs = []  # (seconds per call, others' cores)
    cpu = []  # CPU seconds of this process per call (all its threads)
    quiet = []
    while len(quiet) < reps and len(runs) < 2 * reps:
        if len(runs) > reps and not quiet:
            break  # a constantly busy machine: retrying would only double the time
        if setup is not None:
            setup()
        gc.collect()
        j0 = _cpu_jiffies()
        c = time.process_time()
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        dt = time.perf_counter() - t
        cpu.append((time.process_time() - c) / inner)
        runs.append((dt / inner, others_cores(j0, _cpu_jiffies(), dt)))
        quiet = [r for r in runs if r[1] <= NOISY_CORES]
    used = quiet if len(quiet) >= max(1, (reps + 1) // 2) else runs
    times = [r[0] for r in used]
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "cpu_s": statistics.median(cpu),
        "times_s": [r[0] for r in runs],
        "others_cores": [round(r[1], 2) for r in runs],
        "reps_used": len(used),
        "reps_noisy": len(runs) - len(quiet),
        "inner": inner,
    }


# ----------------------------------------------------------------------------- memory
def proc_status() -> dict:
    """VmRSS and VmHWM of this process in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_growth(fn) -> dict:
    """Run fn once; how far the resident set rose above its size just before (MiB)."""
    gc.collect()
    before = proc_status()["VmRSS"]
    ok = reset_peak()
    fn()
    st = proc_status()
    return {
        "rss_before_mb": before,
        "peak_growth_mb": st["VmHWM"] - before,
        "rss_after_mb": st["VmRSS"],
        "peak_mb": st["VmHWM"],
        "hwm_reset": ok,
    }


# ----------------------------------------------------------------------------- machine
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info() -> list:
    from threadpoolctl import threadpool_info

    keep = ("internal_api", "version", "architecture", "num_threads", "threading_layer", "filepath")
    return [{k: d.get(k) for k in keep} for d in threadpool_info()]


def worker_info(torch_too: bool) -> dict:
    """What the measuring process runs on (its BLAS kernel depends on its environment)."""
    import numpy as np

    info = {
        "numpy": np.__version__,
        "blas": blas_info(),
        "env": {
            k: os.environ.get(k)
            for k in (
                *BLAS_ENV_VARS,
                "TG_NUM_THREADS",
                "TG_MALLOC_TUNING",
                "TG_BLAS_TUNING",
                "OPENBLAS_THREAD_TIMEOUT",
                "MALLOC_MMAP_THRESHOLD_",
                "MALLOC_TRIM_THRESHOLD_",
            )
        },
    }
    import sys

    if "tensorgrad" in sys.modules:
        import tensorgrad

        info["tg_malloc_tuned"] = tensorgrad.devices.malloc_tuned  # at import
        info["tg_blas_wait_tuned"] = tensorgrad.kernels.cpu_blas.blas_wait_tuned  # at import
        try:
            from tensorgrad.kernels import chunks as parallel

            info["tg_threads"] = parallel.num_threads()
        except ImportError:
            info["tg_threads"] = None
    if "numba" in sys.modules:
        import numba

        info["numba"] = {
            "version": numba.__version__,
            "threads": numba.get_num_threads(),
            "threading_layer": numba.config.THREADING_LAYER,
        }
    if torch_too:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_blas"] = "mkl" if torch.backends.mkl.is_available() else "other"
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info


def git_commit() -> str | None:
    """The checkout's HEAD commit, or None outside a git checkout."""
    import subprocess
    from pathlib import Path

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None
