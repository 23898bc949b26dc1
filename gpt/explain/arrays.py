"""Small array helpers shared by the explain modules: host copies, norms, JSON numbers, and
``tensor_slice``, the 2-D piece of a stage's tensor that the pages draw."""

from __future__ import annotations

import math

import numpy as np

import tensorgrad as tg
from tensorgrad import to_numpy


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


def tensor_slice(a: np.ndarray, axes, head: int) -> dict | None:
    """The 2-D slice of a stage's tensor the pages draw as a heat map: batch 0, head ``head``,
    the first SLICE_ROWS positions and SLICE_COLS features (or keys), values to 6 digits
    (None for -inf). ``rows``/``cols`` name the two axes, ``shape`` is the slice's full size.
    Axes beyond the last two are taken at 0; a vector is one row; a number has no slice."""
    index, names = [], []
    for ax in axes:
        if ax in ("B", "1"):
            index.append(0)
        elif ax == "nh":
            index.append(head)
        else:
            names.append(ax)
            index.append(slice(None))
    if not names:
        return None
    for _ in range(len(names) - 2):  # a stage of more axes than a map: their first entries
        index[index.index(slice(None))] = 0
    names = names[-2:] if len(names) > 1 else ["1", names[0]]
    m = np.asarray(a[tuple(index)], dtype=np.float64)
    m = m.reshape(1, -1) if m.ndim == 1 else m
    full = list(m.shape)
    m = m[:SLICE_ROWS, : SLICE_ROWS if names[-1] == "T" else SLICE_COLS]
    cell = [[num(float(f"{v:.6g}")) if math.isfinite(v) else None for v in row] for row in m]
    return {"rows": names[0], "cols": names[1], "shape": full, "values": cell}
