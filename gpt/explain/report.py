"""gpt-explain: one training step of a GPT on one prompt, shown stage by stage, with evidence.

``explain(model, tokenizer, prompt)`` runs the step and returns a JSON-able report:

1. the prompt's token ids and the (input, target) pairs: inputs tokens[:-1], targets tokens[1:];
2. the forward pass: the model's own forward, run as written and recorded with forward hooks
   and an op observer (gpt.explain.record), its stages named (gpt.explain.stages): embeddings,
   then for the chosen block every stage (ln_1, c_attn, q/k/v, heads, q·kᵀ/√hs, causal mask,
   softmax, ·v, merged heads, W_O, residual, ln_2, MLP, residual), the other blocks as one
   summary line each, then ln_f, the tied logits H·Eᵀ and the softmax; an edit to the model's
   code shows here as what ran. The loss is the model's; each stage keeps the statement that
   computed it (``where``), a few values at the position and a 2-D slice of its tensor
   (``tensor``: batch 0, the first head shown, at most 16 × 16) to draw;
3. the attention matrix of every head, the top-k next tokens, the loss and its per-position terms;
4. inside the prediction (gpt.explain.lens): the logit lens after every block and the Δloss of
   zeroing each head;
5. the backward pass: every parameter's gradient norm (c_attn's weight as its W_Q, W_K, W_V
   row blocks; ``head_gradients``: the shown head's own rows of W_Q, W_K, W_V and columns of
   W_O), loudly flagging parameters the loss never reached; beside it the evidence
   (gpt.explain.checks): float64 central differences for a few elements, and the tied
   embedding's gradient split into its logits and lookup parts;
6. one AdamW step (``model.configure_optimizers``, or the optimizer passed in, whose moments
   then carry over from earlier steps): per parameter ‖Δw‖ and ‖Δw‖/‖w‖, for one element of
   W_Q every number of the update, the followed weights (value, gradient, moments, update),
   and the first-order prediction Σ g·Δw of the loss change next to the re-measured loss;
7. ``after``: the prompt through the updated weights (gpt.explain.lens.after_step): the loss,
   the shown head's attention and the next-token probabilities at the position.

Dropout is switched off (eval mode) during the step, so every printed number is reproducible
and attention rows sum to exactly 1. The model's weights are updated in place, as training
would. The prompt is cut to ``max_tokens`` tokens and to the model's block size (with a
note), and the every-block attention maps are kept within ``MAX_MAP_CELLS``, so the report of
a long prompt stays small. ``render_text`` and ``render_html`` (gpt.explain.render.text,
gpt.explain.render.html) turn the report into a terminal listing or one self-contained HTML page
(which opens with gpt.explain.render.story's stage diagram, also shown by the served page);
the command line (``--steps``, ``--serve`` and the rest) is in gpt.explain.cli.
"""

from __future__ import annotations

import math

import numpy as np

import tensorgrad as tg
from tensorgrad import device_of, to_device

from ..diagnostics import OK, grad_status
from ..model import GPT
from ..optim import clip_grad_norm_
from ..tokenizer import BPETokenizer, CharTokenizer, gpt2_split_pattern
from .arrays import host, norm, num, rms, tensor_slice
from .checks import (
    embedding_split,
    finite_differences,
    float64_copy,
    loss64,
    loss_change,
)
from .lens import after_step, head_ablation, logit_lens
from .record import record
from .stages import probabilities, stages

DEFAULT_PROMPT = "The capital of France is Paris"
N_VALUES = 4  # how many features of a vector the report shows
MAX_TOKENS = 64  # default cut of the prompt: a char-level 5,000-character prompt stays small
TOKEN_LIMIT = 256  # the largest --max-tokens accepted: the HTML page grows as T²
MAX_MAP_CELLS = 1 << 15  # attention cells kept for the every-block, every-head maps
MAX_PROMPT_BYTES = 2048  # of a prompt's beginning that is tokenized (257 English words fit)
MAX_PIECE_BYTES = 256  # a longer word ends the prompt: BPE's cost grows as a word's length²


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
    return "[" + ", ".join(w for _, w in picks) + "]", [num(v) for v in vals]


def cut_prompt(prompt: str, kind: str = "bpe") -> str:
    """The beginning of the prompt that holds its first TOKEN_LIMIT tokens, so that learning a
    BPE from it and encoding it take bounded time (both grow as the square of a word's length).

    'char': TOKEN_LIMIT + 1 characters. Otherwise (a byte-level BPE, which never merges across
    GPT-2's pieces: words, numbers, runs of symbols or of spaces): the first TOKEN_LIMIT + 1
    pieces, whose first TOKEN_LIMIT tokenize as in the whole prompt, and at most
    MAX_PROMPT_BYTES bytes; a piece longer than MAX_PIECE_BYTES ends the text inside it.
    A prompt within these bounds comes back whole.
    """
    if kind == "char":
        return prompt[: TOKEN_LIMIT + 1]
    used = 0
    # chars <= bytes: the first MAX_PROMPT_BYTES + 1 characters reach past the byte bound
    for i, m in enumerate(gpt2_split_pattern().finditer(prompt, 0, MAX_PROMPT_BYTES + 1)):
        if i > TOKEN_LIMIT:
            return prompt[: m.start()]
        room = min(MAX_PIECE_BYTES, MAX_PROMPT_BYTES - used)
        size = len(m.group().encode("utf-8", "surrogatepass"))
        if size > room:
            n = 0  # the piece's whole characters that fit in room
            for ch in m.group():
                room -= len(ch.encode("utf-8", "surrogatepass"))
                if room < 0:
                    break
                n += 1
            return prompt[: m.start() + n]
        used += size
    return prompt


def prompt_ids(tokenizer, prompt: str, block_size: int, max_tokens: int = MAX_TOKENS):
    """(ids, notes): the prompt's token ids cut to max_tokens and to block_size + 1 (only the
    beginning ``cut_prompt`` keeps is tokenized)."""
    if not 2 <= max_tokens <= TOKEN_LIMIT:
        raise ValueError(f"max_tokens must be in 2..{TOKEN_LIMIT}, got {max_tokens}")
    text = cut_prompt(prompt, getattr(tokenizer, "kind", "bpe"))
    ids = [int(i) for i in tokenizer.encode(text)]
    pieces = len(gpt2_split_pattern().findall(text))
    long_word = pieces == 1 and len(text) >= 16  # (Chinese text: no spaces, one "word")
    if len(ids) < 2 and long_word and getattr(tokenizer, "kind", "") != "char":
        raise ValueError(
            f"the prompt {prompt[:40]!r} is {len(ids)} token: it begins with one word of "
            f"{len(text):,}+ characters with no space or punctuation (Chinese or Japanese text, "
            "say), which a BPE learned from the prompt makes one token; pass --tokenizer char "
            "(a token per character) or a prompt with shorter words"
        )
    if len(ids) < 2:
        raise ValueError(
            f"the prompt {prompt[:40]!r} is {len(ids)} token(s); a training step "
            "needs at least 2 (inputs are tokens[:-1], targets tokens[1:])"
        )
    limit = min(max_tokens, block_size + 1)
    notes = []
    read = f"; only its first {len(text):,} characters were tokenized" if text != prompt else ""
    if len(ids) > limit:
        why = "max_tokens" if limit == max_tokens else "block_size + 1"
        count = "" if read else f"{len(ids)} "
        notes.append(f"the prompt's {count}tokens were cut to the first {limit} ({why}){read}")
        ids = ids[:limit]
    elif read:
        notes.append(
            f"the prompt was cut inside a word over {MAX_PIECE_BYTES} bytes or at "
            f"{MAX_PROMPT_BYTES} bytes{read}"
        )
    return ids, notes


def _check_choices(cfg, ids, layer: int, heads, position, notes: list) -> tuple[list, int]:
    """(heads, position) checked against the model and the prompt; notes gets what the
    reader must know (dropout off, one position)."""
    if max(ids) >= cfg.vocab_size:
        raise ValueError(
            f"token id {max(ids)} is outside the model's vocabulary "
            f"({cfg.vocab_size}); the tokenizer does not fit the model"
        )
    T, nh = len(ids) - 1, cfg.n_head
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
        notes.append(
            f"dropout (p = {cfg.dropout}) is off for this step, so that the numbers "
            "repeat and attention rows sum to exactly 1"
        )
    if T == 1:
        notes.append(
            "with one position, softmax over a single key is constant: W_Q and W_K "
            "cannot get a gradient (use a longer prompt)"
        )
    return heads, position


# ----------------------------------------------------------------------------- explain
def explain(
    model: GPT,
    tokenizer,
    prompt: str,
    layer: int = 0,
    heads=None,
    position: int | None = None,
    lr: float = 1e-3,
    seed: int = 0,
    element: tuple[int, int] | None = None,
    weight_decay: float = 0.1,
    betas=(0.9, 0.95),
    eps: float = 1e-8,
    top_k: int = 5,
    max_tokens: int = MAX_TOKENS,
    checks: int = 2,
    lens: bool = True,
    optimizer=None,
    follow=None,
    grad_clip: float = 0.0,
) -> dict:
    """Run one training step of ``model`` on ``prompt`` and return what happened, as a dict.

    layer: the block shown in full (others are summarised); heads: the heads whose attention
    matrices are shown (default: up to the first four; the first is the one checked and
    followed); position: the token position whose vectors and next-token prediction are shown
    (default: the last; negative counts from the end); element: (row, col) of the W_Q element
    whose AdamW update is worked out (default: the one with the largest gradient). lr,
    weight_decay, betas, eps: the AdamW step, unless ``optimizer`` (an AdamW over the model,
    kept across calls) is given; grad_clip: the global gradient norm is clipped to it before
    the step, as gpt-train does (0: no clipping). checks: elements per matrix checked by
    finite differences (0: no float64 checks, no re-measured loss); lens: the logit lens and
    head ablation.
    follow: (label, parameter name, row, col) of matrix elements reported before and after the
    update (default: the largest-gradient element of W_Q, W_K, W_V in the first head). seed seeds tensorgrad's
    generators first. The model's weights are updated in place.
    """
    cfg = model.config
    ids, notes = prompt_ids(tokenizer, prompt, cfg.block_size, max_tokens)
    heads, position = _check_choices(cfg, ids, layer, heads, position, notes)
    T, C = len(ids) - 1, cfg.n_embd

    tg.manual_seed(seed)
    dev = device_of(model.transformer.wte.weight.array)
    idx = to_device(np.asarray([ids[:-1]], dtype=np.int64), dev)
    targets = to_device(np.asarray([ids[1:]], dtype=np.int64), dev)
    was_training = model.training
    model.eval()  # dropout off: reproducible numbers, rows of exactly 1
    try:
        with tg.no_grad():
            _, check = model(idx, targets)
        model.zero_grad()
        root, logits, loss = record(model, idx, targets)  # the model's forward, watched
        rec = stages(root, model, layer)
        probabilities(rec, logits)
        loss.backward()
        report = _forward_report(
            tokenizer,
            ids,
            rec,
            logits,
            loss,
            rec.atts,
            rec.blocks,
            layer,
            heads,
            position,
            top_k,
            float(host(check)),
            notes,
        )
        report["gradients"], report["no_gradient"] = _gradients(model, C)
        report["head_gradients"] = head_gradients(model, layer, heads[0])
        report["embedding_split"] = embedding_split(
            model, rec, ids, lambda i: tokenizer.decode([i])
        )
        if lens:
            report["lens"] = logit_lens(model, idx, targets, ids, lambda i: tokenizer.decode([i]))
            report["ablation"] = head_ablation(model, idx, targets, report["loss"]["value"])
        if optimizer is None:
            optimizer = model.configure_optimizers(weight_decay, lr, betas)
            for g in optimizer.param_groups:
                g["eps"] = eps
        evidence = (float64_copy(model), idx, targets, checks) if checks > 0 else None
        step = _adamw_step(model, optimizer, layer, heads[0], element, follow, evidence, grad_clip)
        report["adamw"], report["finite_differences"], report["loss_change"] = step
        report["followed"] = report["adamw"].pop("followed")
        before = dict(report["next_token"], target_prob=report["loss"]["terms"][position]["prob"])
        report["after"] = after_step(
            model, idx, targets, layer, heads[0], before, lambda i: tokenizer.decode([i])
        )
    finally:
        model.train(was_training)
    shown = {"layer": layer, "heads": heads, "position": position}
    report.update(prompt=prompt, notes=notes, seed=seed, **_setting(model, tokenizer, T, shown))
    return report


def _setting(model, tokenizer, T: int, shown: dict) -> dict:
    """The report's config, tokenizer, shown and dims entries."""
    cfg = model.config
    C, nh = cfg.n_embd, cfg.n_head
    return dict(
        config=dict(
            cfg.to_dict(), head_size=C // nh, n_params=model.num_params(non_embedding=False)
        ),
        tokenizer={
            "kind": getattr(tokenizer, "kind", type(tokenizer).__name__),
            "vocab_size": int(tokenizer.vocab_size),
        },
        shown=shown,
        dims={"B": 1, "T": T, "C": C, "nh": nh, "hs": C // nh, "V": cfg.vocab_size},
    )


def _forward_report(
    tok, ids, rec, logits, loss, atts, blocks, layer, heads, position, top_k, model_loss, notes
):
    def text(i):
        return tok.decode([i])

    T = len(ids) - 1
    for st in rec.stages:
        t = rec.tensors[st["key"]]
        st["at"], st["values"] = _sample(host(t), st["axes"], position, heads[0])
        st["rms"] = rms(host(t))
        st["tensor"] = tensor_slice(host(t), st["axes"], heads[0])
        st["grad_norm"] = norm(host(t.grad)) if t.grad is not None else None
    for b in blocks:
        t = b.pop("tensor")
        b["grad_norm_out"] = norm(host(t.grad)) if t.grad is not None else None
    lg = host(logits)[0].astype(np.float64)  # (T, V)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    logp = np.log(p)
    k = min(top_k, p.shape[-1])
    predictions = []
    for t in range(T):
        order = np.argsort(-p[t], kind="stable")[:k]
        top = [{"id": int(j), "token": text(int(j)), "prob": float(p[t, j])} for j in order]
        predictions.append(
            {
                "position": t,
                "input": text(ids[t]),
                "target_id": ids[t + 1],
                "target": text(ids[t + 1]),
                "top": top,
            }
        )
    terms = [
        {
            "position": t,
            "target_id": ids[t + 1],
            "target": text(ids[t + 1]),
            "prob": float(p[t, ids[t + 1]]),
            "loss": float(-logp[t, ids[t + 1]]),
        }
        for t in range(T)
    ]
    allowed = np.tril(np.ones((T, T), dtype=bool))
    shown = rec.tensors.get(f"h{layer}.scores", rec.tensors.get(f"h{layer}.masked"))
    sc = host(shown)[0] if shown is not None else np.full(atts[layer].shape, np.nan)
    attention = {
        "layer": layer,
        "heads": [
            {
                "head": h,
                "weights": atts[layer][h].astype(float).tolist(),
                "scores": [[num(sc[h, i, j]) for j in range(T)] for i in range(T)],
                "masked_scores": [
                    [num(sc[h, i, j]) if allowed[i, j] else None for j in range(T)]
                    for i in range(T)
                ],
            }
            for h in heads
        ],
    }
    # the every-head maps grow as n_layer·n_head·T²: keep whole blocks up to MAX_MAP_CELLS
    per_block = atts[0].shape[0] * T * T
    keep = max(1, min(len(atts), MAX_MAP_CELLS // max(per_block, 1)))
    if keep < len(atts):
        notes.append(
            f"the attention maps of every head are kept for blocks 0..{keep - 1} of "
            f"{len(atts)} (output bound: {MAX_MAP_CELLS} cells)"
        )
    return {
        "tokens": {"ids": ids, "text": [text(i) for i in ids]},
        "pairs": [
            {
                "position": t,
                "input_id": ids[t],
                "input": text(ids[t]),
                "target_id": ids[t + 1],
                "target": text(ids[t + 1]),
            }
            for t in range(T)
        ],
        "stages": rec.stages,
        "blocks": blocks,
        "causal_mask": allowed.tolist(),
        "attention": attention,
        "attention_all": [
            [a.astype(float).tolist() for a in layer_att] for layer_att in atts[:keep]
        ],
        "predictions": predictions,
        "next_token": predictions[position],
        "loss": {
            "value": float(host(loss)),
            "terms": terms,
            "mean_of_terms": float(np.mean([t["loss"] for t in terms])),
            "model_forward": model_loss,
            "where": rec.loss_where,
        },
    }


def _qkv_rows(name: str, shape, C: int):
    """c_attn's (3C, C) weight as its W_Q, W_K, W_V row blocks; any other parameter whole."""
    if name.endswith("attn.c_attn.weight") and shape[0] == 3 * C:
        return [
            (f"{name}[W_Q]", slice(0, C)),
            (f"{name}[W_K]", slice(C, 2 * C)),
            (f"{name}[W_V]", slice(2 * C, 3 * C)),
        ]
    return [(name, slice(None))]


def _gradients(model, C):
    rows = []
    for name, p in model.named_parameters():
        w, g = host(p), None if p.grad is None else host(p.grad)
        for label, rs in _qkv_rows(name, p.shape, C):
            n = None if g is None else norm(g[rs])
            status = grad_status(n)
            rows.append(
                {
                    "name": label,
                    "param": name,
                    "shape": list(w[rs].shape),
                    "weight_norm": norm(w[rs]),
                    "grad_norm": n,
                    "status": status,
                }
            )
    return rows, [{"name": r["name"], "status": r["status"]} for r in rows if r["status"] != OK]


def head_gradients(model, layer: int, head: int) -> list[dict]:
    """‖∂L/∂W‖ and ‖W‖ of one head's part of W_Q, W_K, W_V (its hs rows of c_attn's weight)
    and of W_O (its hs columns of c_proj's weight), in block ``layer``."""
    attn = model.transformer.h[layer].attn
    C = model.config.n_embd
    hs = C // model.config.n_head
    own = slice(head * hs, (head + 1) * hs)
    parts = [(lb, attn.c_attn.weight, k * C) for k, lb in enumerate(("W_Q", "W_K", "W_V"))]
    out = []
    for label, w, r0 in parts + [("W_O", attn.c_proj.weight, None)]:
        pick = (slice(None), own) if r0 is None else (slice(r0 + own.start, r0 + own.stop),)
        g = None if w.grad is None else host(w.grad)[pick]
        out.append(
            {
                "label": label,
                "head": head,
                "shape": list(host(w)[pick].shape),
                "weight_norm": norm(host(w)[pick]),
                "grad_norm": None if g is None else norm(g),
            }
        )
    return out


def default_follow(model, layer: int, head: int) -> list[tuple[str, str, int, int]]:
    """(label, parameter, row, col): the largest-gradient element of W_Q, W_K and W_V in head
    ``head`` of block ``layer`` (row 0, col 0 of the head when there is no gradient yet)."""
    C = model.config.n_embd
    hs = C // model.config.n_head
    w = model.transformer.h[layer].attn.c_attn.weight
    name = f"transformer.h.{layer}.attn.c_attn.weight"
    out = []
    for k, label in enumerate(("W_Q", "W_K", "W_V")):
        r0 = k * C + head * hs
        g = None if w.grad is None else np.abs(host(w.grad)[r0 : r0 + hs])
        i, j = (0, 0) if g is None else np.unravel_index(int(np.argmax(g)), g.shape)
        out.append((label, name, r0 + int(i), int(j)))
    return out


def _moments(opt, p, i, j):
    st = opt.state.get(p)
    if st is None:
        return 0.0, 0.0, 0
    return (float(host(st["exp_avg"])[i, j]), float(host(st["exp_avg_sq"])[i, j]), int(st["step"]))


def _pick_element(model, layer: int, element):
    """(row, col) of the W_Q element worked by hand, and W_Q's gradient (None without one)."""
    C = model.config.n_embd
    wq = model.transformer.h[layer].attn.c_attn.weight
    gq = None if wq.grad is None else host(wq.grad)[:C].astype(np.float64)
    if element is None:
        element = (0, 0) if gq is None else np.unravel_index(int(np.argmax(np.abs(gq))), gq.shape)
    i, j = (int(e) for e in element)
    if not (0 <= i < C and 0 <= j < C):
        raise ValueError(f"element ({i}, {j}) is outside W_Q's ({C}, {C})")
    return i, j, gq


def _check_follow(params: dict, follow) -> None:
    for label, name, r, c in follow:
        p = params.get(name)
        if p is None or p.ndim != 2 or not (0 <= r < p.shape[0] and 0 <= c < p.shape[1]):
            raise ValueError(
                f"followed weight {label} = {name}[{r}, {c}] is not a matrix element of the model"
            )


def _adamw_step(model, opt, layer, head, element, follow, evidence, grad_clip=0.0):
    """The AdamW step with its bookkeeping: (adamw section, finite differences, loss change).

    evidence: (float64 copy, idx, targets, elements per matrix), or None for no checks.
    grad_clip: the gradients are clipped (gpt-train's clip_grad_norm_) after the evidence,
    which is of the loss's own gradient, and before the step; the element and the followed
    weights show the gradient AdamW used."""
    C, hs = model.config.n_embd, model.config.n_embd // model.config.n_head
    named = list(model.named_parameters())
    params = dict(named)
    before = {n: np.array(host(p), copy=True).astype(np.float64) for n, p in named}
    grads = {n: None if p.grad is None else host(p.grad) for n, p in named}
    wq = model.transformer.h[layer].attn.c_attn.weight
    wq_name = f"transformer.h.{layer}.attn.c_attn.weight"
    i, j, gq = _pick_element(model, layer, element)
    follow = default_follow(model, layer, head) if follow is None else list(follow)
    _check_follow(params, follow)
    prev = {(n, r, c): _moments(opt, params[n], r, c) for _, n, r, c in follow}
    m_prev, v_prev, _ = _moments(opt, wq, i, j)
    fd, change = [], None
    if evidence is not None:  # before the update: the differences are of the loss just taken
        model64, idx, targets, n_checks = evidence
        fd = finite_differences(
            model, model64, idx, targets, layer, head, n_checks, extra=[("W_Q", wq_name, i, j)]
        )
        loss_before = loss64(model64, idx, targets)
    # as gpt-train's loop: the norm of all gradients, clipped to grad_clip (0: not clipped)
    grad_norm = float(clip_grad_norm_(list(model.parameters()), grad_clip))
    scale = 1.0
    if grad_clip > 0 and math.isfinite(grad_norm) and grad_clip / (grad_norm + 1e-6) < 1.0:
        scale = grad_clip / (grad_norm + 1e-6)
        gq = host(wq.grad)[:C].astype(np.float64)  # what AdamW sees
    used = {n: None if p.grad is None else host(p.grad) for n, p in named}
    opt.step()
    if evidence is not None:
        change = loss_change(named, grads, before, model64, idx, targets, loss_before)
    rows = []
    for n, p in named:
        w1 = host(p)
        for label, rs in _qkv_rows(n, p.shape, C):
            dn, wn = norm(w1[rs] - before[n][rs]), norm(before[n][rs])
            rows.append(
                {
                    "name": label,
                    "update_norm": dn,
                    "weight_norm": wn,
                    "ratio": dn / wn if wn > 0 else None,
                    "skipped": grads[n] is None,
                }
            )
    followed = []
    for label, n, r, c in follow:
        m, v, t = _moments(opt, params[n], r, c)
        g, new = used[n], float(host(params[n])[r, c])
        followed.append(
            {
                "label": label,
                "param": n,
                "index": [r, c],
                "step": t,
                "value": float(before[n][r, c]),
                "grad": None if g is None else float(g[r, c]),
                "tape_grad": None if grads[n] is None else float(grads[n][r, c]),
                "m_prev": prev[(n, r, c)][0],
                "v_prev": prev[(n, r, c)][1],
                "m": m,
                "v": v,
                "new_value": new,
                "update": new - float(before[n][r, c]),
            }
        )
    group = next(g for g in opt.param_groups if any(q is wq for q in g["params"]))
    el = _element(group, wq_name, layer, hs, i, j, before, wq, gq, opt, m_prev, v_prev)
    if el.get("grad") is not None:
        g0 = grads[wq_name]
        el.update(tape_grad=float(g0[i, j]), clip_scale=scale)
    b1, b2 = group["betas"]
    return (
        {
            "lr": group["lr"],
            "weight_decay": group["weight_decay"],
            "betas": [b1, b2],
            "eps": group["eps"],
            "grad_norm": grad_norm,
            "grad_clip": grad_clip,
            "clip_scale": scale,
            "params": rows,
            "element": el,
            "followed": followed,
        },
        fd,
        change,
    )


def _element(group, wq_name, layer, hs, i, j, before, wq, gq, opt, m_prev, v_prev):
    b1, b2 = group["betas"]
    el = {
        "param": wq_name,
        "matrix": "W_Q",
        "layer": layer,
        "row": i,
        "col": j,
        "head": i // hs,
        "head_dim": i % hs,
        "lr": group["lr"],
        "weight_decay": group["weight_decay"],
        "beta1": b1,
        "beta2": b2,
        "eps": group["eps"],
        "weight": float(before[wq_name][i, j]),
        "new_weight": float(host(wq)[i, j]),
    }
    st = opt.state.get(wq)
    if gq is None or st is None:
        el.update(grad=None, skipped=True)
        return el
    t = st["step"]
    g = float(gq[i, j])
    m, v = float(host(st["exp_avg"])[i, j]), float(host(st["exp_avg_sq"])[i, j])
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    m_hat, v_hat = m / bc1, v / bc2
    decayed = el["weight"] * (1 - el["lr"] * el["weight_decay"])
    update = el["lr"] * m_hat / (math.sqrt(v_hat) + el["eps"])
    el.update(
        grad=g,
        step=t,
        m_prev=m_prev,
        v_prev=v_prev,
        m=m,
        v=v,
        bias_correction1=bc1,
        bias_correction2=bc2,
        m_hat=m_hat,
        v_hat=v_hat,
        decayed=decayed,
        update=update,
        formula_new=decayed - update,
        sgd_new=el["weight"] - el["lr"] * g,
        skipped=False,
    )
    return el


# ----------------------------------------------------------------------------- tokenizer, CLI
def prompt_tokenizer(prompt: str, kind: str = "bpe"):
    """A tokenizer learned from the prompt alone (the beginning ``cut_prompt`` keeps): byte-level
    BPE merged until every word is one token ('bpe'), or one token per character ('char')."""
    prompt = cut_prompt(prompt, kind)  # what prompt_ids will tokenize
    if kind == "char":
        return CharTokenizer.train(prompt)
    # 256 bytes + at most one merge per byte + <|endoftext|>: BPE stops when pairs run out
    return BPETokenizer.train(prompt, vocab_size=257 + len(prompt.encode("utf-8")))
