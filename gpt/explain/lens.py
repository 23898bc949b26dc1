"""gpt-explain inside the prediction: the logit lens and per-head ablation, on the prompt.

- ``logit_lens``: the residual stream after the embeddings and after each block, read out
  through ln_f and the (tied) unembedding as if the model ended there: per position the top
  tokens, p(target), and the loss that reading would have. After the last block it is the
  model's own prediction.
- ``head_ablation``: the loss with one head's output zeroed (its slice of W_O's input), for
  every head of every block, as Δloss = loss(ablated) - loss: how much the prediction leans on
  that head.
- ``after_step``: after the update, the same prompt again: the loss, the picked head's
  attention and the picked position's next-token probabilities, to set beside the step's own.

All run without gradient on the model's own modules (``gpt.explain.forward``), dropout off.
"""

from __future__ import annotations

import numpy as np

import tensorgrad as tg
import tensorgrad.functional as F
from tensorgrad import get_array_module

from .forward import Recorder, block_forward, embed, forward, host, unembed


def _loss(logits, targets) -> float:
    B, T, V = logits.shape
    return float(host(F.cross_entropy(logits.view(B * T, V), targets.reshape(-1))))


def _readout(logits, ids, decode, top_k):
    lg = host(logits)[0].astype(np.float64)  # (T, V)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    rows = []
    for t in range(lg.shape[0]):
        order = np.argsort(-p[t], kind="stable")[:top_k]
        rows.append(
            {
                "position": t,
                "target_prob": float(p[t, ids[t + 1]]),
                "top": [
                    {"id": int(j), "token": decode(int(j)), "prob": float(p[t, j])} for j in order
                ],
            }
        )
    return rows


def logit_lens(model, idx, targets, ids, decode, top_k: int = 3) -> dict:
    """Per read-out point ('embeddings', 'block 0', ...): the loss and, per position, the top
    ``top_k`` tokens and p(target) of ln_f(x)·Eᵀ."""
    T = idx.shape[1]
    allowed = F.causal_mask(get_array_module(idx), T, T)
    layers = []
    with tg.no_grad():
        x = embed(model, idx)
        for i in range(-1, len(model.transformer.h)):
            if i >= 0:
                x = block_forward(model.transformer.h[i], i, x, allowed)[0]
            logits = unembed(model, x)
            layers.append(
                {
                    "after": "embeddings" if i < 0 else f"block {i}",
                    "block": i,
                    "loss": _loss(logits, targets),
                    "positions": _readout(logits, ids, decode, top_k),
                }
            )
    return {"top_k": top_k, "layers": layers}


def ablated_loss(model, idx, targets, layer: int, head: int) -> float:
    """The loss with head ``head`` of block ``layer`` zeroed before W_O."""
    T = idx.shape[1]
    allowed = F.causal_mask(get_array_module(idx), T, T)
    with tg.no_grad():
        x = embed(model, idx)
        for i, block in enumerate(model.transformer.h):
            x = block_forward(block, i, x, allowed, ablate=head if i == layer else None)[0]
        return _loss(unembed(model, x), targets)


def head_ablation(model, idx, targets, loss: float) -> dict:
    """Δloss of zeroing each head, as a (n_layer, n_head) table."""
    c = model.config
    delta = [
        [ablated_loss(model, idx, targets, i, h) - loss for h in range(c.n_head)]
        for i in range(c.n_layer)
    ]
    flat = [(abs(d), i, h) for i, row in enumerate(delta) for h, d in enumerate(row)]
    _, i, h = max(flat)
    return {
        "loss": loss,
        "delta": delta,
        "most_important": {"layer": i, "head": h, "delta": delta[i][h]},
    }


def after_step(model, idx, targets, layer: int, head: int, before: dict, decode) -> dict:
    """The prompt once more after the update: the loss (float32), the attention of ``head`` in
    block ``layer``, and p(token) at the picked position for the tokens of ``before`` (a report's
    ``next_token``: its top tokens and the target) before and after the step."""
    with tg.no_grad():
        logits, loss, atts, _ = forward(model, idx, targets, Recorder(), layer)
    t = before["position"]
    lg = host(logits)[0, t].astype(np.float64)  # (V,)
    p = np.exp(lg - lg.max())
    p /= p.sum()
    was = {e["id"]: e["prob"] for e in before["top"]}
    was.setdefault(before["target_id"], before["target_prob"])
    return {
        "loss": float(host(loss)),
        "attention": atts[layer][head].astype(float).tolist(),
        "next_token": [
            {"id": i, "token": decode(i), "before": q, "after": float(p[i])} for i, q in was.items()
        ],
    }
