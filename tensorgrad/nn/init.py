"""In-place parameter initialisers, as ``torch.nn.init``: no graph is recorded, and the
values come from tensorgrad's seeded generator (``tg.manual_seed``) on the tensor's device
(or from ``generator=``, a ``tg.Generator``).

Imports: math, ..autograd.
"""

from __future__ import annotations

import math

from ..autograd import no_grad


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for an activation, as torch.nn.init.calculate_gain."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fans(tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise ValueError(
            "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions"
        )
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def constant_(tensor, val: float):
    with no_grad():
        return tensor.fill_(val)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def trunc_normal_(
    tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator=None
):
    """N(mean, std²) samples, redrawn until they fall inside [a, b] (absolute bounds)."""
    with no_grad():
        tensor.normal_(mean, std, generator=generator)
        xp_data = tensor.array
        bad = (xp_data < a) | (xp_data > b)
        while bool(bad.any()):
            fresh = tensor.clone().normal_(mean, std, generator=generator).array
            xp_data[bad] = fresh[bad]
            bad = (xp_data < a) | (xp_data > b)
        tensor.mark_written()
    return tensor


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator=generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator=generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(tensor)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in" else fan_out)


def kaiming_uniform_(
    tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator=None
):
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator=generator)


def kaiming_normal_(
    tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator=None
):
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator=generator)
