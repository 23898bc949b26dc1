"""gpt-train's command: resolve the config, lock the run directory, set the run up, run the
loop, and end with the final loss and a sample; every failure is one line and an exit code."""

from __future__ import annotations

import shlex
import signal
import sys
import time
from pathlib import Path

from .. import dist_train
from ..config import GPTConfig
from ..data import DataError
from ..sample import start_ids, stream_sample
from ..store import run_checkpoint as rc
from ..store.errors import CheckpointError, LockError
from ..store.lock import RunLock
from .checks import check_fits, planned_config, validate
from .config import UsageError
from .evaluate import estimate_loss
from .flags import resolve_config
from .guards import Diverged
from .loop import train as train_loop
from .progress import Metrics, Progress
from .setup import (
    TrainRun,
    check_out_dir,
    describe,
    resume_command,
    sample_command,
    setup,
)
from .signals import Interrupted, StopFlag, handle_signals
from .state import save_checkpoint

EXIT_USAGE, EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM = 2, 1, 130, 143


def exit_code(signum: int) -> int:
    return EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM


def train(argv: list[str] | None, stop: StopFlag) -> int:
    """The training script; stop.signal is set by the SIGINT/SIGTERM handler."""
    c, ckpt, control = resolve_config(argv)
    validate(c)
    check_out_dir(Path(c.out_dir), ckpt is not None, control["overwrite"])
    ddp = dist_train.setup(c, UsageError)  # this process's rank (one, without mpiexec)
    if ckpt is not None:
        rc.check_model_file(c.out_dir, ckpt)
    check_fits(c, GPTConfig.from_dict(ckpt["model_config"]) if ckpt else planned_config(c))
    if not ddp.is_main:  # under mpiexec rank 0 holds the lock for the run's ranks
        return run(c, ckpt, control, stop, ddp)
    with RunLock(c.out_dir) as lock:  # one writer per run directory, for the whole run
        if lock.note:
            print(f"gpt-train: {lock.note}", file=sys.stderr)
        return run(c, ckpt, control, stop, ddp)


def run(c, ckpt: dict | None, control: dict, stop: StopFlag, ddp) -> int:
    """Set up (or restore), train, then save on a signal or finish with a sample."""
    r = setup(c, ckpt, control, ddp)
    if r is None:
        return 0  # a resumed run that was finished already
    ddp.start(r.model, r.optimizer, ckpt, r.state.iter)  # mpiexec: rank 0's weights
    r.out.mkdir(parents=True, exist_ok=True)
    keep = r.state.iter if ckpt is not None else None
    r.metrics = Metrics(r.out / "metrics.jsonl", keep) if ddp.is_main else dist_train.NoMetrics()
    describe(r)
    progress = Progress(r)
    r.state.t0 = time.time()
    stop.armed = True  # from here on a signal finishes the step and saves
    try:
        train_loop(r, stop, progress)
    except Diverged as e:
        progress.close()
        print(
            f"gpt-train: error: {e.what} at iter {e.it}; stopped without saving: "
            f"{divergence_advice(r)}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        progress.close()
        r.metrics.close()
    if ddp.agree_stop(stop):
        s = r.state
        if s.saved_at != s.iter or s.evaluated_at != s.iter:
            save_checkpoint(r)
        print(
            f"{signal.Signals(stop.signal).name}: stopped at iter {s.iter}; checkpoint saved "
            f"in {r.out}. Resume with:\n  {resume_command(c)}",
            file=sys.stderr,
        )
        return exit_code(stop.signal)
    stop.armed = False
    finish(r)
    return 0


def divergence_advice(r: TrainRun) -> str:
    """What to run next: the last sane checkpoint with half the learning rate (and a --min-lr
    that stays below it, which validate() insists on)."""
    c, saved_at = r.c, r.state.saved_at
    lr = c.lr / 2
    flags = f"--lr {lr:g}" + (f" --min-lr {lr / 10:g}" if c.min_lr > lr else "")
    if saved_at is None:
        return f"no checkpoint was written yet; start again with a lower learning rate ({flags})"
    return (
        f"the last good checkpoint (iter {saved_at}) in {r.out} is intact; continue it with a "
        f"lower learning rate: {resume_command(c)} {flags}"
    )


def finish(r: TrainRun) -> None:
    """The final validation loss, and a sample from the trained model (rank 0)."""
    c, s = r.c, r.state
    if s.val_loss is None:
        losses = estimate_loss(
            r.model, {"val": r.samplers["val"]}, c.eval_iters, c.device, ddp=r.ddp
        )
        s.val_loss = losses["val"]
    print(
        f"final val loss {s.val_loss:.4f} (best {s.best_val:.4f}) after {s.iter} iterations; "
        f"checkpoints in {r.out}"
    )
    if not r.ddp.is_main:
        return
    if c.sample_tokens:
        print("---------------- sample (temperature 0.8, top_k 200) ----------------")
        ids = start_ids(r.tok, None)
        stream_sample(r.model, r.tok, ids, c.sample_tokens, temperature=0.8, top_k=200, seed=c.seed)
        print("\n---------------------------------------------------------------------")
    again = "sample again" if c.sample_tokens else "sample it"
    print(f"{again}: {sample_command()} --out-dir {shlex.quote(str(r.out))}")


def main(argv: list[str] | None = None) -> int:
    """Run training; returns the exit status (0, 1 error, 2 usage, 130 SIGINT, 143 SIGTERM)."""
    codes = {UsageError: EXIT_USAGE, KeyboardInterrupt: EXIT_SIGINT}
    try:
        with handle_signals(StopFlag()) as stop, dist_train.launch(codes, UsageError):
            return train(argv, stop)  # mpiexec: only rank 0 prints; a failure stops all
    except UsageError as e:
        print(f"gpt-train: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (DataError, CheckpointError, LockError) as e:
        print(f"gpt-train: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_ERROR
    except Interrupted as e:
        print(
            f"gpt-train: {signal.Signals(e.signum).name} received outside the training loop; "
            "stopped (the checkpoints already saved stand)",
            file=sys.stderr,
        )
        return exit_code(e.signum)
    except MemoryError:
        print(
            "gpt-train: error: out of memory (the estimate before the run was too low); "
            "use a smaller model, --batch-size or --block-size",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except OSError as e:
        print(f"gpt-train: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\ngpt-train: interrupted; the last checkpoint (if any) stands", file=sys.stderr)
        return EXIT_SIGINT
