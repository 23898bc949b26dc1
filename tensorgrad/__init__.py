"""tensorgrad: a tiny tape-based autograd framework on NumPy (CuPy on NVIDIA GPUs).

    import tensorgrad as tg
    import tensorgrad.nn.functional as F
    x = tg.randn(4, 3, requires_grad=True)
    F.softmax(x @ x.T, dim=-1).sum().backward()

Its names are PyTorch's (``import tensorgrad as torch`` ports GPT code;
docs/porting-differences.md lists what differs on purpose).

Imports: numpy, ._inductor, .amp, .autograd, .backends, .compiler, .cuda, .devices,
.distributed, .factory, .gradcheck, .kernels, .nn, .ops, .optim, .sampling, .serialization,
.tensor, .tensor_functions, .types, .utils, .version, .viz.
"""

import numpy as _np

from . import (
    _inductor,  # noqa: F401  (torch._inductor.config: scripts set it)
    amp,
    autograd,
    backends,
    cuda,
    distributed,
    kernels,
    nn,
    optim,
    utils,
    version,
    viz,
)
from .amp import autocast
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .compiler import compile  # noqa: A004  (torch.compile)
from .cuda import amp as _cuda_amp  # noqa: F401  (binds tensorgrad.cuda.amp)
from .cuda.ops import get_float32_matmul_precision, set_float32_matmul_precision
from .devices import (
    device_of,
    get_array_module,
    get_rng_state,
    set_rng_state,
    to_device,
    to_numpy,
    tune_cpu_malloc,
)
from .devices import rng as generator
from .factory import (
    arange,
    as_tensor,
    cat,
    concat,
    empty,
    empty_like,
    eye,
    full,
    full_like,
    get_default_device,
    linspace,
    ones,
    ones_like,
    rand,
    rand_like,
    randn,
    randn_like,
    set_default_device,
    stack,
    tensor,
    tril,
    triu,
    where,
    zeros,
    zeros_like,
)
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from .kernels import cpu_blas as _cpu_blas  # noqa: F401  (OpenBLAS's idle wait, set at import)
from .kernels import cpu_chunked  # noqa: F401  (registers the CPU kernels)
from .kernels.threads import get_num_threads, set_num_threads
from .ops import tensor_xp  # noqa: F401  (registers the namespace differentiable backwards use)
from .ops.dtypes import result_type
from .sampling import Generator, default_generator, manual_seed, multinomial, randint, randperm
from .serialization import load, save
from .tensor import Size, Tensor, as_array
from .tensor_functions import *  # noqa: F403  (torch.tanh, torch.topk, ...: the Tensor methods)
from .tensor_functions import __all__ as _functions_all
from .types import as_dtype, bfloat16, device, dtype, finfo, iinfo

try:  # compiled CPU kernels, where numba is installed (a default dependency)
    from .kernels import (  # noqa: F401  (imported to register their kernels)
        cpu_gpt2_block,
        cpu_numba,
        cpu_numba_adamw,
        cpu_numba_attention,
        cpu_numba_embedding,
    )
except ImportError:
    cpu_numba = None

__version__ = version.__version__

float32, float64, float16 = (as_dtype(_t) for _t in (_np.float32, _np.float64, _np.float16))
int8, int16, int32, int64 = (as_dtype(_t) for _t in (_np.int8, _np.int16, _np.int32, _np.int64))
uint8, bool_ = as_dtype(_np.uint8), as_dtype(_np.bool_)
long, half, double = int64, float16, float64
# torch.float, torch.int, torch.bool (last: inside this module they shadow the builtins)
float, int, bool = float32, int32, bool_


def from_numpy(a) -> Tensor:
    return Tensor(a, dtype=a.dtype)


def is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def inference_mode(mode: bool = True):
    """As ``no_grad`` (``mode=False``: as ``enable_grad``); a context manager and decorator."""
    return no_grad() if mode else enable_grad()


def get_default_dtype():
    return float32


__all__ = [
    "Tensor",
    "Size",
    "tensor",
    "zeros",
    "ones",
    "full",
    "empty",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "randn",
    "rand",
    "randn_like",
    "rand_like",
    "randint",
    "randperm",
    "multinomial",
    "Generator",
    "default_generator",
    "arange",
    "linspace",
    "eye",
    "cat",
    "concat",
    "stack",
    "where",
    "tril",
    "triu",
    "no_grad",
    "inference_mode",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "generator",
    "gradcheck",
    "gradgradcheck",
    "GradcheckError",
    "autograd",
    "nn",
    "optim",
    "cuda",
    "kernels",
    "from_numpy",
    "as_tensor",
    "as_array",
    "is_tensor",
    "get_array_module",
    "device_of",
    "to_device",
    "to_numpy",
    "tune_cpu_malloc",
    "save",
    "load",
    "result_type",
    "dtype",
    "device",
    "finfo",
    "iinfo",
    "get_default_dtype",
    "set_default_device",
    "get_default_device",
    "__version__",
    "distributed",
    "viz",
    "amp",
    "autocast",
    "bfloat16",
    "backends",
    "compile",
    "set_float32_matmul_precision",
    "get_float32_matmul_precision",
    "set_num_threads",
    "get_num_threads",
    "version",
    "utils",
]
__all__.extend(_functions_all)
