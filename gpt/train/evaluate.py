"""Evaluation: the mean loss on held-out batches, and the evaluate-then-checkpoint step that
the loop runs every --eval-interval iterations (rewinding its samplers when it must)."""

from __future__ import annotations

import sys

import tensorgrad as tg
from tensorgrad import to_device

from .. import dist_train
from .state import save_checkpoint


@tg.no_grad()
def estimate_loss(
    model, samplers: dict, eval_iters: int, device: str, stop=None, ddp=None
) -> dict | None:
    """Mean loss over eval_iters batches of each sampler, with dropout off; None when
    stop.signal gets set meanwhile (the run is being interrupted). Under mpiexec rank r
    evaluates batches r, r + N, ... (every rank draws them all, so the samplers stay alike)."""
    from tqdm import tqdm

    ddp = ddp or dist_train.SINGLE
    model.eval()
    out = {}
    # a progress bar of its own (it disappears when done): large models evaluate for minutes
    bar = tqdm(
        total=eval_iters * len(samplers),
        desc="eval",
        unit="batch",
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=1.0,
        disable=not ddp.is_main,
    )
    try:
        for split, sampler in samplers.items():
            total = 0.0
            for i in range(eval_iters):
                if ddp.agree_stop(stop):
                    return None
                x, y = sampler.next_batch()
                if i % ddp.world_size == ddp.rank:
                    _, loss = model(to_device(x, device), to_device(y, device))
                    total += loss.item()
                bar.update(1)
            out[split] = ddp.mean(total) * ddp.world_size / eval_iters
    finally:
        bar.close()
        model.train()
    return out


def evaluate(r, stop, progress, guard) -> bool:
    """Evaluate at r.state.iter, log it, and (after step 0) checkpoint; False when a signal
    interrupted it. Raises Diverged when the evaluation shows the run went bad."""
    s, c = r.state, r.c
    samplers = {"train": r.samplers["train_eval"], "val": r.samplers["val"]}
    before = {k: sp.state_dict() for k, sp in samplers.items()}
    losses = estimate_loss(r.model, samplers, c.eval_iters, c.device, stop, r.ddp)
    if losses is None or s.iter % c.eval_interval != 0:
        # interrupted: rewind, so the resumed run repeats this evaluation exactly; off the
        # grid (the last iteration): rewind, so a run continued from here draws the
        # evaluation batches an uninterrupted run would
        for k, sp in samplers.items():
            sp.load_state_dict(before[k])
    if losses is None:
        return False
    s.val_loss = losses["val"]
    r.metrics.log(iter=s.iter, train_loss=losses["train"], val_loss=s.val_loss)
    guard.check_eval(s.iter, losses, s.best_val, r.params)
    s.evaluated_at = s.iter
    note = ""
    if s.iter > 0:
        is_best = s.val_loss < s.best_val
        s.best_val = min(s.best_val, s.val_loss)
        save_checkpoint(r, best=is_best)
        note = " (best, saved)" if is_best else " (saved)"
    progress.write(
        f"iter {s.iter}: train loss {losses['train']:.4f}, val loss {s.val_loss:.4f}{note}"
    )
    progress.plot()
    return True
