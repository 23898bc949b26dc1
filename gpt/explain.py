"""gpt-explain: one training step of a GPT on one prompt, shown stage by stage.

``explain(model, tokenizer, prompt)`` runs the step and returns a JSON-able report:

1. the prompt's token ids and the (input, target) pairs: inputs tokens[:-1], targets tokens[1:];
2. the forward pass, re-run here stage by stage from the model's own modules (so any stage can
   be recorded and can keep its gradient): embeddings, then for the chosen block every stage
   (ln_1, c_attn, q/k/v, heads, q·kᵀ/√hs, causal mask, softmax, ·v, merged heads, W_O,
   residual, ln_2, MLP, residual), the other blocks as one summary line each, then ln_f, the
   tied logits H·Eᵀ and the softmax; the loss must match ``model(idx, targets)``;
3. the attention matrix of every head, the top-k next tokens, the loss and its per-position terms;
4. the backward pass: every parameter's gradient norm (c_attn's weight as its W_Q, W_K, W_V
   row blocks), loudly flagging parameters the loss never reached;
5. one AdamW step (``model.configure_optimizers``): per parameter ‖Δw‖ and ‖Δw‖/‖w‖, and for one
   element of W_Q every number of the update, so that the new value can be checked by hand.

Dropout is switched off (eval mode) during the step, so every printed number is reproducible
and attention rows sum to exactly 1. The model's weights are updated in place, as training
would. ``render_text`` and ``render_html`` turn the report into a terminal listing or one
self-contained HTML page (they live in gpt.explain_text and gpt.explain_html and are imported
here); ``--format json`` prints the report itself.

Without --out-dir or --init-from, the model is a fresh GPT of the 'tiny' preset whose
vocabulary is a byte-level BPE learned from the prompt alone: every word of a short prompt
becomes one token, so "The capital of France is Paris" is the six tokens of the walkthrough.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

import tensorgrad as tg
import tensorgrad.functional as F
from tensorgrad import device_of, get_array_module, to_device, to_numpy

from .config import GPTConfig
from .explain_html import render_html
from .explain_text import render_text
from .model import GPT

DEFAULT_PROMPT = "The capital of France is Paris"
OK, NO_GRAD, ZERO, NON_FINITE = "ok", "no grad", "zero", "non-finite"  # as gpt.diagnostics
N_VALUES = 4  # how many features of a vector the report shows


# ----------------------------------------------------------------------------- small helpers
def _host(t) -> np.ndarray:
    return to_numpy(t.data if isinstance(t, tg.Tensor) else t)


def _norm(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.sqrt(np.dot(a.ravel(), a.ravel())))


def _rms(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def _status(g) -> tuple[float | None, str]:
    if g is None:
        return None, NO_GRAD
    n = _norm(g)
    return n, OK if math.isfinite(n) and n > 0 else (ZERO if n == 0 else NON_FINITE)


def _num(x) -> float | None:
    """A JSON number (None for -inf/nan, e.g. a masked score)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _sample(a: np.ndarray, axes, position: int, head: int):
    """The few values shown for a stage and where they come from, e.g. '[0, 4, :4]'."""
    picks, seen_t = [], False  # (index, label) per axis
    for ax in axes:
        if ax in ("B", "1"):
            picks.append((0, "0"))
        elif ax == "nh":
            picks.append((head, str(head)))
        elif ax == "T" and not seen_t:
            seen_t = True
            picks.append((position, str(position)))
        elif ax == "T":  # the key axis of a (T, T) matrix: the whole row
            picks.append((slice(None), ":"))
        else:
            picks.append((slice(0, N_VALUES), f":{N_VALUES}"))
    vals = np.asarray(a[tuple(i for i, _ in picks)], dtype=np.float64).ravel()
    return "[" + ", ".join(w for _, w in picks) + "]", [_num(v) for v in vals]


class _Recorder:
    """Keeps the stage tensors (and their gradients: retain_grad) in the order they run."""

    def __init__(self):
        self.stages, self.tensors = [], {}

    def __call__(self, key, name, t, axes, formula, block=None):
        if t.requires_grad and not t.is_leaf:
            t.retain_grad()
        self.tensors[key] = t
        self.stages.append({"key": key, "name": name, "block": block, "formula": formula,
                            "shape": list(t.shape), "axes": list(axes)})
        return t


# ----------------------------------------------------------------------------- the forward pass
def _block_forward(block, i, x, allowed, rec, full):
    """One transformer block on (B, T, C) ``x``, the attention spelled out; stages recorded
    when ``full``. Returns the block output, its attention weights and the two deltas."""
    attn, mlp = block.attn, block.mlp
    B, T, C = x.shape
    nh = attn.n_head
    hs = C // nh
    r = rec if full else (lambda key, name, t, *a, **k: t)
    h = r(f"h{i}.ln_1", "ln_1", block.ln_1(x), "BTC", "(x - mean)/std · γ + β", i)
    qkv = r(f"h{i}.qkv", "c_attn", attn.c_attn(h), ("B", "T", "3C"),
            "ln_1 · [W_Q; W_K; W_V]ᵀ + b", i)
    q, k, v = qkv.split(C, dim=2)
    r(f"h{i}.q", "q", q, "BTC", "qkv[..., 0:C] = ln_1 · W_Qᵀ + b_Q", i)
    r(f"h{i}.k", "k", k, "BTC", "qkv[..., C:2C] = ln_1 · W_Kᵀ + b_K", i)
    r(f"h{i}.v", "v", v, "BTC", "qkv[..., 2C:3C] = ln_1 · W_Vᵀ + b_V", i)
    heads = ("B", "nh", "T", "hs")
    q = r(f"h{i}.q_heads", "q heads", q.view(B, T, nh, hs).transpose(1, 2), heads,
          "q.view(B, T, nh, hs).transpose(1, 2)", i)
    k = r(f"h{i}.k_heads", "k heads", k.view(B, T, nh, hs).transpose(1, 2), heads,
          "the same split for k", i)
    v = r(f"h{i}.v_heads", "v heads", v.view(B, T, nh, hs).transpose(1, 2), heads,
          "the same split for v", i)
    tt = ("B", "nh", "T", "T")
    s = r(f"h{i}.scores", "scores", (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs)), tt,
          f"q · kᵀ / √hs  (√{hs} = {math.sqrt(hs):.4g})", i)
    s = r(f"h{i}.masked", "masked scores", s.masked_fill(~tg.Tensor(allowed), float("-inf")),
          tt, "scores, -inf where key s > query t (the future)", i)
    att = r(f"h{i}.att", "attention weights", F.softmax(s, dim=-1), tt,
            "softmax over keys: rows sum to 1, future = 0", i)
    y = r(f"h{i}.att_out", "attention output", att @ v, heads, "att · v", i)
    y = r(f"h{i}.merged", "merged heads", y.transpose(1, 2).contiguous().view(B, T, C), "BTC",
          "heads side by side: transpose(1, 2).view(B, T, C)", i)
    a = r(f"h{i}.attn_proj", "c_proj (W_O)", attn.c_proj(y), "BTC", "merged · W_Oᵀ + b_O", i)
    x = r(f"h{i}.resid_1", "residual 1", x + a, "BTC", "x + attention", i)
    h = r(f"h{i}.ln_2", "ln_2", block.ln_2(x), "BTC", "(x - mean)/std · γ + β", i)
    h = r(f"h{i}.fc", "MLP c_fc", mlp.c_fc(h), ("B", "T", "4C"), "ln_2 · W_fcᵀ + b_fc", i)
    h = r(f"h{i}.gelu", "GELU", mlp.gelu(h), ("B", "T", "4C"), "GELU(c_fc) = x·Φ(x)", i)
    m = r(f"h{i}.mlp_proj", "MLP c_proj", mlp.c_proj(h), "BTC", "GELU · W_projᵀ + b_proj", i)
    x = r(f"h{i}.resid_2", "residual 2", x + m, "BTC", "x + MLP: the block's output", i)
    return x, att, a, m


def _forward(model, idx, targets, rec, layer):
    """The model's forward, stage by stage: (logits, loss, attention per layer, block summaries)."""
    tr = model.transformer
    B, T = idx.shape
    tok = rec("tok_emb", "token embedding", tr.wte(idx), "BTC", "wte[x]: row x_t of E")
    xp = get_array_module(idx)
    pos = rec("pos_emb", "position embedding", tr.wpe(xp.arange(T)[None, :]),
              ("1", "T", "C"), "wpe[t] for t = 0..T-1")
    x = rec("x", "embedding sum", tok + pos, "BTC", "tok_emb + pos_emb")
    x = tr.drop(x)
    allowed = F.causal_mask(xp, T, T)
    atts, blocks = [], []
    for i, block in enumerate(tr.h):
        x_in = x
        x, att, a, m = _block_forward(block, i, x, allowed, rec, full=i == layer)
        if i != layer:
            x.retain_grad()
        atts.append(_host(att)[0])
        blocks.append({"block": i, "full": i == layer, "tensor": x, "rms_in": _rms(_host(x_in)),
                       "rms_attn": _rms(_host(a)), "rms_mlp": _rms(_host(m)),
                       "rms_out": _rms(_host(x))})
    h = rec("ln_f", "ln_f", tr.ln_f(x), "BTC", "final LayerNorm: H")
    tied = model.lm_head is None
    logits = rec("logits", "logits", F.linear(h, model.unembedding), ("B", "T", "V"),
                 "H · Eᵀ (tied to the token embedding)" if tied else "H · W_lmᵀ")
    rec("probs", "probabilities", F.softmax(logits, dim=-1), ("B", "T", "V"),
        "softmax(logits) over the vocabulary (the loss takes the logits directly)")
    loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))
    return logits, loss, atts, blocks


# ----------------------------------------------------------------------------- explain
def explain(model: GPT, tokenizer, prompt: str, layer: int = 0, heads=None,
            position: int | None = None, lr: float = 1e-3, seed: int = 0,
            element: tuple[int, int] | None = None, weight_decay: float = 0.1,
            betas=(0.9, 0.95), eps: float = 1e-8, top_k: int = 5) -> dict:
    """Run one training step of ``model`` on ``prompt`` and return what happened, as a dict.

    layer: the block shown in full (others are summarised); heads: the heads whose attention
    matrices are shown (default: up to the first four); position: the token position whose
    vectors and next-token prediction are shown (default: the last; negative counts from the
    end); element: (row, col) of the W_Q element whose AdamW update is worked out (default: the
    one with the largest gradient). lr, weight_decay, betas, eps: the AdamW step. seed seeds
    tensorgrad's generators first. The model's weights are updated in place.
    """
    cfg = model.config
    ids = [int(i) for i in tokenizer.encode(prompt)]
    notes = []
    if len(ids) < 2:
        raise ValueError(f"the prompt {prompt!r} is {len(ids)} token(s); a training step needs "
                         "at least 2 (inputs are tokens[:-1], targets tokens[1:])")
    if len(ids) > cfg.block_size + 1:
        notes.append(f"the prompt's {len(ids)} tokens were cut to block_size + 1 = "
                     f"{cfg.block_size + 1}")
        ids = ids[: cfg.block_size + 1]
    if max(ids) >= cfg.vocab_size:
        raise ValueError(f"token id {max(ids)} is outside the model's vocabulary "
                         f"({cfg.vocab_size}); the tokenizer does not fit the model")
    T, C, nh = len(ids) - 1, cfg.n_embd, cfg.n_head
    hs = C // nh
    if not 0 <= layer < cfg.n_layer:
        raise ValueError(f"layer {layer} is outside 0..{cfg.n_layer - 1}")
    heads = list(range(min(nh, 4))) if heads is None else [int(h) for h in heads]
    if not heads or any(not 0 <= h < nh for h in heads):
        raise ValueError(f"heads {heads} must be in 0..{nh - 1}")
    position = T - 1 if position is None else int(position)
    if position < 0:
        position += T
    if not 0 <= position < T:
        raise ValueError(f"position must be in 0..{T - 1} (or -{T}..-1), got {position}")
    if cfg.dropout > 0:
        notes.append(f"dropout (p = {cfg.dropout}) is off for this step, so that the numbers "
                     "repeat and attention rows sum to exactly 1")
    if T == 1:
        notes.append("with one position, softmax over a single key is constant: W_Q and W_K "
                     "cannot get a gradient (use a longer prompt)")

    tg.manual_seed(seed)
    dev = device_of(model.transformer.wte.weight.data)
    idx = to_device(np.asarray([ids[:-1]], dtype=np.int64), dev)
    targets = to_device(np.asarray([ids[1:]], dtype=np.int64), dev)
    was_training = model.training
    model.eval()  # dropout off: reproducible numbers, rows of exactly 1
    try:
        with tg.no_grad():
            _, check = model(idx, targets)
        model.zero_grad()
        rec = _Recorder()
        logits, loss, atts, blocks = _forward(model, idx, targets, rec, layer)
        loss.backward()
        report = _forward_report(tokenizer, ids, rec, logits, loss, atts, blocks, layer, heads,
                                 position, top_k, float(_host(check)))
        report["gradients"], report["no_gradient"] = _gradients(model, C)
        report["adamw"] = _adamw_step(model, C, hs, layer, element, lr, weight_decay, betas, eps)
    finally:
        model.train(was_training)
    d = cfg.to_dict()
    report.update(prompt=prompt, notes=notes, seed=seed,
                  config=dict(d, head_size=hs, n_params=model.num_params(non_embedding=False)),
                  tokenizer={"kind": getattr(tokenizer, "kind", type(tokenizer).__name__),
                             "vocab_size": int(tokenizer.vocab_size)},
                  shown={"layer": layer, "heads": heads, "position": position},
                  dims={"B": 1, "T": T, "C": C, "nh": nh, "hs": hs, "V": cfg.vocab_size})
    return report


def _forward_report(tok, ids, rec, logits, loss, atts, blocks, layer, heads, position, top_k,
                    model_loss):
    def text(i):
        return tok.decode([i])

    T = len(ids) - 1
    for st in rec.stages:
        t = rec.tensors[st["key"]]
        st["at"], st["values"] = _sample(_host(t), st["axes"], position, heads[0])
        st["rms"] = _rms(_host(t))
        st["grad_norm"] = _norm(_host(t.grad)) if t.grad is not None else None
    for b in blocks:
        t = b.pop("tensor")
        b["grad_norm_out"] = _norm(_host(t.grad)) if t.grad is not None else None
    lg = _host(logits)[0].astype(np.float64)  # (T, V)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    logp = np.log(p)
    k = min(top_k, p.shape[-1])
    predictions = []
    for t in range(T):
        order = np.argsort(-p[t], kind="stable")[:k]
        top = [{"id": int(j), "token": text(int(j)), "prob": float(p[t, j])} for j in order]
        predictions.append({"position": t, "input": text(ids[t]), "target_id": ids[t + 1],
                            "target": text(ids[t + 1]), "top": top})
    terms = [{"position": t, "target_id": ids[t + 1], "target": text(ids[t + 1]),
              "prob": float(p[t, ids[t + 1]]), "loss": float(-logp[t, ids[t + 1]])}
             for t in range(T)]
    allowed = np.tril(np.ones((T, T), dtype=bool))
    sc = _host(rec.tensors.get(f"h{layer}.scores"))[0]
    attention = {"layer": layer, "heads": [
        {"head": h, "weights": atts[layer][h].astype(float).tolist(),
         "scores": [[_num(sc[h, i, j]) for j in range(T)] for i in range(T)],
         "masked_scores": [[_num(sc[h, i, j]) if allowed[i, j] else None for j in range(T)]
                           for i in range(T)]}
        for h in heads]}
    return {
        "tokens": {"ids": ids, "text": [text(i) for i in ids]},
        "pairs": [{"position": t, "input_id": ids[t], "input": text(ids[t]),
                   "target_id": ids[t + 1], "target": text(ids[t + 1])} for t in range(T)],
        "stages": rec.stages, "blocks": blocks, "causal_mask": allowed.tolist(),
        "attention": attention,
        "attention_all": [[a.astype(float).tolist() for a in layer_att] for layer_att in atts],
        "predictions": predictions, "next_token": predictions[position],
        "loss": {"value": float(_host(loss)), "terms": terms,
                 "mean_of_terms": float(np.mean([t["loss"] for t in terms])),
                 "model_forward": model_loss},
    }


def _qkv_rows(name: str, shape, C: int):
    """c_attn's (3C, C) weight as its W_Q, W_K, W_V row blocks; any other parameter whole."""
    if name.endswith("attn.c_attn.weight") and shape[0] == 3 * C:
        return [(f"{name}[W_Q]", slice(0, C)), (f"{name}[W_K]", slice(C, 2 * C)),
                (f"{name}[W_V]", slice(2 * C, 3 * C))]
    return [(name, slice(None))]


def _gradients(model, C):
    rows = []
    for name, p in model.named_parameters():
        w, g = _host(p), None if p.grad is None else _host(p.grad)
        for label, rs in _qkv_rows(name, p.shape, C):
            norm, status = _status(None if g is None else g[rs])
            rows.append({"name": label, "param": name, "shape": list(w[rs].shape),
                         "weight_norm": _norm(w[rs]), "grad_norm": norm, "status": status})
    return rows, [{"name": r["name"], "status": r["status"]} for r in rows if r["status"] != OK]


def _adamw_step(model, C, hs, layer, element, lr, weight_decay, betas, eps):
    opt = model.configure_optimizers(weight_decay, lr, betas)
    for g in opt.param_groups:
        g["eps"] = eps
    named = list(model.named_parameters())
    before = {n: np.array(_host(p), copy=True) for n, p in named}
    had_grad = {n: p.grad is not None for n, p in named}
    wq = model.transformer.h[layer].attn.c_attn.weight
    gq = None if wq.grad is None else _host(wq.grad)[:C].astype(np.float64)
    if element is None:
        element = (0, 0) if gq is None else np.unravel_index(int(np.argmax(np.abs(gq))), gq.shape)
    i, j = (int(e) for e in element)
    if not (0 <= i < C and 0 <= j < C):
        raise ValueError(f"element ({i}, {j}) is outside W_Q's ({C}, {C})")
    opt.step()
    params = []
    for n, p in named:
        w1 = _host(p)
        for label, rs in _qkv_rows(n, p.shape, C):
            dn, wn = _norm(w1[rs] - before[n][rs]), _norm(before[n][rs])
            params.append({"name": label, "update_norm": dn, "weight_norm": wn,
                           "ratio": dn / wn if wn > 0 else None, "skipped": not had_grad[n]})
    group = next(g for g in opt.param_groups if any(q is wq for q in g["params"]))
    b1, b2 = group["betas"]
    wq_name = f"transformer.h.{layer}.attn.c_attn.weight"
    el = {"param": wq_name, "matrix": "W_Q", "layer": layer,
          "row": i, "col": j, "head": i // hs, "head_dim": i % hs, "lr": group["lr"],
          "weight_decay": group["weight_decay"], "beta1": b1, "beta2": b2, "eps": group["eps"],
          "weight": float(before[wq_name][i, j]), "new_weight": float(_host(wq)[i, j])}
    st = opt.state.get(id(wq))
    if gq is None or st is None:
        el.update(grad=None, skipped=True)
    else:
        t = st["step"]
        g = float(gq[i, j])
        m, v = float(_host(st["exp_avg"])[i, j]), float(_host(st["exp_avg_sq"])[i, j])
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        m_hat, v_hat = m / bc1, v / bc2
        decayed = el["weight"] * (1 - el["lr"] * el["weight_decay"])
        update = el["lr"] * m_hat / (math.sqrt(v_hat) + el["eps"])
        el.update(grad=g, step=t, m=m, v=v, bias_correction1=bc1, bias_correction2=bc2,
                  m_hat=m_hat, v_hat=v_hat, decayed=decayed, update=update,
                  formula_new=decayed - update, sgd_new=el["weight"] - el["lr"] * g,
                  skipped=False)
    return {"lr": lr, "weight_decay": weight_decay, "betas": list(betas), "eps": eps,
            "params": params, "element": el}


# ----------------------------------------------------------------------------- CLI
def prompt_tokenizer(prompt: str, kind: str = "bpe"):
    """A tokenizer learned from the prompt alone: byte-level BPE merged until every word is one
    token ('bpe'), or one token per character ('char')."""
    from .tokenizer import BPETokenizer, CharTokenizer

    if kind == "char":
        return CharTokenizer.train(prompt)
    # 256 bytes + at most one merge per byte + <|endoftext|>: BPE stops when pairs run out
    return BPETokenizer.train(prompt, vocab_size=257 + len(prompt.encode("utf-8")))


def load(args):
    """(model, tokenizer, description) from --out-dir, --init-from, or a fresh preset model."""
    if args.out_dir:
        from .run_checkpoint import load_model

        model, tok, _, d = load_model(args.out_dir, which=args.which)
        return model, tok, f"trained run {d}"
    if args.init_from:
        from .tokenizer import load_tokenizer_dir

        return (GPT.from_pretrained(args.init_from), load_tokenizer_dir(args.init_from),
                f"GPT-2 checkpoint {args.init_from}")
    tok = prompt_tokenizer(args.prompt, args.tokenizer)
    n = len(tok.encode(args.prompt))
    base = GPTConfig.from_preset(args.preset)
    cfg = GPTConfig.from_preset(args.preset, vocab_size=tok.vocab_size,
                                block_size=max(base.block_size, n - 1))
    tg.manual_seed(args.seed)
    return GPT(cfg), tok, f"fresh '{args.preset}' GPT, {args.tokenizer} tokenizer from the prompt"


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.replace(" ", "").split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpt-explain", description="Run one training step of a GPT on a prompt and show "
        "every stage: tokens, embeddings, attention, MLP, logits, loss, gradients, AdamW.")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--out-dir", help="a gpt-train run directory (default: a fresh model)")
    src.add_argument("--init-from", help="a HuggingFace GPT-2 directory (config.json, "
                     "model.safetensors, vocab.json, merges.txt)")
    ap.add_argument("--which", choices=("best", "latest"), default="best",
                    help="which checkpoint of --out-dir")
    ap.add_argument("--preset", default="tiny", help="config of the fresh model (vocab_size "
                    "and block_size follow the tokenizer and the prompt)")
    ap.add_argument("--tokenizer", choices=("bpe", "char"), default="bpe",
                    help="fresh model: BPE or characters, learned from the prompt")
    ap.add_argument("--layer", type=int, default=0, help="the block shown in full")
    ap.add_argument("--heads", type=_ints, default=None, help="heads to show, e.g. 0,1")
    ap.add_argument("--position", type=int, default=None,
                    help="token position whose values and prediction are shown (default last)")
    ap.add_argument("--element", type=_ints, default=None,
                    help="row,col of the W_Q element worked through AdamW (default: largest "
                    "gradient)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=("text", "json", "html"), default="text")
    ap.add_argument("-o", "--output", help="write here instead of stdout")
    ap.add_argument("--graph", help="also write the autograd graph of the loss (.dot, or .svg/"
                    ".png/.pdf with Graphviz installed)")
    args = ap.parse_args(argv)
    if args.element is not None and len(args.element) != 2:
        ap.error("--element takes row,col")
    try:
        model, tok, source = load(args)
        if args.graph:
            ids = tok.encode(args.prompt)[: model.config.block_size + 1]
            _, loss = model(np.asarray([ids[:-1]]), np.asarray([ids[1:]]))
            tg.viz.to_dot(loss, params=model, path=args.graph)
        report = explain(model, tok, args.prompt, layer=args.layer, heads=args.heads,
                         position=args.position, lr=args.lr, seed=args.seed,
                         element=args.element, weight_decay=args.weight_decay)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"gpt-explain: {e}", file=sys.stderr)
        return 2
    report["source"] = source
    if args.format == "json":
        text = json.dumps(report, indent=1, allow_nan=False) + "\n"
    elif args.format == "html":
        text = render_html(report)
    else:
        text = render_text(report)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
