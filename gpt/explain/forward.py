"""gpt-explain's forward pass: the model's own modules re-run stage by stage.

``forward(model, idx, targets, rec, layer)`` is the model's forward with the attention spelled
out (q·kᵀ/√hs, the causal mask, softmax, ·v), so that any stage can be recorded with its
gradient (``Recorder``), and so that a head's output can be zeroed (``ablate``) for the
per-head ablation of ``gpt.explain.lens``. The small array helpers shared by the explain
modules live here too, with ``tensor_slice``, the 2-D piece of a stage's tensor the pages draw.
"""

from __future__ import annotations

import math

import numpy as np

import tensorgrad as tg
import tensorgrad.functional as F
from tensorgrad import get_array_module, to_numpy


def host(t) -> np.ndarray:
    return to_numpy(t.array if isinstance(t, tg.Tensor) else t)


def norm(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.sqrt(np.dot(a.ravel(), a.ravel())))


def rms(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def num(x) -> float | None:
    """A JSON number (None for -inf/nan, e.g. a masked score)."""
    x = float(x)
    return x if math.isfinite(x) else None


SLICE_ROWS, SLICE_COLS = 16, 16  # the most positions and features kept of a stage's tensor


def tensor_slice(a: np.ndarray, axes, head: int) -> dict:
    """The 2-D slice of a stage's tensor the pages draw as a heat map: batch 0, head ``head``,
    the first SLICE_ROWS positions and SLICE_COLS features (or keys), values to 6 digits
    (None for -inf). ``rows``/``cols`` name the two axes, ``shape`` is the slice's full size."""
    index, names = [], []
    for ax in axes:
        if ax in ("B", "1"):
            index.append(0)
        elif ax == "nh":
            index.append(head)
        else:
            names.append(ax)
            index.append(slice(None))
    m = np.asarray(a[tuple(index)], dtype=np.float64)
    full = list(m.shape)
    m = m[:SLICE_ROWS, : SLICE_ROWS if names[-1] == "T" else SLICE_COLS]
    cell = [[num(float(f"{v:.6g}")) if math.isfinite(v) else None for v in row] for row in m]
    return {"rows": names[0], "cols": names[1], "shape": full, "values": cell}


class Recorder:
    """Keeps the stage tensors (and their gradients: retain_grad) in the order they run."""

    def __init__(self):
        self.stages, self.tensors = [], {}

    def __call__(self, key, name, t, axes, formula, block=None):
        if t.requires_grad and not t.is_leaf:
            t.retain_grad()
        self.tensors[key] = t
        self.stages.append(
            {
                "key": key,
                "name": name,
                "block": block,
                "formula": formula,
                "shape": list(t.shape),
                "axes": list(axes),
            }
        )
        return t


def _skip(key, name, t, *args, **kwargs):
    return t


def block_forward(block, i, x, allowed, rec=None, ablate: int | None = None):
    """One transformer block on (B, T, C) ``x``, the attention spelled out; stages recorded
    with ``rec``; head ``ablate``'s output zeroed before W_O. Returns the block output, its
    attention weights and the two deltas added to the residual stream."""
    attn, mlp = block.attn, block.mlp
    B, T, C = x.shape
    nh = attn.n_head
    hs = C // nh
    r = rec or _skip
    h = r(f"h{i}.ln_1", "ln_1", block.ln_1(x), "BTC", "(x - mean)/std · γ + β", i)
    qkv = r(
        f"h{i}.qkv", "c_attn", attn.c_attn(h), ("B", "T", "3C"), "ln_1 · [W_Q; W_K; W_V]ᵀ + b", i
    )
    q, k, v = qkv.split(C, dim=2)
    r(f"h{i}.q", "q", q, "BTC", "qkv[..., 0:C] = ln_1 · W_Qᵀ + b_Q", i)
    r(f"h{i}.k", "k", k, "BTC", "qkv[..., C:2C] = ln_1 · W_Kᵀ + b_K", i)
    r(f"h{i}.v", "v", v, "BTC", "qkv[..., 2C:3C] = ln_1 · W_Vᵀ + b_V", i)
    heads = ("B", "nh", "T", "hs")
    q = r(
        f"h{i}.q_heads",
        "q heads",
        q.view(B, T, nh, hs).transpose(1, 2),
        heads,
        "q.view(B, T, nh, hs).transpose(1, 2)",
        i,
    )
    k = r(
        f"h{i}.k_heads",
        "k heads",
        k.view(B, T, nh, hs).transpose(1, 2),
        heads,
        "the same split for k",
        i,
    )
    v = r(
        f"h{i}.v_heads",
        "v heads",
        v.view(B, T, nh, hs).transpose(1, 2),
        heads,
        "the same split for v",
        i,
    )
    tt = ("B", "nh", "T", "T")
    s = r(
        f"h{i}.scores",
        "scores",
        (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs)),
        tt,
        f"q · kᵀ / √hs  (√{hs} = {math.sqrt(hs):.4g})",
        i,
    )
    s = r(
        f"h{i}.masked",
        "masked scores",
        s.masked_fill(~tg.Tensor(allowed), float("-inf")),
        tt,
        "scores, -inf where key s > query t (the future)",
        i,
    )
    att = r(
        f"h{i}.att",
        "attention weights",
        F.softmax(s, dim=-1),
        tt,
        "softmax over keys: rows sum to 1, future = 0",
        i,
    )
    y = r(f"h{i}.att_out", "attention output", att @ v, heads, "att · v", i)
    if ablate is not None:
        xp = get_array_module(y.array)
        keep = xp.ones((1, nh, 1, 1), dtype=y.dtype)
        keep[0, ablate] = 0  # (1, nh, 1, 1): head `ablate` contributes nothing to W_O's input
        y = y * tg.Tensor(keep)
    y = r(
        f"h{i}.merged",
        "merged heads",
        y.transpose(1, 2).contiguous().view(B, T, C),
        "BTC",
        "heads side by side: transpose(1, 2).view(B, T, C)",
        i,
    )
    a = r(f"h{i}.attn_proj", "c_proj (W_O)", attn.c_proj(y), "BTC", "merged · W_Oᵀ + b_O", i)
    x = r(f"h{i}.resid_1", "residual 1", x + a, "BTC", "x + attention", i)
    h = r(f"h{i}.ln_2", "ln_2", block.ln_2(x), "BTC", "(x - mean)/std · γ + β", i)
    h = r(f"h{i}.fc", "MLP c_fc", mlp.c_fc(h), ("B", "T", "4C"), "ln_2 · W_fcᵀ + b_fc", i)
    h = r(f"h{i}.gelu", "GELU", mlp.gelu(h), ("B", "T", "4C"), "GELU(c_fc) = x·Φ(x)", i)
    m = r(f"h{i}.mlp_proj", "MLP c_proj", mlp.c_proj(h), "BTC", "GELU · W_projᵀ + b_proj", i)
    x = r(f"h{i}.resid_2", "residual 2", x + m, "BTC", "x + MLP: the block's output", i)
    return x, att, a, m


def embed(model, idx, rec=None):
    """(B, T, C) token + position embeddings of (B, T) ``idx``."""
    tr, r = model.transformer, rec or _skip
    T = idx.shape[1]
    tok = r("tok_emb", "token embedding", tr.wte(idx), "BTC", "wte[x]: row x_t of E")
    xp = get_array_module(idx)
    pos = r(
        "pos_emb",
        "position embedding",
        tr.wpe(xp.arange(T)[None, :]),
        ("1", "T", "C"),
        "wpe[t] for t = 0..T-1",
    )
    return tr.drop(r("x", "embedding sum", tok + pos, "BTC", "tok_emb + pos_emb"))


def unembed(model, x, rec=None):
    """(B, T, V) logits of the (B, T, C) residual stream: ln_f, then the unembedding."""
    r = rec or _skip
    h = r("ln_f", "ln_f", model.transformer.ln_f(x), "BTC", "final LayerNorm: H")
    tied = model.lm_head is None
    return r(
        "logits",
        "logits",
        F.linear(h, model.unembedding),
        ("B", "T", "V"),
        "H · Eᵀ (tied to the token embedding)" if tied else "H · W_lmᵀ",
    )


def forward(model, idx, targets, rec, layer):
    """The model's forward, stage by stage: (logits, loss, attention per layer, block summaries).

    Block ``layer`` records every stage in ``rec``; the others keep only their output."""
    T = idx.shape[1]
    x = embed(model, idx, rec)
    allowed = F.causal_mask(get_array_module(idx), T, T)
    atts, blocks = [], []
    for i, block in enumerate(model.transformer.h):
        x_in = x
        x, att, a, m = block_forward(block, i, x, allowed, rec if i == layer else None)
        if i != layer:
            x.retain_grad()
        atts.append(host(att)[0])
        blocks.append(
            {
                "block": i,
                "full": i == layer,
                "tensor": x,
                "rms_in": rms(host(x_in)),
                "rms_attn": rms(host(a)),
                "rms_mlp": rms(host(m)),
                "rms_out": rms(host(x)),
            }
        )
    logits = unembed(model, x, rec)
    rec(
        "probs",
        "probabilities",
        F.softmax(logits, dim=-1),
        ("B", "T", "V"),
        "softmax(logits) over the vocabulary (the loss takes the logits directly)",
    )
    loss = F.cross_entropy(logits.view(T * idx.shape[0], -1), targets.reshape(-1))
    return logits, loss, atts, blocks
