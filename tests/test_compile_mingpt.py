"""minGPT's model (karpathy/minGPT, mingpt/model.py; MIT), written here as it is with the
imports changed, compiled, gets the fused GPT-2 block kernel as ``gpt/model.py`` does.

minGPT writes its block unlike nanoGPT: attention written out with its causal mask read from
a float buffer (``self.bias[:, :, :T, :T] == 0``), the tanh GELU written out (``NewGELU``),
the MLP a ``ModuleDict`` called through a lambda attribute. The comparison records an op, the
mask is folded from the buffer when the plan is made (and the plan is made again when the
buffer changes), and the written GELU and attention become the ops the block pattern reads.
Everything compiled is compared with an eager twin of the same weights: logits, loss and
every gradient, over four calls; with TG_KERNELS=0 nothing is fused and it still agrees.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_compile_patterns import (
    ATTENTION,
    BLOCK,
    ON,
    assert_close,
    compare_fn,
    compare_gpt,
    fused,
    training_calls,
    twins,
)

import tensorgrad as torch  # minGPT's imports, changed
import tensorgrad.nn as nn
from tensorgrad.compiler import MAX_REPLANS, CompileWarning, compiled_forward
from tensorgrad.nn import functional as F

# ----------------------------------------------------------------------------- mingpt/utils.py


class CfgNode:
    """a lightweight configuration class inspired by yacs"""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def to_dict(self):
        """return a dict representation of the config"""
        return {k: v.to_dict() if isinstance(v, CfgNode) else v for k, v in self.__dict__.items()}

    def merge_from_dict(self, d):
        self.__dict__.update(d)


CN = CfgNode

# ----------------------------------------------------------------------------- mingpt/model.py


class NewGELU(nn.Module):
    """
    Implementation of the GELU activation function currently in Google BERT repo (identical to OpenAI GPT).
    Reference: Gaussian Error Linear Units (GELU) paper: https://arxiv.org/abs/1606.08415
    """  # noqa: E501

    def forward(self, x):
        return (
            0.5
            * x
            * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        )


class CausalSelfAttention(nn.Module):
    """
    A vanilla multi-head masked self-attention layer with a projection at the end.
    It is possible to use torch.nn.MultiheadAttention here but I am including an
    explicit implementation here to show that there is nothing too scary here.
    """

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = (
            y.transpose(1, 2).contiguous().view(B, T, C)
        )  # re-assemble all head outputs side by side

        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class Block(nn.Module):
    """an unassuming Transformer block"""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(
            dict(  # noqa: C408  (as minGPT writes it)
                c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
                c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
                act=NewGELU(),
                dropout=nn.Dropout(config.resid_pdrop),
            )
        )
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlpf(self.ln_2(x))
        return x


class GPT(nn.Module):
    """GPT Language Model"""

    @staticmethod
    def get_default_config():
        C = CN()
        # either model_type or (n_layer, n_head, n_embd) must be given in the config
        C.model_type = "gpt"
        C.n_layer = None
        C.n_head = None
        C.n_embd = None
        # these options must be filled in externally
        C.vocab_size = None
        C.block_size = None
        # dropout hyperparameters
        C.embd_pdrop = 0.1
        C.resid_pdrop = 0.1
        C.attn_pdrop = 0.1
        return C

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.block_size = config.block_size

        type_given = config.model_type is not None
        params_given = all(
            [config.n_layer is not None, config.n_head is not None, config.n_embd is not None]
        )
        assert type_given ^ params_given  # exactly one of these (XOR)
        if type_given:
            # translate from model_type to detailed configuration
            config.merge_from_dict(
                {
                    # names follow the huggingface naming conventions
                    # GPT-1
                    "openai-gpt": dict(n_layer=12, n_head=12, n_embd=768),  # noqa: C408  117M params
                    # GPT-2 configs
                    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # noqa: C408  124M params
                    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # noqa: C408  350M
                    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # noqa: C408  774M
                    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # noqa: C408  1558M
                    # Gophers
                    "gopher-44m": dict(n_layer=8, n_head=16, n_embd=512),  # noqa: C408
                    # (there are a number more...)
                    # I made these tiny models up
                    "gpt-mini": dict(n_layer=6, n_head=6, n_embd=192),  # noqa: C408
                    "gpt-micro": dict(n_layer=4, n_head=4, n_embd=128),  # noqa: C408
                    "gpt-nano": dict(n_layer=3, n_head=3, n_embd=48),  # noqa: C408
                }[config.model_type]
            )

        self.transformer = nn.ModuleDict(
            dict(  # noqa: C408
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.embd_pdrop),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

        # init all weights, and apply a special scaled init to the residual projections, per GPT-2 paper
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

        # report number of parameters (note we don't count the decoder parameters in lm_head)
        n_params = sum(p.numel() for p in self.transformer.parameters())
        print("number of parameters: %.2fM" % (n_params / 1e6,))  # noqa: UP031

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.zeros_(module.bias)
            torch.nn.init.ones_(module.weight)

    # (from_pretrained, which loads Hugging Face's weights, is left out)

    def configure_optimizers(self, train_config):
        """
        This long function is unfortunately doing something very simple and is being very defensive:
        We are separating out all parameters of the model into two buckets: those that will experience
        weight decay for regularization and those that won't (biases, and layernorm/embedding weights).
        We are then returning the PyTorch optimizer object.
        """  # noqa: E501

        # separate out all parameters to those that will and won't experience regularizing weight decay
        decay = set()
        no_decay = set()
        whitelist_weight_modules = (torch.nn.Linear,)
        blacklist_weight_modules = (torch.nn.LayerNorm, torch.nn.Embedding)
        for mn, m in self.named_modules():
            for pn, _p in m.named_parameters():
                fpn = "%s.%s" % (mn, pn) if mn else pn  # full param name  # noqa: UP031
                # random note: because named_modules and named_parameters are recursive
                # we will see the same tensors p many many times. but doing it this way
                # allows us to know which parent module any tensor p belongs to...
                if pn.endswith("bias"):
                    # all biases will not be decayed
                    no_decay.add(fpn)
                elif pn.endswith("weight") and isinstance(m, whitelist_weight_modules):
                    # weights of whitelist modules will be weight decayed
                    decay.add(fpn)
                elif pn.endswith("weight") and isinstance(m, blacklist_weight_modules):
                    # weights of blacklist modules will NOT be weight decayed
                    no_decay.add(fpn)

        # validate that we considered every parameter
        param_dict = {pn: p for pn, p in self.named_parameters()}
        inter_params = decay & no_decay
        union_params = decay | no_decay
        assert len(inter_params) == 0, "parameters %s made it into both decay/no_decay sets!" % (  # noqa: UP031
            str(inter_params),
        )
        assert len(param_dict.keys() - union_params) == 0, (
            "parameters %s were not separated into either decay/no_decay set!"  # noqa: UP031
            % (str(param_dict.keys() - union_params),)
        )

        # create the pytorch optimizer object
        optim_groups = [
            {
                "params": [param_dict[pn] for pn in sorted(list(decay))],
                "weight_decay": train_config.weight_decay,
            },
            {"params": [param_dict[pn] for pn in sorted(list(no_decay))], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(
            optim_groups, lr=train_config.learning_rate, betas=train_config.betas
        )
        return optimizer

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.block_size, (
            f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        )
        pos = torch.arange(0, t, dtype=torch.long, device=device).unsqueeze(0)  # shape (1, t)

        # forward the GPT model itself
        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (1, t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)

        # if we are given some desired targets also calculate the loss
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )

        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, do_sample=False, top_k=None):
        """
        Take a conditioning sequence of indices idx (LongTensor of shape (b,t)) and complete
        the sequence max_new_tokens times, feeding the predictions back into the model each time.
        Most likely you'll want to make sure to be in model.eval() mode of operation for this.
        """
        for _ in range(max_new_tokens):
            # if the sequence context is growing too long we must crop it at block_size
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size :]
            # forward the model to get the logits for the index in the sequence
            logits, _ = self(idx_cond)
            # pluck the logits at the final step and scale by desired temperature
            logits = logits[:, -1, :] / temperature
            # optionally crop the logits to only the top k options
            if top_k is not None:
                v, _ = torch.topk(logits, top_k)
                logits[logits < v[:, [-1]]] = -float("Inf")
            # apply softmax to convert logits to (normalized) probabilities
            probs = F.softmax(logits, dim=-1)
            # either sample from the distribution or take the most likely element
            if do_sample:
                idx_next = torch.multinomial(probs, num_samples=1)
            else:
                _, idx_next = torch.topk(probs, k=1, dim=-1)
            # append sampled index to the running sequence and continue
            idx = torch.cat((idx, idx_next), dim=1)

        return idx


# ----------------------------------------------------------------------------- helpers


def config(n_head=2, n_embd=16, pdrop=0.0, n_layer=2):
    C = GPT.get_default_config()
    C.model_type = None
    C.n_layer, C.n_head, C.n_embd = n_layer, n_head, n_embd
    C.vocab_size, C.block_size = 11, 16
    C.embd_pdrop = C.resid_pdrop = C.attn_pdrop = pdrop
    return C


def summary(model) -> dict:
    return compiled_forward(model).summary()


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("n_head", "T"),
    [(2, 8), (1, 8), (2, 1), (4, 12)],
    ids=["nh2-T8", "nh1", "T1", "nh4-T12"],  # nh 1, T 1: contiguous() records nothing
)
def test_mingpt_gets_the_fused_block_and_equals_eager(n_head, T, recwarn):
    patterns = compare_gpt(lambda: GPT(config(n_head=n_head)), T=T)
    assert patterns == fused(2), patterns
    assert not [w for w in recwarn if issubclass(w.category, CompileWarning)]


def test_mingpt_in_eval_mode_with_dropout_gets_the_fused_block():
    """minGPT's default dropouts (0.1), in eval mode: no dropout, so the block matches."""
    compiled, eager = twins(lambda: GPT(config(pdrop=0.1)))
    idx = torch.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
    for m in (compiled, eager):
        m.eval()
    with torch.no_grad():
        for _ in range(4):
            got, want = compiled(idx)[0], eager(idx)[0]
            assert_close(got.numpy(), want.numpy(), "eval logits")
    s = summary(compiled)
    assert s["patterns"] == fused(2) and s["eager"] == [], s


def window(bias, T=16):
    """bias, in place: each query also no longer sees the key two back (a window of two)."""
    with torch.no_grad():
        bias.copy_(torch.tensor(np.tril(np.triu(np.ones((T, T), np.float32), -1))).view(1, 1, T, T))


def causal(bias, T=16):
    with torch.no_grad():
        bias.copy_(torch.tril(torch.ones(T, T)).view(1, 1, T, T))


@pytest.mark.parametrize(
    "change",
    ["in place", "data swapped", "in place and back", "replaced"],
)
def test_a_mask_buffer_changed_after_the_plan_is_not_replayed_stale(change):
    """The block's mask is folded from block 0's buffer when the plan is made. Changed in place
    (its version moves) or given another array of its shape (``.data``), the plan is made again
    before the next replay: block 0 then runs its attention as written, the other block stays
    fused; the mask put back, both are fused again. Compiled equals eager throughout."""
    compiled, eager = twins(lambda: GPT(config()))
    rng = np.random.default_rng(3)
    training_calls(compiled, eager, 3, rng)
    assert summary(compiled)["patterns"] == fused(2)
    for m in (compiled, eager):
        bias = m.transformer.h[0].attn.bias
        new = np.tril(np.triu(np.ones((16, 16), np.float32), -1)).reshape(1, 1, 16, 16)
        if change == "data swapped":
            bias.data = new.copy()
        elif change == "replaced":  # another buffer: another signature, traced afresh
            m.transformer.h[0].attn.bias = torch.tensor(new)
        else:
            window(bias)
    training_calls(compiled, eager, 3, rng, what="after the change: ")
    s = summary(compiled)
    if change == "replaced":
        s = {**s, "compiled": s["compiled"] - 1, "patterns": s["patterns"][-1:]}
    assert s["compiled"] == 1 and s["eager"] == [], s
    if ON:  # block 0's attention as written (its GELU still one op), block 1 fused
        (got,) = s["patterns"]
        assert got.get(BLOCK) == 1 and ATTENTION not in got, got
    else:
        assert s["patterns"] == [{}], s
    if change == "in place and back":
        for m in (compiled, eager):
            causal(m.transformer.h[0].attn.bias)
        training_calls(compiled, eager, 2, rng, what="put back: ")
        assert summary(compiled)["patterns"] == fused(2)


def test_a_mask_buffer_changed_every_call_stops_being_folded():
    """A buffer changed before every call would make a plan every call: after a few, the plan
    no longer folds buffers (the attention runs as written), and still equals eager."""
    compiled, eager = twins(lambda: GPT(config(n_layer=1)))
    rng = np.random.default_rng(4)
    for call in range(12):
        for m in (compiled, eager):
            (causal if call % 2 else window)(m.transformer.h[0].attn.bias)
        training_calls(compiled, eager, 1, rng, what=f"round {call}: ")
    s = summary(compiled)
    assert s["compiled"] == 1 and s["eager"] == [], s
    assert BLOCK not in s["patterns"][0] and ATTENTION not in s["patterns"][0], s
    (graph,) = [v.graph for vs in compiled_forward(compiled).entries.values() for v in vs]
    assert graph.pins == [] and graph.replans == (MAX_REPLANS + 1 if ON else 0)


class MaskedAttention(nn.Module):
    """Attention written out, its mask made from a buffer in one of several ways (``how``)."""

    def __init__(self, how, n=16):
        super().__init__()
        self.how = how
        tril = np.tril(np.ones((n, n), np.float32))
        window = np.tril(np.triu(np.ones((n, n), np.float32), -1))
        buf = {"== 0": tril, "!= 0": 1 - tril, "bool": tril == 0, "~bool": tril == 1}
        buf["window"] = window
        self.register_buffer("bias", torch.tensor(buf[how]).view(1, 1, n, n))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        m = self.bias[:, :, :T, :T]
        if self.how in ("== 0", "window"):
            mask = m == 0
        else:
            mask = {"!= 0": lambda: m != 0, "bool": lambda: m, "~bool": lambda: ~m}[self.how]()
        att = att.masked_fill(mask, float("-inf"))
        return F.softmax(att, dim=-1) @ v


@pytest.mark.parametrize("how", ["== 0", "!= 0", "bool", "~bool", "window"])
def test_a_causal_mask_made_from_a_buffer_makes_one_attention_op(how):
    """Whatever ops make the mask from the buffer (a slice, == 0, != 0, ~), the plan folds its
    value: the causal mask becomes one attention op; a window of two is another mask and runs
    as written."""
    patterns = compare_fn(lambda: MaskedAttention(how), [(2, 2, 8, 4)] * 3)
    want = [{ATTENTION: 1}] if ON and how != "window" else [{}]
    assert patterns == want, patterns


@pytest.mark.skipif(not ON, reason="TG_KERNELS=0: no composites (unset TG_KERNELS to run it)")
def test_the_written_attention_alone_becomes_one_attention_op():
    """minGPT's attention with attention dropout in training mode cannot be the fused block,
    nor one attention op (dropout between softmax and @ v): it runs as written; its written
    GELU still becomes one GELU op."""
    compiled, eager = twins(lambda: GPT(config()))
    for block in (*compiled.transformer.h, *eager.transformer.h):
        block.attn.attn_dropout.p = 0.5
    torch.manual_seed(5)
    idx = torch.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
    for _ in range(3):
        compiled(idx, idx)[1].backward()
    s = summary(compiled)
    assert s["eager"] == [] and BLOCK not in s["patterns"][0], s
    assert ATTENTION not in s["patterns"][0], s
    assert s["patterns"][0].get("GELUs written out as one GELU op") == 2, s
