"""Guards that raise: a non-finite loss or gradient norm, or a loss far above the run's
best, stops the run before it saves (Diverged), keeping the last sane checkpoint."""

from __future__ import annotations

import math

from tensorgrad import get_array_module


class Diverged(Exception):
    """The run went bad at iteration it; what says how. main exits 1 without saving."""

    def __init__(self, what: str, it: int):
        super().__init__(what)
        self.what, self.it = what, it


class Guard:
    """factor: --divergence-factor (0 = only NaN/inf stop the run); floor: ln(vocab size),
    the loss of uniform guessing, below which nothing counts as diverged."""

    def __init__(self, factor: float, vocab_size: int, metrics):
        self.factor, self.floor, self.metrics = factor, math.log(vocab_size), metrics

    def diverged(self, loss: float, best: float) -> bool:
        """Far above the run's best and worse than guessing (see --divergence-factor)."""
        return self.factor > 0 and loss > max(self.factor * best, self.floor)

    def check_step(self, it: int, loss: float, grad_norm: float | None, lr: float, state):
        """Raise Diverged (after logging the step) for a bad step; else record the best loss."""
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            value = loss if not math.isfinite(loss) else grad_norm
            self.metrics.log(
                iter=it, loss=loss, lr=lr, grad_norm=grad_norm, error=f"non-finite {what}"
            )
            raise Diverged(f"non-finite {what} ({value})", it)
        if self.diverged(loss, state.best_loss):
            self.metrics.log(iter=it, loss=loss, lr=lr, grad_norm=grad_norm, error="diverged")
            raise Diverged(
                f"the loss diverged: {loss:.4g} is more than {self.factor:g}x the run's best "
                f"step loss {state.best_loss:.4g} and worse than guessing",
                it,
            )
        state.best_loss = min(state.best_loss, loss)

    def check_eval(self, it: int, losses: dict, best_val: float, params) -> None:
        """Raise Diverged when this evaluation's state must not become a checkpoint."""
        for split, v in losses.items():
            if not math.isfinite(v):
                raise Diverged(f"non-finite {split} loss ({v}) in the evaluation", it)
        if self.diverged(losses["val"], best_val):
            raise Diverged(
                f"the validation loss diverged: {losses['val']:.4g} is more than "
                f"{self.factor:g}x the run's best {best_val:.4g} and worse than guessing",
                it,
            )
        for p in params:
            xp = get_array_module(p.array)
            if not bool(xp.isfinite(p.array).all()):
                raise Diverged("non-finite weights in the evaluation", it)
