"""``tensorgrad.nn``: modules and layers (``nn.Module``, ``nn.Linear``, ...), as in ``torch.nn``.

modules.py     Module, Parameter and the layers a GPT is made of
functional.py  the same functions as ``tensorgrad.functional`` (``torch.nn.functional``)
init.py        in-place initialisers (``nn.init.normal_``, ...)
utils.py       ``clip_grad_norm_``, ``clip_grad_value_``
parallel.py    ``DistributedDataParallel``
"""

from . import functional, init, parallel, utils
from .modules import (
    GELU,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Identity,
    LayerNorm,
    Linear,
    Module,
    ModuleDict,
    ModuleList,
    MSELoss,
    Parameter,
    ReLU,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)

__all__ = [
    "Module",
    "Parameter",
    "Linear",
    "Embedding",
    "LayerNorm",
    "Dropout",
    "GELU",
    "ReLU",
    "ModuleList",
    "ModuleDict",
    "Sequential",
    "Identity",
    "Tanh",
    "Sigmoid",
    "SiLU",
    "Softmax",
    "CrossEntropyLoss",
    "MSELoss",
    "functional",
    "init",
    "utils",
    "parallel",
]
