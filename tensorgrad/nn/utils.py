"""Utilities over a model's parameters: gradient clipping."""

from __future__ import annotations

import math

from ..backend import to_numpy
from ..tensor import Tensor


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale all gradients so that their joint L2 norm is at most ``max_norm``.

    Returns the norm before clipping as a 0-d float32 tensor on the gradients' device (as
    PyTorch; ``float(...)`` or ``.item()`` gives the number); inf/nan pass through unscaled so
    the caller sees them.
    """
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_: only norm_type=2.0 is supported, got {norm_type}")
    if hasattr(parameters, "grad"):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    total = math.sqrt(sum(float(to_numpy((p.grad.data * p.grad.data).sum())) for p in params))
    if max_norm is not None and max_norm > 0 and math.isfinite(total):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for p in params:
                # a new array: gradient arrays may be shared between tensors
                p.grad.data = p.grad.data * p.grad.dtype.type(coef)
    return Tensor(total, device=params[0].device if params else None)
