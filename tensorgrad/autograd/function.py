"""``tensorgrad.autograd.Function``: an op with your own backward, written on Tensors.

    class Cube(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x * x

    y = Cube.apply(x)

``forward`` runs without recording; ``backward`` gets one gradient per output and returns
one per ``forward`` argument (None for non-tensors and inputs that need none), each of its
input's shape and dtype (the same contract, and errors, as the built-in ops). Written with
tensor ops, the backward is itself differentiable (``create_graph=True``).

Imports: .graph.
"""

from __future__ import annotations

from .graph import (
    Op,
    apply_hooks,
    check_versions,
    constant,
    enable_grad,
    is_grad_enabled,
    is_tensor,
    no_grad,
)


class FunctionCtx:
    """The ``ctx`` of forward and backward: ``save_for_backward``, ``saved_tensors``,
    ``needs_input_grad``, ``mark_non_differentiable``; any other attribute is yours."""

    def __init__(self, needs_input_grad: tuple):
        self.needs_input_grad = needs_input_grad
        self._saved = ()
        self._nondiff = ()
        self._node = None

    def save_for_backward(self, *tensors) -> None:
        for t in tensors:
            if t is not None and not is_tensor(t):
                raise TypeError(
                    f"save_for_backward takes tensors (or None), got {type(t).__name__}; "
                    "keep other values as attributes of ctx"
                )
        self._saved = tuple((t, t._version[0]) if t is not None else None for t in tensors)

    @property
    def saved_tensors(self) -> tuple:
        """The saved tensors; raises if one was modified in place since it was saved."""
        node = self._node
        if node is not None:
            if node.released:
                raise RuntimeError(
                    "saved_tensors: the graph was freed by a backward; pass retain_graph=True "
                    "to it to backward again"
                )
            check_versions(node, [(t._version, v, t.shape) for t, v in filter(None, self._saved)])
        return tuple(None if s is None else node_view(node, s[0]) for s in self._saved)

    def mark_non_differentiable(self, *outputs) -> None:
        self._nondiff = tuple(id(o) for o in outputs)


def node_view(node, t):
    """A saved output is handed back as the graph's output tensor (so a differentiable
    backward sees it depend on the inputs); anything else as saved."""
    if node is not None:
        for j, o in enumerate(node.raw_outputs):
            if o is t and node.out_meta[j][1].kind == "f" and id(o) not in node.ctx._nondiff:
                return type(t)._make(t.array, node, j)
    return t


class Function:
    """Subclass with ``@staticmethod forward(ctx, *args)`` and ``backward(ctx, *grads)``,
    then call ``YourFunction.apply(*args)``."""

    @staticmethod
    def forward(ctx, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError("a Function subclass defines forward(ctx, *args)")

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - abstract
        raise NotImplementedError("a Function subclass defines backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args, **kwargs):
        needs = tuple(is_tensor(a) and a.requires_grad for a in args)
        ctx = FunctionCtx(needs)
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        for j, o in enumerate(outs):
            if not is_tensor(o):
                raise TypeError(
                    f"{cls.__name__}.forward returned {type(o).__name__} as output {j}; "
                    "return tensors"
                )
        if apply_hooks:  # (record_ops, a trace): a user's Function is opaque, told so (fn None)
            for hook in apply_hooks:
                hook(cls, None, args, kwargs, outs)
        if not (is_grad_enabled() and any(needs)):
            return out
        node = _CustomNode()
        node.fn_cls, node.ctx, node.reference = cls, ctx, None
        node.needs_input_grad = needs
        results = [_output(node, j, o, ctx) for j, o in enumerate(outs)]
        node.attach(args, results)
        node.raw_outputs = outs  # forward's own tensors, outside the graph: no cycle
        ctx._node = node
        return tuple(results) if isinstance(out, tuple) else results[0]


def _output(node, j: int, o, ctx):
    if id(o) in ctx._nondiff or o.dtype.kind != "f":
        return constant(o.array)
    r = type(o)._make(o.array, node, j)
    r._version = o._version  # an in-place change to either is seen by saved_tensors
    return r


class _CustomNode(Op):
    """The graph node of one ``Function.apply``: runs the user's backward on Tensors."""

    none_is_no_gradient = True  # PyTorch: a Function's backward may return None for an input

    @property
    def name(self) -> str:
        return self.fn_cls.__name__

    def backward(self, *gys):
        recording = is_tensor(gys[0])  # the walk hands Tensors under create_graph
        gts = gys if recording else tuple(constant(g) for g in gys)
        with enable_grad() if recording else no_grad():
            gxs = self.fn_cls.backward(self.ctx, *gts)
        gxs = gxs if isinstance(gxs, tuple) else (gxs,)
        out = []
        for i, gx in enumerate(gxs):
            if gx is not None and not is_tensor(gx):
                raise RuntimeError(
                    f"{self.name}.backward returned {type(gx).__name__} for input {i}; "
                    "return a Tensor or None"
                )
            if gx is not None and i < len(self.in_meta) and self.in_meta[i] is None:
                gx = None  # a gradient for an input that needs none is dropped, as in PyTorch
            out.append(gx if gx is None or recording else gx.array)
        return tuple(out)
