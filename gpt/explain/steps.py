"""gpt-explain across steps: a model trained on one prompt, chosen weights followed step by step.

``Session`` holds a model, its tokenizer, a prompt and one AdamW optimizer kept across steps
(a run's own, with its moments and its learning-rate schedule going on step by step, or an
assumed one: gpt.explain.run);
``Session.step()`` runs one explained training step (``gpt.explain.report.explain`` with that
optimizer, so Adam's moments carry over) and appends to the session's history the loss, and
for every followed weight its value, gradient, moments m and v, and update. The served page
(gpt.explain.serve) steps a Session one click at a time; ``follow_steps`` runs N steps at once
for ``gpt-explain --steps N``. Both give the same numbers for the same model, prompt and
settings: the history is the same code.

``trace()`` is the JSON-able record: the steps, the followed weights, and the attention map of
the followed head at a few steps (``snapshots``). gpt.explain.render.steps draws it as
tables and charts, gpt.explain.render.plots as PNG plots.
"""

from __future__ import annotations

import numpy as np

import tensorgrad as tg
from tensorgrad import device_of, to_device

from . import run
from .arrays import host
from .report import MAX_TOKENS, explain, prompt_ids

STEPS_LIMIT = 1000  # the most steps --steps takes: the history stays a few hundred kB
SNAPSHOTS = 4  # attention maps kept across a run of steps


class Session:
    """One model trained step by step on a prompt, with the followed weights' history."""

    def __init__(
        self,
        model,
        tokenizer,
        prompt: str,
        layer: int = 0,
        head: int = 0,
        position: int | None = None,
        lr: float | None = None,
        weight_decay: float | None = None,
        seed: int = 0,
        max_tokens: int = MAX_TOKENS,
        follow=None,
        checks: int = 2,
        settings: run.StepSettings | None = None,
    ):
        self.model, self.tokenizer, self.prompt = model, tokenizer, prompt
        self.layer, self.head, self.position = layer, head, position
        self.seed, self.max_tokens, self.checks, self.follow = seed, max_tokens, checks, follow
        if settings is None:  # no run: the assumed step (run.py), with lr and decay if given
            settings = run.StepSettings(why="a fresh model has no run")
            settings.lr = settings.lr if lr is None else lr
            settings.weight_decay = settings.weight_decay if weight_decay is None else weight_decay
        self.settings = settings
        self.lr, self.weight_decay = settings.lr_at(0), settings.weight_decay
        self.opt = settings.optimizer(model)  # the run's AdamW and moments, or fresh ones
        self.history, self.snapshots, self.report = [], [], None

    def step(
        self,
        prompt: str | None = None,
        layer: int | None = None,
        head: int | None = None,
        position: int | None = None,
        snapshot: bool = True,
        checks: int | None = None,
        lens: bool = True,
    ) -> dict:
        """One explained training step; returns its report (``gpt.explain.report.explain``)."""
        prompt = self.prompt if prompt is None else prompt
        layer = self.layer if layer is None else int(layer)
        head = self.head if head is None else int(head)
        position = self.position if position is None else int(position)
        lr = self.settings.lr_at(len(self.history))  # a run's schedule goes on step by step
        for g in self.opt.param_groups:
            g["lr"] = lr
        r = explain(
            self.model,
            self.tokenizer,
            prompt,
            layer=layer,
            heads=[head],
            position=position,
            seed=self.seed,
            max_tokens=self.max_tokens,
            checks=self.checks if checks is None else checks,
            lens=lens,
            optimizer=self.opt,
            follow=self.follow,
            grad_clip=self.settings.grad_clip,
        )
        # kept only once the step ran: a refused setting leaves the session as it was
        self.prompt, self.layer, self.head, self.position = prompt, layer, head, position
        if self.follow is None:  # fixed at the first step: the history follows the same weights
            self.follow = [(f["label"], f["param"], *f["index"]) for f in r["followed"]]
        n = len(self.history) + 1
        lc = r.get("loss_change") or {}
        self.history.append(
            {
                "step": n,
                "lr": lr,
                "loss": r["loss"]["value"],
                "loss_after": lc.get("loss_after"),
                "predicted_change": lc.get("predicted"),
                "measured_change": lc.get("measured"),
                "tokens": len(r["tokens"]["ids"]),
                "followed": [
                    {k: f[k] for k in ("label", "value", "grad", "m", "v", "update", "new_value")}
                    for f in r["followed"]
                ],
            }
        )
        if snapshot:
            h = r["attention"]["heads"][0]
            self.snapshots.append(
                {
                    "step": n,
                    "layer": self.layer,
                    "head": h["head"],
                    "weights": h["weights"],
                    "labels": r["tokens"]["text"][:-1],
                }
            )
        r["step"] = n
        self.report = r
        return r

    def loss_now(self) -> float:
        """The loss on the prompt with the current weights (no step, dropout off)."""
        cfg = self.model.config
        ids, _ = prompt_ids(self.tokenizer, self.prompt, cfg.block_size, self.max_tokens)
        dev = device_of(self.model.transformer.wte.weight.array)
        was = self.model.training
        self.model.eval()
        try:
            with tg.no_grad():
                _, loss = self.model(
                    to_device(np.asarray([ids[:-1]]), dev), to_device(np.asarray([ids[1:]]), dev)
                )
        finally:
            self.model.train(was)
        return float(host(loss))

    def trace(self) -> dict:
        c = self.model.config
        followed = [
            {"label": lb, "param": n, "index": [i, j]} for lb, n, i, j in (self.follow or [])
        ]
        return {
            "prompt": self.prompt,
            "layer": self.layer,
            "head": self.head,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "optimizer": self.settings.report(self.model),
            "config": c.to_dict(),
            "followed": followed,
            "steps": self.history,
            "snapshots": self.snapshots,
        }


def follow_steps(
    model,
    tokenizer,
    prompt: str,
    steps: int,
    layer: int = 0,
    head: int = 0,
    lr: float | None = None,
    weight_decay: float | None = None,
    seed: int = 0,
    max_tokens: int = MAX_TOKENS,
    follow=None,
    snapshots: int = SNAPSHOTS,
    settings: run.StepSettings | None = None,
) -> dict:
    """``steps`` training steps on ``prompt``; the trace, with the loss after the last step."""
    if not 1 <= steps <= STEPS_LIMIT:
        raise ValueError(f"steps must be in 1..{STEPS_LIMIT}, got {steps}")
    s = Session(
        model,
        tokenizer,
        prompt,
        layer,
        head,
        lr=lr,
        weight_decay=weight_decay,
        seed=seed,
        max_tokens=max_tokens,
        follow=follow,
        checks=0,
        settings=settings,
    )
    at = {round(x) for x in np.linspace(1, steps, min(steps, snapshots))}
    for k in range(1, steps + 1):
        s.step(snapshot=k in at, lens=False)
    t = s.trace()
    t["final_loss"] = s.loss_now()
    t["notes"] = s.report["notes"]
    return t
