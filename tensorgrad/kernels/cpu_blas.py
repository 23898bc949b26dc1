"""NumPy's OpenBLAS threads: how long they spin idle before they sleep, and how many run.

``import tensorgrad`` calls ``tune_blas_wait`` once (``TG_BLAS_TUNING=0`` turns it off);
docs/internals.md and docs/performance.md say why. ``blas_threads`` / ``set_blas_threads``
read and set the thread count at run time (kernels/threads.py measures which is fastest).
Not part of the core: a CPU speed setting, like the kernels beside it.

Imports: contextlib, ctypes, numpy, os, threading.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import numpy as np

BLAS_WAIT = 18  # OpenBLAS's thread timeout: its idle threads spin 2**18 cycles (~0.1 ms)


def _numpy_openblas() -> str | None:
    """The path of the OpenBLAS that NumPy loaded (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    here = os.path.realpath(os.path.dirname(os.path.dirname(np.__file__)))  # numpy.libs/ there
    mine = (p for p in sorted(paths) if os.path.realpath(p).startswith(here + os.sep))
    return next((p for p in mine if "numpy" in os.path.realpath(p)[len(here) :]), None)


def _first(lib, name: str):
    """OpenBLAS's ``openblas_<name>`` under the prefix and suffix its build gave it, or None."""
    for n in (f"scipy_openblas_{name}64_", f"openblas_{name}64_", f"openblas_{name}"):
        if hasattr(lib, n):
            return getattr(lib, n)
    return None


def tune_blas_wait(level: int = BLAS_WAIT) -> bool:
    """Make NumPy's OpenBLAS threads sleep after ~0.1 ms idle instead of spinning ~0.1 s.

    OpenBLAS's worker threads spin for 2**28 cycles after each call before they sleep, so
    between the many small GEMMs of a training step a worker spins for the whole of the
    step's non-GEMM work. On a 2-vCPU VM (family 25 model 17) a spinning worker slowed the
    main thread's own work for hundreds of steps at a time: char-small's step at 12x64 read
    54 ms in those stretches against 37 otherwise, as slow as one thread (36-55 ms per block
    of 100 steps in one gpt-train run, against 38-41 ms with this). It sets OpenBLAS's
    ``OPENBLAS_THREAD_TIMEOUT`` to ``level`` (2**level cycles; OpenBLAS accepts 4-30) and
    restarts its threads, which read it when they start (the fork handler's restart; the
    thread count is kept). Waking a sleeping thread costs microseconds per call.

    ``import tensorgrad`` calls it once. Skipped when ``OPENBLAS_THREAD_TIMEOUT`` is set
    (OpenBLAS then read yours), with ``TG_BLAS_TUNING=0``, where NumPy's BLAS is not a
    pthreads OpenBLAS with these entry points. The restart is unsafe while another thread
    is in a BLAS call, so the import calls it only where no other Python thread runs; in a
    notebook (whose kernel has threads of its own) call it yourself. ``blas_wait_tuned``
    here says whether it applied at import. Returns whether it was applied.
    """
    if os.environ.get("TG_BLAS_TUNING", "1") == "0" or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return False
    path = _numpy_openblas()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)  # already loaded: the same handle
        read_env, timeout = lib.openblas_read_env, lib.openblas_thread_timeout
        restart = lib.blas_thread_shutdown_  # (threads start again at the next call)
        parallel = _first(lib, "get_parallel")  # 0: no threads, 1: pthreads, 2: OpenMP
        pthreads = parallel is not None and parallel() == 1
    except (OSError, AttributeError):
        return False
    if not pthreads:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(int(level))
    try:
        read_env()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]  # (OpenBLAS keeps its copy)
    if timeout() != int(level):
        return False
    restart()
    return True


_COUNT: list = []  # [(get, set)] of NumPy's OpenBLAS thread count, or [None]: found once


def _count_calls():
    if not _COUNT:
        path, calls = _numpy_openblas(), None
        if path is not None:
            try:
                lib = ctypes.CDLL(path)
                get, put = _first(lib, "get_num_threads"), _first(lib, "set_num_threads")
                if get is not None and put is not None:
                    put.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
                    calls = (get, put)
            except OSError:
                pass
        _COUNT.append(calls)
    return _COUNT[0]


def blas_threads() -> int | None:
    """The threads NumPy's OpenBLAS runs a product on now, or None where it cannot be read."""
    calls = _count_calls()
    return None if calls is None else int(calls[0]())


def set_blas_threads(n: int) -> bool:
    """Run NumPy's OpenBLAS products on n threads from now on (at most its pool's size, which
    it fixed at load). False where that cannot be set. Whether a product's bits change with n
    depends on the CPU's kernels: ``bits_follow_threads`` says."""
    calls = _count_calls()
    if calls is None:
        return False
    calls[1](max(1, int(n)))
    return True


_HELD = threading.Lock()
_holds = {"depth": 0, "was": None}  # blocks inside held() now, and the count to give back


@contextlib.contextmanager
def held(n: int):
    """OpenBLAS at n threads inside the block, its count as it was after the last such block
    ends (two threads inside at once: the first to leave does not give it back early). Does
    nothing where the count cannot be set (``blas_threads()`` is None)."""
    with _HELD:
        if _holds["depth"] == 0:
            _holds["was"] = blas_threads()
        _holds["depth"] += 1
        if _holds["was"] is not None and blas_threads() != n:
            set_blas_threads(n)
    try:
        yield
    finally:
        with _HELD:
            _holds["depth"] -= 1
            if _holds["depth"] == 0 and _holds["was"] is not None:
                set_blas_threads(_holds["was"])


_PROBE = ((128, 64, 128), (256, 512, 256), (64, 1024, 64), (512, 64, 256))  # (m, k, n)
_FOLLOW: dict = {}  # pool size -> whether the bits follow the thread count (measured once)


def bits_follow_threads(n: int) -> bool:
    """Whether NumPy's OpenBLAS computes other bits for a product on n threads than on one:
    measured once per n, on four products of the GPT's kinds (0.1 s on a loaded 2-core VM).

    On OpenBLAS's AVX-512 kernels (SkylakeX, Cooperlake: Zen 4 and 5, recent Xeons) a product
    is split over its rows and columns only and every element gets the same sums on any
    count: 68 shapes at 1, 2 and 4 threads agreed on a Zen 4 VM (family 25 model 17). Its
    Haswell kernels, which AVX2 CPUs get (Zen 2 and 3, most laptops), sum the rows of a
    thread's share in another order: on a Zen 3 VM (family 25 model 1) 2 to 30% of the
    elements of most products of the GPT's shapes differed between 1 and 2 threads (not all:
    384x384x384 agreed), so the probe takes four."""
    if not n or n <= 1 or _count_calls() is None:
        return False
    if n not in _FOLLOW:
        rng = np.random.default_rng(0)
        pairs = [
            (rng.standard_normal((m, k), np.float32), rng.standard_normal((k, c), np.float32))
            for m, k, c in _PROBE
        ]
        was = blas_threads()
        try:
            set_blas_threads(1)
            one = [a @ b for a, b in pairs]
            set_blas_threads(n)
            many = [a @ b for a, b in pairs]
        finally:
            set_blas_threads(was)
        _FOLLOW[n] = any(not np.array_equal(x, y) for x, y in zip(one, many))
    return _FOLLOW[n]


def corename() -> str | None:
    """The kernels NumPy's OpenBLAS chose for this CPU ("Haswell", "SkylakeX", ...), or None."""
    path = _numpy_openblas()
    if path is None:
        return None
    try:
        get = _first(ctypes.CDLL(path), "get_corename")
    except OSError:
        return None
    if get is None:
        return None
    get.restype = ctypes.c_char_p
    return get().decode("ascii", "replace")


# at import, where no other thread could be in a BLAS call: see tune_blas_wait
blas_wait_tuned = threading.active_count() == 1 and tune_blas_wait()
