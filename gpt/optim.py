"""AdamW exactly as published (decoupled weight decay), gradient clipping, and the LR schedule."""

from __future__ import annotations

import math

from tensorgrad.backend import get_array_module, kernels_for, to_device, to_numpy
from tensorgrad.nn import Parameter


class AdamW:
    """AdamW with torch-style param groups and torch.optim.AdamW's order of operations.

    For each parameter p with gradient g, at step t (per group: lr, betas, eps, wd)::

        p -= lr·wd·p                                  (decoupled decay)
        m = β1·m + (1-β1)·g ;  v = β2·v + (1-β2)·g²
        p -= lr/(1-β1^t) · m / (√v / √(1-β2^t) + eps)

    Parameters without a gradient are skipped (their step count does not advance).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        params = list(params)
        if not params:
            raise ValueError("AdamW got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        self.param_groups = []
        seen = set()
        for g in params:
            group = dict(defaults)
            group.update({k: v for k, v in g.items() if k != "params"})
            group["betas"] = tuple(group["betas"])
            group["params"] = list(g["params"])
            for p in group["params"]:
                if not isinstance(p, Parameter) and not getattr(p, "requires_grad", False):
                    raise TypeError("AdamW: every parameter must be a tensor that requires grad")
                if id(p) in seen:
                    raise ValueError("AdamW: a parameter appears in more than one group")
                seen.add(id(p))
            self._check(group)
            self.param_groups.append(group)
        self.state: dict[int, dict] = {}  # id(param) -> {step, exp_avg, exp_avg_sq}

    @staticmethod
    def _check(g):
        b1, b2 = g["betas"]
        if g["lr"] < 0 or not 0.0 <= b1 < 1.0 or not 0.0 <= b2 < 1.0 or g["eps"] < 0 \
                or g["weight_decay"] < 0:
            raise ValueError(f"AdamW: invalid hyperparameters {dict(g, params='...')}")

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                p.grad = None

    def step(self) -> None:
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.data
                x = p.data
                xp = get_array_module(x)
                if not x.flags.c_contiguous:  # before zeros_like, whose moments copy the layout
                    x = p.data = xp.ascontiguousarray(x)
                st = self.state.get(id(p))
                if st is None:
                    st = self.state[id(p)] = {
                        "step": 0, "exp_avg": xp.zeros_like(x), "exp_avg_sq": xp.zeros_like(x),
                    }
                st["step"] += 1
                adamw_update(x, g, st["exp_avg"], st["exp_avg_sq"], lr=lr, b1=b1, b2=b2,
                             eps=eps, wd=wd, step=st["step"])
                p._version[0] += 1

    # ------------------------------------------------------------------ (de)serialisation
    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        """{'param_groups': hyperparameters and parameter indices, 'state': index -> moments}."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups, start = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(d)
        state = {index[k]: dict(v) for k, v in self.state.items() if k in index}
        return {"param_groups": groups, "state": state}

    def load_state_dict(self, sd: dict) -> None:
        params = self._params()
        groups = sd["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)
        ):
            raise ValueError("AdamW.load_state_dict: parameter groups do not match this optimizer")
        for g, saved in zip(self.param_groups, groups):
            g.update({k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, st in sd["state"].items():
            p = params[int(i)]
            m, v = st["exp_avg"], st["exp_avg_sq"]
            if tuple(m.shape) != p.shape or tuple(v.shape) != p.shape:
                raise ValueError(
                    f"AdamW.load_state_dict: moment shape {tuple(m.shape)} does not match "
                    f"parameter {i} of shape {p.shape}"
                )
            self.state[id(p)] = {
                "step": int(st["step"]),
                "exp_avg": to_device(get_array_module(m).asarray(m, dtype=p.dtype), p.device).copy(),
                "exp_avg_sq": to_device(get_array_module(v).asarray(v, dtype=p.dtype), p.device).copy(),
            }


CHUNK = 1 << 17  # elements per pass on CPU: one chunk's temporaries stay in cache


def adamw_update(x, g, m, v, *, lr: float, b1: float, b2: float, eps: float, wd: float,
                 step: int) -> None:
    """One AdamW update of parameter x in place (m, v too), in torch.optim.AdamW's order.

    On CPU it walks the flat arrays in cache-sized chunks, so the ten elementwise passes
    cost one trip through main memory instead of ten, and no full-size temporary is made.
    """
    xp = get_array_module(x)
    K = kernels_for(xp, "adamw")
    if K is not None and x.dtype == g.dtype == "float32":
        # the same float32 operations in one fused CUDA pass
        K.adamw_update(x, g, m, v, lr=lr, b1=b1, b2=b2, eps=eps, wd=wd, step=step)
        return
    xf, mf, vf = x.reshape(-1), m.reshape(-1), v.reshape(-1)  # contiguous: views
    gf = g.reshape(-1)
    n = xf.size
    chunk = CHUNK if xp.__name__ == "numpy" else max(n, 1)
    decay = 1 - lr * wd
    step_size = lr / (1 - b1**step)
    bc2_sqrt = math.sqrt(1 - b2**step)
    buf = xp.empty(min(chunk, n), dtype=x.dtype)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        xs, gs, ms, vs, b = xf[s:e], gf[s:e], mf[s:e], vf[s:e], buf[: e - s]
        if wd:
            xs *= decay  # decoupled weight decay
        ms *= b1  # m = β1·m + (1-β1)·g
        xp.multiply(gs, 1 - b1, out=b)
        ms += b
        vs *= b2  # v = β2·v + (1-β2)·g²
        xp.multiply(gs, gs, out=b)
        b *= 1 - b2
        vs += b
        xp.sqrt(vs, out=b)  # denominator √v/√(1-β2^t) + eps
        b /= bc2_sqrt
        b += eps
        xp.divide(ms, b, out=b)
        b *= step_size
        xs -= b


def clip_grad_norm_(params, max_norm: float) -> float:
    """Scale all gradients so that their joint L2 norm is at most max_norm; return the norm
    before clipping (inf/nan pass through unscaled so the caller can see them)."""
    params = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((to_numpy((p.grad.data * p.grad.data).sum()))) for p in params))
    if max_norm is not None and max_norm > 0 and math.isfinite(total):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for p in params:
                # a new array: gradient arrays may be shared between tensors
                p.grad.data = p.grad.data * p.grad.dtype.type(coef)
    return total


def cosine_lr(it: int, warmup_iters: int, lr_decay_iters: int, max_lr: float,
              min_lr: float) -> float:
    """Learning rate at iteration ``it``: linear warmup, cosine decay, then a floor.

    it < warmup_iters: max_lr·(it+1)/(warmup_iters+1) (never 0, reaches max_lr at warmup_iters);
    warmup_iters <= it < lr_decay_iters: cosine from max_lr down to min_lr; after: min_lr.
    """
    if it < warmup_iters:
        return max_lr * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
