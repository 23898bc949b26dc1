"""``tensorgrad.cuda``: the GPU side (as ``torch.cuda``), without importing CuPy until asked.

kernels.py   fused CUDA kernels (CUDA C sources and their CuPy launch wrappers)
flash.py     flash attention: tiled online softmax, forward and backward
ops.py       those kernels registered for the 'cuda' device, and matmul precision
"""

from .. import backend
from ..backend import CUDA_HINT, cuda_available
from .ops import get_matmul_precision, set_matmul_precision


def is_available() -> bool:
    """Whether CuPy imports and sees an NVIDIA GPU (imports CuPy on the first call)."""
    return cuda_available()


def unavailable_reason() -> str | None:
    """None when CUDA is usable, else one line saying why and how to install it."""
    if cuda_available():
        return None
    return CUDA_HINT.format(why=backend.cuda_error() or "CuPy is unavailable")


__all__ = ["is_available", "unavailable_reason", "set_matmul_precision", "get_matmul_precision"]
