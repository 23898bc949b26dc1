"""``tensorgrad.utils``: helpers beside the library (as ``torch.utils``).

data/   datasets, samplers and the DataLoader (``torch.utils.data``)
tensorboard.py  SummaryWriter (``torch.utils.tensorboard``; imported on its own, it needs the
                tensorboard package)

Imports: .data.
"""

from . import data

__all__ = ["data"]
