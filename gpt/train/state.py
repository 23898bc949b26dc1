"""The run state: the counters a checkpoint holds besides the arrays, and the checkpoint
written from them (with the model config, train config, RNG and sampler states)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import tensorgrad as tg

from ..store import model_code
from ..store import run_checkpoint as rc


def jsonable(x):
    """x with non-finite floats as None (JSON has no nan/inf), dicts recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    return x


@dataclass
class RunState:
    """Where a run stands. iter: the next optimizer step; evaluated_at / saved_at: the newest
    evaluation and checkpoint (None: none yet in this run)."""

    iter: int = 0
    val_loss: float | None = None
    best_val: float = math.inf  # the lowest validation loss so far
    best_loss: float = math.inf  # the lowest training step loss so far (divergence guard)
    evaluated_at: int | None = None
    saved_at: int | None = None
    elapsed0: float = 0.0  # seconds trained before this process (a resumed run's past)
    tokens_seen: int = 0
    t0: float = field(default_factory=time.time)  # when this process started training

    @classmethod
    def from_checkpoint(cls, ckpt: dict) -> RunState:
        start, evaluated = ckpt["iter"], ckpt.get("evaluated", True)
        return cls(
            iter=start,
            val_loss=ckpt.get("val_loss"),
            best_val=ckpt.get("best_val_loss") or math.inf,
            best_loss=ckpt.get("best_train_loss") or math.inf,
            evaluated_at=start if evaluated else None,
            saved_at=start,
            elapsed0=ckpt.get("elapsed_s", 0.0),
            tokens_seen=ckpt.get("tokens_seen", 0),
        )

    def elapsed(self) -> float:
        return self.elapsed0 + (time.time() - self.t0)


def save_checkpoint(r, best: bool = False) -> None:
    """Write the latest checkpoint of the run r (a setup.TrainRun), and best/ with best=True.
    Under mpiexec every rank calls this (it gathers their RNG states); rank 0 writes."""
    s = r.state
    state = {
        "iter": s.iter,
        "val_loss": s.val_loss,
        "best_val_loss": jsonable(s.best_val),
        "best_train_loss": jsonable(s.best_loss),
        "evaluated": s.evaluated_at == s.iter,
        "elapsed_s": s.elapsed(),
        "tokens_seen": s.tokens_seen,
        "model_config": r.model_config.to_dict(),
        "train_config": dataclasses.asdict(r.c),
        "rng": tg.get_rng_state(),
        "samplers": {name: sp.state_dict() for name, sp in r.samplers.items()},
        "data": {"dir": str(r.data_dir), "source_hash": r.meta["source_hash"]},
        "tokenizer": r.tok.to_dict(),
    }
    if r.code is not None:  # the model's code (gpt.store.model_code)
        state[model_code.KEY] = r.code
    state = r.ddp.checkpoint_state(state, r.model)  # every rank's RNG (all ranks call this)
    if r.ddp.is_main:
        rc.save(r.out, state, r.model, r.optimizer)
        if best:
            rc.save(r.out / rc.BEST_DIR, state, r.model)
    s.saved_at = s.iter
