"""The chunked CPU kernels (kernels/cpu_chunked.py) cut into many chunks on three threads
give the reference op's numbers.

Each case selects its chunked kernel alone (``kernels.only``, so neither the numba kernels,
which take these float32 inputs first, nor ``TG_KERNELS=0`` can route around it), wraps the
kernel module's ``chunked`` to count the chunks and the threads that ran them, and compares
forward and gradients with the reference op run on the same arrays.
"""

import os
import threading

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import kernels
from tensorgrad.kernels import chunks as parallel
from tensorgrad.kernels import cpu_chunked

rng = np.random.default_rng(0)
X = rng.standard_normal((5, 7, 24)).astype(np.float32)
W, B = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
Q, K, V = (rng.standard_normal((2, 3, 9, 8)).astype(np.float32) for _ in range(3))
T = rng.integers(0, 24, 35)

CASES = {  # case: (the chunked kernel that must run, the call)
    "gelu": ("cpu.chunked.gelu_tanh", lambda: F.gelu(tg.tensor(X, requires_grad=True), "tanh")),
    "layer_norm": (
        "cpu.chunked.layer_norm",
        lambda: F.layer_norm(
            tg.tensor(X, requires_grad=True),
            24,
            tg.tensor(W, requires_grad=True),
            tg.tensor(B, requires_grad=True),
        ),
    ),
    "softmax": (
        "cpu.chunked.softmax",
        lambda: F.softmax(tg.tensor(X, requires_grad=True), dim=-1),
    ),
    "cross_entropy": (
        "cpu.chunked.cross_entropy",
        lambda: F.cross_entropy(tg.tensor(X.reshape(35, 24), requires_grad=True), T),
    ),
    "attention": (
        "cpu.inplace.attention",
        lambda: F.scaled_dot_product_attention(
            tg.tensor(Q, requires_grad=True),
            tg.tensor(K, requires_grad=True),
            tg.tensor(V, requires_grad=True),
            is_causal=True,
        ),
    ),
}
THREADS = 3


def run(case):
    tg.manual_seed(0)
    out = CASES[case][1]()
    leaves = [t for t in out.grad_fn.edges if isinstance(t, tg.Tensor)]
    (out * 1.5).sum().backward()
    return [out.detach().numpy()] + [t.grad.numpy() for t in leaves]


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_threads_match_reference(case, monkeypatch):
    name = CASES[case][0]
    assert name in {k.name for k in kernels.registered(device="cpu")}, name
    with kernels.reference_only():
        want = run(case)
    chunk_calls, threads = [], set()
    real = cpu_chunked.chunked

    def counting(fn, *args, **kw):
        def body(i, s, e):
            chunk_calls.append(i)
            threads.add(threading.get_ident())
            fn(i, s, e)

        return real(body, *args, **kw)

    monkeypatch.setattr(cpu_chunked, "chunked", counting)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 64)  # many tiny chunks
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)  # and always the thread pool
    monkeypatch.setenv("TG_NUM_THREADS", str(THREADS))
    with kernels.only(name):
        got = run(case)
    # the pool ran: several chunks, on the calling thread and on the pool's threads (an idle
    # worker may take two shares, so at least two threads, not always three)
    assert len(chunk_calls) > THREADS, f"{name}: {len(chunk_calls)} chunks"
    assert threading.get_ident() in threads and len(threads) >= 2, (
        f"{name}: chunks ran on {len(threads)} thread(s)"
    )
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{name}: output {i}")


def test_malloc_tuning_respects_opt_out(monkeypatch):
    from tensorgrad import devices

    monkeypatch.setenv("TG_MALLOC_TUNING", "0")
    assert devices.tune_cpu_malloc() is False
    monkeypatch.delenv("TG_MALLOC_TUNING")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # the user's own setting wins
    assert devices.tune_cpu_malloc() is False


def test_malloc_tuned_at_import_unless_switched_off():
    """A library user gets the allocator setting without calling anything; the documented
    off switch keeps glibc's defaults (checked in fresh interpreters)."""
    import subprocess
    import sys

    code = "import tensorgrad.devices as b; print(b.malloc_tuned)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "TG_MALLOC"))}
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    off = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "TG_MALLOC_TUNING": "0"},
        capture_output=True,
        text=True,
    )
    glibc = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION")
    assert on.stdout.strip() == str(bool(glibc)), on.stderr
    assert off.stdout.strip() == "False", off.stderr


BLAS_PROBE = """
import ctypes, os, sys, threading, time
import numpy as np
import tensorgrad.kernels.cpu_blas as d
path = d._numpy_openblas()
if path is None:
    print("no-openblas"); sys.exit()
lib = ctypes.CDLL(path)
a = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
want = a.astype(np.float64) @ a
ok = np.allclose(a @ a, want, rtol=1e-4, atol=1e-3)  # the restarted threads compute
me = str(threading.get_native_id())

def others():  # the process's other threads: OpenBLAS's worker, numba's (passive) pool
    return [t for t in os.listdir("/proc/self/task") if t != me]

def read(t, name):
    try:
        with open(f"/proc/self/task/{t}/{name}") as f:
            return f.read()
    except FileNotFoundError:  # (a thread that ended)
        return None

def schedstat(t):  # (ns on a CPU, ns runnable but waiting for one)
    s = read(t, "schedstat")
    return tuple(map(int, s.split()[:2])) if s else (0, 0)

def all_asleep():  # no other thread running or waiting to run: the worker went to sleep
    for _ in range(100_000):  # (only a guard against a hang)
        states = [read(t, "stat") for t in others()]
        if all(s is None or s.rsplit(")", 1)[1].split()[0] != "R" for s in states):
            return True
        time.sleep(0.001)
    return False

cpu = runnable = 0  # of the other threads, from each GEMM's end until they all sleep
slept = True
for _ in range(8):
    a @ a
    before = {t: schedstat(t) for t in others()}
    slept &= all_asleep()
    for t, (run0, wait0) in before.items():
        run1, wait1 = schedstat(t)
        cpu += run1 - run0
        runnable += run1 + wait1 - run0 - wait0
print(d.blas_wait_tuned, lib.openblas_thread_timeout(), d._first(lib, "get_num_threads")(), ok,
      "OPENBLAS_THREAD_TIMEOUT" in os.environ, cpu / 1e9, runnable / 1e9, slept)
"""


@pytest.mark.skipif(
    not os.path.exists("/proc/self/schedstat"),
    reason="reads threads' states and times in /proc/<pid>/schedstat: run it on Linux",
)
def test_blas_threads_wait_briefly_unless_switched_off():
    """import tensorgrad makes NumPy's OpenBLAS threads sleep after ~0.1 ms idle (2**18
    cycles) and keeps their count: between GEMMs its worker spends no CPU, where OpenBLAS's
    own setting spins it ~0.1 s after each call. TG_BLAS_TUNING=0 or the user's own
    OPENBLAS_THREAD_TIMEOUT keeps OpenBLAS's setting (fresh interpreters).

    Measured so that a busy machine cannot change the verdict: after each GEMM the probe
    waits until the worker sleeps (its state in /proc, not a timed pause), then reads how
    long it spun from the kernel's accounting (/proc/.../schedstat). Tuned, the CPU it took
    is an upper bound that load only lowers (the spin ends 2**18 cycles of wall time after
    the GEMM, on a CPU or not); untuned, the time it stayed runnable (on a CPU or waiting
    for one) is a lower bound that load only raises (2**28 cycles: 54 ms even at 5 GHz)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TG_BLAS_TUNING",)}
    env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    env.pop("OMP_WAIT_POLICY", None)  # (numba's pool then starts passive: it sleeps)
    env["OPENBLAS_NUM_THREADS"] = "2"

    def probe(**extra):
        r = subprocess.run(
            [sys.executable, "-c", BLAS_PROBE], env={**env, **extra}, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    on = probe()
    if on == ["no-openblas"]:
        pytest.skip(
            "NumPy's BLAS is not OpenBLAS (NumPy's PyPI wheels bundle it: pip install numpy)"
        )
    off = probe(TG_BLAS_TUNING="0")
    assert on[:2] == ["True", "18"] and on[3:5] == ["True", "False"], on
    assert off[0] == "False" and off[3:5] == ["True", "False"], off
    assert on[2] == off[2], (on, off)  # the same thread count as OpenBLAS's own start
    assert on[7] == off[7] == "True", (on, off)  # every worker went to sleep after each GEMM
    assert float(on[5]) < 0.02, on  # CPU: at most ~0.1 ms of spinning after each of 8 GEMMs
    assert float(off[6]) > 0.2, off  # runnable: ~0.1 s after each, the spin this removes
    mine = probe(OPENBLAS_THREAD_TIMEOUT="25")
    assert mine[:2] == ["False", "25"], mine
    # another thread could be in a BLAS call: no restart under it (one waits, alive, until
    # the import is done; a notebook calls tune_blas_wait itself)
    busy = (
        "import threading; done = threading.Event(); threading.Thread(target=done.wait).start()\n"
        "import tensorgrad.kernels.cpu_blas as d; print(d.blas_wait_tuned, d.tune_blas_wait())\n"
        "done.set()\n"
    )
    r = subprocess.run([sys.executable, "-c", busy], env=env, capture_output=True, text=True)
    assert r.stdout.split() == ["False", "True"], r.stderr
