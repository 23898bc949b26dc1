"""The one place that knows about NumPy versus CuPy.

Everything else asks this module for the array module of its inputs (``xp``),
moves arrays between devices through it, and draws random numbers from its
seeded generators. CuPy is imported lazily, only when a 'cuda' device is asked
for, so ``import tensorgrad`` never touches it.
"""

from __future__ import annotations

import numpy as np

_cupy = None  # the cupy module once imported, False if the import failed
_cupy_error: str | None = None

CUDA_HINT = (
    "CUDA device requested but {why}. Install the GPU extra: "
    'pip install -e ".[cuda]" (or the cupy-cudaXXx wheel matching your CUDA version)'
)


def _import_cupy():
    """Import CuPy once; return the module or None (with the reason kept)."""
    global _cupy, _cupy_error
    if _cupy is None:
        try:
            import cupy  # noqa: PLC0415  (lazy on purpose)

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA GPU was found")
            _cupy = cupy
        except Exception as e:  # ImportError, CUDARuntimeError, ...
            _cupy = False
            _cupy_error = (
                "CuPy is not installed" if isinstance(e, ImportError) else f"CuPy failed: {e}"
            )
    return _cupy or None


def cuda_available() -> bool:
    return _import_cupy() is not None


def require_cupy():
    cp = _import_cupy()
    if cp is None:
        raise RuntimeError(CUDA_HINT.format(why=_cupy_error or "CuPy is unavailable"))
    return cp


def get_array_module(*arrays):
    """NumPy or CuPy, whichever holds the arrays (NumPy for scalars)."""
    if _cupy:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return np


def device_of(array) -> str:
    return "cuda" if (_cupy and isinstance(array, _cupy.ndarray)) else "cpu"


def parse_device(device) -> str:
    if device is None:
        return "cpu"
    d = str(device)
    if d == "cpu":
        return "cpu"
    if d == "cuda" or d.startswith("cuda:"):
        return "cuda"
    raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda'")


def xp_for(device) -> object:
    """The array module for a device name."""
    return require_cupy() if parse_device(device) == "cuda" else np


def to_device(array, device):
    """Copy an array to 'cpu' or 'cuda' (no copy when already there)."""
    device = parse_device(device)
    if device == device_of(array):
        return array
    if device == "cuda":
        return require_cupy().asarray(array)
    return array.get()


def to_numpy(array) -> np.ndarray:
    return array.get() if device_of(array) == "cuda" else np.asarray(array)


# ----------------------------------------------------------------------------- random numbers
class _Generators:
    """One seeded generator per device; manual_seed resets both."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.cpu = np.random.Generator(np.random.PCG64(seed))
        self._cuda = None

    def manual_seed(self, seed: int):
        self.seed = int(seed)
        self.cpu = np.random.Generator(np.random.PCG64(self.seed))
        self._cuda = None

    def get(self, device: str = "cpu"):
        if parse_device(device) == "cpu":
            return self.cpu
        if self._cuda is None:
            cp = require_cupy()
            self._cuda = cp.random.Generator(cp.random.XORWOW(self.seed))
        return self._cuda


generators = _Generators()


def manual_seed(seed: int) -> None:
    """Seed every device's generator, so that a run repeats exactly."""
    generators.manual_seed(seed)


def rng(device: str = "cpu"):
    return generators.get(device)


def get_rng_state() -> dict:
    """The CPU generator's state as a JSON-able dict (for checkpoints)."""
    return {"seed": generators.seed, "cpu": generators.cpu.bit_generator.state}


def set_rng_state(state: dict) -> None:
    generators.manual_seed(state["seed"])
    generators.cpu.bit_generator.state = state["cpu"]
