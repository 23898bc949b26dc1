"""The one place that knows about NumPy versus CuPy.

Everything else asks this module for the array module of its inputs (``xp``),
moves arrays between devices through it, and draws random numbers from its
seeded generators. CuPy is imported lazily, only when a 'cuda' device is asked
for, so ``import tensorgrad`` never touches it.

It also holds ``BFLOAT16``, NumPy's bfloat16 dtype (from ml_dtypes, as JAX's), the storage
of ``tensorgrad.bfloat16``; None when ml_dtypes is not installed.

Imports: contextlib, ctypes, ml_dtypes, numpy, os, sys.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

import numpy as np

try:  # a default dependency; without it tensorgrad.bfloat16 says to install it
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

# ----------------------------------------------------------------------------- CPU memory
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def tune_cpu_malloc() -> bool:
    """Ask glibc to keep freed arrays for reuse instead of returning them to the OS.

    By default glibc serves arrays above a (dynamic) threshold with fresh mmap pages and
    unmaps them on free, so every training step page-faults and zero-fills its activations
    again: measured in benchmarks/, a third of a step's time for the 'baby' model. Arrays
    up to 32 MiB (the largest mmap threshold glibc accepts) now come from the heap, and up
    to 1 GiB of free heap is kept. Skipped off glibc, when the user set MALLOC_* variables,
    or with TG_MALLOC_TUNING=0. Returns whether it was applied.

    ``import tensorgrad`` calls it once, so that a library user gets the fast step without
    asking (PyTorch's step does not page-fault its activations either); it is
    process-wide, so ``TG_MALLOC_TUNING=0`` in the environment (or a MALLOC_* variable of
    your own) turns it off. ``tensorgrad.devices.malloc_tuned`` says whether it applied.
    """
    if os.environ.get("TG_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(ok)


malloc_tuned = tune_cpu_malloc()  # at import: see tune_cpu_malloc for the off switch

_cupy = None  # the cupy module once imported, False if the import failed
_cupy_error: str | None = None
# (array type, module, device) of stand-in array modules registered by tests
_registered: list = []
# True once a second array module (CuPy or a registered one) can appear: only then do
# array-module lookups and the mixed-device check in Op.apply do any work
_multi = False

CUDA_HINT = (
    "CUDA device requested but {why}. Install the GPU extra: "
    'pip install -e ".[cuda]" (CUDA 12) or -e ".[cuda13]" (CUDA 13, cupy-cuda13x)'
)


def _import_cupy():
    """Import CuPy once; return the module or None (with the reason kept)."""
    global _cupy, _cupy_error, _multi
    if _cupy is None:
        try:
            import cupy  # noqa: PLC0415  (lazy on purpose)

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA GPU was found")
            _cupy = cupy
            _multi = True
        except Exception as e:  # ImportError, CUDARuntimeError, ...
            _cupy = False
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]  # one line
            _cupy_error = (
                "CuPy is not installed"
                if isinstance(e, ModuleNotFoundError)
                else f"CuPy failed: {first}"
            )
    return _cupy or None


def cuda_available() -> bool:
    return _import_cupy() is not None


def cuda_error() -> str | None:
    """Why CuPy could not be used (after a failed import), else None."""
    return _cupy_error


def is_cupy_array(a) -> bool:
    """True for a real CuPy array (not a stand-in module's: CUDA kernels need the real one)."""
    return bool(_cupy) and isinstance(a, _cupy.ndarray)


def is_cpu_array(a) -> bool:
    """The one answer to "is this array on the CPU" (a NumPy array)."""
    return isinstance(a, np.ndarray)


def require_cupy():
    cp = _import_cupy()
    if cp is None:
        raise RuntimeError(CUDA_HINT.format(why=_cupy_error or "CuPy is unavailable"))
    return cp


def require_cublas():
    """CuPy's cuBLAS bindings (for GEMMs with a chosen compute type)."""
    require_cupy()
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    return cublas


def require_nccl():
    """CuPy's NCCL bindings (for data-parallel GPU runs); ImportError when CuPy has none."""
    require_cupy()
    from cupy.cuda import nccl  # noqa: PLC0415

    return nccl


def get_array_module(*arrays):
    """NumPy or CuPy, whichever holds the arrays (NumPy for scalars); a Tensor is asked
    for its array's."""
    if _multi:
        for a in arrays:
            a = getattr(a, "_array", a)  # a Tensor: its array (the backend knows no Tensor)
            if _cupy and isinstance(a, _cupy.ndarray):
                return _cupy
            for t, module, _ in _registered:
                if isinstance(a, t):
                    return module
    return np


def shares_memory(a, b) -> bool:
    """Whether array a may overlap array b in memory (it itself, or a view of it)."""
    if a is b:
        return True
    if type(a) is np.ndarray and type(b) is np.ndarray and a.base is None and b.base is None:
        # two NumPy arrays that each allocated their own memory (no base) cannot overlap;
        # asked first because the tape asks this for every saved array of every op
        return False
    msm = getattr(get_array_module(a), "may_share_memory", None)
    return bool(msm(a, b)) if msm is not None else getattr(a, "base", None) is not None


def _device_or_none(a):
    """'cpu' or 'cuda' for an array, None for anything else (scalars, None, tuples)."""
    if _cupy and isinstance(a, _cupy.ndarray):
        return "cuda"
    for t, _, device in _registered:
        if isinstance(a, t):
            return device
    if isinstance(a, np.ndarray):
        return "cpu"
    return None


def is_array(a) -> bool:
    """A NumPy or CuPy array (or a registered stand-in's): what a Tensor can hold."""
    return _device_or_none(a) is not None


def device_of(array) -> str:
    return (_device_or_none(array) or "cpu") if _multi else "cpu"


def check_same_device(op: str, arrays) -> None:
    """Raise naming both devices when the arrays given to one op live on different devices."""
    first = None
    for a in arrays:
        d = _device_or_none(a)
        if d is not None and first is not None and d != first:
            raise RuntimeError(
                f"{op}: expected all tensors on the same device, got {first} and {d}; "
                "move them with .to(device) first"
            )
        first = first or d


def register_array_module(array_type, module, device: str = "cuda"):
    """Treat ``array_type`` arrays as living on ``device`` with ``module`` as their xp.

    A stand-in for CuPy in CPU tests (tests/test_backend_dispatch.py). Returns a function
    that removes the registration again.
    """
    global _multi
    entry = (array_type, module, parse_device(device))
    _registered.insert(0, entry)
    _multi = True
    generators.reset_device()

    def unregister():
        global _multi
        _registered.remove(entry)
        _multi = bool(_cupy) or bool(_registered)
        generators.reset_device()

    return unregister


default_device = "cpu"  # where a tensor goes when not told (torch.set_default_device)


def set_default_device(device) -> None:
    """Make ``device`` ('cpu', 'cuda'; None: the CPU) where factory functions and new modules'
    parameters put their tensors when no device is given."""
    global default_device
    default_device = "cpu" if device is None else parse_device(device)


def parse_device(device) -> str:
    """'cpu' or 'cuda' (None: the default device)."""
    if device is None:
        return default_device
    d = str(device)
    if d == "cpu":
        return "cpu"
    if d == "cuda" or d.startswith("cuda:"):
        return "cuda"
    raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda'")


def xp_for(device) -> object:
    """The array module for a device name."""
    if parse_device(device) == "cpu":
        return np
    for _, module, d in _registered:
        if d == "cuda":
            return module
    return require_cupy()


def to_device(array, device):
    """Copy an array to 'cpu' or 'cuda' (no copy when already there)."""
    device = parse_device(device)
    if device == device_of(array):
        return array
    if device == "cuda":
        return xp_for("cuda").asarray(array)
    return array.get()


def to_numpy(array) -> np.ndarray:
    """A host copy (or the array itself when it is already a NumPy array)."""
    return array.get() if device_of(array) != "cpu" else np.asarray(array)


# ----------------------------------------------------------------------------- random numbers
class _Generators:
    """One seeded generator per device; manual_seed resets both."""

    def __init__(self, seed: int = 0):
        self.seed = self.cuda_seed = seed
        self.cpu = np.random.Generator(np.random.PCG64(seed))
        self._cuda = None

    def manual_seed(self, seed: int):
        self.seed = self.cuda_seed = int(seed)
        self.cpu = np.random.Generator(np.random.PCG64(self.seed))
        self._cuda = None

    def manual_seed_cuda(self, seed: int):
        """Seed the GPU's generator only (it starts from this seed when next asked for)."""
        self.cuda_seed, self._cuda = int(seed), None

    def get(self, device: str = "cpu"):
        if parse_device(device) == "cpu":
            return self.cpu
        if self._cuda is None:
            xp = xp_for("cuda")  # CuPy (or a registered stand-in with the same API)
            self._cuda = xp.random.Generator(xp.random.XORWOW(self.cuda_seed))
        return self._cuda

    def reset_device(self):
        """Forget the GPU generator (it restarts from the seed when next asked for)."""
        self._cuda = None


generators = _Generators()
seed_observers: list = []  # told of each manual_seed (a compile trace: replay would not reseed)


def manual_seed(seed: int) -> None:
    """Seed every device's generator, so that a run repeats exactly."""
    if seed_observers:
        for observe in seed_observers:
            observe()
    generators.manual_seed(seed)


def rng(device: str = "cpu"):
    return generators.get(device)


def get_rng_state() -> dict:
    """The CPU generator's state as a JSON-able dict (for checkpoints)."""
    return {"seed": generators.seed, "cpu": generators.cpu.bit_generator.state}


def set_rng_state(state: dict) -> None:
    generators.manual_seed(state["seed"])
    generators.cpu.bit_generator.state = state["cpu"]


# ----------------------------------------------------------------------------- GPU execution
def errstate(xp, **kwargs):
    """``xp.errstate(**kwargs)`` where the module has one (NumPy); a no-op context otherwise
    (GPU arithmetic never warns)."""
    es = getattr(xp, "errstate", None)
    return es(**kwargs) if es is not None else contextlib.nullcontext()
