"""Small formatters shared by gpt-explain's renderers: numbers, tokens, shapes, the
fixed-width matrix, and the AdamW-by-hand lines of one W_Q element (text and HTML both)."""

from __future__ import annotations

import textwrap


def fmt_value(x) -> str:
    """A value, signed, 4 decimals (scientific when tiny); None is a masked -inf."""
    if x is None:
        return "  -inf "
    return f"{x:+.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:+.1e}"


def fmt_g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def fmt_token(s: str, width: int = 0) -> str:
    r = repr(s)
    return (r[: width - 1] + "…" if width and len(r) > width else r).ljust(width)


def fmt_shape(shape, axes) -> str:
    return "(" + ", ".join(map(str, shape)) + ") " + ",".join(axes)


WIDTH = 100  # the terminal listing's columns
MATRIX_COLS = (WIDTH - 16) // 9  # the columns of a matrix that fit in WIDTH


def matrix_lines(lines, rows, labels, fmt, masked=None, max_rows: int | None = None):
    """A labelled matrix, one 9-character cell per column, within WIDTH columns (the first
    MATRIX_COLS columns and max_rows rows; a note says what was left out)."""
    w, n = 9, MATRIX_COLS
    lines.append(" " * 16 + "".join(fmt_token(s, w - 1)[: w - 1].rjust(w) for s in labels[:n]))
    for i, row in enumerate(rows[:max_rows]):
        cells = [
            "·".rjust(w) if masked is not None and not masked[i][j] else fmt(v).rjust(w)
            for j, v in enumerate(row[:n])
        ]
        lines.append(f"  {i:>2} {fmt_token(labels[i], 11)}" + "".join(cells))
    if len(labels) > n or (max_rows is not None and len(rows) > max_rows):
        shown = min(len(rows), max_rows or len(rows))
        lines.append(
            f"     ({shown} of {len(rows)} rows, {min(n, len(labels))} of {len(labels)} columns "
            "shown; --format html draws them all)"
        )


def fit(lines: list[str], width: int = WIDTH) -> list[str]:
    """The lines, each longer than width wrapped at spaces (continuations indented)."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * min(len(line) - len(line.lstrip()) + 4, 12)
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=True)
    return out


def capped(rows: list[str], n: int | None, what: str) -> list[str]:
    """The first n rows, and a line saying how many more --full shows (n None: all)."""
    if n is None or len(rows) <= n + 1:
        return rows
    return rows[:n] + [f"  ... {len(rows) - n} more {what} (gpt-explain --full shows all)"]


def element_lines(e):
    """The AdamW update of one W_Q element, every number of the formula on its own line."""
    out = [
        f"== 8. one weight by hand: W_Q[{e['row']}, {e['col']}] of block {e['layer']} " + "=" * 20,
        (
            f"  = c_attn.weight[{e['row']}, {e['col']}]: query feature {e['row']} (head "
            f"{e['head']}, dim {e['head_dim']}) from input feature {e['col']}"
        ),
    ]
    if e.get("skipped"):
        return out + [
            (
                f"  w = {e['weight']:.10f} got no gradient: AdamW skips it "
                f"(new value {e['new_weight']:.10f})"
            )
        ]
    out.append(f"  w                         = {e['weight']:+.10f}")
    if e.get("clip_scale", 1.0) < 1.0:  # gpt-train's clipping: every gradient times one c
        out += [
            f"  ∂L/∂w                     = {e['tape_grad']:+.6e}",
            f"  g = c·∂L/∂w               = {e['grad']:+.6e}   (clipped: c = {e['clip_scale']:.6g})",
        ]
    else:
        out.append(f"  g = ∂L/∂w                 = {e['grad']:+.6e}")
    out += [
        (
            f"  lr = {e['lr']:g}, β1 = {e['beta1']:g}, β2 = {e['beta2']:g}, ε = {e['eps']:g}, "
            f"weight decay λ = {e['weight_decay']:g}, step t = {e['step']}"
        ),
        f"  m = β1·m + (1-β1)·g       = {e['m']:+.6e}   "
        + ("(m starts at 0)" if e["step"] == 1 else f"(m was {e['m_prev']:+.6e})"),
        f"  v = β2·v + (1-β2)·g²      = {e['v']:.6e}   "
        + ("(v starts at 0)" if e["step"] == 1 else f"(v was {e['v_prev']:.6e})"),
        f"  m̂ = m / (1-β1^t)          = {e['m_hat']:+.6e}   (1-β1^t = {e['bias_correction1']:.6g})",
        f"  v̂ = v / (1-β2^t)          = {e['v_hat']:.6e}   (1-β2^t = {e['bias_correction2']:.6g})",
        f"  w·(1 - lr·λ)              = {e['decayed']:+.10f}   (decoupled weight decay)",
        f"  lr · m̂ / (√v̂ + ε)         = {e['update']:+.10f}",
        (
            f"  new w = w·(1-lr·λ) - lr·m̂/(√v̂+ε) = {e['formula_new']:+.10f}   "
            f"(the optimizer wrote {e['new_weight']:+.10f})"
        ),
    ]
    if e["step"] == 1:
        out += [
            f"  plain SGD, w - lr·g, would give {e['sgd_new']:+.10f}: Adam's first step moves "
            "every",
            "  weight by about lr whatever the size of its gradient (m̂/√v̂ = sign(g) at t = 1)",
        ]
    else:
        out.append(
            f"  plain SGD, w - lr·g, would give {e['sgd_new']:+.10f}: Adam divides by the "
            "running size √v̂"
        )
    return out
