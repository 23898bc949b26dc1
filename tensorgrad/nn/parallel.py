"""``tensorgrad.nn.parallel.DistributedDataParallel``: PyTorch's DDP wrapper, over
``tensorgrad.distributed.DataParallel`` (bucketed all-reduce of the gradients).

    model = DDP(model, device_ids=[local_rank])   # rank 0's weights copied to every rank
    logits, loss = model(x, y)
    loss.backward()                               # then every gradient averaged over ranks

A forward with gradients enabled queues the reduction to run when the next backward has
finished (``autograd.queue_callback``), unless ``require_backward_grad_sync`` is False (or
inside ``no_sync()``): gradients then add up locally, and the next synced backward reduces
the sum, as nanoGPT's gradient accumulation expects. ``device_ids`` and ``output_device`` are
accepted; the module stays where it is (move it with ``.to()`` first).

Imports: contextlib, .module, ..autograd, ..distributed.
"""

from __future__ import annotations

from contextlib import contextmanager

from ..autograd import is_grad_enabled, queue_callback
from ..distributed import DataParallel
from .module import Module


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training; ``.module`` is the model itself."""

    def __init__(
        self,
        module: Module,
        device_ids=None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group=None,
        bucket_cap_mb: float = 4.0,
        find_unused_parameters: bool = False,
        **kwargs,
    ):
        super().__init__()
        if process_group is not None:
            raise ValueError("DistributedDataParallel: only the world group (None) exists")
        self.module = module
        self.device_ids = device_ids
        self.require_backward_grad_sync = True
        self.reducer = DataParallel(module.parameters(), bucket_mb=bucket_cap_mb)
        self._queued = False

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if is_grad_enabled() and self.require_backward_grad_sync and not self._queued:
            self._queued = True
            queue_callback(self._reduce)
        return out

    def _reduce(self) -> None:
        self._queued = False
        self.reducer.reduce_gradients()

    @contextmanager
    def no_sync(self):
        """Backwards inside the block only accumulate locally (no all-reduce)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old


__all__ = ["DistributedDataParallel"]
