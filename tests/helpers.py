"""The one test helper (`check_op`) and the hypothesis strategies the op tests draw from.

`check_op` runs a tensorgrad function on float64 tensors, compares the forward with a
plain NumPy formula, and checks every float input's gradient with `tg.gradcheck`
(float64 central differences). A failure names the op, the input shapes and the
worst element.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorgrad as tg


def _op_name(tg_fn, name):
    if name:
        return name
    fn_name = getattr(tg_fn, "__name__", repr(tg_fn))
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("::")[-1]
    return f"{test} [{fn_name}]" if fn_name == "<lambda>" and test else fn_name


def _worst(got, want, atol, rtol):
    """Index, got and expected value of the element furthest outside the tolerance."""
    got, want = np.broadcast_arrays(np.asarray(got, np.float64), np.asarray(want, np.float64))
    same = (got == want) | (np.isnan(got) & np.isnan(want))  # inf == inf, nan "==" nan
    err = np.where(same, -np.inf, np.abs(got - want) - (atol + rtol * np.abs(want)))
    err = np.where(np.isnan(err), np.inf, err)
    k = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
    return k, got[k], want[k], float(err[k]) > 0


def assert_close(got, want, atol=1e-6, rtol=1e-6, what="value"):
    """Elementwise |got - want| <= atol + rtol·|want| (NaN matches NaN), naming the worst one."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return
    k, g, w, bad = _worst(got, want, atol, rtol)
    assert not bad, f"{what}: worst element {tuple(map(int, k))} is {g!r}, expected {w!r}"


def check_op(
    tg_fn,
    np_fn,
    *arrays,
    grad=True,
    atol=1e-7,
    rtol=1e-6,
    grad_atol=1e-5,
    grad_rtol=1e-3,
    eps=1e-6,
    name=None,
):
    """Forward of ``tg_fn`` against ``np_fn`` and backward against finite differences.

    ``arrays`` are NumPy arrays (or scalars); float ones become float64 tensors that require
    grad (when ``grad``), the others (ints, bools) plain tensors. ``np_fn`` (None to skip)
    gets the same arrays as float64 NumPy arrays. Returns the forward output.
    """
    op = _op_name(tg_fn, name)
    arrays = [np.asarray(a) for a in arrays]
    arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    shapes = ", ".join(str(a.shape) for a in arrays)
    tensors = [
        tg.tensor(a.copy(), requires_grad=grad and a.dtype.kind == "f", dtype=a.dtype)
        for a in arrays
    ]
    out = tg_fn(*tensors)
    assert isinstance(out, tg.Tensor), f"{op}: returned {type(out).__name__}, not a Tensor"
    if np_fn is not None:
        want = np.asarray(np_fn(*[a.copy() for a in arrays]))
        if want.dtype.kind == "f":
            assert out.dtype == np.float64, f"{op} on ({shapes}): dtype {out.dtype}, not float64"
        assert out.shape == want.shape, (
            f"{op} on inputs ({shapes}): output shape {out.shape}, expected {want.shape}"
        )
        if want.dtype.kind == "b":
            assert out.dtype == np.bool_, f"{op} on ({shapes}): dtype {out.dtype}, not bool"
        if out.array.size:
            k, g, w, bad = _worst(out.detach().numpy(), want, atol, rtol)
            assert not bad, (
                f"{op} on inputs ({shapes}): forward differs at {tuple(map(int, k))}: "
                f"got {g!r}, expected {w!r}"
            )
    if grad and any(t.requires_grad for t in tensors):
        try:
            tg.gradcheck(tg_fn, tensors, eps=eps, atol=grad_atol, rtol=grad_rtol)
        except tg.GradcheckError as e:
            raise AssertionError(f"{op} on inputs ({shapes}): {e}") from None
    return out


def recomputed_bytes(op: str, arrays) -> int:
    """Bytes a reference op computes again in backward instead of keeping (so that its
    backward is differentiable: it keeps only inputs, outputs and masks). A kernel, whose
    backward is not differentiated, may keep them instead: the memory tests allow that."""
    x = arrays[0]
    item = x.dtype.itemsize
    if op in ("layer_norm", "add_layer_norm"):  # x̂ and the per-row mean and 1/std
        return x.nbytes + 2 * (x.size // max(x.shape[-1], 1)) * item
    if op == "cross_entropy":  # the softmax and the per-row max and log-sum
        return x.nbytes + 2 * x.shape[0] * item
    if op == "attention":  # the (..., L, S) probabilities
        q, k = arrays[0], arrays[1]
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        return int(np.prod(batch, dtype=np.int64)) * q.shape[-2] * k.shape[-2] * item
    return 0


# ----------------------------------------------------------------------------- strategies


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=3):
    """Small shapes, size-1 dims and (with min_dims=0) 0-d included."""
    return hnp.array_shapes(
        min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    )


def broadcast_pairs(min_dims=0, max_dims=3, max_side=3):
    """Two shapes that broadcast together (size-1 and missing leading dims included)."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=2, min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side
    ).map(lambda s: s.input_shapes)


def arrays(shape, lo=-2.0, hi=2.0, min_abs=0.0):
    """float64 arrays with values in [lo, hi]; ``min_abs`` keeps them away from 0 (abs, relu, /).

    With ``min_abs`` the magnitudes lie in [min_abs, hi] with a random sign.
    """
    if min_abs > 0:
        mag = st.floats(min_abs, hi, allow_subnormal=False)
        elements = st.tuples(mag, st.booleans()).map(lambda t: t[0] if t[1] else -t[0])
    else:
        elements = st.floats(lo, hi, allow_subnormal=False)
    return hnp.arrays(np.float64, shape, elements=elements)


@st.composite
def distinct_arrays(draw, shape, gap=0.25, offset=-1.0):
    """Values spaced at least ``gap`` apart (max / sort without ties, well-conditioned var)."""
    n = int(np.prod(shape, dtype=np.int64))
    perm = draw(st.permutations(range(n)))
    jitter = draw(hnp.arrays(np.float64, (n,), elements=st.floats(0, gap / 4)))
    return (np.asarray(perm, np.float64) * gap + offset + jitter).reshape(shape)


@st.composite
def dims(draw, ndim, allow_none=True, allow_tuple=True):
    """A reduction ``dim``: None, an int (maybe negative) or a tuple of distinct dims."""
    options = []
    if allow_none:
        options.append(st.none())
    if ndim:
        options.append(st.integers(-ndim, ndim - 1))
        if allow_tuple:
            options.append(
                st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(
                    lambda ds: tuple(d - ndim if i % 2 else d for i, d in enumerate(ds))
                )
            )
    return draw(st.one_of(options)) if options else None


@st.composite
def shape_dim_keepdim(draw, min_dims=1, max_dims=3, allow_none=True, allow_tuple=True):
    """(shape, dim, keepdim) for reductions."""
    shape = draw(shapes(min_dims=min_dims, max_dims=max_dims))
    dim = draw(dims(len(shape), allow_none=allow_none, allow_tuple=allow_tuple))
    return shape, dim, draw(st.booleans())


def np_axes(dim, ndim):
    """A reduction ``dim`` as NumPy's ``axis``."""
    if dim is None:
        return None
    return tuple(d % ndim for d in ((dim,) if isinstance(dim, int) else dim))


def reduced_count(shape, dim):
    axes = np_axes(dim, len(shape))
    axes = range(len(shape)) if axes is None else axes
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))
