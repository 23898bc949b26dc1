"""PyTorch's path ``torch.nn.modules``: the classes of ``tensorgrad.nn`` (Module, Linear,
...), for code that imports them from there, and the one list of them that ``tensorgrad.nn``
exports. They live in module.py, layers.py and more_layers.py.

Imports: .layers, .module, .more_layers.
"""

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
    "BatchNorm1d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "Identity",
    "LayerNorm",
    "Linear",
    "MSELoss",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "ReLU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "Unflatten",
]
