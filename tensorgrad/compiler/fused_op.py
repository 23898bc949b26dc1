"""The runtime op of a fused run: ``FusedElementwise``, the graph node replay runs for it.

codegen.py makes one subclass per run (``Fused[add+gelu+mul]``), whose class attributes say
how each input is read (``kinds``), the run's shape as R rows of C, which outputs hold one
value per row, and which inputs want a gradient and how it is written (``grad_kinds``); its
``kernel_forward`` and ``kernel_backward`` are the run's two generated numba kernels. The
forward keeps its inputs (the backward recomputes the run's values from them, nothing else
is stored), runs the forward kernel over the flattened arrays, and reshapes the outputs; the
backward runs the backward kernel and finishes the gradients the kernel leaves partial (a
broadcast input's blocks of column sums, a trailing broadcast's or a row value's sums over
what shares it). Both run on the CPU kernels' threads (``TG_KERNEL_THREADS``).

Imports: numpy, ..autograd.
"""

from __future__ import annotations

import numpy as np

from ..autograd.graph import Op


class FusedElementwise(Op):
    """One fused run: forward and backward by generated kernels over the flattened arrays."""

    multi_output = True
    kinds: list = []
    shape: tuple = ()
    rows_shape: tuple = (0, 1, 0)  # R rows of C, P blocks of rows
    out_rows: list = []  # per output: whether it holds one value per row
    wanted: list = []
    grad_kinds: list = []

    def forward(self, *inputs):
        self.inputs = inputs  # the backward recomputes the run's values from them
        arrays = [_flat(a) for a, k in zip(inputs, self.kinds) if k[0] != "scalar"]
        dtype = next(a.dtype for a in arrays)
        R, C, _ = self.rows_shape
        outs = [np.empty(R if row else R * C, dtype) for row in self.out_rows]
        with _threads(R * C):
            self.kernel_forward(R, C, *arrays, *outs)
        return tuple(
            o.reshape((*self.shape[:-1], 1) if row else self.shape)
            for o, row in zip(outs, self.out_rows)
        )

    def backward(self, *gys):
        inputs = self.inputs
        arrays = [_flat(a) for a, k in zip(inputs, self.kinds) if k[0] != "scalar"]
        R, C, P = self.rows_shape
        dtype = gys[0].dtype
        gs = [_flat(g) for g in gys]
        sizes = {"full": R * C, "tail": R * C, "row": R, "rows": R}
        gx = [
            np.zeros((P, C), dtype) if k == "parts" else np.empty(sizes[k], dtype)
            for k in self.grad_kinds
        ]
        with _threads(R * C):
            self.kernel_backward(R, C, P, *arrays, *gs, *gx)
        out = [None] * len(inputs)
        for j, k, g in zip(self.wanted, self.grad_kinds, gx):
            if k == "parts":
                g = g.sum(0)
            elif k == "tail":
                g = g.reshape(-1, self.kinds[j][1]).sum(0)
            elif k == "rows":
                g = g.reshape(-1, self.kinds[j][1] // C).sum(1)
            out[j] = g.reshape(np.shape(inputs[j]))
        return tuple(out)


def _threads(n: int):
    """The CPU kernels' thread policy (kernels.cpu_numba.threads_for: TG_KERNEL_THREADS)."""
    from ..kernels.cpu_numba import threads_for

    return threads_for(n)


def _flat(a):
    return np.ascontiguousarray(a).reshape(-1)
