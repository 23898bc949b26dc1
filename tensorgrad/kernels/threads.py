"""How many threads the CPU's two pools run: measured on the machine as it is now.

A step's matrix products run on NumPy's OpenBLAS threads and its kernels on numba's. On a
quiet machine every core helps. On a busy one, a product split over two threads waits for
the one the scheduler has not run yet: with both cores of a 2-vCPU Zen 4 VM (family 25
model 17) kept busy by other jobs, char-small's compiled forward took 110 ms on 2 OpenBLAS
threads and 8.9 ms on 1; PyTorch's took 6.6. The right count is not the core count, and it
changes while a run goes on.

So it is measured. Each replay of a compiled forward ticks the governor: the calls of one
forward under one grad mode in one thread drive it (a training step each, or a sampled
token); a training forward takes it over from an evaluation's at once, any other only after
STALE_S without a call, and a forward that measured before gets its setting back without
measuring again. After WARMUP ticks, the time from one tick to the next is measured under
each setting of ``Governor.settings()`` (each pool at every core or at one) in turn, ROUNDS
times; the fastest median is kept, and ``choice()`` says it in one line. The kept setting's
calls are watched in windows of WINDOW: two windows in a row whose median is DRIFT times
slower or faster than its first window's (a program started or stopped) measure again, at
least RETRY calls after the last measuring (twice that each time the same setting wins
again). What the code computes never changes with the setting: the kernels sum in blocks of a
fixed size (tests/test_kernel_determinism.py), and OpenBLAS's count is measured only where
its products come out the same on any count (``cpu_blas.bits_follow_threads``: its AVX-512
kernels, not its AVX2 ones); elsewhere it stays at its pool's size, so that a run repeats,
and the line says so (tests/test_threads.py).

``TG_THREADS=N`` in the environment, or ``tensorgrad.set_num_threads(N)`` (PyTorch's name),
pins both pools at N and turns the measuring off. A pool's own variable wins over both
(OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS for OpenBLAS, TG_KERNEL_THREADS
for the kernels; NUMBA_NUM_THREADS bounds them), and OpenBLAS is never set above the pool it
started with. A count that someone else sets at run time (threadpoolctl's
``threadpool_limits``) stands: from then on only the kernels are measured. Eager code (not
compiled) never ticks it. A forked child starts with no forward driving it.

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
    return max(1, int(v)) if v.isascii() and v.isdigit() else None


def _blas_pinned() -> bool:
    """OpenBLAS's count was set by its own variables, which it read at load."""
    return any(_env_int(v) for v in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"))


class Governor:
    """The measuring (one per process: ``GOVERNOR``). ``apply(blas, kernels)`` sets the
    pools; ``clock`` and ``settings`` are there for the tests."""

    def __init__(self, settings=None, apply=None, clock=time.perf_counter):
        self.clock, self._apply = clock, apply
        self._settings = settings
        self.blas = cpu_blas.blas_threads()  # OpenBLAS's count at the start: its pool's size
        self.blas_set: int | None = None  # the count this governor gave OpenBLAS last
        self.blas_user = False  # someone else set OpenBLAS's count since (threadpoolctl)
        self.blas_kept: int | None = None  # OpenBLAS kept at this count: its bits follow it
        self.pinned = _env_int("TG_THREADS")  # TG_THREADS=N: both pools at N
        self.kernels: int | None = None  # the kernels' count now (None: every core)
        self.known: dict = {}  # forward -> (setting kept, RETRY spacing): resumed, not measured
        self.news: str | None = None
        self._reset()
        if self.pinned is not None:
            self.set(self.pinned, self.pinned)

    def _reset(self) -> None:
        """No forward drives it (at the start, and in a forked child)."""
        self.lock = threading.Lock()
        self.owner, self.owner_grad, self.last, self.seen = None, False, 0.0, 0
        self.phase, self.schedule, self.i, self.times = "warmup", [], 0, {}
        self.kept, self.retry = None, RETRY
        self.recent, self.base, self.drifted, self.measured_at = [], None, 0, 0

    # ------------------------------------------------------------------ settings
    def settings(self) -> list[tuple]:
        """The (OpenBLAS, kernels) thread counts tried, every core first: a pool pinned by
        its own variable, or one whose count cannot be set, keeps what it has."""
        if self._settings is not None:
            return list(self._settings)
        blas = self.blas  # (not the count now, which a setting tried may have lowered)
        mine = blas is not None and blas > 1 and not _blas_pinned() and not self.blas_user
        if mine and cpu_blas.bits_follow_threads(blas):
            mine, self.blas_kept = False, blas  # another count would compute other bits
        b = [blas, 1] if mine else [None]
        numba = _env_int("NUMBA_NUM_THREADS")  # numba's pool: no more kernel threads than it
        cores = min(_CORES, numba) if numba else _CORES
        k = [None] if _env_int("TG_KERNEL_THREADS") or cores == 1 else [cores, 1]
        return [(x, y) for x in b for y in k]

    def set(self, blas: int | None, kernels: int | None) -> None:
        """Set the pools (None: leave that one as it is). OpenBLAS is never set above its
        pool's size at the start, nor where its own variables or another library set it."""
        if self._apply is not None:
            self._apply(blas, kernels)
            return
        if blas is not None and not _blas_pinned() and not self.blas_user and self.blas:
            self.blas_set = min(blas, self.blas)
            cpu_blas.set_blas_threads(self.blas_set)
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
        a training call). A training forward takes the governor over from an evaluation's
        at once; an evaluation takes it from training only after STALE_S without a call; a
        forward that had measured before resumes its setting without measuring again."""
        if self.pinned is not None:
            return
        now = self.clock()
        with self.lock:
            if key != self.owner:
                at_once = grad and not self.owner_grad  # training over an evaluation
                if self.owner is not None and not at_once and now - self.last < STALE_S:
                    return  # another forward drives it
                self._take(key, grad, now)
                return
            if self._blas_changed():
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
            elif self.phase == "run":
                self._watch(dt)

    def _take(self, key, grad: bool, now: float) -> None:
        """``key`` drives the governor from now on."""
        if self.phase == "measure":  # abandoned: the pools back as they were
            self.set(*(self.kept or self.schedule[0]))
        if grad and not self.owner_grad:
            self.news = None  # an evaluation's choice, before training began: not news
        self.owner, self.owner_grad, self.last, self.seen = key, grad, now, 0
        self.recent, self.base, self.drifted, self.measured_at = [], None, 0, 0
        self.kept, self.retry = self.known.get(key, (None, RETRY))
        if self.kept is not None:
            self.set(*self.kept)
            self.phase = "run"
        else:
            self.phase = "warmup"

    def _blas_changed(self) -> bool:
        """Whether someone else set OpenBLAS's count since this governor did (threadpoolctl's
        limits, a user's call): that count holds from now on, and the kernels alone are
        measured again."""
        if self.blas_set is None or self._apply is not None:
            return False
        if cpu_blas.blas_threads() == self.blas_set:
            return False
        self.blas_user, self.blas_set = True, None
        self.known.clear()
        self.phase, self.seen, self.kept = "warmup", 0, None
        return True

    def _watch(self, dt: float) -> None:
        """The kept setting's calls, in windows of WINDOW: measure again after two windows in
        a row whose median drifted from the first window's by DRIFT, RETRY calls apart."""
        self.recent.append(dt)
        if len(self.recent) < WINDOW:
            return
        m, self.recent = statistics.median(self.recent), []
        if self.base is None:
            self.base = m
        elif m > DRIFT * self.base or m * DRIFT < self.base:
            self.drifted += 1
            if self.drifted >= 2 and self.seen - self.measured_at >= self.retry:
                self._measure()
        else:
            self.drifted = 0

    def _measure(self) -> None:
        settings = self.settings()
        if len(settings) < 2:
            self.phase = "off"  # one core, or every pool pinned: nothing to choose
            return
        self.phase, self.i, self.measured_at = "measure", 0, self.seen
        self.schedule = settings * ROUNDS
        self.times = {s: [] for s in settings}
        self.set(*self.schedule[0])
        self.last = self.clock()  # (settings() may have probed OpenBLAS: not a call's time)

    def _keep(self) -> None:
        medians = {s: statistics.median(ts) for s, ts in self.times.items()}
        best = min(medians, key=medians.get)
        self.set(*best)
        again = self.kept is not None
        # the same choice again: the drift was the machine's noise, so look less often
        self.retry = min(self.retry * 2, 16 * RETRY) if best == self.kept else RETRY
        self.kept, self.phase = best, "run"
        self.recent, self.base, self.drifted = [], None, 0
        self.known[self.owner] = (best, self.retry)
        tried = ", ".join(f"{_name(s)} {m * 1e3:.1f}" for s, m in medians.items())
        self.news = (
            f"threads: {_name(best, long=True)}, the fastest of {len(medians)} settings "
            f"{'measured again' if again else 'measured'} over {len(self.schedule)} calls "
            f"(ms per call, OpenBLAS/kernels: {tried}); TG_THREADS=N pins them"
        )
        if self.blas_kept is not None:
            kind = cpu_blas.corename()
            self.news += (
                f"; OpenBLAS stays at {self.blas_kept}: its {kind + ' ' if kind else ''}kernels "
                "compute other bits on another count, and the run would not repeat"
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
if hasattr(os, "register_at_fork"):  # a child forked mid-call: a free lock, no owner
    os.register_at_fork(after_in_child=GOVERNOR._reset)


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
