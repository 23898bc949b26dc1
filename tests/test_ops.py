"""Every op: forward against a NumPy formula, backward against float64 finite differences."""

import math

import numpy as np
import pytest
from helpers import (
    arrays,
    assert_close,
    broadcast_pairs,
    check_op,
    distinct_arrays,
    np_axes,
    reduced_count,
    shape_dim_keepdim,
    shapes,
)
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorgrad as tg
import tensorgrad.nn.functional as F

rs = np.random.default_rng(0)


def randn(*shape):
    return rs.standard_normal(shape)


# ----------------------------------------------------------------------------- elementwise

BINARY = {
    "add": (lambda x, y: x + y, np.add),
    "sub": (lambda x, y: x - y, np.subtract),
    "mul": (lambda x, y: x * y, np.multiply),
    "div": (lambda x, y: x / y, np.divide),
    "add()": (lambda x, y: x.add(y), np.add),
    "mul()": (lambda x, y: x.mul(y), np.multiply),
}


@pytest.mark.parametrize("op", BINARY)
@given(data=st.data(), shapes2=broadcast_pairs())
def test_binary_broadcast(op, data, shapes2):
    sx, sy = shapes2
    x = data.draw(arrays(sx))
    y = data.draw(arrays(sy, hi=2.0, min_abs=0.5 if op == "div" else 0.0))
    check_op(*BINARY[op], x, y, name=f"{op} {sx} {sy}")


SCALAR_FORMS = {
    "x+2": (lambda x: x + 2, lambda x: x + 2),
    "2+x": (lambda x: 2 + x, lambda x: 2 + x),
    "x-1.5": (lambda x: x - 1.5, lambda x: x - 1.5),
    "1.5-x": (lambda x: 1.5 - x, lambda x: 1.5 - x),
    "x*3": (lambda x: x * 3, lambda x: x * 3),
    "0.5*x": (lambda x: 0.5 * x, lambda x: 0.5 * x),
    "x/4": (lambda x: x / 4, lambda x: x / 4),
    "2/x": (lambda x: 2 / x, lambda x: 2 / x),
    "-x": (lambda x: -x, lambda x: -x),
    "x*np.float64": (lambda x: x * np.float64(1.5), lambda x: x * 1.5),
}


@pytest.mark.parametrize("op", SCALAR_FORMS)
@given(data=st.data(), shape=shapes())
def test_scalar_forms(op, data, shape):
    x = data.draw(arrays(shape, hi=2.0, min_abs=0.5 if "/x" in op else 0.0))
    check_op(*SCALAR_FORMS[op], x, name=f"{op} {shape}")


@pytest.mark.parametrize("p", [2, 3, -1, 0.5, -1.5, 1.0])
@given(data=st.data(), shape=shapes())
def test_pow_tensor_scalar(p, data, shape):
    # non-integer powers need a positive base; integer ones take any sign away from 0
    x = data.draw(
        arrays(shape, hi=2.0, min_abs=0.5) if isinstance(p, int) else arrays(shape, lo=0.3, hi=2.0)
    )
    check_op(lambda t: t**p, lambda a: a**p, x, name=f"x**{p} {shape}")


@pytest.mark.parametrize("base", [2.0, 0.5, math.e])
@given(data=st.data(), shape=shapes())
def test_pow_scalar_tensor(base, data, shape):
    x = data.draw(arrays(shape))
    check_op(lambda t: base**t, lambda a: base**a, x, name=f"{base}**x {shape}")


@given(data=st.data(), shapes2=broadcast_pairs())
def test_pow_tensor_tensor(data, shapes2):
    x = data.draw(arrays(shapes2[0], lo=0.3, hi=2.0))
    y = data.draw(arrays(shapes2[1], lo=-2.0, hi=2.0))
    check_op(lambda a, b: a**b, np.power, x, y, name=f"x**y {shapes2}")
    check_op(lambda a, b: a.pow(b), np.power, x, y, name=f"x.pow(y) {shapes2}")


def _sigmoid(a):
    return 1 / (1 + np.exp(-a))


UNARY = {
    "exp": (lambda x: x.exp(), np.exp, {"lo": -3.0, "hi": 3.0}),
    "log": (lambda x: x.log(), np.log, {"lo": 0.2, "hi": 3.0}),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, {"lo": 0.2, "hi": 3.0}),
    "rsqrt": (lambda x: x.rsqrt(), lambda a: 1 / np.sqrt(a), {"lo": 0.2, "hi": 3.0}),
    "tanh": (lambda x: x.tanh(), np.tanh, {"lo": -3.0, "hi": 3.0}),
    "abs": (lambda x: x.abs(), np.abs, {"hi": 3.0, "min_abs": 0.1}),
    "abs()": (lambda x: abs(x), np.abs, {"hi": 3.0, "min_abs": 0.1}),
    "relu": (lambda x: x.relu(), lambda a: np.maximum(a, 0), {"hi": 3.0, "min_abs": 0.1}),
    "F.relu": (F.relu, lambda a: np.maximum(a, 0), {"hi": 3.0, "min_abs": 0.1}),
    "sigmoid": (lambda x: x.sigmoid(), _sigmoid, {"lo": -6.0, "hi": 6.0}),
    "square": (lambda x: x.square(), np.square, {}),
    "neg": (lambda x: x.__neg__(), np.negative, {}),
}


@pytest.mark.parametrize("op", UNARY)
@given(data=st.data(), shape=shapes())
def test_unary(op, data, shape):
    tg_fn, np_fn, bounds = UNARY[op]
    check_op(tg_fn, np_fn, data.draw(arrays(shape, **bounds)), name=f"{op} {shape}")


def test_sigmoid_saturates_without_overflow():
    x = tg.tensor(np.array([-1e4, -50.0, 0.0, 50.0, 1e4]), dtype=np.float64)
    assert_close(
        x.sigmoid().detach().numpy(), [0.0, _sigmoid(-50.0), 0.5, _sigmoid(50.0), 1.0], atol=1e-300
    )


COMPARE = {
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
}


@pytest.mark.parametrize("op", COMPARE)
@given(data=st.data(), shapes2=broadcast_pairs())
def test_comparisons(op, data, shapes2):
    # small integers as floats, so that ties happen
    ints = st.integers(-2, 2).map(float)
    x = data.draw(arrays(shapes2[0]).map(np.round))
    y = data.draw(arrays(shapes2[1]).map(np.round))
    tg_fn, np_fn = COMPARE[op]
    a, b = tg.tensor(x, requires_grad=True), tg.tensor(y, requires_grad=True)
    for out, want in [(tg_fn(a, b), np_fn(x, y)), (tg_fn(a, data.draw(ints)), None)]:
        assert out.dtype == np.bool_ and not out.requires_grad, f"{op}: {out!r}"
        if want is not None:
            np.testing.assert_array_equal(out.detach().numpy(), want, err_msg=f"{op} {shapes2}")
    c = data.draw(ints)
    np.testing.assert_array_equal(
        tg_fn(a, c).detach().numpy(), np_fn(x, c), err_msg=f"{op} scalar {c}"
    )


def test_logic_ops():
    a, b = tg.tensor([True, False, True]), tg.tensor([True, True, False])
    assert (a & b).tolist() == [True, False, False]
    assert (a | b).tolist() == [True, True, True]
    assert (~a).tolist() == [False, True, False]


# ----------------------------------------------------------------------------- matmul

MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 2)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((2, 2, 3, 2), (2, 2, 2, 3)),  # (B, nh, T, hs) @ (B, nh, hs, T)
    ((2, 2, 3, 3), (2, 2, 3, 2)),  # att @ v
    ((2, 3, 4), (4, 2)),  # (B, T, C) @ (C, D)
    ((2, 1, 2, 3), (3, 3, 2)),  # batch dims broadcast both ways
    ((3,), (2, 3, 2)),
    ((2, 2, 3), (3,)),
    ((1, 3), (3, 1)),
]


@pytest.mark.parametrize("sx,sy", MATMUL_SHAPES)
def test_matmul(sx, sy):
    check_op(lambda a, b: a @ b, np.matmul, randn(*sx), randn(*sy), name=f"matmul {sx} @ {sy}")
    check_op(lambda a, b: a.matmul(b), np.matmul, randn(*sx), randn(*sy), name=f"matmul() {sx}")


@given(data=st.data(), batch=broadcast_pairs(max_dims=2), nkm=st.tuples(*[st.integers(1, 3)] * 3))
def test_matmul_batched_broadcast(data, batch, nkm):
    n, k, m = nkm
    x = data.draw(arrays((*batch[0], n, k)))
    y = data.draw(arrays((*batch[1], k, m)))
    check_op(lambda a, b: a @ b, np.matmul, x, y, name=f"matmul {x.shape} @ {y.shape}")


def test_rmatmul_with_ndarray():
    w, a = randn(3, 2), randn(2, 3)
    check_op(lambda x: a @ x, lambda x: a @ x, w)
    check_op(lambda x: x.T @ x, lambda a: a.T @ a, w)


# ----------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("op", ["sum", "mean"])
@given(data=st.data(), sdk=shape_dim_keepdim(min_dims=0))
def test_sum_mean(op, data, sdk):
    shape, dim, keepdim = sdk
    x = data.draw(arrays(shape))
    ax = np_axes(dim, len(shape))
    check_op(
        lambda t: getattr(t, op)(dim, keepdim=keepdim),
        lambda a: getattr(np, op)(a, axis=ax, keepdims=keepdim),
        x,
        name=f"{op}(dim={dim}, keepdim={keepdim}) {shape}",
    )


@pytest.mark.filterwarnings("ignore:Degrees of freedom")
@pytest.mark.parametrize("correction", [1, 0])
@given(data=st.data(), sdk=shape_dim_keepdim())
def test_var(correction, data, sdk):
    shape, dim, keepdim = sdk
    n = reduced_count(shape, dim)
    x = data.draw(distinct_arrays(shape))
    ax = np_axes(dim, len(shape))
    want = lambda a: np.var(a, axis=ax, keepdims=keepdim, ddof=correction)
    if n <= correction:  # PyTorch: inf/nan for one element with correction 1
        with np.errstate(divide="ignore", invalid="ignore"):
            check_op(lambda t: t.var(dim, keepdim, correction=correction), want, x, grad=False)
        return
    check_op(
        lambda t: t.var(dim, keepdim, correction=correction),
        want,
        x,
        name=f"var(dim={dim}, keepdim={keepdim}, correction={correction}) {shape}",
    )
    if n == 1:
        return  # std of one element is 0, where sqrt has no derivative
    check_op(
        lambda t: t.std(dim, keepdim, unbiased=bool(correction)),
        lambda a: np.std(a, axis=ax, keepdims=keepdim, ddof=correction),
        x,
        name=f"std(dim={dim}) {shape}",
    )


@given(data=st.data(), sdk=shape_dim_keepdim(min_dims=0))
def test_amax_amin(data, sdk):
    shape, dim, keepdim = sdk
    x = data.draw(distinct_arrays(shape))
    ax = np_axes(dim, len(shape))
    check_op(
        lambda t: t.amax(dim, keepdim),
        lambda a: np.max(a, axis=ax, keepdims=keepdim),
        x,
        name=f"amax(dim={dim}, keepdim={keepdim}) {shape}",
    )
    check_op(
        lambda t: t.amin(dim, keepdim),
        lambda a: np.min(a, axis=ax, keepdims=keepdim),
        x,
        name=f"amin(dim={dim}, keepdim={keepdim}) {shape}",
    )


@given(data=st.data(), sdk=shape_dim_keepdim(allow_none=False, allow_tuple=False))
def test_max_min_dim_values_indices(data, sdk):
    shape, dim, keepdim = sdk
    x = data.draw(distinct_arrays(shape))
    t = tg.tensor(x)
    for name, npf, npa in [("max", np.max, np.argmax), ("min", np.min, np.argmin)]:
        values, indices = getattr(t, name)(dim, keepdim=keepdim)
        res = getattr(t, name)(dim, keepdim)
        assert res.values is res[0] and res.indices is res[1]
        assert_close(
            values.detach().numpy(), npf(x, axis=dim, keepdims=keepdim), what=f"{name} values"
        )
        assert indices.dtype.kind == "i" and not indices.requires_grad
        np.testing.assert_array_equal(indices.detach().numpy(), npa(x, axis=dim, keepdims=keepdim))
        check_op(
            lambda a, name=name: getattr(a, name)(dim, keepdim)[0],
            lambda a, npf=npf: npf(a, axis=dim, keepdims=keepdim),
            x,
            name=f"{name}(dim={dim}) {shape}",
        )
    check_op(lambda a: a.max(), np.max, x, name=f"max() {shape}")


def test_max_ties_share_gradient():
    x = tg.tensor(np.array([1.0, 3.0, 3.0, 2.0]), requires_grad=True)
    x.amax().backward()
    assert x.grad.tolist() == [0.0, 0.5, 0.5, 0.0]


# ----------------------------------------------------------------------------- shape ops

SHAPE_CASES = [
    ("view(6)", (2, 3), lambda t: t.view(6), lambda a: a.reshape(6)),
    ("view(3,-1)", (2, 3), lambda t: t.view(3, -1), lambda a: a.reshape(3, -1)),
    ("view((-1,))", (2, 1, 3), lambda t: t.view((-1,)), lambda a: a.reshape(-1)),
    ("reshape(-1,2)", (2, 2, 1), lambda t: t.reshape(-1, 2), lambda a: a.reshape(-1, 2)),
    ("reshape 0-d", (), lambda t: t.reshape(1, 1), lambda a: a.reshape(1, 1)),
    ("view_as", (2, 3), lambda t: t.view_as(tg.zeros(3, 2)), lambda a: a.reshape(3, 2)),
    ("transpose(0,1)", (2, 3), lambda t: t.transpose(0, 1), lambda a: a.T),
    ("transpose(-2,-1)", (2, 3, 2), lambda t: t.transpose(-2, -1), lambda a: a.swapaxes(-2, -1)),
    ("T", (2, 3, 2), lambda t: t.T, lambda a: a.transpose(2, 1, 0)),
    ("mT", (2, 3, 2), lambda t: t.mT, lambda a: a.swapaxes(-1, -2)),
    ("t()", (2, 3), lambda t: t.t(), lambda a: a.T),
    ("permute(2,0,1)", (2, 3, 2), lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    (
        "permute((1,-1,0))",
        (2, 3, 2),
        lambda t: t.permute((1, -1, 0)),
        lambda a: a.transpose(1, 2, 0),
    ),
    ("movedim", (2, 3, 2), lambda t: t.movedim(0, -1), lambda a: np.moveaxis(a, 0, -1)),
    (
        "contiguous",
        (2, 3),
        lambda t: t.transpose(0, 1).contiguous().view(-1),
        lambda a: a.T.reshape(-1),
    ),
    ("unsqueeze(0)", (2, 3), lambda t: t.unsqueeze(0), lambda a: a[None]),
    ("unsqueeze(-1)", (2, 3), lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    ("unsqueeze(1)", (2, 3), lambda t: t.unsqueeze(1), lambda a: a[:, None]),
    ("squeeze()", (1, 2, 1, 3), lambda t: t.squeeze(), lambda a: a.squeeze()),
    ("squeeze(2)", (1, 2, 1, 3), lambda t: t.squeeze(2), lambda a: a.squeeze(2)),
    ("squeeze(-1) no-op", (1, 2, 3), lambda t: t.squeeze(-1), lambda a: a),
    ("squeeze((0,2))", (1, 2, 1, 3), lambda t: t.squeeze((0, 2)), lambda a: a.squeeze((0, 2))),
    ("flatten()", (2, 3, 2), lambda t: t.flatten(), lambda a: a.reshape(-1)),
    ("flatten(1)", (2, 3, 2), lambda t: t.flatten(1), lambda a: a.reshape(2, -1)),
    ("flatten(0,1)", (2, 3, 2), lambda t: t.flatten(0, 1), lambda a: a.reshape(6, 2)),
    ("flatten 0-d", (), lambda t: t.flatten(), lambda a: a.reshape(1)),
    ("unflatten", (2, 6), lambda t: t.unflatten(1, (2, 3)), lambda a: a.reshape(2, 2, 3)),
    ("expand", (3, 1), lambda t: t.expand(3, 4), lambda a: np.broadcast_to(a, (3, 4))),
    ("expand -1", (3, 1), lambda t: t.expand(2, -1, 2), lambda a: np.broadcast_to(a, (2, 3, 2))),
    ("expand 0-d", (), lambda t: t.expand(2, 2), lambda a: np.broadcast_to(a, (2, 2))),
    (
        "expand_as",
        (1, 2),
        lambda t: t.expand_as(tg.zeros(3, 2)),
        lambda a: np.broadcast_to(a, (3, 2)),
    ),
    ("repeat", (2, 1), lambda t: t.repeat(2, 3), lambda a: np.tile(a, (2, 3))),
    (
        "view of permute",
        (2, 3, 2),
        lambda t: t.permute(1, 0, 2).reshape(3, 4),
        lambda a: a.transpose(1, 0, 2).reshape(3, 4),
    ),
    # the nanoGPT head split: (B, T, C) -> (B, nh, T, hs) and back
    (
        "head split",
        (2, 3, 4),
        lambda t: t.view(2, 3, 2, 2).transpose(1, 2),
        lambda a: a.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3),
    ),
    (
        "head merge",
        (2, 2, 3, 2),
        lambda t: t.transpose(1, 2).contiguous().view(2, 3, 4),
        lambda a: a.transpose(0, 2, 1, 3).reshape(2, 3, 4),
    ),
]


@pytest.mark.parametrize("name,shape,tg_fn,np_fn", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_shape_ops(name, shape, tg_fn, np_fn):
    check_op(tg_fn, np_fn, randn(*shape), name=f"{name} {shape}")


def test_views_share_data():
    x = tg.tensor(np.arange(6.0))
    v = x.view(2, 3)
    with tg.no_grad():
        v[0, 0] = 100.0
    assert x[0].item() == 100.0 and v.transpose(0, 1).is_contiguous() is False


@pytest.mark.parametrize(
    "bad",
    [
        lambda t: t.view(4, 2),
        lambda t: t.view(-1, -1),
        lambda t: t.expand(3, 4),
        lambda t: t.permute(0, 0),
    ],
)
def test_shape_errors(bad):
    with pytest.raises(ValueError, match=r"\(2, 3\)|permut|-1"):
        bad(tg.zeros(2, 3))


# ----------------------------------------------------------------------------- indexing

m23 = np.array([[True, False, True], [False, False, True]])
INDEX_CASES = [
    ("int", (3, 2), 1),
    ("negative int", (3, 2), -1),
    ("int int", (3, 2), (2, 1)),
    ("slice", (4, 2), slice(1, 3)),
    ("slice step", (5,), slice(None, None, 2)),
    ("negative slice", (4, 3), (slice(-2, None), slice(None, -1))),
    ("None", (2, 3), (None, slice(None), 1)),
    ("Ellipsis", (2, 3, 2), (Ellipsis, 0)),
    ("int Ellipsis int", (2, 3, 4), (1, Ellipsis, 3)),
    ("Ellipsis None", (2, 3), (Ellipsis, None)),
    ("bool mask", (2, 3), m23),
    ("bool mask rows", (3, 2), np.array([True, False, True])),
    ("bool mask after slice", (4, 2, 3), (slice(1, 3), m23)),
    ("int array", (4, 2), np.array([3, 0, 2])),
    ("int array repeats", (4, 2), np.array([3, 3, 3, 1])),
    ("int array 2-d", (4, 2), np.array([[0, 1], [1, 1]])),
    ("list repeats", (4, 2), [1, 1, 0]),
    ("list in tuple", (4, 2), ([1, 1], slice(None))),
    ("int arrays pair", (3, 3), (np.array([0, 2, 2]), np.array([1, 1, 1]))),
    ("slice int array", (2, 4), (slice(None), np.array([0, 0, 3]))),
    ("gather rows", (3, 4), (np.arange(3), np.array([1, 3, 1]))),
]


@pytest.mark.parametrize("name,shape,key", INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_getitem(name, shape, key):
    check_op(lambda t: t[key], lambda a: a[key], randn(*shape), name=f"x[{name}] {shape}")


def test_getitem_tensor_keys():
    x = randn(4, 3)
    idx, mask = tg.tensor([2, 2, 0]), tg.tensor(x[:, 0] > 0)
    check_op(lambda t: t[idx], lambda a: a[[2, 2, 0]], x)
    check_op(lambda t: t[mask], lambda a: a[x[:, 0] > 0], x)
    check_op(lambda t: t[:, tg.tensor(1)], lambda a: a[:, 1], x)


def test_repeated_indices_accumulate():
    w = tg.tensor(np.zeros((5, 2)), requires_grad=True)
    w[np.array([3, 3, 3])].sum().backward()
    np.testing.assert_array_equal(w.grad.numpy()[:, 0], [0, 0, 0, 3, 0])
    e = tg.tensor(np.zeros((5, 2)), requires_grad=True)
    F.embedding(tg.tensor([3, 3, 3]), e).sum().backward()
    np.testing.assert_array_equal(e.grad.numpy()[:, 1], [0, 0, 0, 3, 0])


@pytest.mark.parametrize("key", [3, -4, (0, 2), (Ellipsis, 5), np.array([0, 3]), ([0, 1], [0, 7])])
def test_getitem_out_of_range(key):
    with pytest.raises(IndexError):
        tg.zeros(3, 2)[key]


# ----------------------------------------------------------------------------- split, cat, stack


SPLIT_CASES = [
    ((5, 2), 2, 0),
    ((2, 6), 3, 1),
    ((2, 6), 4, -1),
    ((2, 5), [1, 3, 1], 1),
    ((4, 3), [4], 0),
    ((2, 2, 3), [2, 1], -1),
]


@pytest.mark.parametrize("shape,sizes,dim", SPLIT_CASES)
def test_split(shape, sizes, dim):
    x = randn(*shape)
    n = shape[dim]
    if isinstance(sizes, int):
        cuts = list(range(sizes, n, sizes))
    else:
        cuts = list(np.cumsum(sizes)[:-1])
    want = np.split(x, cuts, axis=dim)
    pieces = tg.tensor(x).split(sizes, dim=dim)
    assert isinstance(pieces, tuple) and len(pieces) == len(want)
    for i in range(len(want)):
        check_op(
            lambda t, i=i: t.split(sizes, dim)[i],
            lambda a, i=i: np.split(a, cuts, axis=dim)[i],
            x,
            name=f"split({sizes}, dim={dim})[{i}] {shape}",
        )
    # all pieces used, with different weights
    check_op(
        lambda t: sum((p * (i + 1)).sum() for i, p in enumerate(t.split(sizes, dim))),
        lambda a: sum((p * (i + 1)).sum() for i, p in enumerate(np.split(a, cuts, axis=dim))),
        x,
        name=f"split({sizes}) all pieces",
    )


@pytest.mark.parametrize(
    "shape,chunks,dim", [((6, 2), 3, 0), ((5, 2), 2, 0), ((2, 7), 3, -1), ((2, 3, 4), 2, 1)]
)
def test_chunk(shape, chunks, dim):
    x = randn(*shape)
    n = shape[dim]
    step = -(-n // chunks)
    cuts = list(range(step, n, step))
    for i in range(len(cuts) + 1):
        check_op(
            lambda t, i=i: t.chunk(chunks, dim)[i],
            lambda a, i=i: np.split(a, cuts, axis=dim)[i],
            x,
            name=f"chunk({chunks}, dim={dim})[{i}] {shape}",
        )


def test_split_errors():
    with pytest.raises(ValueError, match="add up"):
        tg.zeros(2, 5).split([2, 2], dim=1)


@pytest.mark.parametrize(
    "shapes_,dim",
    [
        ([(2, 3), (1, 3), (3, 3)], 0),
        ([(2, 1), (2, 3)], 1),
        ([(2, 2, 1), (2, 2, 2)], -1),
        ([(3,)], 0),
    ],
)
def test_cat(shapes_, dim):
    xs = [randn(*s) for s in shapes_]
    check_op(
        lambda *ts: tg.cat(list(ts), dim=dim),
        lambda *a: np.concatenate(a, axis=dim),
        *xs,
        name=f"cat {shapes_} dim={dim}",
    )
    check_op(lambda *ts: tg.concat(ts, dim), lambda *a: np.concatenate(a, axis=dim), *xs)


@pytest.mark.parametrize(
    "shape,n,dim", [((2, 3), 3, 0), ((2, 3), 2, 1), ((2, 3), 2, -1), ((2,), 2, 0), ((), 3, 0)]
)
def test_stack(shape, n, dim):
    xs = [randn(*shape) for _ in range(n)]
    check_op(
        lambda *ts: tg.stack(list(ts), dim=dim),
        lambda *a: np.stack(a, axis=dim),
        *xs,
        name=f"stack {n}x{shape} dim={dim}",
    )


def test_cat_stack_errors():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 2\)"):
        tg.cat([tg.zeros(2, 3), tg.zeros(2, 2)], dim=0)
    with pytest.raises(ValueError, match="stack"):
        tg.stack([tg.zeros(2, 3), tg.zeros(3, 2)])


# ----------------------------------------------------------------------------- where, masks


@given(
    data=st.data(),
    three=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3),
)
def test_where(data, three):
    cshape, xshape, yshape = three.input_shapes
    x, y = data.draw(arrays(xshape)), data.draw(arrays(yshape))
    c = data.draw(hnp.arrays(np.bool_, cshape))
    if c.size >= 2:  # both branches, so each input's gradient is checked where it flows
        c.flat[0], c.flat[1] = True, False
    check_op(
        lambda c_, a, b: tg.where(c_, a, b), np.where, c, x, y, name=f"where {three.input_shapes}"
    )
    check_op(lambda c_, a: tg.where(c_, a, 0.0), lambda c_, a: np.where(c_, a, 0.0), c, x)
    check_op(lambda c_, b: tg.where(c_, -1.0, b), lambda c_, b: np.where(c_, -1.0, b), c, y)


def test_where_needs_bool():
    with pytest.raises(TypeError, match="boolean"):
        tg.where(tg.tensor([1, 0]), tg.zeros(2), tg.ones(2))


@pytest.mark.parametrize(
    "xshape,mshape",
    [
        ((2, 3), (2, 3)),
        ((2, 3), (3,)),
        ((2, 3, 3), (3, 3)),
        ((2, 2, 3, 3), (1, 1, 3, 3)),
        ((2, 3), (2, 1)),
    ],
)
def test_masked_fill(xshape, mshape):
    x = randn(*xshape)
    m = rs.random(mshape) > 0.5
    check_op(
        lambda t: t.masked_fill(m, 0.25),
        lambda a: np.where(m, 0.25, a),
        x,
        name=f"masked_fill {xshape} mask {mshape}",
    )
    check_op(lambda t: t.masked_fill(tg.tensor(m), 0.0), lambda a: np.where(m, 0.0, a), x)
    # -inf: check the forward, and the gradient through a softmax (some key kept per row)
    m[..., 0] = False
    out = tg.tensor(x).masked_fill(m, float("-inf"))
    np.testing.assert_array_equal(out.detach().numpy(), np.where(m, -np.inf, x))
    check_op(lambda t: t.masked_fill(m, float("-inf")).softmax(-1), None, x)


def test_masked_fill_errors():
    with pytest.raises(TypeError, match="boolean"):
        tg.zeros(2, 3).masked_fill(tg.tensor([1, 0, 1]), 0.0)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        tg.zeros(2, 3).masked_fill(np.ones((4, 3), bool), 0.0)


@pytest.mark.parametrize("fn,npf", [(tg.tril, np.tril), (tg.triu, np.triu)])
@pytest.mark.parametrize("diagonal", [-1, 0, 1])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4), (2, 3, 2)])
def test_tril_triu(fn, npf, diagonal, shape):
    check_op(
        lambda t: fn(t, diagonal=diagonal),
        lambda a: npf(a, k=diagonal),
        randn(*shape),
        name=f"{fn.__name__}(diagonal={diagonal}) {shape}",
    )


# ----------------------------------------------------------------------------- functional: softmax


def np_log_softmax(a, axis=-1):
    m = np.max(a, axis=axis, keepdims=True)
    return a - m - np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))


def np_softmax(a, axis=-1):
    return np.exp(np_log_softmax(a, axis))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@given(data=st.data(), sdk=shape_dim_keepdim(allow_none=False, allow_tuple=False))
def test_softmax_family(op, data, sdk):
    shape, dim, _ = sdk
    x = data.draw(arrays(shape, lo=-4.0, hi=4.0))
    npf = np_softmax if op == "softmax" else np_log_softmax
    check_op(
        lambda t: getattr(F, op)(t, dim=dim),
        lambda a: npf(a, dim),
        x,
        name=f"F.{op}(dim={dim}) {shape}",
    )
    check_op(lambda t: getattr(t, op)(dim), lambda a: npf(a, dim), x, name=f"Tensor.{op}")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_large_magnitudes(op, dtype):
    x = np.array([[1e4, -1e4, 0.0, 1e4 - 1], [-1e4, -1e4 + 2, -1e4 + 1, -1e4]])
    out = getattr(F, op)(tg.tensor(x.astype(dtype)), dim=-1).detach().numpy()
    assert out.dtype == dtype and np.all(np.isfinite(out)), f"{op} {dtype}: {out}"
    npf = np_softmax if op == "softmax" else np_log_softmax
    assert_close(out, npf(x), atol=1e-6, rtol=1e-5, what=f"{op} at ±1e4")
    check_op(lambda t: getattr(F, op)(t, -1), lambda a: npf(a), x, name=f"{op} at ±1e4")


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cross_entropy"])
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=2, max_side=4))
def test_wide_range_logits_stay_finite(op, data, shape):
    x = data.draw(arrays(shape, lo=-1e4, hi=1e4))
    if op == "cross_entropy":
        t = np.arange(shape[0]) % shape[1]
        tg_fn, np_fn = (lambda a: F.cross_entropy(a, t)), (lambda a: np_cross_entropy(a, t))
    else:
        npf = np_softmax if op == "softmax" else np_log_softmax
        tg_fn, np_fn = (lambda a: getattr(F, op)(a, dim=-1)), npf
    out = check_op(tg_fn, np_fn, x, atol=1e-9, rtol=1e-9, name=f"{op} in [-1e4, 1e4] {shape}")
    assert np.all(np.isfinite(out.detach().numpy()))
    out32 = tg_fn(tg.tensor(x.astype(np.float32)))
    assert out32.dtype == np.float32 and np.all(np.isfinite(out32.detach().numpy())), (
        f"{op} float32"
    )


def test_softmax_all_minus_inf_row_is_nan():
    x = tg.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 1.0]])
    with np.errstate(invalid="ignore"):
        y = F.softmax(x, dim=-1).detach().numpy()
    assert np.all(np.isnan(y[0])), "a fully masked row has no softmax: NaN, as in PyTorch"
    assert_close(y[1], np_softmax(np.array([0.0, -np.inf, 1.0])), atol=1e-7)


# ----------------------------------------------------------------------------- layer_norm, gelu


def np_layer_norm(a, nd, w=None, b=None, eps=1e-5):
    axes = tuple(range(a.ndim - nd, a.ndim))
    y = (a - a.mean(axes, keepdims=True)) / np.sqrt(a.var(axes, keepdims=True) + eps)
    y = y * w if w is not None else y
    return y + b if b is not None else y


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize(
    "shape,ns", [((2, 3), 3), ((2, 3), (3,)), ((2, 2, 3), (2, 3)), ((4,), 4), ((3, 1, 4), [4])]
)
def test_layer_norm(affine, shape, ns):
    nshape = (ns,) if isinstance(ns, int) else tuple(ns)
    x = randn(*shape) * 2 + 0.5
    w = randn(*nshape) if affine in ("weight", "both") else None
    b = randn(*nshape) if affine in ("bias", "both") else None
    args = [a for a in (x, w, b) if a is not None]

    def tg_fn(*ts):
        ts = list(ts)
        t = ts.pop(0)
        tw = ts.pop(0) if w is not None else None
        tb = ts.pop(0) if b is not None else None
        return F.layer_norm(t, ns, tw, tb)

    check_op(
        tg_fn,
        lambda a, *_: np_layer_norm(a, len(nshape), w, b),
        *args,
        name=f"layer_norm {shape} ns={ns} affine={affine}",
    )


@given(
    shape=shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    nd=st.integers(1, 2),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_add_layer_norm(shape, nd, affine, seed):
    """AddLayerNorm (what tensorgrad.compile makes of x + a and the LayerNorm after it): both
    outputs, every input's gradient against finite differences."""
    from tensorgrad.compiler.patterns import AddLayerNorm

    nd = min(nd, len(shape))
    r = np.random.default_rng(seed)
    x, a = r.standard_normal(shape) * 2, r.standard_normal(shape)
    w, b = (r.standard_normal(shape[len(shape) - nd :]) for _ in range(2))
    args = [x, a, w, b] if affine else [x, a]

    def tg_fn(x, a, w=None, b=None):
        s, y = AddLayerNorm.apply(x, a, w, b, nd=nd)
        return y * 2 + s * s

    def np_fn(x, a, *_):
        s = x + a
        return np_layer_norm(s, nd, *(args[2:] if affine else ())) * 2 + s * s

    with tg.kernels.reference_only():  # the reference op (the kernel: tests/test_kernels.py)
        check_op(tg_fn, np_fn, *args, name=f"add_layer_norm {shape} nd={nd} affine={affine}")


def test_layer_norm_shape_error():
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(tg.zeros(2, 3), 4)


_erf = np.vectorize(math.erf)


@given(data=st.data(), shape=shapes())
def test_gelu_exact(data, shape):
    x = data.draw(arrays(shape, lo=-5.0, hi=5.0))
    check_op(
        lambda t: F.gelu(t),
        lambda a: a * 0.5 * (1 + _erf(a / math.sqrt(2))),
        x,
        atol=1e-6,
        name=f"gelu(approximate='none') {shape}",
    )


@given(data=st.data(), shape=shapes())
def test_gelu_tanh(data, shape):
    x = data.draw(arrays(shape, lo=-5.0, hi=5.0))
    c = math.sqrt(2 / math.pi)
    check_op(
        lambda t: F.gelu(t, approximate="tanh"),
        lambda a: 0.5 * a * (1 + np.tanh(c * (a + 0.044715 * a**3))),
        x,
        name=f"gelu(approximate='tanh') {shape}",
    )


def test_gelu_exact_float32_against_math_erf():
    x = np.linspace(-8, 8, 161)
    want = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    got = F.gelu(tg.tensor(x.astype(np.float32))).detach().numpy()
    assert got.dtype == np.float32
    assert_close(got, want, atol=1e-6, rtol=1e-6, what="gelu float32 vs math.erf")


def test_gelu_bad_approximate():
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(tg.zeros(2), approximate="fast")


# ----------------------------------------------------------------------------- dropout


def test_dropout_identity_when_not_training_or_p0():
    x = tg.randn(3, 4, requires_grad=True)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_mask_statistics_and_gradient(p):
    x = tg.ones(200, 500, requires_grad=True)
    y = F.dropout(x, p)
    out = y.detach().numpy()
    kept = out != 0
    assert abs(1 - kept.mean() - p) < 0.01, f"dropout p={p}: dropped fraction {1 - kept.mean()}"
    assert_close(
        out[kept],
        np.full(kept.sum(), 1 / (1 - p), np.float32),
        rtol=1e-6,
        what="kept values scaled by 1/(1-p)",
    )
    g = rs.standard_normal(out.shape).astype(np.float32)
    y.backward(g)
    assert_close(x.grad.numpy(), g * out, rtol=1e-6, what="dropout gradient = same mask")


def test_dropout_p1_and_bad_p():
    assert np.all(F.dropout(tg.randn(5), 1.0).detach().numpy() == 0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(tg.randn(5), 1.5)


def test_dropout_seeded_repeatable():
    x = tg.ones(50)
    tg.manual_seed(123)
    a = F.dropout(x, 0.5).detach().numpy()
    b = F.dropout(x, 0.5).detach().numpy()
    tg.manual_seed(123)
    np.testing.assert_array_equal(F.dropout(x, 0.5).detach().numpy(), a)
    assert not np.array_equal(a, b)


# ----------------------------------------------------------------------------- linear, embedding


@pytest.mark.parametrize("xshape", [(3,), (2, 3), (2, 2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(xshape, bias):
    x, w, b = randn(*xshape), randn(4, 3), randn(4)
    if bias:
        check_op(F.linear, lambda a, ww, bb: a @ ww.T + bb, x, w, b, name=f"linear {xshape}")
    else:
        check_op(
            lambda a, ww: F.linear(a, ww),
            lambda a, ww: a @ ww.T,
            x,
            w,
            name=f"linear {xshape} no bias",
        )


def test_linear_shape_error():
    with pytest.raises(ValueError, match=r"linear.*\(2, 3\).*\(4, 5\)"):
        F.linear(tg.zeros(2, 3), tg.zeros(4, 5))


@pytest.mark.parametrize(
    "idx",
    [
        np.array([3, 3, 3]),
        np.array([[0, 4], [4, 1]]),
        np.array(2),
        np.array([1, 0, 1, 2, 2], dtype=np.int32),
    ],
)
def test_embedding(idx):
    w = randn(5, 3)
    check_op(lambda t: F.embedding(idx, t), lambda a: a[idx], w, name=f"embedding {idx.shape}")
    check_op(lambda t: F.embedding(tg.tensor(idx), t), lambda a: a[idx], w)


def test_embedding_errors():
    with pytest.raises(IndexError, match="5"):
        F.embedding(tg.tensor([0, 5]), tg.zeros(5, 2))
    with pytest.raises(TypeError, match="integer"):
        F.embedding(tg.tensor([0.0, 1.0]), tg.zeros(5, 2))


# ----------------------------------------------------------------------------- cross_entropy


def np_cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    """Classes on axis 1 (or the only axis), as PyTorch."""
    if logits.ndim == 1:
        logits, target = logits[None], np.asarray(target).reshape(1)
    lp = np_log_softmax(np.moveaxis(logits, 1, -1))  # (N, d..., C)
    valid = target != ignore_index
    t = np.where(valid, target, 0)
    nll = -np.take_along_axis(lp, t[..., None], axis=-1)[..., 0]
    nll = np.where(valid, nll, 0.0)
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    with np.errstate(invalid="ignore"):
        return nll.sum() / valid.sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "lshape,tshape",
    [((4, 3), (4,)), ((2, 3, 2), (2, 2)), ((1, 4), (1,)), ((2, 3, 2, 2), (2, 2, 2))],
)
@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy(reduction, lshape, tshape, ignore):
    c = lshape[1]
    x = randn(*lshape) * 2
    t = rs.integers(0, c, tshape)
    if ignore:
        t.reshape(-1)[::2] = -1
        if t.size == 1:
            t.reshape(-1)[0] = 1
    kw = {"ignore_index": -1} if ignore else {}
    check_op(
        lambda a: F.cross_entropy(a, tg.tensor(t), reduction=reduction, **kw),
        lambda a: np_cross_entropy(a, t, kw.get("ignore_index", -100), reduction),
        x,
        name=f"cross_entropy {lshape} target {tshape} {reduction} ignore={ignore}",
    )


def test_cross_entropy_1d_logits():
    x, t = randn(4), np.array(2)
    check_op(lambda a: F.cross_entropy(a, t), lambda a: np_cross_entropy(a, t), x)
    check_op(
        lambda a: F.cross_entropy(a, t, reduction="none"),
        lambda a: np_cross_entropy(a, t, reduction="none").reshape(()),
        x,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_large_logits_finite(dtype):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4], [-1e4, -1e4, -1e4]])
    t = np.array([1, 2, 0])
    logits = tg.tensor(x.astype(dtype), requires_grad=True)
    loss = F.cross_entropy(logits, t, reduction="none")
    assert loss.dtype == dtype and np.all(np.isfinite(loss.detach().numpy()))
    assert_close(loss.detach().numpy(), np_cross_entropy(x, t, reduction="none"), rtol=1e-6)
    loss.sum().backward()
    assert np.all(np.isfinite(logits.grad.numpy()))
    check_op(lambda a: F.cross_entropy(a, t), lambda a: np_cross_entropy(a, t), x)


def test_cross_entropy_all_ignored_is_nan():
    loss = F.cross_entropy(tg.randn(3, 4), tg.tensor([-100, -100, -100]))
    assert math.isnan(loss.item())
    assert F.cross_entropy(tg.randn(3, 4), [-100] * 3, reduction="sum").item() == 0.0


def test_cross_entropy_errors():
    with pytest.raises(IndexError, match="4"):
        F.cross_entropy(tg.randn(2, 4), tg.tensor([0, 4]))
    with pytest.raises(TypeError, match="integer"):
        F.cross_entropy(tg.randn(2, 4), tg.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(tg.randn(2, 4), tg.tensor([0, 1]), reduction="avg")
    with pytest.raises(ValueError, match="target shape"):
        F.cross_entropy(tg.randn(2, 4), tg.tensor([0, 1, 2]))


# ----------------------------------------------------------------------------- attention


def np_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """Reference SDPA; ``mask`` boolean (True = attend) or additive float."""
    L, S = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    allowed = np.ones((L, S), bool)
    if is_causal:
        allowed = np.tril(allowed, k=S - L)
    if mask is not None and mask.dtype == bool:
        allowed = allowed & mask
    elif mask is not None:
        s = s + mask
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    return (e / np.where(den == 0, 1, den)) @ v


ATTN_CASES = {
    "plain": ((1, 2, 3, 2), (1, 2, 3, 2), None, False),
    "causal": ((2, 1, 3, 2), (2, 1, 3, 2), None, True),
    "causal L<S (kv cache)": ((1, 1, 2, 2), (1, 1, 4, 2), None, True),
    "bool mask": ((2, 1, 3, 2), (2, 1, 3, 2), "bool", False),
    "bool mask + causal": ((1, 2, 3, 2), (1, 2, 3, 2), "bool", True),
    "float mask": ((1, 2, 3, 2), (1, 2, 4, 2), "float", False),
    "3-d, no heads": ((2, 3, 2), (2, 4, 2), None, False),
    "broadcast kv": ((2, 2, 3, 2), (1, 1, 3, 2), None, True),
}


@pytest.mark.parametrize("case", ATTN_CASES)
def test_sdpa(case):
    qshape, kshape, mask_kind, is_causal = ATTN_CASES[case]
    q, k, v = randn(*qshape), randn(*kshape), randn(*kshape)
    L, S = qshape[-2], kshape[-2]
    mask = None
    if mask_kind == "bool":
        mask = rs.random((L, S)) > 0.4
        mask[:, 0] = True  # every query keeps a key
    elif mask_kind == "float":
        mask = rs.standard_normal((L, S))
    check_op(
        lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, attn_mask=mask, is_causal=is_causal
        ),
        lambda a, b, c: np_attention(a, b, c, mask, is_causal),
        q,
        k,
        v,
        name=f"sdpa {case} q{qshape} k{kshape}",
    )


def test_sdpa_scale():
    q, k, v = randn(1, 3, 2), randn(1, 3, 2), randn(1, 3, 2)
    check_op(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=0.3),
        lambda a, b, c: np_attention(a, b, c, scale=0.3),
        q,
        k,
        v,
    )


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_sdpa_fully_masked_row_gives_zeros(mask_kind):
    q, k, v = randn(1, 3, 2), randn(1, 3, 2), randn(1, 3, 2)
    allowed = np.array([[True, True, False], [False, False, False], [True, False, True]])
    mask = allowed if mask_kind == "bool" else np.where(allowed, 0.0, -np.inf)
    out = check_op(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask),
        lambda a, b, c: np_attention(a, b, c, allowed),
        q,
        k,
        v,
        name=f"sdpa fully masked row ({mask_kind})",
    )
    assert np.all(out.detach().numpy()[0, 1] == 0) and np.all(np.isfinite(out.detach().numpy()))


def test_sdpa_shape_error():
    with pytest.raises(ValueError, match="line up"):
        F.scaled_dot_product_attention(tg.zeros(1, 3, 2), tg.zeros(1, 3, 4), tg.zeros(1, 3, 4))
