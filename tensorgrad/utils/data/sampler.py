"""Samplers: which dataset indices a DataLoader visits, and in which order and groups
(``SequentialSampler``, ``RandomSampler``, ``SubsetRandomSampler``, ``WeightedRandomSampler``,
``BatchSampler``), as in torch.utils.data. Random ones draw from ``generator`` (default: the
global generator, so ``tensorgrad.manual_seed`` repeats them).

Imports: collections, numpy, ...factory, ...sampling.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ...factory import tensor
from ...sampling import Generator, multinomial, randint, randperm

_CHUNK = 1024  # indices drawn at a time with replacement (num_samples may be 1e10)


def check_generator(generator, who: str):
    """``generator`` unless it is neither None nor a tensorgrad.Generator (a torch.Generator,
    a seed): one TypeError naming what is expected."""
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(
            f"{who}: generator must be a tensorgrad.Generator or None, "
            f"got {type(generator).__name__}"
        )
    return generator


def check_batch_args(batch_size, drop_last) -> None:
    """PyTorch's checks of BatchSampler's arguments (a DataLoader over a stream makes them too)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(
            f"batch_size should be a positive integer value, but got batch_size={batch_size!r}"
        )
    if not isinstance(drop_last, bool):
        raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")


class Sampler:
    """Base class: subclasses define ``__iter__`` (indices) and usually ``__len__``."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """Random indices into ``data_source``: without replacement, whole permutations (one per
    epoch of ``len(data_source)``, the last cut to ``num_samples``); with replacement,
    ``num_samples`` independent uniform draws, made lazily in chunks (so a huge ``num_samples``
    costs nothing up front)."""

    def __init__(self, data_source, replacement: bool = False, num_samples=None, generator=None):
        if not isinstance(replacement, bool):
            raise TypeError(f"RandomSampler: replacement must be a bool, got {replacement!r}")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(
                f"RandomSampler: num_samples must be a positive integer, got {num_samples!r}"
            )
        self.data_source, self.replacement = data_source, replacement
        self._num_samples = num_samples
        self.generator = check_generator(generator, "RandomSampler")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n, left = len(self.data_source), self.num_samples
        if n == 0 and left > 0:  # PyTorch divides by zero here; a permutation loop never ends
            raise ValueError(
                f"RandomSampler: cannot draw num_samples={left} indices from an empty data source"
            )
        if self.replacement:
            while left > 0:
                k = min(left, _CHUNK)
                yield from randint(n, (k,), generator=self.generator).tolist()
                left -= k
            return
        while left > 0:
            perm = randperm(n, generator=self.generator).tolist()
            yield from perm[:left]
            left -= n

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given ``indices`` in a random order (a new one each epoch)."""

    def __init__(self, indices: Sequence[int], generator=None):
        self.indices = indices
        self.generator = check_generator(generator, "SubsetRandomSampler")

    def __iter__(self):
        for i in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices in [0, len(weights)), index i with probability proportional
    to ``weights[i]`` (with or without replacement; with it, drawn lazily in chunks, so a huge
    ``num_samples`` costs nothing up front)."""

    def __init__(self, weights, num_samples: int, replacement: bool = True, generator=None):
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(
                f"WeightedRandomSampler: num_samples must be a positive integer, got {num_samples!r}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                "WeightedRandomSampler: replacement should be a boolean value, "
                f"but got replacement={replacement!r}"
            )
        check_generator(generator, "WeightedRandomSampler")
        self.weights = tensor(np.asarray(weights, dtype=np.float64))
        if self.weights.ndim != 1:
            raise ValueError("WeightedRandomSampler: weights must be a 1-d sequence")
        self.num_samples, self.replacement, self.generator = num_samples, replacement, generator

    def __iter__(self):
        if not self.replacement:  # num_samples <= len(weights), or multinomial refuses
            drawn = multinomial(self.weights, self.num_samples, False, self.generator)
            return iter(drawn.tolist())
        return self._draws()

    def _draws(self):
        left, chunk = self.num_samples, max(_CHUNK, self.weights.shape[0])
        while left > 0:
            k = min(left, chunk)
            yield from multinomial(self.weights, k, True, self.generator).tolist()
            left -= k

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Groups ``sampler``'s indices into lists of ``batch_size``; the last, shorter list is
    dropped with ``drop_last``."""

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        check_batch_args(batch_size, drop_last)
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
