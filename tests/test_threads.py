"""The thread governor (tensorgrad/kernels/threads.py, issue 52): it measures each setting
over the ticks of one compiled forward, keeps the fastest, measures again when the time per
call drifts, leaves pinned pools alone; and the setting never changes what is computed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.kernels import cpu_blas, threads
from tensorgrad.kernels.threads import DRIFT, RETRY, ROUNDS, WARMUP, WINDOW, Governor

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [(2, 2), (2, 1), (1, 2), (1, 1)]


class Machine:
    """A fake clock whose call takes ``cost[setting]`` seconds under the setting applied."""

    def __init__(self, cost):
        self.cost, self.now, self.setting, self.applied = dict(cost), 0.0, SETTINGS[0], []

    def apply(self, blas, kernels):
        self.setting = (blas, kernels)
        self.applied.append(self.setting)

    def clock(self):
        return self.now

    def calls(self, gov, n, key="fwd"):
        for _ in range(n):
            self.now += self.cost[self.setting]
            gov.tick(key)


def governor(machine, monkeypatch=None) -> Governor:
    return Governor(settings=SETTINGS, apply=machine.apply, clock=machine.clock)


def test_it_keeps_the_fastest_setting_and_says_so(monkeypatch):
    monkeypatch.delenv("TG_THREADS", raising=False)
    m = Machine({(2, 2): 0.110, (2, 1): 0.100, (1, 2): 0.009, (1, 1): 0.006})
    gov = governor(m)
    m.calls(gov, 1 + WARMUP + len(SETTINGS) * ROUNDS)
    assert m.setting == (1, 1) and gov.kept == (1, 1)
    assert sorted(m.applied[: len(SETTINGS)]) == sorted(SETTINGS)  # each tried
    line = gov.choice()
    assert line.startswith("threads: OpenBLAS 1, kernels 1, the fastest of 4 settings")
    assert "2/2 110.0" in line and "1/1 6.0" in line and "TG_THREADS=N" in line
    assert gov.choice() is None  # said once


def test_it_measures_again_when_the_machine_changes(monkeypatch):
    monkeypatch.delenv("TG_THREADS", raising=False)
    busy = {(2, 2): 0.110, (2, 1): 0.100, (1, 2): 0.009, (1, 1): 0.006}
    m = Machine(busy)
    gov = governor(m)
    m.calls(gov, 1 + WARMUP + len(SETTINGS) * ROUNDS)
    gov.choice()
    m.calls(gov, RETRY)  # steady: nothing new
    assert gov.choice() is None and m.setting == (1, 1)
    m.cost = {(2, 2): 0.002, (2, 1): 0.003, (1, 2): 0.003, (1, 1): 0.004}  # the load went
    m.calls(gov, WINDOW)  # 6 ms -> 4 ms is not a drift of DRIFT
    assert gov.phase == "run"
    m.cost = {s: c / 2 for s, c in m.cost.items()}  # 2 ms: it is
    assert 0.004 / 0.002 >= DRIFT
    m.calls(gov, WINDOW + len(SETTINGS) * ROUNDS)
    assert m.setting == (2, 2)
    assert "measured again" in gov.choice()


def test_only_one_forward_drives_it(monkeypatch):
    monkeypatch.delenv("TG_THREADS", raising=False)
    m = Machine({(2, 2): 0.05, (2, 1): 0.04, (1, 2): 0.03, (1, 1): 0.02})
    gov = governor(m)
    for _ in range(1 + WARMUP + len(SETTINGS) * ROUNDS):
        m.now += m.cost[m.setting]
        gov.tick("train")
        gov.tick("eval")  # another forward between: ignored while the first is called
    assert gov.owner == "train" and gov.kept == (1, 1)


def test_a_training_forward_takes_it_over_from_an_evaluation(monkeypatch):
    monkeypatch.delenv("TG_THREADS", raising=False)
    m = Machine({(2, 2): 0.05, (2, 1): 0.04, (1, 2): 0.03, (1, 1): 0.02})
    gov = governor(m)
    for _ in range(5):  # gpt-train evaluates first, under no_grad
        m.now += 0.01
        gov.tick("eval", grad=False)
    assert gov.owner == "eval"
    m.now += 0.01
    gov.tick("train", grad=True)
    assert gov.owner == "train" and gov.phase == "warmup"
    m.now += 0.01
    gov.tick("eval", grad=False)  # an evaluation in the middle of training does not
    assert gov.owner == "train"


def test_pinned_measures_nothing(monkeypatch):
    monkeypatch.setenv("TG_THREADS", "1")
    m = Machine({s: 0.01 for s in SETTINGS})
    gov = governor(m)
    assert m.applied == [(1, 1)]
    m.calls(gov, 50)
    assert m.applied == [(1, 1)] and gov.choice() is None
    monkeypatch.delenv("TG_THREADS")
    gov = governor(m)
    gov.pin(2)  # tensorgrad.set_num_threads
    m.calls(gov, 50)
    assert m.applied[-1] == (2, 2) and len(m.applied) == 2


def test_pools_pinned_by_their_own_variables_are_left_alone(monkeypatch):
    for v in ("TG_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "TG_KERNEL_THREADS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 2)
    monkeypatch.setattr(threads, "_CORES", 2)
    gov = Governor()
    assert gov.settings() == SETTINGS
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 1)  # while (1, x) is tried
    assert gov.settings() == SETTINGS  # measured again: the pool's size, not the count now
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 2)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert Governor().settings() == [(None, 2), (None, 1)]
    monkeypatch.setenv("TG_KERNEL_THREADS", "1")
    assert Governor().settings() == [(None, None)]  # nothing to choose: it stays off
    monkeypatch.setattr(threads, "_CORES", 1)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.delenv("TG_KERNEL_THREADS")
    assert Governor().settings() == [(2, None), (1, None)]


def test_blas_thread_count_is_set_at_run_time():
    n = cpu_blas.blas_threads()
    if n is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count can be set")
    try:
        assert cpu_blas.set_blas_threads(1) and cpu_blas.blas_threads() == 1
    finally:
        cpu_blas.set_blas_threads(n)
    assert cpu_blas.blas_threads() == n


# ----------------------------------------------------------------------------- the same bits
STEPS = """
import hashlib, sys
import numpy as np
import tensorgrad as tg
from tensorgrad.kernels import threads
from gpt.model import GPT, GPTConfig

cycle = sys.argv[1] == "cycle"
if cycle:  # a different setting at every call (the governor measuring, at its worst); B·T·C = 2**19
    # elements, so the kernels run parallel where they may
    gov = threads.GOVERNOR
    settings = [(2, 2), (2, 1), (1, 2), (1, 1)]
    gov.settings = lambda: settings
    gov.tick = lambda key, grad=True, i=[0]: (gov.set(*settings[i[0] % 4]), i.__setitem__(0, i[0] + 1))
tg.manual_seed(0)
cfg = GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=256, dropout=0.1)
model = tg.compile(GPT(cfg))
opt = tg.optim.AdamW(model.parameters(), lr=1e-3)
rng = np.random.default_rng(0)
h = hashlib.sha256()
for step in range(6):
    x = tg.tensor(rng.integers(0, 65, (32, 64)))
    y = tg.tensor(rng.integers(0, 65, (32, 64)))
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    h.update(np.float32(loss.item()).tobytes())
for p in model.parameters():
    h.update(p.array.tobytes())
print(h.hexdigest())
"""


def test_a_compiled_training_step_is_the_same_on_any_setting():
    env = {k: v for k, v in os.environ.items() if k not in ("TG_THREADS", "OMP_NUM_THREADS")}
    env.update(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="2", NUMBA_NUM_THREADS="2")
    env.pop("TG_KERNEL_THREADS", None)
    out = {}
    for how in ("cycle", "one"):
        if how == "one":
            env["TG_THREADS"] = "1"
        p = subprocess.run(
            [sys.executable, "-c", STEPS, how],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        out[how] = p.stdout.strip()
    assert out["cycle"] == out["one"]


def test_torch_names():
    n = tg.get_num_threads()
    assert n >= 1
    assert tg.set_num_threads is threads.set_num_threads
    assert np.isscalar(n)
