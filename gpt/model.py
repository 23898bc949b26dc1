"""The GPT-2 transformer on tensorgrad, with GPT-2's parameter names and initialisation.

Shapes in comments: B batch, T sequence length, C = n_embd, nh heads, hs = C / nh head
size, V vocabulary, S keys (T plus cached positions when generating).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import as_array, get_array_module, nn, to_device, to_numpy
from tensorgrad import generator as rng

from .config import GPTConfig


class KVCache:
    """Keys and values of the positions seen so far, one (B, nh, block_size, hs) pair a layer.

    Preallocated, so appending a position writes in place instead of re-concatenating.
    """

    def __init__(self, config: GPTConfig, batch_size: int, xp, dtype):
        hs = config.n_embd // config.n_head
        shape = (batch_size, config.n_head, config.block_size, hs)
        self.k = [xp.zeros(shape, dtype) for _ in range(config.n_layer)]
        self.v = [xp.zeros(shape, dtype) for _ in range(config.n_layer)]
        self.length = 0  # positions filled

    def append(self, layer: int, k, v):
        """Store (B, nh, T, hs) keys/values after the cached ones; return all of them."""
        t0, t1 = self.length, self.length + k.shape[2]
        self.k[layer][:, :, t0:t1] = k.array
        self.v[layer][:, :, t0:t1] = v.array
        return tg.Tensor(self.k[layer][:, :, :t1]), tg.Tensor(self.v[layer][:, :, :t1])


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        C = config.n_embd
        self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)  # W_Q, W_K, W_V as one matrix
        self.c_proj = nn.Linear(C, C, bias=config.bias)  # W_O
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, C

    def forward(self, x, mask=None, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, nh, S, hs)
        S = k.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S) scores
        allowed = mask if mask is not None else F.causal_mask(get_array_module(x), T, S)
        att = att.masked_fill(~tg.Tensor(allowed), float("-inf"))  # no looking ahead
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),  # token embedding E
                "wpe": nn.Embedding(config.block_size, config.n_embd),  # position embedding
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                "ln_f": nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias),
            }
        )
        if config.tie_weights:
            self.lm_head = None  # the unembedding is transformer.wte.weight itself
        else:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._init_weights()

    # ------------------------------------------------------------------ init and bookkeeping
    def _init_weights(self):
        """GPT-2 init: N(0, 0.02) weights, zero biases, N(0, 0.02/√(2·n_layer)) residual proj."""
        g = rng("cpu")
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                p.array = g.normal(0.0, proj_std, p.shape).astype(np.float32)
            elif name.endswith((".ln_1.weight", ".ln_2.weight", "ln_f.weight")):
                p.array = np.ones(p.shape, np.float32)
            elif name.endswith(".bias"):
                p.array = np.zeros(p.shape, np.float32)
            else:
                p.array = g.normal(0.0, 0.02, p.shape).astype(np.float32)

    @property
    def unembedding(self) -> nn.Parameter:
        return self.transformer.wte.weight if self.lm_head is None else self.lm_head.weight

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True):
        yield from super().named_parameters(prefix, remove_duplicate)
        if self.lm_head is None and not remove_duplicate:
            # tied: list the shared matrix under its GPT-2 name as well
            yield (f"{prefix}." if prefix else "") + "lm_head.weight", self.transformer.wte.weight

    def load_state_dict(self, state: dict, strict: bool = True):
        """As Module.load_state_dict; with tied weights 'lm_head.weight' may be absent."""
        state = dict(state)
        if self.lm_head is None:
            head = state.pop("lm_head.weight", None)
            wte = state.get("transformer.wte.weight", head)
            if wte is not None:
                state["transformer.wte.weight"] = state["lm_head.weight"] = wte
        return super().load_state_dict(state, strict)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (the tied matrix once); by default without position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def estimate_flops_per_token(self, T: int) -> float:
        """Training FLOPs per token, as nanoGPT's MFU estimate: 6·N + 12·L·H·Q·T.

        N = num_params() (non-embedding), L layers, H heads, Q head size, T context:
        6·N for the matmuls' forward and backward, 12·L·H·Q·T for attention scores and values.
        """
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * T

    # ------------------------------------------------------------------ forward
    def _check_idx(self, idx):
        """idx as a (B, T) integer Tensor. Its values are not read here (a compiled forward
        would replay past such a read): the embedding checks each id is in the vocabulary."""
        idx = tg.as_tensor(idx)
        if idx.ndim == 1:
            idx = idx.unsqueeze(0)
        if idx.ndim != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        if idx.dtype.kind not in "iu":
            raise ValueError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        return idx

    def _masks(self, idx, attention_mask, doc_sep, offset: int, S: int):
        """Position ids and the boolean (B, 1, T, S) attention mask, or None for plain causal."""
        xp = get_array_module(idx)
        B, T = idx.shape
        pos = xp.arange(offset, offset + T)[None, :]
        if attention_mask is None and doc_sep is None:
            return pos, None
        idx = as_array(idx)  # the masks are computed in NumPy from the ids (tg.compile: eager)
        allowed = F.causal_mask(xp, T, S)[None]  # (1, T, S)
        if attention_mask is not None:
            am = as_array(attention_mask).astype(bool)
            if am.shape != (B, S):
                raise ValueError(f"attention_mask must have shape {(B, S)}, got {tuple(am.shape)}")
            own = xp.arange(S)[None, :] == xp.arange(offset, S)[:, None]  # (T, S) own key
            allowed = allowed & (am[:, None, :] | own)  # padded keys unseen (a padded row
            # sees itself alone, so that its softmax is defined: its output is never read)
        if doc_sep is not None:
            # a separator ends its document: doc id = separators strictly before t
            sep = idx == doc_sep
            doc = xp.cumsum(sep, axis=1) - sep
            allowed = allowed & (doc[:, :, None] == doc[:, None, :])
            # positions restart at each document, as if each ran alone
            t = xp.arange(T)[None, :]
            start = xp.maximum.accumulate(xp.where(sep, t + 1, 0), axis=1)
            start = xp.concatenate([xp.zeros((B, 1), start.dtype), start[:, :-1]], axis=1)
            pos = t - start
        return pos, allowed[:, None]  # (B, 1, T, S)

    def forward(
        self,
        idx,
        targets=None,
        attention_mask=None,
        doc_sep: int | None = None,
        cache: KVCache | None = None,
    ):
        """Logits and loss. idx: (B, T) token ids.

        With targets (B, T): logits (B, T, V) and the mean cross-entropy over positions whose
        target is not -1. Without: logits of the last position only, (B, 1, V), and None.
        attention_mask (B, T) of 0/1 hides right-padding keys; doc_sep=<id> keeps attention
        (and position ids) within each packed document.
        """
        idx = self._check_idx(idx)
        B, T = idx.shape
        offset = cache.length if cache is not None else 0
        if offset + T > self.config.block_size:
            raise ValueError(
                f"sequence length {offset + T} exceeds block_size {self.config.block_size}"
            )
        pos, mask = self._masks(idx, attention_mask, doc_sep, offset, offset + T)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, mask, cache, i)
        if cache is not None:
            cache.length += T
        x = self.transformer.ln_f(x)
        if targets is None:
            x = x[:, -1:, :]  # only the last position's prediction is needed
        logits = F.linear(x, self.unembedding)  # (B, T, V) = H·Eᵀ
        if targets is None:
            return logits, None
        targets = tg.as_tensor(targets)  # shares the array: tensor ops from here on
        if tuple(targets.shape) != (B, T):
            raise ValueError(f"targets must have shape {(B, T)}, got {tuple(targets.shape)}")
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1).long(), ignore_index=-1)
        return logits, loss

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas=(0.9, 0.95)):
        """AdamW with decay on every ≥2-D parameter (matmul weights, embeddings) only."""
        from .optim import AdamW

        params = list(self.named_parameters())  # the tied matrix appears once
        decay = [p for _, p in params if p.ndim >= 2]
        no_decay = [p for _, p in params if p.ndim < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return AdamW(groups, lr=learning_rate, betas=betas)

    # ------------------------------------------------------------------ generation
    def generate_stream(
        self,
        idx,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        seed: int | None = None,
        use_cache: bool = True,
        suppress_tokens=None,
    ):
        """Yield (B,) arrays of new tokens one step at a time (see ``generate``)."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        was_training = self.training
        self.eval()
        try:
            ctx = to_numpy(self._check_idx(idx)).astype(np.int64)
            gen = np.random.Generator(np.random.PCG64(seed)) if seed is not None else rng("cpu")
            bs = self.config.block_size
            cache, done = None, np.zeros(ctx.shape[0], dtype=bool)
            xp = get_array_module(self.transformer.wte.weight.array)
            for _ in range(max_new_tokens):
                window = ctx[:, -bs:]  # the last block_size tokens: all the model can see
                if use_cache and ctx.shape[1] <= bs:  # every position still has its own slot
                    if cache is None:  # fill the cache from the prompt
                        dtype = self.transformer.wte.weight.dtype
                        cache = KVCache(self.config, ctx.shape[0], xp, dtype)
                    else:  # then one token at a time against the cached keys and values
                        window = ctx[:, -1:]
                else:  # past the block the positions shift: the whole window, one forward
                    cache = None  # (of fixed shape: a compiled model replays it)
                # per step, not a decorator: no_grad around a generator function ends before
                # its body runs, and must not stay on while the caller runs between tokens
                with tg.no_grad():
                    window = to_device(window, _dev(xp))
                    logits, _ = self(window) if cache is None else self(window, cache=cache)
                last = to_numpy(logits.array)[:, -1, :]
                if suppress_tokens:
                    last = last.copy()
                    last[:, list(suppress_tokens)] = -np.inf
                nxt = sample_next(last, temperature, top_k, top_p, gen)
                if eos_token_id is not None:
                    nxt = np.where(done, eos_token_id, nxt)
                    done |= nxt == eos_token_id
                ctx = np.concatenate([ctx, nxt[:, None]], axis=1)
                yield nxt
                if eos_token_id is not None and done.all():
                    break
        finally:
            self.train(was_training)

    def generate(
        self,
        idx,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        seed: int | None = None,
        use_cache: bool = True,
        suppress_tokens=None,
    ) -> np.ndarray:
        """The prompt (B, T) followed by up to max_new_tokens sampled tokens, (B, T + new).

        temperature 0 is greedy; top_k keeps the k likeliest tokens, top_p the smallest set
        whose probability reaches p; a row that emits eos_token_id is padded with it and
        generation stops when every row has. The context is cropped to block_size. With
        use_cache each new token runs the blocks on one position against cached keys/values.
        Token ids in suppress_tokens are never sampled (e.g. a tokenizer's unknown token).
        """
        prompt = to_numpy(self._check_idx(idx)).astype(np.int64)
        new = list(
            self.generate_stream(
                prompt,
                max_new_tokens,
                temperature,
                top_k,
                top_p,
                eos_token_id,
                seed,
                use_cache,
                suppress_tokens,
            )
        )
        if not new:
            return prompt
        return np.concatenate([prompt, np.stack(new, axis=1)], axis=1)

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, name_or_path, revision: str | None = None) -> GPT:
        """GPT-2 from a Hugging Face-format directory (config.json + model.safetensors) or a
        hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl, owner/repo; see gpt.hub), fetched
        into the hub cache; validated before anything is allocated."""
        from .hub import resolve
        from .store.checkpoint import load_hf_gpt2

        return load_hf_gpt2(cls, resolve(name_or_path, revision))

    def save_pretrained(self, directory, tokenizer=None) -> None:
        """Write a directory that transformers.GPT2LMHeadModel.from_pretrained loads (config.json,
        model.safetensors, and the tokenizer's files when given); see gpt.hf_format."""
        from .hf_format import save_pretrained

        save_pretrained(self, directory, tokenizer)

    # ------------------------------------------------------------------ nanoGPT's names
    def get_num_params(self, non_embedding: bool = True) -> int:
        """nanoGPT's name for ``num_params``."""
        return self.num_params(non_embedding)

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context to ``block_size`` (e.g. to fine-tune GPT-2 on shorter windows)."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(
                f"crop_block_size: {block_size} is not in [1, {self.config.block_size}]"
            )
        self.config = dataclasses.replace(self.config, block_size=block_size)
        wpe = self.transformer.wpe
        wpe.weight = nn.Parameter(wpe.weight.array[:block_size].copy())
        wpe.num_embeddings = block_size

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float, peak_flops: float = 312e12) -> float:
        """Model FLOPs utilisation as nanoGPT reports it: achieved training FLOP/s over
        ``peak_flops`` (default an A100's bf16 peak, nanoGPT's; pass your hardware's)."""
        T = self.config.block_size
        return self.estimate_flops_per_token(T) * T * fwdbwd_per_iter / dt / peak_flops


def _dev(xp) -> str:
    return "cpu" if xp is np else "cuda"


def sample_next(logits: np.ndarray, temperature: float, top_k, top_p, gen) -> np.ndarray:
    """One token id per row from (B, V) logits (NumPy, float64 for the arithmetic)."""
    logits = logits.astype(np.float64)
    if temperature == 0:
        return logits.argmax(axis=-1)
    logits = logits / temperature
    V = logits.shape[-1]
    if top_k is not None and top_k < V:
        kth = np.partition(logits, V - top_k, axis=-1)[:, V - top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        # drop a token when the tokens ranked above it already reach top_p
        # (less a rounding margin: the normalising sum rounds with the vocabulary's order, and
        # the boundary must not: probs [.5, .3, .2] with top_p .8 keep two in every order)
        drop_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p >= top_p - 1e-12
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    u = gen.random(probs.shape[0])
    cdf = np.cumsum(probs, axis=-1)
    return np.minimum((cdf < (u * cdf[:, -1])[:, None]).sum(axis=-1), V - 1)
