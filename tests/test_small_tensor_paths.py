"""The short cuts small tensors take keep the general path's results and errors: in-place
arithmetic written straight into a tensor's memory, the tape's saved-array guard, scalar
operands that need no gradient, and the memory-overlap test. (Speed is measured by
``python -m benchmarks.small``, never here.)"""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.devices import shares_memory


def _leaf(shape=(3, 4), seed=0, dtype=np.float32):
    g = np.random.default_rng(seed)
    return tg.tensor(g.standard_normal(shape).astype(dtype), requires_grad=True)


# ----------------------------------------------------------------------------- in place
@pytest.mark.parametrize("op", ["+=", "-=", "*=", "/="])
@pytest.mark.parametrize("other", ["tensor", "float", "int"])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_inplace_arithmetic_matches_out_of_place(op, other, grad_mode):
    a = _leaf().detach()
    b = {"tensor": _leaf(seed=1).detach(), "float": 0.25, "int": 3}[other]
    want = {"+=": a + b, "-=": a - b, "*=": a * b, "/=": a / b}[op].numpy()
    arr, version = a.array, a._version[0]
    with tg.set_grad_enabled(grad_mode):
        if op == "+=":
            a += b
        elif op == "-=":
            a -= b
        elif op == "*=":
            a *= b
        else:
            a /= b
    assert a.array is arr and a.dtype == tg.float32  # written into its own memory
    assert a._version[0] == version + 1
    np.testing.assert_array_equal(a.numpy(), want)


def test_manual_sgd_step_updates_the_parameter_and_its_version():
    # the lectures' update, with and without no_grad: p.data += -lr * p.grad
    for guard in (tg.no_grad, tg.enable_grad):
        p = _leaf()
        (p * p).sum().backward()
        before, v = p.detach().numpy().copy(), p._version[0]
        with guard():
            p.data += -0.1 * p.grad
        np.testing.assert_allclose(p.detach().numpy(), before - 0.1 * 2 * before, rtol=1e-6)
        # .data has a version counter of its own, as in PyTorch: p's is untouched
        assert p._version[0] == v and p.requires_grad and p.is_leaf


def test_inplace_through_a_view_writes_the_base():
    base = _leaf().detach()
    row = base[1]
    row += 1.0
    np.testing.assert_array_equal(base.numpy()[1], row.numpy())


def test_inplace_that_promotes_or_broadcasts_keeps_the_general_rules():
    a = tg.ones(2, 3)
    a += tg.tensor(np.full((2, 3), 0.5))  # float64 operand: computed in float64, stored float32
    assert a.dtype == tg.float32
    np.testing.assert_array_equal(a.numpy(), np.full((2, 3), 1.5, np.float32))
    a += tg.tensor([1.0, 2.0, 3.0])  # broadcast into a
    np.testing.assert_array_equal(a.numpy()[1], [2.5, 3.5, 4.5])
    i = tg.zeros(3, dtype=tg.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        i += 0.5
    with pytest.raises(RuntimeError, match="does not fit"):
        a += tg.ones(4, 2, 3)


def test_inplace_arithmetic_is_shown_to_op_observers():
    seen = []
    a = tg.ones(3)
    with tg.autograd.record_ops(lambda cls, *rest: seen.append(cls.__name__)):
        a += 1.0
    assert seen == ["Add"] and a.tolist() == [2.0, 2.0, 2.0]


def test_inplace_on_a_leaf_that_requires_grad_still_raises():
    p = _leaf()
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        p += 1.0


def test_inplace_on_a_recorded_tensor_still_records():
    x = _leaf()
    y = x * 2
    y += x  # recorded: y = 2x + x
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 3, np.float32))


def test_inplace_after_save_still_fails_the_backward():
    x = _leaf()
    y = x.tanh()  # saves its output
    with tg.no_grad():
        y += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()


# ----------------------------------------------------------------------------- the tape
def test_constant_operand_of_add_and_sub_gets_no_gradient_and_the_tensor_its_own():
    x = _leaf()
    for f, sign in ((lambda t: t + 0.5, 1), (lambda t: 0.5 - t, -1), (lambda t: t - 2, 1)):
        x.grad = None
        f(x).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), sign, np.float32))


def test_broadcast_add_reduces_the_gradient_and_bad_shapes_name_the_op():
    x, b = _leaf((5, 4)), _leaf((4,), seed=2)
    (x + b).sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 5, np.float32))
    with pytest.raises(ValueError, match="add: shapes"):
        x + _leaf((3,))


class _Scale(tg.autograd.Op):
    """x * m with m saved as given: a plain array input kept for backward."""

    def forward(self, x, m):
        self.save(m)
        return x * m

    def backward(self, g):
        (m,) = self.saved
        return g * m, None


def test_saved_plain_array_input_is_copied():
    mask = np.array([1.0, 0.0, 2.0], np.float32)
    x = _leaf((3,))
    y = _Scale.apply(x, mask)
    mask[:] = 7.0  # nothing would notice: the op must have kept a copy
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 2.0])


def test_saved_view_of_a_tensor_written_in_place_fails_the_backward():
    v = _leaf((2, 3)) * 1.0
    w = v[0]  # a view of v
    out = (w * w).sum()  # saves w's array, which shares v's memory
    with tg.no_grad():
        v[0, 0] = 5.0
    with pytest.raises(RuntimeError, match="modified in place"):
        out.backward()


def test_gradient_contract_still_checked_on_every_node():
    class Bad(tg.autograd.Op):
        def forward(self, x):
            return x * 2

        def backward(self, g):
            return g[:1]

    with pytest.raises(RuntimeError, match="shape"):
        Bad.apply(_leaf()).sum().backward()


# ----------------------------------------------------------------------------- helpers
def test_shares_memory():
    a, b = np.zeros(6), np.zeros(6)
    assert shares_memory(a, a) and not shares_memory(a, b)
    assert shares_memory(a[2:], a) and shares_memory(a, a.reshape(2, 3))
    assert not shares_memory(a[:3], a[3:])


def test_dtype_kind_and_identity():
    assert tg.float32.kind == "f" and tg.int64.kind == "i" and tg.bool.kind == "b"
    assert tg.ones(2).dtype is tg.float32 and tg.ones(2).dtype == np.float32


def test_numba_thread_count_is_restored_around_a_kernel():
    numba = pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    cpu_numba = pytest.importorskip(
        "tensorgrad.kernels.cpu_numba", reason="numba is not installed: pip install numba"
    )
    before = numba.get_num_threads()
    with cpu_numba.threads_for(10):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
