"""The embedding's lookup and backward compiled (numba): the ids' range checked in one pass,
each row of the gradient added at its id in one loop. ``tests/test_kernels.py`` checks it
against ``ops.nn.Embedding``.

Imports: numpy, .cpu_numba, .formulas, .numba_math, .on_cpu, .register, ..ops.
"""

from __future__ import annotations

import numpy as np

from ..ops.nn import Embedding, embedding_range_error, without_padding_row
from . import on_cpu, register
from .cpu_numba import FLOATS, contiguous
from .formulas import FM
from .numba_math import jit


@jit()
def _id_range(ids):
    """(min, max) of a flat integer array, in one pass."""
    lo = hi = ids[0]
    for i in range(1, ids.size):
        lo, hi = min(lo, ids[i]), max(hi, ids[i])
    return lo, hi


@jit(fastmath=FM)
def _embedding_bwd(ids, g, gw):
    """gw (zeros on entry) <- row ids[i] += g[i] for each i, in order (one thread: the same
    sums however many threads)."""
    for i in range(ids.size):
        gr, row = gw[ids[i]], g[i]
        for j in range(row.size):
            gr[j] += row[j]


@register(
    "embedding",
    "cpu",
    name="cpu.numba.embedding",
    priority=20,
    takes="float32 or float64 (V, C) weight, NumPy integer ids",
    when=lambda w, idx, **kw: _f32_or_64(w) and w.ndim == 2 and _int_array(idx),
)
class NumbaEmbedding(Embedding):
    """The reference's lookup with its range check in one pass (the reference reduces the
    ids twice); the backward adds each row of g at its id in one loop, where the sorted
    kernel's argsort and reduceat cost more than the adds at a small model's sizes (gpt-nano's
    two lookups: 48 µs each step)."""

    def forward(self, w, idx, padding_idx=None):
        if idx.size:
            lo, hi = _id_range(idx.reshape(-1))
            if lo < 0 or hi >= w.shape[0]:
                raise IndexError(embedding_range_error(int(lo), int(hi), w.shape[0]))
        self.save(idx)
        self.wshape, self.padding_idx = w.shape, padding_idx
        return w[idx]

    def backward(self, g):
        (idx,) = self.saved
        gw = np.zeros(self.wshape, dtype=g.dtype)
        if idx.size:
            _embedding_bwd(idx.reshape(-1), contiguous(g).reshape(-1, self.wshape[1]), gw)
        return without_padding_row(gw, self.padding_idx), None


def _f32_or_64(a) -> bool:
    return on_cpu(a) and a.dtype in FLOATS and a.flags.c_contiguous


def _int_array(a) -> bool:
    return on_cpu(a) and a.dtype.kind in "iu" and a.dtype.itemsize <= 8
