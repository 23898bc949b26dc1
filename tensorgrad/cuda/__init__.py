"""``tensorgrad.cuda``: the GPU side (as ``torch.cuda``), without importing CuPy until asked.

kernels.py   fused CUDA kernels (CUDA C sources and their CuPy launch wrappers)
flash.py     flash attention: tiled online softmax, forward and backward
ops.py       those kernels registered for the 'cuda' device, and matmul precision
amp.py       GradScaler and autocast bound to 'cuda' (``torch.cuda.amp``)

Without a GPU: ``is_available()`` and ``is_bf16_supported()`` are False, ``device_count()``
is 0, ``manual_seed``/``manual_seed_all`` store the seed for a GPU generator made later,
``synchronize()`` has nothing to wait for, and ``set_device``/``current_device`` raise.

Imports: .ops, ..devices.
"""

from .. import devices
from ..devices import CUDA_HINT, cuda_available
from .ops import get_matmul_precision, set_matmul_precision


def is_available() -> bool:
    """Whether CuPy imports and sees an NVIDIA GPU (imports CuPy on the first call)."""
    return cuda_available()


def unavailable_reason() -> str | None:
    """None when CUDA is usable, else one line saying why and how to install it."""
    if cuda_available():
        return None
    return CUDA_HINT.format(why=devices.cuda_error() or "CuPy is unavailable")


def _require(what: str):
    if not cuda_available():
        raise RuntimeError(f"cuda.{what}: {unavailable_reason()}")
    return devices.require_cupy()


def device_count() -> int:
    return devices.require_cupy().cuda.runtime.getDeviceCount() if cuda_available() else 0


def current_device() -> int:
    return _require("current_device").cuda.Device().id


def set_device(device) -> None:
    """Make GPU ``device`` (an int, 'cuda:N' or 'cuda') CuPy's current device."""
    cp = _require("set_device")
    index = device if isinstance(device, int) else str(device).partition(":")[2] or "0"
    if not str(index).isdigit() or int(index) >= device_count():
        raise ValueError(f"cuda.set_device: no GPU {device!r} ({device_count()} GPU(s) here)")
    cp.cuda.Device(int(index)).use()


def synchronize(device=None) -> None:
    """Wait for the current GPU's queued work; nothing to wait for without a GPU."""
    if cuda_available():
        devices.require_cupy().cuda.Device().synchronize()


def is_bf16_supported() -> bool:
    """Whether the GPU has bfloat16 tensor cores (compute capability 8.0 or later)."""
    if not cuda_available():
        return False
    return int(devices.require_cupy().cuda.Device().compute_capability) >= 80


def manual_seed(seed: int) -> None:
    """Seed the GPU's generator (the CPU's is ``tensorgrad.manual_seed``, which seeds both)."""
    devices.generators.manual_seed_cuda(seed)


def manual_seed_all(seed: int) -> None:
    """The same as ``manual_seed``: tensorgrad has one GPU generator."""
    devices.generators.manual_seed_cuda(seed)


# --------------------------------------------------------------------------- memory statistics
# PyTorch's names; without a GPU each answers as PyTorch's CPU build does (0 bytes). On a GPU
# they read CuPy's memory pool: "allocated" is what tensors hold, "reserved" what the pool
# holds, and a peak is the pool's size (it grows to the peak and keeps it until emptied).
def _pool():
    return devices.require_cupy().get_default_memory_pool() if cuda_available() else None


def memory_allocated(device=None) -> int:
    pool = _pool()
    return 0 if pool is None else int(pool.used_bytes())


def memory_reserved(device=None) -> int:
    pool = _pool()
    return 0 if pool is None else int(pool.total_bytes())


def max_memory_allocated(device=None) -> int:
    return memory_reserved(device)


def max_memory_reserved(device=None) -> int:
    return memory_reserved(device)


def reset_peak_memory_stats(device=None) -> None:
    """Start the peaks afresh: on a GPU the pool gives its unused blocks back."""
    empty_cache()


reset_max_memory_allocated = reset_peak_memory_stats


def empty_cache() -> None:
    pool = _pool()
    if pool is not None:
        pool.free_all_blocks()


__all__ = [
    "current_device",
    "empty_cache",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "device_count",
    "get_matmul_precision",
    "is_available",
    "is_bf16_supported",
    "manual_seed",
    "manual_seed_all",
    "set_device",
    "set_matmul_precision",
    "synchronize",
    "unavailable_reason",
]
