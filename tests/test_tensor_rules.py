"""PyTorch's rules on tensors: dim checks, views and their version counters, in-place writes
on leaves, views and non-leaves, 0-d reductions, and type promotion."""

import numpy as np
import pytest

import tensorgrad as tg

# ----------------------------------------------------------------------------- dims

X = tg.randn(3, 4)
DIM_OPS = {  # op name (as the error names it), call, the range it must name
    "split": (lambda: X.split(2, dim=5), "[-2, 1]", 5),
    "chunk": (lambda: X.chunk(2, dim=-3), "[-2, 1]", -3),
    "stack": (lambda: tg.stack([X, X], dim=3), "[-3, 2]", 3),
    "cat": (lambda: tg.cat([X, X], dim=2), "[-2, 1]", 2),
    "movedim": (lambda: X.movedim(0, 2), "[-2, 1]", 2),
    "unsqueeze": (lambda: X.unsqueeze(3), "[-3, 2]", 3),
    "squeeze": (lambda: X.squeeze(2), "[-2, 1]", 2),
    "flatten": (lambda: X.flatten(0, 2), "[-2, 1]", 2),
    "unflatten": (lambda: X.unflatten(2, (2, 2)), "[-2, 1]", 2),
    "transpose": (lambda: X.transpose(0, 3), "[-2, 1]", 3),
    "permute": (lambda: X.permute(0, 2), "[-2, 1]", 2),
    "max": (lambda: X.max(dim=2), "[-2, 1]", 2),
    "min": (lambda: X.min(dim=-3), "[-2, 1]", -3),
    "argmax": (lambda: X.argmax(dim=5), "[-2, 1]", 5),
    "argmin": (lambda: X.argmin(dim=2), "[-2, 1]", 2),
    "amax": (lambda: X.amax(dim=2), "[-2, 1]", 2),
    "amin": (lambda: X.amin(dim=2), "[-2, 1]", 2),
    "sum": (lambda: X.sum(dim=(0, 2)), "[-2, 1]", 2),
    "cumsum": (lambda: X.cumsum(2), "[-2, 1]", 2),
    "softmax": (lambda: X.softmax(2), "[-2, 1]", 2),
    "log_softmax": (lambda: X.log_softmax(-3), "[-2, 1]", -3),
    "topk": (lambda: X.topk(1, dim=2), "[-2, 1]", 2),
    "sort": (lambda: X.sort(dim=2), "[-2, 1]", 2),
    "gather": (lambda: X.gather(2, tg.zeros(3, 1, dtype=tg.int64)), "[-2, 1]", 2),
    "index_select": (lambda: X.index_select(2, tg.tensor([0])), "[-2, 1]", 2),
    "unbind": (lambda: X.unbind(2), "[-2, 1]", 2),
    "size": (lambda: X.size(2), "[-2, 1]", 2),
}


@pytest.mark.parametrize("op", DIM_OPS)
def test_dim_out_of_range_is_pytorchs_index_error(op):
    fn, rng, dim = DIM_OPS[op]
    with pytest.raises(IndexError) as e:
        fn()
    msg = str(e.value)
    assert "Dimension out of range" in msg and rng in msg and f"but got {dim})" in msg, msg
    assert msg.split(":")[0] == op, msg  # names the op


def test_split_on_the_last_dim_and_negative_dims_still_work():
    a, b = X.split(2, dim=-1)
    assert a.shape == (3, 2) and b.shape == (3, 2)
    assert X.transpose(-1, -2).shape == (4, 3) and X.unsqueeze(-1).shape == (3, 4, 1)


# ----------------------------------------------------------------------------- views


def test_views_share_the_version_counter_only_when_they_share_memory():
    x = tg.randn(3, 4)
    assert x.view(12)._version is x._version
    assert x[1:]._version is x._version
    assert x.transpose(0, 1)._version is x._version
    t = x.t()
    assert t.reshape(12)._version is not t._version  # NumPy had to copy
    assert x[[0, 2]]._version is not x._version  # advanced indexing copies
    assert x[1:]._base is x and x[1:][0]._base is x  # a view of a view has the first base


def test_view_of_non_contiguous_raises_pytorchs_error_and_reshape_copies():
    t = tg.randn(3, 4).t()
    with pytest.raises(RuntimeError, match=r"view size is not compatible .*Use \.reshape"):
        t.view(12)
    r = t.reshape(12)
    np.testing.assert_array_equal(r.detach().numpy(), t.detach().numpy().reshape(12))
    assert t.contiguous().view(12).shape == (12,)
    assert t.view(4, 3).shape == (4, 3)  # no change of layout needed: allowed


def test_in_place_write_through_a_view_of_a_leaf_that_requires_grad_raises():
    x = tg.randn(4, 3, requires_grad=True)
    before = x.detach().numpy().copy()
    for write in (
        lambda v: v.__iadd__(1),
        lambda v: v.mul_(2),
        lambda v: v.zero_(),
        lambda v: v.fill_(1.0),
        lambda v: v.copy_(tg.ones(2, 3)),
        lambda v: v.masked_fill_(tg.ones(2, 3, dtype=tg.bool_), 0.0),
        lambda v: v.normal_(),
        lambda v: v.__setitem__(0, 5.0),
    ):
        with pytest.raises(RuntimeError, match="leaf|autograd"):
            write(x[0:2])
    np.testing.assert_array_equal(x.detach().numpy(), before)  # and x is unchanged
    with tg.no_grad():
        x[0:2] += 1  # fine without recording, as in PyTorch
    np.testing.assert_allclose(x.detach().numpy()[:2], before[:2] + 1)


def test_in_place_on_a_leaf_that_requires_grad_raises_each_way():
    x = tg.randn(3, requires_grad=True)
    for write in (
        lambda: x.__iadd__(1),
        lambda: x.zero_(),
        lambda: x.fill_(2.0),
        lambda: x.copy_(tg.ones(3)),
        lambda: x.normal_(),
        lambda: x.uniform_(),
    ):
        with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
            write()


def test_view_made_under_no_grad_is_still_guarded_when_recording():
    x = tg.randn(4, requires_grad=True)
    with tg.no_grad():
        v = x[:2]
    with pytest.raises(RuntimeError, match="view of a leaf"):
        v += 1


def test_in_place_on_a_view_of_a_plain_tensor_writes_through():
    x = tg.zeros(4)
    x[1:3] += 2
    x[0:1].fill_(7.0)
    np.testing.assert_array_equal(x.detach().numpy(), [7, 2, 2, 0])


def test_in_place_through_a_view_of_a_non_leaf_is_recorded():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y[0:2] *= 3  # PyTorch rewrites y's graph; so do we
    np.testing.assert_allclose(y.detach().numpy(), [6, 12, 6])
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6, 6, 2])


def test_writing_a_tensor_that_requires_grad_into_a_plain_buffer():
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    buf = tg.zeros(4)
    buf[1:3] += w
    c = tg.tensor([1.0, 10.0, 100.0, 1000.0])
    (buf * c).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [10, 100])
    assert buf.requires_grad and not buf.is_leaf


def test_setitem_and_copy_are_recorded():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = tg.tensor(5.0, requires_grad=True)
    y = x * 1.0
    y[1] = w * 2
    c = tg.tensor([1.0, 10.0, 100.0])
    (y * c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1, 0, 100])
    np.testing.assert_allclose(w.grad.numpy(), 20.0)
    z = tg.zeros(3)
    z.copy_(x)
    (z * c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 10, 200])


@pytest.mark.parametrize("fill", ["zero_", "fill_", "masked_fill_", "clamp_", "copy_"])
def test_constant_fills_of_a_non_leaf_stop_its_gradient(fill):
    x = tg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = x * 2
    {
        "zero_": lambda: y.zero_(),
        "fill_": lambda: y.fill_(1.0),
        "masked_fill_": lambda: y.masked_fill_(tg.tensor([True, True, True]), 0.0),
        "clamp_": lambda: y.clamp_(10.0, 20.0),
        "copy_": lambda: y.copy_(tg.ones(3)),
    }[fill]()
    (y * x).sum().backward()  # only the direct use of x is left
    np.testing.assert_allclose(x.grad.numpy(), y.detach().numpy())


def test_other_views_see_a_write_through_one_view():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    a, b = y[0:2], y[1:3]  # overlapping views, taken before the write
    a *= 3
    b.sum().backward()  # b = (6x1, 2x2)[1:] -> d/dx = (0, 6, 2)
    np.testing.assert_allclose(x.grad.numpy(), [0, 6, 2])
    x.grad = None
    z = x * 1.0
    t = z.view(3, 1)
    z *= 5  # a write into the base itself
    t.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5, 5, 5])


def _writes_through_views(x):
    y = x * 1.0  # (2, 3, 4), non-leaf
    v = y.view(6, 4)[1:5].transpose(0, 1)  # a view of a view of a view: (4, 4)
    v *= 2.0
    v[1:3] += x[0, 0]  # a broadcast value that requires grad
    s = y.split(2, dim=2)[1]
    s.masked_fill_(s > 1.0, 0.5)
    return (y * y).sum(dim=0)


def test_in_place_writes_through_views_match_finite_differences():
    rs = np.random.default_rng(0)
    x = tg.tensor(rs.standard_normal((2, 3, 4)), dtype=tg.float64, requires_grad=True)
    tg.gradcheck(_writes_through_views, [x])


def test_a_saved_base_written_through_a_view_still_raises_at_backward():
    x = tg.randn(3, requires_grad=True)
    e = x.exp()  # saves its output
    e[0:1] += 1
    with pytest.raises(RuntimeError, match="modified in place"):
        e.sum().backward()


# ----------------------------------------------------------------------------- 0-d and non-leaf


def test_full_reductions_are_0d_arrays():
    x = tg.randn(3, 4)
    for r in (x.sum(), x.mean(), x.amax(), x.var(), x.max(), x.norm()):
        assert isinstance(r.array, np.ndarray) and r.shape == ()


def test_in_place_on_0d_and_non_leaf_tensors_is_recorded():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x.sum()
    y += 1
    y *= 2
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2])
    assert y.item() == 14.0
    x.grad = None
    d = x * 1.0
    d += d * 2
    d.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3, 3, 3])


def test_in_place_on_a_saved_non_leaf_still_raises_at_backward():
    x = tg.randn(3, requires_grad=True)
    e = x.exp()  # saves its output
    e += 1
    with pytest.raises(RuntimeError, match="modified in place"):
        e.sum().backward()


@pytest.mark.parametrize("op", ["exp", "softmax", "tanh", "sigmoid"])
def test_an_unused_output_that_its_op_saved_is_freed_without_the_cyclic_gc(op):
    """An op that saves its output guards it by its version counter, not by holding the
    output tensor: the tensor would hold its node, and the node it, a cycle that only the
    cyclic GC breaks (dropped outputs piled up, 12.6 MB each, until it ran)."""
    import gc
    import weakref

    x = tg.randn(4, 8, requires_grad=True)
    f = {"softmax": lambda t: t.softmax(-1)}.get(op, lambda t: getattr(t, op)())
    enabled = gc.isenabled()
    gc.disable()
    try:
        y = f(x)
        gone = weakref.ref(y.array)
        del y
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


def _guards(fn, inputs, outs, arrays, general: bool, monkeypatch):
    from tensorgrad.autograd import graph

    with monkeypatch.context() as mp:
        if general:
            mp.setattr(graph, "_guard_saved_inputs", lambda *a: None)
        checks, links = graph._guard_saved(fn, inputs, outs, arrays)
    copied = [s is not a for s, a in zip(fn.saved, arrays)]
    return [(id(ver), v, shape) for ver, v, shape in checks], links, copied


@pytest.mark.parametrize(
    "kinds",
    ["ttt", "tpt", "t0p", "tvt", "tTt", "pp0", "tt", "t0", "ts"],
)
def test_the_quick_guard_of_an_op_that_saves_its_inputs_equals_the_general_one(kinds, monkeypatch):
    """t a tensor, p a plain array, 0 a 0-d tensor, v a tensor viewing the first, T the first
    tensor again, s a saved output: the quick pass applies or defers, never differs."""
    from tensorgrad.autograd import graph

    base = tg.randn(4, 3)
    inputs = []
    for k in kinds:
        inputs.append(
            {
                "t": lambda: tg.randn(4, 3),
                "p": lambda: np.ones(3, np.float32),
                "0": lambda: tg.tensor(2.0),
                "v": lambda: tg.Tensor(base.array[1:]),
                "T": lambda: inputs[0],
                "s": lambda: tg.randn(2),
            }[k]()
        )
    inputs[0] = base if "v" in kinds else inputs[0]
    arrays = [x.array if isinstance(x, tg.Tensor) else x for x in inputs]
    outs = [tg.Tensor(arrays[-1] if kinds.endswith("s") else np.zeros(2, np.float32))]
    got = []
    for general in (False, True):
        fn = graph.Op()
        fn.save(*arrays)
        got.append(_guards(fn, inputs, outs, arrays, general, monkeypatch))
    assert got[0] == got[1]


def test_accumulate_grad_lives_in_autograd_only():
    assert not hasattr(tg.Tensor, "_accumulate_grad")


# ----------------------------------------------------------------------------- promotion

i64 = tg.tensor([1, 2])
i32 = tg.tensor([1, 2], dtype=tg.int32)
f32 = tg.tensor([1.0, 2.0])
f64 = tg.tensor([1.0, 2.0], dtype=tg.float64)
f16 = tg.tensor([1.0, 2.0], dtype=tg.float16)
b = tg.tensor([True, False])
f64_0d = tg.tensor(2.0, dtype=tg.float64)
i64_0d = tg.tensor(3)

# as torch.result_type (checked against PyTorch 2.x by hand)
PROMOTION = [
    ("int / 2", lambda: i64 / 2, np.float32),
    ("int / int", lambda: i64 / i64, np.float32),
    ("2 / int", lambda: 2 / i64, np.float32),
    ("int * 0.5", lambda: i64 * 0.5, np.float32),
    ("int + 1", lambda: i64 + 1, np.int64),
    ("int32 + 1", lambda: i32 + 1, np.int32),
    ("int32 + int64", lambda: i32 + i64, np.int64),
    ("int64 * float32", lambda: i64 * f32, np.float32),
    ("float32 * int64", lambda: f32 * i64, np.float32),
    ("float32 + float64", lambda: f32 + f64, np.float64),
    ("float32 * 0-d float64", lambda: f32 * f64_0d, np.float32),
    ("float16 * 0-d float64", lambda: f16 * f64_0d, np.float16),
    ("float16 * 1.5", lambda: f16 * 1.5, np.float16),
    ("int64 * 0-d float64", lambda: i64 * f64_0d, np.float64),
    ("float32 + 0-d int64", lambda: f32 + i64_0d, np.float32),
    ("bool + 1", lambda: b + 1, np.int64),
    ("bool + 1.5", lambda: b + 1.5, np.float32),
    ("bool * float64", lambda: b * f64, np.float64),
    ("float32 ** 2", lambda: f32**2, np.float32),
    ("float32 * np.float64", lambda: f32 * np.float64(2), np.float32),
    ("int // 2", lambda: i64 // 2, np.int64),
    ("float // 2", lambda: f32 // 2, np.float32),
    ("full int", lambda: tg.full((2, 3), 7), np.int64),
    ("full float", lambda: tg.full((2, 3), 7.0), np.float32),
    ("full bool", lambda: tg.full((2, 3), True), np.bool_),
    ("sum of bool", lambda: b.sum(), np.int64),
    ("sum of int32", lambda: i32.sum(), np.int64),
]


@pytest.mark.parametrize("name, fn, want", PROMOTION, ids=[p[0] for p in PROMOTION])
def test_type_promotion_table(name, fn, want):
    assert fn().dtype == want, name


def test_result_type():
    assert tg.result_type(f32, f64_0d) == np.float32
    assert tg.result_type(i64, 2.5) == np.float32


def test_promotion_keeps_gradients_in_each_inputs_dtype():
    x = tg.randn(3, requires_grad=True)
    w = tg.tensor(2.0, dtype=tg.float64, requires_grad=True)
    y = x * w
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float64
    np.testing.assert_allclose(w.grad.numpy(), x.detach().numpy().sum(), rtol=1e-6)
