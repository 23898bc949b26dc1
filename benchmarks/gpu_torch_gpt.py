"""gpt/model.py's GPT in PyTorch eager on any device, for the GPU side-by-side benchmark.

Same architecture and GPT-2 parameter names (pre-LN blocks, fused c_attn, causal
``F.scaled_dot_product_attention``, tanh GELU, wte tied to the unembedding, biases, no
dropout), so ``from_tensorgrad`` copies a tensorgrad model's weights in and both frameworks
start from the same numbers. (benchmarks/torch_gpt.py is the CPU twin; this one keeps every
tensor on the model's device.) Imported only where torch is installed.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, C: int, n_head: int, eps: float):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class TorchGPT(nn.Module):
    """GPT-2 with tied embeddings; ``config`` is a gpt.config.GPTConfig (dropout 0, biases)."""

    def __init__(self, config):
        super().__init__()
        if config.dropout or not config.bias or not config.tie_weights or config.gelu != "tanh":
            raise ValueError("TorchGPT mirrors only dropout=0, bias=True, tied, tanh-GELU configs")
        C = config.n_embd
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, C),
                "wpe": nn.Embedding(config.block_size, C),
                "h": nn.ModuleList(
                    [Block(C, config.n_head, config.layer_norm_eps) for _ in range(config.n_layer)]
                ),
                "ln_f": nn.LayerNorm(C, eps=config.layer_norm_eps),
            }
        )

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        logits = F.linear(self.transformer.ln_f(x), self.transformer.wte.weight)  # (B, T, V)
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas=(0.9, 0.95)):
        """torch.optim.AdamW with gpt.model.GPT's groups (decay on >= 2-D parameters)."""
        params = list(self.parameters())
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def from_tensorgrad(tg_model, device) -> TorchGPT:
    """A TorchGPT on ``device`` holding a copy of a tensorgrad GPT's parameters."""
    from tensorgrad.devices import to_numpy

    model = TorchGPT(tg_model.config)
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in tg_model.named_parameters():
            own[name].copy_(torch.from_numpy(np.ascontiguousarray(to_numpy(p.array))))
    return model.to(device)
