"""``tensorgrad.nn``: modules and layers (``nn.Module``, ``nn.Linear``, ...), as in ``torch.nn``.

modules.py     Module, Parameter and the layers (a GPT's, BatchNorm1d, Flatten, ...)
functional.py  F.*: softmax, cross_entropy, layer_norm, ... (``torch.nn.functional``)
init.py        in-place initialisers (``nn.init.normal_``, ...)
utils.py       ``clip_grad_norm_``, ``clip_grad_value_``
parallel.py    ``DistributedDataParallel``
"""

from . import functional, init, parallel, utils
from .modules import (
    GELU,
    BatchNorm1d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
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
    Unflatten,
)

__all__ = [
    "Module",
    "Parameter",
    "Linear",
    "Embedding",
    "LayerNorm",
    "BatchNorm1d",
    "Flatten",
    "Unflatten",
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
