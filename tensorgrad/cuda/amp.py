"""``tensorgrad.cuda.amp``: ``GradScaler`` and ``autocast`` bound to the 'cuda' device, as the
older ``torch.cuda.amp`` spelling (see tensorgrad.amp). Without a GPU both disable themselves
with a warning, as in PyTorch. autocast's default dtype here is bfloat16 (PyTorch's is
float16, which tensorgrad's tensor-core matmuls do not take).

Imports: ..amp.
"""

from __future__ import annotations

from .. import amp


class GradScaler(amp.GradScaler):
    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        super().__init__(
            "cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled
        )


class autocast(amp.autocast):
    def __init__(self, enabled: bool = True, dtype=amp.bfloat16, cache_enabled=None):
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


__all__ = ["GradScaler", "autocast"]
