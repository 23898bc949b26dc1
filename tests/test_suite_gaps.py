"""Cases a mutation sweep showed the rest of the suite did not pin down: SGD's momentum,
dampening and Nesterov against PyTorch's formulas written in NumPy; clip_grad_norm_'s inf-norm
on negative gradients; the fused GPT-2 block with a non-default LayerNorm eps; sample_next's
top_k, top_p and temperature; gpt-train's gradient accumulation without mpi4py.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
from gpt import train
from gpt.config import GPTConfig
from gpt.model import GPT, sample_next
from gpt.store import run_checkpoint as rc
from tensorgrad.kernels.cpu_gpt2_block import GPT2_BLOCK_PARAMS
from tensorgrad.nn import Parameter
from tensorgrad.nn.utils import clip_grad_norm_

# ----------------------------------------------------------------------------- SGD


def sgd_reference(x, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    """torch.optim.SGD's documented update, step after step, in float64 NumPy."""
    x, buf = np.array(x, np.float64), None
    for g in grads:
        g = np.array(g, np.float64)
        if weight_decay:
            g = g + weight_decay * x
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        x = x - lr * g
    return x


SGD_CASES = {
    "plain": {"lr": 0.1},
    "momentum": {"lr": 0.1, "momentum": 0.9},
    "dampening": {"lr": 0.05, "momentum": 0.8, "dampening": 0.3},
    "nesterov": {"lr": 0.1, "momentum": 0.9, "nesterov": True},
    "nesterov + weight decay": {"lr": 0.1, "momentum": 0.7, "weight_decay": 0.2, "nesterov": True},
    "everything": {"lr": 0.03, "momentum": 0.6, "dampening": 0.5, "weight_decay": 0.1},
}
SGD_SHAPES = [(3, 4), (5,)]
SGD_STEPS = 5


def sgd_grads(step: int, i: int):
    return np.random.default_rng(100 * step + i).standard_normal(SGD_SHAPES[i])


def sgd_start():
    g = np.random.default_rng(7)
    return [g.standard_normal(s) for s in SGD_SHAPES]


def run_sgd(opt, params, steps, start=0):
    for t in range(start, start + steps):
        for i, p in enumerate(params):
            p.grad = tg.Tensor(sgd_grads(t, i))
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("case", SGD_CASES)
def test_sgd_matches_the_pytorch_formulas(case):
    hp = SGD_CASES[case]
    params = [Parameter(a.copy()) for a in sgd_start()]
    run_sgd(tg.optim.SGD(params, **hp), params, SGD_STEPS)
    for i, (p, x0) in enumerate(zip(params, sgd_start())):
        want = sgd_reference(x0, [sgd_grads(t, i) for t in range(SGD_STEPS)], **hp)
        np.testing.assert_allclose(p.array, want, rtol=1e-12, atol=1e-12, err_msg=f"{case} p{i}")


def test_sgd_groups_keep_their_own_momentum_settings():
    a, b = (dict(SGD_CASES["dampening"]), dict(SGD_CASES["nesterov"]))
    params = [Parameter(x.copy()) for x in sgd_start()]
    opt = tg.optim.SGD([dict(a, params=params[:1]), dict(b, params=params[1:])], lr=1.0)
    run_sgd(opt, params, SGD_STEPS)
    for i, (p, x0, hp) in enumerate(zip(params, sgd_start(), (a, b))):
        want = sgd_reference(x0, [sgd_grads(t, i) for t in range(SGD_STEPS)], **hp)
        np.testing.assert_allclose(p.array, want, rtol=1e-12, atol=1e-12, err_msg=f"group {i}")


def test_sgd_momentum_buffer_survives_a_state_dict_round_trip():
    hp = SGD_CASES["everything"]
    params = [Parameter(x.copy()) for x in sgd_start()]
    opt = tg.optim.SGD(params, **hp)
    run_sgd(opt, params, 2)
    again = [Parameter(p.array.copy()) for p in params]
    opt2 = tg.optim.SGD(again, lr=1.0)  # lr and momentum come back from the state dict
    opt2.load_state_dict(opt.state_dict())
    run_sgd(opt2, again, SGD_STEPS - 2, start=2)
    for i, (p, x0) in enumerate(zip(again, sgd_start())):
        want = sgd_reference(x0, [sgd_grads(t, i) for t in range(SGD_STEPS)], **hp)
        np.testing.assert_allclose(p.array, want, rtol=1e-12, atol=1e-12, err_msg=f"p{i}")


def test_sgd_float32_stays_float32_and_follows_the_formula():
    hp = SGD_CASES["nesterov + weight decay"]
    x0 = sgd_start()[0].astype(np.float32)
    p = Parameter(x0.copy())
    opt = tg.optim.SGD([p], **hp)
    grads = [sgd_grads(t, 0).astype(np.float32) for t in range(SGD_STEPS)]
    for g in grads:
        p.grad = tg.Tensor(g)
        opt.step()
    assert p.array.dtype == np.float32
    assert opt.state[p]["momentum_buffer"].dtype == np.float32
    np.testing.assert_allclose(p.array, sgd_reference(x0, grads, **hp), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "hp",
    [{"momentum": 0.0, "nesterov": True}, {"momentum": 0.9, "dampening": 0.1, "nesterov": True}],
)
def test_sgd_refuses_nesterov_without_momentum_or_with_dampening(hp):
    with pytest.raises(ValueError, match="nesterov"):
        tg.optim.SGD([Parameter(np.zeros(2))], lr=0.1, **hp)


# ----------------------------------------------------------------------------- clip_grad_norm_


def with_grads(*arrays):
    ps = [Parameter(np.zeros(np.shape(a), np.float32)) for a in arrays]
    for p, a in zip(ps, arrays):
        p.grad = tg.Tensor(np.asarray(a, np.float32))
    return ps


@pytest.mark.parametrize("norm_type", [math.inf, float("inf"), "inf"])
def test_clip_grad_norm_inf_takes_the_largest_magnitude(norm_type):
    """The largest |g| is a negative entry: the inf-norm is 5, not the largest value 2."""
    arrays = [np.array([[-5.0, 1.0], [0.5, -0.25]]), np.array([2.0, -3.0, 0.0])]
    ps = with_grads(*arrays)
    total = clip_grad_norm_(ps, max_norm=1.0, norm_type=norm_type)
    assert float(total) == 5.0
    for p, a in zip(ps, arrays):
        np.testing.assert_allclose(p.grad.array, a / (5.0 + 1e-6), rtol=1e-6)
    assert float(np.abs(ps[0].grad.array).max()) == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_inf_all_negative_and_below_the_limit():
    arrays = [np.array([-0.5, -0.75]), np.array([[-0.25]])]
    ps = with_grads(*arrays)
    assert float(clip_grad_norm_(ps, max_norm=1.0, norm_type="inf")) == 0.75
    for p, a in zip(ps, arrays):
        np.testing.assert_array_equal(p.grad.array, np.asarray(a, np.float32))  # not scaled


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("norm_type", [2.0, "inf"])
def test_clip_grad_norm_nonfinite(bad, norm_type):
    arrays = [np.array([1.0, bad]), np.array([-3.0])]
    ps = with_grads(*arrays)
    with pytest.raises(RuntimeError, match="norm"):
        clip_grad_norm_(ps, 1.0, norm_type=norm_type, error_if_nonfinite=True)
    total = float(clip_grad_norm_(ps, 1.0, norm_type=norm_type))
    assert math.isnan(total) if math.isnan(bad) else total == math.inf
    for p, a in zip(ps, arrays):  # passed through unscaled, for the caller to see
        np.testing.assert_array_equal(p.grad.array, np.asarray(a, np.float32))


# ----------------------------------------------------------------------------- fused block eps

EPS = 1e-1  # far from the default 1e-5: the LayerNorm outputs differ at the first digit


def block_arrays(C, seed=0):
    r = np.random.default_rng(seed)
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,)]
    shapes += [(4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    params = []
    for name, s in zip(GPT2_BLOCK_PARAMS, shapes):
        a = r.standard_normal(s) * (0.3 if len(s) == 2 else 0.2)
        params.append(a + (1.0 if name.startswith("ln_") and name.endswith("weight") else 0.0))
    return [p.astype(np.float32) for p in params]


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / (var + eps).sqrt() * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + ((2.0 / math.pi) ** 0.5 * (x + 0.044715 * x**3)).tanh())


def block_by_hand(x, params, n_head, eps):
    """ln -> causal attention -> residual -> ln -> MLP -> residual, from elementary ops."""
    l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, mw, mb = params
    B, T, C = x.shape
    hs = C // n_head
    qkv = layer_norm(x, l1w, l1b, eps) @ aw.T + ab  # (B, T, 3C)
    q, k, v = (qkv[:, :, i * C : (i + 1) * C].reshape(B, T, n_head, hs) for i in range(3))
    q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))  # (B, nh, T, hs)
    att = (q @ k.permute(0, 1, 3, 2)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
    att = att.masked_fill(~np.tril(np.ones((T, T), bool)), float("-inf"))
    att = (att - att.amax(-1, keepdim=True).detach()).exp()
    y = (att / att.sum(-1, keepdim=True)) @ v  # (B, nh, T, hs)
    x = x + y.permute(0, 2, 1, 3).reshape(B, T, C) @ pw.T + pb
    h = gelu_tanh(layer_norm(x, l2w, l2b, eps) @ fw.T + fb)
    return x + h @ mw.T + mb


@pytest.mark.skipif(
    not tg.kernels.is_enabled(), reason="TG_KERNELS=0: no fused block (unset TG_KERNELS to run it)"
)
def test_gpt2_block_honours_a_non_default_eps():
    """The fused GPT-2 block kernel (float32) against the block written by hand in float64,
    with eps = 0.1: output and all 13 gradients."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    (kernel,) = tg.kernels.registered("gpt2_block", "cpu")
    B, T, C, nh = 2, 7, 16, 2
    params = block_arrays(C)
    x = np.random.default_rng(1).standard_normal((B, T, C)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((B, T, C))
    runs = []
    for dtype in (np.float32, np.float64):
        ts = [tg.tensor(a.astype(dtype), dtype=dtype, requires_grad=True) for a in [x, *params]]
        if dtype == np.float32:
            out = kernel.impl.apply(ts[0], *ts[1:], n_head=nh, eps=EPS)
        else:
            out = block_by_hand(ts[0], ts[1:], nh, EPS)
        (out * tg.tensor(w.astype(dtype), dtype=dtype)).sum().backward()
        runs.append([out.array] + [t.grad.array for t in ts])
    names = ["output", "x", *GPT2_BLOCK_PARAMS]
    for name, got, want in zip(names, *runs):
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale, err_msg=name)


def gpt_by_hand(params: dict, idx, targets, config):
    """GPT's training loss, composed op by op from the parameters (tied head)."""
    B, T = idx.shape
    x = params["transformer.wte.weight"][idx] + params["transformer.wpe.weight"][np.arange(T)]
    for i in range(config.n_layer):
        pre = f"transformer.h.{i}."
        block = [params[pre + n] for n in GPT2_BLOCK_PARAMS]
        x = block_by_hand(x, block, config.n_head, config.layer_norm_eps)
    x = layer_norm(
        x, params["transformer.ln_f.weight"], params["transformer.ln_f.bias"], config.layer_norm_eps
    )
    logits = (x @ params["transformer.wte.weight"].T).reshape(B * T, -1)
    m = logits.amax(-1, keepdim=True).detach()
    logp = logits - m - (logits - m).exp().sum(-1, keepdim=True).log()
    return -logp[np.arange(B * T), targets.reshape(-1)].mean()


def test_gpt_training_step_honours_layer_norm_eps():
    """A float32 GPT with layer_norm_eps = 0.1 (the fused block wherever the model uses it):
    its loss and every parameter gradient against the model composed op by op in float64."""
    config = GPTConfig(
        block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=16, layer_norm_eps=EPS
    )
    tg.manual_seed(0)
    model = GPT(config)
    r = np.random.default_rng(3)
    for name, p in model.named_parameters():  # LayerNorms and biases away from 1 and 0
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            p.array = (1.0 + 0.3 * r.standard_normal(p.shape)).astype(np.float32)
        elif name.endswith("bias"):
            p.array = (0.1 * r.standard_normal(p.shape)).astype(np.float32)
    model.train()
    idx = r.integers(0, config.vocab_size, (2, 8))
    targets = r.integers(0, config.vocab_size, (2, 8))
    tg.compile(model)  # as gpt-train: the third call replays, with the fused block kernel
    for _ in range(3):
        model.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
    named = dict(model.named_parameters())
    ref = {n: tg.tensor(p.array.astype(np.float64), requires_grad=True) for n, p in named.items()}
    want = gpt_by_hand(ref, idx, targets, config)
    want.backward()
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    for name, p in named.items():
        w = ref[name].grad.array
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(p.grad.array, w, rtol=1e-3, atol=1e-3 * scale, err_msg=name)


# ----------------------------------------------------------------------------- sample_next

DRAWS = 4000


def drawn(logits, temperature=1.0, top_k=None, top_p=None, seed=0):
    """Token ids of DRAWS draws (one row per draw) from the same (V,) logits."""
    rows = np.repeat(np.asarray(logits, np.float64)[None, :], DRAWS, axis=0)
    return sample_next(rows, temperature, top_k, top_p, np.random.default_rng(seed))


def test_temperature_zero_is_argmax():
    logits = np.random.default_rng(0).standard_normal((6, 11))
    got = sample_next(logits.astype(np.float32), 0, None, None, np.random.default_rng(0))
    np.testing.assert_array_equal(got, logits.argmax(axis=-1))
    got = sample_next(logits, 0, 3, 0.5, np.random.default_rng(0))  # top_k/top_p change nothing
    np.testing.assert_array_equal(got, logits.argmax(axis=-1))


# distinct logits close together: every kept token is drawn often, the others never
FLAT = np.random.default_rng(5).permutation(np.linspace(0.0, 1.0, 12))


@pytest.mark.parametrize("k", [1, 2, 5, 11])
def test_top_k_draws_exactly_the_k_largest(k):
    got = set(drawn(FLAT, top_k=k).tolist())
    assert got == set(np.argsort(FLAT)[-k:].tolist()), f"top_k={k}: drew {sorted(got)}"


@pytest.mark.parametrize("k", [12, 50, None])
def test_top_k_at_or_over_the_vocabulary_keeps_everything(k):
    assert set(drawn(FLAT, top_k=k).tolist()) == set(range(12))


def test_top_k_renormalises_what_it_keeps():
    logits = np.log([0.1, 0.4, 0.2, 0.3])
    counts = np.bincount(drawn(logits, top_k=2), minlength=4) / DRAWS
    np.testing.assert_allclose(counts, [0.0, 4 / 7, 0.0, 3 / 7], atol=0.03)


# probs 0.5, 0.3, 0.2 (in float64 0.5 + 0.3 == 0.8 exactly, and softmax of their logs gives
# them back exactly): top_p keeps the smallest set of most likely tokens whose sum reaches p
TOP_P = [(0.3, {0}), (0.5, {0}), (0.5000001, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2})]
TOP_P += [(1.0, {0, 1, 2}), (None, {0, 1, 2})]


@pytest.mark.parametrize("top_p, want", TOP_P, ids=[str(p) for p, _ in TOP_P])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, want):
    assert 0.5 + 0.3 == 0.8
    got = set(drawn(np.log([0.5, 0.3, 0.2]), top_p=top_p).tolist())
    assert got == want, f"top_p={top_p}: kept {sorted(got)}"


def test_top_p_boundary_does_not_depend_on_the_vocabulary_order():
    base = np.log(np.array([0.5, 0.3, 0.2]))
    for order in itertools.permutations(range(3)):
        for top_p, want in TOP_P:
            got = {order[t] for t in drawn(base[list(order)], top_p=top_p).tolist()}
            assert got == want, f"tokens in order {order}, top_p={top_p}: kept {sorted(got)}"


def test_top_p_renormalises_what_it_keeps():
    counts = np.bincount(drawn(np.log([0.5, 0.3, 0.2]), top_p=0.8), minlength=3) / DRAWS
    np.testing.assert_allclose(counts, [0.625, 0.375, 0.0], atol=0.03)


def test_temperature_scales_the_logits():
    p = np.array([0.6, 0.3, 0.1])
    for t in (0.5, 2.0):
        counts = np.bincount(drawn(np.log(p), temperature=t), minlength=3) / DRAWS
        want = p ** (1 / t) / (p ** (1 / t)).sum()
        np.testing.assert_allclose(counts, want, atol=0.03, err_msg=f"temperature {t}")


def test_top_k_then_top_p():
    """top_k=3 of [0.4, 0.3, 0.2, 0.1] renormalises to 4/9, 3/9, 2/9; top_p=0.7 then keeps two."""
    got = set(drawn(np.log([0.4, 0.3, 0.2, 0.1]), top_k=3, top_p=0.7).tolist())
    assert got == {0, 1}


# ----------------------------------------------------------------------------- grad accumulation

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
TINY += ["--eval-iters", "1", "--dropout", "0.0", "--warmup-iters", "0", "--no-sample"]
TINY += ["--max-iters", "1", "--eval-interval", "1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    rnd = random.Random(0)
    words = "the king and queen of a far land rode out at dawn to see what lay beyond".split()
    lines = (" ".join(rnd.choice(words) for _ in range(10)) for _ in range(80))
    (d / "a.txt").write_text("\n".join(lines) + "\n")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT_CACHE_DIR", str(cache))
        yield d


def steps(out):
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def test_grad_accum_averages_the_micro_batches(corpus, tmp_path):
    """Batch 4 in one micro-batch and batch 2 in two draw the same rows (one generator, the
    same order): the step's loss, gradient norm and the weights after it must agree. Summing
    the micro-batch losses instead of averaging them would double the loss and the norm."""
    outs = {}
    for batch, accum in ((4, 1), (2, 2)):
        out = outs[accum] = tmp_path / f"accum{accum}"
        argv = ["--data", str(corpus), "--out-dir", str(out), *TINY]
        assert train.main([*argv, "--batch-size", str(batch), "--grad-accum", str(accum)]) == 0
    one, two = steps(outs[1]), steps(outs[2])
    assert [r["iter"] for r in one] == [r["iter"] for r in two] == [0]
    for a, b in zip(one, two):
        for key in ("loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), f"iter {a['iter']} {key}"
    _, wa, _ = rc.load(outs[1])
    _, wb, _ = rc.load(outs[2])
    for name in wa:
        np.testing.assert_allclose(wb[name], wa[name], rtol=1e-4, atol=1e-6, err_msg=name)
