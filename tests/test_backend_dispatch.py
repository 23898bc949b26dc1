"""Every op dispatches on its inputs' array module: checked on CPU with a recording fake.

``FakeArray`` wraps a NumPy array but is no ndarray: ``__array__`` raises and NumPy ufuncs
and functions refuse it, so any op that calls ``numpy.`` on tensor data (instead of ``xp.``)
fails loudly. ``FakeXP`` is the module handed out as ``xp`` for it (registered as the
'cuda' device through ``devices.register_array_module``), like CuPy it refuses NumPy arrays
mixed into its functions, and it records each call. Forward and backward of every op, a
tiny GPT training step and an AdamW step run through it and must match the NumPy run.
Also here: the device API without CuPy (import, error message, moves, checkpoints).
"""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import devices, nn

# ----------------------------------------------------------------------------- the fake


def _unwrap(x):
    if isinstance(x, FakeArray):
        return x.a
    if isinstance(x, np.ndarray):
        raise TypeError("a NumPy array was mixed into a fake-device operation (CuPy refuses it)")
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    if isinstance(x, list):
        return [_unwrap(v) for v in x]
    return x


def _wrap(r):
    if isinstance(r, np.ndarray):
        return FakeArray(r)
    if isinstance(r, np.generic):  # CuPy reductions give 0-d arrays, not scalars
        return FakeArray(np.asarray(r))
    if isinstance(r, (tuple, list)):
        return type(r)(_wrap(v) for v in r)
    return r


def _call(fn, args, kwargs):
    return _wrap(fn(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))


class NumpyTouched(RuntimeError):
    """NumPy read a FakeArray's data: some op called numpy on tensor data instead of xp."""


class FakeArray:
    """A device array stand-in that delegates to an inner NumPy array."""

    __slots__ = ("a",)
    __array_ufunc__ = None  # np.exp(fake) raises TypeError

    def __init__(self, a: np.ndarray):
        self.a = a

    def __array__(self, *args, **kwargs):
        # not a TypeError: NumPy would swallow that and read the array as a sequence
        raise NumpyTouched("NumPy touched a FakeArray directly: an op bypassed xp")

    def __array_function__(self, func, types, args, kwargs):
        return NotImplemented  # np.concatenate([fake]) raises TypeError

    def get(self):
        return self.a.copy()  # the device -> host copy

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__ & co: NumPy must not see the data
            raise AttributeError(name)
        attr = getattr(self.a, name)
        if callable(attr):
            return lambda *args, **kwargs: _call(attr, args, kwargs)
        return _wrap(attr)

    def __repr__(self):
        return f"FakeArray({self.a!r})"

    def __len__(self):
        return len(self.a)

    def __iter__(self):
        return (FakeArray(r) if isinstance(r, np.ndarray) else _wrap(r) for r in self.a)

    def __getitem__(self, key):
        return _wrap(self.a[_unwrap(key)])

    def __setitem__(self, key, value):
        self.a[_unwrap(key)] = _unwrap(value)

    def __bool__(self):
        return bool(self.a)

    def __int__(self):
        return int(self.a)

    def __float__(self):
        return float(self.a)

    def __index__(self):
        return self.a.__index__()

    __hash__ = None


def _binop(name):
    op = getattr(np.ndarray, name)
    return lambda self, other: _wrap(op(self.a, _unwrap(other)))


def _inplace(name):
    op = getattr(np.ndarray, name)

    def f(self, other):
        op(self.a, _unwrap(other))
        return self

    return f


for _n in ("add", "sub", "mul", "truediv", "pow", "matmul", "and", "or", "xor", "mod", "floordiv"):
    setattr(FakeArray, f"__{_n}__", _binop(f"__{_n}__"))
    setattr(FakeArray, f"__r{_n}__", _binop(f"__r{_n}__"))
    setattr(FakeArray, f"__i{_n}__", _inplace(f"__i{_n}__"))
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(FakeArray, f"__{_n}__", _binop(f"__{_n}__"))


def _unary(name):
    op = getattr(np.ndarray, name)
    return lambda self: _wrap(op(self.a))


for _n in ("neg", "pos", "abs", "invert"):
    setattr(FakeArray, f"__{_n}__", _unary(f"__{_n}__"))


class _Recorded:
    """A NumPy function or ufunc that records its calls (ufunc methods as 'add.at')."""

    def __init__(self, xp, name, fn):
        self.xp, self.name, self.fn = xp, name, fn

    def __call__(self, *args, **kwargs):
        self.xp.calls[self.name] += 1
        return _call(self.fn, args, kwargs)

    def __getattr__(self, method):  # add.at, add.reduceat, maximum.accumulate, ...
        fn = getattr(self.fn, method)
        return _Recorded(self.xp, f"{self.name}.{method}", fn)


class _FakeGenerator:
    def __init__(self, xp, bitgen):
        self.xp, self.g = xp, np.random.Generator(bitgen)

    def __getattr__(self, name):
        self.xp.calls[f"random.{name}"] += 1
        fn = getattr(self.g, name)
        return lambda *args, **kwargs: _call(fn, args, kwargs)


class FakeXP:
    """The stand-in array module: the CuPy functions tensorgrad uses, each one recorded."""

    __name__ = "fakexp"
    FUNCTIONS = frozenset(
        {
            "abs",
            "add",
            "arange",
            "argmax",
            "argmin",
            "argsort",
            "ascontiguousarray",
            "broadcast_to",
            "clip",
            "concatenate",
            "copyto",
            "cumsum",
            "divide",
            "einsum",
            "empty",
            "empty_like",
            "exp",
            "flatnonzero",
            "flip",
            "minimum",
            "pad",
            "reshape",
            "sum",
            "swapaxes",
            "take_along_axis",
            "transpose",
            "full",
            "isfinite",
            "log",
            "maximum",
            "may_share_memory",
            "mean",
            "moveaxis",
            "multiply",
            "ones",
            "ones_like",
            "sign",
            "split",
            "sqrt",
            "stack",
            "subtract",
            "tanh",
            "tril",
            "triu",
            "trunc",
            "where",
            "zeros",
            "zeros_like",
        }
    )  # errstate is left out on purpose: code must not rely on it (CuPy has none)
    CONSTANTS = frozenset(
        {
            "inf",
            "nan",
            "pi",
            "newaxis",
            "float32",
            "float64",
            "int32",
            "int64",
            "bool_",
            "uint8",
            "float16",
        }
    )
    ndarray = FakeArray

    def __init__(self):
        self.calls = collections.Counter()
        xp = self

        class random:
            @staticmethod
            def XORWOW(seed):
                return np.random.PCG64(seed)

            @staticmethod
            def Generator(bitgen):
                return _FakeGenerator(xp, bitgen)

        self.random = random

    def asarray(self, a, dtype=None):
        self.calls["asarray"] += 1
        if isinstance(a, FakeArray):
            return a if dtype is None else FakeArray(a.a.astype(dtype, copy=False))
        return FakeArray(np.array(a, dtype=dtype))  # host -> device copy

    def __getattr__(self, name):
        if name in self.FUNCTIONS:
            return _Recorded(self, name, getattr(np, name))
        if name in self.CONSTANTS:
            return getattr(np, name)
        raise AttributeError(f"fake xp has no {name!r} (CuPy may not either): add it knowingly")


@pytest.fixture
def fake():
    xp = FakeXP()
    unregister = devices.register_array_module(FakeArray, xp, "cuda")
    try:
        yield xp
    finally:
        unregister()


def on(device, a, grad=False):
    a = np.asarray(a)
    return tg.tensor(a.copy(), dtype=a.dtype, device=device, requires_grad=grad)


# ----------------------------------------------------------------------------- the fake itself


def test_fake_refuses_numpy(fake):
    x = FakeArray(np.ones(3))
    with pytest.raises(TypeError):
        np.exp(x)
    with pytest.raises(NumpyTouched):
        np.asarray(x)
    with pytest.raises((TypeError, NumpyTouched)):
        np.concatenate([x, x])
    with pytest.raises(NumpyTouched):
        np.zeros(3) + np.asarray(x)
    with pytest.raises(TypeError):
        fake.where(x > 0, x, np.zeros(3))
    assert devices.get_array_module(x) is fake and devices.device_of(x) == "cuda"


# ----------------------------------------------------------------------------- every op

rng = np.random.default_rng(0)


def R(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# name, function of tensors, input arrays, xp calls that must have happened
CASES = [
    ("add", lambda a, b: a + b, [R(2, 3), R(3)], []),
    ("sub", lambda a, b: a - b, [R(2, 3), R(2, 1)], []),
    ("mul", lambda a, b: a * b * 2.0, [R(2, 3), R(1, 3)], []),
    ("div", lambda a, b: a / b, [R(2, 3), R(2, 3, lo=0.5)], []),
    ("pow", lambda a, b: a**b, [R(2, 3, lo=0.5), R(2, 3)], ["log", "where"]),
    ("pow_scalar", lambda a: a**3, [R(4)], []),
    ("rpow", lambda a: 2.0**a, [R(4)], ["log"]),
    ("neg", lambda a: -a, [R(3)], []),
    ("exp", lambda a: a.exp(), [R(3)], ["exp"]),
    ("log", lambda a: a.log(), [R(3, lo=0.5)], ["log"]),
    ("sqrt", lambda a: a.sqrt(), [R(3, lo=0.5)], ["sqrt"]),
    ("tanh", lambda a: a.tanh(), [R(3)], ["tanh"]),
    ("abs", lambda a: a.abs(), [R(3)], ["abs", "sign"]),
    ("relu", lambda a: a.relu(), [R(3)], ["maximum"]),
    ("sigmoid", lambda a: a.sigmoid(), [R(3)], []),
    ("where", lambda a, b: tg.where(a > 0, a, b), [R(2, 3), R(3)], ["where", "sum"]),
    ("where_scalar", lambda a: tg.where(a > 0, a, 0.0), [R(2, 3)], ["where"]),
    ("masked_fill", lambda a: a.masked_fill(a > 0.5, -1.0), [R(2, 3)], ["where", "asarray"]),
    ("cast", lambda a: a.double().sum(dim=0), [R(2, 3)], []),
    ("sum", lambda a: a.sum(dim=1), [R(2, 3)], ["broadcast_to"]),
    ("mean", lambda a: a.mean(dim=(0, 1)), [R(2, 3)], ["broadcast_to"]),
    ("var", lambda a: a.var(dim=1), [R(2, 3)], []),
    ("max", lambda a: a.amax(dim=1), [R(2, 3)], []),
    ("argmax", lambda a: a * a.argmax(dim=1, keepdim=True), [R(2, 3)], ["argmax"]),
    ("reshape", lambda a: a.view(3, 2).T, [R(2, 3)], []),
    ("expand", lambda a: a.expand(4, 3), [R(1, 3)], ["broadcast_to"]),
    ("contiguous", lambda a: a.T.contiguous(), [R(2, 3)], ["ascontiguousarray"]),
    ("getitem_basic", lambda a: a[1:, ::2], [R(3, 4)], ["zeros"]),
    ("getitem_int_array", lambda a: a[[0, 2, 0]], [R(3, 4)], ["add.at"]),
    ("getitem_tensor_index", lambda a, i: a[i], [R(3, 4), np.array([2, 2, 1])], ["add.at"]),
    ("cat", lambda a, b: tg.cat([a, b], dim=1), [R(2, 3), R(2, 1)], ["concatenate", "split"]),
    ("stack", lambda a, b: tg.stack([a, b], dim=1), [R(2, 3), R(2, 3)], ["stack", "moveaxis"]),
    ("split", lambda a: a.split(2, dim=1)[1] * 2, [R(2, 5)], ["split", "concatenate"]),
    ("matmul", lambda a, b: a @ b, [R(2, 3, 4), R(4, 5)], []),
    ("matvec", lambda a, b: a @ b, [R(3, 4), R(4)], []),
    ("linear", lambda a, w, b: F.linear(a, w, b), [R(2, 3, 4), R(5, 4), R(5)], []),
    ("softmax", lambda a: F.softmax(a, dim=-1), [R(2, 5)], ["exp"]),
    ("log_softmax", lambda a: F.log_softmax(a, dim=0), [R(2, 5)], ["exp", "log"]),
    (
        "cross_entropy",
        lambda a, t: F.cross_entropy(a, t, ignore_index=1),
        [R(4, 6), np.array([0, 1, 5, 2])],
        ["where", "arange", "log", "exp"],
    ),
    (
        "cross_entropy_none",
        lambda a, t: F.cross_entropy(a, t, reduction="none"),
        [R(2, 6, 3), np.array([[0, 1, 5], [2, 2, 0]])],
        ["where"],
    ),
    ("layer_norm", lambda a, w, b: F.layer_norm(a, 4, w, b), [R(2, 3, 4), R(4), R(4)], ["sqrt"]),
    ("gelu_tanh", lambda a: F.gelu(a, "tanh"), [R(2, 5)], ["tanh"]),
    ("gelu_erf", lambda a: F.gelu(a), [R(2, 5)], ["exp", "where"]),
    (
        "embedding",
        lambda w, i: F.embedding(i, w),
        [R(5, 3), np.array([[0, 4, 0], [1, 1, 2]])],
        ["zeros", "add.at"],
    ),
    (
        "attention",
        causal_sdpa,
        [R(2, 2, 5, 4), R(2, 2, 5, 4), R(2, 2, 5, 4)],
        ["tril", "where", "isfinite", "exp"],
    ),
    (
        "attention_mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [R(1, 3, 4), R(1, 6, 4), R(1, 6, 4), rng.random((3, 6)) > 0.3],
        ["where"],
    ),
    (
        "attention_additive",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
        [R(2, 3, 4), R(2, 3, 4), R(2, 3, 4), R(3, 3)],
        ["exp"],
    ),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), [R(2, 3)], ["maximum", "minimum"]),
    (
        "maximum",
        lambda a, b: tg.maximum(a, b) + tg.minimum(a, b) * 2,
        [R(2, 3), R(3)],
        ["maximum", "minimum"],
    ),
    (
        "gather",
        lambda a, i: a.gather(1, i),
        [R(2, 3), np.array([[0, 2, 2], [1, 1, 0]])],
        ["take_along_axis", "add.at"],
    ),
    (
        "scatter_add",
        lambda a, s, i: a.scatter_add(1, i, s),
        [R(2, 3), R(2, 3), np.array([[0, 2, 2], [1, 1, 0]])],
        ["add.at", "take_along_axis"],
    ),
    ("sort_topk", lambda a: a.sort(dim=1)[0] + a.topk(3, dim=1)[0], [R(2, 3)], ["argsort"]),
    ("cumsum", lambda a: a.cumsum(1), [R(2, 3)], ["cumsum", "flip"]),
    ("einsum", lambda a, b: tg.einsum("ij,kj->ik", a, b), [R(2, 3), R(4, 3)], ["einsum"]),
    ("pad", lambda a: F.pad(a, (1, 2, 0, 1), value=0.5), [R(2, 3)], ["pad"]),
    ("silu_mse", lambda a, b: F.silu(a) + F.mse_loss(a, b), [R(2, 3), R(2, 3)], []),
    ("clone_norm", lambda a: a.clone() * a.norm(dim=1, keepdim=True), [R(2, 3)], ["sqrt"]),
    (
        "label_smoothing",
        lambda a, t: F.cross_entropy(a, t, label_smoothing=0.1),
        [R(4, 6), np.array([0, 1, 5, 2])],
        ["exp", "log"],
    ),
]


@pytest.mark.parametrize("name, fn, arrays, expect", CASES, ids=[c[0] for c in CASES])
def test_op_runs_through_the_array_module(fake, name, fn, arrays, expect):
    outs, grads = {}, {}
    for dev in ("cpu", "cuda"):
        ts = [on(dev, a, grad=a.dtype.kind == "f") for a in arrays]
        out = fn(*ts)
        w = on(dev, np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype))
        (out * w).sum().backward()
        assert out.device == dev, f"{name}: output on {out.device}, expected {dev}"
        outs[dev] = out.detach().numpy()
        grads[dev] = [t.grad.numpy() if t.grad is not None else None for t in ts]
    np.testing.assert_allclose(outs["cuda"], outs["cpu"], rtol=1e-6, atol=1e-6, err_msg=name)
    for i, (gc, gf) in enumerate(zip(grads["cpu"], grads["cuda"])):
        if gc is None:
            assert gf is None, f"{name}: input {i} got a gradient on the fake device only"
        else:
            np.testing.assert_allclose(gf, gc, rtol=1e-5, atol=1e-6, err_msg=f"{name} grad {i}")
    missing = [c for c in expect if not fake.calls[c]]
    assert not missing, f"{name}: expected xp calls {missing}; recorded {dict(fake.calls)}"


def test_dropout_uses_the_device_generator(fake):
    x = on("cuda", np.ones((50, 40), np.float32), grad=True)
    tg.manual_seed(3)
    y1 = F.dropout(x, 0.25)
    tg.manual_seed(3)
    y2 = F.dropout(x, 0.25)
    y1.sum().backward()
    a = y1.detach().numpy()
    assert fake.calls["random.random"] == 2
    np.testing.assert_array_equal(a, y2.detach().numpy())  # a seed repeats the device run
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.6 < (a > 0).mean() < 0.9
    np.testing.assert_array_equal(x.grad.numpy(), a)


def test_sampling_and_in_place_fills_stay_on_the_device(fake):
    tg.manual_seed(0)
    p = tg.softmax(on("cuda", R(3, 6)), dim=-1)
    for repl in (True, False):
        ids = tg.multinomial(p, 2, replacement=repl)
        assert ids.device == "cuda" and ids.shape == (3, 2) and isinstance(ids.array, FakeArray)
    v, i = tg.topk(p, 2)
    assert v.device == "cuda" and i.device == "cuda"
    w = tg.zeros(4, 5, device="cuda")
    for fill in (
        lambda: nn.init.normal_(w),
        lambda: nn.init.xavier_uniform_(w),
        lambda: nn.init.trunc_normal_(w, std=0.02),
        lambda: w.copy_(np.ones((4, 5))),
        lambda: w.masked_fill_(w > 0, 0.0),
        lambda: w.zero_(),
    ):
        fill()
        assert isinstance(w.array, FakeArray)
    for t in (
        tg.randn_like(w),
        tg.rand_like(w),
        tg.full_like(w, 2),
        tg.randint(3, (2,), device="cuda"),
    ):
        assert t.device == "cuda"


def test_module_to_moves_buffers_and_load_returns_device_tensors(fake, tmp_path):
    m = nn.Linear(3, 2)
    m.register_buffer("mask", tg.tril(tg.ones(2, 2)))
    m.to("cuda")
    assert m.mask.device == "cuda" and m.weight.device == "cuda"
    assert all(t.device == "cuda" for t in m.state_dict().values())
    tg.save(m.state_dict(), tmp_path / "m.safetensors")  # device tensors are written from host
    back = tg.load(tmp_path / "m.safetensors", map_location="cuda")
    assert back["mask"].device == "cuda"
    np.testing.assert_array_equal(back["mask"].detach().numpy(), np.tril(np.ones((2, 2))))


def test_factories_and_moves(fake):
    for t in (
        tg.zeros(2, 3, device="cuda"),
        tg.ones(2, device="cuda"),
        tg.full((2,), 7.0, device="cuda"),
        tg.arange(4, device="cuda"),
        tg.randn(3, device="cuda"),
        tg.rand(3, device="cuda"),
        tg.randint(0, 5, (3,), device="cuda"),
        tg.tensor([1.0, 2.0], device="cuda"),
        tg.tril(tg.ones(3, 3, device="cuda")),
        tg.zeros_like(tg.ones(2, device="cuda")),
    ):
        assert t.device == "cuda" and isinstance(t.array, FakeArray)
    x = tg.randn(2, 3, requires_grad=True)
    y = x.to("cuda")
    assert (y.device, x.device) == ("cuda", "cpu") and y.cuda() is y
    assert isinstance(y.detach().numpy(), np.ndarray) and not isinstance(y.array, np.ndarray)
    np.testing.assert_array_equal(y.detach().numpy(), x.detach().numpy())
    (y.cpu() * 2).sum().backward()  # differentiable both ways
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0, np.float32))
    lin = nn.Linear(3, 2).to("cuda")
    assert all(p.device == "cuda" for p in lin.parameters())
    assert lin(tg.ones(4, 3, device="cuda")).device == "cuda"
    assert "device='cuda:0'" in repr(y)


def test_mixing_devices_names_both(fake):
    a, b = tg.ones(3), tg.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match="cuda and cpu|cpu and cuda"):
        a + b
    logits = tg.zeros(2, 4, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="crossentropy: .*cuda and cpu"):
        F.cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(RuntimeError, match="cpu"):
        tg.cat([a, b])


# ----------------------------------------------------------------------------- GPT and AdamW


def comparable(name: str, a: np.ndarray) -> np.ndarray:
    """A parameter without the entries two devices may legitimately disagree on after AdamW.

    The key third of c_attn.bias has an exactly zero gradient (softmax ignores a constant
    added to one query's scores), so its computed gradient is rounding noise, which AdamW
    normalises into steps of up to ±lr that differ between any two summation orders.
    """
    if name.endswith("attn.c_attn.bias"):
        C = a.shape[0] // 3
        return np.concatenate([a[:C], a[2 * C :]])
    return a


def _tiny_step(device, doc_sep=None):
    from gpt.config import GPTConfig
    from gpt.model import GPT
    from gpt.optim import clip_grad_norm_

    tg.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny"))
    model.to(device)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    data = np.random.default_rng(5).integers(0, 32, size=(3, 9))
    x = devices.to_device(data[:, :-1], device)
    y = devices.to_device(data[:, 1:], device)
    losses = []
    for _ in range(2):
        _, loss = model(x, y, doc_sep=doc_sep)
        opt.zero_grad()
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("doc_sep", [None, 3])
def test_tiny_gpt_training_step(fake, doc_sep):
    cpu_model, cpu_losses = _tiny_step("cpu", doc_sep)
    fake.calls.clear()
    dev_model, dev_losses = _tiny_step("cuda", doc_sep)
    np.testing.assert_allclose(dev_losses, cpu_losses, rtol=1e-6)
    for (n, p), (_, q) in zip(cpu_model.named_parameters(), dev_model.named_parameters()):
        assert isinstance(q.array, FakeArray), n
        np.testing.assert_allclose(
            comparable(n, q.detach().numpy()),
            comparable(n, p.detach().numpy()),
            rtol=1e-5,
            atol=1e-5,
            err_msg=n,
        )
    for c in ("exp", "sqrt", "tanh", "add.at", "where", "split", "zeros_like"):
        assert fake.calls[c], f"{c} was not called through xp: {dict(fake.calls)}"
    out = dev_model.generate(np.array([[1, 2, 3]]), 4, temperature=0)
    np.testing.assert_array_equal(out, cpu_model.generate(np.array([[1, 2, 3]]), 4, temperature=0))


def test_checkpoints_cross_devices(fake, tmp_path):
    from gpt.config import GPTConfig
    from gpt.model import GPT
    from gpt.store.checkpoint import load_arrays, save_arrays

    dev_model, _ = _tiny_step("cuda")
    save_arrays(tmp_path / "m.safetensors", dev_model.state_dict())
    cpu_model = GPT(GPTConfig.from_preset("tiny"))
    cpu_model.load_state_dict(load_arrays(tmp_path / "m.safetensors"))
    for (n, p), (_, q) in zip(cpu_model.named_parameters(), dev_model.named_parameters()):
        assert p.device == "cpu"
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=n)
    back = GPT(GPTConfig.from_preset("tiny")).to("cuda")
    back.load_state_dict(cpu_model.state_dict())  # host arrays land on the param's device
    assert all(isinstance(p.array, FakeArray) for p in back.parameters())


# ----------------------------------------------------------------------------- without CuPy


def _run(code: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_import_never_imports_cupy():
    assert (
        _run("import tensorgrad, gpt.model, sys; print('cupy' in sys.modules)").strip() == "False"
    )


def test_cuda_request_without_cupy_is_one_clear_line():
    out = _run(
        "import sys\n"
        "sys.modules['cupy'] = None  # as if CuPy were not installed\n"
        "import tensorgrad as tg\n"
        "print(tg.cuda.is_available())\n"
        "for make in (lambda: tg.zeros(2, device='cuda'), lambda: tg.ones(2).to('cuda'),\n"
        "             lambda: tg.randn(2, device='cuda')):\n"
        "    try:\n"
        "        make()\n"
        "    except RuntimeError as e:\n"
        "        print(repr(str(e)))\n"
    )
    lines = out.splitlines()
    assert lines[0] == "False" and len(lines) == 4
    for line in lines[1:]:
        msg = eval(line)
        assert "\n" not in msg and ".[cuda]" in msg and "CuPy is not installed" in msg


def test_set_default_device_puts_new_tensors_and_layers_there(fake):
    """torch.set_default_device: factories, tg.tensor and new modules' parameters and buffers
    go to the default device when no device is given; None goes back to the CPU."""
    tg.set_default_device("cuda")
    try:
        made = [tg.zeros(2), tg.randn(2), tg.arange(3), tg.full((2,), 1.0), tg.tensor([1.0])]
        made += [nn.Linear(2, 2).weight, nn.BatchNorm1d(2).running_var, nn.Embedding(3, 2).weight]
        assert [t.device.type for t in made] == ["cuda"] * len(made)
        assert tg.get_default_device().type == "cuda" and tg.zeros(1, device="cpu").is_cuda is False
        x = tg.randn(4, 2, requires_grad=True)
        nn.BatchNorm1d(2)(nn.Linear(2, 2)(x)).sum().backward()
        assert isinstance(x.grad.array, FakeArray)
    finally:
        tg.set_default_device(None)
    assert tg.zeros(1).device.type == "cpu" and tg.get_default_device().type == "cpu"
