"""Modules: parameter registration, state dicts, and the layers a GPT is made of."""

from __future__ import annotations

import math
from collections import OrderedDict, namedtuple

import numpy as np

from .. import devices
from ..autograd import RemovableHandle
from ..devices import get_array_module, rng, to_device
from ..tensor import DEFAULT_DTYPE, Tensor, to_args
from . import functional as F


class Parameter(Tensor):
    """A leaf tensor that a Module registers as learnable (requires_grad=True)."""

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        if isinstance(data, Tensor):
            super().__init__(data.array, requires_grad=requires_grad)
        elif devices.default_device != "cpu" and type(data) is np.ndarray:
            # a layer's initial host array goes where tensors go by default (set_default_device)
            super().__init__(data, requires_grad=requires_grad, device=devices.default_device)
        else:  # an array already on a device stays there, as nn.Parameter(t) in PyTorch
            super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


_TENSOR_TYPES = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long"}
_TENSOR_TYPES.update(int32="Int", int16="Short", int8="Char", uint8="Byte", bool="Bool")


def _type_name(value) -> str:
    """PyTorch's name for the type of ``value`` in its messages (torch.FloatTensor, int)."""
    if isinstance(value, Tensor):
        return f"torch.{_TENSOR_TYPES.get(value.dtype.name, '')}Tensor"
    return type(value).__name__


class IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What load_state_dict(strict=False) did not match: ``missing_keys``, ``unexpected_keys``."""


class Module:
    """Base class: assigning a Parameter or Module attribute registers it by name."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ first")
        if (
            name in self._buffers
            and (value is None or isinstance(value, Tensor))
            and not isinstance(value, Parameter)
        ):
            self._buffers[name] = value  # self.mask = new_tensor replaces the buffer
            object.__setattr__(self, name, value)
            return
        if name in self._parameters and not (value is None or isinstance(value, Parameter)):
            raise TypeError(
                f"cannot assign '{_type_name(value)}' as parameter '{name}' "
                "(torch.nn.Parameter or None expected)"
            )
        if name in self._parameters and value is None:
            self._parameters[name] = None  # stays registered, as PyTorch (bias=None)
            object.__setattr__(self, name, value)
            return
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """A tensor that belongs to the module but is not learned (a causal mask, running
        statistics): it moves with .to(), and is in state_dict() when ``persistent``."""
        if "_buffers" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ first")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}"
            )
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"register_buffer: attribute {name!r} already exists")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name: str, param) -> None:
        setattr(self, name, param)

    def register_module(self, name: str, module) -> None:
        setattr(self, name, module)

    add_module = register_module

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        for hook in list(self.__dict__.get("_forward_pre_hooks", ())):
            new = hook(self, args)
            if new is not None:
                args = new if isinstance(new, tuple) else (new,)
        out = self.forward(*args, **kwargs)
        for hook in list(self.__dict__.get("_forward_hooks", ())):
            new = hook(self, args, out)
            if new is not None:
                out = new
        return out

    def register_forward_pre_hook(self, hook) -> RemovableHandle:
        """Call ``hook(module, args)`` before each forward; a returned value (a tuple, or a
        single input) replaces the positional inputs. ``.remove()`` on the handle undoes it."""
        return self._add_hook("_forward_pre_hooks", hook)

    def register_forward_hook(self, hook) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after each forward; a returned value replaces
        the output (what interpretability code uses to read or patch an activation)."""
        return self._add_hook("_forward_hooks", hook)

    def has_forward_hooks(self) -> bool:
        """Whether forward hooks or pre-hooks are registered on this module (not its children)."""
        return bool(self.__dict__.get("_forward_pre_hooks") or self.__dict__.get("_forward_hooks"))

    def _add_hook(self, kind: str, hook) -> RemovableHandle:
        hooks = self.__dict__.get(kind)
        if hooks is None:
            hooks = []
            object.__setattr__(self, kind, hooks)
        hooks.append(hook)
        return RemovableHandle(hooks, hook)

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

    def named_children(self):
        """(name, module) of the direct submodules, in registration order."""
        seen = set()
        for n, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield n, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def apply(self, fn):
        """Call ``fn`` on every submodule (children first) and then on self; returns self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def named_buffers(self, prefix: str = "", remove_duplicate: bool = True):
        seen = set()
        for mname, m in self._walk(prefix):
            for n, b in m._buffers.items():
                if b is None or (remove_duplicate and id(b) in seen):
                    continue
                seen.add(id(b))
                yield (f"{mname}.{n}" if mname else n), b

    def buffers(self):
        for _, b in self.named_buffers():
            yield b

    def get_submodule(self, target: str):
        m = self
        for part in target.split(".") if target else ():
            m = m._modules[part]
        return m

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True):
        """(dotted name, Parameter) pairs; a shared Parameter is listed once, by its first name."""
        seen = set()
        for mname, m in self._walk(prefix):
            for n, p in m._parameters.items():
                if p is None or (remove_duplicate and id(p) in seen):
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
    def _persistent_buffers(self):
        for mname, m in self._walk():
            for n, b in m._buffers.items():
                if b is not None and n not in m._non_persistent:
                    yield (f"{mname}.{n}" if mname else n), b

    def state_dict(self) -> OrderedDict[str, Tensor]:
        """name -> Tensor (detached, sharing the parameter's memory) for every parameter and
        persistent buffer; a shared Parameter appears under each of its names."""
        views: dict = {}  # a tied Parameter gives the same Tensor under each name

        def view(t):
            return views.setdefault(id(t), t.detach())

        sd = OrderedDict((n, view(t)) for n, t in self._state_items())
        for n, p in self.named_parameters(remove_duplicate=False):  # names a subclass adds
            if n not in sd:
                sd[n] = view(p)
        return sd

    def _state_items(self):
        """(name, tensor) of every parameter and persistent buffer: each module's own
        parameters, then its own buffers, then its children's, as PyTorch orders them."""
        for mname, m in self._walk():
            pre = f"{mname}." if mname else ""
            for n, p in m._parameters.items():
                if p is not None:
                    yield pre + n, p
            for n, b in m._buffers.items():
                if b is not None and n not in m._non_persistent:
                    yield pre + n, b

    def load_state_dict(self, state: dict, strict: bool = True):
        """Copy arrays (or Tensors) into the parameters and persistent buffers, checking names
        and shapes first.

        Raises KeyError listing missing/unexpected names (when strict) and ValueError
        listing shape mismatches; nothing is modified unless every check passes.
        Returns (missing_keys, unexpected_keys), a named tuple as PyTorch's.
        """
        own = OrderedDict(self._state_items())
        own.update(self.named_parameters(remove_duplicate=False))
        missing = [n for n in own if n not in state]
        unexpected = [n for n in state if n not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        bad = [
            f"{n}: checkpoint {tuple(np.shape(v))} vs model {tuple(p.shape)}"
            for n, v in state.items()
            if n in own and tuple(np.shape(v)) != (p := own[n]).shape
        ]
        if bad:
            raise ValueError("load_state_dict: shape mismatch for " + "; ".join(bad))
        for n, v in state.items():
            if n in own:
                p = own[n]
                arr = to_device(v.array if isinstance(v, Tensor) else v, p.device)
                dst = p.array
                if dst.flags.c_contiguous and dst.flags.writeable:  # in place, as PyTorch's
                    get_array_module(dst).copyto(dst, arr, casting="unsafe")  # copy_: views see it
                else:  # a contiguous copy: the optimizer updates parameters in place
                    p.array = get_array_module(arr).array(arr, dtype=p.dtype, order="C", copy=True)
                p._version[0] += 1
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True):
        """Forget the gradients (the default) or, with set_to_none=False, fill them with zeros."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.array = get_array_module(p.grad.array).zeros_like(p.grad.array)

    def requires_grad_(self, requires_grad: bool = True):
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def to(self, *args, **kwargs):
        """Move and/or cast every parameter and buffer in place, as PyTorch's forms: to(device),
        to(dtype), to(device, dtype), to(tensor). A dtype casts floating-point ones only.
        Returns self."""
        device, dtype = to_args(args, kwargs)
        tensors = list(self.parameters()) + list(self.buffers())
        for t in tensors:
            arr = t.array
            if device is not None:
                arr = to_device(arr, device)
            if dtype is not None and arr.dtype.kind == "f":
                arr = arr.astype(dtype)
            if arr is not t.array:
                t.array = arr
                t._version[0] += 1
                if isinstance(t, Parameter):
                    t.grad = None
        return self

    def cuda(self, device=None):
        return self.to("cuda")

    def cpu(self):
        return self.to("cpu")

    def float(self):
        return self.to(np.float32)

    def double(self):
        return self.to(np.float64)

    def half(self):
        return self.to(np.float16)

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
    """Rows of ``weight`` (num_embeddings, embedding_dim), N(0, 1) at init; the row at
    ``padding_idx`` starts at zero and gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        w = rng("cpu").standard_normal((num_embeddings, embedding_dim), dtype=DEFAULT_DTYPE)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = ns, eps
        self.weight = Parameter(np.ones(ns, DEFAULT_DTYPE)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(ns, DEFAULT_DTYPE)) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        affine = self.weight is not None
        bias = f", bias={self.bias is not None}" if affine else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={affine}{bias}"


class BatchNorm1d(Module):
    """F.batch_norm over (N, C) or (N, C, L): batch statistics while training (the running
    ones updated), running statistics in eval(). ``momentum=None``: the running statistics
    are the plain average over the batches seen."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        bias: bool = True,
    ):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        c = (num_features,)
        self.weight = Parameter(np.ones(c, DEFAULT_DTYPE)) if affine else None
        self.bias = Parameter(np.zeros(c, DEFAULT_DTYPE)) if affine and bias else None
        stats = {
            "running_mean": np.zeros(c, DEFAULT_DTYPE),
            "running_var": np.ones(c, DEFAULT_DTYPE),
        }
        stats["num_batches_tracked"] = np.array(0, np.int64)
        for name, a in stats.items():
            buf = Tensor(a, device=devices.default_device) if track_running_stats else None
            self.register_buffer(name, buf)

    def forward(self, x):
        if x.ndim not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {x.ndim}D input)")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # the cumulative average
                momentum = 1.0 / self.num_batches_tracked.item()
        batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(
            x,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            batch_stats,
            momentum,
            self.eps,
        )

    def extra_repr(self):
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class Flatten(Module):
    """x.flatten(start_dim, end_dim): by default everything but the batch dim."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """x.unflatten(dim, unflattened_size): one dim split into several."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p, self.inplace = p, inplace  # inplace is accepted; the result is a new tensor

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Sequential(ModuleList):
    """Modules applied in order; ``Sequential(OrderedDict(name=module))`` names them, and a
    slice is a Sequential of the same modules."""

    def __init__(self, *modules):
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            Module.__init__(self)
            for name, m in modules[0].items():
                setattr(self, name, m)
        else:
            super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(OrderedDict(list(self._modules.items())[i]))
        return super().__getitem__(i)


class Identity(Module):
    def forward(self, x):
        return x


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class CrossEntropyLoss(Module):
    """F.cross_entropy as a module: logits (N, C) or (N, C, d1, ...) against class ids."""

    def __init__(
        self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0
    ):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, logits, target):
        return F.cross_entropy(
            logits,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, x, target):
        return F.mse_loss(x, target, reduction=self.reduction)
