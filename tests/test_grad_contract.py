"""No silent missing gradient: the contract raises when an op leaves an input that requires
grad with None, and the inputs that used to be left so (an additive attention mask, tensor
clamp bounds) get their gradients, checked against float64 finite differences. Also the
ops whose gradients were checked at one shape only, now at drawn shapes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import arrays, assert_close, broadcast_pairs, check_op, distinct_arrays, shapes
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import kernels
from tensorgrad.autograd import Op

# ----------------------------------------------------------------------------- the contract


class _Half(Op):
    """y = x·w, with a backward that forgets w unless told it is non-differentiable."""

    def forward(self, x, w):
        self.save(x, w)
        return x * w

    def backward(self, g):
        x, w = self.saved
        return g * w, None


class _HalfDeclared(_Half):
    non_differentiable = (1,)


def test_none_for_an_input_that_requires_grad_raises_naming_op_and_input():
    x, w = tg.ones(3, requires_grad=True), tg.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"_Half\.backward returned no gradient for input 1"):
        _Half.apply(x, w).sum().backward()


def test_none_is_fine_when_the_input_needs_no_grad_or_is_declared():
    x, w = tg.ones(3, requires_grad=True), tg.ones(3)
    _Half.apply(x, w).sum().backward()
    assert x.grad is not None
    x.grad = None
    w.requires_grad_(True)
    _HalfDeclared.apply(x, w).sum().backward()
    assert x.grad is not None and w.grad is None


# ----------------------------------------------------------------------------- attention


def _np_attention(q, k, v, mask=None, causal=False, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        s = s + mask
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool), S - L), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


# the reference and the CPU kernel that takes masks and dropout (float64 goes to the kernel)
IMPLS = {"reference": kernels.reference_only, "kernel": lambda: kernels.only(KERNEL)}
KERNEL = "cpu.inplace.attention"


def _sdpa(impl, *args, **kw):
    """F.scaled_dot_product_attention under ``impl``, asserting which implementation ran."""
    with IMPLS[impl]():
        out = F.scaled_dot_product_attention(*args, **kw)
    if out._node is not None:  # recorded (finite differences run without a graph)
        ran = out._node.name
        assert ("kernel" in ran) == (impl == "kernel"), f"{impl} requested, {ran} ran"
    return out


@pytest.mark.parametrize("impl", IMPLS)
@given(
    data=st.data(),
    BLSE=st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3)),
    causal=st.booleans(),
)
def test_attention_additive_mask_gets_its_gradient(impl, data, BLSE, causal):
    B, L, S, E = BLSE
    if causal and L > S:
        L = S  # every query sees a key (a fully masked row has no gradient to check)
    mshape = data.draw(
        st.sampled_from([(L, S), (1, S), (L, 1), (B, L, S), (B, 1, S), (S,), ()]), label="mask"
    )
    q, k, v = (data.draw(arrays(sh)) for sh in ((B, L, E), (B, S, E), (B, S, E)))
    m = data.draw(arrays(mshape))
    check_op(
        lambda q, k, v, m: _sdpa(impl, q, k, v, attn_mask=m, is_causal=causal),
        lambda q, k, v, m: _np_attention(q, k, v, m, causal),
        q,
        k,
        v,
        m,
        name=f"attention ({impl}) mask {mshape} causal={causal}",
    )


def test_attention_mask_gradient_float32_keeps_mask_dtype():
    r = np.random.default_rng(0)
    q = tg.tensor(r.standard_normal((2, 3, 4)), dtype=tg.float32, requires_grad=True)
    m = tg.tensor(r.standard_normal((3, 3)), requires_grad=True)  # float64 mask
    F.scaled_dot_product_attention(q, q, q, attn_mask=m).sum().backward()
    assert m.grad is not None and m.grad.dtype == np.float64 and m.grad.shape == (3, 3)


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data(), p=st.sampled_from([0.2, 0.5]), causal=st.booleans())
def test_attention_dropout_gradient(impl, data, p, causal):
    """A fixed seed fixes the dropout mask, so finite differences see one function."""
    q, k, v = (data.draw(arrays((2, 3, 2))) for _ in range(3))

    def fn(q, k, v):
        tg.manual_seed(7)
        return _sdpa(impl, q, k, v, dropout_p=p, is_causal=causal)

    out = check_op(fn, None, q, k, v, name=f"attention ({impl}) dropout_p={p}")
    assert_close(
        fn(*(tg.tensor(a) for a in (q, k, v))).detach().numpy(), out.detach().numpy()
    )  # same mask


# ----------------------------------------------------------------------------- clamp


@given(
    data=st.data(),
    three=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3),
)
def test_clamp_tensor_bounds_get_gradients(data, three):
    """x on the half-grid, lo even, hi odd: no ties, and lo > hi happens (output hi)."""
    sx, slo, shi = three.input_shapes

    def ints(shape, lo, hi):
        return data.draw(hnp.arrays(np.int64, shape, elements=st.integers(lo, hi)))

    x = ints(sx, -3, 3) + 0.5
    lo = 2.0 * ints(slo, -2, 2)
    hi = 2.0 * ints(shi, -2, 2) + 1
    check_op(
        lambda x, lo, hi: tg.clamp(x, min=lo, max=hi),
        lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
        x,
        lo,
        hi,
        name=f"clamp {three.input_shapes}",
    )
    check_op(lambda x, lo: x.clamp(min=lo), np.maximum, x, lo, name="clamp min tensor")
    check_op(lambda x, hi: x.clamp(max=hi), np.minimum, x, hi, name="clamp max tensor")


def test_clamp_bounds_gradient_by_hand():
    """torch.clamp's rule: lo gets it where x < lo < hi, hi where x > hi or hi < lo."""
    x = tg.tensor([-2.0, 0.0, 2.0, 5.0], requires_grad=True)
    lo = tg.tensor([-1.0, 1.0, -1.0, 6.0], requires_grad=True)
    hi = tg.tensor(3.0, requires_grad=True)
    tg.clamp(x, min=lo, max=hi).sum().backward()
    assert x.grad.tolist() == [0, 0, 1, 0]
    assert lo.grad.tolist() == [1, 1, 0, 0]
    assert hi.grad.item() == 1.0


# ----------------------------------------------------------------------------- Cast, losses


@given(data=st.data(), shape=shapes())
def test_cast_gradient(data, shape):
    x = data.draw(arrays(shape))
    # through float32 and back: the difference quotient needs a step float32 can resolve
    check_op(
        lambda x: x.float().double() * x,
        lambda x: x.astype(np.float32).astype(np.float64) * x,
        x,
        atol=1e-6,
        eps=1e-3,
        grad_atol=1e-3,
        grad_rtol=1e-3,
    )
    x32 = tg.tensor(x, dtype=tg.float32, requires_grad=True)
    (x32.double() ** 2).sum().backward()
    assert x32.grad.dtype == np.float32
    assert_close(x32.grad.detach().numpy(), 2 * x.astype(np.float32), atol=1e-6)


@given(data=st.data(), pair=broadcast_pairs(), reduction=st.sampled_from(["mean", "sum", "none"]))
def test_l1_loss(data, pair, reduction):
    x = data.draw(arrays(pair[0]))
    # the target one unit-and-more away from x wherever they meet: |x - t| differentiable
    t = data.draw(arrays(pair[1], min_abs=0.25)) + 4.0
    red = {"mean": np.mean, "sum": np.sum, "none": lambda a: a}[reduction]
    check_op(
        lambda x, t: F.l1_loss(x, t, reduction=reduction),
        lambda x, t: red(np.abs(x - t)),
        x,
        t,
        name=f"l1_loss {reduction}",
    )


@given(
    idx=hnp.arrays(np.int64, shapes(max_dims=2), elements=st.integers(0, 4)),
    extra=st.integers(0, 2),
)
def test_one_hot(idx, extra):
    got = F.one_hot(tg.tensor(idx), num_classes=5 + extra)
    assert got.dtype == np.int64 and got.shape == (*idx.shape, 5 + extra)
    np.testing.assert_array_equal(got.detach().numpy(), np.eye(5 + extra, dtype=np.int64)[idx])
    if idx.size:
        inferred = F.one_hot(tg.tensor(idx))
        assert inferred.shape[-1] == idx.max() + 1


# ----------------------------------------------------------------------------- the compat ops


@given(data=st.data(), pair=broadcast_pairs())
def test_maximum_minimum_drawn(data, pair):
    n = int(np.prod(np.broadcast_shapes(*pair), dtype=np.int64)) * 2
    vals = data.draw(distinct_arrays((n,)))  # no ties: the gradient is defined everywhere
    x = vals[: int(np.prod(pair[0], dtype=np.int64))].reshape(pair[0])
    y = vals[n // 2 : n // 2 + int(np.prod(pair[1], dtype=np.int64))].reshape(pair[1])
    check_op(tg.maximum, np.maximum, x, y, name=f"maximum {pair}")
    check_op(tg.minimum, np.minimum, x, y, name=f"minimum {pair}")


@given(data=st.data(), shape=shapes(min_dims=1))
def test_clamp_scalar_bounds_drawn(data, shape):
    x = data.draw(arrays(shape, min_abs=0.3))  # away from the bounds ±0.2 (no kinks)
    check_op(lambda x: x.clamp(-0.2, 0.2), lambda x: np.clip(x, -0.2, 0.2), x)
    check_op(lambda x: tg.clamp(x, min=0.2), lambda x: np.maximum(x, 0.2), x)


@given(data=st.data(), shape=shapes(min_dims=1))
def test_gather_scatter_add_drawn(data, shape):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    ishape = tuple(data.draw(st.integers(1, s)) for s in shape)
    idx = data.draw(hnp.arrays(np.int64, ishape, elements=st.integers(0, shape[dim] - 1)))
    x, src = data.draw(arrays(shape)), data.draw(arrays(ishape))
    d = dim % len(shape)  # torch.gather's output is index's shape: x's corner elsewhere
    corner = tuple(slice(None) if a == d else slice(0, n) for a, n in enumerate(ishape))
    check_op(
        lambda x: x.gather(dim, tg.tensor(idx)),
        lambda x: np.take_along_axis(x[corner], idx, dim),
        x,
        name=f"gather dim={dim}",
    )

    def np_scatter_add(x, s):
        out = x.copy()
        grid = list(np.indices(ishape, sparse=True))
        grid[dim] = idx
        np.add.at(out, tuple(grid), s)
        return out

    check_op(
        lambda x, s: x.scatter_add(dim, tg.tensor(idx), s),
        np_scatter_add,
        x,
        src,
        name=f"scatter_add dim={dim}",
    )


@given(data=st.data(), shape=shapes(min_dims=1))
def test_cumsum_sort_topk_drawn(data, shape):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    x = data.draw(distinct_arrays(shape))
    check_op(lambda x: x.cumsum(dim), lambda x: np.cumsum(x, dim), x, name=f"cumsum {dim}")
    check_op(lambda x: x.sort(dim=dim)[0], lambda x: np.sort(x, dim), x, name=f"sort {dim}")
    k = data.draw(st.integers(1, shape[dim]), label="k")
    check_op(
        lambda x: x.topk(k, dim=dim)[0],
        lambda x: np.take(-np.sort(-x, dim), range(k), dim),
        x,
        name=f"topk k={k} dim={dim}",
    )


@given(data=st.data(), shape=shapes(min_dims=1, max_dims=2))
def test_pad_drawn(data, shape):
    amounts = data.draw(st.lists(st.integers(-1, 2), min_size=2, max_size=2 * len(shape)))
    amounts = amounts[: 2 * (len(amounts) // 2)]
    for d, (a, b) in enumerate(zip(amounts[::2], amounts[1::2])):
        side = shape[len(shape) - 1 - d]
        if a + b <= -side:  # would crop everything
            amounts[2 * d] = amounts[2 * d + 1] = 0
    x = data.draw(arrays(shape))

    def np_pad(x):
        for d, (a, b) in enumerate(zip(amounts[::2], amounts[1::2])):
            ax = x.ndim - 1 - d
            x = np.take(x, range(max(0, -a), x.shape[ax] - max(0, -b)), ax)
            width = [(0, 0)] * x.ndim
            width[ax] = (max(a, 0), max(b, 0))
            x = np.pad(x, width, constant_values=0.5)
        return x

    check_op(lambda x: F.pad(x, amounts, value=0.5), np_pad, x, name=f"pad {amounts}")


@given(data=st.data(), n=st.integers(1, 3), m=st.integers(1, 3), j=st.integers(1, 3))
def test_einsum_drawn(data, n, m, j):
    a, b = data.draw(arrays((n, j))), data.draw(arrays((m, j)))
    check_op(lambda x, y: tg.einsum("ij,kj->ik", x, y), lambda x, y: x @ y.T, a, b)
    c = data.draw(arrays((n, j)))
    check_op(lambda x, y: tg.einsum("ij,ij->i", x, y), lambda x, y: (x * y).sum(1), a, c)
    check_op(lambda x: tg.einsum("...j->...", x), lambda x: x.sum(-1), a)


@given(data=st.data(), pair=broadcast_pairs())
def test_silu_mse_drawn(data, pair):
    x, t = data.draw(arrays(pair[0])), data.draw(arrays(pair[1]))
    check_op(F.silu, lambda x: x / (1 + np.exp(-x)), x)
    check_op(F.mse_loss, lambda x, t: np.mean((x - t) ** 2), x, t, name=f"mse_loss {pair}")


@given(data=st.data(), shape=shapes(min_dims=1))
def test_norm_drawn(data, shape):
    x = data.draw(arrays(shape, min_abs=0.1))  # a zero norm has no gradient
    dim = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    keep = data.draw(st.booleans())

    def np_norm(x):
        if dim is None:  # every dim reduced (kept as size 1 with keepdim, as vector_norm)
            n = np.linalg.norm(x.reshape(-1))
            return n.reshape((1,) * x.ndim) if keep else n
        return np.linalg.norm(x, axis=dim, keepdims=keep)

    check_op(lambda x: x.norm(dim=dim, keepdim=keep), np_norm, x, name=f"norm dim={dim}")


@given(data=st.data(), N=st.integers(1, 4), C=st.integers(2, 5), eps=st.floats(0.0, 0.5))
def test_label_smoothing_drawn(data, N, C, eps):
    x = data.draw(arrays((N, C)))
    t = data.draw(hnp.arrays(np.int64, (N,), elements=st.integers(0, C - 1)))

    def np_ce(x):
        logp = (
            x
            - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
            - x.max(1, keepdims=True)
        )
        return ((1 - eps) * -logp[np.arange(N), t] - eps * logp.mean(1)).mean()

    check_op(
        lambda x: F.cross_entropy(x, tg.tensor(t), label_smoothing=eps),
        np_ce,
        x,
        name=f"label smoothing {eps}",
    )


@given(data=st.data(), pair=broadcast_pairs(max_dims=2))
def test_fill_values_that_require_grad_get_their_gradient(data, pair):
    """masked_fill / masked_fill_ / fill_ with a 0-d tensor value: the value's gradient is
    the sum of the filled elements' (it used to be read with .item() and dropped)."""
    xshape = np.broadcast_shapes(*pair)
    x = data.draw(arrays(xshape))
    m = data.draw(hnp.arrays(np.bool_, pair[1]))
    v = data.draw(arrays(()))

    def inplace(x, v):
        y = x * 1.0
        y.masked_fill_(tg.tensor(m), v)
        return y

    want = lambda x, v: np.where(m, v, x)  # noqa: E731
    check_op(lambda x, v: x.masked_fill(tg.tensor(m), v), want, x, v, name="masked_fill")
    check_op(inplace, want, x, v, name="masked_fill_")
    check_op(lambda x, v: (x * 1.0).fill_(v) * x, lambda x, v: v * x, x, v, name="fill_")


def test_fill_value_must_be_0d():
    x, v = tg.zeros(2, 3), tg.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        x.masked_fill(tg.ones(2, 3, dtype=tg.bool), v)
