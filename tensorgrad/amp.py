"""Mixed precision, as ``torch.amp``: ``autocast`` (matmuls in bfloat16 for a block) and
``GradScaler`` (dynamic loss scaling for float16 gradients).

    with tg.autocast("cpu", dtype=tg.bfloat16):    # matmul, linear, attention in bfloat16
        logits, loss = model(x, y)

    scaler = tg.amp.GradScaler("cpu")              # float16 parameters on the CPU
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                           # optional: before clipping
    scaler.step(opt)                               # skipped when a gradient is inf/NaN
    scaler.update()                                # halve on overflow, double after 2000 clean steps

autocast on 'cpu' is PyTorch's CPU autocast (its op lists, ``LOWER`` and ``FP32`` below): an
op on the lower-precision list (matmul / mm / bmm, linear, scaled_dot_product_attention)
casts its floating inputs to the block's dtype (bfloat16 or float16) and returns that dtype;
one on the float32 list (cross_entropy, prod, the losses) casts them to float32; every other
op runs in its inputs' dtype. The casts are recorded ops, so gradients reach the float32
weights as float32. ``Op.apply`` asks the block running in its thread to cast.

autocast on 'cuda' is what ``gpt-train --dtype`` does: weights, activations and optimizer state
stay float32 and the GPU's float32 matmuls round their inputs to bfloat16 (or TF32) on tensor
cores, for the block only. float16 has no such tensor-core mode here, so it is refused on
'cuda'.

``bfloat16`` is a tensor dtype stored through ml_dtypes (a default dependency): without it,
it is a dtype name for 'cuda' autocast only, and using it for storage raises one line saying
``pip install ml_dtypes``. ``float16`` is NumPy's.

Imports: contextlib, math, numpy, warnings, .autograd, .cuda, .devices, .ops, .types.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from .autograd import graph
from .cuda.ops import get_matmul_precision, set_matmul_precision
from .devices import cuda_available, get_array_module, parse_device
from .ops.linalg import Linear, MatMul
from .ops.more_math import Prod
from .ops.nn import Attention, CrossEntropy
from .types import ReducedFloat, as_dtype, bfloat16

float16 = np.float16
_CUDA_PRECISION = {"bfloat16": "bf16"}
_CPU_DTYPES = ("bfloat16", "float16")
# PyTorch's CPU autocast lists (aten/src/ATen/autocast_mode.cpp), as tensorgrad's ops: those
# cast to the block's dtype (matmul, mm, bmm, linear, scaled_dot_product_attention) and
# those cast to float32 (cross_entropy_loss, prod; nn/losses.py's losses call float32_inputs)
LOWER = frozenset({MatMul, Linear, Attention})
FP32 = frozenset({CrossEntropy, Prod})


def _dtype_name(dtype) -> str:
    if isinstance(dtype, ReducedFloat):
        return dtype.name
    return np.dtype(dtype).name


def _caller(obj, base) -> int:
    """The warning stack level of the user's line (a subclass's __init__ adds a frame)."""
    return 2 if type(obj).__init__ is base.__init__ else 3


class autocast(contextlib.ContextDecorator):
    """Run the block's matmuls in reduced precision (see the module docstring)."""

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
        if device_type == "cpu" and enabled and name not in _CPU_DTYPES:
            warnings.warn(  # PyTorch's words
                "In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                "CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently.",
                stacklevel=_caller(self, autocast),
            )
            enabled = False
        self.device_type, self.fast_dtype, self.enabled = device_type, name, enabled
        self.dtype = bfloat16 if name == "bfloat16" else as_dtype(name)
        self._saved: list = []

    def __enter__(self):
        if self.enabled and self.device_type == "cuda":
            self._saved.append(get_matmul_precision())
            set_matmul_precision(_CUDA_PRECISION[self.fast_dtype])
        elif self.device_type == "cpu":  # (a disabled block turns an outer one off inside it)
            self._saved.append(graph._state.autocast)
            graph._state.autocast = self if self.enabled else None
        return self

    def __exit__(self, *exc):
        if self.enabled and self.device_type == "cuda":
            set_matmul_precision(self._saved.pop())
        elif self.device_type == "cpu":
            graph._state.autocast = self._saved.pop()
        return False

    def cast_inputs(self, op, inputs) -> tuple:
        """The inputs of reference op ``op`` as PyTorch's CPU autocast casts them: each floating
        CPU tensor but float64 to the block's dtype (``op`` in LOWER) or to float32 (in FP32),
        by a recorded cast; as they are for any other op."""
        if op in LOWER:
            return _cast(inputs, self.dtype)
        return _cast(inputs, np.float32) if op in FP32 else inputs


def _cast(inputs, dtype) -> tuple:
    """Each floating CPU tensor of ``inputs`` but float64 cast to ``dtype`` (a recorded op)."""

    def eligible(x) -> bool:
        return (
            graph.is_tensor(x) and x.dtype.kind == "f" and x.dtype != np.float64 and not x.is_cuda
        )

    return tuple(x.to(dtype) if eligible(x) else x for x in inputs)


def float32_inputs(*inputs) -> tuple:
    """The float32 list for an op composed of others (``F.mse_loss``): its floating tensor
    inputs cast to float32 inside a CPU autocast block, as they are outside one."""
    return inputs if graph._state.autocast is None else _cast(inputs, np.float32)


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
