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

All run the model's own forward (its code as written, op by op) without
gradient, dropout off; hooks reach inside it (a block made to hand on its input, a head's slice
zeroed), so an edit to the model's code shows here too.
"""

from __future__ import annotations

import contextlib

import numpy as np

import tensorgrad as tg

from .arrays import host
from .record import record
from .stages import stages


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
    ``top_k`` tokens and p(target) of ln_f(x)·Eᵀ, x the residual stream there: the model's own
    forward with every later block handing on its input unchanged (a forward hook)."""
    layers = []
    blocks = list(model.transformer.h)
    for i in range(-1, len(blocks)):
        with contextlib.ExitStack() as hooks:
            for b in blocks[i + 1 :]:  # these blocks pass x through: the stream after block i
                hooks.enter_context(b.register_forward_hook(lambda m, args, out: args[0]))
            logits, loss = _forward(model, idx, targets)
        layers.append(
            {
                "after": "embeddings" if i < 0 else f"block {i}",
                "block": i,
                "loss": float(host(loss)),
                "positions": _readout(logits, ids, decode, top_k),
            }
        )
    return {"top_k": top_k, "layers": layers}


def _forward(model, idx, targets):
    with tg.no_grad():
        return model(idx, targets)


def ablated_loss(model, idx, targets, layer: int, head: int) -> float:
    """The loss with head ``head`` of block ``layer`` zeroed before W_O: a pre-hook on its
    c_proj multiplies that head's hs columns of the merged heads by 0."""
    attn = model.transformer.h[layer].attn
    C, nh = model.config.n_embd, model.config.n_head
    hs = C // nh

    def zero_head(module, args):
        y = args[0]  # (B, T, C): the heads side by side
        keep = np.ones(C, dtype=y.dtype)
        keep[head * hs : (head + 1) * hs] = 0
        return (y * tg.Tensor(tg.to_device(keep, tg.device_of(y.array))), *args[1:])

    with attn.c_proj.register_forward_pre_hook(zero_head):
        _, loss = _forward(model, idx, targets)
    return float(host(loss))


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
        root, logits, loss = record(model, idx, targets)
    att = stages(root, model, layer).atts[layer]
    t = before["position"]
    lg = host(logits)[0, t].astype(np.float64)  # (V,)
    p = np.exp(lg - lg.max())
    p /= p.sum()
    was = {e["id"]: e["prob"] for e in before["top"]}
    was.setdefault(before["target_id"], before["target_prob"])
    return {
        "loss": float(host(loss)),
        "attention": att[head].astype(float).tolist(),
        "next_token": [
            {"id": i, "token": decode(i), "before": q, "after": float(p[i])} for i, q in was.items()
        ],
    }
