"""The drawing code of gpt-explain's pages: the stylesheet, escaping, the attention heat map
and the line chart, shared by the report page (html.py) and the steps page (steps.py)."""

from __future__ import annotations

import html

from .fmt import fmt_token

CSS = """
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


def escape(s) -> str:
    return html.escape(str(s), quote=True)


def heat_color(w: float) -> str:
    lo, hi = (247, 251, 255), (8, 48, 107)  # white to dark blue
    return "#" + "".join(f"{round(a + w * (b - a)):02x}" for a, b in zip(lo, hi))


def heatmap(weights, allowed, labels, title, cell=None, uid="h") -> str:
    """One attention matrix as an SVG grid: rows = queries, columns = keys; masked cells
    hatched grey (their weight is exactly 0)."""
    T = len(weights)
    small = cell is not None and cell < 12
    cell = cell or max(16, min(46, 460 // max(T, 1)))
    pad = 0 if small else 96
    size = pad + T * cell
    out = [
        (
            f'<svg class="heatmap" width="{size}" height="{size}" '
            f'viewBox="0 0 {size} {size}" role="img" aria-label="{escape(title)}">'
        ),
        (
            f'<defs><pattern id="hatch-{uid}" width="6" height="6" '
            'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#e4e7eb"/><line x1="0" y1="0" x2="0" y2="6" '
            'stroke="#9aa5b1" stroke-width="2"/></pattern></defs>'
        ),
    ]
    for i in range(T):
        if not small:
            y = pad + i * cell + cell / 2 + 4
            out.append(
                f'<text x="{pad - 4}" y="{y:.1f}" text-anchor="end" font-size="11">'
                f"{escape(fmt_token(labels[i], 12))}</text>"
            )
            x = pad + i * cell + cell / 2 + 4
            out.append(
                f'<text transform="translate({x:.1f},{pad - 4}) rotate(-55)" '
                f'font-size="11">{escape(fmt_token(labels[i], 12))}</text>'
            )
        for j in range(T):
            x, y, w = pad + j * cell, pad + i * cell, weights[i][j]
            if allowed[i][j] and small:  # a thumbnail: no tooltip, a fraction of the bytes
                out.append(
                    f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                    f'fill="{heat_color(w)}"/>'
                )
            elif allowed[i][j]:
                tip = f"query t={i} {labels[i]!r} -> key s={j} {labels[j]!r}: {w:.4f}"
                out.append(
                    f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                    f'fill="{heat_color(w)}" stroke="#fff"><title>{escape(tip)}</title></rect>'
                )
                if cell >= 34:
                    color = "#fff" if w > 0.5 else "#1f2933"
                    out.append(
                        f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" font-size="10" '
                        f'text-anchor="middle" fill="{color}">{w:.2f}</text>'
                    )
            elif small:
                out.append(
                    f'<rect class="cell masked" x="{x}" y="{y}" width="{cell}" '
                    f'height="{cell}" fill="#e4e7eb"/>'
                )
            else:
                tip = f"query t={i} -> key s={j}: masked (the future), weight {w:g}"
                out.append(
                    f'<rect class="cell masked" x="{x}" y="{y}" width="{cell}" '
                    f'height="{cell}" fill="url(#hatch-{uid})" stroke="#fff">'
                    f"<title>{escape(tip)}</title></rect>"
                )
    out.append("</svg>")
    return "".join(out)


def line_chart(xs, series, title: str, width: int = 340, height: int = 150) -> str:
    """An inline SVG line chart of ``series`` (label -> values over ``xs``)."""
    colors = ("#3e7cb1", "#d64545", "#2f9e44", "#f08c00")
    vals = [v for ys in series.values() for v in ys if v is not None]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1e-12
    x0, x1 = (xs[0], xs[-1]) if len(xs) > 1 else (0, 1)
    pad = 34

    def px(x):
        return pad + (x - x0) / (x1 - x0 or 1) * (width - pad - 8)

    def py(y):
        return height - 18 - (y - lo) / (hi - lo) * (height - 36)

    out = [
        (
            f'<svg class="chart" width="{width}" height="{height}" role="img" '
            f'aria-label="{escape(title)}"><text x="{pad}" y="12" font-size="11">{escape(title)}</text>'
        ),
        (
            f'<text x="2" y="{py(hi) + 4:.1f}" font-size="9">{hi:.3g}</text>'
            f'<text x="2" y="{py(lo) + 4:.1f}" font-size="9">{lo:.3g}</text>'
        ),
        (
            f'<line x1="{pad}" y1="{height - 18}" x2="{width - 8}" y2="{height - 18}" '
            'stroke="#9aa5b1"/>'
        ),
    ]
    for k, (label, ys) in enumerate(series.items()):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        c = colors[k % len(colors)]
        out.append(
            f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{pts}">'
            f"<title>{escape(label)}</title></polyline>"
        )
        out.append(
            f'<text x="{pad + 80 * k}" y="{height - 4}" font-size="10" fill="{c}">'
            f"{escape(label)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def signed_color(x: float, big: float) -> str:
    """Blue for negative, white for 0, red for positive; full colour at |x| = big."""
    a = min(1.0, abs(x) / big) if big > 0 else 0.0
    far = (33, 102, 172) if x < 0 else (178, 24, 43)
    return "#" + "".join(f"{round(255 + a * (c - 255)):02x}" for c in far)


TIP_CELLS = 160  # a map of more cells has no per-cell tooltip: the page stays small


def matrix_map(
    values, rows: str, cols: str, row_ticks=(), title: str = "", prob=False, uid: str = "m"
) -> str:
    """A 2-D slice as an SVG heat map with both axes titled and a colour scale under it.

    values: rows of numbers (None: masked, drawn hatched grey); rows/cols: the axes' titles;
    row_ticks: a label per row (tokens), the columns are numbered; prob: a 0..1 scale (white to
    blue) instead of the signed one (blue < 0 < red, symmetric about 0); uid: unique in the page
    (the colour scale's gradient id)."""
    n, m = len(values), len(values[0]) if values else 0
    cell = max(8, min(26, 380 // max(n, m, 1)))
    left, top = 104, 34
    w, h = max(left + m * cell + 8, left + 250), top + n * cell + 52
    finite = [v for row in values for v in row if v is not None]
    big = max((abs(v) for v in finite), default=0.0)
    lo, hi = (0.0, 1.0) if prob else (-big, big)
    tips, shades = n * m <= TIP_CELLS, {}
    out = [
        f'<svg class="tensormap" width="{w}" height="{h}" role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="12" font-size="11" font-weight="bold">{escape(cols)} →</text>',
        f'<text x="{left}" y="{top - 4}" font-size="9">0</text>',
        f'<text x="{left + m * cell}" y="{top - 4}" font-size="9" text-anchor="end">{m - 1}</text>',
        f'<text transform="translate(10,{top}) rotate(90)" font-size="11" font-weight="bold">'
        f"{escape(rows)} →</text>",
    ]
    for i, row in enumerate(values):
        y = top + i * cell
        tick = fmt_token(row_ticks[i], 12) if i < len(row_ticks) else str(i)
        out.append(
            f'<text x="{left - 4}" y="{y + cell / 2 + 4}" font-size="10" text-anchor="end">'
            f"{i} {escape(tick.strip())}</text>"
        )
        for j, v in enumerate(row):
            x = left + j * cell
            if v is None:
                fill, tip = "#d9dde2", f"[{i}, {j}]: masked (-inf)"
            elif tips:
                fill = heat_color(v) if prob else signed_color(v, big)
                tip = f"[{i}, {j}] = {v:.4g}"
            else:  # 21 shades, one path each: a large map stays a few bytes a cell
                fill = (
                    heat_color(round(v * 20) / 20)
                    if prob
                    else signed_color(round(v / big * 10) / 10 if big else 0, 1)
                )
            if tips:
                out.append(
                    f'<rect class="tc" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                    f'fill="{fill}"><title>{tip}</title></rect>'
                )
            else:
                shades.setdefault(fill, []).append(f"M{x},{y}h{cell}v{cell}h-{cell}z")
    out += [f'<path class="tc" fill="{c}" d="{"".join(d)}"/>' for c, d in shades.items()]
    y = top + n * cell + 10
    stops = [heat_color(0), heat_color(1)] if prob else ["#2166ac", "#ffffff", "#b2182b"]
    grad = "".join(
        f'<stop offset="{k / (len(stops) - 1)}" stop-color="{c}"/>' for k, c in enumerate(stops)
    )
    uid = f"scale-{uid}"
    out += [
        f'<defs><linearGradient id="{uid}">{grad}</linearGradient></defs>',
        f'<rect x="{left}" y="{y}" width="160" height="9" fill="url(#{uid})" stroke="#9aa5b1"/>',
        f'<text x="{left}" y="{y + 21}" font-size="10">{lo:.3g}</text>',
        f'<text x="{left + 80}" y="{y + 21}" font-size="10" text-anchor="middle">'
        f"{'' if prob else '0'}</text>",
        f'<text x="{left + 160}" y="{y + 21}" font-size="10" text-anchor="end">{hi:.3g}</text>',
        f'<text x="{left + 170}" y="{y + 9}" font-size="10">colour scale</text>',
        "</svg>",
    ]
    return "".join(out)
