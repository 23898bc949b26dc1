"""The GPT of gpt/model.py written in PyTorch eager, for side-by-side benchmarks.

Same architecture and parameter names as ``gpt.model.GPT`` (GPT-2 pre-LN blocks, fused
c_attn, causal ``F.scaled_dot_product_attention``, tanh GELU, wte tied to the unembedding,
biases, no dropout), so ``load_tensorgrad_state`` copies tensorgrad's weights in and both
frameworks do the same arithmetic. Imported only when torch is installed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x, cache=None, layer: int = 0):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, nh, S, hs)
        # one new query attends to every cached key; a full block is causal
        y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, eps: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = MLP(n_embd)

    def forward(self, x, cache=None, layer: int = 0):
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class KVCache:
    """Preallocated (B, nh, block_size, hs) keys and values per layer, as gpt.model.KVCache."""

    def __init__(self, n_layer, B, nh, block_size, hs):
        self.k = [torch.zeros(B, nh, block_size, hs) for _ in range(n_layer)]
        self.v = [torch.zeros(B, nh, block_size, hs) for _ in range(n_layer)]
        self.length = 0

    def append(self, layer, k, v):
        t0, t1 = self.length, self.length + k.shape[2]
        self.k[layer][:, :, t0:t1] = k
        self.v[layer][:, :, t0:t1] = v
        return self.k[layer][:, :, :t1], self.v[layer][:, :, :t1]


class TorchGPT(nn.Module):
    """GPT-2 with tied embeddings; ``config`` is a gpt.config.GPTConfig (dropout must be 0)."""

    def __init__(self, config):
        super().__init__()
        if config.dropout or not config.bias or not config.tie_weights or config.gelu != "tanh":
            raise ValueError("TorchGPT mirrors only dropout=0, bias=True, tied, tanh-GELU configs")
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, C),
                wpe=nn.Embedding(config.block_size, C),
                h=nn.ModuleList(
                    [Block(C, config.n_head, config.layer_norm_eps) for _ in range(config.n_layer)]
                ),
                ln_f=nn.LayerNorm(C, eps=config.layer_norm_eps),
            )
        )
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx, targets=None, cache: KVCache | None = None):
        B, T = idx.shape
        offset = cache.length if cache is not None else 0
        pos = torch.arange(offset, offset + T)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += T
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None  # (B, 1, V)
        logits = self.lm_head(x)  # (B, T, V)
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas=(0.9, 0.95)):
        """torch.optim.AdamW with the groups of gpt.model.GPT.configure_optimizers."""
        params = [p for p in self.parameters() if p.requires_grad]  # tied matrix once
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    def new_cache(self, B: int) -> KVCache:
        c = self.config
        return KVCache(c.n_layer, B, c.n_head, c.block_size, c.n_embd // c.n_head)

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens: int, use_cache: bool = True):
        """Greedy decoding, one (B,) tensor of new ids per step (the benchmark's twin of
        GPT.generate_stream with temperature 0)."""
        bs = self.config.block_size
        ctx, cache = idx, None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits, _ = self(ctx[:, -bs:])
            elif cache is None or cache.length >= bs:
                cache = self.new_cache(ctx.shape[0])
                logits, _ = self(ctx[:, -bs:], cache=cache)
            else:
                logits, _ = self(ctx[:, -1:], cache=cache)
            nxt = logits[:, -1, :].argmax(dim=-1)
            ctx = torch.cat([ctx, nxt[:, None]], dim=1)
            yield nxt


def load_tensorgrad_state(model: TorchGPT, tg_model) -> None:
    """Copy every parameter of a tensorgrad GPT into ``model`` by its GPT-2 name."""
    state = {n: torch.from_numpy(a.numpy().copy()) for n, a in tg_model.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # the tied lm_head shares wte's storage, so it may be reported either way
    if [m for m in missing if m != "lm_head.weight"] or [
        u for u in unexpected if u != "lm_head.weight"
    ]:
        raise KeyError(f"state_dict names differ: missing {missing}, unexpected {unexpected}")


def init_gpt2(model: TorchGPT) -> None:
    """GPT-2 init (N(0, 0.02), residual projections scaled by 1/√(2·n_layer)), as gpt.model."""
    std_proj = 0.02 / math.sqrt(2 * model.config.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):
                p.normal_(0.0, std_proj)
            elif name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
