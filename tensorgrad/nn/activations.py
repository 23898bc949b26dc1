"""The F functions a GPT does not use, other than losses: ``log_softmax``, ``batch_norm``,
``silu``, ``tanh``, ``sigmoid``, ``pad``, ``softplus``, ``leaky_relu``, ``elu``, ``normalize``
(``tensorgrad.nn.functional`` re-exports each: ``F.silu``).

Imports: ..autograd, ..factory, ..ops, ..tensor.
"""

from __future__ import annotations

from ..autograd import no_grad
from ..factory import where
from ..ops.dims import wrap_dim
from ..ops.more_shape import Pad
from ..ops.nn import LogSoftmax
from ..tensor import Tensor


def log_softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor:
    """x - logsumexp(x) along ``dim`` (max-shifted, so ±1e4 logits stay finite)."""
    x = x if dtype is None else x.to(dtype)
    return LogSoftmax.apply(x, dim=wrap_dim("log_softmax", dim, x.ndim))


def batch_norm(
    x: Tensor,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1), over every other dim.

    training: the batch's mean and biased variance, and the running statistics (when given)
    updated in place, ``(1 - momentum)·running + momentum·batch`` with the unbiased variance;
    else the running statistics. Composed of Tensor ops, which give its gradient."""
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected an input of (N, C, ...), got {tuple(x.shape)}")
    dims = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)  # statistics broadcast along the channels
    if training:
        n = x.numel() // x.shape[1]
        if n <= 1:
            raise ValueError(
                "Expected more than 1 value per channel when training, got input size "
                f"{tuple(x.shape)}"
            )
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        with no_grad():
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(mean * momentum)
            if running_var is not None:
                running_var.mul_(1 - momentum).add_(var * (momentum * n / (n - 1)))
    else:
        mean, var = running_mean, running_var
    y = (x - mean.view(shape)) / (var.view(shape) + eps).sqrt()
    if weight is not None:
        y = y * weight.view(shape)
    return y if bias is None else y + bias.view(shape)


def silu(x: Tensor) -> Tensor:
    """x·sigmoid(x) (swish)."""
    return x * x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def pad(x: Tensor, pad, mode: str = "constant", value: float = 0.0) -> Tensor:
    """Constant padding, ``pad`` = (left, right) for the last dim, then the one before, ...;
    negative amounts crop. Only mode='constant'."""
    if mode != "constant":
        raise NotImplementedError(f"pad: only mode='constant' is supported, got {mode!r}")
    return Pad.apply(x, tuple(pad), value=0.0 if value is None else value)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(βx))/β, and x itself where βx > threshold (as PyTorch)."""
    bx = x * beta
    soft = (((-bx.abs()).exp() + 1.0).log() + bx.relu()) / beta
    return where(bx > threshold, x, soft)


def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x where x > 0, else negative_slope·x."""
    return where(x > 0, x, x * negative_slope)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, else alpha·(exp(x) - 1)."""
    return where(x > 0, x, (x.clamp(max=0.0).exp() - 1.0) * alpha)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(‖x‖_p, eps) along ``dim``."""
    return x / x.norm(p, dim, keepdim=True).clamp(min=eps)
