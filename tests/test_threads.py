"""The thread governor (tensorgrad/kernels/threads.py, issue 52): it measures each setting
over the calls of one compiled forward, keeps the fastest median, measures again when the
time per call drifts for good (not for one slow window, not more often than RETRY), hands
over between forwards without measuring twice, leaves pinned pools alone and a user's own
limit standing; and the setting never changes what is computed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.kernels import cpu_blas, threads
from tensorgrad.kernels.threads import RETRY, ROUNDS, STALE_S, WARMUP, WINDOW, Governor

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [(2, 2), (2, 1), (1, 2), (1, 1)]
BUSY = {(2, 2): 0.110, (2, 1): 0.100, (1, 2): 0.009, (1, 1): 0.006}  # a core busy elsewhere
QUIET = {(2, 2): 0.001, (2, 1): 0.0015, (1, 2): 0.0015, (1, 1): 0.002}
PINS = ("TG_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")


@pytest.fixture(autouse=True)
def _no_pins(monkeypatch):
    for v in (*PINS, "TG_KERNEL_THREADS", "NUMBA_NUM_THREADS"):
        monkeypatch.delenv(v, raising=False)
    # the fake machines' OpenBLAS computes the same bits on any count (a real one: the
    # subprocess test at the end)
    monkeypatch.setattr(cpu_blas, "bits_follow_threads", lambda n: False)


class Machine:
    """A fake clock whose call takes ``cost[setting]`` seconds under the setting applied."""

    def __init__(self, cost):
        self.cost, self.now, self.setting, self.applied = dict(cost), 0.0, SETTINGS[0], []

    def apply(self, blas, kernels):
        self.setting = (blas, kernels)
        self.applied.append(self.setting)

    def clock(self):
        return self.now

    def calls(self, gov, n, key="fwd", grad=True):
        for _ in range(n):
            self.now += self.cost[self.setting]
            gov.tick(key, grad)


def governor(machine) -> Governor:
    return Governor(settings=SETTINGS, apply=machine.apply, clock=machine.clock)


def settle(m, gov, key="fwd", grad=True) -> None:
    """Warm-up, the measuring, and the kept setting's first window (its baseline)."""
    m.calls(gov, 1 + WARMUP + len(SETTINGS) * ROUNDS + WINDOW, key, grad)
    gov.choice()


# ----------------------------------------------------------------------------- choosing
def test_it_keeps_the_fastest_setting_and_says_so():
    m = Machine(BUSY)
    gov = governor(m)
    m.calls(gov, 1 + WARMUP + len(SETTINGS) * ROUNDS)
    assert m.setting == (1, 1) and gov.kept == (1, 1)
    assert sorted(m.applied[: len(SETTINGS)]) == sorted(SETTINGS)  # each tried
    line = gov.choice()
    assert line.startswith("threads: OpenBLAS 1, kernels 1, the fastest of 4 settings")
    assert "2/2 110.0" in line and "1/1 6.0" in line and "TG_THREADS=N" in line
    assert gov.choice() is None  # said once


def test_the_first_calls_are_not_measured():
    m = Machine(BUSY)
    gov = governor(m)
    m.calls(gov, WARMUP)  # the first call takes it, then WARMUP - 1 intervals
    assert m.applied == []
    m.calls(gov, 1)
    assert m.applied == [SETTINGS[0]] and gov.phase == "measure"


def test_a_median_is_kept_not_one_slow_call():
    m = Machine(BUSY)
    gov = governor(m)
    m.calls(gov, 1 + WARMUP)
    first = [True]
    for _ in range(len(SETTINGS) * ROUNDS):
        slow = m.setting == (1, 1) and first[0]  # (1, 1)'s first call waited on the disk
        first[0] = first[0] and not slow
        m.now += 1.0 if slow else m.cost[m.setting]
        gov.tick("fwd")
    assert gov.kept == (1, 1)


# ----------------------------------------------------------------------------- drift
def test_it_measures_again_when_the_machine_changes():
    m = Machine(BUSY)
    gov = governor(m)
    settle(m, gov)
    m.calls(gov, RETRY)  # steady: nothing new
    assert gov.choice() is None and m.setting == (1, 1)
    m.cost = dict(QUIET)  # the other program stopped: 6 ms -> 2 ms a call
    m.calls(gov, WINDOW)  # one window drifted: not yet
    assert gov.phase == "run"
    m.calls(gov, WINDOW)  # two in a row: measure
    assert gov.phase == "measure"
    m.calls(gov, len(SETTINGS) * ROUNDS)
    assert m.setting == (2, 2) and "measured again" in gov.choice()
    m.calls(gov, WINDOW)  # the new setting's first window: its baseline
    m.cost = {s: c * 10 for s, c in BUSY.items()}  # and slower than that: again
    m.calls(gov, RETRY + 2 * WINDOW + len(SETTINGS) * ROUNDS)
    assert m.setting == (1, 1) and "measured again" in gov.choice()


def test_one_slow_window_is_not_a_drift_and_drifts_wait_for_retry():
    m = Machine(BUSY)
    gov = governor(m)
    settle(m, gov)
    slow = {s: c * 3 for s, c in BUSY.items()}
    m.cost = slow
    m.calls(gov, WINDOW)  # an evaluation, a checkpoint written
    m.cost = dict(BUSY)
    m.calls(gov, 3 * WINDOW)
    assert gov.phase == "run" and gov.drifted == 0
    m.cost = slow  # lasting, but fewer than RETRY calls after the last measuring
    assert gov.seen - gov.measured_at + 2 * WINDOW < RETRY
    m.calls(gov, 2 * WINDOW)
    assert gov.phase == "run" and gov.measured_at == WARMUP
    m.calls(gov, RETRY)
    assert gov.measured_at > WARMUP  # measured again once RETRY calls had passed


def test_the_same_choice_again_doubles_the_spacing():
    m = Machine(BUSY)
    gov = governor(m)
    settle(m, gov)
    assert gov.retry == RETRY
    gov.base = 0.001  # as if the first window had been quick: every window reads as drift
    m.calls(gov, RETRY + 2 * WINDOW + len(SETTINGS) * ROUNDS)
    assert gov.kept == (1, 1) and gov.retry == 2 * RETRY


# ----------------------------------------------------------------------------- forwards
def test_only_one_forward_drives_it():
    m = Machine(BUSY)
    gov = governor(m)
    for _ in range(1 + WARMUP + len(SETTINGS) * ROUNDS):
        m.now += m.cost[m.setting]
        gov.tick("train")
        gov.tick("other")  # another training forward between: ignored while the first runs
    assert gov.owner == "train" and gov.kept == (1, 1)
    m.now += STALE_S + 1  # the first is called no more: the other takes it over
    gov.tick("other")
    assert gov.owner == "other"


def test_a_training_forward_takes_it_over_from_an_evaluation():
    m = Machine(BUSY)
    gov = governor(m)
    m.calls(gov, 1 + WARMUP + 2, key="eval", grad=False)  # gpt-train evaluates first
    assert gov.owner == "eval" and gov.phase == "measure"
    m.calls(gov, 1, key="train")  # at once; the measuring it broke off is undone
    assert gov.owner == "train" and gov.phase == "warmup" and m.setting == SETTINGS[0]
    m.calls(gov, 1, key="eval", grad=False)  # an evaluation during training does not
    assert gov.owner == "train"


def test_a_forward_that_measured_resumes_its_setting():
    m = Machine(BUSY)
    gov = governor(m)
    settle(m, gov)  # training kept (1, 1)
    m.now += STALE_S + 1  # a long evaluation takes it over and measures for itself
    m.cost = {s: 0.05 for s in SETTINGS}
    settle(m, gov, key="eval", grad=False)
    assert gov.owner == "eval" and gov.kept == (2, 2)
    n = len(m.applied)
    m.calls(gov, 2)  # training again: its own setting back, nothing measured, nothing said
    assert gov.owner == "fwd" and m.setting == (1, 1) and gov.phase == "run"
    assert m.applied[n:] == [(1, 1)] and gov.choice() is None


# ----------------------------------------------------------------------------- pins
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
    monkeypatch.setenv("TG_THREADS", "²")  # not a number: ignored, not a crash at import
    assert Governor(settings=SETTINGS, apply=m.apply).pinned is None


def test_pools_pinned_by_their_own_variables_are_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 2)
    monkeypatch.setattr(threads, "_CORES", 2)
    gov = Governor()
    assert gov.settings() == SETTINGS
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 1)  # while (1, x) is tried
    assert gov.settings() == SETTINGS  # measured again: the pool's size, not the count now
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 2)
    for pin in PINS[1:]:
        monkeypatch.setenv(pin, "2")
        assert Governor().settings() == [(None, 2), (None, 1)], pin
        monkeypatch.delenv(pin)
    monkeypatch.setenv("NUMBA_NUM_THREADS", "1")  # numba's pool has one thread
    assert Governor().settings() == [(2, None), (1, None)]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert Governor().settings() == [(None, None)]  # nothing to choose: it stays off
    monkeypatch.delenv("NUMBA_NUM_THREADS")
    monkeypatch.setenv("TG_KERNEL_THREADS", "1")
    assert Governor().settings() == [(None, None)]


def test_the_pools_are_set_within_their_sizes_and_pins(monkeypatch):
    got = []
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 2)
    monkeypatch.setattr(cpu_blas, "set_blas_threads", got.append)
    monkeypatch.setattr(threads.GOVERNOR, "kernels", None)  # (earlier compiled tests' choice)
    gov = Governor()
    gov.set(1, 1)
    assert got == [1] and gov.kernels == 1 and threads.kernel_threads(2) == 2  # (not GOVERNOR)
    gov.set(8, None)  # never above the pool OpenBLAS started with
    assert got == [1, 2] and gov.kernels == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    gov.set(2, 2)  # the user's variable holds
    assert got == [1, 2] and gov.kernels == 2


def test_a_limit_set_by_someone_else_stands(monkeypatch):
    """threadpoolctl's limits (or any call) change OpenBLAS's count behind the governor's
    back: from then on the count is theirs and only the kernels are measured."""
    count = [2]
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: count[0])
    monkeypatch.setattr(cpu_blas, "set_blas_threads", lambda n: count.__setitem__(0, n))
    monkeypatch.setattr(threads, "_CORES", 2)
    now = [0.0]
    gov = Governor(clock=lambda: now[0])
    for _ in range(1 + WARMUP + 2):
        now[0] += 0.01
        gov.tick("fwd")
    assert gov.phase == "measure" and count[0] in (1, 2)
    count[0] = 1 if gov.blas_set == 2 else 2  # threadpool_limits(...) entered
    now[0] += 0.01
    gov.tick("fwd")
    assert gov.blas_user and gov.phase == "warmup"
    assert gov.settings() == [(None, 2), (None, 1)]
    held = count[0]
    for _ in range(1 + WARMUP + 2 * ROUNDS):
        now[0] += 0.01
        gov.tick("fwd")
    assert count[0] == held and gov.kept is not None


def test_openblas_stays_where_its_bits_follow_its_count(monkeypatch):
    """OpenBLAS's AVX2 kernels sum a thread's rows in another order: there the governor
    measures the kernels alone, so that a run repeats, and its line says why."""
    monkeypatch.setattr(cpu_blas, "blas_threads", lambda: 2)
    monkeypatch.setattr(cpu_blas, "bits_follow_threads", lambda n: True)
    monkeypatch.setattr(cpu_blas, "corename", lambda: "Haswell")
    monkeypatch.setattr(threads, "_CORES", 2)
    m = Machine({(None, 2): 0.002, (None, 1): 0.001})
    m.setting = (None, 2)
    gov = Governor(apply=m.apply, clock=m.clock)
    assert gov.settings() == [(None, 2), (None, 1)]
    m.calls(gov, 1 + WARMUP + 2 * ROUNDS)
    assert gov.kept == (None, 1) and all(b is None for b, _ in m.applied)
    line = gov.choice()
    assert "kernels 1, the fastest of 2 settings" in line
    assert line.endswith(
        "OpenBLAS stays at 2: its Haswell kernels compute other bits on another count, "
        "and the run would not repeat"
    )


def test_held_gives_openblas_its_count_back_once_the_last_hold_ends():
    n = cpu_blas.blas_threads()
    if n is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count can be set")
    with pytest.raises(RuntimeError):
        with cpu_blas.held(1):
            assert cpu_blas.blas_threads() == 1
            with cpu_blas.held(1):  # (another thread's attention, say)
                pass
            assert cpu_blas.blas_threads() == 1  # the inner hold did not give it back early
            raise RuntimeError
    assert cpu_blas.blas_threads() == n


def test_a_forked_child_starts_with_a_free_lock():
    gov = Governor(settings=SETTINGS, apply=lambda *a: None)
    gov.lock.acquire()  # another thread was inside tick when the process forked
    gov._reset()  # what os.register_at_fork runs in the child
    assert gov.lock.acquire(timeout=1) and gov.owner is None


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
from tensorgrad.kernels import cpu_blas, threads
from tensorgrad.kernels import cpu_numba as K
from gpt.model import GPT, GPTConfig

# "cycle": every setting the governor would try on this machine, a different one at every
# call (the governor measuring, at its worst); "first": the first setting throughout.
# B·T·C = 2**19 elements, so the kernels run parallel where they may
gov = threads.GOVERNOR
settings, used = gov.settings(), set()
cycle = sys.argv[1] == "cycle"


def tick(key, grad=True, i=[0]):
    gov.set(*settings[i[0] % len(settings) if cycle else 0])
    i[0] += 1
    used.add((cpu_blas.blas_threads(), K.kernel_threads()))


gov.tick = tick
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
print(gov.blas, int(cpu_blas.bits_follow_threads(gov.blas)), sorted(used))
"""


@pytest.mark.skipif(
    threads._CORES < 2, reason="one usable core: OpenBLAS's pool has one thread, nothing varies"
)
def test_a_compiled_training_step_is_the_same_on_any_setting():
    """Every setting the governor tries computes the same bits: the kernels' count always,
    OpenBLAS's where its kernels allow (on a Zen 3 VM, whose OpenBLAS runs its Haswell
    kernels, cycling OpenBLAS too changed the hash)."""
    if cpu_blas.blas_threads() is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count can be set")
    env = {k: v for k, v in os.environ.items() if k not in PINS}  # OpenBLAS's pool: the cores
    env.update(PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2")
    env.pop("TG_KERNEL_THREADS", None)
    out = {}
    for how in ("cycle", "first"):
        p = subprocess.run(
            [sys.executable, "-c", STEPS, how],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        out[how] = p.stdout.split(maxsplit=3)
    digest, pool, follow, used = out["cycle"]
    assert digest == out["first"][0]
    # each pool really ran at each count tried (a governor that set nothing would pass above)
    blas = [pool] if follow == "1" else [1, pool]
    assert used.strip() == str(sorted((int(b), k) for b in blas for k in (1, 2)))


def test_torch_names():
    n = tg.get_num_threads()
    assert n >= 1
    assert tg.set_num_threads is threads.set_num_threads
    assert np.isscalar(n)
