"""``tensorgrad.utils``: helpers beside the library (as ``torch.utils``).

data/   datasets, samplers and the DataLoader (``torch.utils.data``)
"""

from . import data

__all__ = ["data"]
