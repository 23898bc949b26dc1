"""``tensorgrad.backends``: PyTorch's switches for GPU math, mapped onto what tensorgrad has.

    tg.backends.cuda.matmul.allow_tf32 = True    # float32 GPU matmuls on TF32 tensor cores
    tg.backends.cudnn.allow_tf32 = True          # stored only: tensorgrad has no cuDNN ops

``backends.cuda.matmul.allow_tf32`` is a view of ``tensorgrad.cuda`` matmul precision: True
sets 'tf32' (when it is 'highest'), False sets 'highest' (when it is 'tf32'), and reading it
says whether GPU matmuls use reduced-precision inputs. On the CPU nothing changes: its
matmuls are float32 (or the tensors' dtype) always. Not to be confused with
``tensorgrad.devices``, the NumPy / CuPy layer.

Imports: ..cuda.
"""

from __future__ import annotations

from ..cuda.ops import get_matmul_precision, set_matmul_precision


class _Matmul:
    @property
    def allow_tf32(self) -> bool:
        return get_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        now = get_matmul_precision()
        if value and now == "highest":
            set_matmul_precision("tf32")
        elif not value and now == "tf32":
            set_matmul_precision("highest")


class _Cuda:
    matmul = _Matmul()

    @staticmethod
    def is_built() -> bool:
        return True  # the CUDA path needs no build step: CuPy compiles at run time


class _Cudnn:
    """Stored flags: tensorgrad has no cuDNN kernels (no convolutions), so they change nothing."""

    allow_tf32 = True
    benchmark = False
    deterministic = False
    enabled = True

    @staticmethod
    def is_available() -> bool:
        return False


class _Mps:
    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def is_built() -> bool:
        return False


cuda = _Cuda()
cudnn = _Cudnn()
mps = _Mps()

__all__ = ["cuda", "cudnn", "mps"]
