"""Learning-rate schedules, as ``torch.optim.lr_scheduler``: each sets every param group's
``lr`` from its initial one by PyTorch's closed-form formula for the epoch count.

    sched = lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    for step in ...: opt.step(); sched.step()

The constructor applies epoch 0 (as PyTorch's does); ``step()`` advances one epoch.

Imports: bisect, math.
"""

from __future__ import annotations

import bisect
import math


class LRScheduler:
    """Base class: ``lr_at(base_lr, epoch)`` is the schedule; ``step()`` applies the next epoch."""

    def __init__(self, optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, epoch: int, i: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self._apply(self.last_epoch)

    def _apply(self, epoch: int) -> None:
        self._last_lr = []
        for i, (g, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            g["lr"] = self.lr_at(base, epoch, i)
            self._last_lr.append(g["lr"])

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


class LambdaLR(LRScheduler):
    """lr = initial_lr · lr_lambda(epoch) (one function, or one per param group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        n = len(optimizer.param_groups)
        self.lr_lambdas = (
            list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        )
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * self.lr_lambdas[i](epoch)

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}


class StepLR(LRScheduler):
    """lr = initial_lr · gamma^(epoch // step_size)."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * self.gamma ** (epoch // self.step_size)


class LinearLR(LRScheduler):
    """lr = initial_lr · (start + (end - start) · min(epoch, total_iters) / total_iters)."""

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):  # fmt: skip
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("LinearLR: start_factor must be in (0, 1], end_factor in [0, 1]")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        f = self.end_factor - self.start_factor
        return base_lr * (self.start_factor + f * min(epoch, self.total_iters) / self.total_iters)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) · (1 + cos(π · epoch / T_max)) / 2."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):  # noqa: N803
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        cos = 1 + math.cos(math.pi * epoch / self.T_max)
        return self.eta_min + (base_lr - self.eta_min) * cos / 2


class SequentialLR(LRScheduler):
    """schedulers[k] from milestones[k-1] on, each counting its epochs from its milestone."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("SequentialLR: expected one milestone fewer than schedulers")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        for g in optimizer.param_groups:  # undo the first steps the schedulers took
            g["lr"] = g["initial_lr"]
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        k = bisect.bisect_right(self.milestones, epoch)
        start = self.milestones[k - 1] if k else 0
        return self.schedulers[k].lr_at(base_lr, epoch - start, i)

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k != "schedulers"}
