"""``DataLoader``: iterate over a dataset in batches, as torch.utils.data.DataLoader.

    loader = DataLoader(dataset, batch_size=64, shuffle=True, drop_last=True)
    for x, y in loader:          # each a Tensor with the batch in dim 0
        ...

Map-style datasets go through a sampler (``SequentialSampler``, or ``RandomSampler`` with
``shuffle=True``) grouped by a ``BatchSampler``; an ``IterableDataset`` is read in its own
order. Each batch is ``collate_fn(list of samples)`` (``default_collate``).

Everything runs in this process. ``num_workers > 0`` is accepted and reads the samples here
too (``worker_init_fn(0)`` is called once per epoch): on the CPU the model's step, not the
loading, is what takes the time, and a worker process would compete with the NumPy threads
for the same cores. ``pin_memory`` is accepted and does nothing (there is no pinned memory
on the CPU; a batch moves to a GPU with ``.to("cuda")``).

Imports: .collate, .dataset, .sampler.
"""

from __future__ import annotations

from .collate import default_collate, default_convert
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler, check_batch_args


def get_worker_info():
    """None: samples are always read in the main process (see the module docstring)."""
    return None


class DataLoader:
    """Batches of ``dataset``; the arguments mean what they mean in PyTorch."""

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
    ):
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"num_workers option should be a non-negative integer, got {num_workers!r}"
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        self.dataset, self.num_workers, self.pin_memory = dataset, num_workers, pin_memory
        self.timeout, self.worker_init_fn, self.generator = timeout, worker_init_fn, generator
        self.prefetch_factor, self.persistent_workers = prefetch_factor, persistent_workers
        self.iterable = isinstance(dataset, IterableDataset)
        if self.iterable:
            if shuffle:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}"
                )
            if sampler is not None or batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler and "
                    "batch_sampler options"
                )
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
        elif batch_size is not None:  # every kind of dataset: a stream is batched by count
            check_batch_args(batch_size, drop_last)
        if sampler is None and not self.iterable:
            sampler = (
                RandomSampler(dataset, generator=generator)
                if shuffle
                else SequentialSampler(dataset)
            )
        if batch_size is not None and batch_sampler is None and not self.iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler
        auto = batch_size is not None or batch_sampler is not None
        self.collate_fn = collate_fn or (default_collate if auto else default_convert)
        self._auto = auto

    def __iter__(self):
        if self.worker_init_fn is not None and self.num_workers > 0:
            self.worker_init_fn(0)
        if self.iterable:
            return self._iter_stream()
        if self._auto:
            return self._iter_batches()
        return (self.collate_fn(self.dataset[i]) for i in self.sampler)

    def _iter_batches(self):
        getitems = getattr(self.dataset, "__getitems__", None)
        for indices in self.batch_sampler:
            samples = getitems(indices) if getitems else [self.dataset[i] for i in indices]
            yield self.collate_fn(samples)

    def _iter_stream(self):
        if not self._auto:
            yield from (self.collate_fn(s) for s in self.dataset)
            return
        batch = []
        for s in self.dataset:
            batch.append(s)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def __len__(self) -> int:
        if self.iterable:
            n = len(self.dataset)  # TypeError when the stream has no length, as in PyTorch
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler if self._auto else self.sampler)
