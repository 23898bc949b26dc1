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
self-contained HTML page; ``--format json`` prints the report itself.

Without --out-dir or --init-from, the model is a fresh GPT of the 'tiny' preset whose
vocabulary is a byte-level BPE learned from the prompt alone: every word of a short prompt
becomes one token, so "The capital of France is Paris" is the six tokens of the walkthrough.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from pathlib import Path

import numpy as np

import tensorgrad as tg
import tensorgrad.functional as F
from tensorgrad.backend import device_of, get_array_module, to_device, to_numpy

from .config import GPTConfig
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
        self.stages.append(dict(key=key, name=name, block=block, formula=formula,
                                shape=list(t.shape), axes=list(axes)))
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
        blocks.append(dict(block=i, full=i == layer, tensor=x, rms_in=_rms(_host(x_in)),
                           rms_attn=_rms(_host(a)), rms_mlp=_rms(_host(m)),
                           rms_out=_rms(_host(x))))
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
                  tokenizer=dict(kind=getattr(tokenizer, "kind", type(tokenizer).__name__),
                                 vocab_size=int(tokenizer.vocab_size)),
                  shown=dict(layer=layer, heads=heads, position=position),
                  dims=dict(B=1, T=T, C=C, nh=nh, hs=hs, V=cfg.vocab_size))
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
        predictions.append(dict(position=t, input=text(ids[t]), target_id=ids[t + 1],
                                target=text(ids[t + 1]),
                                top=[dict(id=int(j), token=text(int(j)), prob=float(p[t, j]))
                                     for j in order]))
    terms = [dict(position=t, target_id=ids[t + 1], target=text(ids[t + 1]),
                  prob=float(p[t, ids[t + 1]]), loss=float(-logp[t, ids[t + 1]]))
             for t in range(T)]
    allowed = np.tril(np.ones((T, T), dtype=bool))
    sc = _host(rec.tensors.get(f"h{layer}.scores"))[0]
    attention = dict(layer=layer, heads=[
        dict(head=h, weights=atts[layer][h].astype(float).tolist(),
             scores=[[_num(sc[h, i, j]) for j in range(T)] for i in range(T)],
             masked_scores=[[_num(sc[h, i, j]) if allowed[i, j] else None for j in range(T)]
                            for i in range(T)])
        for h in heads])
    return dict(
        tokens=dict(ids=ids, text=[text(i) for i in ids]),
        pairs=[dict(position=t, input_id=ids[t], input=text(ids[t]), target_id=ids[t + 1],
                    target=text(ids[t + 1])) for t in range(T)],
        stages=rec.stages, blocks=blocks, causal_mask=allowed.tolist(), attention=attention,
        attention_all=[[a.astype(float).tolist() for a in layer_att] for layer_att in atts],
        predictions=predictions, next_token=predictions[position],
        loss=dict(value=float(_host(loss)), terms=terms,
                  mean_of_terms=float(np.mean([t["loss"] for t in terms])),
                  model_forward=model_loss),
    )


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
            rows.append(dict(name=label, param=name, shape=list(w[rs].shape),
                             weight_norm=_norm(w[rs]), grad_norm=norm, status=status))
    return rows, [dict(name=r["name"], status=r["status"]) for r in rows if r["status"] != OK]


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
            params.append(dict(name=label, update_norm=dn, weight_norm=wn,
                               ratio=dn / wn if wn > 0 else None, skipped=not had_grad[n]))
    group = next(g for g in opt.param_groups if any(q is wq for q in g["params"]))
    b1, b2 = group["betas"]
    wq_name = f"transformer.h.{layer}.attn.c_attn.weight"
    el = dict(param=wq_name, matrix="W_Q", layer=layer,
              row=i, col=j, head=i // hs, head_dim=i % hs, lr=group["lr"],
              weight_decay=group["weight_decay"], beta1=b1, beta2=b2, eps=group["eps"],
              weight=float(before[wq_name][i, j]), new_weight=float(_host(wq)[i, j]))
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
    return dict(lr=lr, weight_decay=weight_decay, betas=list(betas), eps=eps, params=params,
                element=el)


# ----------------------------------------------------------------------------- text
def _f(x) -> str:
    """A value, signed, 4 decimals (scientific when tiny); None is a masked -inf."""
    if x is None:
        return "  -inf "
    return f"{x:+.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:+.1e}"


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _tok(s: str, width: int = 0) -> str:
    r = repr(s)
    return (r[: width - 1] + "…" if width and len(r) > width else r).ljust(width)


def _shape(shape, axes) -> str:
    return "(" + ", ".join(map(str, shape)) + ") " + ",".join(axes)


def _matrix(lines, rows, labels, fmt, masked=None):
    w = 9
    lines.append(" " * 16 + "".join(_tok(s, w - 1)[: w - 1].rjust(w) for s in labels))
    for i, row in enumerate(rows):
        cells = ["·".rjust(w) if masked is not None and not masked[i][j] else fmt(v).rjust(w)
                 for j, v in enumerate(row)]
        lines.append(f"  {i:>2} {_tok(labels[i], 11)}" + "".join(cells))


def render_text(r: dict) -> str:
    """The report as a terminal listing, section by section."""
    d, c, shown = r["dims"], r["config"], r["shown"]
    L, pos, T = shown["layer"], shown["position"], d["T"]
    labels = r["tokens"]["text"][:-1]
    out = [f'gpt-explain: one training step on "{r["prompt"]}"',
           f"model: n_layer={c['n_layer']} n_head={c['n_head']} n_embd={c['n_embd']} "
           f"block_size={c['block_size']} vocab_size={c['vocab_size']}, "
           f"{c['n_params']:,} parameters; {r['tokenizer']['kind']} tokenizer; seed {r['seed']}"]
    if "source" in r:
        out.insert(1, f"source: {r['source']}")
    out += [f"note: {n}" for n in r["notes"]]
    out += ["", "== 1. tokens " + "=" * 60,
            f"ids {r['tokens']['ids']}  ({len(r['tokens']['ids'])} tokens)",
            "inputs x = tokens[:-1], targets y = tokens[1:]: every position predicts the next",
            "   t  input              -> target"]
    out += [f"  {p['position']:>2}  {p['input_id']:>6} {_tok(p['input'], 11)} -> "
            f"{p['target_id']:>6} {_tok(p['target'])}" for p in r["pairs"]]
    out += ["", "== 2. forward " + "=" * 59,
            "B=1 T={T} C={C} nh={nh} hs={hs} V={V}; values at position t={p} ({tok}), head "
            "{h}; ‖∂L/∂·‖ is the stage's gradient after backward".format(
                **d, p=pos, tok=_tok(labels[pos]), h=shown["heads"][0])]
    summary_done = False
    for st in r["stages"]:
        if st["key"] == "ln_f" and not summary_done:
            out += _block_summaries(r, skip=L)
            summary_done = True
        if st["key"] == f"h{L}.ln_1":
            out += _block_summaries(r, upto=L)
            out.append(f"-- block {L} (in full) --")
        vals = " ".join(_f(v) for v in st["values"][:T if "T" in st["axes"][-1:] else 4])
        out.append(f"{st['name']:<19} {st['formula']}")
        out.append(f"    {_shape(st['shape'], st['axes']):<24} {st['at']:<14} {vals}"
                   f"   ‖∂L/∂·‖ {_g(st['grad_norm'])}")
    out += _attention_text(r, labels)
    nt = r["next_token"]
    out += ["", f"== 4. next token after {_tok(nt['input'])} (t={nt['position']}): top "
                f"{len(nt['top'])} of {d['V']} " + "=" * 20]
    out += [f"  {k + 1}. {_tok(e['token'], 14)} id {e['id']:>6}  p = {e['prob']:.5f}"
            + ("   <- target" if e["id"] == nt["target_id"] else "")
            for k, e in enumerate(nt["top"])]
    lo = r["loss"]
    out += ["", "== 5. loss: cross-entropy, one term -log p(target) per position " + "=" * 8,
            "   t  target          p(target)   -log p"]
    out += [f"  {t['position']:>2}  {_tok(t['target'], 14)} {t['prob']:10.6f} {t['loss']:9.4f}"
            for t in lo["terms"]]
    out.append(f"  loss = mean of the {T} terms = {lo['value']:.6f}  (mean recomputed "
               f"{lo['mean_of_terms']:.6f}; model(idx, targets) gives {lo['model_forward']:.6f})")
    out += _gradients_text(r) + _adamw_text(r)
    return "\n".join(out) + "\n"


def _block_summaries(r, upto=None, skip=None):
    rows = [b for b in r["blocks"] if (upto is None or b["block"] < upto) and b["block"] != skip
            and not b["full"]]
    return [f"-- block {b['block']} (summary): rms in {b['rms_in']:.4f}, + attention "
            f"{b['rms_attn']:.4f}, + MLP {b['rms_mlp']:.4f}, rms out {b['rms_out']:.4f}; "
            f"‖∂L/∂out‖ {_g(b['grad_norm_out'])}" for b in rows]


def _attention_text(r, labels):
    a, T = r["attention"], r["dims"]["T"]
    out = ["", f"== 3. attention of block {a['layer']} " + "=" * 44,
           "causal mask (0 = may attend, -inf = the future):"]
    _matrix(out, [[0.0 if m else None for m in row] for row in r["causal_mask"]], labels,
            lambda v: "0" if v is not None else "-inf")
    for h in a["heads"]:
        w = np.asarray(h["weights"])
        sums = w.sum(axis=1)
        upper = w[np.triu_indices(T, k=1)]
        out.append(f"head {h['head']}: softmax(q·kᵀ/√hs + mask); rows = query t, columns = key s,"
                   f" · = masked")
        _matrix(out, h["weights"], labels, lambda v: f"{v:.4f}", r["causal_mask"])
        out.append(f"    rows sum to 1 (max |sum - 1| = {np.abs(sums - 1).max():.1e}); "
                   f"{upper.size} entries above the diagonal, "
                   + ("all exactly 0" if not upper.any() else "NOT ALL ZERO"))
    return out


def _gradients_text(r):
    out = ["", "== 6. backward: ‖∂L/∂w‖ for every parameter (c_attn.weight as W_Q, W_K, W_V) ==="]
    if r["no_gradient"]:
        out.append(f"!!! {len(r['no_gradient'])} parameter(s) got NO GRADIENT: the loss never "
                   "reached them (cut from the graph?)")
        out += [f"!!!   {e['name']}: {e['status']}" for e in r["no_gradient"]]
    width = max(len(g["name"]) for g in r["gradients"])
    out.append(f"  {'parameter':<{width}} {'shape':>10} {'‖w‖':>10} {'‖∂L/∂w‖':>10}")
    for g in r["gradients"]:
        flag = "" if g["status"] == OK else f"   <-- !!! {g['status'].upper()}"
        out.append(f"  {g['name']:<{width}} {'x'.join(map(str, g['shape'])):>10} "
                   f"{g['weight_norm']:>10.4g} {_g(g['grad_norm']):>10}{flag}")
    return out


def _adamw_text(r):
    a = r["adamw"]
    out = ["", f"== 7. AdamW step: lr {a['lr']:g}, betas {tuple(a['betas'])}, eps {a['eps']:g}, "
               f"weight decay {a['weight_decay']:g} on matrices ==="]
    width = max(len(p["name"]) for p in a["params"])
    out.append(f"  {'parameter':<{width}} {'‖Δw‖':>10} {'‖Δw‖/‖w‖':>10}")
    for p in a["params"]:
        extra = "   (skipped: no gradient)" if p["skipped"] else ""
        out.append(f"  {p['name']:<{width}} {p['update_norm']:>10.3g} {_g(p['ratio']):>10}"
                   + extra)
    return out + [""] + _element_text(a["element"])


def _element_text(e):
    """The AdamW update of one W_Q element, every number of the formula on its own line."""
    out = [f"== 8. one weight by hand: W_Q[{e['row']}, {e['col']}] of block {e['layer']} "
           + "=" * 20,
           f"  = c_attn.weight[{e['row']}, {e['col']}]: query feature {e['row']} (head "
           f"{e['head']}, dim {e['head_dim']}) from input feature {e['col']}"]
    if e.get("skipped"):
        return out + [f"  w = {e['weight']:.10f} got no gradient: AdamW skips it "
                      f"(new value {e['new_weight']:.10f})"]
    out += [
        f"  w                         = {e['weight']:+.10f}",
        f"  g = ∂L/∂w                 = {e['grad']:+.6e}",
        f"  lr = {e['lr']:g}, β1 = {e['beta1']:g}, β2 = {e['beta2']:g}, ε = {e['eps']:g}, "
        f"weight decay λ = {e['weight_decay']:g}, step t = {e['step']}",
        f"  m = β1·m + (1-β1)·g       = {e['m']:+.6e}   (m starts at 0)",
        f"  v = β2·v + (1-β2)·g²      = {e['v']:.6e}   (v starts at 0)",
        f"  m̂ = m / (1-β1^t)          = {e['m_hat']:+.6e}   (1-β1^t = {e['bias_correction1']:.6g})",
        f"  v̂ = v / (1-β2^t)          = {e['v_hat']:.6e}   (1-β2^t = {e['bias_correction2']:.6g})",
        f"  w·(1 - lr·λ)              = {e['decayed']:+.10f}   (decoupled weight decay)",
        f"  lr · m̂ / (√v̂ + ε)         = {e['update']:+.10f}",
        f"  new w = w·(1-lr·λ) - lr·m̂/(√v̂+ε) = {e['formula_new']:+.10f}   "
        f"(the optimizer wrote {e['new_weight']:+.10f})",
        f"  plain SGD, w - lr·g, would give {e['sgd_new']:+.10f}: Adam's first step moves every",
        "  weight by about lr whatever the size of its gradient (m̂/√v̂ = sign(g) at t = 1)",
    ]
    return out


# ----------------------------------------------------------------------------- html
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1150px;color:#1f2933;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
.meta,.note{color:#52606d}.note{font-style:italic}
table{border-collapse:collapse;font-size:12.5px}td,th{padding:2px 8px;text-align:right;
border-bottom:1px solid #eef1f4}th{background:#f5f7fa}td.l,th.l{text-align:left}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.chip{display:inline-block;border:1px solid #9fb3c8;border-radius:4px;padding:2px 6px;margin:2px;
background:#f0f4f8}.chip small{display:block;color:#627d98;font-size:10px;text-align:center}
.heads{display:flex;flex-wrap:wrap;gap:18px}.heads figure{margin:0}
figcaption{font-size:12px;color:#52606d;text-align:center}
.thumbs{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-end}
.bar{height:12px;background:#3e7cb1;display:inline-block;vertical-align:middle}
.alarm{background:#ffe3e3;border:2px solid #d64545;color:#8a1c1c;padding:8px 12px;
font-weight:bold;margin:8px 0}tr.bad td{background:#ffe3e3;color:#8a1c1c;font-weight:bold}
.calc td{text-align:left}.calc td:first-child{color:#52606d}
.layout{display:flex;gap:24px;align-items:flex-start}
"""
_GROUPS = {"emb": "#fde68a", "norm": "#fecaca", "attn": "#bfdbfe", "mlp": "#bbf7d0",
           "res": "#e9d5ff", "head": "#fed7aa", "block": "#e5e7eb"}


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def _heat(w: float) -> str:
    lo, hi = (247, 251, 255), (8, 48, 107)  # white to dark blue
    return "#%02x%02x%02x" % tuple(round(a + w * (b - a)) for a, b in zip(lo, hi))


def _heatmap(weights, allowed, labels, title, cell=None, uid="h") -> str:
    """One attention matrix as an SVG grid: rows = queries, columns = keys; masked cells
    hatched grey (their weight is exactly 0)."""
    T = len(weights)
    small = cell is not None and cell < 12
    cell = cell or max(16, min(46, 460 // max(T, 1)))
    pad = 0 if small else 96
    size = pad + T * cell
    out = [(f'<svg class="heatmap" width="{size}" height="{size}" '
            f'viewBox="0 0 {size} {size}" role="img" aria-label="{_e(title)}">'),
           (f'<defs><pattern id="hatch-{uid}" width="6" height="6" '
            'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#e4e7eb"/><line x1="0" y1="0" x2="0" y2="6" '
            'stroke="#9aa5b1" stroke-width="2"/></pattern></defs>')]
    for i in range(T):
        if not small:
            y = pad + i * cell + cell / 2 + 4
            out.append(f'<text x="{pad - 4}" y="{y:.1f}" text-anchor="end" font-size="11">'
                       f'{_e(_tok(labels[i], 12))}</text>')
            x = pad + i * cell + cell / 2 + 4
            out.append(f'<text transform="translate({x:.1f},{pad - 4}) rotate(-55)" '
                       f'font-size="11">{_e(_tok(labels[i], 12))}</text>')
        for j in range(T):
            x, y, w = pad + j * cell, pad + i * cell, weights[i][j]
            if allowed[i][j]:
                tip = f"query t={i} {labels[i]!r} -> key s={j} {labels[j]!r}: {w:.4f}"
                out.append(f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                           f'fill="{_heat(w)}" stroke="#fff"><title>{_e(tip)}</title></rect>')
                if cell >= 34:
                    color = "#fff" if w > 0.5 else "#1f2933"
                    out.append(f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" font-size="10" '
                               f'text-anchor="middle" fill="{color}">{w:.2f}</text>')
            else:
                tip = f"query t={i} -> key s={j}: masked (the future), weight {w:g}"
                out.append(f'<rect class="cell masked" x="{x}" y="{y}" width="{cell}" '
                           f'height="{cell}" fill="url(#hatch-{uid})" stroke="#fff">'
                           f'<title>{_e(tip)}</title></rect>')
    out.append("</svg>")
    return "".join(out)


def _group(key: str) -> str:
    k = key.split(".")[-1]
    if k in ("tok_emb", "pos_emb", "x"):
        return "emb"
    if k.startswith("ln"):
        return "norm"
    if k.startswith("resid"):
        return "res"
    if k in ("fc", "gelu", "mlp_proj"):
        return "mlp"
    return "head" if k in ("logits", "probs") else "attn"


def _diagram(r) -> str:
    """The stages top to bottom as an SVG flow chart; the residual adds get skip arrows."""
    L = r["shown"]["layer"]
    boxes = []  # (key, title, subtitle, group)
    for st in r["stages"]:
        if st["key"] == f"h{L}.ln_1":
            boxes += [(f"b{b['block']}", f"block {b['block']}", "attention + MLP, summarised",
                       "block") for b in r["blocks"] if b["block"] < L]
        if st["key"] == "ln_f":
            boxes += [(f"b{b['block']}", f"block {b['block']}", "attention + MLP, summarised",
                       "block") for b in r["blocks"] if b["block"] > L]
        boxes.append((st["key"], st["name"], "(" + ", ".join(
            f"{a}={n}" if a not in "1" else "1" for a, n in zip(st["axes"], st["shape"])) + ")",
            _group(st["key"])))
    boxes.append(("loss", "loss", f"cross-entropy = {r['loss']['value']:.4f}", "head"))
    bw, bh, gap, x0 = 300, 36, 14, 70
    height = len(boxes) * (bh + gap) + 10
    y_of = {key: 8 + k * (bh + gap) for k, (key, *_) in enumerate(boxes)}
    out = [(f'<svg class="diagram" width="{x0 + bw + 330}" height="{height}" role="img" '
            'aria-label="stages of the forward pass">'),
           ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#52606d"/></marker>'
            '</defs>')]
    formulas = {st["key"]: st["formula"] for st in r["stages"]}
    for k, (key, title, sub, grp) in enumerate(boxes):
        y = y_of[key]
        if k:
            out.append(f'<line x1="{x0 + bw / 2}" y1="{y - gap}" x2="{x0 + bw / 2}" y2="{y}" '
                       'stroke="#52606d" marker-end="url(#arrow)"/>')
        out.append(f'<rect x="{x0}" y="{y}" width="{bw}" height="{bh}" rx="6" '
                   f'fill="{_GROUPS[grp]}" stroke="#7b8794"><title>{_e(formulas.get(key, sub))}'
                   f'</title></rect>')
        out.append(f'<text x="{x0 + 10}" y="{y + 15}" font-size="12" font-weight="bold">'
                   f'{_e(title)}</text><text x="{x0 + 10}" y="{y + 29}" font-size="11" '
                   f'fill="#334e68">{_e(sub)}</text>')
        if key in formulas:
            out.append(f'<text x="{x0 + bw + 12}" y="{y + 22}" font-size="11" fill="#52606d">'
                       f'{_e(formulas[key])}</text>')
    # skip connections: block input -> residual 1, residual 1 -> residual 2
    before_ln1 = boxes[[b[0] for b in boxes].index(f"h{L}.ln_1") - 1][0]
    for src, dst in ((before_ln1, f"h{L}.resid_1"), (f"h{L}.resid_1", f"h{L}.resid_2")):
        y1, y2 = y_of[src] + bh / 2, y_of[dst] + bh / 2
        out.append(f'<path d="M{x0},{y1} C{x0 - 60},{y1} {x0 - 60},{y2} {x0},{y2}" fill="none" '
                   'stroke="#7c3aed" stroke-width="1.5" marker-end="url(#arrow)"/>')
    out.append("</svg>")
    return "".join(out)


def render_html(r: dict) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG, nothing fetched)."""
    d, c, shown = r["dims"], r["config"], r["shown"]
    labels = r["tokens"]["text"][:-1]
    T = d["T"]
    p = ['<!doctype html><html lang="en"><head><meta charset="utf-8">',
         f"<title>gpt-explain: {_e(r['prompt'])}</title><style>{_CSS}</style></head><body>",
         f"<h1>One training step on &ldquo;{_e(r['prompt'])}&rdquo;</h1>",
         (f'<p class="meta">{_e(r.get("source", "GPT"))}: n_layer={c["n_layer"]}, '
          f'n_head={c["n_head"]}, n_embd={c["n_embd"]}, vocab_size={c["vocab_size"]} '
          f'({c["n_params"]:,} parameters), {_e(r["tokenizer"]["kind"])} tokenizer, seed '
          f'{r["seed"]}. B=1, T={T}, C={d["C"]}, nh={d["nh"]}, hs={d["hs"]}, V={d["V"]}.</p>')]
    p += [f'<p class="note">{_e(n)}</p>' for n in r["notes"]]
    if r["no_gradient"]:
        p.append(f'<div class="alarm">{len(r["no_gradient"])} parameter(s) received NO '
                 "GRADIENT: " + ", ".join(_e(f"{e['name']} ({e['status']})")
                                          for e in r["no_gradient"]) + "</div>")
    p.append("<h2>1. Tokens: inputs and targets</h2><div>")
    p += [f'<span class="chip">{_e(_tok(s))}<small>{i}</small></span>'
          for i, s in zip(r["tokens"]["ids"], r["tokens"]["text"])]
    p.append('</div><table><tr><th>t</th><th class="l">input x<sub>t</sub></th>'
             '<th class="l">target y<sub>t</sub> = x<sub>t+1</sub></th></tr>')
    p += [f'<tr><td>{q["position"]}</td><td class="l mono">{q["input_id"]} {_e(_tok(q["input"]))}'
          f'</td><td class="l mono">{q["target_id"]} {_e(_tok(q["target"]))}</td></tr>'
          for q in r["pairs"]]
    p.append("</table>")
    p.append(f"<h2>2. The forward pass, block {shown['layer']} in full</h2>"
             f'<div class="layout"><div>{_diagram(r)}</div></div>')
    p.append(f'<table><tr><th class="l">stage</th><th class="l">formula</th><th>shape</th>'
             f'<th class="l">values at t={shown["position"]}, head {shown["heads"][0]}</th>'
             "<th>‖∂L/∂·‖</th></tr>")
    for st in r["stages"]:
        vals = " ".join(_f(v) for v in st["values"])
        p.append(f'<tr><td class="l">{_e(st["name"])}</td><td class="l">{_e(st["formula"])}</td>'
                 f'<td class="mono">{_e(_shape(st["shape"], st["axes"]))}</td><td class="l mono">'
                 f'{_e(st["at"])} {_e(vals)}</td><td>{_g(st["grad_norm"])}</td></tr>')
    p.append('</table><table><tr><th>block</th><th>rms in</th><th>+ attention</th>'
             '<th>+ MLP</th><th>rms out</th><th>‖∂L/∂out‖</th></tr>')
    p += [f'<tr><td>{b["block"]}{" (full)" if b["full"] else ""}</td><td>{b["rms_in"]:.4f}</td>'
          f'<td>{b["rms_attn"]:.4f}</td><td>{b["rms_mlp"]:.4f}</td><td>{b["rms_out"]:.4f}</td>'
          f'<td>{_g(b["grad_norm_out"])}</td></tr>' for b in r["blocks"]]
    p.append("</table>")
    a = r["attention"]
    p.append(f"<h2>3. Attention weights of block {a['layer']}</h2><p>Rows are queries t, columns "
             "keys s; hatched cells are the future (masked to -inf before the softmax, so their "
             "weight is exactly 0); every row sums to 1.</p><div class=\"heads\">")
    for h in a["heads"]:
        n = h["head"]
        svg = _heatmap(h["weights"], r["causal_mask"], labels, f"head {n}", uid=f"h{n}")
        p.append(f"<figure>{svg}<figcaption>head {n}</figcaption></figure>")
    p.append("</div><h3>Every block and head</h3><div class=\"thumbs\">")
    small = max(3, min(10, 80 // T))
    for li, layer_att in enumerate(r["attention_all"]):
        for hi, w in enumerate(layer_att):
            svg = _heatmap(w, r["causal_mask"], labels, f"block {li} head {hi}", cell=small,
                           uid=f"a{li}_{hi}")
            p.append(f"<figure>{svg}<figcaption>b{li} h{hi}</figcaption></figure>")
    p.append("</div>")
    nt = r["next_token"]
    p.append(f"<h2>4. Next token after {_e(_tok(nt['input']))} (t={nt['position']})</h2><table>"
             '<tr><th class="l">token</th><th>id</th><th>p</th><th class="l"></th></tr>')
    top = max(e["prob"] for e in nt["top"])
    p += [f'<tr><td class="l mono">{_e(_tok(e["token"]))}</td><td>{e["id"]}</td>'
          f'<td>{e["prob"]:.5f}</td><td class="l"><span class="bar" style="width:'
          f'{200 * e["prob"] / top:.0f}px"></span>{" target" if e["id"] == nt["target_id"] else ""}'
          "</td></tr>" for e in nt["top"]]
    lo = r["loss"]
    p.append(f"</table><h2>5. Loss = mean of -log p(target) = {lo['value']:.6f}</h2><table>"
             '<tr><th>t</th><th class="l">target</th><th>p(target)</th><th>-log p</th></tr>')
    p += [f'<tr><td>{t["position"]}</td><td class="l mono">{_e(_tok(t["target"]))}</td>'
          f'<td>{t["prob"]:.6f}</td><td>{t["loss"]:.4f}</td></tr>' for t in lo["terms"]]
    p.append(f"</table><p>model(idx, targets) gives {lo['model_forward']:.6f}.</p>")
    p.append("<h2>6. Backward: ‖∂L/∂w‖ per parameter</h2><table><tr><th class=\"l\">parameter"
             "</th><th>shape</th><th>‖w‖</th><th>‖∂L/∂w‖</th><th class=\"l\">status</th></tr>")
    p += [f'<tr class="{"bad" if g["status"] != OK else ""}"><td class="l mono">{_e(g["name"])}'
          f'</td><td>{"×".join(map(str, g["shape"]))}</td><td>{g["weight_norm"]:.4g}</td>'
          f'<td>{_g(g["grad_norm"])}</td><td class="l">{_e(g["status"])}</td></tr>'
          for g in r["gradients"]]
    ad = r["adamw"]
    p.append(f"</table><h2>7. AdamW step (lr {ad['lr']:g}, betas {tuple(ad['betas'])}, "
             f"weight decay {ad['weight_decay']:g})</h2><table><tr><th class=\"l\">parameter"
             "</th><th>‖Δw‖</th><th>‖Δw‖/‖w‖</th></tr>")
    p += [f'<tr class="{"bad" if q["skipped"] else ""}"><td class="l mono">{_e(q["name"])}</td>'
          f'<td>{q["update_norm"]:.3g}</td><td>{_g(q["ratio"])}</td></tr>' for q in ad["params"]]
    p.append("</table>")
    calc = "\n".join(_element_text(ad["element"])[1:])  # the h2 above is the title
    p.append(f"<h2>8. One weight of W_Q by hand</h2><pre class=\"mono\">{_e(calc)}</pre>")
    p.append("</body></html>\n")
    return "\n".join(p)


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
