"""Matrix products: batched ``matmul`` with broadcasting, and the fused ``linear``. (einsum is
in ``more_math.py``.)

Imports: ..autograd, ..devices, ..kernels.
"""

from __future__ import annotations

from .. import kernels
from ..autograd import Op, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import device_of


def matmul(x, y):
    """x @ y on arrays, or a registered 'matmul' kernel (cuBLAS in TF32/BF16 mode on the GPU);
    recorded (``MatMul``) on Tensors."""
    if is_tensor(x) or is_tensor(y):
        return MatMul.apply(x, y)
    fast = kernels.pick("matmul", device_of(x), x, y)
    return fast(x, y) if fast is not None else x @ y


def _mT(a):
    return xp_of(a).swapaxes(a, -1, -2)


class MatMul(Op):
    """x @ y with NumPy's batched broadcasting; 1-D operands act as in NumPy."""

    def forward(self, x, y):
        if x.ndim == 0 or y.ndim == 0:
            raise ValueError("matmul: both operands need at least one dimension")
        if x.shape[-1] != y.shape[-2 if y.ndim > 1 else 0]:
            raise ValueError(
                f"matmul: shapes {tuple(x.shape)} and {tuple(y.shape)} are not aligned "
                f"({x.shape[-1]} != {y.shape[-2 if y.ndim > 1 else 0]})"
            )
        try:
            out = matmul(x, y)
        except ValueError:
            raise ValueError(
                f"matmul: batch shapes of {tuple(x.shape)} and {tuple(y.shape)} cannot be "
                "broadcast together"
            ) from None
        self.save(x, y)
        return out

    def backward(self, g):
        x, y = self.saved
        x2 = x[None, :] if x.ndim == 1 else x
        y2 = y[:, None] if y.ndim == 1 else y
        if y.ndim == 1:
            g = g[..., None]
        if x.ndim == 1:
            g = g[..., None, :]  # after y's axis, so a 0-d g (vector @ vector) works too
        xp = xp_of(g, x, y)
        gx = matmul(g, _mT(y2))
        gy = matmul(_mT(x2), g)
        if x.ndim == 1:
            gx = xp.reshape(gx, tuple(gx.shape[:-2]) + (gx.shape[-1],))
        if y.ndim == 1:
            gy = xp.reshape(gy, tuple(gy.shape[:-2]) + (gy.shape[-2],))
        return unbroadcast(gx, x.shape), unbroadcast(gy, y.shape)


class Linear(Op):
    """y = x @ W.T + b as one 2-D GEMM over all leading rows; W is (out, in)."""

    def forward(self, x, w, b=None):
        if x.shape[-1] != w.shape[1]:
            raise ValueError(
                f"linear: input of shape {tuple(x.shape)} does not match weight of shape "
                f"{tuple(w.shape)} (in_features = {w.shape[1]})"
            )
        x2 = x.reshape(-1, x.shape[-1])
        y = matmul(x2, w.T)
        if b is not None:
            y += b
        self.save(x, w)
        self.has_b = b is not None
        self.lead = x.shape[:-1]
        return y.reshape(*self.lead, w.shape[0])

    def backward(self, g):
        x, w = self.saved
        xp = xp_of(g, x, w)
        x2 = xp.reshape(x, (-1, x.shape[-1]))
        g2 = xp.reshape(g, (-1, g.shape[-1]))
        gx = xp.reshape(matmul(g2, w), (*self.lead, w.shape[1]))
        gw = matmul(_mT(g2), x2)
        gb = xp.sum(g2, axis=0) if self.has_b else None
        return gx, gw, gb
