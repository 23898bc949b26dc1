"""Optimizers, as ``torch.optim``: ``Optimizer`` (param groups, state dicts), ``SGD``, ``Adam``,
``AdamW``, ``RMSprop``; learning-rate schedules in ``lr_scheduler``.

Each update is written once, as the published formula on arrays (``sgd_update``,
``adamw_update``); a faster implementation of the AdamW update (one cache-sized pass
on the CPU, one fused kernel on the GPU) is registered in ``tensorgrad.kernels`` under
the op name 'adamw' and checked against this one by the registry test.

optimizer.py     Optimizer, the base class
__init__.py      SGD, AdamW and Adam (the update a GPT trains with, and its neighbours)
rmsprop.py       RMSprop
lr_scheduler.py  learning-rate schedules

Imports: math, .lr_scheduler, .optimizer, .rmsprop, ..devices, ..kernels.
"""

from __future__ import annotations

import math

from .. import kernels
from ..devices import device_of, get_array_module
from .optimizer import Optimizer
from .rmsprop import RMSprop, rmsprop_update  # noqa: F401  (torch.optim.RMSprop)

# ----------------------------------------------------------------------------- SGD


def sgd_update(x, g, buf, *, lr, momentum, dampening, nesterov, wd, first: bool):
    """torch.optim.SGD's step on arrays, in place (``buf`` is the momentum buffer or None)."""
    if wd:
        g = g + wd * x
    if momentum:
        if first:
            buf[...] = g
        else:
            buf *= momentum
            buf += (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    x -= lr * g


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay
    (L2, added to the gradient), in torch.optim.SGD's order of operations."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                dampening=dampening,
                weight_decay=weight_decay,
                nesterov=nesterov,
            ),
        )

    def _check(self, g):
        if not (g["lr"] >= 0 and g["momentum"] >= 0 and g["weight_decay"] >= 0):
            raise ValueError(f"SGD: invalid hyperparameters {dict(g, params='...')}")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("SGD: nesterov momentum requires a momentum and zero dampening")

    def step(self) -> None:
        for group, p, g, x in self._updated():
            st = self.state.setdefault(p, {"step": 0})
            first = "momentum_buffer" not in st
            if group["momentum"] and first:
                st["momentum_buffer"] = get_array_module(x).zeros_like(x)
            st["step"] += 1
            sgd_update(
                x,
                g,
                st.get("momentum_buffer"),
                lr=group["lr"],
                momentum=group["momentum"],
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                wd=group["weight_decay"],
                first=first,
            )
            self._bump(p)


# ----------------------------------------------------------------------------- AdamW


def adamw_update(
    x, g, m, v, *, lr: float, b1: float, b2: float, eps: float, wd: float, step: int
) -> None:
    """One AdamW update of parameter x in place (m, v too), in torch.optim.AdamW's order::

    x -= lr·wd·x                                    (decoupled weight decay)
    m = β1·m + (1-β1)·g ;  v = β2·v + (1-β2)·g²
    x -= lr/(1-β1^t) · m / (√v / √(1-β2^t) + eps)
    """
    xp = get_array_module(x)
    if wd:
        x *= 1 - lr * wd
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * (g * g)
    x -= (m / (xp.sqrt(v) / math.sqrt(1 - b2**step) + eps)) * (lr / (1 - b1**step))


def adamw_foreach(xs, gs, ms, vs, hyper) -> None:
    """adamw_update of each (x, g, m, v) in turn, ``hyper`` its keywords: the reference of a
    kernel that takes the whole list at once (torch.optim's ``foreach``)."""
    for x, g, m, v, hp in zip(xs, gs, ms, vs, hyper):
        adamw_update(x, g, m, v, **hp)


class AdamW(Optimizer):
    """AdamW (decoupled weight decay) with torch-style param groups and torch's order of
    operations. Parameters without a gradient are skipped (their step does not advance)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        fused: bool | None = None,
    ):
        # ``fused`` is accepted for torch compatibility; registered kernels decide
        super().__init__(
            params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        )

    def _check(self, g):
        g["betas"] = tuple(g["betas"])
        b1, b2 = g["betas"]
        vals = (g["lr"], b1, b2, g["eps"], g["weight_decay"])
        if (
            not all(math.isfinite(v) for v in vals)
            or g["lr"] < 0
            or not 0.0 <= b1 < 1.0
            or not 0.0 <= b2 < 1.0
            or g["eps"] < 0
            or g["weight_decay"] < 0
        ):
            raise ValueError(f"AdamW: invalid hyperparameters {dict(g, params='...')}")

    def step(self) -> None:
        ps, xs, gs, ms, vs, hyper = [], [], [], [], [], []
        for group, p, g, x in self._updated():
            st = self.state.get(p)
            if st is None:
                xp = get_array_module(x)
                st = self.state[p] = {
                    "step": 0,
                    "exp_avg": xp.zeros_like(x),
                    "exp_avg_sq": xp.zeros_like(x),
                }
            st["step"] += 1
            g, wd = self._decay(g, x, group["weight_decay"])
            b1, b2 = group["betas"]
            ps.append(p)
            xs.append(x)
            gs.append(g)
            ms.append(st["exp_avg"])
            vs.append(st["exp_avg_sq"])
            hyper.append(
                dict(lr=group["lr"], b1=b1, b2=b2, eps=group["eps"], wd=wd, step=st["step"])
            )
        if not ps:
            return
        # all at once where a kernel takes the list (torch's foreach), else one by one
        foreach = kernels.pick("adamw_foreach", device_of(xs[0]), xs, gs, ms, vs, hyper)
        if foreach is not None:
            foreach(xs, gs, ms, vs, hyper)
        else:
            for x, g, m, v, hp in zip(xs, gs, ms, vs, hyper):
                update = kernels.pick("adamw", device_of(x), x, g, m, v) or adamw_update
                update(x, g, m, v, **hp)
        for p in ps:
            self._bump(p)

    @staticmethod
    def _decay(g, x, wd):
        """(gradient, decoupled decay): AdamW decays the weights apart from the gradient."""
        return g, wd


class Adam(AdamW):
    """Adam: as AdamW, but ``weight_decay`` (0 by default) is L2, added to the gradient before
    the moments (torch.optim.Adam)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, fused: bool | None = None):  # fmt: skip
        super().__init__(params, lr, betas, eps, weight_decay, fused)

    @staticmethod
    def _decay(g, x, wd):
        return (g + wd * x if wd else g), 0.0


from . import lr_scheduler  # noqa: E402, F401  (torch.optim.lr_scheduler; imports nothing from here)
