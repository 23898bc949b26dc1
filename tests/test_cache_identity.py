"""A run is the same run whether its CPU kernels were compiled in the process or loaded from
numba's cache (issue 49, item 4).

numba compiles a ``parallel=True`` kernel's loop body, and each jitted function a kernel
calls, twice: in a library of its own and again inside its caller's. The process that
compiles runs the first copy; the cache keeps the second, which every later process loads.
While the kernels were compiled with ``reassoc`` fast-math, LLVM ordered the two copies'
sums differently (``out += x + b`` as ``(out + b) + x`` in one, the LayerNorm backward's row
sums): gpt-train's losses from a fresh cache and from a warm one parted in their last bits
(tensorgrad/kernels/numba_math.py, "One computation").

Each run here is a subprocess with its own NUMBA_CACHE_DIR: empty for the first (which
compiles every kernel it meets: the one slow part, 20-35 s on a 2-core machine; the two cold
runs start side by side), the same directory for the next ones, which must compile nothing
(no cache file written or changed) and give the same bits.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: pip install numba")

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # tests/test_train.py's tiny model, dropout included
    *("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"),
    *("--batch-size", "4", "--eval-iters", "2", "--dropout", "0.1", "--warmup-iters", "2"),
    *("--no-sample", "--eval-interval", "3", "--lr-decay-iters", "6"),
]
TIMES = ("tokens_per_s", "elapsed_s")  # the only fields of metrics.jsonl that may differ


def env_with(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "NUMBA_"))}
    env.update(
        NUMBA_CACHE_DIR=str(cache),
        TG_KERNELS="1",  # (the kernels are what is compared, under TG_KERNELS=0 too)
        PYTHONPATH=str(ROOT),  # this tree's tensorgrad, whatever is installed
    )
    return env


def cache_files(cache: Path) -> dict:
    """Every file of a numba cache directory: its size and modification time."""
    return {
        str(p.relative_to(cache)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in cache.rglob("*")
        if p.is_file()
    }


class Run:
    """``cmd`` started in a subprocess with numba's cache in ``cache``. ``compiles``: the cache
    is empty and the run must fill it; else the run must find every kernel there (no cache
    file written or changed). ``output()`` waits for it and returns its stdout."""

    def __init__(self, cmd: list, cache: Path, extra_env: dict | None = None, compiles=False):
        self.cache, self.compiles, self.before = cache, compiles, cache_files(cache)
        assert compiles == (not self.before), f"{cache}: expected {'no' if compiles else 'a'} cache"
        env = env_with(cache)
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def output(self) -> str:
        out, err = self.proc.communicate(timeout=600)
        assert self.proc.returncode == 0, err[-3000:]
        after = cache_files(self.cache)
        if self.compiles:
            assert after, "the first run cached no kernel"
        else:
            changed = sorted(k for k in after if self.before.get(k) != after[k])
            assert not changed, f"a warm run compiled kernels again: {changed}"
        return out


BITS = [sys.executable, str(ROOT / "tests" / "kernel_bits.py")]


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """Both cold runs, started side by side (each compiles on one core for 20-35 s): every
    kernel of tests/kernel_bits.py, and gpt-train's first leg (3 of 6 steps, a checkpoint at
    3) on a small corpus. Yields (the kernel_bits run, its cache, a train(out, *args) that
    runs gpt-train with the leg's cache, the leg's run, its folder, the work folder)."""
    d = tmp_path_factory.mktemp("cache_identity")
    corpus = d / "corpus"
    corpus.mkdir()
    rnd = random.Random(0)
    words = "the king and queen of a far land rode out at dawn to see what lay beyond".split()
    for name in ("a.txt", "b.txt"):
        lines = (" ".join(rnd.choice(words) for _ in range(10)) for _ in range(60))
        (corpus / name).write_text("\n".join(lines) + "\n")
    bits_cache, train_cache = d / "numba-bits", d / "numba-train"
    bits_cache.mkdir()
    train_cache.mkdir()
    data_env = {"GPT_CACHE_DIR": str(d / "data")}

    def train(out: Path, *args: str, compiles: bool = False) -> Run:
        cmd = [sys.executable, "-m", "gpt.train", "--data", str(corpus), "--out-dir", str(out)]
        return Run([*cmd, *TINY, *args], train_cache, data_env, compiles=compiles)

    bits = Run(BITS, bits_cache, compiles=True)
    first = train(d / "cold", "--max-iters", "3", compiles=True)
    yield bits, bits_cache, train, first, d / "cold", d
    for run in (bits, first):
        if run.proc.poll() is None:  # (a test that failed before waiting for it)
            run.proc.kill()
            run.proc.communicate()


def test_every_cpu_kernel_gives_the_same_bits_compiled_or_loaded(cold):
    """tests/kernel_bits.py (every CPU kernel that sums, forward and backward, and compile's
    generated kernels): hashes of each output with a cold cache, then with the warm one."""
    bits, cache = cold[:2]
    cold_run, warm_run = json.loads(bits.output()), json.loads(Run(BITS, cache).output())
    compiled, loaded = cold_run["hashes"], warm_run["hashes"]
    # (and tensorgrad.kernels.compile_counts, which gpt-train's first-step line reads, says so)
    assert cold_run["counts"]["compiled"] > 20 and cold_run["counts"]["loaded"] == 0
    assert warm_run["counts"]["compiled"] == 0 and warm_run["counts"]["loaded"] > 20
    # (fewer loaded than compiled: a jitted helper that only kernels call compiles with them
    # when they compile, and is inside them when they load)
    assert len(compiled) > 80 and loaded.keys() == compiled.keys()
    differ = sorted(k for k in compiled if compiled[k] != loaded[k])
    assert not differ, f"loaded from the cache, not the bits compiled in the process: {differ}"


@pytest.fixture(scope="module")
def legs(cold):
    """gpt-train's first leg, finished: (train, its folder, the work folder)."""
    _, _, train, first, out, d = cold
    first.output()
    return train, out, d


def records(out: Path) -> list:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in lines]


def same_records(a: list, b: list) -> None:
    """Two runs' metrics.jsonl (times aside) equal, the first difference named."""
    for ra, rb in zip(a, b):
        assert ra == rb, f"iter {ra.get('iter')}: {ra} != {rb}"
    assert len(a) == len(b)


def same_weights(a: Path, b: Path) -> None:
    from gpt.store import run_checkpoint as rc

    ca, wa, oa = rc.load(a)
    cb, wb, ob = rc.load(b)
    assert ca["iter"] == cb["iter"] and wa.keys() == wb.keys()
    for name in wa:
        np.testing.assert_array_equal(wa[name], wb[name], err_msg=name)
    assert oa["state"].keys() == ob["state"].keys()
    for k, sa in oa["state"].items():  # AdamW's moments
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(sa[key], ob["state"][k][key], err_msg=f"{k} {key}")


def test_gpt_train_is_the_same_run_with_an_empty_or_a_warm_kernel_cache(legs):
    """The first leg's command again, its kernels now loaded from the cache: every loss,
    gradient norm, evaluation and weight the same, bit for bit."""
    train, first, d = legs
    warm = d / "warm"
    train(warm, "--max-iters", "3").output()
    assert [r["iter"] for r in records(first) if "loss" in r] == [0, 1, 2]
    same_records(records(warm), records(first))
    same_weights(first, warm)


def test_resume_is_exact_across_a_fresh_cache_leg_and_a_warm_cache_leg(legs):
    """The cold first leg resumed with the warm cache repeats an uninterrupted run."""
    train, first, d = legs
    split = d / "split"
    shutil.copytree(first, split)
    resume = [sys.executable, "-m", "gpt.train", "--resume", "--out-dir", str(split)]
    Run(
        [*resume, "--max-iters", "6"], d / "numba-train", {"GPT_CACHE_DIR": str(d / "data")}
    ).output()
    full = d / "full"
    train(full, "--max-iters", "6").output()
    assert [r["iter"] for r in records(full) if "loss" in r] == list(range(6))
    same_records(records(split), records(full))
    same_weights(split, full)


SOFTMAX = (
    "import json, numpy as np; from tensorgrad import kernels; "
    "from tensorgrad.kernels import cpu_numba as K; x = np.ones((2, 3), np.float32); "
    "K._softmax_fwd(x, np.empty_like(x)); print(json.dumps(kernels.compile_counts()))"
)


def test_an_edit_to_an_inlined_formula_is_not_served_from_the_cache(tmp_path):
    """A kernel inlines kernels/formulas.py's functions, and numba checks a cached kernel
    against its own file only: an edit to formulas.py left every kernel that inlines it
    running the old formula from the cache. The cache stamp carries a digest of every file a
    kernel may inline (numba_math.SOURCES), so the edit compiles again."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "tensorgrad", tree / "tensorgrad", ignore=shutil.ignore_patterns("__pycache__")
    )
    cache = tmp_path / "numba"
    cache.mkdir()

    def counts() -> dict:
        env = env_with(cache)
        env["PYTHONPATH"] = str(tree)
        out = subprocess.run(
            [sys.executable, "-c", SOFTMAX], env=env, cwd=tree, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    assert counts()["compiled"] > 0
    assert counts() == {"compiled": 0, "loaded": 1, "generated": 0}
    formulas = tree / "tensorgrad" / "kernels" / "formulas.py"
    formulas.write_text(formulas.read_text() + "\n# an edit\n")
    assert counts()["compiled"] > 0, "the kernel came from the cache after its formula changed"
