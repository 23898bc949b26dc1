"""Utilities over a model's parameters: gradient clipping.

Imports: math, ..devices, ..tensor.
"""

from __future__ import annotations

import math

from ..devices import get_array_module, to_numpy
from ..tensor import Tensor


def _with_grads(parameters) -> list:
    if hasattr(parameters, "grad"):
        parameters = [parameters]
    return [p for p in parameters if p.grad is not None]


def clip_grad_norm_(
    parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> Tensor:
    """Scale all gradients so that their joint ``norm_type``-norm (2 or inf) is at most
    ``max_norm``.

    Returns the norm before clipping as a 0-d tensor in the gradients' dtype on their device (as
    PyTorch; ``float(...)`` or ``.item()`` gives the number); inf/nan pass through unscaled so
    the caller sees them (or raise with ``error_if_nonfinite``).
    """
    inf = norm_type in (math.inf, "inf")
    if not inf and float(norm_type) != 2.0:
        raise ValueError(f"clip_grad_norm_: norm_type must be 2.0 or inf, got {norm_type}")
    params = _with_grads(parameters)
    if not params:
        return Tensor(0.0)
    grads = [p.grad.array for p in params]
    if inf:
        total = max(float(to_numpy(abs(g).max())) if g.size else 0.0 for g in grads)
    else:
        total = math.sqrt(sum(float(to_numpy((g * g).sum())) for g in grads))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of the gradients is {total}")
    if max_norm is not None and max_norm > 0 and math.isfinite(total):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for p in params:
                # a new array: gradient arrays may be shared between tensors
                p.grad.array = p.grad.array * p.grad.array.dtype.type(coef)
    xp = get_array_module(grads[0])
    return Tensor(xp.asarray(total, dtype=grads[0].dtype), dtype=grads[0].dtype)


def clip_grad_value_(parameters, clip_value: float) -> None:
    """Clamp every gradient element to [-clip_value, clip_value], in place."""
    for p in _with_grads(parameters):
        xp = get_array_module(p.grad.array)
        p.grad.array = xp.clip(p.grad.array, -clip_value, clip_value)
