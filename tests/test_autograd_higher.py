"""Second derivatives of every reference op: ``tg.gradgradcheck`` (the gradient taken with
create_graph=True, checked against float64 finite differences of itself) on drawn shapes.

The fused GPT ops run twice: through the registered kernels (whose backward is not
differentiable, so the walk replays their reference) and through the references only.
"""

import numpy as np
import pytest
from helpers import arrays, broadcast_pairs, distinct_arrays, shapes
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorgrad as tg
import tensorgrad.nn.functional as F

FEW = settings(max_examples=4)


def ggc(fn, *arrays, name=""):
    ts = [tg.tensor(a, dtype=np.float64, requires_grad=True) for a in arrays]
    try:
        tg.gradgradcheck(fn, ts, atol=1e-5, rtol=1e-3)
    except tg.GradcheckError as e:
        shapes_ = ", ".join(str(np.shape(a)) for a in arrays)
        raise AssertionError(f"{name} on ({shapes_}): {e}") from None


# Finite differences step 1e-6 either side of each value, so an op whose derivative jumps (a
# kink: max, clamp, a mask) is checked only on values drawn away from its kinks, by construction.


def outside(*bands, lo=-2.0, hi=2.0):
    """float64 elements in [lo, hi] outside every open interval in ``bands``."""
    edges = [lo, *sorted(v for band in bands for v in band), hi]
    parts = [st.floats(a, b, allow_subnormal=False) for a, b in zip(edges[::2], edges[1::2])]
    return st.one_of(parts)


def kinks(*at, gap=0.05):
    """The bands ``outside`` leaves out around each kink."""
    return [(k - gap, k + gap) for k in at]


@st.composite
def untied(draw, sx, sy):
    """x of shape sx and y of shape sy whose values are all distinct, 0.1875 apart or more: no
    element of x ties with any of y, whichever pairs broadcasting makes."""
    nx, ny = (int(np.prod(s, dtype=np.int64)) for s in (sx, sy))
    v = draw(distinct_arrays((nx + ny,), offset=-2.0))
    return v[:nx].reshape(sx), v[nx:].reshape(sy)


# ----------------------------------------------------------------------------- elementwise

BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "pow": lambda x, y: x.abs() ** y,
    "maximum": lambda x, y: tg.maximum(x, y),
    "minimum": lambda x, y: tg.minimum(x, y),
}


@pytest.mark.parametrize("op", BINARY)
@FEW
@given(data=st.data(), shapes2=broadcast_pairs(max_dims=2))
def test_binary(op, data, shapes2):
    sx, sy = shapes2
    if op in ("maximum", "minimum"):
        x, y = data.draw(untied(sx, sy))  # a tie is a kink: never drawn
    else:
        x = data.draw(arrays(sx, min_abs=0.5))
        y = data.draw(arrays(sy, min_abs=0.5))
    ggc(BINARY[op], x, y, name=op)


UNARY = {
    "neg": (lambda x: -x, {}),
    "exp": (lambda x: x.exp(), {}),
    "log": (lambda x: x.log(), {"lo": 0.3}),
    "sqrt": (lambda x: x.sqrt(), {"lo": 0.3}),
    "tanh": (lambda x: x.tanh(), {}),
    "sigmoid": (lambda x: x.sigmoid(), {}),
    "abs": (lambda x: x.abs() * x, {"min_abs": 0.3}),
    "relu": (lambda x: x.relu() * x, {"min_abs": 0.3}),
    "x**3": (lambda x: x**3, {}),
    "2**x": (lambda x: 2.0**x, {}),
    "clamp": (lambda x: x.clamp(-1.2345, 0.8765) * x, {"away": kinks(-1.2345, 0.8765)}),
    "where": (lambda x: tg.where(x > 0, x * x, x.exp()), {"min_abs": 0.3}),
    "masked_fill": (lambda x: x.masked_fill(x.data > 0.4321, 0.0) * x, {"away": kinks(0.4321)}),
    "sum": (lambda x: x.sum(-1) ** 2, {}),
    "mean": (lambda x: x.mean(0, keepdim=True) ** 2, {}),
    "var": (lambda x: x.var(-1), {}),
    "cumsum": (lambda x: x.cumsum(-1) ** 2, {}),
    "reshape": (lambda x: x.reshape(-1) ** 2, {}),
    "permute": (lambda x: x.permute(1, 0) ** 2, {}),
    "expand": (lambda x: x[:, :1].expand(-1, 4) ** 2, {}),
    "getitem": (lambda x: x[1:, ::2] ** 2, {}),
    "flip": (lambda x: x.flip(-1) ** 2, {}),
    "flip dims": (lambda x: x.flip((0, 1)) * x, {}),
    "roll": (lambda x: x.roll(1, -1) ** 2, {}),
    "roll flattened": (lambda x: x.roll(-2) * x, {}),
    "log10": (lambda x: x.log10() * x, {"lo": 0.3}),
    "log2": (lambda x: x.log2() * x, {"lo": 0.3}),
    "sin": (lambda x: x.sin() * x, {}),
    "cos": (lambda x: x.cos() * x, {}),
    "prod": (lambda x: x.prod(-1) * x.sum(), {}),
    "prod all": (lambda x: x.prod() * x, {}),
    "clamp tensor bounds": (  # the bounds lie in ±(0.34, 0.77) for any x in [-2, 2]
        lambda x: x.clamp(min=x[:1] * 0.1 - 0.5432, max=x[:1] * 0.1 + 0.5678) * x,
        {"away": [(-0.8, -0.3), (0.3, 0.8)]},
    ),
    "masked_fill value": (
        lambda x: x.masked_fill(x.data > 0.4321, x[0, 0]) * x,
        {"away": kinks(0.4321)},
    ),
    "getitem ids": (lambda x: x[np.array([0, 1, 1])] ** 2, {}),
    "clone": (lambda x: x.clone() ** 2, {}),
    "contiguous": (lambda x: x.T.contiguous() ** 2, {}),
    "pad": (lambda x: F.pad(x, (1, 0, 0, 1)) ** 2, {}),
    "cat": (lambda x: tg.cat([x, x * x], dim=1) ** 2, {}),
    "stack": (lambda x: tg.stack([x, x * x], dim=0) ** 2, {}),
    "split": (lambda x: x.split(1, dim=0)[1] ** 2, {}),
    "gather": (lambda x: x.gather(1, tg.tensor([[0, 0], [1, 0]], dtype=tg.int64)) ** 2, {}),
    "scatter_add": (
        lambda x: x.scatter_add(1, tg.tensor([[0, 0], [1, 0]], dtype=tg.int64), x * x) ** 2,
        {},
    ),
    "matmul": (lambda x: (x @ x.T) ** 2, {}),
    "matvec": (lambda x: (x @ x[0]) ** 2, {}),
    "einsum": (lambda x: tg.einsum("ij,kj->ik", x, x * x), {}),
}


ELEMENTWISE = {"neg", "exp", "log", "sqrt", "tanh", "sigmoid", "abs", "relu", "x**3", "2**x"}
ELEMENTWISE |= {"clamp", "where", "masked_fill", "clone", "sin", "cos", "log10", "log2"}


@pytest.mark.parametrize("op", UNARY)
@FEW
@given(data=st.data())
def test_unary_and_shape(op, data):
    fn, kw = UNARY[op]
    shape = data.draw(shapes(max_dims=3)) if op in ELEMENTWISE else (2, 3)
    if "away" in kw:
        x = data.draw(hnp.arrays(np.float64, shape, elements=outside(*kw["away"])))
    else:
        x = data.draw(arrays(shape, **{"hi": 2.0, **kw}))
    ggc(fn, x, name=op)


@FEW
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3))
def test_amax_without_ties(data, shape):
    x = data.draw(distinct_arrays(shape))
    ggc(lambda t: t.amax(-1) * t.sum(), x, name="amax")


# ----------------------------------------------------------------------------- linear, GPT ops

FUSED = {
    "linear": (lambda x, w: F.linear(x, w, w[:, 0] * 2), [(2, 3, 4), (5, 4)]),
    "softmax": (lambda x: F.softmax(x, dim=-1), [(2, 5)]),
    "softmax dim0": (lambda x: F.softmax(x, dim=0), [(3, 4)]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1) * x, [(2, 5)]),
    "cross_entropy mean": (
        lambda x: F.cross_entropy(x, tg.tensor([1, 0, 4], dtype=tg.int64)),
        [(3, 5)],
    ),
    "cross_entropy sum ignore": (
        lambda x: F.cross_entropy(
            x, tg.tensor([1, -100, 4], dtype=tg.int64), reduction="sum", ignore_index=-100
        ),
        [(3, 5)],
    ),
    "cross_entropy none": (
        lambda x: F.cross_entropy(x, tg.tensor([1, 2, 4], dtype=tg.int64), reduction="none"),
        [(3, 5)],
    ),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), [(2, 3, 4), (4,), (4,)]),
    "gelu tanh": (lambda x: F.gelu(x, approximate="tanh"), [(2, 5)]),
    "gelu none": (lambda x: F.gelu(x), [(2, 5)]),
    "embedding": (lambda w: F.embedding(tg.tensor([[0, 2], [2, 1]]), w) ** 2, [(3, 4)]),
    "sdpa causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 2)],
    ),
    "sdpa bool mask": (
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=tg.tensor([[True, False, True], [True, True, False]])
        ),
        [(2, 2, 4), (2, 3, 4), (2, 3, 4)],
    ),
    "sdpa float mask": (
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=tg.tensor([[0.0, -1.0, 0.5], [0.3, 0.0, -2.0]], dtype=tg.float64)
        ),
        [(2, 2, 4), (2, 3, 4), (2, 3, 4)],
    ),
    "dropout": (lambda x: _seeded(lambda: F.dropout(x, p=0.4) ** 3), [(3, 4)]),
    "sdpa dropout": (
        lambda q, k, v: _seeded(
            lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        ),
        [(1, 3, 4), (1, 3, 4), (1, 3, 4)],
    ),
}


def _seeded(f):
    tg.manual_seed(7)  # the same mask in every evaluation finite differences make
    return f()


@pytest.mark.parametrize("kernels", ["kernels", "references"])
@pytest.mark.parametrize("op", FUSED)
@FEW
@given(data=st.data())
def test_fused_ops(op, kernels, data):
    fn, shapes_ = FUSED[op]
    xs = [data.draw(arrays(s, hi=1.5)) for s in shapes_]
    if "dropout" in op and kernels == "kernels":
        # a kernel's random mask cannot be replayed: the walk says so
        ts = [tg.tensor(a, dtype=np.float64, requires_grad=True) for a in xs]
        out = fn(*ts)
        if out.grad_fn.name.startswith("Attention (kernel"):
            with pytest.raises(RuntimeError, match="reference_only"):
                tg.autograd.grad(out.sum(), ts, create_graph=True)
            return
    if kernels == "references":
        with tg.kernels.reference_only():
            ggc(fn, *xs, name=op)
    else:
        ggc(fn, *xs, name=op)
