"""The walk's guarantees: a wrong gradient cannot pass silently, and nothing backward reads
can be changed behind its back."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad.autograd import Op


class SumAll(Op):
    """A deliberately wrong op: backward returns the upstream sum (a scalar) instead of g."""

    def forward(self, x):
        return x * 2

    def backward(self, g):
        return g.sum()


class WrongShape(Op):
    def forward(self, x):
        return x.copy()

    def backward(self, g):
        return g[:1]


class TooFew(Op):
    def forward(self, x, y):
        return x + y

    def backward(self, g):
        return g  # one gradient for two inputs


class WrongDtype(Op):
    def forward(self, x):
        return x.copy()

    def backward(self, g):
        return g.astype(np.float64)


@pytest.mark.parametrize(
    "fn, match",
    [
        (
            lambda x: SumAll.apply(x),
            r"SumAll.backward returned a gradient of shape \(\) for input 0 "
            r"of shape \(2, 3\)",
        ),
        (
            lambda x: WrongShape.apply(x),
            r"WrongShape.backward returned a gradient of shape \(1, 3\)",
        ),
        (lambda x: TooFew.apply(x, x), r"TooFew.backward returned 1 gradients for 2 inputs"),
        (
            lambda x: WrongDtype.apply(x),
            r"WrongDtype.backward returned a float64 gradient for input "
            r"0 of dtype float32",
        ),
    ],
)
def test_a_wrong_backward_raises_naming_the_op(fn, match):
    x = tg.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=match):
        fn(x).sum().backward()
    assert x.grad is None  # nothing was silently broadcast into .grad


def test_the_sum_bug_from_the_issue_no_longer_gives_12():
    # before the contract, g.sum() was broadcast into .grad: 12 instead of 2 per element
    x = tg.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="SumAll"):
        SumAll.apply(x).sum().backward()


def test_embedding_ids_changed_after_the_op_cannot_misroute_the_gradient():
    w = tg.randn(5, 3, requires_grad=True)
    ids = np.array([0, 1])
    out = F.embedding(ids, w)
    ids[:] = 4  # the caller reuses its array
    out.sum().backward()
    want = np.zeros((5, 3), np.float32)
    want[[0, 1]] = 1
    np.testing.assert_array_equal(w.grad.numpy(), want)


def test_embedding_id_tensor_changed_in_place_cannot_misroute_the_gradient():
    w = tg.randn(5, 3, requires_grad=True)
    ids = tg.tensor([0, 1])
    out = w[ids]
    ids[0] = 4
    out.sum().backward()
    assert w.grad.numpy()[[0, 1]].sum() == 6 and w.grad.numpy()[4].sum() == 0


def test_masked_fill_mask_changed_after_the_op():
    x = tg.randn(2, 3, requires_grad=True)
    mask = np.array([[True, False, False], [False, False, True]])
    y = x.masked_fill(mask, 0.0)
    mask[:] = False
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.where(mask | [[1, 0, 0], [0, 0, 1]], 0, 1))


def test_where_condition_changed_after_the_op():
    x, y = tg.randn(4, requires_grad=True), tg.randn(4, requires_grad=True)
    cond = np.array([True, False, True, False])
    out = tg.where(tg.tensor(cond), x, y)
    cond[:] = True
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1, 0, 1, 0])


def test_saved_tensor_changed_in_place_raises_naming_the_op():
    x = tg.randn(3, requires_grad=True)
    h = x * 1.0
    y = h.exp()  # saves its output
    with tg.no_grad():
        y += 1
    with pytest.raises(RuntimeError, match="backward of Exp was modified in place"):
        y.sum().backward()


def test_scalar_multiply_saves_nothing_that_later_changes():
    # d * 2 only needs the 2: changing d afterwards is fine (PyTorch agrees)
    x = tg.randn(3, requires_grad=True)
    d = x * 1.0
    d2 = d * 2
    with tg.no_grad():
        d += 5
    d2.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2, 2, 2])


def test_mixed_int_float_multiply_stays_float32():
    x = tg.randn(2, 3, requires_grad=True)
    y = x * x.argmax(dim=1, keepdim=True)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


def test_import_changes_nothing_process_wide():
    import subprocess
    import sys

    code = "import ctypes, tensorgrad, tensorgrad.devices as b; print(hasattr(b, 'MALLOC_TUNED'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
    code = "import sys, tensorgrad; print(any(m.startswith(('cupy', 'gpt')) for m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_tensorgrad_never_mentions_gpt():
    from pathlib import Path

    root = Path(tg.__file__).parent
    for f in root.rglob("*.py"):
        text = f.read_text()
        assert "import gpt" not in text and "from gpt" not in text, f


@pytest.mark.parametrize(
    "call, err, match",
    [
        (
            lambda x: x.split(2, dim=5),
            IndexError,
            r"split: Dimension out of range \(expected to be in range of \[-2, 1\], but got 5\)",
        ),
        (lambda x: x.transpose(0, 3), IndexError, r"transpose: Dimension out of range"),
        (lambda x: F.softmax(x, dim=2), IndexError, r"softmax: Dimension out of range"),
        (lambda x: tg.stack([x, x], dim=4), IndexError, r"stack: Dimension out of range"),
        (lambda x: x.unsqueeze(3), IndexError, r"unsqueeze: Dimension out of range"),
        (
            lambda x: F.layer_norm(x, 4, weight=tg.ones(3)),
            ValueError,
            r"layer_norm: weight of shape \(3,\) does not match normalized_shape \(4,\)",
        ),
        (lambda x: x.permute(0, 0), ValueError, r"permute"),
    ],
)
def test_bad_dims_and_shapes_name_the_op(call, err, match):
    with pytest.raises(err, match=match):
        call(tg.ones(3, 4))


# ----------------------------------------------------------------------------- .grad in place
# A second gradient is added into .grad in place when nothing else holds that array (as in
# PyTorch), else into a new array: every way of holding it must keep its own value.


def test_grad_accumulates_in_place_only_when_nobody_else_holds_it():
    x = tg.ones(3, requires_grad=True)
    (x * 2).sum().backward()
    held_tensor = x.grad
    (x * 2).sum().backward()
    assert held_tensor is x.grad and x.grad.numpy().tolist() == [4.0] * 3  # PyTorch's way

    held_array = x.grad.numpy()  # the array itself: must not change under the caller
    view = x.grad.array[:2]
    (x * 2).sum().backward()
    assert held_array.tolist() == [4.0] * 3 and view.tolist() == [4.0] * 2
    assert x.grad.numpy().tolist() == [6.0] * 3


def test_leaves_sharing_one_gradient_array_stay_apart():
    a, b = tg.ones(3, requires_grad=True), tg.ones(3, requires_grad=True)
    (a + b).sum().backward()  # Add hands both leaves the same array
    (a + b).sum().backward()
    (a * 3).sum().backward()
    assert a.grad.numpy().tolist() == [5.0] * 3 and b.grad.numpy().tolist() == [2.0] * 3


def test_a_grad_that_views_another_leafs_grad_is_not_added_into_in_place():
    x, w = tg.ones(6, requires_grad=True), tg.ones(2, 3, requires_grad=True)
    ((x.reshape(2, 3) + w) * tg.full((2, 3), 2.0)).sum().backward()
    assert x.grad.array.base is w.grad.array  # Add gave both the same array, Reshape a view
    (x * 1).sum().backward()
    assert x.grad.numpy().tolist() == [3.0] * 6
    assert w.grad.numpy().tolist() == [[2.0] * 3] * 2


def test_one_backward_with_a_view_shared_by_two_leaves():
    a, x = tg.zeros(6, requires_grad=True), tg.zeros(2, 3, requires_grad=True)
    ((x * 3).sum() + ((a + x.reshape(6)) * 2).sum()).backward()
    assert a.grad.numpy().tolist() == [2.0] * 6
    assert x.grad.numpy().tolist() == [[5.0] * 3] * 2


def test_the_callers_seed_array_is_never_written():
    x = tg.zeros(3, requires_grad=True)
    seeds = np.ones((2, 3), np.float32)
    x.backward(seeds[0])
    x.backward(seeds[0])
    (x + 1).backward(seeds[1])
    assert seeds.tolist() == [[1.0] * 3] * 2 and x.grad.numpy().tolist() == [3.0] * 3
    buf = np.zeros(6, np.float32)
    p = tg.zeros(3, requires_grad=True)
    p.grad = tg.tensor(buf[:3])  # a user-set .grad wrapping a view of the user's buffer
    (p * 1).sum().backward()
    assert buf.tolist() == [0.0] * 6 and p.grad.numpy().tolist() == [1.0] * 3


def test_a_grad_saved_by_another_graph_is_not_changed_under_it():
    x, w = tg.ones(3, requires_grad=True), tg.ones(3, requires_grad=True)
    (x * 2).sum().backward()
    h = (x.grad * w).sum()  # Mul saves x.grad's array for w's gradient
    (x * 5).sum().backward()
    h.backward()
    assert x.grad.numpy().tolist() == [7.0] * 3
    assert w.grad.numpy().tolist() == [2.0] * 3  # the value x.grad had when h was built


def test_tied_weight_gradient_sums_both_uses():
    g = np.random.default_rng(0)
    w = tg.tensor(g.standard_normal((6, 4)).astype(np.float32), requires_grad=True)
    ids = np.array([[0, 2, 2, 5]])
    logits = F.embedding(tg.tensor(ids), w) @ w.T  # (1, 4, 6): w used twice
    up = g.standard_normal((1, 4, 6)).astype(np.float32)
    logits.backward(tg.tensor(up))
    h = w.detach().numpy()[ids]  # (1, 4, 4)
    want = np.einsum("btv,btc->vc", up, h)  # through the unembedding
    np.add.at(
        want, ids.reshape(-1), (up @ w.detach().numpy()).reshape(-1, 4)
    )  # through the embedding
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-5, atol=1e-5)
