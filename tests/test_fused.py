"""Fused F.* ops against their composed twins built from primitive ops: same outputs, same grads.

Both twins run on the same float64 inputs; the gradients compared are the tape's own
(after a backward with fixed random output weights), so a fused backward that drifts
from the composed chain rule shows up even where finite differences are loose.
"""

import math

import numpy as np
import pytest
from helpers import arrays, assert_close, shape_dim_keepdim, shapes
from hypothesis import given
from hypothesis import strategies as st

import tensorgrad as tg
import tensorgrad.nn.functional as F

rs = np.random.default_rng(1)


def check_twins(fused, composed, *arrays_, atol=1e-10, rtol=1e-8, name="op"):
    """Outputs and input gradients of ``fused`` and ``composed`` agree on float64 inputs."""
    results = []
    for fn in (fused, composed):
        ts = [tg.tensor(a.copy(), requires_grad=True, dtype=np.float64) for a in arrays_]
        out = fn(*ts)
        w = np.random.default_rng(7).standard_normal(out.shape)
        (out * tg.tensor(w, dtype=np.float64)).sum().backward()
        results.append(
            (out.detach().numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts])
        )
    (yf, gf), (yc, gc) = results
    shapes_ = [a.shape for a in arrays_]
    assert_close(yf, yc, atol, rtol, what=f"{name} {shapes_}: fused vs composed output")
    for i, (a, b) in enumerate(zip(gf, gc)):
        a = np.zeros(arrays_[i].shape) if a is None else a
        b = np.zeros(arrays_[i].shape) if b is None else b
        what = f"{name} {shapes_}: fused vs composed grad of input {i}"
        assert_close(a, b, atol, rtol, what=what)


# ----------------------------------------------------------------------------- composed twins


def softmax_composed(x, dim=-1):
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)


def log_softmax_composed(x, dim=-1):
    z = x - x.amax(dim, keepdim=True)
    return z - z.exp().sum(dim, keepdim=True).log()


def layer_norm_composed(x, nd, w=None, b=None, eps=1e-5):
    dims = tuple(range(-nd, 0))
    y = (x - x.mean(dims, keepdim=True)) / (x.var(dims, keepdim=True, unbiased=False) + eps).sqrt()
    y = y * w if w is not None else y
    return y + b if b is not None else y


def gelu_tanh_composed(x):
    return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)).tanh())


def cross_entropy_composed(logits, target, ignore_index=-100, reduction="mean"):
    """log_softmax + integer indexing; classes on dim 1 as PyTorch."""
    t = np.asarray(target)
    if logits.ndim > 2:
        logits = logits.movedim(1, -1).reshape(-1, logits.shape[1])
    t = t.reshape(-1)
    valid = t != ignore_index
    lp = log_softmax_composed(logits, dim=-1)
    nll = -lp[np.arange(len(t)), np.where(valid, t, 0)]
    nll = tg.where(tg.tensor(valid), nll, 0.0)
    if reduction == "none":
        return nll.reshape(np.asarray(target).shape)
    if reduction == "sum":
        return nll.sum()
    return nll.sum() / float(valid.sum())


def attention_composed(q, k, v, mask=None):
    """The nanoGPT way; ``mask`` is 1 where a query may attend a key (broadcast to (.., T, S))."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if mask is not None:
        att = att.masked_fill(mask == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "twins",
    [(F.softmax, softmax_composed), (F.log_softmax, log_softmax_composed)],
    ids=["softmax", "log_softmax"],
)
@given(data=st.data(), sdk=shape_dim_keepdim(allow_none=False, allow_tuple=False))
def test_softmax_twins(twins, data, sdk):
    shape, dim, _ = sdk
    x = data.draw(arrays(shape, lo=-5.0, hi=5.0))
    fused, composed = twins
    check_twins(
        lambda t: fused(t, dim=dim),
        lambda t: composed(t, dim),
        x,
        name=f"{fused.__name__}(dim={dim})",
    )


@pytest.mark.parametrize(
    "twins",
    [(F.softmax, softmax_composed), (F.log_softmax, log_softmax_composed)],
    ids=["softmax", "log_softmax"],
)
def test_softmax_twins_large_magnitudes(twins):
    x = np.array([[1e4, -1e4, 3.0, 1e4 - 0.5], [-1e4, -1e4 + 1.0, -1e4 - 2.0, -1e4]])
    check_twins(
        lambda t: twins[0](t, -1),
        lambda t: twins[1](t, -1),
        x,
        atol=1e-9,
        name=f"{twins[0].__name__} at ±1e4",
    )


@pytest.mark.parametrize("affine", [False, True])
@given(
    data=st.data(),
    lead=shapes(min_dims=0, max_dims=2),
    norm=shapes(min_dims=1, max_dims=2, min_side=2),
)
def test_layer_norm_twins(affine, data, lead, norm):
    x = data.draw(arrays(lead + norm, lo=-3.0, hi=3.0))
    x = x + np.arange(x.size).reshape(x.shape) * 0.1  # keep the variance away from 0
    wb = [rs.standard_normal(norm), rs.standard_normal(norm)] if affine else []
    nd = len(norm)
    check_twins(
        lambda t, *p: F.layer_norm(t, norm, *p),
        lambda t, *p: layer_norm_composed(t, nd, *p),
        x,
        *wb,
        atol=1e-9,
        rtol=1e-7,
        name=f"layer_norm(normalized_shape={norm}, affine={affine})",
    )


@given(data=st.data(), shape=shapes())
def test_gelu_tanh_twins(data, shape):
    x = data.draw(arrays(shape, lo=-6.0, hi=6.0))
    check_twins(lambda t: F.gelu(t, approximate="tanh"), gelu_tanh_composed, x, name="gelu tanh")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("lshape,tshape", [((5, 4), (5,)), ((2, 3, 4), (2, 4))])
@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy_twins(reduction, lshape, tshape, ignore):
    x = rs.standard_normal(lshape) * 3
    t = rs.integers(0, lshape[1], tshape)
    if ignore:
        t.reshape(-1)[1::3] = -100
    check_twins(
        lambda a: F.cross_entropy(a, t, reduction=reduction),
        lambda a: cross_entropy_composed(a, t, reduction=reduction),
        x,
        name=f"cross_entropy {reduction} ignore={ignore}",
    )


def _qkv(B, nh, T, hs):
    return [rs.standard_normal((B, nh, T, hs)) for _ in range(3)]


@pytest.mark.parametrize("B,nh,T,hs", [(1, 1, 1, 2), (2, 2, 3, 2), (1, 2, 4, 3)])
def test_attention_twins_no_mask(B, nh, T, hs):
    check_twins(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        attention_composed,
        *_qkv(B, nh, T, hs),
        name="sdpa, no mask",
    )


@pytest.mark.parametrize("B,nh,T,hs", [(1, 1, 1, 2), (2, 2, 3, 2), (1, 2, 4, 3)])
def test_attention_twins_causal(B, nh, T, hs):
    bias = tg.tril(tg.ones(T, T)).view(1, 1, T, T)  # nanoGPT's registered buffer
    check_twins(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda q, k, v: attention_composed(q, k, v, bias[:, :, :T, :T]),
        *_qkv(B, nh, T, hs),
        name="sdpa, causal",
    )


@pytest.mark.parametrize("causal", [False, True])
def test_attention_twins_padding_mask(causal):
    B, nh, T, hs = 2, 2, 4, 2
    lengths = np.array([4, 2])  # batch 1 has two padding keys at the end
    keep = np.arange(T)[None, :] < lengths[:, None]  # (B, T): key j is real
    mask = keep[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
    comp = mask & np.tril(np.ones((T, T), bool)) if causal else mask
    check_twins(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal),
        lambda q, k, v: attention_composed(q, k, v, tg.tensor(comp.astype(np.float64))),
        *_qkv(B, nh, T, hs),
        name=f"sdpa, padding mask, causal={causal}",
    )


def test_attention_twins_float32():
    q, k, v = [a.astype(np.float32) for a in _qkv(2, 2, 3, 4)]
    outs = []
    for fn in (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda q, k, v: attention_composed(q, k, v, tg.tril(tg.ones(3, 3))),
    ):
        ts = [tg.tensor(a, requires_grad=True) for a in (q, k, v)]
        y = fn(*ts)
        y.sum().backward()
        assert y.dtype == np.float32 and all(t.grad.dtype == np.float32 for t in ts)
        outs.append([y.detach().numpy()] + [t.grad.numpy() for t in ts])
    for a, b in zip(*outs):
        assert_close(a, b, atol=1e-5, rtol=1e-4, what="sdpa float32 fused vs composed")
