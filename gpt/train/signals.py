"""SIGINT/SIGTERM: before the loop they stop the run at once; in the loop they set a flag
that the loop reads between steps, so the step finishes and a checkpoint is saved."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

from .. import dist_train


class Interrupted(Exception):
    """SIGINT/SIGTERM outside the training loop (reading data, loading, the final sample):
    main exits at once with 130/143 (a hung read of a FIFO would swallow a mere flag)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopFlag:
    """signal: the signal received (0: none); armed: the loop is running, so a signal only
    sets the flag (a second one raises KeyboardInterrupt: quit without saving)."""

    def __init__(self):
        self.signal, self.armed = 0, False

    def on_signal(self, signum, frame) -> None:
        if not self.armed:  # before the loop (reading data, loading): stop right away
            raise Interrupted(signum)
        if self.signal:  # a second one: give up at once (the last checkpoint stands)
            raise KeyboardInterrupt
        self.signal = signum
        if dist_train.launch_rank() == 0:  # (under mpiexec every rank gets it)
            os.write(
                2,
                f"\n{signal.Signals(signum).name} received: finishing this step, then "
                "saving a checkpoint (Ctrl-C again to quit without saving)\n".encode(),
            )


@contextmanager
def handle_signals(stop: StopFlag):
    """stop.on_signal handles SIGINT and SIGTERM inside the block (main thread only)."""
    previous = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, stop.on_signal)
    except ValueError:  # not the main thread: no handlers, Ctrl-C raises as usual
        pass
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
