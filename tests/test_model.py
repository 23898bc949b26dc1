"""Tests for gpt.model: GPT-2 names and shapes, init, loss, masks, gradients, KV cache, dtypes."""

import math
import re

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from gpt import model as gm
from gpt.config import GPTConfig
from gpt.model import GPT
from gpt.optim import AdamW

V, BS, C, L = 32, 16, 16, 2  # the tiny preset: vocab, block, n_embd, n_layer


def tiny(**overrides) -> GPTConfig:
    return GPTConfig.from_preset("tiny", **overrides)


def tokens(B, T, seed=0, high=V):
    return np.random.default_rng(seed).integers(0, high, (B, T))


def to_float64(model, scale=None, seed=0):
    """Cast every parameter to float64; with ``scale``, also redraw it so every path is active."""
    g = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        a = p.array.astype(np.float64)
        if scale is not None:
            ln_weight = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
            a = g.normal(0.0, scale, p.shape) + (1.0 if ln_weight else 0.0)
        p.array = a
    return model


def grads(model) -> dict:
    out = {}
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
        out[n] = p.grad.array.copy()
    return out


def loss_of(model, idx, targets, **kw) -> float:
    with tg.no_grad():
        return float(model(idx, targets, **kw)[1].item())


def assert_close(name, got, want, rtol, atol):
    got, want = np.asarray(got), np.asarray(want)
    err = np.abs(got - want) - (atol + rtol * np.abs(want))
    if err.size and err.max() > 0:
        k = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(f"{name} {got.shape}: at {k} got {got[k]!r}, want {want[k]!r}")


# --------------------------------------------------------------------------- names and tying

GPT2_BLOCK = [
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
]


def gpt2_names(n_layer, head):
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    names += [f"transformer.h.{i}.{s}" for i in range(n_layer) for s in GPT2_BLOCK]
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    return names + (["lm_head.weight"] if head else [])


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_and_state_dict_names_are_gpt2(tie):
    model = GPT(tiny(tie_weights=tie))
    assert [n for n, _ in model.named_parameters()] == gpt2_names(L, head=not tie)
    assert list(model.state_dict()) == gpt2_names(L, head=True)  # lm_head.weight even when tied
    shapes = {n: p.shape for n, p in model.named_parameters(remove_duplicate=False)}
    assert shapes["transformer.wte.weight"] == (V, C) and shapes["transformer.wpe.weight"] == (
        BS,
        C,
    )
    h = "transformer.h.1."
    assert shapes[h + "attn.c_attn.weight"] == (3 * C, C)  # Linear weights are (out, in)
    assert shapes[h + "attn.c_proj.weight"] == (C, C)
    assert shapes[h + "mlp.c_fc.weight"] == (4 * C, C)
    assert shapes[h + "mlp.c_proj.weight"] == (C, 4 * C)
    assert shapes["lm_head.weight"] == (V, C)


def test_tied_model_shares_one_parameter():
    model = GPT(tiny())
    assert model.lm_head is None and model.unembedding is model.transformer.wte.weight
    sd = model.state_dict()
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]
    ids = [id(p) for p in model.parameters()]
    assert len(ids) == len(set(ids))


def test_untied_model_has_a_separate_head():
    model = GPT(tiny(tie_weights=False))
    assert model.lm_head is not None and model.unembedding is model.lm_head.weight
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert model.lm_head.bias is None
    assert not np.array_equal(model.lm_head.weight.array, model.transformer.wte.weight.array)


@pytest.mark.parametrize("with_head", [True, False])
def test_tied_load_state_dict_with_or_without_lm_head(with_head):
    tg.manual_seed(1)
    src = {k: v.clone() for k, v in GPT(tiny()).state_dict().items()}
    if not with_head:
        del src["lm_head.weight"]
    model = GPT(tiny())
    model.load_state_dict(src)
    for n, a in model.state_dict().items():
        want = src["transformer.wte.weight"] if n == "lm_head.weight" else src[n]
        np.testing.assert_array_equal(a, want, err_msg=n)
    assert model.unembedding is model.transformer.wte.weight


def test_untied_load_state_dict_needs_lm_head():
    src = dict(GPT(tiny(tie_weights=False)).state_dict())
    del src["lm_head.weight"]
    with pytest.raises(KeyError, match="lm_head.weight"):
        GPT(tiny(tie_weights=False)).load_state_dict(src)


def test_load_state_dict_copies_the_arrays():
    src_model = GPT(tiny())
    before = src_model.transformer.wte.weight.array.copy()
    model = GPT(tiny())
    model.load_state_dict(src_model.state_dict())
    model(tokens(2, 8), tokens(2, 8, 1))[1].backward()
    AdamW(model.parameters(), lr=0.1).step()
    np.testing.assert_array_equal(src_model.transformer.wte.weight.array, before)


def test_tied_gradient_is_the_sum_of_both_uses():
    tied = to_float64(GPT(tiny()), scale=0.2)
    untied = to_float64(GPT(tiny(tie_weights=False)))
    sd = {k: v.clone() for k, v in tied.state_dict().items()}  # lm_head.weight = a copy of wte
    untied.load_state_dict(sd)
    idx, tgt = tokens(2, 12), tokens(2, 12, 1)
    lt, lu = tied(idx, tgt)[1], untied(idx, tgt)[1]
    assert float(lt.item()) == pytest.approx(float(lu.item()), rel=1e-12)
    lt.backward()
    lu.backward()
    gt, gu = grads(tied), grads(untied)
    assert_close(
        "wte grad",
        gt["transformer.wte.weight"],
        gu["transformer.wte.weight"] + gu["lm_head.weight"],
        1e-9,
        1e-12,
    )
    for n in gt:
        if n != "transformer.wte.weight":
            assert_close(n, gt[n], gu[n], 1e-9, 1e-12)


# --------------------------------------------------------------------------- initialisation


def test_init_statistics():
    cfg = GPTConfig(
        block_size=64, vocab_size=512, n_layer=4, n_head=4, n_embd=128, tie_weights=False
    )
    model = GPT(cfg)
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for n, p in model.named_parameters():
        a = p.array
        assert a.dtype == np.float32, n
        if n.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            np.testing.assert_array_equal(a, 1.0, err_msg=n)
        elif n.endswith(".bias"):
            np.testing.assert_array_equal(a, 0.0, err_msg=n)
        else:
            std = proj_std if n.endswith("c_proj.weight") else 0.02
            assert a.std() == pytest.approx(std, rel=0.05), n
            assert abs(a.mean()) < 0.1 * std, n


def test_manual_seed_gives_identical_models():
    def build(seed):
        tg.manual_seed(seed)
        return GPT(tiny()).state_dict()

    a, b, c = build(7), build(7), build(8)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    assert not np.array_equal(a["transformer.wte.weight"], c["transformer.wte.weight"])


# --------------------------------------------------------------------------- loss and logits


def test_loss_at_init_is_about_log_vocab():
    model = GPT(tiny())
    loss = loss_of(model, tokens(4, BS), tokens(4, BS, 1))
    assert abs(loss - math.log(V)) < 0.3


def test_overfits_one_batch():
    model = GPT(tiny())
    idx, tgt = tokens(4, BS), tokens(4, BS, 1)
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for step in range(400):
        loss = model(idx, tgt)[1]
        if loss.item() < 0.05:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"loss {loss.item():.3f} after {step} steps"


def test_logits_shapes_and_last_position():
    model = GPT(tiny())
    idx = tokens(3, 10)
    full, loss = model(idx, tokens(3, 10, 1))
    assert full.shape == (3, 10, V) and loss.shape == ()
    last, none = model(idx)
    assert last.shape == (3, 1, V) and none is None
    np.testing.assert_allclose(last.array, full.array[:, -1:], rtol=1e-6, atol=1e-6)


def test_ignored_targets_do_not_count():
    model = GPT(tiny())
    idx, tgt = tokens(2, 10), tokens(2, 10, 1)
    tgt[0, 3:7] = -1
    tgt[1, 0] = -1
    logits, loss = model(idx, tgt)
    lg = logits.array.astype(np.float64)
    logp = lg - lg.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    valid = tgt != -1
    want = -np.take_along_axis(logp, np.where(valid, tgt, 0)[..., None], -1)[..., 0][valid].mean()
    assert float(loss.item()) == pytest.approx(want, rel=1e-5)


def test_input_errors_name_the_numbers():
    model = GPT(tiny())
    with pytest.raises(ValueError, match=r"(?=.*\b17\b)(?=.*\b16\b)"):
        model(tokens(1, BS + 1))
    bad = tokens(1, 5)
    bad[0, 2] = V + 3
    # the embedding checks the ids, in every call (a compiled forward's replays too)
    with pytest.raises(IndexError, match=rf"index {V + 3} is out of range for {V} rows"):
        model(bad)
    bad[0, 2] = -4
    with pytest.raises(IndexError, match=re.escape("-4")):
        model(tg.tensor(bad))
    with pytest.raises(ValueError, match="targets"):
        model(tokens(2, 5), tokens(2, 4))


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("tie", [True, False])
def test_gradient_matches_finite_differences(tie):
    model = to_float64(GPT(tiny(tie_weights=tie, dropout=0.0)), scale=0.3, seed=int(tie))
    idx, tgt = tokens(2, 7, 2), tokens(2, 7, 3)
    tgt[1, 2] = -1
    loss = model(idx, tgt)[1]
    loss.backward()
    named = list(model.named_parameters())
    g = grads(model)
    rng = np.random.default_rng(4)

    # the whole model along one random direction
    dirs = {n: rng.standard_normal(p.shape) for n, p in named}
    h = 1e-5

    def shifted(s):
        for n, p in named:
            p.array = p.array + s * dirs[n]
        out = loss_of(model, idx, tgt)
        for n, p in named:
            p.array = p.array - s * dirs[n]
        return out

    numeric = (shifted(h) - shifted(-h)) / (2 * h)
    analytic = sum(float((g[n] * dirs[n]).sum()) for n in g)
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-9)

    # a few elements of every parameter, so a gradient missing anywhere shows up
    for n, p in named:
        flat = p.array.reshape(-1)
        for j in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            orig = flat[j]
            flat[j] = orig + h
            up = loss_of(model, idx, tgt)
            flat[j] = orig - h
            down = loss_of(model, idx, tgt)
            flat[j] = orig
            num = (up - down) / (2 * h)
            assert g[n].reshape(-1)[j] == pytest.approx(num, rel=1e-5, abs=1e-9), f"{n}[{j}]"


def sdpa_attention(self, x, mask=None, cache=None, layer=0):
    """CausalSelfAttention's forward with its written scores -> mask -> softmax -> ·v as one
    F.scaled_dot_product_attention call (what nanoGPT's flash path writes)."""
    B, T, C = x.shape
    nh, hs = self.n_head, C // self.n_head
    q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
    if cache is not None:
        k, v = cache.append(layer, k, v)
    p = self.attn_dropout.p if self.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


@pytest.mark.parametrize("mask", ["causal", "padding", "documents"])
def test_written_attention_matches_scaled_dot_product_attention(mask, monkeypatch):
    model = to_float64(GPT(tiny()), scale=0.3)
    idx, tgt = tokens(2, 12, 5, high=V - 1), tokens(2, 12, 6)
    kw = {}
    if mask == "padding":
        am = np.ones((2, 12), int)
        am[1, 7:] = 0
        kw = {"attention_mask": am}
    elif mask == "documents":
        idx[0, [3, 8]] = V - 1
        idx[1, 5] = V - 1
        kw = {"doc_sep": V - 1}
    out = {}
    for sdpa in (False, True):
        if sdpa:
            monkeypatch.setattr(gm.CausalSelfAttention, "forward", sdpa_attention)
        model.zero_grad()
        logits, loss = model(idx, tgt, **kw)
        loss.backward()
        out[sdpa] = logits.array, grads(model)
    assert_close("logits", out[True][0], out[False][0], 1e-10, 1e-12)
    for n in out[True][1]:
        assert_close(n, out[True][1][n], out[False][1][n], 1e-9, 1e-12)


# --------------------------------------------------------------------------- masks


def test_padding_mask_matches_unpadded_runs():
    model = to_float64(GPT(tiny()), scale=0.3)
    seqs = [tokens(1, n, 10 + n)[0] for n in (5, 9, 3)]
    tgts = [tokens(1, n, 20 + n)[0] for n in (5, 9, 3)]
    T = 9
    idx = np.zeros((3, T), int)
    tgt = np.full((3, T), -1)
    am = np.zeros((3, T), int)
    for b, (s, t) in enumerate(zip(seqs, tgts)):
        idx[b, : len(s)], tgt[b, : len(s)], am[b, : len(s)] = s, t, 1
    logits, loss = model(idx, tgt, attention_mask=am)
    total = 0.0
    for b, (s, t) in enumerate(zip(seqs, tgts)):
        alone, alone_loss = model(s[None], t[None])
        assert_close(f"row {b}", logits.array[b, : len(s)], alone.array[0], 1e-9, 1e-12)
        total += float(alone_loss.item()) * len(s)
    assert float(loss.item()) == pytest.approx(total / sum(len(s) for s in seqs), rel=1e-10)


def test_masked_keys_are_not_seen():
    model = to_float64(GPT(tiny()), scale=0.3)
    idx = tokens(2, 10, 70)
    am = np.ones((2, 10), int)
    am[0, :3] = 0  # left padding
    am[1, 4:6] = 0  # a hole
    other = idx.copy()
    other[0, :3] = (idx[0, :3] + 7) % V
    other[1, 4:6] = (idx[1, 4:6] + 7) % V
    a = model(idx, idx, attention_mask=am)[0].array
    b = model(other, idx, attention_mask=am)[0].array
    assert_close("row 0", a[0, 3:], b[0, 3:], 1e-12, 1e-12)
    assert_close("row 1", a[1, 6:], b[1, 6:], 1e-12, 1e-12)
    assert np.abs(model(other, idx)[0].array - a).max() > 1e-3  # without the mask they differ


def test_document_mask_matches_each_document_alone():
    eot = V - 1
    model = to_float64(GPT(tiny()), scale=0.3)
    docs = [tokens(1, n, 30 + n, high=eot)[0] for n in (4, 2, 5)]
    pieces = [np.append(docs[0], eot), np.append(docs[1], eot), docs[2]]
    row = np.concatenate(pieces)
    row2 = np.concatenate([pieces[1], pieces[0], pieces[2]])  # another packing in the batch
    tgt = tokens(2, len(row), 40)
    logits = model(np.stack([row, row2]), tgt, doc_sep=eot)[0].array
    for b, order in enumerate([(0, 1, 2), (1, 0, 2)]):
        t0 = 0
        for d in order:
            piece = pieces[d]
            alone = model(piece[None], tgt[:1, : len(piece)])[0].array[0]
            assert_close(f"row {b} doc {d}", logits[b, t0 : t0 + len(piece)], alone, 1e-9, 1e-12)
            t0 += len(piece)


# --------------------------------------------------------------------------- generation

SAMPLING = [
    {"temperature": 1.0},
    {"temperature": 1.0, "top_k": 5},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 8, "top_p": 0.8},
    {"temperature": 0.0},
]


@pytest.mark.parametrize("kw", SAMPLING, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("T,new", [(3, 6), (5, 20), (BS, 4)])  # the last two refill the cache
def test_kv_cache_generates_the_same_tokens(kw, T, new):
    model = GPT(tiny())
    prompt = tokens(2, T, 50)
    a = model.generate(prompt, new, seed=123, use_cache=True, **kw)
    b = model.generate(prompt, new, seed=123, use_cache=False, **kw)
    assert a.shape == (2, T + new)
    np.testing.assert_array_equal(a[:, :T], prompt)
    np.testing.assert_array_equal(a, b)


def test_sampling_past_the_block_replays_one_compiled_window_forward():
    """Past block_size each token runs the whole window, (B, block_size), one shape: a
    compiled model replays it (the KV-cached steps before run eagerly, by design), and gives
    the eager model's tokens."""
    import warnings

    from tensorgrad.compiler import CompileWarning, compiled_forward

    model = GPT(tiny())
    compiled = tg.compile(GPT(tiny()))
    compiled.load_state_dict(model.state_dict())
    prompt, new = tokens(2, 5, 40), BS + 6  # runs past the block after BS - 5 tokens
    want = model.generate(prompt, new, temperature=0.0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = compiled.generate(prompt, new, temperature=0.0)
    np.testing.assert_array_equal(got, want)
    s = compiled_forward(compiled).summary()
    assert s["compiled"] == 1, s  # the window's forward, replayed from its third token on
    reasons = {str(w.message) for w in said if issubclass(w.category, CompileWarning)}
    assert all("KVCache" in r for r in reasons) and reasons, reasons


def test_eos_stops_and_pads():
    model = GPT(tiny())
    prompt = tokens(3, 4, 60)
    free = model.generate(prompt, 12, seed=5)  # sampled, so a row would go on after its eos
    eos = int(free[0, 4 + 2])
    first = [int(np.argmax(r == eos)) if (r == eos).any() else None for r in free[:, 4:]]
    out = model.generate(prompt, 12, seed=5, eos_token_id=eos)
    assert out.shape[0] == 3 and out.shape[1] <= 16
    for b, k in enumerate(first):
        if k is None:
            np.testing.assert_array_equal(out[b], free[b, : out.shape[1]])
            continue
        np.testing.assert_array_equal(out[b, : 4 + k + 1], free[b, : 4 + k + 1])
        assert (out[b, 4 + k :] == eos).all(), f"row {b} not padded after its eos"
    if all(k is not None for k in first):
        assert out.shape[1] == 4 + max(first) + 1  # stops once every row is done
    else:
        assert out.shape[1] == 16
    # a single row stops right after its eos (the stream of draws depends on the batch size)
    free = model.generate(prompt[:1], 12, seed=6)
    eos = int(free[0, 4 + 3])
    k = int(np.argmax(free[0, 4:] == eos))
    single = model.generate(prompt[:1], 12, seed=6, eos_token_id=eos)
    np.testing.assert_array_equal(single, free[:, : 4 + k + 1])


@pytest.mark.parametrize("training", [True, False])
def test_generate_keeps_the_training_mode(training):
    model = GPT(tiny(dropout=0.1))
    model.train(training)
    model.generate(tokens(1, 3), 3, seed=0)
    assert all(m.training == training for m in model.modules())


def test_generate_records_no_graph():
    model = GPT(tiny())
    seen = []
    forward = model.forward

    def spy(*a, **k):
        seen.append(tg.is_grad_enabled())
        return forward(*a, **k)

    model.forward = spy
    for _ in model.generate_stream(tokens(1, 3), 4, seed=0):
        assert tg.is_grad_enabled()  # the caller's code between tokens still records
    assert seen and not any(seen)


# --------------------------------------------------------------------------- counts and dtypes


@pytest.mark.parametrize("tie", [True, False])
def test_num_params_and_flops(tie):
    model = GPT(tiny(tie_weights=tie))
    per_layer = 12 * C * C + 13 * C
    total = V * C + BS * C + L * per_layer + 2 * C + (0 if tie else V * C)
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - BS * C
    H, Q, T = 2, C // 2, 10
    assert model.estimate_flops_per_token(T) == 6 * (total - BS * C) + 12 * L * H * Q * T


def float64_in_graph(root):
    """Names of recorded ops that output or saved a float64 array (walked before backward)."""
    bad, seen, stack = [], set(), [root._node]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        arrays = [v for v in fn.__dict__.values() if hasattr(v, "dtype")]
        arrays += [a for a in fn.__dict__.get("saved", ()) if hasattr(a, "dtype")]
        if any(dt == np.float64 for _, dt in fn.out_meta) or any(
            a.dtype == np.float64 for a in arrays
        ):
            bad.append(fn.name)
        stack += [e[0] for e in fn.edges if type(e) is tuple]
    return bad


@pytest.mark.parametrize("mask", [None, "padding", "documents"])
def test_float32_model_stays_float32(mask):
    model = GPT(tiny(dropout=0.1))
    idx, tgt = tokens(2, 10, high=V - 1), tokens(2, 10, 1)
    kw = {}
    if mask == "padding":
        kw = {"attention_mask": np.array([[1] * 10, [1] * 6 + [0] * 4])}
    elif mask == "documents":
        idx[:, 4] = V - 1
        kw = {"doc_sep": V - 1}
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    logits, loss = model(idx, tgt, **kw)
    assert logits.dtype == np.float32 and loss.dtype == np.float32
    assert float64_in_graph(loss) == []
    loss.backward()
    opt.step()
    for n, p in model.named_parameters():
        assert p.dtype == np.float32 and p.grad.dtype == np.float32, n
        st = opt.state[p]
        assert st["exp_avg"].dtype == np.float32 and st["exp_avg_sq"].dtype == np.float32, n


def test_generate_never_samples_suppressed_tokens():
    tg.manual_seed(0)
    model = GPT(tiny())
    out = model.generate(tokens(2, 3), 40, temperature=2.0, seed=0, suppress_tokens=[0, 5])
    assert not np.isin(out[:, 3:], [0, 5]).any()
