"""Matrix products: batched ``matmul`` with broadcasting, and the fused ``linear``."""

from __future__ import annotations

from .. import kernels
from ..autograd import Op, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import device_of, get_array_module


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


def _einsum_spec(equation: str, ndims) -> tuple:
    """(input subscripts, output subscript) with '...' spelled out as letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ndims):
        raise ValueError(f"einsum: {equation!r} names {len(ins)} operands, got {len(ndims)}")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    n_ell = max(
        (nd - len(s.replace("...", "")) for s, nd in zip(ins, ndims) if "..." in s), default=0
    )
    ell = "".join(spare[:n_ell])
    ins = [
        s.replace("...", ell[len(ell) - (nd - len(s.replace("...", ""))) :])
        for s, nd in zip(ins, ndims)
    ]
    if not arrow:  # implicit output: the letters seen once, sorted, after the ellipsis dims
        letters = "".join(ins)
        rhs = ell + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
        )
    else:
        rhs = rhs.replace("...", ell)
    for s, nd in zip(ins, ndims):
        if len(s) != nd:
            raise ValueError(f"einsum: subscript {s!r} does not match an operand with {nd} dims")
        if len(set(s)) != len(s):
            raise ValueError(f"einsum: repeated subscript in {s!r} (diagonals) is not supported")
    return ins, rhs


class Einsum(Op):
    """xp.einsum; the gradient of each operand is the einsum of g with the others."""

    def forward(self, *xs, equation):
        xp = get_array_module(*xs)
        self.ins, self.out = _einsum_spec(equation, [x.ndim for x in xs])
        self.save(*xs)
        spec = ",".join(self.ins) + "->" + self.out
        return xp.einsum(spec, *xs)

    def backward(self, g):
        xs = self.saved
        xp = xp_of(g, *xs)
        gxs = []
        for i, (x, s) in enumerate(zip(xs, self.ins)):
            if not self.needs_input_grad[i]:
                gxs.append(None)
                continue
            others = [(xs[j], self.ins[j]) for j in range(len(xs)) if j != i]
            seen = set(self.out).union(*[set(o) for _, o in others])
            kept = "".join(c for c in s if c in seen)  # letters summed in x alone broadcast back
            spec = ",".join([self.out] + [o for _, o in others]) + "->" + kept
            gk = xp.einsum(spec, g, *[a for a, _ in others])
            shape = [x.shape[k] if c in seen else 1 for k, c in enumerate(s)]
            gk = xp.broadcast_to(xp.reshape(gk, shape), x.shape)
            gxs.append(gk if gk.dtype == x.dtype else gk.astype(x.dtype))
        return tuple(gxs)
