"""gpt-explain's evidence: each number the step shows, checked by a second computation.

- ``finite_differences``: a few elements of W_Q, W_K, W_V and W_O of the shown head and of the
  token embedding, their tape gradient (float32, as training computes it) next to the float64
  central difference (L(w + h) - L(w - h)) / 2h on a float64 copy of the model;
- ``loss_change``: after the AdamW update, the first-order prediction of the loss change,
  ΔL ≈ Σ g·Δw over every parameter, next to the loss re-measured in float64 before and after;
- ``embedding_split``: the tied embedding E gets its gradient from two places, the logits
  H·Eᵀ (∂L/∂logitsᵀ · H) and the input lookup E[x] (the rows of ∂L/∂tok_emb added into the rows
  of the input tokens); the two parts must sum to E's gradient.
"""

from __future__ import annotations

import copy

import numpy as np

import tensorgrad as tg

from .arrays import host, norm

FD_STEP = 1e-5  # float64: rounding ~1e-16·L/h ≈ 1e-10, truncation ~h² ≈ 1e-10
# float32 backward against float64 differences: agreement within 1e-3 of the value or 1e-3 of
# the largest gradient of the same matrix (tiny gradients carry float32 cancellation error)
RTOL, ATOL_REL = 1e-3, 1e-3


def float64_copy(model):
    """A float64 copy of ``model`` in eval mode (dropout off), for exact-ish re-measurements."""
    m = copy.deepcopy(model)
    m.zero_grad()
    return m.to(dtype=np.float64).eval()


def loss64(model64, idx, targets) -> float:
    with tg.no_grad():
        _, loss = model64(idx, targets)
    return float(host(loss))


def _targets(layer: int, head: int, C: int, hs: int):
    """(label, parameter name, rows, cols) of the blocks whose elements are checked: the
    head's rows of W_Q, W_K, W_V (c_attn's weight is [W_Q; W_K; W_V]), its columns of W_O."""

    def rows(off):
        return slice(off + head * hs, off + (head + 1) * hs)

    attn = f"transformer.h.{layer}.attn"
    return [
        ("W_Q", f"{attn}.c_attn.weight", rows(0), slice(None)),
        ("W_K", f"{attn}.c_attn.weight", rows(C), slice(None)),
        ("W_V", f"{attn}.c_attn.weight", rows(2 * C), slice(None)),
        ("W_O", f"{attn}.c_proj.weight", slice(None), rows(0)),
        ("E (wte)", "transformer.wte.weight", slice(None), slice(None)),
    ]


def finite_differences(
    model, model64, idx, targets, layer: int, head: int, n: int = 2, extra=()
) -> list[dict]:
    """For each checked matrix, the ``n`` elements with the largest gradient in head ``head``'s
    rows (W_Q, W_K, W_V) or columns (W_O), and in E; ``extra``: (label, name, i, j) to check
    too. Each row: the tape gradient, the float64 central difference and their agreement
    (|g - fd| <= RTOL·|fd| + ATOL_REL·max|g| of the block the element was picked from)."""
    C, nh = model.config.n_embd, model.config.n_head
    hs = C // nh
    params = dict(model.named_parameters())
    params64 = dict(model64.named_parameters())
    picks = [(*e, None) for e in extra]
    for label, name, rows, cols in _targets(layer, head, C, hs):
        p = params[name]
        if p.grad is None:
            continue
        g = np.abs(host(p.grad))[rows, cols]
        for flat in np.argsort(-g, axis=None, kind="stable")[:n]:
            i, j = np.unravel_index(int(flat), g.shape)
            picks.append(
                (
                    label,
                    name,
                    (rows.start or 0) + int(i),
                    (cols.start or 0) + int(j),
                    float(g.max()),
                )
            )
    out, seen = [], set()
    for label, name, i, j, scale in picks:
        if (name, i, j) in seen:
            continue
        seen.add((name, i, j))
        p, p64 = params[name], params64[name]
        g = None if p.grad is None else float(host(p.grad)[i, j])
        w = p64.array[i, j]
        p64.array[i, j] = w + FD_STEP
        up = loss64(model64, idx, targets)
        p64.array[i, j] = w - FD_STEP
        down = loss64(model64, idx, targets)
        p64.array[i, j] = w
        fd = (up - down) / (2 * FD_STEP)
        if scale is None:  # an extra element: the scale of its whole matrix
            scale = float(np.abs(host(p.grad)).max()) if p.grad is not None else 0.0
        err = None if g is None else abs(g - fd)
        out.append(
            {
                "label": label,
                "param": name,
                "index": [i, j],
                "grad": g,
                "fd": fd,
                "abs_err": err,
                "rel_err": None if g is None else err / max(abs(fd), 1e-30),
                "agree": g is not None and err <= RTOL * abs(fd) + ATOL_REL * scale,
            }
        )
    return out


def loss_change(named, grads: dict, before: dict, model64, idx, targets, loss_before: float):
    """ΔL predicted to first order, Σ g·Δw (Δw = the AdamW update), next to the float64 loss
    re-measured on the updated weights; the largest contributions per parameter."""
    contrib = []
    params64 = dict(model64.named_parameters())
    for n, p in named:
        dw = host(p).astype(np.float64) - before[n]
        params64[n].array = p.array.astype("float64")  # the float64 copy takes the new weights
        if grads.get(n) is not None:
            contrib.append((n, float(np.sum(grads[n].astype(np.float64) * dw))))
    after = loss64(model64, idx, targets)
    predicted = float(sum(c for _, c in contrib))
    measured = after - loss_before
    top = sorted(contrib, key=lambda c: -abs(c[1]))[:5]
    return {
        "predicted": predicted,
        "measured": measured,
        "loss_before": loss_before,
        "loss_after": after,
        "second_order": measured - predicted,
        "ratio": measured / predicted if predicted else None,
        "top": [{"param": n, "g_dw": c} for n, c in top],
    }


def embedding_split(model, rec, ids, decode) -> dict:
    """E's gradient as the part through the logits plus the part through the input lookup."""
    if model.lm_head is not None:
        return {"tied": False}
    E = model.transformer.wte.weight
    total = host(E.grad).astype(np.float64)
    dlogits = host(rec.tensors["logits"].grad)[0].astype(np.float64)  # (T, V)
    H = host(rec.tensors["ln_f"])[0].astype(np.float64)  # (T, C)
    from_logits = dlogits.T @ H  # (V, C): logits = H·Eᵀ, so ∂L/∂E = ∂L/∂logitsᵀ · H
    dtok = host(rec.tensors["tok_emb"].grad)[0].astype(np.float64)  # (T, C)
    from_lookup = np.zeros_like(total)
    np.add.at(from_lookup, np.asarray(ids[:-1]), dtok)  # a token used twice adds twice
    diff = np.abs(from_logits + from_lookup - total)
    rows = [
        {
            "id": int(t),
            "token": decode(int(t)),
            "logits_norm": norm(from_logits[t]),
            "lookup_norm": norm(from_lookup[t]),
            "total_norm": norm(total[t]),
        }
        for t in sorted(set(ids[:-1]))
    ]
    return {
        "tied": True,
        "logits_norm": norm(from_logits),
        "lookup_norm": norm(from_lookup),
        "total_norm": norm(total),
        "sum_norm": norm(from_logits + from_lookup),
        "max_abs_diff": float(diff.max()),
        "rel_diff": float(diff.max() / max(np.abs(total).max(), 1e-30)),
        "rows": rows[:32],
    }
