"""The CPU kernels give the same bits on any thread count (issue 53).

Each kernel that sums (LayerNorm's weight and bias gradients, cross-entropy, softmax and
log-softmax, the flash attention over rows or heads, the fused GPT-2 block, AdamW and its
foreach form, the embedding's backward, the generated kernels of tensorgrad.compile with
their bias-gradient sums) sums in blocks of a fixed number, never one per thread: a run
resumed on another machine, or with TG_KERNEL_THREADS changed, repeats the same numbers.
tests/kernel_bits.py runs them all in a fresh process at 1, 2 and 4 numba threads (more
threads than cores is allowed: the sums, not the speed, are compared) and prints a hash of
every output and gradient; the three must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="numba is not installed: pip install numba")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "kernel_bits.py"
THREADS = (1, 2, 4)


def bits(n: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_"))}
    env.update(
        TG_KERNEL_THREADS=str(n),
        NUMBA_NUM_THREADS=str(n),
        OPENBLAS_NUM_THREADS="2",  # the same in every run: only the kernels' threads change
        TG_KERNELS="1",  # (the kernels are what is compared, under TG_KERNELS=0 too)
        PYTHONPATH=str(ROOT),  # this tree's tensorgrad, whatever is installed
    )
    return subprocess.Popen(
        [sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_every_cpu_kernel_gives_the_same_bits_on_1_2_and_4_threads():
    runs = {n: bits(n) for n in THREADS}  # (side by side: each mostly loads cached kernels)
    results = {}
    for n, proc in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()
        results[n] = json.loads(out)
    for n, r in results.items():
        assert r["threads"] == n, f"TG_KERNEL_THREADS={n}: the kernels ran on {r['threads']}"
        assert r["fused"] and r["fused"][0] >= 1, f"nothing was fused: {r['fused']}"
    one = results[1]["hashes"]
    assert len(one) > 80
    for n in THREADS[1:]:
        other = results[n]["hashes"]
        assert other.keys() == one.keys()
        differ = sorted(k for k in one if one[k] != other[k])
        assert not differ, f"on {n} threads, not the bits of 1 thread: {', '.join(differ)}"
