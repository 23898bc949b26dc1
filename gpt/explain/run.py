"""The AdamW step gpt-explain takes: the run's own next step, or one it assumes and says so.

On a gpt-train checkpoint (``--out-dir``) the step is the one the run would take next, built
with gpt-train's own code (gpt/optim.py): the run's TrainConfig from the checkpoint (its
betas, weight decay on the matrices only, gradient clipping), the learning rate of its
schedule at the checkpoint's iteration (warmup, cosine decay, min lr: ``run_lr``), and its
AdamW state (moments, step counts, eps). best/ keeps no optimizer state: when the latest
checkpoint holds the same weights its state is used, else the moments start at 0 and the
line says so. Only the batch differs: the prompt instead of the run's next batch.

Anything else (a fresh model, a GPT-2 from --init-from, a checkpoint without a training
config) gets an assumed step (lr 1e-3 constant, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
on the matrices, no clipping, moments from 0), and the one line says so. --lr and
--weight-decay, when given, replace the run's (or the assumed) values, and the line says so.

``StepSettings.line`` is that one line; ``optimizer(model)`` builds the AdamW and
``lr_at(k)`` gives the learning rate of the k-th step shown (from 0: --steps follows the
schedule on).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..optim import load_run_optimizer, run_lr, run_optimizer

ASSUMED = dict(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, grad_clip=0.0)


@dataclass
class StepSettings:
    """How the shown AdamW step is taken. source: 'run' (a gpt-train checkpoint's) or
    'assumed'; config: the run's TrainConfig (None when assumed); state: the run's AdamW
    state dict (None: the moments start at 0); why: the reason for an assumption or for
    fresh moments, shown in the line."""

    source: str = "assumed"
    lr: float = ASSUMED["lr"]
    weight_decay: float = ASSUMED["weight_decay"]
    betas: tuple = ASSUMED["betas"]
    eps: float = ASSUMED["eps"]
    grad_clip: float = ASSUMED["grad_clip"]
    iter: int | None = None  # the run's next iteration
    config: object = None
    state: dict | None = None
    why: str = ""
    given: tuple = ()  # the flags that replaced a value: '--lr', '--weight-decay'

    def lr_at(self, k: int = 0) -> float:
        """The learning rate of the k-th step shown (k = 0: the run's next step)."""
        if self.config is None or "--lr" in self.given:
            return self.lr
        return run_lr(self.config, self.iter + k)

    def optimizer(self, model):
        """The AdamW over ``model``: gpt-train's, with the run's state, or the assumed one."""
        if self.config is not None:
            c = dataclasses.replace(self.config, weight_decay=self.weight_decay)
            opt = run_optimizer(model, c)
            if self.state is not None:
                load_run_optimizer(opt, c, self.state)
        else:
            opt = model.configure_optimizers(self.weight_decay, self.lr, self.betas)
            for g in opt.param_groups:
                g["eps"] = self.eps
        for g in opt.param_groups:
            g["lr"] = self.lr_at(0)
        return opt

    def moments(self) -> str:
        return "run" if self.state is not None else "fresh"

    def line(self, model) -> str:
        """What the step is, in one line (the count of decayed matrices from ``model``: GPT's
        configure_optimizers decays the ≥2-D parameters, not the biases and LayerNorm gains)."""
        n_decay = sum(p.ndim >= 2 for _, p in model.named_parameters())
        c = self.config
        lr = f"lr {self.lr_at(0):.4g}"
        if "--lr" in self.given:
            lr += " (--lr)"
        elif c is not None:
            lr += (
                f" (warmup {c.warmup_iters}, cosine {c.lr:g} -> {c.min_lr:g} by iter "
                f"{c.lr_decay_iters or c.max_iters})"
            )
        else:
            lr += " constant"
        wd = " (--weight-decay)" if "--weight-decay" in self.given else ""
        clip = (
            f"gradient norm clipped to {self.grad_clip:g}"
            if self.grad_clip > 0
            else "no gradient clipping"
        )
        if self.state is not None:
            steps = [int(s["step"]) for s in self.state["state"].values()]
            moments = f"the run's moments (step {max(steps, default=0)})"
        else:
            moments = "moments from 0"
        if self.source == "run":
            head = f"the run's next step, iter {self.iter}"
            tail = f"; {self.why}" if self.why else ""
        else:
            head, tail = f"assumed ({self.why})", ""
        return (
            f"{head}: {lr}, AdamW betas {tuple(self.betas)}, eps {self.eps:g}, weight decay "
            f"{self.weight_decay:g}{wd} on the {n_decay} matrices only, {clip}, {moments}{tail}"
        )

    def report(self, model) -> dict:
        """The report's ``optimizer`` entry."""
        return {
            "source": self.source,
            "line": self.line(model),
            "iter": self.iter,
            "lr": self.lr_at(0),
            "weight_decay": self.weight_decay,
            "betas": list(self.betas),
            "eps": self.eps,
            "grad_clip": self.grad_clip,
            "moments": self.moments(),
        }


def assumed(why: str, lr: float | None = None, weight_decay: float | None = None):
    """The step assumed for a model without a run (``why`` says which)."""
    s = StepSettings(why=why)
    return _given(s, lr, weight_decay)


def from_run(ckpt: dict, state: dict | None, which_dir: str, lr=None, weight_decay=None):
    """The run's next step from its checkpoint ``ckpt`` and AdamW ``state`` (None when the
    checkpoint has none: the moments start at 0). which_dir names the checkpoint (best/)."""
    from ..train.config import FIELDS, TrainConfig, UsageError, check_types

    saved = ckpt.get("train_config")
    if not isinstance(saved, dict):
        return assumed("the checkpoint records no training config", lr, weight_decay)
    saved = {k: v for k, v in saved.items() if k in FIELDS}
    try:
        check_types(saved)
        c = TrainConfig(**{**dataclasses.asdict(TrainConfig()), **saved})
    except (UsageError, TypeError) as e:
        return assumed(f"the checkpoint's training config is unusable: {e}", lr, weight_decay)
    s = StepSettings(
        source="run",
        weight_decay=c.weight_decay,
        betas=(c.beta1, c.beta2),
        grad_clip=c.grad_clip,
        iter=int(ckpt["iter"]),
        config=c,
        state=state,
    )
    s.lr = run_lr(c, s.iter)
    if state is None:
        s.why = (
            f"{which_dir} keeps no optimizer state (--which latest gives the run's own)"
            if ckpt.get("optim") is None
            else "the checkpoint's optimizer state was not read"
        )
    else:
        s.eps = state["param_groups"][0].get("eps", s.eps)
    return _given(s, lr, weight_decay)


def _given(s: StepSettings, lr, weight_decay) -> StepSettings:
    given = []
    if lr is not None:
        s.lr = float(lr)
        given.append("--lr")
    if weight_decay is not None:
        s.weight_decay = float(weight_decay)
        given.append("--weight-decay")
    s.given = tuple(given)
    return s


__all__ = ["ASSUMED", "StepSettings", "assumed", "from_run"]
