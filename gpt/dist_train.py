"""gpt-train on several processes: `mpiexec -n N gpt-train ...` is the same run, only faster.

Data parallel: every rank holds the whole model and optimizer; each optimizer step consumes
the same global batch as one process would (--batch-size x --grad-accum sequences, drawn
from the same seeded sampler, which every rank advances alike), rank r takes its 1/N of those
rows, and the gradients are averaged over the ranks (tensorgrad.distributed.DataParallel)
before clipping and AdamW, so every rank takes the identical step. N ranks therefore give the
one-process losses up to float32 reduction order (with --dropout 0: each rank draws its own
dropout masks). A global batch that N does not divide is refused.

Only rank 0 prints, logs metrics.jsonl, draws loss.png and writes checkpoints; the other
ranks' output goes to /dev/null. Checkpoints hold every rank's RNG state, so --resume with the
same N is bitwise exact, and any N (or one process) can resume them. Decisions that must be
the same everywhere are agreed on: a signal on any rank (a tiny all-reduce each step) stops
all ranks at the same step, rank 0 saves once. A rank that raises prints one line naming
itself and the cause and ends at once; the launcher (or the watchdog of
tensorgrad.distributed) then stops the others.

With one process (no mpiexec) every method below is the plain single-process behaviour.
"""

from __future__ import annotations

import fcntl
import math
import os
import sys
import time
import traceback
from contextlib import contextmanager

import numpy as np

import tensorgrad as tg
import tensorgrad.distributed as dist

from .data import DataError, default_cache_dir
from .store.errors import CheckpointError

BUCKET_MB = 4.0  # gradient all-reduce bucket size
GRACE_S = 2.0  # a failing rank > 0 waits this long first: if rank 0 failed alike, its line shows
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


launch_rank = dist.launch_rank  # this process's rank, from the environment (0 without mpiexec)


class Run:
    """This process's part of the run: rank, world size, its share of each global batch."""

    def __init__(
        self, world: int = 1, rank: int = 0, batch_size: int = 1, grad_accum: int = 1, seed: int = 0
    ):
        self.world_size, self.rank = world, rank
        self.active, self.is_main = world > 1, rank == 0
        self.batch_size, self.grad_accum, self.seed = batch_size, grad_accum, seed
        B, self.rows = batch_size, batch_size * grad_accum // world  # rows: this rank's per step
        m = math.ceil(self.rows / B)  # micro-steps, none larger than --batch-size
        self.chunks = (
            [self.rows // m] * m if self.rows % m == 0 else [B] * (self.rows // B) + [self.rows % B]
        )
        self.reducer: dist.DataParallel | None = None

    # -- one optimizer step -------------------------------------------------------------
    def micro_batches(self, sampler):
        """Yield (x, y, weight) for this rank's micro-steps of one optimizer step.

        weight is the micro-batch's share of this rank's rows (scale its mean loss by it).
        Every rank draws the whole global batch, in the order one process would, and keeps
        rows [rank * rows, (rank + 1) * rows) of it.
        """
        if not self.active:
            w = 1.0 / self.grad_accum if self.grad_accum > 1 else 1.0
            for _ in range(self.grad_accum):
                x, y = sampler.next_batch()
                yield x, y, w
            return
        xs, ys = zip(*(sampler.next_batch() for _ in range(self.grad_accum)))
        lo = self.rank * self.rows
        x = np.concatenate(xs)[lo : lo + self.rows]  # (rows, T)
        y = np.concatenate(ys)[lo : lo + self.rows]
        o = 0
        for n in self.chunks:
            yield x[o : o + n], y[o : o + n], n / self.rows
            o += n

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks (after the last micro-step's backward); with
        one process there is nothing to do."""
        if self.reducer is not None:
            self.reducer.reduce_gradients()

    def mean(self, value: float) -> float:
        """The mean over the ranks of a float (every rank gets it)."""
        if not self.active:
            return value
        return float(dist.all_reduce(np.array([value], dtype=np.float64), "mean")[0])

    def agree_stop(self, stop) -> int:
        """The signal that stops the run, agreed by all ranks (0 for none): a signal that
        reached any rank stops every rank here, at the same step. stop: a StopFlag or None."""
        mine = int(getattr(stop, "signal", 0) or 0)
        if not self.active or stop is None:
            return mine
        agreed = int(dist.all_reduce(np.array([mine], dtype=np.int64), "max")[0])
        if agreed:
            stop.signal = agreed
        return agreed

    # -- start and checkpoints ------------------------------------------------------------
    def start(self, model, optimizer, ckpt: dict | None, it: int) -> None:
        """Before the first step: rank 0's weights everywhere, the optimizer states checked to
        agree, each rank's dropout RNG restored (same N) or seeded apart."""
        if not self.active:
            return
        self.reducer = dist.DataParallel(model.parameters(), bucket_mb=BUCKET_MB)
        moments = [
            a
            for s in optimizer.state_dict()["state"].values()
            for a in (s["exp_avg"], s["exp_avg_sq"])
        ]
        if not dist.same_on_all_ranks([np.array([it]), *moments]):
            raise CheckpointError(
                "the ranks restored different optimizer states: every rank "
                "must read the same --out-dir (a shared filesystem)"
            )
        states = (ckpt or {}).get("rng_ranks")
        if states and len(states) == self.world_size:
            tg.set_rng_state(states[self.rank])
        elif self.rank > 0:  # its own dropout masks
            tg.manual_seed(
                int(np.random.SeedSequence([self.seed, self.rank, it]).generate_state(1)[0])
            )
        if self.is_main:
            self._describe(model)

    def _describe(self, model) -> None:
        n = sum(p.array.size for p in self.reducer.params)
        mb = 4 * (n + len(self.reducer.params)) / 1e6
        ring = 2 * (self.world_size - 1) / self.world_size * mb
        print(
            f"distributed: {self.world_size} ranks ({dist.local_world_size()} on this "
            f"machine); each takes {self.rows} of the {self.batch_size * self.grad_accum} "
            f"sequences per step in micro-batches of {self.chunks}; gradients averaged in "
            f"{len(self.reducer.buckets)} all-reduce buckets of <= {BUCKET_MB:g} MB, "
            f"{mb:.3g} MB per step (a ring moves {ring:.3g} MB per rank)",
            file=sys.stderr,
        )
        if dist.local_world_size() > 1 and not any(v in os.environ for v in _BLAS_VARS):
            cores = os.cpu_count() or 1
            print(
                f"note: {dist.local_world_size()} ranks share {cores} cores and BLAS threads "
                f"are not limited; set OPENBLAS_NUM_THREADS="
                f"{max(1, cores // dist.local_world_size())} (and OMP_NUM_THREADS) to avoid "
                "oversubscription",
                file=sys.stderr,
            )

    def checkpoint_state(self, state: dict, model) -> dict:
        """Add every rank's RNG state to a checkpoint (a collective: all ranks call it), after
        checking that the ranks' weights are still bitwise the same."""
        if not self.active:
            return state
        params = [p.array for p in model.parameters()]
        if not dist.same_on_all_ranks(params):
            raise RuntimeError(
                f"the ranks' weights differ at iter {state['iter']} (the "
                "all-reduce gave ranks different results); not saving"
            )
        return dict(
            state, world_size=self.world_size, rng_ranks=dist.all_gather_json(tg.get_rng_state())
        )

    @contextmanager
    def one_at_a_time(self):
        """Ranks run the block one after another (a file lock in the data cache), so that only
        the first prepares the data and the others find it ready."""
        if not self.active:
            yield
            return
        path = default_cache_dir() / ".prepare.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


SINGLE = Run()  # one process


class NoMetrics:
    """What ranks other than 0 log to: nothing."""

    def __init__(self):
        self.records: list = []

    def log(self, **record) -> None:
        pass

    def close(self) -> None:
        pass


def setup(c, error=RuntimeError) -> Run:
    """The Run of this process: one rank, or join the MPI launch (raises ``error`` with one
    line when the global batch does not split evenly or the [mpi] extra is missing)."""
    n = dist.launch_world_size()
    if n <= 1:
        return Run(1, 0, c.batch_size, c.grad_accum, c.seed)
    total = c.batch_size * c.grad_accum
    if total % n:
        raise error(
            f"the global batch, --batch-size {c.batch_size} x --grad-accum "
            f"{c.grad_accum} = {total} sequences, does not split evenly over {n} ranks: "
            f"make it a multiple of {n}"
        )
    try:
        dist.init()
        if c.device == "cuda":
            dist.use_local_gpu()
    except dist.DistributedError as e:
        raise error(str(e)) from None
    return Run(dist.world_size(), dist.rank(), c.batch_size, c.grad_accum, c.seed)


@contextmanager
def launch(exit_codes: dict, usage_error: type = ValueError):
    """Around gpt-train's main under mpiexec: ranks other than 0 print nothing, and a rank
    that raises after the ranks have joined prints one line naming itself and the cause and
    ends the process at once (waiting for peers that are blocked in a collective would hang).
    exit_codes: exception type -> exit status (others: 1); a ``usage_error`` on rank 0 (a bad
    flag, the same on every rank) is printed as one process would. One process: nothing.
    """
    if dist.launch_world_size() <= 1:
        yield
        return
    rank = dist.launch_rank()
    saved = sys.stdout, sys.stderr
    if rank > 0:
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (until the process ends)
    try:
        yield
    except BaseException as e:
        if not dist.is_initialized() or isinstance(e, SystemExit):
            raise  # before joining: every rank fails alike and main reports it (rank 0 shows)
        code = next((v for t, v in exit_codes.items() if isinstance(e, t)), 1)
        known = (DataError, CheckpointError, OSError, *exit_codes)
        if isinstance(e, KeyboardInterrupt):
            line = "gpt-train: interrupted; the last checkpoint (if any) stands"
        else:
            cause = " ".join(str(e).split()) or type(e).__name__
            if not isinstance(e, known):
                traceback.print_exception(e, file=sys.__stderr__)
                cause = f"{type(e).__name__}: {cause}"
            tag = "" if rank == 0 and isinstance(e, usage_error) else f"rank {rank}: "
            line = f"gpt-train: error: {tag}{cause}"
        if rank > 0:
            time.sleep(GRACE_S)  # if every rank failed alike, rank 0's line is the one shown
            if isinstance(e, KeyboardInterrupt):
                line = None
        dist.abort(code, line)  # to the real stderr (fd 2)
    sys.stdout, sys.stderr = saved
