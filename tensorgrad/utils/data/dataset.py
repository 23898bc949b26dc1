"""Datasets: the map-style ``Dataset`` (``len`` and ``[i]``), the ``IterableDataset`` (a stream),
``TensorDataset``, ``Subset``, ``ConcatDataset`` and ``random_split``, as in torch.utils.data.

Imports: bisect, collections, math, .sampler, ...sampling, ...tensor.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from ...sampling import randperm
from ...tensor import Tensor
from .sampler import check_generator


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__(i)`` and usually ``__len__``."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: subclasses define ``__iter__``. A DataLoader batches them in the
    order they come (no sampler, no shuffle)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class TensorDataset(Dataset):
    """Sample i is ``tuple(t[i] for t in tensors)``; every tensor has the same first dim."""

    def __init__(self, *tensors: Tensor):
        if not tensors:
            raise ValueError("TensorDataset: needs at least one tensor")
        n = tensors[0].shape[0]
        sizes = [t.shape[0] for t in tensors]
        if any(s != n for s in sizes):
            raise ValueError(f"TensorDataset: size mismatch between tensors (first dims {sizes})")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]):
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, index):
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """The map-style datasets one after another."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes, total = [], 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int):
        if index < 0:
            if -index > len(self):
                raise IndexError(
                    f"ConcatDataset: index {index} out of range for length {len(self)}"
                )
            index += len(self)
        d = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[d - 1] if d > 0 else 0
        return self.datasets[d][index - start]


def _split_lengths(n: int, lengths) -> list[int]:
    lengths = list(lengths)
    if lengths and all(isinstance(x, float) for x in lengths) and math.isclose(sum(lengths), 1):
        if any(not 0 <= x <= 1 for x in lengths):
            raise ValueError(f"random_split: fractions must lie in [0, 1], got {lengths}")
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):  # the remainder, one each, round-robin from the first
            sizes[i % len(sizes)] += 1
        return sizes
    if any(not isinstance(x, int) or x < 0 for x in lengths):
        raise ValueError(
            f"random_split: lengths must be non-negative ints or fractions, got {lengths}"
        )
    if sum(lengths) != n:
        raise ValueError(
            f"random_split: sum of input lengths ({sum(lengths)}) does not equal the length of "
            f"the input dataset ({n})"
        )
    return lengths


def random_split(dataset: Dataset, lengths, generator=None) -> list[Subset]:
    """Split ``dataset`` into non-overlapping random Subsets of the given ``lengths`` (ints
    adding up to ``len(dataset)``, or fractions adding up to 1: each gets floor(n * f), the
    remainder going one each to the first splits). One permutation from ``generator`` (default:
    the global one, so ``tensorgrad.manual_seed`` repeats it)."""
    check_generator(generator, "random_split")
    sizes = _split_lengths(len(dataset), lengths)
    perm = randperm(sum(sizes), generator=generator).tolist()
    out, start = [], 0
    for size in sizes:
        out.append(Subset(dataset, perm[start : start + size]))
        start += size
    return out
