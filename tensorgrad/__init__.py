"""tensorgrad: a tiny tape-based autograd framework on NumPy (CuPy on NVIDIA GPUs).

    import tensorgrad as tg
    import tensorgrad.functional as F
    x = tg.randn(4, 3, requires_grad=True)
    F.softmax(x @ x.T, dim=-1).sum().backward()
"""

import numpy as _np

from . import cuda, distributed, functional, kernels, nn, optim, viz
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .backend import (
    device_of, get_array_module, get_rng_state, manual_seed, set_rng_state, to_device, to_numpy,
    tune_cpu_malloc,
)
from .backend import rng as generator
from .factory import (
    arange, cat, concat, empty, full, ones, ones_like, rand, randint, randn, stack, tensor, tril,
    triu, where, zeros, zeros_like,
)
from .gradcheck import GradcheckError, gradcheck
from .kernels import cpu_chunked  # noqa: F401  (registers the CPU kernels)
from .tensor import Tensor, as_array

float32, float64, float16 = _np.float32, _np.float64, _np.float16
int32, int64, uint8, bool_ = _np.int32, _np.int64, _np.uint8, _np.bool_
long = int64


def from_numpy(a) -> Tensor:
    return Tensor(a, dtype=a.dtype)


__all__ = [
    "Tensor", "tensor", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "randn",
    "rand", "randint", "arange", "cat", "concat", "stack", "where", "tril", "triu", "no_grad",
    "enable_grad", "set_grad_enabled", "is_grad_enabled", "manual_seed", "get_rng_state",
    "set_rng_state", "generator", "gradcheck", "GradcheckError", "functional", "nn", "optim",
    "cuda", "kernels", "from_numpy", "as_array", "get_array_module", "device_of", "to_device",
    "to_numpy", "tune_cpu_malloc", "distributed",
]
