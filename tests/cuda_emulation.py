"""Run tensorgrad's CUDA kernel sources on the CPU, for tests on machines without a GPU.

The CUDA C of ``tensorgrad.cuda_kernels`` and ``tensorgrad.cuda_flash`` is compiled by g++
behind a small shim: every CUDA thread of a block is an OS thread, ``__syncthreads`` is a
barrier, ``__shared__`` arrays are function statics (blocks run one after another, so a
static is exactly one block's shared memory), and ``__shfl_xor_sync`` exchanges through a
buffer between two barriers. Float arithmetic is IEEE single precision without
contraction, as NVRTC's ``__f*_rn`` intrinsics. Slow, so only for small shapes; a kernel
that hits a barrier on some threads only (a real bug on the GPU) is reported instead of
hanging.

``nvcc_check`` compiles the same sources for sm_90 with nvcc, to catch what g++ accepts
but CUDA does not.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SHIM = r"""
#include <math.h>
#include <string.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

struct dim3 { unsigned x = 1, y = 1, z = 1; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

struct tg_barrier {  // a barrier that gives up (and says so) instead of deadlocking
    std::mutex mu; std::condition_variable cv;
    int n = 0, waiting = 0; long gen = 0; bool broken = false;
    void wait() {
        std::unique_lock<std::mutex> lk(mu);
        if (broken) return;
        long g = gen;
        if (++waiting == n) { waiting = 0; ++gen; cv.notify_all(); return; }
        if (!cv.wait_for(lk, std::chrono::seconds(20), [&] { return gen != g || broken; })) {
            broken = true; cv.notify_all();
        }
    }
};
static tg_barrier* tg_bar = nullptr;
static float tg_xchg[1024];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
inline void __syncthreads() { tg_bar->wait(); }
inline int tg_flat_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    const int t = tg_flat_tid();
    tg_xchg[t] = v;
    __syncthreads();
    const float r = tg_xchg[t ^ lane_mask];
    __syncthreads();
    return r;
}
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::max;
using std::min;

// One OS thread per CUDA thread of a block; the threads walk the blocks one after another,
// meeting at a barrier after each (so a block's statics are free for the next one).
template <class F> static int tg_launch(dim3 g, dim3 b, F f) {
    gridDim = g; blockDim = b;
    const int nt = b.x * b.y * b.z;
    tg_barrier bar; bar.n = nt; tg_bar = &bar;
    std::vector<std::thread> ts;
    for (int t = 0; t < nt; ++t) ts.emplace_back([&, t] {
        threadIdx = dim3{t % b.x, (t / b.x) % b.y, t / (b.x * b.y)};
        for (unsigned z = 0; z < g.z; ++z) for (unsigned y = 0; y < g.y; ++y)
        for (unsigned x = 0; x < g.x; ++x) {
            blockIdx = dim3{x, y, z};
            f();
            tg_bar->wait();
        }
    });
    for (auto& th : ts) th.join();
    return bar.broken ? 1 : 0;
}
"""

_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(([^)]*)\)')
_CTYPES = {"float": ctypes.c_float, "int": ctypes.c_int, "long long": ctypes.c_longlong}
_EW_TYPES = {"float32": "float", "int64": "long long"}


def kernel_signatures(source: str) -> dict:
    """name -> [(C type, parameter name)] of every extern "C" __global__ kernel."""
    out = {}
    for name, params in _KERNEL.findall(source):
        sig = []
        for p in params.split(","):
            words = p.replace("*", " * ").split()
            sig.append((" ".join(w for w in words[:-1] if w not in ("__restrict__",)), words[-1]))
        out[name] = sig
    return out


def elementwise_source(name, in_params, out_params, operation, scalars=(), cuda=False) -> str:
    """An ElementwiseKernel as a plain C function (or a __global__ kernel for nvcc)."""
    sig, pre, post = ["long long n"], [], []
    for spec, is_out in [(p, False) for p in in_params.split(",")] + [
        (p, True) for p in out_params.split(",")
    ]:
        t, nm = spec.split()
        ct = _EW_TYPES[t]
        if nm in scalars:
            sig.append(f"{ct} {nm}")
        elif is_out:
            sig.append(f"{ct}* {nm}_p")
            pre.append(f"{ct} {nm} = {nm}_p[i];")
            post.append(f"{nm}_p[i] = {nm};")
        else:
            sig.append(f"const {ct}* {nm}_p")
            pre.append(f"const {ct} {nm} = {nm}_p[i];")
    body = " ".join(pre) + " { " + operation + " } " + " ".join(post)
    if cuda:
        return (
            f'extern "C" __global__ void {name}({", ".join(sig)}) {{ long long i = '
            f"(long long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) {{ {body} }} }}\n"
        )
    return (
        f'extern "C" void ew_{name}({", ".join(sig)}) {{ for (long long i = 0; i < n; ++i) '
        f"{{ {body} }} }}\n"
    )


def _wrappers(source: str) -> str:
    out = []
    for name, sig in kernel_signatures(source).items():
        params = ", ".join(f"{t} {n}" for t, n in sig)
        names = ", ".join(n for _, n in sig)
        out.append(
            f'extern "C" int run_{name}(unsigned tg_gx, unsigned tg_gy, unsigned tg_gz, '
            f"unsigned tg_bx, unsigned tg_by, unsigned tg_bz, {params}) {{ return tg_launch("
            f"dim3{{tg_gx, tg_gy, tg_gz}}, dim3{{tg_bx, tg_by, tg_bz}}, [&] {{ {name}({names}); "
            f"}}); }}\n"
        )
    return "".join(out)


_BUILD_DIR = Path(tempfile.gettempdir()) / "tg_cuda_emulation"


def build(source: str, extra: str = "") -> ctypes.CDLL:
    """Compile kernels (and extra plain C functions) into a shared library, cached by hash."""
    code = SHIM + source + _wrappers(source) + extra
    flags = ["-std=c++17", "-O1", "-w", "-pthread", "-fPIC", "-shared", "-ffp-contract=off"]
    _BUILD_DIR.mkdir(exist_ok=True)
    key = hashlib.sha1((code + " ".join(flags)).encode()).hexdigest()[:16]
    lib = _BUILD_DIR / f"k{key}.so"
    if not lib.exists():
        src = lib.with_suffix(".cc")
        src.write_text(code)
        tmp = lib.with_suffix(".tmp.so")
        r = subprocess.run(
            ["g++", *flags, str(src), "-o", str(tmp)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode:
            raise RuntimeError(f"g++ failed on the emulated kernels:\n{r.stderr[-4000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


class Emulated:
    """Kernels of one CUDA source, launched as ``k.launch(name, grid, block, *args)``.

    Arrays are NumPy arrays (written in place); scalars are converted to the C type.
    """

    def __init__(self, source: str, extra: str = ""):
        self.sigs = kernel_signatures(source)
        self.lib = build(source, extra)

    def launch(self, name, grid, block, *args):
        sig = self.sigs[name]
        assert len(args) == len(sig), f"{name} takes {len(sig)} arguments, got {len(args)}"
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        cargs = []
        for (t, n), a in zip(sig, args):
            if "*" in t:  # any view: the kernel gets the address of its first element
                assert isinstance(a, np.ndarray), f"{name}: {n} is {type(a).__name__}"
                cargs.append(ctypes.c_void_p(a.ctypes.data))
            else:
                cargs.append(_CTYPES[t.replace("const ", "")](a))
        fn = getattr(self.lib, f"run_{name}")
        fn.restype = ctypes.c_int
        rc = fn(*[ctypes.c_uint(v) for v in grid + block], *cargs)
        assert rc == 0, f"{name}: threads of one block waited at different barriers"


_NP_TYPES = {"float32": np.float32, "int64": np.int64}


class ElementwiseEmulated:
    """A cupy.ElementwiseKernel stand-in: broadcasts its inputs, allocates the outputs that
    are not passed, writes the passed ones in place, and returns the outputs."""

    def __init__(self, name, spec):
        self.name, (ins, outs, self.op) = name, spec
        self.spec = spec
        self.ins = [p.split() for p in ins.split(",")]
        self.outs = [p.split() for p in outs.split(",")]

    def __call__(self, *args):
        ins, outs = self.ins, self.outs
        given = list(args[len(ins) :]) + [None] * (len(outs) - len(args[len(ins) :]))
        scalars = {n: a for (t, n), a in zip(ins, args) if not isinstance(a, np.ndarray)}
        shapes = [a.shape for a in args if isinstance(a, np.ndarray)]
        shape = np.broadcast_shapes(*shapes)
        bufs, call = {}, []
        for (t, n), a in zip(ins, args):
            if n in scalars:
                call.append(ctypes.c_float(a) if t == "float32" else ctypes.c_longlong(a))
            else:
                bufs[n] = np.ascontiguousarray(np.broadcast_to(a, shape), dtype=_NP_TYPES[t])
                call.append(ctypes.c_void_p(bufs[n].ctypes.data))
        for (t, n), o in zip(outs, given):
            src = np.zeros(shape, _NP_TYPES[t]) if o is None else np.broadcast_to(o, shape)
            bufs[n] = np.ascontiguousarray(src, dtype=_NP_TYPES[t]).copy()
            call.append(ctypes.c_void_p(bufs[n].ctypes.data))
        ins_s, outs_s, op = self.spec
        lib = build("", elementwise_source(self.name, ins_s, outs_s, op, tuple(scalars)))
        getattr(lib, f"ew_{self.name}")(ctypes.c_longlong(int(np.prod(shape))), *call)
        results = []
        for (t, n), o in zip(outs, given):
            if o is not None:
                o[...] = bufs[n]
            results.append(o if o is not None else bufs[n])
        return results[0] if len(results) == 1 else tuple(results)


def install(monkeypatch) -> None:
    """Run the registered CUDA kernels on float32 NumPy arrays, through the emulated kernels.

    tensorgrad/cuda/kernels.py and flash.py then run their real Python wrappers with NumPy
    in CuPy's place (the calls they make exist in both), and every 'cuda' kernel of the
    registry is also registered, first, for the 'cpu' device.
    """
    import numpy as np

    from tensorgrad import kernels
    from tensorgrad.cuda import flash as FA
    from tensorgrad.cuda import kernels as K
    from tensorgrad.cuda import ops as CO

    cache = {}

    def kernel(key, source, name):
        em = cache.get(key)
        if em is None:
            em = cache[key] = Emulated(source())
        return lambda grid, block, args: em.launch(name, grid, block, *args)

    monkeypatch.setattr(K, "_raw", lambda name: kernel("rows", K.rows_source, name))
    monkeypatch.setattr(FA, "_raw", lambda hd, name: kernel(hd, lambda: FA.flash_source(hd), name))
    monkeypatch.setattr(
        K, "_elementwise", lambda name: ElementwiseEmulated(name, K.ELEMENTWISE[name])
    )
    for module in (K, FA):
        monkeypatch.setattr(module, "require_cupy", lambda: np)
    monkeypatch.setattr(
        CO,
        "on_gpu",
        lambda *a: all(
            x is None or (isinstance(x, np.ndarray) and x.dtype == np.float32) for x in a
        ),
    )
    registry = {key: list(ks) for key, ks in kernels._registry.items()}
    for (op, dev), ks in kernels._registry.items():
        if dev == "cuda" and op != "matmul":
            registry[(op, "cpu")] = list(ks) + registry.get((op, "cpu"), [])
    monkeypatch.setattr(kernels, "_registry", registry)
    monkeypatch.setattr(kernels, "_enabled", True)  # also under TG_KERNELS=0


def nvcc_check(source: str, arch: str = "sm_90") -> str:
    """Compile with nvcc (no run); returns ptxas' resource report, raises on errors."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc")
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.cu"
        src.write_text(source)
        r = subprocess.run(
            [
                nvcc,
                "-c",
                f"-arch={arch}",
                "-Xptxas",
                "-v",
                "-Werror",
                "all-warnings",
                str(src),
                "-o",
                str(Path(d) / "k.o"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if r.returncode:
        raise RuntimeError(f"nvcc failed:\n{r.stderr[-4000:]}")
    return r.stderr
