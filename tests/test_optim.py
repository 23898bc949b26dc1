"""Tests for gpt.optim: AdamW against the published algorithm, resume, groups, clipping, LR."""

import itertools
import math

import numpy as np
import pytest

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.model import GPT
from gpt.optim import AdamW, clip_grad_norm_, cosine_lr
from tensorgrad.nn import Parameter

SHAPES = [(3, 4), (5,), (2, 3, 2), (3, 50_000)]  # the last spans several CPU chunks
GROUPS = [
    {"lr": 1e-2, "weight_decay": 0.1},
    {"lr": 3e-3, "weight_decay": 0.0, "betas": (0.8, 0.99), "eps": 1e-6},
]
DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}


def make_params(seed=0):
    g = np.random.default_rng(seed)
    return [Parameter(g.standard_normal(s)) for s in SHAPES]  # float64


def grad_at(step, i):
    return np.random.default_rng(1000 * step + i).standard_normal(SHAPES[i])


def make_opt(params):
    groups = [dict(GROUPS[0], params=params[:2]), dict(GROUPS[1], params=params[2:])]
    return AdamW(groups, **DEFAULTS)


def run(opt, params, steps, start=0):
    for t in range(start, start + steps):
        for i, p in enumerate(params):
            p.grad = tg.Tensor(grad_at(t, i))
        opt.step()


def reference_adamw(steps):
    """torch.optim.AdamW, transcribed: decay, moments, bias-corrected step."""
    ps = [p.array.copy() for p in make_params()]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    for t in range(1, steps + 1):
        for i, p in enumerate(ps):
            h = dict(DEFAULTS, **GROUPS[0 if i < 2 else 1])
            lr, (b1, b2), eps, wd = h["lr"], h["betas"], h["eps"], h["weight_decay"]
            g = grad_at(t - 1, i)
            p *= 1 - lr * wd
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            p -= lr / (1 - b1**t) * m[i] / (np.sqrt(v[i]) / math.sqrt(1 - b2**t) + eps)
    return ps


def test_adamw_matches_the_published_algorithm():
    params = make_params()
    run(make_opt(params), params, 10)
    for i, (p, want) in enumerate(zip(params, reference_adamw(10))):
        assert p.dtype == np.float64
        np.testing.assert_allclose(p.array, want, rtol=1e-12, atol=1e-14, err_msg=f"param {i}")


def test_non_contiguous_parameter_is_updated_like_a_contiguous_one():
    g = np.random.default_rng(0)
    a = Parameter(np.asfortranarray(g.standard_normal((4, 3))))
    b = Parameter(np.ascontiguousarray(a.array))
    opts = [AdamW([a], lr=0.1), AdamW([b], lr=0.1)]
    for t in range(3):
        grad = g.standard_normal((4, 3))
        for p, opt in zip((a, b), opts):
            p.grad = tg.Tensor(grad.copy())
            opt.step()
    np.testing.assert_array_equal(a.array, b.array)
    np.testing.assert_array_equal(opts[0].state[a]["exp_avg"], opts[1].state[b]["exp_avg"])


def test_parameter_without_grad_is_left_alone():
    params = make_params()
    before = params[1].array.copy()
    opt = make_opt(params)
    params[0].grad = tg.Tensor(grad_at(0, 0))
    opt.step()
    np.testing.assert_array_equal(params[1].array, before)  # no decay either
    assert params[1] not in opt.state and opt.state[params[0]]["step"] == 1


def test_state_dict_resume_is_exact():
    straight = make_params()
    run(make_opt(straight), straight, 10)

    params = make_params()
    opt = make_opt(params)
    run(opt, params, 5)
    sd = opt.state_dict()
    # what a checkpoint keeps: copies of the moments and of the parameters
    saved = {
        "param_groups": [dict(g) for g in sd["param_groups"]],
        "state": {
            k: {n: (a.copy() if hasattr(a, "copy") else a) for n, a in st.items()}
            for k, st in sd["state"].items()
        },
    }
    resumed = [Parameter(p.array.copy()) for p in params]
    opt2 = AdamW([{"params": resumed[:2]}, {"params": resumed[2:]}], lr=0.5, weight_decay=0.5)
    opt2.load_state_dict(saved)
    for g2, g in zip(opt2.param_groups, opt.param_groups):
        for k in ("lr", "betas", "eps", "weight_decay"):
            assert g2[k] == g[k], k
    run(opt2, resumed, 5, start=5)
    for i, (a, b) in enumerate(zip(resumed, straight)):
        np.testing.assert_array_equal(a.array, b.array, err_msg=f"param {i}")


def test_load_state_dict_refuses_other_groups():
    params = make_params()
    opt = make_opt(params)
    run(opt, params, 1)
    with pytest.raises(ValueError, match="groups"):
        AdamW(make_params()).load_state_dict(opt.state_dict())


@pytest.mark.parametrize("tie", [True, False])
def test_configure_optimizers_groups(tie):
    model = GPT(GPTConfig.from_preset("tiny", tie_weights=tie))
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-4)
    name = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(g["lr"] == 3e-4 for g in opt.param_groups)
    for p in decay["params"]:
        assert p.ndim >= 2, name[id(p)]
    for p in no_decay["params"]:
        n = name[id(p)]
        assert p.ndim == 1 and (n.endswith(".bias") or ".ln_" in n), n
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == set(name)
    assert ids.count(id(model.transformer.wte.weight)) == 1
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params(
        non_embedding=False
    )


def grads_of(arrays):
    ps = [Parameter(np.zeros(a.shape, np.float32)) for a in arrays]
    for p, a in zip(ps, arrays):
        p.grad = tg.Tensor(a.astype(np.float32))
    return ps


def test_clip_grad_norm_scales_down_to_max_norm():
    g = np.random.default_rng(0)
    arrays = [g.standard_normal((4, 5)), g.standard_normal(7)]
    ps = grads_of(arrays) + [Parameter(np.ones(3, np.float32))]  # one without a gradient
    want = math.sqrt(
        sum(float((a.astype(np.float32).astype(np.float64) ** 2).sum()) for a in arrays)
    )
    total = clip_grad_norm_(ps, max_norm=1.0)
    assert total == pytest.approx(want, rel=1e-6)
    after = math.sqrt(sum(float((p.grad.array.astype(np.float64) ** 2).sum()) for p in ps[:2]))
    assert after == pytest.approx(1.0, rel=1e-5)
    for p, a in zip(ps, arrays):  # same direction
        np.testing.assert_allclose(p.grad.array * (want / after), a, rtol=1e-5, atol=1e-6)
    assert ps[2].grad is None


def test_clip_grad_norm_leaves_small_gradients():
    arrays = [np.full((2, 2), 0.1), np.full(3, -0.2)]
    ps = grads_of(arrays)
    before = [p.grad.array.copy() for p in ps]
    total = clip_grad_norm_(ps, max_norm=5.0)
    assert total == pytest.approx(math.sqrt(4 * 0.01 + 3 * 0.04), rel=1e-6)
    for p, b in zip(ps, before):
        np.testing.assert_array_equal(p.grad.array, b)


def test_cosine_lr_shape():
    warm, decay, hi, lo = 10, 100, 1e-3, 1e-4
    lr = [cosine_lr(it, warm, decay, hi, lo) for it in range(130)]
    assert 0 < lr[0] <= hi / warm
    assert all(a < b for a, b in itertools.pairwise(lr[: warm + 1]))  # warmup rises
    assert lr[warm] == pytest.approx(hi)
    assert all(a > b for a, b in itertools.pairwise(lr[warm : decay + 1]))  # then decays
    assert lr[(warm + decay) // 2] == pytest.approx((hi + lo) / 2)
    assert all(x == pytest.approx(lo) for x in lr[decay:])
    assert min(lr) >= min(lo, lr[0]) and max(lr) <= hi
