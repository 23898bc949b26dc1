"""``tensorgrad.utils.tensorboard.SummaryWriter``: scalars for TensorBoard, as
``torch.utils.tensorboard``'s, written by the ``tensorboard`` package's own event writer
(``tensorboard.summary.Writer``: NumPy only, no TensorFlow or torch). Like PyTorch's, it needs
that package: ``pip install tensorboard``. It records scalars only.

Imports: datetime, os, socket, tensorboard.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime

try:
    from tensorboard.summary import Writer as _Writer
except ImportError:  # tensorboard missing, or older than 2.5 (no tensorboard.summary.Writer)
    raise ImportError(
        "tensorgrad.utils.tensorboard needs the tensorboard package (2.5 or later): "
        "pip install tensorboard"
    ) from None


def _number(value) -> float:
    return float(value.item() if hasattr(value, "item") else value)


class SummaryWriter:
    """Event files under ``log_dir`` (default ``runs/<date>_<host><comment>``, as PyTorch's);
    ``add_scalar`` and ``add_scalars`` record values, ``flush``/``close`` write them out."""

    def __init__(self, log_dir: str | None = None, comment: str = "", **_ignored):
        if log_dir is None:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")
        self.log_dir = str(log_dir)
        self._writer = _Writer(self.log_dir)
        self._children: dict[str, _Writer] = {}

    def get_logdir(self) -> str:
        return self.log_dir

    def add_scalar(self, tag: str, scalar_value, global_step=None, walltime=None, **_ignored):
        """One value (a number or a one-element tensor) of series ``tag`` at ``global_step``."""
        step = 0 if global_step is None else int(global_step)
        self._writer.add_scalar(tag, _number(scalar_value), step, wall_time=walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict, global_step=None, walltime=None):
        """Several series in one chart: each ``tag`` in its own run ``log_dir/main_tag_tag``,
        all under ``main_tag`` (PyTorch's layout)."""
        step = 0 if global_step is None else int(global_step)
        for tag, value in tag_scalar_dict.items():
            run = os.path.join(self.log_dir, f"{main_tag}_{tag}".replace("/", "_"))
            if run not in self._children:
                self._children[run] = _Writer(run)
            self._children[run].add_scalar(main_tag, _number(value), step, wall_time=walltime)

    def __getattr__(self, name: str):
        if name.startswith("add_"):
            raise NotImplementedError(
                f"SummaryWriter.{name}: tensorgrad's writer records scalars only "
                "(add_scalar, add_scalars)"
            )
        raise AttributeError(f"'SummaryWriter' object has no attribute {name!r}")

    def flush(self) -> None:
        for w in (self._writer, *self._children.values()):
            w.flush()

    def close(self) -> None:
        for w in (self._writer, *self._children.values()):
            w.close()
        self._children = {}

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["SummaryWriter"]
