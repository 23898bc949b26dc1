"""Composite patterns match the traced graph's dataflow (compiler/patterns.py, docs/compile.md).

nanoGPT's model.py, written here as it is with the imports changed (k reshaped before q and
v, the exact GELU, ``transpose``), compiled, gets the fused GPT-2 block kernel as
``gpt/model.py`` does, and so do blocks that write the same ops in another order or spelling,
with n_head 1 and T 1, where ``contiguous()`` records nothing; so does attention written out
with its causal mask read from a buffer (the mask folded when the plan is made). Near misses
(another scale, such a buffer narrowed in place after the plan, another eps, a value of the
block read outside it, a user's op that shares an op's name) do not match and run as
written. Everything compiled is compared with an eager twin of the same weights: outputs and
every gradient, over four calls. (minGPT's model: test_compile_mingpt.py.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import tensorgrad as torch  # nanoGPT's imports, changed
import tensorgrad.nn as nn
from tensorgrad import kernels
from tensorgrad.autograd import Op
from tensorgrad.compiler import compiled_forward, patterns
from tensorgrad.nn import functional as F
from tensorgrad.ops import elementwise as ew
from tensorgrad.ops import nn as ops_nn

BLOCK = "GPT-2 blocks as the fused block kernel"
ATTENTION = "causal attentions as one attention op"
ADD_LN = "residual adds with their LayerNorm as one kernel"
ON = kernels.is_enabled()  # TG_KERNELS=0: no composites; compiled still equals eager

# ----------------------------------------------------------------------------- nanoGPT's model.py


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None,
            dropout_p=self.dropout if self.training else 0,
            is_causal=True,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 11
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 16
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(  # noqa: C408  (as nanoGPT writes it)
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)
        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss


# ----------------------------------------------------------------------------- helpers


def twins(make):
    """The same module twice, equal weights: one compiled, one eager."""
    torch.manual_seed(0)
    a = make()
    b = make()
    b.load_state_dict(a.state_dict())
    return torch.compile(a), b


def assert_close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(1e-3, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * scale, err_msg=what)


def compare_gpt(make, B=2, T=8, calls=4):
    """A compiled and an eager GPT of equal weights over ``calls`` training calls: logits,
    loss and every parameter's gradient agree. Returns the compiled one's patterns."""
    compiled, eager = twins(make)
    training_calls(compiled, eager, calls, np.random.default_rng(1), B, T)
    return compiled_forward(compiled).summary()["patterns"]


def training_calls(compiled, eager, n, rng, B=2, T=8, what=""):
    """n training calls of both GPTs: logits, loss and every parameter's gradient agree."""
    for call in range(n):
        idx = torch.tensor(rng.integers(0, 11, (B, T)))
        tgt = torch.tensor(rng.integers(0, 11, (B, T)))
        outs = []
        for m in (compiled, eager):
            m.zero_grad()
            logits, loss = m(idx, tgt)
            loss.backward()
            grads = {n: p.grad.numpy() for n, p in m.named_parameters()}
            outs.append((logits.detach().numpy(), loss.item(), grads))
        (lg, ls, gg), (lw, lw_loss, gw) = outs
        assert_close(lg, lw, f"logits, {what}call {call}")
        assert_close(ls, lw_loss, f"loss, {what}call {call}")
        assert gg.keys() == gw.keys()
        for name in gw:
            assert_close(gg[name], gw[name], f"grad of {name}, {what}call {call}")


def compare_fn(make, inputs, calls=4, between=None):
    """A compiled module and its eager twin over ``calls`` calls: every output and the
    gradient of every input and parameter (``between(call, module)`` runs on both before
    each call). Returns the compiled one's patterns."""
    compiled, eager = twins(make)
    rng = np.random.default_rng(2)
    for call in range(calls):
        if between is not None:
            between(call, compiled)
            between(call, eager)
        arrays = [rng.standard_normal(s).astype(np.float32) for s in inputs]
        res = []
        for m in (compiled, eager):
            m.zero_grad()
            xs = [torch.tensor(a, requires_grad=True) for a in arrays]
            out = m(*xs)
            outs = out if isinstance(out, tuple) else (out,)
            w = [
                np.random.default_rng(call).standard_normal(o.shape).astype(np.float32)
                for o in outs
            ]
            sum((o * torch.tensor(wi)).sum() for o, wi in zip(outs, w)).backward()
            grads = [x.grad.numpy() for x in xs] + [p.grad.numpy() for p in m.parameters()]
            res.append(([o.detach().numpy() for o in outs], grads))
        for k, (g, w) in enumerate(zip(res[0][0], res[1][0])):
            assert_close(g, w, f"output {k}, call {call}")
        for k, (g, w) in enumerate(zip(res[0][1], res[1][1])):
            assert_close(g, w, f"gradient {k}, call {call}")
    return compiled_forward(compiled).summary()["patterns"]


def fused(n: int) -> list:
    """What summary()["patterns"] says for n fused blocks (nothing with kernels off)."""
    return [{BLOCK: n}] if ON else [{}]


# ----------------------------------------------------------------------------- nanoGPT


@pytest.mark.parametrize(
    ("n_head", "T"),
    [(2, 8), (1, 8), (2, 1), (4, 12)],
    ids=["nh2-T8", "nh1", "T1", "nh4-T12"],  # nh 1, T 1: contiguous() records nothing
)
def test_nanogpt_gets_the_fused_block_and_equals_eager(n_head, T):
    patterns = compare_gpt(lambda: GPT(GPTConfig(n_head=n_head)), T=T)
    assert patterns == fused(2), patterns


def test_nanogpt_in_eval_mode_gets_the_fused_block():
    """In eval mode nanoGPT passes ``dropout_p=0``, an int: still no dropout."""
    compiled, eager = twins(lambda: GPT(GPTConfig()))
    idx = torch.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
    for m in (compiled, eager):
        m.eval()
    with torch.no_grad():
        for _ in range(4):
            got, want = compiled(idx)[0], eager(idx)[0]
            assert_close(got.numpy(), want.numpy(), "eval logits")
    assert compiled_forward(compiled).summary()["patterns"] == fused(2)


@pytest.mark.skipif(not ON, reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)")
def test_the_block_kernel_runs_the_exact_gelu():
    compiled, _ = twins(lambda: GPT(GPTConfig()))
    idx = torch.tensor(np.zeros((2, 8), dtype=np.int64))
    for _ in range(3):
        compiled(idx, idx)[1].backward()
    entries = compiled_forward(compiled).entries.values()
    (entry,) = [v.graph for vs in entries for v in vs if v.state == "ready"]
    blocks = [s for s in entry.plan if s.pattern == BLOCK]
    assert [s.impl.__name__ for s in blocks] == ["NumbaGPT2Block"] * 2
    assert all(s.kwargs["approximate"] == ("c", "none") for s in blocks)


# ----------------------------------------------------------------------------- other spellings


class Spelled(nn.Module):
    """One pre-LN block, its attention written in one of several ways that all trace the
    stock block's dataflow (or, for the near misses, not)."""

    def __init__(self, how, C=16, n_head=2):
        super().__init__()
        self.how, self.n_head = how, n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C, eps=0.1 if how == "eps" else 1e-5)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.c_out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        mask = ~np.tril(np.ones((16, 16), dtype=bool))
        self.register_buffer("masked", torch.tensor(mask))  # True: may not attend

    def heads(self, t, B, T, C):
        if self.how == "permute":
            return t.reshape(B, T, self.n_head, C // self.n_head).permute(0, 2, 1, 3)
        h = t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        return h.contiguous() if self.how == "copies" else h  # (a recorded copy)

    def attend(self, q, k, v, T):
        if self.how == "scale":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        if self.how == "buffer-mask":  # as nanoGPT's non-flash path: a graph value, folded
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.masked[:T, :T], float("-inf"))
            return F.softmax(att, dim=-1) @ v
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        if self.how == "vqk":
            v = self.heads(v, B, T, C)
            q = self.heads(q, B, T, C)
            k = self.heads(k, B, T, C)
        else:
            q, k, v = (self.heads(t, B, T, C) for t in (q, k, v))
        y = self.attend(q, k, v, T).transpose(1, 2)
        y = y.reshape(B, T, C) if self.how == "permute" else y.contiguous().view(B, T, C)
        a = self.c_proj(y)
        x = a + x if self.how == "left" else x + a
        m = self.c_out(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        out = m + x if self.how == "left" else x + m
        if self.how == "read-inside":
            return out, y  # the merged heads, made inside the block, read outside it
        return out


SPELLINGS = {
    "vqk": "v, q, k reshaped in that order",
    "left": "the residual added on the left: attn(ln_1(x)) + x",
    "permute": "permute and reshape, no contiguous()",
    "copies": "a recorded contiguous() copy of each head",
}


@pytest.mark.parametrize("how", sorted(SPELLINGS), ids=sorted(SPELLINGS))
def test_a_block_spelled_another_way_gets_the_fused_block(how):
    assert compare_fn(lambda: Spelled(how), [(2, 8, 16)]) == fused(1)


NEAR_MISSES = {
    "scale": "another attention scale",
    "buffer-mask": "attention written out with its mask read from a buffer, narrowed after the plan",
    "eps": "two LayerNorms with different eps",
    "read-inside": "a value made inside the block read outside it",
}


def narrow_the_mask(call, module):
    """From the third call on, the buffer's mask also hides the key two back (a window of
    two): a mask read from a buffer may change between calls, and replay must follow it (the
    plan, which folded the causal mask from it, is made again)."""
    if call == 2 and module.how == "buffer-mask":
        with torch.no_grad():
            module.masked.copy_(torch.tensor(~np.tril(np.triu(np.ones((16, 16), bool), -1))))


def test_a_causal_mask_read_from_a_buffer_is_folded_until_the_buffer_changes():
    """Attention written out with its mask read from a bool buffer (``masked[:T, :T]``, True:
    may not attend): the slice equals the causal mask when the plan is made, so the block is
    the fused block (through one attention op). Narrowed in place after the second call, the
    buffer's version moves, the plan is made again, and the attention runs as written."""
    before = []

    def between(call, module):
        fwd = compiled_forward(module)
        if call == 2 and fwd is not None:
            before.append(fwd.summary()["patterns"])
        narrow_the_mask(call, module)

    after = compare_fn(lambda: Spelled("buffer-mask"), [(2, 8, 16)], between=between)
    assert before == [fused(1)], before
    assert BLOCK not in after[0] and ATTENTION not in after[0], after


@pytest.mark.parametrize("how", sorted(NEAR_MISSES), ids=sorted(NEAR_MISSES))
def test_a_near_miss_is_not_fused_and_runs_as_written(how):
    patterns = compare_fn(lambda: Spelled(how), [(2, 8, 16)], between=narrow_the_mask)
    (got,) = patterns
    assert BLOCK not in got and ATTENTION not in got, got


class DroppedAttention(nn.Module):
    """gpt/model.py's attention with dropout between the softmax and ·v; ``interleaved``: a
    second dropout drawn between the two, which the fused op's draw must not move past."""

    def __init__(self, interleaved: bool):
        super().__init__()
        self.interleaved = interleaved
        self.drop = nn.Dropout(0.3)

    def forward(self, q, k, v, z):
        T = q.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = att.masked_fill(~torch.Tensor(F.causal_mask(np, T, T)), float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        z = self.drop(z) if self.interleaved else z
        return att @ v, z


@pytest.mark.parametrize("interleaved", [False, True], ids=["alone", "interleaved"])
def test_attention_dropout_is_the_ops_dropout_and_keeps_the_draws_in_order(interleaved):
    compiled, eager = twins(lambda: DroppedAttention(interleaved))
    rng = np.random.default_rng(3)
    for call in range(3):
        arrays = [rng.standard_normal((2, 2, 6, 4)).astype(np.float32) for _ in range(4)]
        res = []
        for m in (compiled, eager):
            torch.manual_seed(call)  # the same draws for both
            xs = [torch.tensor(a, requires_grad=True) for a in arrays]
            y, z = m(*xs)
            (y.sum() + (z * z).sum()).backward()
            res.append([y.detach().numpy(), z.detach().numpy()] + [x.grad.numpy() for x in xs])
        for k, (g, w) in enumerate(zip(*res)):
            assert_close(g, w, f"value {k}, call {call}")
    got = compiled_forward(compiled).summary()["patterns"][-1]
    label = patterns.CausalAttentionDropout.label
    assert got == ({} if interleaved or not ON else {label: 1}), got


# ----------------------------------------------------------------------------- the matcher


class Gelu(Op):
    """A user's op named as tensorgrad's GELU op, computing something else (x·σ(1.702x))."""

    def forward(self, x, approximate="tanh"):
        self.save(x)
        return x / (1 + np.exp(-1.702 * x))

    def backward(self, g):
        (x,) = self.saved
        s = 1 / (1 + np.exp(-1.702 * x))
        return g * (s + 1.702 * x * s * (1 - s))


class NamedLikeGelu(Spelled):
    """The stock block with a user's op called ``Gelu`` as its activation: patterns are
    keyed on Op classes, not names, so it does not match."""

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (self.heads(t, B, T, C) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.c_out(Gelu.apply(self.c_fc(self.ln_2(x)), approximate="tanh"))


def test_patterns_are_keyed_on_op_classes_not_names():
    patterns = compare_fn(lambda: NamedLikeGelu("stock"), [(2, 8, 16)])
    assert BLOCK not in patterns[0], patterns


def read_before_the_root(x, a, w, b):
    """x + a read by an op between the add and the LayerNorm of it: the AddLayerNorm step,
    standing where the LayerNorm stood, would make the sum after that op reads it."""
    s = x + a
    t = s * 2.0
    return F.layer_norm(s, (8,), w, b) + t


def test_an_output_read_before_the_root_keeps_the_ops():
    class Fn(nn.Module):
        def forward(self, *xs):
            return read_before_the_root(*xs)

    patterns = compare_fn(Fn, [(2, 5, 8), (2, 5, 8), (8,), (8,)])
    assert patterns == [{}], patterns


def test_a_pattern_is_added_in_one_place(monkeypatch):
    """docs/compile.md's example: a tanh GELU written out (minGPT's NewGELU) as one GELU op.
    A subclass of Pattern is the whole change. (patterns.py registers this entry by default:
    it is taken out here, and written again as the docs write it.)"""
    stock = [p for p in patterns.PATTERNS if p is not patterns.WrittenGelu]
    monkeypatch.setattr(patterns, "PATTERNS", stock)  # (undone after)
    V, K, op = patterns.V, patterns.K, patterns.op

    class WrittenGelu(patterns.Pattern):
        label = "GELUs written out as one GELU op"
        inputs, outputs = ("x",), ("y",)
        kernel, ref, fallback = "gelu", ops_nn.Gelu, True

        @staticmethod
        def graph():
            x = V("x")
            cube = op(ew.Mul, op(ew.Pow, x, K("three")), K("c"), commutative=True)
            u = op(ew.Mul, op(ew.Add, x, cube, commutative=True), K("k"), commutative=True)
            t = op(ew.Add, op(ew.Tanh, u), K("one"), commutative=True)
            half = op(ew.Mul, x, K("half"), commutative=True)
            return op(ew.Mul, half, t, commutative=True, name="y")

        @staticmethod
        def conditions(graph, m):
            want = {"three": 3, "c": 0.044715, "k": math.sqrt(2 / math.pi), "one": 1, "half": 0.5}
            if any(not isinstance(m[n], (int, float)) or m[n] != v for n, v in want.items()):
                return None
            return {"approximate": "tanh"}

    assert patterns.PATTERNS[-1] is WrittenGelu

    class NewGELU(nn.Module):  # minGPT's
        def forward(self, x):
            return (
                0.5
                * x
                * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
            )

    got = compare_fn(NewGELU, [(4, 64)])
    assert got == ([{"GELUs written out as one GELU op": 1}] if ON else [{}]), got


def test_every_pattern_binds_what_it_names():
    """The registry's entries, in order; the block's inputs are the kernel's, in its order; an
    entry whose outputs it does not bind is refused where it is written."""
    assert [p.__name__ for p in patterns.PATTERNS] == [
        "WrittenGelu",  # (first: the block reads the one GELU op it makes, and
        "CausalAttention",  # the one attention op this one makes)
        "CausalAttentionDropout",
        "GPT2Block",
        "AddLayerNormPattern",
    ]
    with pytest.raises(ValueError, match="not a value the pattern binds"):

        class Broken(patterns.Pattern):
            inputs, outputs = ("x",), ("nowhere",)

            @staticmethod
            def graph():
                return patterns.op(ops_nn.Gelu, patterns.V("x"), name="y")

    assert [p.__name__ for p in patterns.PATTERNS][-1] == "AddLayerNormPattern"
    pytest.importorskip("numba", reason="numba is not installed: pip install numba")
    from tensorgrad.kernels.cpu_gpt2_block import GPT2_BLOCK_PARAMS

    assert patterns.GPT2Block.inputs == ("x", *GPT2_BLOCK_PARAMS)
