"""The training loop: one optimizer step after another, evaluating and checkpointing every
--eval-interval steps. Read `train` top to bottom: it is the whole step.

Everything around the step lives in the neighbouring modules: setup.py builds (or restores)
the model, optimizer and samplers; evaluate.py evaluates and checkpoints; guards.py stops a
diverging run; progress.py draws the bar, metrics.jsonl and loss.png; signals.py turns
Ctrl-C into a flag that this loop reads between steps.
"""

from __future__ import annotations

import math
import time

from tensorgrad import to_device

from ..optim import clip_grad_norm_, run_lr
from .evaluate import evaluate
from .guards import Guard
from .progress import Diagnose, Progress
from .setup import TrainRun, tokens_per_iter


def train(r: TrainRun, stop, progress: Progress) -> None:
    """Train r until --max-iters or until stop.signal is set (then the caller saves).
    Raises guards.Diverged when a loss or gradient goes bad (nothing is saved then)."""
    c, s, model, optimizer = r.c, r.state, r.model, r.optimizer
    params = r.params
    guard = Guard(c.divergence_factor, r.model_config.vocab_size, r.metrics)
    diagnose = Diagnose(r, progress, start=s.iter)
    n_tokens = tokens_per_iter(r)  # tokens in one optimizer step, over all ranks
    while not r.ddp.agree_stop(stop):
        # every eval_interval steps (and at the end): evaluate, then save a checkpoint
        at_eval = s.iter % c.eval_interval == 0 or s.iter == c.max_iters
        if at_eval and s.iter != s.evaluated_at:
            if not evaluate(r, stop, progress, guard):
                break  # a signal arrived meanwhile
        if s.iter >= c.max_iters:
            break
        t0 = time.time()

        # the learning rate for this iteration: linear warmup, then cosine decay (gpt/optim.py)
        lr = run_lr(c, s.iter)
        for group in optimizer.param_groups:
            group["lr"] = lr

        # forward and backward over the micro-batches: the gradients add up in each p.grad
        loss_sum = 0.0
        for x, y, weight in r.ddp.micro_batches(r.samplers["train"]):  # this rank's share
            # x, y: (B, T) token ids, y is x shifted left by one
            logits, loss = model(to_device(x, c.device), to_device(y, c.device))
            loss_sum += loss.item() * weight
            if not math.isfinite(loss_sum) and not r.ddp.active:  # (ranks finish the step)
                break
            if weight != 1.0:
                loss = loss * weight  # so the step follows the mean gradient of the batch
            loss.backward()
        r.ddp.reduce_gradients()  # mpiexec: average over the ranks; one process: nothing
        loss_val = r.ddp.mean(loss_sum)
        diagnose.after_backward(s.iter)

        # clip the global gradient norm, refuse a bad step, then let AdamW update
        grad_norm = float(clip_grad_norm_(params, c.grad_clip)) if math.isfinite(loss_val) else None
        guard.check_step(s.iter, loss_val, grad_norm, lr, s)  # raises Diverged
        diagnose.before_step()
        optimizer.step()
        optimizer.zero_grad()
        diagnose.after_step(s.iter)

        # log
        dt = time.time() - t0
        s.tokens_seen += n_tokens
        r.metrics.log(
            iter=s.iter,
            loss=loss_val,
            lr=lr,
            grad_norm=grad_norm,
            tokens_per_s=n_tokens / dt,
            elapsed_s=s.elapsed(),
        )
        s.iter += 1
        progress.step(loss_val, lr, n_tokens / dt, dt)
