"""Shape ops: reshape, transpose/permute, expand, contiguous, indexing (and its adjoint
``add_at``), cat/stack, split, clone. (flip, roll, gather, scatter_add, pad and the in-place
view ops are in ``more_shape.py``.)

Imports: .dims, ..autograd, ..devices.
"""

from __future__ import annotations

from ..autograd import Op, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import get_array_module
from .dims import wrap_dim


def resolve_shape(shape, size: int, old_shape) -> tuple:
    """Fill in one -1 and check the element count, naming both shapes on failure."""
    shape = tuple(map(int, shape))
    if shape.count(-1) > 1:
        raise ValueError(f"view: only one dimension can be -1, got {shape}")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise ValueError(f"view: invalid size {s} in {shape}")
            known *= s
    if -1 in shape:
        if known == 0 or size % known:
            raise ValueError(
                f"view: shape {shape} is invalid for input of shape {tuple(old_shape)}"
            )
        shape = tuple(size // known if s == -1 else s for s in shape)
    elif known != size:
        raise ValueError(f"view: shape {shape} is invalid for input of shape {tuple(old_shape)}")
    return shape


class Reshape(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x, shape):
        self.shape = x.shape
        return x.reshape(resolve_shape(shape, x.size, x.shape))

    def backward(self, g):
        return xp_of(g).reshape(g, self.shape), None


class Permute(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x, dims):
        if len(dims) != x.ndim:
            raise ValueError(
                f"permute: {tuple(dims)} has {len(dims)} dims for a {x.ndim}-d tensor of shape "
                f"{tuple(x.shape)}"
            )
        self.dims = tuple(wrap_dim("permute", d, x.ndim) for d in dims)
        if sorted(self.dims) != list(range(x.ndim)):
            raise ValueError(f"permute: {tuple(dims)} is not a permutation of {x.ndim} dims")
        return x.transpose(self.dims)

    def backward(self, g):
        inv = [0] * len(self.dims)
        for i, d in enumerate(self.dims):
            inv[d] = i
        return xp_of(g).transpose(g, inv), None


class Expand(Op):
    def forward(self, x, shape):
        xp = get_array_module(x)
        self.shape = x.shape
        lead = len(shape) - x.ndim
        if lead < 0:
            raise ValueError(f"expand: cannot expand shape {tuple(x.shape)} to {tuple(shape)}")
        full = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
        try:
            return xp.broadcast_to(x, full)
        except ValueError:
            raise ValueError(
                f"expand: cannot expand shape {tuple(x.shape)} to {tuple(shape)}"
            ) from None

    def backward(self, g):
        return unbroadcast(g, self.shape), None


class Contiguous(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x):
        return get_array_module(x).ascontiguousarray(x)

    def backward(self, g):
        return g


def _has_int_array(key) -> bool:
    """True when the key holds an integer array (indices may repeat, so backward must add)."""
    items = key if isinstance(key, tuple) else (key,)
    return any(getattr(k, "dtype", None) is not None and k.dtype.kind in "iu" for k in items)


def _check_bounds(x, key):
    """IndexError naming the dim for out-of-range integers (NumPy also raises, less clearly)."""
    items = key if isinstance(key, tuple) else (key,)
    dim = 0
    for pos, k in enumerate(items):
        if k is None:
            continue
        if k is Ellipsis:
            # the ellipsis covers every dim not consumed by the items after it
            rest = items[pos + 1 :]
            dim = x.ndim - sum(
                getattr(i, "ndim", 1)
                if getattr(getattr(i, "dtype", None), "kind", "") == "b"
                else 1
                for i in rest
                if i is not None
            )
            continue
        if isinstance(k, int):
            if dim >= x.ndim or not -x.shape[dim] <= k < x.shape[dim]:
                size = x.shape[dim] if dim < x.ndim else 0
                raise IndexError(f"index {k} is out of range for dim {dim} with size {size}")
        elif not isinstance(k, slice) and getattr(k, "dtype", None) is not None:
            if k.dtype.kind in "iu" and k.size:
                size = x.shape[dim] if dim < x.ndim else 0
                lo, hi = int(k.min()), int(k.max())
                if lo < -size or hi >= size:
                    bad = hi if hi >= size else lo
                    raise IndexError(f"index {bad} is out of range for dim {dim} with size {size}")
            elif k.dtype.kind == "b":
                dim += k.ndim - 1
        dim += 1


def _own_key(key):
    def own(k):
        return k.copy() if getattr(k, "ndim", 0) else k

    return tuple(own(k) for k in key) if isinstance(key, tuple) else own(key)


class GetItem(Op):
    """x[key]; the backward of integer-array indexing accumulates repeated indices."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x, key):
        _check_bounds(x, key)
        # index arrays are small: a recorded op keeps copies, so that a later change to them
        # cannot misroute the gradient (an unrecorded one is dropped after its forward)
        recorded = True in self.needs_input_grad
        self.shape, self.dtype, self.key = x.shape, x.dtype, _own_key(key) if recorded else key
        return x[key]

    def backward(self, g):
        return add_at(self.shape, self.key, g), None


def add_at(shape, key, g):
    """Zeros of ``shape`` with g added at ``key`` (repeated indices add up): the adjoint of
    ``x[key]``; recorded (``IndexAdd``) when g is a Tensor."""
    if is_tensor(g):
        return IndexAdd.apply(g, shape, key)
    xp = get_array_module(g)
    gx = xp.zeros(shape, dtype=g.dtype)
    if _has_int_array(key):
        xp.add.at(gx, key, g)
    else:
        gx[key] = g
    return gx


class IndexAdd(Op):
    """``add_at`` as an op, for gradients of gradients;  its own gradient is g[key]."""

    def forward(self, g, shape, key):
        self.key = key
        return add_at(shape, key, g)

    def backward(self, gg):
        return GetItem.apply(gg, self.key) if is_tensor(gg) else gg[self.key], None, None


class Cat(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, *xs, dim=0):
        xp = get_array_module(*xs)
        nd = xs[0].ndim
        if nd == 0:
            raise ValueError("cat: zero-dimensional tensors cannot be concatenated")
        self.dim = wrap_dim("cat", dim, nd)
        for x in xs:
            if x.ndim != nd or any(
                a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape)) if i != self.dim
            ):
                raise ValueError(
                    f"cat: shapes {[tuple(t.shape) for t in xs]} differ outside dim {dim}"
                )
        self.sizes = [x.shape[self.dim] for x in xs]
        return xp.concatenate(xs, axis=self.dim)

    def backward(self, g):
        cuts = []
        acc = 0
        for s in self.sizes[:-1]:
            acc += s
            cuts.append(acc)
        return tuple(xp_of(g).split(g, cuts, axis=self.dim))


class Stack(Op):
    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, *xs, dim=0):
        xp = get_array_module(*xs)
        if any(x.shape != xs[0].shape for x in xs):
            raise ValueError(f"stack: all shapes must be equal, got {[tuple(x.shape) for x in xs]}")
        self.dim = wrap_dim("stack", dim, xs[0].ndim + 1)
        return xp.stack(xs, axis=self.dim)

    def backward(self, g):
        return tuple(xp_of(g).moveaxis(g, self.dim, 0))


class Split(Op):
    """Cut x along ``dim`` into pieces of the given sizes; outputs are views."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    multi_output = True

    def forward(self, x, sizes, dim):
        self.dim, self.shape = dim, x.shape
        cuts, acc = [], 0
        for s in sizes[:-1]:
            acc += s
            cuts.append(acc)
        self.cuts = cuts
        xp = get_array_module(x)
        return tuple(xp.split(x, cuts, axis=dim))

    def backward(self, *gs):
        return xp_of(*gs).concatenate(gs, axis=self.dim), None, None


class Clone(Op):
    """A copy in new memory (x.clone())."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, x):
        return x.copy()

    def backward(self, g):
        return g
