"""How many threads the CPU's two pools run: measured on the machine as it is now.

A step's matrix products run on NumPy's OpenBLAS threads and its kernels on numba's. On a
quiet machine every core helps. On a busy one, a product split over two threads waits for
the one the scheduler has not run yet: with both cores of a 2-vCPU Zen 4 VM (family 25
model 17) kept busy by other jobs, char-small's compiled forward took 110 ms on 2 OpenBLAS
threads and 8.9 ms on 1; PyTorch's took 6.6. The right count is not the core count, and it
changes while a run goes on.

So it is measured. Each replay of a compiled forward ticks the governor: the calls of one
forward under one grad mode in one thread drive it (a training step each, or a sampled
token), and a training forward takes it over from an evaluation's. After WARMUP ticks, the
time from one tick to the next is measured under each setting of ``Governor.settings()``
(each pool at every core or at one) in turn, ROUNDS times; the fastest median is kept, and
``choice()`` says it in one line. When the time between ticks drifts from that median by
DRIFT either way, it measures again (at most once every RETRY ticks). What the code
computes does not change with the setting: OpenBLAS splits a product over its rows and
columns, never along its sums, and the kernels sum in blocks of a fixed size
(tests/test_kernel_determinism.py, tests/test_threads.py).

``TG_THREADS=N`` in the environment, or ``tensorgrad.set_num_threads(N)`` (PyTorch's name),
pins both pools at N and turns the measuring off; a pool pinned by its own variable
(OPENBLAS_NUM_THREADS / OMP_NUM_THREADS for OpenBLAS, TG_KERNEL_THREADS for the kernels)
keeps its count and only the other is measured. Eager code (not compiled) never ticks it.

Imports: os, statistics, threading, time, .cpu_blas.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from . import cpu_blas

WARMUP = 3  # ticks before measuring (the first replays compile generated kernels)
ROUNDS = 3  # intervals measured per setting
WINDOW = 9  # intervals of the kept setting whose median is watched for drift
DRIFT = 1.5  # a median this many times slower (or faster) than measured: measure again
RETRY = 100  # ticks between two measurings, at least
STALE_S = 10.0  # a forward not called for this long gives the governor up to another

_CORES = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return max(1, int(v)) if v.isdigit() else None


class Governor:
    """The measuring (one per process: ``GOVERNOR``). ``apply(blas, kernels)`` sets the
    pools; ``clock`` and ``settings`` are there for the tests."""

    def __init__(self, settings=None, apply=None, clock=time.perf_counter):
        self.clock, self._apply = clock, apply
        self._settings = settings
        self.blas = cpu_blas.blas_threads()  # OpenBLAS's count at the start: its pool's size
        self.pinned = _env_int("TG_THREADS")  # TG_THREADS=N: both pools at N
        self.kernels: int | None = None  # the kernels' count now (None: every core)
        self.lock = threading.Lock()
        self.owner, self.owner_grad, self.last, self.seen = None, False, 0.0, 0
        self.phase, self.schedule, self.i, self.times = "warmup", [], 0, {}
        self.recent: list[float] = []
        self.kept, self.base, self.measured_at, self.news = None, 0.0, -RETRY, None
        if self.pinned is not None:
            self.set(self.pinned, self.pinned)

    # ------------------------------------------------------------------ settings
    def settings(self) -> list[tuple]:
        """The (OpenBLAS, kernels) thread counts tried, every core first: a pool pinned by
        its own variable, or one whose count cannot be set, keeps what it has."""
        if self._settings is not None:
            return list(self._settings)
        blas = self.blas  # (not the count now, which a setting tried may have lowered)
        pinned_blas = any(_env_int(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"))
        b = [None] if blas is None or pinned_blas or blas == 1 else [blas, 1]
        k = [None] if _env_int("TG_KERNEL_THREADS") or _CORES == 1 else [_CORES, 1]
        return [(x, y) for x in b for y in k]

    def set(self, blas: int | None, kernels: int | None) -> None:
        """Set the pools (None: leave that one as it is)."""
        if self._apply is not None:
            self._apply(blas, kernels)
            return
        if blas is not None:
            cpu_blas.set_blas_threads(blas)
        if kernels is not None:
            self.kernels = kernels

    def pin(self, n: int) -> None:
        """Both pools at n from now on; no more measuring (``tensorgrad.set_num_threads``)."""
        with self.lock:
            self.pinned = max(1, int(n))
            self.set(self.pinned, self.pinned)

    # ------------------------------------------------------------------ ticks
    def tick(self, key, grad: bool = True) -> None:
        """A call of a compiled forward (``key``: which forward, grad mode, thread; ``grad``:
        a training call, which takes the governor over from one that is not)."""
        if self.pinned is not None:
            return
        now = self.clock()
        with self.lock:
            if key != self.owner:
                if self.owner is not None and now - self.last < STALE_S:
                    if not grad or self.owner_grad:
                        return  # another forward drives it
                self.owner, self.owner_grad, self.seen, self.phase = key, grad, 0, "warmup"
                self.last = now
                return
            dt, self.last = now - self.last, now
            self.seen += 1
            if self.phase == "warmup":
                if self.seen >= WARMUP:
                    self._measure()
            elif self.phase == "measure":
                self.times[self.schedule[self.i]].append(dt)
                self.i += 1
                if self.i < len(self.schedule):
                    self.set(*self.schedule[self.i])
                else:
                    self._keep()
            else:
                self.recent = (self.recent + [dt])[-WINDOW:]
                if len(self.recent) == WINDOW and self.seen - self.measured_at >= RETRY:
                    m = statistics.median(self.recent)
                    if m > DRIFT * self.base or m * DRIFT < self.base:
                        self._measure()

    def _measure(self) -> None:
        settings = self.settings()
        if len(settings) < 2:
            self.phase = "off"  # one core, or every pool pinned: nothing to choose
            return
        self.phase, self.i, self.measured_at = "measure", 0, self.seen
        self.schedule = settings * ROUNDS
        self.times = {s: [] for s in settings}
        self.set(*self.schedule[0])

    def _keep(self) -> None:
        medians = {s: statistics.median(ts) for s, ts in self.times.items()}
        best = min(medians, key=medians.get)
        self.set(*best)
        again = self.kept is not None
        self.kept, self.base, self.phase, self.recent = best, medians[best], "run", []
        tried = ", ".join(f"{_name(s)} {m * 1e3:.1f}" for s, m in medians.items())
        self.news = (
            f"threads: {_name(best, long=True)}, the fastest of {len(medians)} settings "
            f"{'measured again' if again else 'measured'} over {len(self.schedule)} calls "
            f"(ms per call, OpenBLAS/kernels: {tried}); TG_THREADS=N pins them"
        )

    def choice(self) -> str | None:
        """The last choice, in one line, once (None if nothing new was chosen)."""
        with self.lock:
            news, self.news = self.news, None
        return news


def _name(s: tuple, long: bool = False) -> str:
    blas, kernels = (x if x is not None else "-" for x in s)
    return f"OpenBLAS {blas}, kernels {kernels}" if long else f"{blas}/{kernels}"


GOVERNOR = Governor()


def kernel_threads(default: int) -> int:
    """The numba kernels' thread count now: TG_KERNEL_THREADS, else pinned or measured,
    else ``default`` (every core)."""
    env = _env_int("TG_KERNEL_THREADS")
    if env is not None:
        return env
    return GOVERNOR.kernels if GOVERNOR.kernels is not None else default


def tick(key, grad: bool = True) -> None:
    GOVERNOR.tick(key, grad)


def choice() -> str | None:
    """What the governor chose last and why, in one line, once; None if nothing new."""
    return GOVERNOR.choice()


def set_num_threads(n: int) -> None:
    """Both pools (OpenBLAS's products and the numba kernels) at n threads, measured no more
    (``torch.set_num_threads``)."""
    GOVERNOR.pin(n)


def get_num_threads() -> int:
    """The threads a product runs on now (``torch.get_num_threads``): OpenBLAS's count where
    it can be read, else the kernels'."""
    blas = cpu_blas.blas_threads()
    return blas if blas is not None else kernel_threads(_CORES)
