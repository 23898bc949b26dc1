"""The shape and indexing ops beyond the GPT's: flip, roll, gather, scatter_add, constant
pad, and the two ops of an in-place write through a view (``WriteView``, ``ReadView``; applied
by ``tensor_inplace.py``). Each is one reference ``Op`` with its backward, as in the core files.

Imports: .dims, .shape, ..autograd, ..devices.
"""

from __future__ import annotations

from ..autograd import Op, unbroadcast, xp_of
from ..autograd.graph import is_tensor
from ..devices import get_array_module
from .dims import wrap_dim
from .shape import add_at


def _array(a):
    return a.array if is_tensor(a) else a


class Flip(Op):
    def forward(self, x, dims):
        self.dims = dims
        return get_array_module(x).flip(x, dims).copy()

    def backward(self, g):
        return xp_of(g).flip(g, self.dims), None


class Roll(Op):
    """Elements shifted ``shifts`` places along ``dims``, wrapping around (dims None: along the
    flattened array, the shape kept); the gradient is g shifted back."""

    def forward(self, x, shifts, dims):
        self.shifts, self.dims = shifts, dims
        return get_array_module(x).roll(x, shifts, dims)

    def backward(self, g):
        back = tuple(-s for s in self.shifts) if self.dims is not None else -self.shifts
        return xp_of(g).roll(g, back, self.dims)


def roll(x, shifts, dims=None):
    """torch.roll: ``shifts`` and ``dims`` ints or tuples of equal length; dims None rolls the
    flattened tensor (one shift) and keeps its shape."""
    shifts = tuple(int(s) for s in shifts) if isinstance(shifts, (tuple, list)) else (int(shifts),)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(
                f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims: 0"
            )
        return Roll.apply(x, shifts=shifts[0], dims=None)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims):
        raise RuntimeError(
            f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims: {len(dims)}"
        )
    return Roll.apply(x, shifts=shifts, dims=tuple(wrap_dim("roll", d, x.ndim) for d in dims))


def _along(index, dim: int, xp):
    """The full index tuple that picks ``index`` along ``dim`` (and every position elsewhere),
    for ``xp.add.at`` (which, unlike put_along_axis, adds repeated indices)."""
    nd = index.ndim
    grid = [
        xp.arange(n).reshape([n if i == a else 1 for i in range(nd)])
        for a, n in enumerate(index.shape)
    ]
    grid[dim] = index
    return tuple(grid)


def _corner(index, dim: int) -> tuple:
    """The slices that cut an array down to ``index``'s extent in every dim but ``dim``
    (torch.gather / scatter_add read only that corner; NumPy would broadcast instead)."""
    d = dim % index.ndim if index.ndim else 0
    return tuple(slice(None) if a == d else slice(0, n) for a, n in enumerate(index.shape))


class Gather(Op):
    """out[i][j] = x[i][index[i][j]] along ``dim`` (torch.gather: the output has index's
    shape, which may be smaller than x's in the other dims); repeated ids add up in
    backward."""

    def forward(self, x, index, dim):
        xp = get_array_module(x)
        self.dim, self.shape = dim, x.shape
        self.save(index)
        return xp.take_along_axis(x[_corner(index, dim)], index, axis=dim)

    def backward(self, g):
        index = _array(self.saved[0])
        return add_at(self.shape, _along(index, self.dim, get_array_module(index)), g), None, None


class ScatterAdd(Op):
    """x with src added at ``index`` along ``dim`` (torch.scatter_add);  ∂src = gather(g)."""

    def forward(self, x, index, src, dim):
        xp = get_array_module(x)
        self.dim = dim
        self.save(index)
        out = x.copy()
        xp.add.at(out, _along(index, dim, xp), src[tuple(slice(0, s) for s in index.shape)])
        self.src_shape = src.shape
        return out

    def backward(self, g):
        index = _array(self.saved[0])
        picked = xp_of(g).take_along_axis(g[_corner(index, self.dim)], index, axis=self.dim)
        gsrc = add_at(self.src_shape, tuple(slice(0, s) for s in index.shape), picked)
        return g, None, gsrc, None


class Pad(Op):
    """Constant padding; ``pad`` lists (before, after) pairs from the last dim backwards, as
    torch.nn.functional.pad. Negative amounts crop."""

    def forward(self, x, pad, value=0.0):
        xp = get_array_module(x)
        if len(pad) % 2 or len(pad) // 2 > x.ndim:
            raise ValueError(f"pad: {tuple(pad)} needs pairs for at most {x.ndim} dims")
        widths = [(0, 0)] * x.ndim
        for i in range(len(pad) // 2):
            widths[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
        grow = [(max(a, 0), max(b, 0)) for a, b in widths]
        y = xp.pad(x, grow, mode="constant", constant_values=xp.asarray(value, dtype=x.dtype))
        crop = tuple(slice(-min(a, 0), y.shape[d] + min(b, 0)) for d, (a, b) in enumerate(widths))
        self.shape, self.widths = x.shape, widths
        return y[crop]

    def backward(self, g):
        # undo: pad back what was cropped (with zeros), crop what was padded
        grow = [(max(-a, 0), max(-b, 0)) for a, b in self.widths]
        g = xp_of(g).pad(g, grow)
        keep = tuple(
            slice(max(a, 0), g.shape[d] - max(b, 0)) for d, (a, b) in enumerate(self.widths)
        )
        return g[keep], None


def _arrays_only(fn: Op, g) -> None:
    if is_tensor(g):
        raise RuntimeError(
            f"{fn.name}: the backward of an in-place write through a view cannot be recorded "
            "(create_graph=True); compute out of place (y = x * 2, torch.where) instead"
        )


class WriteView(Op):
    """In-place write of v into a region of base (``base[key] = v``, ``base.view(..)[i] += 1``):
    the base after the write. ``get(a)`` reads the region from an array shaped like base,
    ``put(a, v)`` writes it. The gradient for base is g outside the region, for v the region
    of g (summed back to v's shape when v was broadcast)."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, base, v, get, put):
        put(base, v)
        self.get, self.put, self.v_shape = get, put, getattr(v, "shape", ())
        return base

    def backward(self, g):
        _arrays_only(self, g)
        xp = get_array_module(g)
        gv = unbroadcast(xp.asarray(self.get(g)), self.v_shape)
        gb = xp.array(g)  # a copy, and an array even when g is a 0-d NumPy scalar
        self.put(gb, 0)  # the old values of the region no longer reach the output
        return gb, gv


class ReadView(Op):
    """The region ``get(base)`` of base as a view (a view of a tensor rewritten in place)."""

    in_float32 = False  # moves values: bfloat16 stays bfloat16

    def forward(self, base, get):
        self.get, self.shape = get, base.shape
        return get(base)

    def backward(self, g):
        _arrays_only(self, g)
        xp = get_array_module(g)
        gb = xp.zeros(self.shape, dtype=g.dtype)
        region = self.get(gb)
        if not xp.may_share_memory(region, gb):
            raise RuntimeError(
                "backward through a view rewritten in place: the view's region "
                "could not be located in its base; use out-of-place ops"
            )
        region[...] = g
        return gb
