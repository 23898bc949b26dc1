"""Mixed precision, as ``torch.amp``: ``autocast`` (matmul precision for a block) and
``GradScaler`` (dynamic loss scaling for float16 gradients).

    with tg.autocast("cuda", dtype=tg.bfloat16):   # matmuls on bfloat16 tensor cores
        logits, loss = model(x, y)

    scaler = tg.amp.GradScaler("cpu")              # float16 parameters on the CPU
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                           # optional: before clipping
    scaler.step(opt)                               # skipped when a gradient is inf/NaN
    scaler.update()                                # halve on overflow, double after 2000 clean steps

autocast on 'cuda' is what ``gpt-train --dtype`` does: weights, activations and optimizer state
stay float32 and the GPU's float32 matmuls round their inputs to bfloat16 (or TF32) on tensor
cores, for the block only. float16 has no such tensor-core mode here, so it is refused on
'cuda'. On the CPU autocast changes nothing (every op stays in its tensors' dtype).

``bfloat16`` is a dtype name for autocast only: NumPy has no bfloat16 storage, so a tensor of
it cannot be made (using it as a dtype raises one line saying so). ``float16`` is NumPy's.

Imports: contextlib, math, numpy, warnings, .cuda, .devices.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from .cuda.ops import get_matmul_precision, set_matmul_precision
from .devices import cuda_available, get_array_module, parse_device

float16 = np.float16


class ReducedFloat:
    """A dtype name without NumPy storage (``tensorgrad.bfloat16``): accepted by autocast;
    as a tensor's dtype it raises TypeError."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"tensorgrad.{self.name}"

    @property
    def dtype(self):  # NumPy reads .dtype when given this object as a dtype
        raise TypeError(
            f"tensorgrad.{self.name} has no storage (NumPy has no {self.name}); use it as "
            "autocast(dtype=...) for GPU matmuls, or float32 / float16 for tensors"
        )

    @property
    def itemsize(self) -> int:
        return 2

    is_floating_point = True


bfloat16 = ReducedFloat("bfloat16")
_CUDA_PRECISION = {"bfloat16": "bf16"}


def _dtype_name(dtype) -> str:
    if isinstance(dtype, ReducedFloat):
        return dtype.name
    return np.dtype(dtype).name


def _caller(obj, base) -> int:
    """The warning stack level of the user's line (a subclass's __init__ adds a frame)."""
    return 2 if type(obj).__init__ is base.__init__ else 3


class autocast(contextlib.ContextDecorator):
    """Run the block's GPU matmuls in reduced precision (see the module docstring)."""

    def __init__(
        self, device_type: str = "cuda", dtype=None, enabled: bool = True, cache_enabled=None
    ):
        device_type = parse_device(device_type)
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}")
        name = _dtype_name(bfloat16 if dtype is None else dtype)
        if device_type == "cuda" and enabled and not cuda_available():
            warnings.warn(
                "autocast: device_type 'cuda' but CUDA is not available; autocast is disabled",
                stacklevel=_caller(self, autocast),
            )
            enabled = False
        if device_type == "cuda" and enabled and name not in _CUDA_PRECISION:
            raise ValueError(
                f"autocast: dtype {name} is not supported on cuda (tensorgrad's tensor-core "
                "matmuls take bfloat16 inputs): use dtype=tensorgrad.bfloat16"
            )
        self.device_type, self.fast_dtype, self.enabled = device_type, name, enabled
        self._saved: list[str] = []

    def __enter__(self):
        if self.enabled and self.device_type == "cuda":
            self._saved.append(get_matmul_precision())
            set_matmul_precision(_CUDA_PRECISION[self.fast_dtype])
        return self

    def __exit__(self, *exc):
        if self.enabled and self.device_type == "cuda":
            set_matmul_precision(self._saved.pop())
        return False


# ----------------------------------------------------------------------------- GradScaler
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """Dynamic loss scaling: the loss is multiplied by ``scale`` before backward, so small
    float16 gradients do not flush to zero; ``step`` divides the gradients back and skips the
    optimizer step when any is inf or NaN. ``update`` then halves the scale (``backoff_factor``)
    after an overflow, or doubles it (``growth_factor``) after ``growth_interval`` steps in a
    row without one. ``enabled=False`` makes every method a pass-through. On ``device='cuda'``
    without a GPU it disables itself with a warning, as PyTorch does."""

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        if enabled and parse_device(device) == "cuda" and not cuda_available():
            warnings.warn(
                "GradScaler: device 'cuda' but CUDA is not available; the scaler is disabled",
                stacklevel=_caller(self, GradScaler),
            )
            enabled = False
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if not isinstance(growth_interval, int) or growth_interval <= 0:
            raise ValueError(
                f"GradScaler: growth_interval must be a positive int, got {growth_interval!r}"
            )
        self.device, self._enabled = device, enabled
        self._scale, self._growth_tracker = float(init_scale), 0
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = growth_interval
        self._per_optimizer: dict[int, dict] = {}

    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def scale(self, outputs):
        """``outputs * scale`` (a Tensor, or tensors in lists / tuples)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self._scale

    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": None})

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in their dtype, and note whether any
        is inf or NaN. At most once per optimizer between two ``update`` calls."""
        if not self._enabled:
            return
        st = self._state(optimizer)
        if st["stage"] == _UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()"
            )
        if st["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        inv = 1.0 / self._scale
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.array
                xp = get_array_module(g)
                g = g * g.dtype.type(inv)  # a new array: the grad may share memory with another
                found = found or not bool(xp.isfinite(g).all())
                p.grad.array = g
        st["stage"], st["found_inf"] = _UNSCALED, found

    def step(self, optimizer, *args, **kwargs):
        """Unscale (if not done yet), then ``optimizer.step()`` unless a gradient is inf/NaN;
        returns what step returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        st = self._state(optimizer)
        if st["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if st["stage"] == _READY:
            self.unscale_(optimizer)
        out = None if st["found_inf"] else optimizer.step(*args, **kwargs)
        st["stage"] = _STEPPED
        return out

    def update(self, new_scale=None) -> None:
        """Set the scale for the next iteration: ``new_scale`` if given, else back off after
        an inf/NaN this iteration, or grow after ``growth_interval`` clean ones."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale.item() if hasattr(new_scale, "item") else new_scale)
        else:
            found = [
                s["found_inf"] for s in self._per_optimizer.values() if s["found_inf"] is not None
            ]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update().")
            if any(found):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    grown = self._scale * self._growth_factor
                    self._scale = grown if math.isfinite(grown) else self._scale
                    self._growth_tracker = 0
        self._per_optimizer = {}

    def state_dict(self) -> dict:
        """The scale and its schedule (empty when disabled), for checkpoints."""
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state: dict) -> None:
        if not self._enabled:
            raise RuntimeError("load_state_dict: this GradScaler is disabled (enabled=False)")
        if not state:
            raise RuntimeError(
                "load_state_dict: the state dict is empty (saved from a disabled GradScaler?)"
            )
        self._scale = float(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


__all__ = ["GradScaler", "autocast", "bfloat16", "float16", "ReducedFloat"]
