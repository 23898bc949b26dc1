"""``tensorgrad.utils.data``: datasets, samplers and the DataLoader (``torch.utils.data``).

dataset.py     Dataset, IterableDataset, TensorDataset, Subset, ConcatDataset, random_split
sampler.py     SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
               BatchSampler
collate.py     default_collate, default_convert (samples -> one batch)
dataloader.py  DataLoader (in-process; see its docstring for num_workers and pin_memory)

Imports: .collate, .dataloader, .dataset, .sampler.
"""

from .collate import default_collate, default_convert
from .dataloader import DataLoader, get_worker_info
from .dataset import (
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]
