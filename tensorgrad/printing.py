"""How a tensor prints: ``tensor([1.5000, 2.0000])``, as PyTorch.

Floats take 4 decimals, or none (``1.``) when every value is whole, or scientific notation
(``1.0000e-05``) when the values span more than 1000x, exceed 1e8 or go below 1e-4. All
elements share one width. The dtype is shown unless it is float32, int64 or bool; then
``device='cuda:0'``, ``requires_grad=True`` (a leaf) or ``grad_fn=<MulBackward0>``.

Imports: numpy, .devices.
"""

from __future__ import annotations

import numpy as np

from .devices import BFLOAT16, to_numpy

PRECISION = 4
THRESHOLD, EDGEITEMS, LINEWIDTH = 1000, 3, 80
_DEFAULT_SHOWN = ("float32", "int64", "bool")


def _float_format(a: np.ndarray):
    """The function that formats one float of ``a`` and the shared width, as PyTorch picks them
    from the nonzero finite values."""
    finite = a[np.isfinite(a) & (a != 0)]
    finite = np.abs(finite.astype(np.float64))
    whole = bool(np.all(finite == np.ceil(finite)))
    sci = False
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        sci = hi / lo > 1000.0 or hi > 1e8 or (not whole and lo < 1e-4)
    if sci:
        fmt = lambda v: f"{v:.{PRECISION}e}"  # noqa: E731
    elif whole:
        fmt = lambda v: f"{v:.0f}" + ("." if np.isfinite(v) else "")  # noqa: E731
    else:
        fmt = lambda v: f"{v:.{PRECISION}f}"  # noqa: E731
    nonzero = a[np.isfinite(a) & (a != 0)].astype(np.float64)
    return fmt, max((len(fmt(v)) for v in nonzero.tolist()), default=1)


def _edges(a: np.ndarray) -> np.ndarray:
    """The elements that are printed when a big tensor is summarized (EDGEITEMS per side)."""
    if a.ndim == 0:
        return a.reshape(1)
    if a.shape[0] > 2 * EDGEITEMS:
        a = np.concatenate([a[:EDGEITEMS], a[-EDGEITEMS:]])
    return np.concatenate([_edges(r).reshape(-1) for r in a]) if a.ndim > 1 else a


def _nested(a: np.ndarray, indent: int, one, width: int, summarize: bool) -> str:
    """PyTorch's layout: rows wrapped to LINEWIDTH, nested dims separated by blank lines."""
    n = a.shape[0]
    cut = summarize and n > 2 * EDGEITEMS
    idx = [*range(EDGEITEMS), None, *range(n - EDGEITEMS, n)] if cut else list(range(n))
    if a.ndim == 1:
        items = [" ..." if i is None else one(a[i]) for i in idx]
        per_line = max(1, (LINEWIDTH - indent) // (width + 2))
        lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    rows = ["..." if i is None else _nested(a[i], indent + 1, one, width, summarize) for i in idx]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _body(a: np.ndarray, indent: int) -> str:
    summarize = a.size > THRESHOLD
    shown = _edges(a) if summarize else a.reshape(-1)
    if a.dtype.kind == "f":
        fmt, width = _float_format(shown)
    else:
        fmt = str if a.dtype.kind == "b" else (lambda v: str(int(v)))
        width = max((len(fmt(v)) for v in shown.tolist()), default=1)

    def one(v):
        return fmt(v.item()).rjust(width)

    if a.ndim == 0:
        return one(a)
    return _nested(a, indent, one, width, summarize)


def tensor_repr(t, prefix: str = "tensor(") -> str:
    """``repr(t)`` (and ``str(t)``) as PyTorch writes it."""
    a = to_numpy(t.array)
    extra = []
    if a.size == 0 and a.ndim != 1:
        body = "[]"
        extra.append(f"size={tuple(a.shape)}")
    else:  # (bfloat16 values print as the float32 values they are)
        body = _body(a.astype(np.float32) if a.dtype is BFLOAT16 else a, len(prefix))
    if a.dtype.name not in _DEFAULT_SHOWN:
        extra.append(f"dtype=torch.{a.dtype.name}")
    if t.device == "cuda":
        extra.append("device='cuda:0'")
    if t.grad_fn is not None:
        extra.append(f"grad_fn=<{type(t.grad_fn).__name__}Backward0>")
    elif t.requires_grad:
        extra.append("requires_grad=True")
    out = prefix + body
    last = len(out) - out.rfind("\n") + 1  # PyTorch's count for the last line's length
    for suffix in extra:  # a suffix that would pass column 80 starts a line of its own
        if last + len(suffix) + 2 > 80:
            out += ",\n" + " " * len(prefix) + suffix
            last = len(prefix) + len(suffix)
        else:
            out += ", " + suffix
            last += len(suffix) + 2
    return out + ")"
