"""``RMSprop`` (torch.optim.RMSprop): its update on arrays, ``rmsprop_update``, and the class.

Imports: .optimizer, ..devices.
"""

from __future__ import annotations

from ..devices import get_array_module
from .optimizer import Optimizer


def rmsprop_update(x, g, sq, gavg, buf, *, lr, alpha, eps, wd, momentum) -> None:
    """One torch.optim.RMSprop update of x in place (its state arrays too)::

    g += wd·x ;  sq = α·sq + (1-α)·g²
    v = sq, or sq - gavg² with gavg = α·gavg + (1-α)·g (centered)
    x -= lr·buf with buf = μ·buf + g/(√v + eps) (momentum), else x -= lr·g/(√v + eps)
    """
    xp = get_array_module(x)
    if wd:
        g = g + wd * x
    sq *= alpha
    sq += (1 - alpha) * (g * g)
    v = sq
    if gavg is not None:
        gavg *= alpha
        gavg += (1 - alpha) * g
        v = sq - gavg * gavg
    step = g / (xp.sqrt(v) + eps)
    if buf is not None:
        buf *= momentum
        buf += step
        step = buf
    x -= lr * step


class RMSprop(Optimizer):
    """RMSprop: each gradient divided by the root of its running mean square (``alpha`` its
    decay), optionally centered (minus the running mean's square) and with momentum;
    ``weight_decay`` is L2, added to the gradient (torch.optim.RMSprop's algorithm)."""

    def __init__(
        self,
        params,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ):
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay)
        super().__init__(params, dict(defaults, momentum=momentum, centered=centered))

    def _check(self, g):
        for k in ("lr", "alpha", "eps", "weight_decay", "momentum"):
            if not g[k] >= 0:
                raise ValueError(f"RMSprop: invalid {k} value: {g[k]}")

    def step(self) -> None:
        for group, p, g, x in self._updated():
            xp = get_array_module(x)
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = {"step": 0, "square_avg": xp.zeros_like(x)}
                if group["momentum"] > 0:
                    st["momentum_buffer"] = xp.zeros_like(x)
                if group["centered"]:
                    st["grad_avg"] = xp.zeros_like(x)
            st["step"] += 1
            rmsprop_update(
                x,
                g,
                st["square_avg"],
                st.get("grad_avg"),
                st.get("momentum_buffer"),
                lr=group["lr"],
                alpha=group["alpha"],
                eps=group["eps"],
                wd=group["weight_decay"],
                momentum=group["momentum"],
            )
            self._bump(p)
