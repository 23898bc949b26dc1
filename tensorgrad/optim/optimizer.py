"""``Optimizer``, the base class of every optimizer (as ``torch.optim.optimizer.Optimizer``):
parameter groups with their hyperparameters, per-parameter state, zero_grad, state dicts.
A subclass writes ``step()`` over ``self._updated()`` and calls ``self._bump(p)`` after each
in-place update.

Imports: ..devices, ..tensor.
"""

from __future__ import annotations

from ..devices import get_array_module, to_device
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
