"""``tensorgrad.version``: as ``torch.version``, what a script prints or checks. ``cuda`` is
None, as in PyTorch's CPU build: tensorgrad's GPU path is CuPy's, whose CUDA version
``tensorgrad.cuda.is_available()`` does not need (scripts check ``cuda.is_available()``).

Imports: importlib.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("tensorgrad-gpt")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0"

cuda = None
hip = None
debug = False
