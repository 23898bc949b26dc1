"""Modules: parameter registration, state dicts, and the layers a GPT is made of."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from .. import functional as F
from ..backend import get_array_module, parse_device, rng, to_device
from ..tensor import DEFAULT_DTYPE, Tensor


class Parameter(Tensor):
    """A leaf tensor that a Module registers as learnable (requires_grad=True)."""

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        super().__init__(data.data if isinstance(data, Tensor) else data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class: assigning a Parameter or Module attribute registers it by name."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ first")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = ""):
        """(dotted name, module) pairs, depth first in registration order, as PyTorch."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            kids = [(f"{name}.{n}" if name else n, c) for n, c in m._modules.items()]
            stack.extend(reversed(kids))

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True):
        """(dotted name, Parameter) pairs; a shared Parameter is listed once, by its first name."""
        seen = set()
        for mname, m in self._walk(prefix):
            for n, p in m._parameters.items():
                if remove_duplicate and id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mname}.{n}" if mname else n), p

    def _walk(self, prefix=""):
        # depth-first in registration order, like PyTorch
        yield prefix, self
        for n, c in self._modules.items():
            yield from c._walk(f"{prefix}.{n}" if prefix else n)

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    # ------------------------------------------------------------------ state
    def state_dict(self) -> "OrderedDict[str, object]":
        """name -> backend array, every name (a shared Parameter appears under each name)."""
        return OrderedDict(
            (n, p.data) for n, p in self.named_parameters(remove_duplicate=False)
        )

    def load_state_dict(self, state: dict, strict: bool = True):
        """Copy arrays into the parameters, checking names and shapes first.

        Raises KeyError listing missing/unexpected names (when strict) and ValueError
        listing shape mismatches; nothing is modified unless every check passes.
        Returns (missing, unexpected).
        """
        own = OrderedDict(self.named_parameters(remove_duplicate=False))
        missing = [n for n in own if n not in state]
        unexpected = [n for n in state if n not in own]
        if strict and (missing or unexpected):
            raise KeyError(
                f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}"
            )
        bad = [
            f"{n}: checkpoint {tuple(np.shape(v))} vs model {p.shape}"
            for n, v in state.items()
            if n in own and tuple(np.shape(v)) != (p := own[n]).shape
        ]
        if bad:
            raise ValueError("load_state_dict: shape mismatch for " + "; ".join(bad))
        for n, v in state.items():
            if n in own:
                p = own[n]
                arr = v.data if isinstance(v, Tensor) else v
                # a contiguous copy: the optimizer updates parameters in place
                arr = get_array_module(arr).array(arr, dtype=p.dtype, order="C", copy=True)
                p.data = to_device(arr, p.device)
                p._version[0] += 1
        return missing, unexpected

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, requires_grad: bool = True):
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def to(self, device=None, dtype=None):
        """Move (and/or cast) every parameter in place; returns self."""
        for p in self.parameters():
            arr = p.data
            if device is not None:
                arr = to_device(arr, parse_device(device))
            if dtype is not None:
                arr = arr.astype(dtype)
            p.data = arr
            if p.grad is not None:
                p.grad = None
        return self

    def cuda(self):
        return self.to("cuda")

    def cpu(self):
        return self.to("cpu")

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for n, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({n}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module):
        setattr(self, str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        for k, v in (modules or {}).items():
            setattr(self, k, v)

    def __getitem__(self, k):
        return self._modules[k]

    def __setitem__(self, k, v):
        setattr(self, k, v)

    def __contains__(self, k):
        return k in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()


def _uniform(shape, bound):
    return rng("cpu").uniform(-bound, bound, size=shape).astype(DEFAULT_DTYPE)


class Linear(Module):
    """y = x @ weight.T + bias, weight (out_features, in_features), PyTorch's default init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(rng("cpu").standard_normal((num_embeddings, embedding_dim), dtype=DEFAULT_DTYPE))

    def forward(self, idx):
        return F.embedding(idx, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        super().__init__()
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = ns, eps
        self.weight = Parameter(np.ones(ns, DEFAULT_DTYPE)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(ns, DEFAULT_DTYPE)) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class Dropout(Module):
    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Sequential(ModuleList):
    def forward(self, x):
        for m in self:
            x = m(x)
        return x

    def __init__(self, *modules):
        super().__init__(modules)
