"""Optimizers, as ``torch.optim``: ``Optimizer`` (param groups, state dicts), ``SGD``, ``Adam``,
``AdamW``, ``RMSprop``; learning-rate schedules in ``lr_scheduler``.

Each update is written once, as the published formula on arrays (``sgd_update``,
``adamw_update``); a faster implementation of the AdamW update (one cache-sized pass
on the CPU, one fused kernel on the GPU) is registered in ``tensorgrad.kernels`` under
the op name 'adamw' and checked against this one by the registry test.
"""

from __future__ import annotations

import math

from .. import kernels
from ..devices import device_of, get_array_module, to_device
from ..tensor import Tensor, as_array


class Optimizer:
    """Parameter groups (dicts with 'params' plus hyperparameters) and per-parameter state."""

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        self.param_groups: list[dict] = []
        self.state: dict = {}  # parameter -> its state (arrays), as opt.state[p] in PyTorch
        for g in params:
            self.add_param_group(g)

    def add_param_group(self, group: dict) -> None:
        name = type(self).__name__
        g = dict(self.defaults)
        g.update({k: v for k, v in group.items() if k != "params"})
        ps = group["params"]
        g["params"] = [ps] if hasattr(ps, "data") else list(ps)
        seen = {id(p) for pg in self.param_groups for p in pg["params"]}
        for p in g["params"]:
            if not getattr(p, "requires_grad", False):
                raise TypeError(f"{name}: every parameter must be a tensor that requires grad")
            if id(p) in seen:
                raise ValueError(f"{name}: a parameter appears in more than one group")
            seen.add(id(p))
        self._check(g)
        self.param_groups.append(g)

    def _check(self, group: dict) -> None:  # hyperparameter validation, per optimizer
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (``set_to_none=True``, the default) or fill them with zeros."""
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.array = get_array_module(p.grad.array).zeros_like(p.grad.array)

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def _updated(self):
        """(group, parameter, gradient array, contiguous parameter array) for each p with a grad."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                x = p.array
                if not x.flags.c_contiguous:  # the update works on flat views
                    x = p.array = get_array_module(x).ascontiguousarray(x)
                yield group, p, p.grad.array, x

    def state_dict(self) -> dict:
        """{'param_groups': hyperparameters and parameter indices, 'state': index -> state}."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups, start = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(d)
        state = {index[id(p)]: _tensors(st) for p, st in self.state.items() if id(p) in index}
        return {"param_groups": groups, "state": state}

    def load_state_dict(self, sd: dict) -> None:
        name = type(self).__name__
        params = self._params()
        groups = sd["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)
        ):
            raise ValueError(f"{name}.load_state_dict: parameter groups do not match")
        for g, saved in zip(self.param_groups, groups):
            g.update(
                {k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"}
            )
        self.state = {}
        for i, st in sd["state"].items():
            p = params[int(i)]
            new = {}
            for k, v in st.items():
                if hasattr(v, "shape"):
                    v = as_array(v)
                    if tuple(v.shape) != p.shape:
                        raise ValueError(
                            f"{name}.load_state_dict: state {k!r} of shape {tuple(v.shape)} does "
                            f"not match parameter {i} of shape {tuple(p.shape)}"
                        )
                    v = to_device(get_array_module(v).asarray(v, dtype=p.dtype), p.device).copy()
                elif k == "step":
                    v = int(v)
                new[k] = v
            self.state[p] = new

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines) + "\n)"

    def _bump(self, p) -> None:
        p._version[0] += 1  # the parameter changed in place: graphs that saved it are stale


def _tensors(st: dict) -> dict:
    """A parameter's state with its arrays as Tensors (sharing memory), as PyTorch's."""
    return {k: (Tensor(v, dtype=v.dtype) if hasattr(v, "shape") else v) for k, v in st.items()}


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
        for group, p, g, x in self._updated():
            xp = get_array_module(x)
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = {
                    "step": 0,
                    "exp_avg": xp.zeros_like(x),
                    "exp_avg_sq": xp.zeros_like(x),
                }
            st["step"] += 1
            m, v = st["exp_avg"], st["exp_avg_sq"]
            g, wd = self._decay(g, x, group["weight_decay"])
            update = kernels.pick("adamw", device_of(x), x, g, m, v) or adamw_update
            b1, b2 = group["betas"]
            update(
                x,
                g,
                m,
                v,
                lr=group["lr"],
                b1=b1,
                b2=b2,
                eps=group["eps"],
                wd=wd,
                step=st["step"],
            )
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


# ----------------------------------------------------------------------------- RMSprop


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


from . import lr_scheduler  # noqa: E402, F401  (torch.optim.lr_scheduler; imports nothing from here)
