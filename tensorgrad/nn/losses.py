"""The losses a GPT does not use, as F functions: ``nll_loss``, ``mse_loss``, ``l1_loss``,
``binary_cross_entropy_with_logits``, ``one_hot``, and the branches of ``F.cross_entropy``
for class probabilities (``soft_cross_entropy``) and label smoothing
(``smoothed_cross_entropy``). ``tensorgrad.nn.functional`` re-exports the F names. Each is
on PyTorch's CPU autocast float32 list: in an autocast block its inputs are cast to float32.

Imports: numpy, .activations, ..amp, ..autograd, ..devices, ..tensor.
"""

from __future__ import annotations

import numpy as np

from ..amp import float32_inputs
from ..autograd import is_grad_enabled
from ..autograd.graph import note_value_read
from ..devices import get_array_module
from ..tensor import Tensor, as_array
from .activations import log_softmax


def _reduce(rows: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return rows.mean()
    if reduction == "sum":
        return rows.sum()
    if reduction == "none":
        return rows
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse_loss(x: Tensor, target, reduction: str = "mean") -> Tensor:
    """mean((x - target)²) (broadcast, as PyTorch)."""
    x, target = float32_inputs(x, target)
    d = x - target
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(x: Tensor, target, reduction: str = "mean") -> Tensor:
    x, target = float32_inputs(x, target)
    return _reduce((x - target).abs(), reduction, "l1_loss")


def one_hot(idx, num_classes: int = -1) -> Tensor:
    """int64 (..., num_classes) with a 1 at each id (num_classes -1: max id + 1)."""
    note_value_read(idx, "one_hot")
    t = as_array(idx)
    n = int(t.max()) + 1 if num_classes < 0 else num_classes
    xp = get_array_module(t)
    return Tensor((t[..., None] == xp.arange(n)).astype(xp.int64), dtype=xp.int64)


def _classes_last(x: Tensor, t):
    """(N, C, d1, ...) logits and (N, d1, ...) targets as (M, C) and (M,)."""
    if x.ndim == 1:
        return x.unsqueeze(0), t.reshape(1)
    if x.ndim > 2:
        return x.movedim(1, -1).reshape(-1, x.shape[1]), t.reshape(-1)
    return x, t


def nll_loss(logp: Tensor, target, weight=None, ignore_index: int = -100, reduction="mean"):
    """-weight[t]·logp[t] per position, for log-probabilities (N, C) or (N, C, d1, ...) and
    class ids (N,) or (N, d1, ...); 'mean' divides by the summed weight of the kept positions."""
    t = as_array(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"nll_loss: target must hold integer class ids, got {t.dtype}")
    if getattr(weight, "requires_grad", False) and is_grad_enabled():
        raise RuntimeError("nll_loss: the derivative for 'weight' is not implemented (detach it)")
    note_value_read(target, "nll_loss's kept targets")
    (logp,) = float32_inputs(logp)
    x, tf = _classes_last(logp, t)
    keep = tf != ignore_index
    xp = get_array_module(tf)
    safe = xp.where(keep, tf, 0).astype(np.int64)
    picked = -x.gather(1, safe[:, None]).squeeze(1)  # (M,)
    w = xp.ones(x.shape[1], dtype=x.dtype.type) if weight is None else as_array(weight)
    wt = xp.where(keep, w[safe], 0).astype(x.dtype.type)
    rows = picked * Tensor(wt)
    if reduction == "none":
        return rows.reshape(t.shape) if logp.ndim != 1 else rows.reshape(())
    if reduction == "mean":
        return rows.sum() / float(wt.sum())
    return _reduce(rows, reduction, "nll_loss")


def soft_cross_entropy(logits: Tensor, target, weight, reduction: str, eps: float) -> Tensor:
    """cross_entropy against class probabilities: -sum_c weight_c·target_c·log p_c per row."""
    logits, target = float32_inputs(logits, target)
    t = target if isinstance(target, Tensor) else Tensor(target)
    if t.shape != logits.shape:
        raise ValueError(
            f"cross_entropy: probability targets of shape {tuple(t.shape)} do not match logits "
            f"of shape {tuple(logits.shape)}"
        )
    cdim = 1 if logits.ndim > 1 else 0
    c = logits.shape[cdim]
    if eps:
        t = t * (1.0 - eps) + eps / c
    logp = log_softmax(logits, cdim)
    if weight is not None:
        w = weight if isinstance(weight, Tensor) else Tensor(weight)
        logp = logp * w.reshape([c] + [1] * (logits.ndim - cdim - 1))
    rows = -(t * logp).sum(cdim)
    if reduction == "mean":
        return rows.sum() / (rows.numel() if logits.ndim > 1 else 1)
    return _reduce(rows, reduction, "cross_entropy")


def binary_cross_entropy_with_logits(
    x: Tensor, target, weight=None, reduction: str = "mean", pos_weight=None
) -> Tensor:
    """-[pos_weight·y·log σ(x) + (1-y)·log(1-σ(x))]·weight, written with
    log σ(x) = -softplus(-x) so that large |x| stay finite."""
    x, target = float32_inputs(x, target)
    y = target if isinstance(target, Tensor) else Tensor(target)
    log1p_exp = ((-x.abs()).exp() + 1.0).log() + (-x).relu()  # softplus(-x) = -log σ(x)
    if pos_weight is None:
        rows = (1.0 - y) * x + log1p_exp
    else:
        rows = (1.0 - y) * x + (1.0 + (pos_weight - 1.0) * y) * log1p_exp
    if weight is not None:
        rows = rows * weight
    return _reduce(rows, reduction, "binary_cross_entropy_with_logits")


def smoothed_cross_entropy(logits, target, ignore_index, reduction, eps, cross_entropy):
    """cross_entropy with label smoothing, composed from the fused loss and log_softmax.

    ``cross_entropy`` is F.cross_entropy (passed in, as F imports this module): its fused loss
    gives each position's -log p[target]."""
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {eps}")
    (logits,) = float32_inputs(logits)
    nll = cross_entropy(logits, target, ignore_index=ignore_index, reduction="none")
    cdim = 1 if logits.ndim > 1 else 0
    uniform = -log_softmax(logits, cdim).mean(cdim)  # (N, d1, ...): -mean_c log p_c
    note_value_read(target, "label smoothing's kept targets")
    valid = as_array(target) != ignore_index
    rows = uniform.masked_fill(~valid, 0.0) * eps + nll * (1.0 - eps)
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / float(valid.sum())
