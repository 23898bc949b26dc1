"""``tensorgrad.nn.functional`` is ``tensorgrad.functional`` (as ``torch.nn.functional``)."""

from ..functional import *  # noqa: F403
