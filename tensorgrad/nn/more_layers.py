"""The layers a GPT does not use, as ``torch.nn``'s: ``BatchNorm1d``, ``Flatten``, ``Unflatten``,
``Sequential``, ``Identity``, the activations ``ReLU``, ``Tanh``, ``Sigmoid``, ``SiLU``,
``Softmax``, and the losses ``CrossEntropyLoss`` and ``MSELoss``.

Imports: collections, numpy, .functional, .module, ..devices, ..tensor.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import devices
from ..tensor import DEFAULT_DTYPE, Tensor
from . import functional as F
from .module import Module, ModuleList, Parameter


class BatchNorm1d(Module):
    """F.batch_norm over (N, C) or (N, C, L): batch statistics while training (the running
    ones updated), running statistics in eval(). ``momentum=None``: the running statistics
    are the plain average over the batches seen."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        bias: bool = True,
    ):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        c = (num_features,)
        self.weight = Parameter(np.ones(c, DEFAULT_DTYPE)) if affine else None
        self.bias = Parameter(np.zeros(c, DEFAULT_DTYPE)) if affine and bias else None
        stats = {
            "running_mean": np.zeros(c, DEFAULT_DTYPE),
            "running_var": np.ones(c, DEFAULT_DTYPE),
        }
        stats["num_batches_tracked"] = np.array(0, np.int64)
        for name, a in stats.items():
            buf = Tensor(a, device=devices.default_device) if track_running_stats else None
            self.register_buffer(name, buf)

    def forward(self, x):
        if x.ndim not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {x.ndim}D input)")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # the cumulative average
                momentum = 1.0 / self.num_batches_tracked.item()
        batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(
            x,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            batch_stats,
            momentum,
            self.eps,
        )

    def extra_repr(self):
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class Flatten(Module):
    """x.flatten(start_dim, end_dim): by default everything but the batch dim."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """x.unflatten(dim, unflattened_size): one dim split into several."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Sequential(ModuleList):
    """Modules applied in order; ``Sequential(OrderedDict(name=module))`` names them, and a
    slice is a Sequential of the same modules."""

    def __init__(self, *modules):
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            Module.__init__(self)
            for name, m in modules[0].items():
                setattr(self, name, m)
        else:
            super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(OrderedDict(list(self._modules.items())[i]))
        return super().__getitem__(i)


class Identity(Module):
    def forward(self, x):
        return x


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class CrossEntropyLoss(Module):
    """F.cross_entropy as a module: logits (N, C) or (N, C, d1, ...) against class ids."""

    def __init__(
        self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0
    ):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, logits, target):
        return F.cross_entropy(
            logits,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, x, target):
        return F.mse_loss(x, target, reduction=self.reduction)
