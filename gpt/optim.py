"""What is GPT-specific about optimisation: the learning-rate schedule, and a run's AdamW.

The optimizers themselves belong to the framework (``tensorgrad.optim``), as in PyTorch;
``AdamW`` and ``clip_grad_norm_`` are re-exported here so that existing imports keep working.
The decay / no-decay parameter groups are ``GPT.configure_optimizers`` (gpt/model.py).
``run_lr``, ``run_optimizer`` and ``load_run_optimizer`` are how a gpt-train run of a config
gets its learning rate and its AdamW: gpt-train steps with them, and gpt-explain takes the
run's next step with the same code.
"""

from __future__ import annotations

import math

from tensorgrad.nn.utils import clip_grad_norm_
from tensorgrad.optim import AdamW, adamw_update

__all__ = [
    "AdamW",
    "adamw_update",
    "clip_grad_norm_",
    "cosine_lr",
    "load_run_optimizer",
    "run_lr",
    "run_optimizer",
]


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


def run_lr(c, it: int) -> float:
    """The learning rate of a gpt-train run of config ``c`` (a TrainConfig) at iteration
    ``it``: cosine_lr with its warmup, its decay end (--lr-decay-iters, else --max-iters),
    its --lr and --min-lr."""
    return cosine_lr(it, c.warmup_iters, c.lr_decay_iters or c.max_iters, c.lr, c.min_lr)


def run_optimizer(model, c) -> AdamW:
    """A fresh AdamW as a gpt-train run of config ``c`` builds it: weight decay on the
    matrices only (GPT.configure_optimizers), the run's betas, eps 1e-8, lr set per step."""
    return model.configure_optimizers(c.weight_decay, c.lr, (c.beta1, c.beta2))


def load_run_optimizer(optimizer, c, state: dict) -> None:
    """A run's checkpointed AdamW state (moments, step counts, eps) into ``optimizer``; the
    betas and weight decay follow ``c`` (flags may change them when a run is resumed)."""
    optimizer.load_state_dict(state)
    for g, wd in zip(optimizer.param_groups, (c.weight_decay, 0.0)):
        g["betas"], g["weight_decay"] = (c.beta1, c.beta2), wd
