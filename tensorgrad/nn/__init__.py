"""``tensorgrad.nn``: modules and layers (``nn.Module``, ``nn.Linear``, ...), as in ``torch.nn``.

module.py      Parameter, Module, ModuleList, ModuleDict: the module machinery
layers.py      the layers a GPT is made of: Linear, Embedding, LayerNorm, Dropout, GELU
more_layers.py the other layers: BatchNorm1d, Flatten, Sequential, ReLU, ..., CrossEntropyLoss
modules.py     all of them again, at PyTorch's path ``torch.nn.modules``
functional.py  F.*: softmax, cross_entropy, layer_norm, ... (``torch.nn.functional``); the F
               functions a GPT does not use come from activations.py and losses.py
init.py        in-place initialisers (``nn.init.normal_``, ...)
utils.py       ``clip_grad_norm_``, ``clip_grad_value_``
parallel.py    ``DistributedDataParallel``

Imports: .functional, .init, .modules, .parallel, .utils.
"""

from . import functional, init, parallel, utils
from .modules import *  # noqa: F403  (the layers, listed once in modules.py)
from .modules import __all__ as _layers

__all__ = [*_layers, "functional", "init", "utils", "parallel"]
