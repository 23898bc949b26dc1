"""``torch.<op>(x, ...)`` at module level: each is the Tensor method of the same name.

``tg.tanh(x)`` is ``x.tanh()``, ``tg.topk(x, k)`` is ``x.topk(k)`` and so on; a non-Tensor
first argument (a list, an array, a number) becomes a tensor first. ``einsum`` and ``bmm``
live here alone.

Imports: .ops, .tensor.
"""

from __future__ import annotations

from .ops.more_math import Einsum
from .tensor import Tensor

_METHODS = (
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "relu",
    "square",
    "pow",
    "clamp",
    "clip",
    "maximum",
    "minimum",
    "matmul",
    "softmax",
    "log_softmax",
    "sum",
    "mean",
    "var",
    "std",
    "norm",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "cumsum",
    "topk",
    "sort",
    "argsort",
    "gather",
    "scatter_add",
    "index_select",
    "masked_fill",
    "transpose",
    "permute",
    "reshape",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "movedim",
    "split",
    "chunk",
    "unbind",
    "numel",
    "isnan",
    "isinf",
    "isfinite",
    "all",
    "any",
    "logical_not",
    "add",
    "sub",
    "mul",
    "div",
    "floor_divide",
    "clone",
    "t",
    "sin",
    "cos",
    "sign",
    "floor",
    "ceil",
    "round",
    "flip",
    "roll",
    "log10",
    "log2",
    "histogram",
    "prod",
    "logsumexp",
    "logical_and",
    "logical_or",
    "logical_xor",
    "count_nonzero",
    "allclose",
    "equal",
    "nan_to_num",
    "unique",
    "mm",
    "dot",
    "outer",
    "nonzero",
    "scatter",
    "index_add",
)


def _method(name: str):
    def fn(x, *args, **kwargs):
        t = x if isinstance(x, Tensor) else Tensor(x)
        return getattr(t, name)(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``tg.{name}(x, ...)`` is ``x.{name}(...)``."
    return fn


for _name in _METHODS:
    globals()[_name] = _method(_name)
del _name

swapaxes = globals()["transpose"]
multiply, divide = globals()["mul"], globals()["div"]


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation (``'bij,bjk->bik'``, ``'...'`` allowed; no repeated subscript within
    one operand); the gradient of each operand is the einsum of g with the others."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ts = [t if isinstance(t, Tensor) else Tensor(t) for t in operands]
    return Einsum.apply(*ts, equation=equation)


def bmm(x: Tensor, y: Tensor) -> Tensor:
    """Batched matrix product of (B, n, m) and (B, m, p)."""
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0]:
        raise RuntimeError(
            f"bmm: expected (B, n, m) and (B, m, p), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    return x @ y


__all__ = list(_METHODS) + ["swapaxes", "multiply", "divide", "einsum", "bmm"]
