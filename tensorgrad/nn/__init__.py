"""``tensorgrad.nn``: modules and layers (``nn.Module``, ``nn.Linear``, ...), as in ``torch.nn``.

module.py      Parameter, Module, ModuleList, ModuleDict: the module machinery
layers.py      the layers a GPT is made of: Linear, Embedding, LayerNorm, Dropout, GELU
more_layers.py the other layers: BatchNorm1d, Flatten, Sequential, ReLU, ..., CrossEntropyLoss
functional.py  F.*: softmax, cross_entropy, layer_norm, ... (``torch.nn.functional``); the F
               functions a GPT does not use come from activations.py and losses.py
init.py        in-place initialisers (``nn.init.normal_``, ...)
utils.py       ``clip_grad_norm_``, ``clip_grad_value_``
parallel.py    ``DistributedDataParallel``

Imports: .functional, .init, .layers, .module, .more_layers, .parallel, .utils.
"""

from . import functional, init, parallel, utils
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear
from .module import Module, ModuleDict, ModuleList, Parameter
from .more_layers import (
    BatchNorm1d,
    CrossEntropyLoss,
    Flatten,
    Identity,
    MSELoss,
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
