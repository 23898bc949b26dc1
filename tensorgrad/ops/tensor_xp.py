"""NumPy's functions on Tensors, each a recorded op: what ``xp`` is in a backward run under
``create_graph=True``.

Backward code is written once, against ``xp = xp_of(g)`` and NumPy's signatures
(``xp.sum(g, axis=..., keepdims=True)``, ``xp.where(c, a, b)``, ``xp.exp(y)``): on arrays
that is NumPy (or CuPy) itself, the fast path; on Tensors it is this namespace, so the
backward builds a graph and its result can be differentiated again. Masks, indices and
shapes stay plain arrays and values: they carry no gradient.

Imports: .elementwise, .linalg, .more_math, .more_shape, .reduce, .shape, ..autograd,
..devices.
"""

from __future__ import annotations

from ..autograd import register_tensor_xp
from ..autograd.graph import constant, is_tensor
from ..devices import get_array_module
from . import elementwise as E
from . import linalg, reduce
from . import more_math as M
from . import more_shape as MS
from . import shape as S


def _data(a):
    return a.array if is_tensor(a) else a


class TensorXP:
    """The differentiable stand-in for the array module (only the functions backward uses)."""

    # constants: no gradient flows through them
    def zeros_like(self, a):
        return constant(get_array_module(_data(a)).zeros_like(_data(a)))

    def ones_like(self, a):
        return constant(get_array_module(_data(a)).ones_like(_data(a)))

    def sign(self, a):  # its derivative is zero almost everywhere
        return constant(get_array_module(_data(a)).sign(_data(a)))

    # elementwise
    exp = staticmethod(E.Exp.apply)
    log = staticmethod(E.Log.apply)
    sqrt = staticmethod(E.Sqrt.apply)
    tanh = staticmethod(E.Tanh.apply)
    abs = staticmethod(E.Abs.apply)
    sin = staticmethod(M.Sin.apply)
    cos = staticmethod(M.Cos.apply)

    def where(self, cond, x, y):
        return E.Where.apply(_data(cond), x, y)

    def maximum(self, x, y):
        return M.Maximum.apply(x, y)

    def minimum(self, x, y):
        return M.Minimum.apply(x, y)

    # reductions
    def sum(self, a, axis=None, keepdims=False):
        return reduce.Sum.apply(a, dim=axis, keepdim=keepdims)

    def mean(self, a, axis=None, keepdims=False):
        return reduce.Mean.apply(a, dim=axis, keepdim=keepdims)

    def cumsum(self, a, axis):
        return M.Cumsum.apply(a, axis)

    # shapes
    def reshape(self, a, shape):
        return S.Reshape.apply(a, tuple(shape) if not isinstance(shape, int) else (shape,))

    def transpose(self, a, axes):
        return S.Permute.apply(a, tuple(axes))

    def swapaxes(self, a, i, j):
        axes = list(range(a.ndim))
        axes[i], axes[j] = axes[j], axes[i]
        return S.Permute.apply(a, tuple(axes))

    def moveaxis(self, a, src, dst):
        axes = [d for d in range(a.ndim) if d != src % a.ndim]
        axes.insert(dst % a.ndim, src % a.ndim)
        return S.Permute.apply(a, tuple(axes))

    def broadcast_to(self, a, shape):
        return S.Expand.apply(a, tuple(shape))

    def flip(self, a, axis):
        for ax in axis if isinstance(axis, (tuple, list)) else (axis,):
            a = S.GetItem.apply(a, (slice(None),) * (ax % a.ndim) + (slice(None, None, -1),))
        return a

    def roll(self, a, shift, axis=None):
        return MS.Roll.apply(a, shifts=shift, dims=axis)

    def concatenate(self, xs, axis=0):
        return S.Cat.apply(*xs, dim=axis)

    def stack(self, xs, axis=0):
        return S.Stack.apply(*xs, dim=axis)

    def split(self, a, cuts, axis=0):
        bounds = [0, *cuts, a.shape[axis]]
        return list(S.Split.apply(a, [b - c for c, b in zip(bounds, bounds[1:])], axis))

    def take_along_axis(self, a, index, axis):
        return MS.Gather.apply(a, _data(index), axis)

    def pad(self, a, widths):
        flat = [int(v) for pair in reversed(list(widths)) for v in pair]
        return MS.Pad.apply(a, flat)

    # products
    def matmul(self, x, y):
        return linalg.MatMul.apply(x, y)

    def einsum(self, spec, *xs):
        return M.Einsum.apply(*xs, equation=spec)


register_tensor_xp(TensorXP())
