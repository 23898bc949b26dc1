"""``tensorgrad._inductor``: the name scripts import to tune torch.compile's inductor backend
(llm.c's ``import torch._inductor.config as config``). Its ``config`` is a settable namespace;
tensorgrad.compile reads none of it (docs/compile.md, "Options").

Imports: .config.
"""

from . import config

__all__ = ["config"]
