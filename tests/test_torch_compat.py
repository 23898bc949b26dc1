"""Code written for PyTorch runs with only its import lines changed (issue 12).

The first part is a nanoGPT-style model and training loop written here as a PyTorch user
would (not copied from anywhere), using the idioms GPT code uses: register_buffer of a
causal mask, F.scaled_dot_product_attention, Module.apply with nn.init, configure_optimizers
with inspect.signature, param-group lr edits, clip_grad_norm_, f"{loss:.4f}", a multinomial
sampling loop with topk, tg.save / tg.load. The rest checks each idiom on its own, and the
gradient of each new op against float64 finite differences. The idiom table (issue 27) holds
short PyTorch snippets with PyTorch's result written down, and snippets PyTorch rejects.
"""

import argparse
import collections
import dataclasses
import enum
import inspect
import math
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from helpers import arrays, check_op, shapes
from hypothesis import assume, given
from hypothesis import strategies as st

# ruff: noqa: C408, PLR0402, RUF059  (written as PyTorch code is: dict(), import ... as nn)
import tensorgrad as torch  # the only lines that differ from PyTorch code
import tensorgrad.nn as nn
from tensorgrad.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- nanoGPT-style


class Config:
    block_size, vocab_size, n_layer, n_head, n_embd, dropout, bias = 16, 11, 2, 2, 16, 0.0, True


class SelfAttention(nn.Module):
    def __init__(self, config, flash):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.flash = config.n_head, config.n_embd, flash
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config, flash):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = SelfAttention(config, flash)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, config, flash=True):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, flash) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
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

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
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

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == "cuda"
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = (
                idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size :]
            )
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def get_lr(it, warmup_iters=2, lr_decay_iters=30, learning_rate=1e-2, min_lr=1e-3):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def get_batch(data, block_size, batch_size, device):
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix]
    )
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
        device, non_blocking=True
    )


def test_nanogpt_style_model_trains_samples_and_checkpoints(tmp_path, capsys):
    torch.manual_seed(1337)
    data = np.arange(400, dtype=np.uint16) % Config.vocab_size  # a learnable cycle
    device, device_type = "cpu", "cpu"
    model = TinyGPT(Config())
    model.to(device)
    assert model.get_num_params() > 0
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), device_type)
    losses = []
    for iter_num in range(30):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        X, Y = get_batch(data, Config.block_size, 8, device)
        logits, loss = model(X, Y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item()
        losses.append(lossf)
        print(f"iter {iter_num}: loss {loss:.4f}, norm {norm:.2f}, lr {lr:.2e}")
    assert optimizer.param_groups[0]["lr"] == get_lr(29)
    assert isinstance(norm, torch.Tensor) and norm.shape == ()
    assert losses[-1] < losses[0] - 0.5, losses
    out = capsys.readouterr().out
    assert f"iter 29: loss {losses[-1]:.4f}" in out

    # sampling with topk + multinomial
    model.eval()
    start = torch.zeros((1, 1), dtype=torch.long, device=device)
    y = model.generate(start, 20, temperature=0.8, top_k=3)
    assert y.shape == (1, 21) and y.dtype == torch.long
    assert int(y.max()) < Config.vocab_size

    # the causal-mask buffer: in the state dict, moves with .to, loads back
    sd = model.state_dict()
    assert "transformer.h.0.attn.bias" in sd and isinstance(
        sd["transformer.h.0.attn.bias"], torch.Tensor
    )
    checkpoint = {
        "model": sd,
        "optimizer": optimizer.state_dict(),
        "iter_num": 30,
        "best_val_loss": 1.5,
        "config": {"n_layer": 2, "betas": (0.9, 0.95)},
    }
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    ck = torch.load(tmp_path / "ckpt.pt", map_location=device)
    assert ck["iter_num"] == 30 and ck["config"]["betas"] == (0.9, 0.95)
    model2 = TinyGPT(Config(), flash=False)  # the explicit masked-softmax path
    model2.load_state_dict(ck["model"])
    opt2 = model2.configure_optimizers(0.1, 3e-3, (0.9, 0.95), device_type)
    opt2.load_state_dict(ck["optimizer"])
    X, Y = get_batch(data, Config.block_size, 4, device)
    with torch.no_grad():
        a, b = model(X, Y)[1], model2(X, Y)[1]
    assert abs(a.item() - b.item()) < 1e-5


def test_configure_optimizers_sees_fused_and_passes_it():
    assert "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = TinyGPT(Config()).configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cuda")
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["weight_decay"] == 0.0


# ----------------------------------------------------------------------------- modules


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("mask", torch.ones(2, 2))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


def test_register_buffer_state_dict_and_load():
    m = WithBuffers()
    sd = m.state_dict()
    assert list(sd) == ["mask", "lin.weight", "lin.bias"]  # own buffers first, as PyTorch
    assert [n for n, _ in m.named_buffers()] == ["mask", "scratch"]
    assert [n for n, _ in m.named_parameters()] == ["lin.weight", "lin.bias"]
    m2 = WithBuffers()
    m2.load_state_dict({**{k: v.clone() for k, v in sd.items()}, "mask": np.full((2, 2), 3.0)})
    np.testing.assert_array_equal(m2.mask.detach().numpy(), np.full((2, 2), 3.0))
    with pytest.raises(KeyError, match="mask"):
        m2.load_state_dict({"lin.weight": sd["lin.weight"], "lin.bias": sd["lin.bias"]})
    m2.mask = torch.zeros(2, 2)  # reassigning keeps it a buffer
    assert "mask" in m2.state_dict()


def test_state_dict_tensors_share_the_parameters_memory():
    m = nn.Linear(3, 2)
    sd = m.state_dict()
    with torch.no_grad():
        sd["weight"].copy_(torch.ones(3, 2).t())  # as nanoGPT's from_pretrained fills weights
    np.testing.assert_array_equal(m.weight.detach().numpy(), np.ones((2, 3)))
    assert sd["weight"].grad_fn is None and not sd["weight"].requires_grad


def test_buffers_move_and_cast_with_to():
    m = WithBuffers().to(torch.float64)
    assert m.lin.weight.dtype == np.float64 and m.mask.dtype == np.float64
    m.to("cpu", torch.float32)
    assert m.mask.dtype == np.float32
    assert m.double().mask.dtype == np.float64 and m.float().lin.weight.dtype == np.float32
    x = torch.randn(2, 3)
    assert x.to(torch.float64).dtype == np.float64
    assert x.to("cpu", torch.float64).dtype == np.float64
    assert x.to(dtype=torch.float64).dtype == np.float64
    assert x.double().float().dtype == np.float32
    assert x.to(torch.zeros(1, dtype=torch.float64)).dtype == np.float64


def test_module_traversal_in_pytorchs_order():
    m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Tanh(), nn.Linear(2, 1)))
    assert [n for n, _ in m.named_modules()] == ["", "0", "1", "1.0", "1.1"]
    assert [n for n, _ in m.named_children()] == ["0", "1"]
    assert [type(c).__name__ for c in m.children()] == ["Linear", "Sequential"]
    assert len(list(m.modules())) == 5
    seen = []
    assert m.apply(lambda mod: seen.append(type(mod).__name__)) is m
    assert seen == ["Linear", "Tanh", "Linear", "Sequential", "Sequential"]  # children first


def test_zero_grad_set_to_none_false_zero_fills():
    m = nn.Linear(3, 2)
    m(torch.randn(4, 3)).sum().backward()
    m.zero_grad(set_to_none=False)
    assert m.weight.grad is not None and not m.weight.grad.numpy().any()
    m.zero_grad()
    assert m.weight.grad is None
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(4, 3)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert not m.bias.grad.numpy().any()


INITS = {
    "normal_": (lambda t: nn.init.normal_(t, 1.0, 0.5), 1.0, 0.5),
    "uniform_": (lambda t: nn.init.uniform_(t, -1.0, 3.0), 1.0, 4 / math.sqrt(12)),
    "zeros_": (nn.init.zeros_, 0.0, 0.0),
    "ones_": (nn.init.ones_, 1.0, 0.0),
    "constant_": (lambda t: nn.init.constant_(t, 0.25), 0.25, 0.0),
    "xavier_uniform_": (nn.init.xavier_uniform_, 0.0, math.sqrt(2 / (200 + 300))),
    "xavier_normal_": (nn.init.xavier_normal_, 0.0, math.sqrt(2 / (200 + 300))),
    "kaiming_uniform_": (
        lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)),
        0.0,
        math.sqrt(2 / 6) / math.sqrt(300),
    ),
    "trunc_normal_": (lambda t: nn.init.trunc_normal_(t, std=0.02, a=-0.04, b=0.04), 0.0, None),
}


@pytest.mark.parametrize("name", INITS)
def test_nn_init_in_place_no_graph_seeded(name):
    fn, mean, std = INITS[name]
    torch.manual_seed(0)
    p = nn.Parameter(torch.zeros(200, 300))
    assert fn(p) is p and p.is_leaf and p.grad_fn is None and p.dtype == np.float32
    a = p.detach().numpy()
    assert abs(a.mean() - mean) < 0.02
    if std is not None:
        assert abs(a.std() - std) < 0.05 * std + 1e-6
    else:
        assert a.min() >= -0.04 and a.max() <= 0.04
    torch.manual_seed(0)
    q = nn.Parameter(torch.zeros(200, 300))
    fn(q)
    np.testing.assert_array_equal(q.detach().numpy(), a)  # drawn from the seeded generator


# ----------------------------------------------------------------------------- optim, utils


def test_param_group_lr_edit_changes_the_step():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=1.0)
    p.grad = torch.ones(3)
    opt.param_groups[0]["lr"] = 0.5
    opt.step()
    np.testing.assert_allclose(p.detach().numpy(), 0.5)


def test_clip_grad_norm_returns_a_0d_tensor():
    p = nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 2.0)
    n = torch.nn.utils.clip_grad_norm_([p], 1.0)
    assert isinstance(n, torch.Tensor) and n.shape == () and n.dtype == np.float32
    assert float(n) == pytest.approx(4.0) and f"{n:.1f}" == "4.0"
    np.testing.assert_allclose(np.linalg.norm(p.grad.numpy()), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------- sampling


def test_topk_sort_argmax_cumsum():
    x = torch.tensor([[1.0, 5.0, 3.0, 2.0], [0.0, -1.0, 4.0, 4.5]])
    v, i = torch.topk(x, 2)
    np.testing.assert_array_equal(v.detach().numpy(), [[5, 3], [4.5, 4]])
    np.testing.assert_array_equal(i.detach().numpy(), [[1, 2], [3, 2]])
    _, i2 = x.topk(1, dim=0, largest=False)
    np.testing.assert_array_equal(i2.detach().numpy(), [[1, 1, 0, 0]])
    s, j = torch.sort(x, dim=-1, descending=True)
    np.testing.assert_array_equal(s.detach().numpy(), -np.sort(-x.detach().numpy(), axis=-1))
    np.testing.assert_array_equal(torch.gather(x, 1, j).detach().numpy(), s.detach().numpy())
    assert torch.argmax(x).item() == 1 and torch.argmax(x, dim=1).tolist() == [1, 3]
    np.testing.assert_allclose(
        torch.cumsum(x, dim=1).detach().numpy(), np.cumsum(x.detach().numpy(), axis=1)
    )


def test_multinomial_with_and_without_replacement():
    torch.manual_seed(0)
    probs = torch.tensor([[0.0, 0.7, 0.3], [0.5, 0.0, 0.5]])
    draws = torch.multinomial(probs, 2000, replacement=True)
    assert draws.shape == (2, 2000) and draws.dtype == np.int64
    d = draws.detach().numpy()
    assert not (d[0] == 0).any() and not (d[1] == 1).any()  # zero weight: never drawn
    assert abs((d[0] == 1).mean() - 0.7) < 0.05
    w = torch.multinomial(torch.tensor([1.0, 2.0, 0.0, 4.0]), 3)  # unnormalised weights
    assert sorted(w.tolist()) == [0, 1, 3]
    with pytest.raises(RuntimeError, match="multinomial"):
        torch.multinomial(torch.tensor([1.0, 0.0]), 2)
    g = torch.Generator().manual_seed(42)
    a = torch.multinomial(probs, 5, replacement=True, generator=g)
    b = torch.multinomial(probs, 5, replacement=True, generator=torch.Generator().manual_seed(42))
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_random_factories():
    torch.manual_seed(3)
    x = torch.randn(2, 3)
    assert torch.randn_like(x).shape == (2, 3) and torch.rand_like(x).dtype == np.float32
    r = torch.rand_like(x).detach().numpy()
    assert (r >= 0).all() and (r < 1).all()
    a = torch.randint(2, 5, (100,)).detach().numpy()
    assert a.min() >= 2 and a.max() < 5 and a.dtype == np.int64
    b = torch.randint(3, (4, 5))
    assert b.shape == (4, 5) and int(b.max()) < 3
    gen = torch.manual_seed(3)
    assert gen.initial_seed() == 3
    np.testing.assert_array_equal(torch.randn(2, 3).detach().numpy(), x.detach().numpy())


# ----------------------------------------------------------------------------- functions


def test_module_level_functions_are_the_methods():
    x = torch.tensor([[0.5, -1.0], [2.0, 3.0]])
    for name in ("tanh", "exp", "abs", "sigmoid", "relu"):
        np.testing.assert_array_equal(
            getattr(torch, name)(x).detach().numpy(), getattr(x, name)().detach().numpy()
        )
    np.testing.assert_allclose(
        torch.sqrt(x.abs()).detach().numpy(), np.sqrt(np.abs(x.detach().numpy()))
    )
    np.testing.assert_allclose(
        torch.rsqrt(x.abs()).detach().numpy(), 1 / np.sqrt(np.abs(x.detach().numpy()))
    )
    np.testing.assert_allclose(
        torch.log(x.abs()).detach().numpy(), np.log(np.abs(x.detach().numpy()))
    )
    np.testing.assert_allclose(torch.pow(x, 2).detach().numpy(), x.detach().numpy() ** 2)
    np.testing.assert_array_equal(
        torch.clamp(x, min=0.0, max=2.0).detach().numpy(), np.clip(x.detach().numpy(), 0, 2)
    )
    np.testing.assert_array_equal(
        torch.maximum(x, torch.zeros(2, 2)).detach().numpy(), np.maximum(x.detach().numpy(), 0)
    )
    np.testing.assert_array_equal(
        torch.minimum(x, torch.zeros(2, 2)).detach().numpy(), np.minimum(x.detach().numpy(), 0)
    )
    np.testing.assert_allclose(
        torch.softmax(x, dim=-1).detach().numpy(), F.softmax(x, -1).detach().numpy()
    )
    np.testing.assert_array_equal(torch.tril(x).detach().numpy(), np.tril(x.detach().numpy()))
    np.testing.assert_array_equal(torch.ones_like(x).detach().numpy(), np.ones((2, 2)))
    a, b = torch.randn(3, 2, 4), torch.randn(3, 4, 5)
    np.testing.assert_allclose(
        torch.bmm(a, b).detach().numpy(), a.detach().numpy() @ b.detach().numpy(), rtol=1e-5
    )
    np.testing.assert_allclose(
        torch.matmul(a, b).detach().numpy(), a.detach().numpy() @ b.detach().numpy(), rtol=1e-5
    )
    np.testing.assert_allclose(
        torch.einsum("bij,bjk->bik", a, b).detach().numpy(),
        a.detach().numpy() @ b.detach().numpy(),
        rtol=1e-5,
    )


def test_tensor_methods():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(
        x.index_select(1, torch.tensor([2, 0])).detach().numpy(), [[3, 1], [6, 4]]
    )
    np.testing.assert_allclose(x.norm().item(), np.linalg.norm(x.detach().numpy()), rtol=1e-6)
    np.testing.assert_allclose(
        x.norm(dim=1).detach().numpy(), np.linalg.norm(x.detach().numpy(), axis=1), rtol=1e-6
    )
    rows = x.unbind(0)
    assert len(rows) == 2 and rows[1].tolist() == [4, 5, 6]
    np.testing.assert_array_equal(
        torch.zeros(2, 3).scatter_add(1, torch.tensor([[0, 0, 2], [1, 1, 1]]), x).detach().numpy(),
        [[3, 0, 3], [0, 15, 0]],
    )
    assert (x // 2).tolist() == [[0, 1, 1], [2, 2, 3]]
    y = torch.zeros(2, 3)
    y.copy_(x)
    y.masked_fill_(x > 4, -1.0)
    assert y.tolist() == [[1, 2, 3], [4, -1, -1]]
    y.zero_().fill_(2.5)
    assert (y == 2.5).all()
    torch.manual_seed(0)
    assert (
        y.normal_(0.0, 1.0).detach().numpy().std() > 0
        and y.uniform_(2, 3).detach().numpy().min() >= 2
    )
    np.testing.assert_allclose(
        x.std(dim=1, correction=0).detach().numpy(), x.detach().numpy().std(axis=1), rtol=1e-6
    )
    np.testing.assert_allclose(
        x.var(correction=1).item(), x.detach().numpy().var(ddof=1), rtol=1e-6
    )
    assert f"{x.sum():.1f}" == "21.0" and f"{torch.tensor(3)}" == "3"
    s = x.size()
    assert s == (2, 3) and s[1] == 3 and s.numel() == 6 and isinstance(s, tuple)
    assert s[-1:] == (3,) and x.size(-1) == 3 and x.shape.numel() == 6


def test_functional_and_loss_modules():
    x = torch.randn(4, 5)
    t = torch.tensor([0, 3, 1, 4])
    np.testing.assert_allclose(
        F.silu(x).detach().numpy(),
        x.detach().numpy() / (1 + np.exp(-x.detach().numpy())),
        rtol=1e-5,
    )
    np.testing.assert_allclose(nn.SiLU()(x).detach().numpy(), F.silu(x).detach().numpy())
    np.testing.assert_allclose(
        nn.Tanh()(x).detach().numpy(), np.tanh(x.detach().numpy()), rtol=1e-6
    )
    np.testing.assert_allclose(
        nn.Softmax(dim=-1)(x).detach().numpy(), F.softmax(x, -1).detach().numpy()
    )
    assert F.pad(x, (1, 2)).shape == (4, 8) and F.pad(x, (0, 0, 1, 0), value=9.0)[0, 0] == 9
    np.testing.assert_allclose(
        F.mse_loss(x, torch.zeros(4, 5)).item(), (x.detach().numpy() ** 2).mean(), rtol=1e-6
    )
    ce = nn.CrossEntropyLoss()(x, t)
    np.testing.assert_allclose(ce.item(), F.cross_entropy(x, t).item())
    # label smoothing, against its definition
    eps = 0.1
    logp = x.detach().numpy() - np.log(np.exp(x.detach().numpy()).sum(1, keepdims=True))
    want = ((1 - eps) * -logp[np.arange(4), t.detach().numpy()] - eps * logp.mean(1)).mean()
    got = F.cross_entropy(x, t, label_smoothing=eps)
    np.testing.assert_allclose(got.item(), want, rtol=1e-5)
    got = nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=3)(x, t)
    keep = t.detach().numpy() != 3
    want = ((1 - eps) * -logp[np.arange(4), t.detach().numpy()] - eps * logp.mean(1))[keep].mean()
    np.testing.assert_allclose(got.item(), want, rtol=1e-5)


# ----------------------------------------------------------------------------- gradients

rs = np.random.default_rng(0)
A, B34 = rs.standard_normal((3, 4)), rs.standard_normal((3, 4))
IDX = np.array([[0, 2, 2, 1], [3, 3, 0, 0], [1, 0, 1, 2]])

GRADS = {
    "clamp": (lambda x: x.clamp(-0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), [A]),
    "clamp min": (lambda x: torch.clamp(x, min=0.1), lambda x: np.maximum(x, 0.1), [A]),
    "maximum": (torch.maximum, np.maximum, [A, B34]),
    "minimum": (torch.minimum, np.minimum, [A, B34]),
    "gather": (
        lambda x: x.gather(1, torch.tensor(IDX)),
        lambda x: np.take_along_axis(x, IDX, 1),
        [A],
    ),
    "scatter_add": (lambda x, s: x.scatter_add(1, torch.tensor(IDX), s), None, [A, B34]),
    "index_select": (
        lambda x: x.index_select(0, torch.tensor([2, 0, 2])),
        lambda x: x[[2, 0, 2]],
        [A],
    ),
    "cumsum": (lambda x: x.cumsum(1), lambda x: np.cumsum(x, 1), [A]),
    "cumsum dim 0": (lambda x: torch.cumsum(x, dim=0), lambda x: np.cumsum(x, 0), [A]),
    "sort values": (lambda x: x.sort(dim=1)[0], lambda x: np.sort(x, 1), [A]),
    "topk values": (lambda x: x.topk(2)[0], lambda x: -np.sort(-x, 1)[:, :2], [A]),
    "norm": (lambda x: x.norm(), np.linalg.norm, [A]),
    "norm dim": (lambda x: x.norm(dim=0), lambda x: np.linalg.norm(x, axis=0), [A]),
    "pad": (
        lambda x: F.pad(x, (1, 2, 0, 1), value=0.5),
        lambda x: np.pad(x, ((0, 1), (1, 2)), constant_values=0.5),
        [A],
    ),
    "pad crop": (lambda x: F.pad(x, (-1, 1)), lambda x: np.pad(x[:, 1:], ((0, 0), (0, 1))), [A]),
    "einsum": (lambda x, y: torch.einsum("ij,kj->ik", x, y), lambda x, y: x @ y.T, [A, B34]),
    "einsum sum": (
        lambda x, y: torch.einsum("ij,ij->i", x, y),
        lambda x, y: (x * y).sum(1),
        [A, B34],
    ),
    "einsum ellipsis": (lambda x: torch.einsum("...j->...", x), lambda x: x.sum(-1), [A]),
    "silu": (F.silu, lambda x: x / (1 + np.exp(-x)), [A]),
    "mse_loss": (F.mse_loss, lambda x, y: ((x - y) ** 2).mean(), [A, B34]),
    "clone": (lambda x: x.clone() * 2, lambda x: x * 2, [A]),
    "unbind": (lambda x: x.unbind(1)[2], lambda x: x[:, 2], [A]),
    "bmm": (
        torch.bmm,
        lambda x, y: x @ y,
        [rs.standard_normal((2, 3, 4)), rs.standard_normal((2, 4, 2))],
    ),
    "label smoothing": (
        lambda x: F.cross_entropy(x, torch.tensor([0, 3, 1]), label_smoothing=0.2),
        None,
        [A],
    ),
}


@pytest.mark.parametrize("op", GRADS)
def test_new_op_gradients(op):
    fn, np_fn, arrays = GRADS[op]
    check_op(fn, np_fn, *arrays, name=op)


def test_float32_stays_float32_through_the_new_ops():
    x = torch.randn(3, 4, requires_grad=True)
    outs = [
        x.clamp(0, 1),
        torch.maximum(x, x * 2),
        x.gather(1, torch.tensor(IDX)),
        x.cumsum(0),
        x.topk(2)[0],
        x.norm(),
        F.pad(x, (1, 1)),
        F.silu(x),
        torch.einsum("ij->j", x),
        F.cross_entropy(x, torch.tensor([0, 1, 2]), label_smoothing=0.1),
    ]
    for o in outs:
        assert o.dtype == np.float32
    sum(o.sum() for o in outs).backward()
    assert x.grad.dtype == np.float32


# ----------------------------------------------------------------------------- the surface


def test_save_load_round_trip_without_pickle(tmp_path):
    state = {
        "w": torch.randn(2, 3),
        "ids": torch.tensor([1, 2]),
        "step": 7,
        "name": "run",
        "nested": {"a": [1.5, None, torch.ones(1)], 3: "int key"},
        "arr": np.zeros(2),
    }
    torch.save(state, tmp_path / "s.safetensors")
    raw = (tmp_path / "s.safetensors").read_bytes()
    assert b"pickle" not in raw and raw[:1] != b"\x80"
    back = torch.load(tmp_path / "s.safetensors")
    np.testing.assert_array_equal(back["w"].detach().numpy(), state["w"].detach().numpy())
    assert back["ids"].dtype == np.int64 and back["step"] == 7 and back["name"] == "run"
    assert back["nested"][3] == "int key" and back["nested"]["a"][1] is None
    assert isinstance(back["nested"]["a"][2], torch.Tensor)
    assert isinstance(back["arr"], np.ndarray)
    with pytest.raises(TypeError, match="no pickle"):
        torch.save({"f": object()}, tmp_path / "bad")


@dataclasses.dataclass
class _SavedConfig:  # build-nanogpt's GPTConfig, as its checkpoint holds it
    block_size: int = 1024
    n_layer: int = 12
    sizes: tuple = (1, 2)


_SavedPair = collections.namedtuple("_SavedPair", ["loss", "weight"])


class _SavedKind(enum.Enum):
    CHAR = "char"


def test_a_checkpoint_with_a_config_dataclass_saves_and_loads_without_pickle(tmp_path):
    ckpt = {
        "model": {"w": torch.ones(2)},
        "config": _SavedConfig(n_layer=2),
        "pair": _SavedPair(1.5, torch.zeros(3)),
        "kind": _SavedKind.CHAR,
        "args": argparse.Namespace(lr=0.1),
        "step": 5,
    }
    torch.save(ckpt, tmp_path / "c.pt")
    back = torch.load(tmp_path / "c.pt")  # (weights_only: the fields as plain data)
    assert back["config"] == {"block_size": 1024, "n_layer": 2, "sizes": (1, 2)}
    assert back["pair"]["loss"] == 1.5 and back["kind"] == "char" and back["args"] == {"lr": 0.1}
    classes = [_SavedConfig, _SavedPair, _SavedKind, argparse.Namespace]
    with torch.serialization.safe_globals(classes):
        back = torch.load(tmp_path / "c.pt")
    assert back["config"] == _SavedConfig(n_layer=2) and back["kind"] is _SavedKind.CHAR
    assert isinstance(back["pair"], _SavedPair) and back["args"].lr == 0.1
    assert torch.serialization.get_safe_globals() == []  # (only inside the block)
    with pytest.raises(TypeError, match="cannot store a function"):
        torch.save({"f": lambda: 0}, tmp_path / "bad")


def test_version_license_and_configs():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert torch.__version__ == meta["version"]
    assert meta["license"]["text"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.json")), ids=lambda p: p.name)
def test_example_configs_are_valid_for_gpt_train(path, tmp_path):
    from gpt.train import resolve_config, validate

    c = resolve_config(["--config", str(path), "--out-dir", str(tmp_path / "run")])[0]
    validate(c)
    assert c.preset == path.stem


def test_gpt_package_surface(capsys):
    from gpt import GPT, GPTConfig

    model = GPT(GPTConfig.from_preset("tiny"))
    assert model.get_num_params() == model.num_params()
    mfu = model.estimate_mfu(fwdbwd_per_iter=4, dt=1.0)
    assert 0 < mfu < 1
    model.crop_block_size(8)
    assert model.config.block_size == 8 and model.transformer.wpe.weight.shape[0] == 8
    ids = np.zeros((1, 8), dtype=np.int64)
    logits, loss = model(ids, targets=ids)
    assert logits.shape[1] == 8 and loss.shape == ()
    out = subprocess.run(
        [sys.executable, "-m", "gpt"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    for cmd in ("gpt-train", "gpt-sample", "gpt-explain"):
        assert cmd in out


def test_tensorgrad_never_imports_gpt():
    code = (
        "import sys, tensorgrad; assert not any(m == 'gpt' or m.startswith('gpt.') "
        "for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ----------------------------------------------------------------------------- idiom table
# Issue 27: short PyTorch idioms from GPT and small-model code, each with PyTorch 2.13's result
# (its repr) written down once, so that every difference from PyTorch is a failing test. These
# tests do not import torch; the expected strings were produced by running the same lines under
# PyTorch.


def _grad_of(fn, values):
    x = torch.tensor(values, requires_grad=True)
    fn(x).sum().backward()
    return x.grad


class _Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = nn.Linear(1, 1)
        self.register_buffer("mask", torch.ones(1))
        self.w = nn.Parameter(torch.ones(1))


def _emb_grad():
    e = nn.Embedding(3, 2, padding_idx=0)
    e(torch.tensor([0, 1, 0])).sum().backward()
    return e.weight.grad


def _clip_norm(dtype, norm_type):
    p = nn.Parameter(torch.ones(2, dtype=dtype))
    p.grad = torch.tensor([3.0, 4.0], dtype=dtype)
    n = nn.utils.clip_grad_norm_([p], 1.0, norm_type=norm_type)
    return n, p.grad


def _clip_value():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([-3.0, 0.5, 4.0])
    nn.utils.clip_grad_value_([p], 1.0)
    return p.grad


def _adam_opt():
    p = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.Adam([p], lr=0.1, weight_decay=0.1)
    p.grad = torch.tensor([0.5, 0.25])
    opt.step()
    return p, opt


def _adam_step():
    p, opt = _adam_opt()
    return p.detach(), int(opt.state[p]["step"])  # opt.state is keyed by the parameter


def _adam_state():
    return _adam_opt()[1].state_dict()


def _lrs(make):
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0)
    sched = make(opt)
    out = []
    for _ in range(6):
        out.append(round(opt.param_groups[0]["lr"], 6))
        opt.step()
        sched.step()
    return out


def _inference():
    x = torch.ones(2, requires_grad=True)
    with torch.inference_mode():
        y = x * 2
    return y.requires_grad


def _through_data(edit):
    """Edit a Linear's weight through .data (init code's idiom) and show the weight."""
    lin = nn.Linear(2, 2)
    edit(lin.weight.data)
    return lin.weight, lin.weight.data.requires_grad, type(lin.weight.data).__name__


def _data_iadd():
    p = nn.Parameter(torch.ones(2))
    p.data += torch.tensor([1.0, 2.0])
    return p


def _source_changed_after(make):
    a = np.zeros(2, np.float32)
    t = make(a)
    a[0] = 1.0
    return t


def _load_into_shared_storage():
    l1, l2 = nn.Linear(2, 2), nn.Linear(2, 2)
    l2.weight.data = l1.weight.data  # tied storage
    l1.load_state_dict({k: torch.zeros_like(v) for k, v in l1.state_dict().items()})
    return l2.weight.abs().sum().item()


# issue 35: names used by makemore, the Zero to Hero notebooks and PyTorch's tutorials
def _keepdims_shapes():
    x = torch.arange(6.0).view(2, 3)
    b = x > 1
    outs = [
        x.sum(1, keepdims=True),
        x.mean(1, keepdims=True),
        x.prod(1, keepdims=True),
        x.std(1, keepdims=True),
        x.var(1, keepdims=True),
        x.logsumexp(1, keepdims=True),
        x.amax(1, keepdims=True),
        x.amin(1, keepdims=True),
        x.max(1, keepdims=True).values,
        x.min(1, keepdims=True).indices,
        x.argmax(1, keepdims=True),
        x.argmin(1, keepdims=True),
        b.any(1, keepdims=True),
        b.all(1, keepdims=True),
        torch.sum(x, 0, keepdims=True),
        torch.amax(x, dim=0, keepdims=True),
    ]
    return [tuple(o.shape) for o in outs]


def _with_default_device(dev):
    torch.set_default_device(dev)
    try:
        return torch.get_default_device(), torch.zeros(2).device, torch.tensor([1.0]).device
    finally:
        torch.set_default_device(None)


def _rmsprop(**kw):
    p = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.RMSprop([p], lr=0.1, **kw)
    for g in ([0.5, 0.25], [-1.0, 0.5], [0.25, 2.0]):
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach()


def _rmsprop_state():
    p = nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.RMSprop([p], momentum=0.9, centered=True)
    p.grad = torch.tensor([1.0])
    opt.step()
    return sorted(opt.state_dict()["state"][0])


def _batchnorm():
    bn = nn.BatchNorm1d(2)
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]])
    y = [[round(v, 4) + 0.0 for v in row] for row in bn(x).tolist()]
    bn.eval()
    return y, bn.running_mean, bn.running_var, bn(x).detach(), bn.num_batches_tracked


def _batchnorm_3d():
    bn = nn.BatchNorm1d(2, affine=False, momentum=None)
    x = torch.arange(12.0).view(2, 2, 3)
    for _ in range(2):
        y = bn(x)
    return y.shape, bn.running_mean, bn.running_var, list(dict(bn.named_parameters()))


def _batchnorm_grad():
    bn = nn.BatchNorm1d(2)
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]], requires_grad=True)
    (bn(x) * torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]])).sum().backward()
    return x.grad, bn.weight.grad, bn.bias.grad


LR = torch.optim.lr_scheduler
IDIOMS = [
    (
        "mixed basic and advanced indexing",
        lambda: torch.arange(24.0).view(2, 3, 4)[0, :, [1, 2]],
        "tensor([[ 1.,  2.],\n        [ 5.,  6.],\n        [ 9., 10.]])",
    ),
    (
        "mixed indexing, equal sizes",
        lambda: torch.arange(8.0).view(2, 2, 2)[1, :, [0, 1]],
        "tensor([[4., 5.],\n        [6., 7.]])",
    ),
    (
        "int and list on one side",
        lambda: torch.arange(24).view(2, 3, 4)[1, [0, 2]],
        "tensor([[12, 13, 14, 15],\n        [20, 21, 22, 23]])",
    ),
    ("empty index list", lambda: torch.arange(3.0)[[]], "tensor([])"),
    (
        "where promotes a Python float",
        lambda: torch.where(torch.tensor([True, False]), torch.tensor([1, 0]), 0.5),
        "tensor([1.0000, 0.5000])",
    ),
    (
        "cat promotes int with float32",
        lambda: torch.cat([torch.tensor([1, 2]), torch.tensor([1.5])]),
        "tensor([1.0000, 2.0000, 1.5000])",
    ),
    (
        "stack promotes",
        lambda: torch.stack([torch.tensor([1, 2]), torch.tensor([0.5, 1.0])]),
        "tensor([[1.0000, 2.0000],\n        [0.5000, 1.0000]])",
    ),
    ("clamp of ints by a float", lambda: torch.tensor([1, 2]).clamp(min=0.5), "tensor([1., 2.])"),
    ("compare ints with a float", lambda: torch.tensor([1, 2]) < 1.5, "tensor([ True, False])"),
    (
        "exp/log/sqrt/tanh/sigmoid/sin/cos of ints are float32",
        lambda: [
            str(getattr(torch.tensor([1, 4]), f)().dtype)
            for f in ("exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos")
        ],
        "['torch.float32', 'torch.float32', 'torch.float32', 'torch.float32', "
        "'torch.float32', 'torch.float32', 'torch.float32']",
    ),
    (
        "max(dim) gradient at ties",
        lambda: _grad_of(lambda x: x.max(dim=0).values, [1.0, 3.0, 3.0]),
        "tensor([0., 1., 0.])",
    ),
    (
        "amax gradient at ties",
        lambda: _grad_of(lambda x: x.amax(0), [1.0, 3.0, 3.0]),
        "tensor([0.0000, 0.5000, 0.5000])",
    ),
    ("repr float", lambda: torch.tensor([1.5, 2.0]), "tensor([1.5000, 2.0000])"),
    (
        "repr whole floats",
        lambda: torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "tensor([[1., 2.],\n        [3., 4.]])",
    ),
    ("repr scientific", lambda: torch.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    (
        "repr inf nan",
        lambda: torch.tensor([float("inf"), 1.5, float("nan")]),
        "tensor([   inf, 1.5000,    nan])",
    ),
    (
        "repr 3-d",
        lambda: torch.arange(24.0).view(2, 3, 4) - 5,
        "tensor([[[-5., -4., -3., -2.],\n         [-1.,  0.,  1.,  2.],\n         [ 3.,  4.,  5.,  6.]],\n\n        [[ 7.,  8.,  9., 10.],\n         [11., 12., 13., 14.],\n         [15., 16., 17., 18.]]])",
    ),
    (
        "repr summarized",
        lambda: torch.arange(2000.0),
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n        1.9990e+03])",
    ),
    (
        "repr wrapped rows",
        lambda: torch.ones(2, 12) / 3,
        "tensor([[0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333,\n         0.3333, 0.3333, 0.3333],\n        [0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333,\n         0.3333, 0.3333, 0.3333]])",
    ),
    ("repr whole with inf", lambda: torch.tensor([1.0, float("inf")]), "tensor([1., inf])"),
    (
        "repr int32",
        lambda: torch.tensor([1, 2], dtype=torch.int32),
        "tensor([1, 2], dtype=torch.int32)",
    ),
    (
        "repr float64",
        lambda: torch.tensor([1.0, 2.0], dtype=torch.float64),
        "tensor([1., 2.], dtype=torch.float64)",
    ),
    ("repr bool", lambda: torch.tensor([True, False]), "tensor([ True, False])"),
    ("repr 0-d", lambda: torch.tensor(3.5), "tensor(3.5000)"),
    ("repr empty", lambda: torch.zeros(0, 3), "tensor([], size=(0, 3))"),
    (
        "repr requires_grad",
        lambda: torch.tensor([1.0, 2.0], requires_grad=True),
        "tensor([1., 2.], requires_grad=True)",
    ),
    (
        "repr grad_fn",
        lambda: torch.tensor([1.0, 2.0], requires_grad=True) * 2,
        "tensor([2., 4.], grad_fn=<MulBackward0>)",
    ),
    ("Size", lambda: torch.zeros(2, 3).shape, "torch.Size([2, 3])"),
    ("dtype", lambda: torch.zeros(2).dtype, "torch.float32"),
    (
        "dtype.is_floating_point",
        lambda: (torch.float32.is_floating_point, torch.int64.is_floating_point),
        "(True, False)",
    ),
    (
        "finfo",
        lambda: (torch.finfo(torch.float32).eps, torch.finfo(torch.float16).max),
        "(1.1920928955078125e-07, 65504.0)",
    ),
    (
        "iinfo",
        lambda: (torch.iinfo(torch.int32).max, torch.iinfo(torch.int8).min),
        "(2147483647, -128)",
    ),
    (
        "device",
        lambda: (torch.zeros(1).device.type, torch.device("cpu") == torch.zeros(1).device),
        "('cpu', True)",
    ),
    ("Dropout repr", lambda: nn.Dropout(0.3), "Dropout(p=0.3, inplace=False)"),
    (
        "LayerNorm repr",
        lambda: nn.LayerNorm(4),
        "LayerNorm((4,), eps=1e-05, elementwise_affine=True, bias=True)",
    ),
    ("GELU repr", lambda: nn.GELU(), "GELU(approximate='none')"),
    ("Linear repr", lambda: nn.Linear(2, 3), "Linear(in_features=2, out_features=3, bias=True)"),
    ("Embedding repr", lambda: nn.Embedding(5, 3, padding_idx=0), "Embedding(5, 3, padding_idx=0)"),
    (
        "state_dict order",
        lambda: list(_Holder().state_dict()),
        "['w', 'mask', 'child.weight', 'child.bias']",
    ),
    (
        "new_zeros",
        lambda: torch.ones(2, dtype=torch.float64).new_zeros(2, 3),
        "tensor([[0., 0., 0.],\n        [0., 0., 0.]], dtype=torch.float64)",
    ),
    ("new_full", lambda: torch.ones(2).new_full((2,), 7.0), "tensor([7., 7.])"),
    (
        "new_tensor",
        lambda: torch.ones(2, dtype=torch.float64).new_tensor([1, 2]),
        "tensor([1., 2.], dtype=torch.float64)",
    ),
    (
        "scatter",
        lambda: torch.zeros(2, 3).scatter(1, torch.tensor([[2], [0]]), 5.0),
        "tensor([[0., 0., 5.],\n        [5., 0., 0.]])",
    ),
    (
        "scatter_add_",
        lambda: torch.zeros(3).scatter_add_(
            0, torch.tensor([0, 0, 2]), torch.tensor([1.0, 2.0, 3.0])
        ),
        "tensor([3., 0., 3.])",
    ),
    (
        "index_add_",
        lambda: torch.zeros(3, 2).index_add_(0, torch.tensor([0, 2]), torch.ones(2, 2)),
        "tensor([[1., 1.],\n        [0., 0.],\n        [1., 1.]])",
    ),
    ("prod", lambda: torch.tensor([[1.0, 2.0], [3.0, 4.0]]).prod(1), "tensor([ 2., 12.])"),
    (
        "logsumexp",
        lambda: torch.tensor([[0.0, 1.0], [2.0, 3.0]]).logsumexp(1),
        "tensor([1.3133, 3.3133])",
    ),
    (
        "all(dim)",
        lambda: torch.tensor([[True, False], [True, True]]).all(dim=1),
        "tensor([False,  True])",
    ),
    (
        "any(dim)",
        lambda: torch.tensor([[True, False], [False, False]]).any(dim=1),
        "tensor([ True, False])",
    ),
    ("count_nonzero", lambda: torch.tensor([[0, 1], [2, 3]]).count_nonzero(), "tensor(3)"),
    ("where(cond)", lambda: torch.where(torch.tensor([0, 3, 0, 4]) > 0), "(tensor([1, 3]),)"),
    (
        "Tensor.where",
        lambda: torch.tensor([1.0, 2.0]).where(torch.tensor([True, False]), 0.0),
        "tensor([1., 0.])",
    ),
    (
        "sin cos",
        lambda: (torch.tensor([0.0]).sin(), torch.tensor([0.0]).cos()),
        "(tensor([0.]), tensor([1.]))",
    ),
    (
        "sign floor ceil round",
        lambda: [
            f(torch.tensor([-1.5, 0.5, 2.5]))
            for f in (torch.sign, torch.floor, torch.ceil, torch.round)
        ],
        "[tensor([-1.,  1.,  1.]), tensor([-2.,  0.,  2.]), tensor([-1.,  1.,  3.]), tensor([-2.,  0.,  2.])]",
    ),
    ("flip", lambda: torch.arange(6).view(2, 3).flip(1), "tensor([[2, 1, 0],\n        [5, 4, 3]])"),
    (
        "mm dot outer",
        lambda: (
            torch.ones(2, 3).mm(torch.ones(3, 1)),
            torch.tensor([1.0, 2.0]).dot(torch.tensor([3.0, 4.0])),
            torch.tensor([1, 2]).outer(torch.tensor([1, 3])),
        ),
        "(tensor([[3.],\n        [3.]]), tensor(11.), tensor([[1, 3],\n        [2, 6]]))",
    ),
    (
        "allclose equal",
        lambda: (
            torch.tensor([1.0]).allclose(torch.tensor([1.0 + 1e-9])),
            torch.tensor([1, 2]).equal(torch.tensor([1, 2])),
        ),
        "(True, True)",
    ),
    (
        "nan_to_num",
        lambda: torch.tensor([float("nan"), 1.0, float("-inf")]).nan_to_num(
            posinf=9.0, neginf=-9.0
        ),
        "tensor([ 0.,  1., -9.])",
    ),
    (
        "unique",
        lambda: torch.tensor([3, 1, 3, 2]).unique(return_counts=True),
        "(tensor([1, 2, 3]), tensor([1, 1, 2]))",
    ),
    (
        "logical ops",
        lambda: (
            torch.tensor([True, False]).logical_and(torch.tensor([True, True])),
            torch.logical_or(torch.tensor([True, False]), torch.tensor([False, False])),
            torch.logical_not(torch.tensor([True, False])),
        ),
        "(tensor([ True, False]), tensor([ True, False]), tensor([False,  True]))",
    ),
    (
        "softmax(dtype=)",
        lambda: F.softmax(torch.tensor([0.0, 0.0]), dim=0, dtype=torch.float64),
        "tensor([0.5000, 0.5000], dtype=torch.float64)",
    ),
    (
        "cross_entropy probabilities",
        lambda: F.cross_entropy(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.2, 0.3, 0.5]])),
        "tensor(1.1076)",
    ),
    (
        "cross_entropy weight",
        lambda: F.cross_entropy(
            torch.tensor([[1.0, 2.0], [0.5, 0.1]]),
            torch.tensor([1, 0]),
            weight=torch.tensor([1.0, 3.0]),
        ),
        "tensor(0.3632)",
    ),
    (
        "nll_loss",
        lambda: F.nll_loss(torch.tensor([[-1.0, -2.0], [-0.5, -0.1]]), torch.tensor([1, 0])),
        "tensor(1.2500)",
    ),
    (
        "bce with logits",
        lambda: F.binary_cross_entropy_with_logits(
            torch.tensor([0.5, -1.0]), torch.tensor([1.0, 0.0])
        ),
        "tensor(0.3937)",
    ),
    (
        "softplus",
        lambda: F.softplus(torch.tensor([-1.0, 0.0, 30.0])),
        "tensor([ 0.3133,  0.6931, 30.0000])",
    ),
    (
        "leaky_relu",
        lambda: F.leaky_relu(torch.tensor([-1.0, 2.0]), 0.1),
        "tensor([-0.1000,  2.0000])",
    ),
    ("elu", lambda: F.elu(torch.tensor([-1.0, 2.0])), "tensor([-0.6321,  2.0000])"),
    ("normalize", lambda: F.normalize(torch.tensor([[3.0, 4.0]])), "tensor([[0.6000, 0.8000]])"),
    (
        "Embedding padding_idx gradient",
        lambda: _emb_grad(),
        "tensor([[0., 0.],\n        [1., 1.],\n        [0., 0.]])",
    ),
    (
        "Sequential slicing",
        lambda: type(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))[:2]).__name__,
        "'Sequential'",
    ),
    (
        "Sequential(OrderedDict)",
        lambda: list(
            dict(nn.Sequential(OrderedDict(fc=nn.Linear(2, 2), act=nn.ReLU())).named_children())
        ),
        "['fc', 'act']",
    ),
    (
        "load_state_dict(strict=False)",
        lambda: tuple(
            nn.Linear(2, 2).load_state_dict(
                {"weight": torch.zeros(2, 2), "extra": torch.zeros(1)}, strict=False
            )
        ),
        "(['bias'], ['extra'])",
    ),
    (
        "clip_grad_norm_ dtype",
        lambda: _clip_norm(torch.float64, 2.0),
        "(tensor(5., dtype=torch.float64), tensor([0.6000, 0.8000], dtype=torch.float64))",
    ),
    (
        "clip_grad_norm_ inf",
        lambda: _clip_norm(torch.float32, "inf"),
        "(tensor(4.), tensor([0.7500, 1.0000]))",
    ),
    ("clip_grad_value_", lambda: _clip_value(), "tensor([-1.0000,  0.5000,  1.0000])"),
    ("Adam step", lambda: _adam_step(), "(tensor([ 0.9000, -2.1000]), 1)"),
    (
        "optimizer state_dict holds Tensors",
        lambda: type(_adam_state()["state"][0]["exp_avg"]).__name__,
        "'Tensor'",
    ),
    (
        "LambdaLR",
        lambda: _lrs(lambda o: LR.LambdaLR(o, lambda e: 0.5**e)),
        "[1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125]",
    ),
    ("StepLR", lambda: _lrs(lambda o: LR.StepLR(o, 2, 0.5)), "[1.0, 1.0, 0.5, 0.5, 0.25, 0.25]"),
    (
        "LinearLR",
        lambda: _lrs(lambda o: LR.LinearLR(o, 0.25, total_iters=2)),
        "[0.25, 0.625, 1.0, 1.0, 1.0, 1.0]",
    ),
    (
        "CosineAnnealingLR",
        lambda: _lrs(lambda o: LR.CosineAnnealingLR(o, T_max=4)),
        "[1.0, 0.853553, 0.5, 0.146447, 0.0, 0.146447]",
    ),
    (
        "SequentialLR",
        lambda: _lrs(
            lambda o: LR.SequentialLR(
                o,
                [LR.LinearLR(o, 0.1, total_iters=2), LR.CosineAnnealingLR(o, T_max=3)],
                milestones=[2],
            )
        ),
        "[0.1, 0.55, 1.0, 0.75, 0.25, 0.0]",
    ),
    ("inference_mode", lambda: _inference(), "False"),
    (
        "p.data.zero_()",
        lambda: _through_data(lambda d: d.zero_()),
        "(Parameter containing:\ntensor([[0., 0.],\n        [0., 0.]], requires_grad=True), "
        "False, 'Tensor')",
    ),
    (
        "p.data.fill_()",
        lambda: _through_data(lambda d: d.fill_(0.5))[0],
        "Parameter containing:\ntensor([[0.5000, 0.5000],\n        [0.5000, 0.5000]], "
        "requires_grad=True)",
    ),
    (
        "p.data.copy_() then mul_()",
        lambda: _through_data(lambda d: d.copy_(torch.eye(2)).mul_(3))[0],
        "Parameter containing:\ntensor([[3., 0.],\n        [0., 3.]], requires_grad=True)",
    ),
    (
        "p.data += t",
        lambda: _data_iadd(),
        "Parameter containing:\ntensor([2., 3.], requires_grad=True)",
    ),
    (
        "x.data shares memory, outside autograd",
        lambda: (lambda x: (x.data.requires_grad, x.data.grad_fn, x.data.shape))(
            torch.ones(2, 3, requires_grad=True) * 2
        ),
        "(False, None, torch.Size([2, 3]))",
    ),
    ("torch.tensor copies", lambda: _source_changed_after(torch.tensor), "tensor([0., 0.])"),
    ("torch.as_tensor shares", lambda: _source_changed_after(torch.as_tensor), "tensor([1., 0.])"),
    (
        "torch.from_numpy shares",
        lambda: _source_changed_after(torch.from_numpy),
        "tensor([1., 0.])",
    ),
    ("load_state_dict copies in place", lambda: _load_into_shared_storage(), "0.0"),
    (
        "bernoulli_ with probabilities 0 and 1",
        lambda: (
            torch.zeros(3).bernoulli_(torch.tensor([0.0, 1.0, 1.0])),
            torch.ones(2).bernoulli_(0.0),
        ),
        "(tensor([0., 1., 1.]), tensor([0., 0.]))",
    ),
    (
        "addcmul_, lerp_, addcdiv_, neg_, exp_ through .data",
        lambda: _through_data(
            lambda d: (
                d.fill_(1.0)
                .addcmul_(torch.full((2, 2), 2.0), torch.full((2, 2), 3.0), value=0.5)
                .lerp_(torch.zeros(2, 2), 0.5)
                .addcdiv_(torch.ones(2, 2), torch.full((2, 2), 4.0))
                .neg_()
                .exp_()
            )
        )[0],
        "Parameter containing:\ntensor([[0.1054, 0.1054],\n        [0.1054, 0.1054]], "
        "requires_grad=True)",
    ),
    # issue 35: makemore, the Zero to Hero notebooks, PyTorch's autograd/nn/optim examples
    (
        "repr suffixes past column 80 wrap",
        lambda: [
            torch.ones(9, requires_grad=True) / 3,
            torch.ones(9, requires_grad=True, dtype=torch.float64) / 3,
            torch.full((9,), 1 / 3, requires_grad=True),
            torch.ones(2, 7) / 3 * torch.ones(1, requires_grad=True),
        ],
        "[tensor([0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333],\n"
        "       grad_fn=<DivBackward0>), tensor([0.3333, 0.3333, 0.3333, 0.3333, 0.3333, "
        "0.3333, 0.3333, 0.3333, 0.3333],\n       dtype=torch.float64, grad_fn=<DivBackward0>), "
        "tensor([0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333],\n"
        "       requires_grad=True), tensor([[0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, "
        "0.3333],\n        [0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333]],\n"
        "       grad_fn=<MulBackward0>)]",
    ),
    (
        "roll",
        lambda: torch.arange(6).view(2, 3).roll(1, 1),
        "tensor([[2, 0, 1],\n        [5, 3, 4]])",
    ),
    (
        "roll, dims=None flattens",
        lambda: torch.arange(6).view(2, 3).roll(-2),
        "tensor([[2, 3, 4],\n        [5, 0, 1]])",
    ),
    (
        "torch.roll tuples",
        lambda: torch.roll(torch.arange(6).view(2, 3), shifts=(1, -1), dims=(0, 1)),
        "tensor([[4, 5, 3],\n        [1, 2, 0]])",
    ),
    (
        "roll gradient",
        lambda: _grad_of(lambda x: x.roll(1) * torch.tensor([1.0, 2.0, 3.0]), [1.0, 1.0, 1.0]),
        "tensor([2., 3., 1.])",
    ),
    (
        "keepdims alias",
        _keepdims_shapes,
        "[(2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (2, 1), (1, 3), (1, 3)]",
    ),
    (
        "log10 log2",
        lambda: (torch.tensor([1.0, 10.0, 1000.0]).log10(), torch.log2(torch.tensor([1.0, 8.0]))),
        "(tensor([0., 1., 3.]), tensor([0., 3.]))",
    ),
    (
        "log10 log2 of integers are float32",
        lambda: (torch.tensor([10, 100]).log10(), torch.log2(torch.tensor([8]))),
        "(tensor([1., 2.]), tensor([3.]))",
    ),
    ("log10 gradient", lambda: _grad_of(torch.log10, [1.0, 10.0]), "tensor([0.4343, 0.0434])"),
    ("log2 gradient", lambda: _grad_of(lambda x: x.log2(), [1.0, 4.0]), "tensor([1.4427, 0.3607])"),
    (
        "default device",
        lambda: _with_default_device("cpu"),
        "(device(type='cpu'), device(type='cpu'), device(type='cpu'))",
    ),
    (
        "Flatten",
        lambda: (
            nn.Flatten(),
            nn.Flatten()(torch.zeros(2, 3, 4)).shape,
            nn.Flatten(0, 1)(torch.zeros(5, 1)).shape,
        ),
        "(Flatten(start_dim=1, end_dim=-1), torch.Size([2, 12]), torch.Size([5]))",
    ),
    (
        "Unflatten",
        lambda: (nn.Unflatten(1, (2, 3)), nn.Unflatten(-1, (2, 2))(torch.zeros(3, 4)).shape),
        "(Unflatten(dim=1, unflattened_size=(2, 3)), torch.Size([3, 2, 2]))",
    ),
    ("RMSprop", lambda: _rmsprop(), "tensor([ 0.6758, -4.8588])"),
    (
        "RMSprop momentum centered",
        lambda: _rmsprop(momentum=0.9, centered=True),
        "tensor([-0.2403, -7.4122])",
    ),
    (
        "RMSprop weight_decay alpha eps",
        lambda: _rmsprop(alpha=0.9, eps=1e-3, weight_decay=0.1),
        "tensor([ 0.8547, -2.9175])",
    ),
    (
        "RMSprop state",
        _rmsprop_state,
        "['grad_avg', 'momentum_buffer', 'square_avg', 'step']",
    ),
    (
        "histogram",
        lambda: tuple(torch.histogram(torch.tensor([1.0, 2.0, 1.0]), bins=4, range=(0.0, 3.0))),
        "(tensor([0., 2., 1., 0.]), tensor([0.0000, 0.7500, 1.5000, 2.2500, 3.0000]))",
    ),
    (
        "histogram density",
        lambda: tuple(torch.histogram(torch.tensor([1.0, 2.0, 1.0, 5.0]), bins=4, density=True)),
        "(tensor([0.5000, 0.2500, 0.0000, 0.2500]), tensor([1., 2., 3., 4., 5.]))",
    ),
    (
        "BatchNorm1d",
        _batchnorm,
        "([[-1.2247, -0.4629], [0.0, 1.3887], [1.2247, -0.9258]], tensor([0.3000, 0.3000]), tensor([1.3000, 1.6000]), tensor([[0.6139, 1.3440],\n        [2.3680, 4.5062],\n        [4.1222, 0.5534]]), tensor(1))",
    ),
    (
        "BatchNorm1d gradient",
        _batchnorm_grad,
        "(tensor([[ 0.2041,  0.6062],\n        [-0.4082, -0.1212],\n        [ 0.2041, -0.4850]]), tensor([ 1.2247, -2.3145]), tensor([3.5000, 1.0000]))",
    ),
    (
        "BatchNorm1d (N, C, L), cumulative average",
        _batchnorm_3d,
        "(torch.Size([2, 2, 3]), tensor([4., 7.]), tensor([11.6000, 11.6000]), [])",
    ),
    (
        "BatchNorm1d repr",
        lambda: nn.BatchNorm1d(3, momentum=0.2),
        "BatchNorm1d(3, eps=1e-05, momentum=0.2, affine=True, bias=True, track_running_stats=True)",
    ),
    (
        "set_float32_matmul_precision (build-nanogpt)",
        lambda: [
            torch.set_float32_matmul_precision(p) or torch.get_float32_matmul_precision()
            for p in ("high", "medium", "highest")
        ],
        "['high', 'medium', 'highest']",
    ),
    ("torch.version.cuda, as a CPU build", lambda: torch.version.cuda, "None"),
    ("torch.version.__version__", lambda: torch.version.__version__ == torch.__version__, "True"),
    (
        "cuda memory statistics, as a CPU build (llm.c)",
        lambda: [torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()],
        "[0, 0]",
    ),
    (
        "torch._inductor.config is settable (llm.c)",
        lambda: _inductor_config_set("coordinate_descent_tuning", True),
        "True",
    ),
]


def _inductor_config_set(name, value):
    import tensorgrad._inductor.config as config

    before = getattr(config, name)
    setattr(config, name, value)
    try:
        return getattr(config, name)
    finally:
        setattr(config, name, before)


@pytest.mark.parametrize(("code", "expected"), [pytest.param(c, e, id=n) for n, c, e in IDIOMS])
def test_idiom_gives_pytorchs_result(code, expected):
    assert repr(code()) == expected


ERRORS = [
    ("reversed slice", lambda: torch.arange(4)[::-1], ValueError, "step must be greater than zero"),
    (
        "numpy() of bfloat16",
        lambda: torch.ones(2).to(torch.bfloat16).numpy(),
        TypeError,
        "Got unsupported ScalarType BFloat16",
    ),
    (
        "an unknown float32 matmul precision",
        lambda: torch.set_float32_matmul_precision("low"),
        RuntimeError,
        "Invalid precision",
    ),
    (
        "float32 @ float64",
        lambda: torch.ones(2, 2) @ torch.ones(2, 2, dtype=torch.float64),
        RuntimeError,
        "expected m1 and m2 to have the same dtype, but got: float != double",
    ),
    (
        "int32 class targets",
        lambda: F.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1], dtype=torch.int32)),
        RuntimeError,
        "expected target dtype to be Long or Byte",
    ),
    (
        ".numpy() of a tensor that requires grad",
        lambda: torch.ones(2, requires_grad=True).numpy(),
        RuntimeError,
        "Can't call numpy() on Tensor that requires grad",
    ),
    (
        "plain Tensor as a Parameter attribute",
        lambda: setattr(nn.Linear(3, 4), "weight", torch.ones(4, 3)),
        TypeError,
        "cannot assign 'torch.FloatTensor' as parameter 'weight' (torch.nn.Parameter or None expected)",
    ),
]


@pytest.mark.parametrize(
    ("code", "error", "message"), [pytest.param(*e[1:], id=e[0]) for e in ERRORS]
)
def test_code_pytorch_rejects_raises(code, error, message):
    with pytest.raises(error) as info:
        code()
    assert message in str(info.value)


# ----------------------------------------------------------------------------- new ops' gradients
# Every differentiable op added for issue 27, checked in float64 against NumPy and finite
# differences on hypothesis-drawn shapes.


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _scatter_ref(x, y):
    out, n = x.copy(), x.shape[0]
    out[np.arange(n), np.arange(n) % x.shape[1]] = y[:, 0]
    return out


def _index_add_ref(x, y):
    out = x.copy()
    np.add.at(out, np.arange(x.shape[0]) // 2, y)
    return out


def _w(x):
    return np.linspace(0.5, 2.0, x.shape[1])


def _class_ids(x):
    return np.arange(x.shape[0]) % x.shape[1]


UNARY_NEW = {
    "sin": (lambda x: x.sin(), np.sin),
    "cos": (lambda x: torch.cos(x), np.cos),
    "prod": (lambda x: x.prod(), np.prod),
    "prod dim": (lambda x: x.prod(-1), lambda x: x.prod(-1)),
    "prod keepdim": (lambda x: x.prod(0, keepdim=True), lambda x: x.prod(0, keepdims=True)),
    "logsumexp": (lambda x: x.logsumexp(-1), lambda x: np.log(np.exp(x).sum(-1))),
    "flip": (lambda x: x.flip(-1), lambda x: np.flip(x, -1)),
    "max(dim) values": (lambda x: x.max(dim=-1).values, lambda x: x.max(-1)),
    "min(dim) values": (lambda x: x.min(0, keepdim=True)[0], lambda x: x.min(0, keepdims=True)),
    "softplus": (F.softplus, lambda x: np.log1p(np.exp(x))),
    "softplus beta": (lambda x: F.softplus(x, beta=2.0), lambda x: np.log1p(np.exp(2 * x)) / 2),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), lambda x: np.where(x > 0, x, 0.1 * x)),
    "elu": (F.elu, lambda x: np.where(x > 0, x, np.expm1(x))),
    "normalize": (
        lambda x: F.normalize(x, dim=-1),
        lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True),
    ),
    "nan_to_num": (lambda x: x.nan_to_num(), lambda x: x),
    "roll": (lambda x: x.roll(1, -1), lambda x: np.roll(x, 1, -1)),
    "roll flattened": (lambda x: x.roll(-2), lambda x: np.roll(x, -2)),
    "roll two dims": (
        lambda x: torch.roll(x, (1, 2), (0, -1)),
        lambda x: np.roll(x, (1, 2), (0, -1)),
    ),
    "log10": (lambda x: x.abs().log10(), lambda x: np.log10(np.abs(x))),
    "log2": (lambda x: torch.log2(x.abs()), lambda x: np.log2(np.abs(x))),
    "where promoted": (lambda x: torch.where(x > 0, x, 1), lambda x: np.where(x > 0, x, 1.0)),
}


@pytest.mark.parametrize("op", UNARY_NEW)
@given(data=st.data(), shape=shapes(min_dims=1))
def test_new_unary_op_gradients(op, data, shape):
    x = data.draw(arrays(shape, min_abs=0.1))  # away from the kinks at 0
    # no ties, nor near-ties inside the finite differences' step: no derivative there
    assume("(dim)" not in op or x.size < 2 or np.diff(np.sort(x, axis=None)).min() > 1e-3)
    check_op(*UNARY_NEW[op], x, name=f"{op} {shape}")


PAIR_NEW = {
    "scatter": (
        lambda x, y: x.scatter(1, torch.tensor(np.arange(x.shape[0]) % x.shape[1])[:, None], y),
        _scatter_ref,
    ),
    "index_add": (
        lambda x, y: x.index_add(0, torch.tensor(np.arange(x.shape[0]) // 2), y),
        _index_add_ref,
    ),
    "cross_entropy weight": (
        lambda x, _: F.cross_entropy(x, torch.tensor(_class_ids(x)), weight=torch.tensor(_w(x))),
        lambda x, _: (
            -(_w(x)[_class_ids(x)] * _log_softmax(x)[np.arange(len(x)), _class_ids(x)]).sum()
            / _w(x)[_class_ids(x)].sum()
        ),
    ),
    "cross_entropy probabilities": (
        F.cross_entropy,
        lambda x, p: -(p * _log_softmax(x)).sum(-1).mean(),
    ),
    "nll_loss ignore_index": (
        lambda x, _: F.nll_loss(x, torch.tensor([-100, *_class_ids(x)[1:]])),
        lambda x, _: -x[np.arange(1, len(x)), _class_ids(x)[1:]].mean() if len(x) > 1 else np.nan,
    ),
    "bce with logits": (
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, pos_weight=torch.tensor(2.0)),
        lambda x, y: (
            -(2 * y * np.log(1 / (1 + np.exp(-x))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-x))))
        ).mean(),
    ),
    "outer": (lambda x, y: x[0].outer(y[0]), lambda x, y: np.outer(x[0], y[0])),
    "batch_norm": (
        lambda x, y: F.batch_norm(x, None, None, y[0], y[1], training=True),
        lambda x, y: (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5) * y[0] + y[1],
    ),
    "mm": (lambda x, y: x.mm(y.T), lambda x, y: x @ y.T),
}


@pytest.mark.parametrize("op", PAIR_NEW)
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=2, min_side=2))
def test_new_two_input_op_gradients(op, data, shape):
    x, y = data.draw(arrays(shape, min_abs=0.1)), data.draw(arrays(shape, min_abs=0.1))
    check_op(*PAIR_NEW[op], x, y, name=f"{op} {shape}")


def test_summary_writer_without_tensorboard_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "tensorgrad.utils.tensorboard", raising=False)
    with pytest.raises(
        ImportError, match=r"needs the tensorboard package.*pip install tensorboard"
    ):
        from tensorgrad.utils.tensorboard import SummaryWriter  # noqa: F401


def test_summary_writer_scalars_read_back_by_tensorboard(tmp_path):
    pytest.importorskip(
        "tensorboard", reason="tensorboard is not installed: pip install tensorboard"
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    from tensorgrad.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path)) as writer:  # makemore's calls
        writer.add_scalar("Loss/train", torch.tensor(2.5), 500)
        writer.add_scalar("Loss/train", 1.75, 1000)
        writer.add_scalars("lr", {"a": 0.1}, 3)
        writer.flush()
        with pytest.raises(NotImplementedError, match="scalars only"):
            writer.add_histogram("w", torch.zeros(3), 0)
    runs = {}
    for run in (tmp_path, tmp_path / "lr_a"):
        acc = EventAccumulator(str(run))
        acc.Reload()
        runs[run.name] = {
            tag: [(e.step, round(float(make_ndarray(e.tensor_proto)), 6)) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]
        }
    assert runs == {
        tmp_path.name: {"Loss/train": [(500, 2.5), (1000, 1.75)]},
        "lr_a": {"lr": [(3, 0.1)]},
    }


def test_embedding_padding_row_gets_no_gradient():
    e = nn.Embedding(4, 3, padding_idx=1)
    assert np.all(e.weight.detach().numpy()[1] == 0)
    with torch.no_grad():
        e.weight[1] = 5.0  # the row's values are still read, only its gradient is zero
    out = e(torch.tensor([1, 2, 1]))
    out.sum().backward()
    assert np.all(out.detach().numpy()[0] == 5.0)
    np.testing.assert_array_equal(e.weight.grad.numpy()[:, 0], [0.0, 0.0, 1.0, 0.0])


def test_mixed_indexing_writes_where_pytorch_reads():
    x = torch.zeros(2, 3, 4)
    x[0, :, [1, 2]] = torch.arange(6.0).view(3, 2)
    np.testing.assert_array_equal(x[0, :, [1, 2]].numpy(), np.arange(6.0).reshape(3, 2))
    y = torch.arange(24.0).view(2, 3, 4).requires_grad_()
    y[1, [0, 2], 1:3].sum().backward()
    assert y.grad.numpy().sum() == 4 and y.grad.numpy()[1, 2, 2] == 1


def test_parameter_data_assignment_and_set_to_none():
    lin = nn.Linear(3, 4)
    lin.weight.data = torch.zeros(4, 3)  # a Tensor: its array is stored
    assert isinstance(lin.weight.array, np.ndarray) and lin.weight.detach().numpy().sum() == 0
    lin.weight.data = np.ones((4, 3), np.float32)  # an array is stored as it is
    assert lin.weight.detach().numpy().sum() == 12 and isinstance(lin.weight.data, torch.Tensor)
    for bad in ([1.0, 2.0], 5.0):  # PyTorch's TypeError, not a tensor holding a list
        with pytest.raises(TypeError, match="Variable data has to be a tensor, but got"):
            lin.bias.data = bad
    lin.bias = None  # stays a registered (absent) parameter, as PyTorch
    assert list(dict(lin.named_parameters())) == ["weight"] and lin.bias is None
    with pytest.raises(TypeError, match="cannot assign 'torch.FloatTensor' as parameter 'bias'"):
        lin.bias = torch.zeros(4)


def test_new_in_place_updates_record_their_gradients():
    """neg_, exp_, lerp_, addcmul_, addcdiv_ on a tensor in the graph give the gradients of
    the out-of-place formulas (float64; those ops are finite-difference checked above)."""
    rng = np.random.default_rng(0)
    vals = [rng.uniform(0.5, 1.5, (3, 4)) for _ in range(4)]

    def run(in_place):
        x, a, b, e = (torch.tensor(v, requires_grad=True) for v in vals)
        y = x * 1.0
        if in_place:
            y.addcmul_(a, b, value=0.3).addcdiv_(a, b, value=0.2).lerp_(e, 0.25).neg_().exp_()
        else:
            y = y + a * b * 0.3
            y = y + a / b * 0.2
            y = (-(y + (e - y) * 0.25)).exp()
        (y * torch.tensor(vals[0])).sum().backward()
        return [t.grad.numpy() for t in (x, a, b, e)]

    for got, want in zip(run(True), run(False)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
