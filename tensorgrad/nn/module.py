"""The module machinery: ``Parameter``, ``Module`` (registration, traversal, state dicts,
.to(), train/eval, forward hooks) and the containers ``ModuleList`` and ``ModuleDict``.

Imports: collections, numpy, ..autograd, ..devices, ..tensor, ..types.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import numpy as np

from .. import devices
from ..autograd import RemovableHandle
from ..autograd.graph import model_epoch, note_effect
from ..autograd.graph import watch as _watch
from ..devices import get_array_module, to_device
from ..tensor import Tensor, to_args
from ..types import as_dtype, bfloat16


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
_TENSOR_TYPES["bfloat16"] = "BFloat16"


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
        if _watch.traces:  # made inside a forward that is being compiled: its own setup is
            object.__setattr__(self, "_made_in_trace", True)  # no effect on the model

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ first")
        model_epoch[0] += 1
        if _watch.traces and "_made_in_trace" not in self.__dict__:
            note_effect(f"it sets {type(self).__name__}.{name} (replay would skip the assignment)")
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
        model_epoch[0] += 1
        if _watch.traces and "_made_in_trace" not in self.__dict__:
            note_effect(f"it deletes {type(self).__name__}.{name} (replay would skip it)")
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
        model_epoch[0] += 1
        if _watch.traces and "_made_in_trace" not in self.__dict__:
            note_effect(f"it registers the buffer {type(self).__name__}.{name}")
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
        model_epoch[0] += 1
        if _watch.traces:
            note_effect(f"it registers a forward hook on {type(self).__name__}")
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
        model_epoch[0] += 1
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
            if dtype is not None and as_dtype(arr.dtype).kind == "f":
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

    def bfloat16(self):
        return self.to(bfloat16)

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
