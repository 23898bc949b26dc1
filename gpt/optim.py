"""What is GPT-specific about optimisation: the learning-rate schedule.

The optimizers themselves belong to the framework (``tensorgrad.optim``), as in PyTorch;
``AdamW`` and ``clip_grad_norm_`` are re-exported here so that existing imports keep working.
The decay / no-decay parameter groups are ``GPT.configure_optimizers`` (gpt/model.py).
"""

from __future__ import annotations

import math

from tensorgrad.nn.utils import clip_grad_norm_
from tensorgrad.optim import AdamW, adamw_update

__all__ = ["AdamW", "adamw_update", "clip_grad_norm_", "cosine_lr"]


def cosine_lr(
    it: int, warmup_iters: int, lr_decay_iters: int, max_lr: float, min_lr: float
) -> float:
    """Learning rate at iteration ``it``: linear warmup, cosine decay, then a floor.

    it < warmup_iters: max_lr·(it+1)/(warmup_iters+1) (never 0, reaches max_lr at warmup_iters);
    warmup_iters <= it < lr_decay_iters: cosine from max_lr down to min_lr; after: min_lr.
    """
    if it < warmup_iters:
        return max_lr * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
