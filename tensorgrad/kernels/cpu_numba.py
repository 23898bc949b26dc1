"""Compiled CPU kernels (numba): one pass per row for softmax, log-softmax, cross-entropy,
LayerNorm and GELU; AdamW (``cpu_numba_adamw``), the embedding (``cpu_numba_embedding``) and
flash-style attention (``cpu_numba_attention``) beside it.

numba is a default dependency; where it is missing (no wheel for the platform, or
uninstalled) importing this module raises ImportError, nothing is registered and the
pure-NumPy kernels run. Each kernel is an ``Op`` with its own
forward, backward and saved state, registered for 'cpu' with a predicate that accepts only
what it handles (NumPy arrays, C-contiguous, float32 where it uses :func:`exp32`, the last
axis); everything else runs the reference. ``tests/test_kernels_cpu.py`` checks each one
against its reference.

Rows run in parallel (``prange`` on numba's pool, started passive: TG_KERNEL_THREADS, every
core by default; one thread below PARALLEL_MIN elements, where waking the pool costs more). Fast-math
is limited to ``contract`` (a multiply-add may be fused; nothing is reordered, inf and NaN
propagate as in the reference): with ``reassoc`` a kernel compiled in the process and the
same kernel loaded from numba's cache gave different last bits (numba_math's "One
computation"). Row sums are numba_math's :func:`rsum` and its kin, vectorised in a fixed
order; loops that call ``exp32`` store e^x and sum it in a second pass over the row, which
is still in L1/L2. Compiled code is cached on disk (``cache=True``,
in ``__pycache__`` or NUMBA_CACHE_DIR): the first use in a fresh environment compiles
every kernel it meets (a char-small training step: 12-15 s on the 2-core machine of
benchmarks/, ``python -m benchmarks.startup``), later processes load them (0.6 s).

Imports: math, numba, numpy, os, .formulas, .numba_math, .on_cpu, .register, .threads,
..autograd, ..ops.
"""

from __future__ import annotations

import math
import os

import numba
import numpy as np
from numba import prange

from ..autograd import Op
from ..ops.nn import check_classes, loss_coef, reduce_losses
from . import on_cpu, register, threads
from .formulas import (
    FM,
    gelu_erf,
    gelu_erf_grad,
    gelu_tanh,
    gelu_tanh_grad,
    ln_row,
    ln_row_grad,
    log_softmax_grad,
    log_softmax_row,
    softmax_grad_in_place,
    softmax_in_place,
)
from .numba_math import exp32_in_place, exp32_nonpos, jit, rdot, rmax, rsum

F32 = np.float32
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def numpy_array(a):
    """The NumPy array behind a raw array or a Tensor (None for anything else)."""
    if on_cpu(a):  # (or a Spec of one: kernels.which)
        return a
    d = getattr(a, "array", None)
    return d if isinstance(d, np.ndarray) else None


def _f32(*arrays) -> bool:
    """Every array is a C-contiguous, non-empty float32 NumPy array."""
    for a in arrays:
        a = numpy_array(a)
        if a is None or a.dtype != np.float32 or not a.flags.c_contiguous or a.size == 0:
            return False
    return True


def _last_dim(x, dim) -> bool:
    x = numpy_array(x)
    return x is not None and x.ndim >= 1 and dim in (-1, x.ndim - 1)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


PARALLEL_MIN = 1 << 19  # elements below which one thread runs a kernel: waking the sleeping
# pool costs more than the second core saves (char-small's ReLU-edited step: 57 ms on two
# threads from 1 << 16 elements, 45 ms from 1 << 19, as on one thread; Zen 4, 2 cores)


def kernel_threads() -> int:
    """Threads for the numba kernels: TG_KERNEL_THREADS, else the count kernels/threads.py
    pinned or measured, else every core this process may use. The pool is started passive (:func:`_start_pool`), so that its threads sleep at once
    after a kernel rather than spin against OpenBLAS's: with a spinning pool a char-small
    training step took 305 ms on 2 threads against 43 ms on 1, passive 40 ms (family 25
    model 17, Zen 4, 2 cores).
    """
    return threads.kernel_threads(_CORES)


_CORES = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _start_pool() -> None:
    """Start numba's thread pool once, with OMP_WAIT_POLICY=PASSIVE for its OpenMP runtime
    unless the user set a policy. OpenMP reads the policy when its library loads, which is
    when numba starts the pool, so the variable is set for that moment only and removed
    again: an OpenMP runtime loaded later (PyTorch's) keeps its own default. It runs when
    this module is imported (4 ms), before anything else can start the pool spinning: a
    ``numba.set_num_threads`` call starts it too."""
    if "OMP_WAIT_POLICY" in os.environ:
        numba.get_num_threads()
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        numba.get_num_threads()  # (starts the pool)
    finally:
        del os.environ["OMP_WAIT_POLICY"]


class threads_for:
    """``with threads_for(n):`` up to kernel_threads() numba threads for n elements of
    work (at least PARALLEL_MIN of them), else one. (A class rather than a generator
    context manager: it runs around every kernel call, small ones included.)"""

    __slots__ = ("size", "prev", "want")

    def __init__(self, size: int):
        self.size = size

    def __enter__(self):
        self.prev = prev = numba.get_num_threads()
        self.want = min(prev, kernel_threads()) if self.size >= PARALLEL_MIN else 1
        if self.want != prev:
            numba.set_num_threads(self.want)  # thread-local: other Python threads keep theirs

    def __exit__(self, *exc):
        if self.want != self.prev:
            numba.set_num_threads(self.prev)
        return False


def run_kernel(kernel, size: int, *args) -> None:
    with threads_for(size):
        kernel(*args)


def contiguous(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


# ----------------------------------------------------------------------------- softmax family


# Each kernel runs the row formula of kernels/formulas.py over the rows, in parallel. The
# softmax formulas work in place (the attention's scores become its probabilities, and an
# output that may alias its input keeps LLVM's loop scalar), so these copy each row first,
# in L1: forward + backward of a (384, 256) softmax on one thread took 49 + 16 µs with its
# own out-of-place loops, 53 + 20 µs through the shared formula (family 25 model 17, Zen 4).


@jit(parallel=True, fastmath=FM)
def _softmax_fwd(x, y):
    for i in prange(x.shape[0]):
        yi = y[i]
        yi[:] = x[i]
        softmax_in_place(yi, yi.size)


@jit(parallel=True, fastmath=FM)
def _softmax_bwd(g, y, gx):
    for i in prange(g.shape[0]):
        gi, yi, o = g[i], y[i], gx[i]
        o[:] = gi
        softmax_grad_in_place(o, yi, rdot(gi, yi), F32(1))


@jit(parallel=True, fastmath=FM)
def _log_softmax_fwd(x, y):
    for i in prange(x.shape[0]):
        log_softmax_row(x[i], y[i])


@jit(parallel=True, fastmath=FM)
def _log_softmax_bwd(g, y, gx):
    for i in prange(g.shape[0]):
        log_softmax_grad(g[i], y[i], gx[i])


def _softmax_when(x, dim=-1):
    return _f32(x) and _last_dim(x, dim)


@register(
    "softmax",
    "cpu",
    name="cpu.numba.softmax",
    priority=20,
    takes="float32, C-contiguous, over the last axis",
    when=_softmax_when,
)
class NumbaSoftmax(Op):
    """softmax over the last axis of float32 x: max, e^(x-max) and 1/sum in one row pass."""

    def forward(self, x, dim=-1):
        y = np.empty_like(x)
        run_kernel(_softmax_fwd, x.size, _rows(x), _rows(y))
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        gx = np.empty_like(y)
        run_kernel(_softmax_bwd, y.size, _rows(contiguous(g)), _rows(y), _rows(gx))
        return gx


@register(
    "log_softmax",
    "cpu",
    name="cpu.numba.log_softmax",
    priority=20,
    takes="float32, C-contiguous, over the last axis",
    when=_softmax_when,
)
class NumbaLogSoftmax(Op):
    """log_softmax over the last axis of float32 x; backward g - e^y·sum(g) per row."""

    def forward(self, x, dim=-1):
        y = np.empty_like(x)
        run_kernel(_log_softmax_fwd, x.size, _rows(x), _rows(y))
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        gx = np.empty_like(y)
        run_kernel(_log_softmax_bwd, y.size, _rows(contiguous(g)), _rows(y), _rows(gx))
        return gx


# ----------------------------------------------------------------------------- cross-entropy
CE_FLAT = 4096  # logits exponentiated per flat loop (rows of few classes share one)


@jit(parallel=True, fastmath=FM)
def _ce_fwd(x, t, loss, mx, ls_out, block):
    """Per row: loss = log Σe^(x-m) - (x[t]-m) (0 where t < 0); keeps m and log Σe^(x-m).
    Rows are exponentiated CE_FLAT elements at a time in one flat loop, which vectorises
    where a row of a few classes would not (gpt-nano's 10: 17 against 9 µs)."""
    n, c = x.shape
    rows = max(1, CE_FLAT // c)
    for b in prange((n + block - 1) // block):
        e = np.empty(rows * c, dtype=x.dtype)  # this block's scratch rows for e^(x-m)
        b1 = min(n, (b + 1) * block)
        for r0 in range(b * block, b1, rows):
            r1 = min(b1, r0 + rows)
            for i in range(r0, r1):
                xi, ei = x[i], e[(i - r0) * c : (i - r0 + 1) * c]
                m = rmax(xi)
                mx[i] = m
                for j in range(c):
                    ei[j] = xi[j] - m
            exp32_in_place(e[: (r1 - r0) * c])
            for i in range(r0, r1):
                ls = math.log(np.float64(rsum(e[(i - r0) * c : (i - r0 + 1) * c])))
                # m and log Σ kept apart (not m + log Σ): (x - m) - log Σ stays exact in
                # backward for ±1e4 logits, all in float32
                ls_out[i] = F32(ls)
                loss[i] = F32(ls - (x[i, t[i]] - mx[i])) if t[i] >= 0 else F32(0)


@jit(parallel=True, fastmath=FM)
def _ce_bwd(x, t, mx, ls, coef, gx):
    """gx = coef·(softmax(x) - onehot(t)) per row; rows with coef 0 are zeros."""
    n, c = x.shape
    for i in prange(n):
        k = coef[i]
        # written through gx[i, j], not a row view o = gx[i]: with the view, numba 0.68.1
        # (parallel=True) silently dropped `o[:] = 0` and `o[t[i]] -= k` (reproduced, cause
        # not pinned down); tests/test_kernels_cpu.py covers both stores
        if k == 0:
            for j in range(c):
                gx[i, j] = 0
        else:
            mi, li = mx[i], ls[i]
            for j in range(c):
                gx[i, j] = k * exp32_nonpos(F32(x[i, j] - mi) - li)
            gx[i, t[i]] -= k


@register(
    "cross_entropy",
    "cpu",
    name="cpu.numba.cross_entropy",
    priority=20,
    takes="float32 C-contiguous (N, C) logits, (N,) targets",
    when=lambda x, target, ignore_index=-100, reduction="mean": (
        _f32(x)
        and numpy_array(x).ndim == 2
        and numpy_array(target) is not None
        and numpy_array(target).ndim == 1
    ),
)
class NumbaCrossEntropy(Op):
    """Cross-entropy of (N, C) float32 logits, one pass per row each way.

    Saves the logits (an input), the row max and log-sum-exp (float32, two per row) and the
    targets as int32 with -1 for ignored rows, instead of the (N, C) probabilities.
    """

    def forward(self, x, target, ignore_index=-100, reduction="mean"):
        n, c = x.shape
        valid = target != ignore_index
        t = np.where(valid, target, 0)
        check_classes(np, t, c)
        t32 = np.where(valid, t, -1).astype(np.int32)  # classes < 2^31; -1: ignored
        loss, mx, ls = np.empty(n, x.dtype), np.empty(n, x.dtype), np.empty(n, x.dtype)
        run_kernel(_ce_fwd, x.size, x, t32, loss, mx, ls, max(8, CE_FLAT // c))
        self.reduction = reduction
        self.save(x, t32, mx, ls)
        return reduce_losses(np, loss, valid, reduction)

    def backward(self, g):
        x, t32, mx, ls = self.saved
        coef = loss_coef(g, t32 >= 0, self.reduction, x.dtype)
        gx = np.empty_like(x)
        run_kernel(_ce_bwd, x.size, x, np.maximum(t32, 0), mx, ls, coef, gx)
        return gx, None


# ----------------------------------------------------------------------------- layer norm


@jit(parallel=True, fastmath=FM)
def _ln_fwd(x, w, b, eps, y, rstd):
    for i in prange(x.shape[0]):
        rstd[i] = ln_row(x[i], w, b, eps, y[i])[1]


@jit(parallel=True, fastmath=FM)
def _add_ln_fwd(x, a, w, b, eps, s, y, rstd):
    """s = x + a, y = LayerNorm(s) per row: one pass, s still in L1 when it is normalised."""
    n, c = x.shape
    for i in prange(n):
        si = s[i]
        for j in range(c):
            si[j] = x[i, j] + a[i, j]
        rstd[i] = ln_row(si, w, b, eps, y[i])[1]


@jit(parallel=True, fastmath=FM)
def _ln_bwd(g, x, w, rstd, gs, gx, gw_part, gb_part):
    """gx = gs + ∂LayerNorm/∂x · g per row (gs: the gradient reaching AddLayerNorm's sum
    from its other readers, added first as the two ops' walk adds them; None: LayerNorm
    alone); Σ g·x̂ and Σ g over the rows of each of gw_part's blocks. The row mean is
    recomputed from x, as the forward computed it (one more read of a row in cache)."""
    n, c = x.shape
    parts = gw_part.shape[0]
    for p in prange(parts):
        for i in range(p * n // parts, (p + 1) * n // parts):
            xi, o = x[i], gx[i]
            if gs is not None:
                o[:] = gs[i]
            mean = xi.dtype.type(rsum(xi) / c)
            ln_row_grad(g[i], xi, w, mean, rstd[i], o, gw_part[p], gb_part[p], gs is not None)


def _ln_when(x, w, b, nd=1, eps=1e-5):
    xa = numpy_array(x)
    if (
        xa is None
        or xa.dtype not in (np.float32, np.float64)
        or not xa.flags.c_contiguous
        or xa.size == 0
        or not 1 <= nd <= xa.ndim
    ):
        return False
    for p in (w, b):
        pa = numpy_array(p)
        if p is not None and (
            pa is None or pa.dtype != xa.dtype or pa.shape != xa.shape[xa.ndim - nd :]
        ):
            return False
    return True


def _ln_vector(v, C: int, dtype, fill: float):
    """A LayerNorm weight or bias as a contiguous (C,) array; ``fill`` everywhere if None."""
    return np.full(C, fill, dtype) if v is None else np.ascontiguousarray(v).reshape(C)


@register(
    "layer_norm",
    "cpu",
    name="cpu.numba.layer_norm",
    priority=20,
    takes="float32 or float64, C-contiguous x; w, b of x's dtype and trailing shape",
    when=_ln_when,
)
class NumbaLayerNorm(Op):
    """LayerNorm over the trailing nd dims (float32 or float64), one pass per row each way.

    Saves x (an input), 1/std per row and w: backward recomputes the row mean from x
    (one more read of a row already in cache) instead of keeping x̂.
    """

    def forward(self, x, w, b, nd=1, eps=1e-5):
        C = math.prod(x.shape[x.ndim - nd :])
        w1, b1 = _ln_vector(w, C, x.dtype, 1), _ln_vector(b, C, x.dtype, 0)
        x2 = x.reshape(-1, C)
        y = np.empty_like(x2)
        rstd = np.empty(x2.shape[0], x.dtype)
        run_kernel(_ln_fwd, x.size, x2, w1, b1, x.dtype.type(eps), y, rstd)
        self.has_w, self.has_b, self.nd = w is not None, b is not None, nd
        self.save(x, rstd, w)
        return y.reshape(x.shape)

    def backward(self, g):
        return self._grads(g, None)

    def _grads(self, g, gs):
        """(∂x, ∂w, ∂b) for g at the output, plus gs (AddLayerNorm's sum's own gradient)."""
        x, rstd, w = self.saved
        C = math.prod(x.shape[x.ndim - self.nd :])
        w1 = _ln_vector(w, C, x.dtype, 1)
        x2 = x.reshape(-1, C)
        n = x2.shape[0]
        parts = min(n, 16)  # fixed, not per thread: the same sums on any machine
        gw_part, gb_part = np.zeros((parts, C), x.dtype), np.zeros((parts, C), x.dtype)
        gx = np.empty_like(x2)
        g2 = contiguous(g).reshape(n, C)
        gs2 = None if gs is None else contiguous(gs).reshape(n, C)
        run_kernel(_ln_bwd, x.size, g2, x2, w1, rstd, gs2, gx, gw_part, gb_part)
        wshape = x.shape[x.ndim - self.nd :]
        gw = gw_part.sum(axis=0).reshape(wshape) if self.has_w else None
        gb = gb_part.sum(axis=0).reshape(wshape) if self.has_b else None
        return gx.reshape(x.shape), gw, gb


def _add_ln_when(x, a, w, b, nd=1, eps=1e-5):
    xa, aa = numpy_array(x), numpy_array(a)
    if xa is None or aa is None or aa.shape != xa.shape or aa.dtype != xa.dtype:
        return False
    return bool(aa.flags.c_contiguous) and _ln_when(x, w, b, nd, eps)


@register(
    "add_layer_norm",
    "cpu",
    name="cpu.numba.add_layer_norm",
    priority=20,
    takes="as cpu.numba.layer_norm, a of x's shape, dtype and layout",
    when=_add_ln_when,
)
class NumbaAddLayerNorm(NumbaLayerNorm):
    """s = x + a and LayerNorm(s) in one pass per row each way (compiler.patterns.AddLayerNorm, made by
    tensorgrad.compile): the sum is normalised while its row is in L1, and the backward adds
    the sum's own gradient to LayerNorm's as it writes it. Saves s, 1/std per row and w."""

    multi_output = True
    takes_none = True

    def forward(self, x, a, w, b, nd=1, eps=1e-5):
        C = math.prod(x.shape[x.ndim - nd :])
        w1, b1 = _ln_vector(w, C, x.dtype, 1), _ln_vector(b, C, x.dtype, 0)
        x2 = x.reshape(-1, C)
        s, y = np.empty_like(x2), np.empty_like(x2)
        rstd = np.empty(x2.shape[0], x.dtype)
        run_kernel(_add_ln_fwd, x.size, x2, a.reshape(-1, C), w1, b1, x.dtype.type(eps), s, y, rstd)
        s = s.reshape(x.shape)
        self.has_w, self.has_b, self.nd = w is not None, b is not None, nd
        self.save(s, rstd, w)
        return s, y.reshape(x.shape)

    def backward(self, gs, gy):
        if gy is None:  # (w and b still get their gradients: zeros)
            gy = np.zeros_like(self.saved[0])
        gx, gw, gb = self._grads(gy, gs)
        return gx, gx, gw, gb


# ----------------------------------------------------------------------------- GELU

BLOCK = 1 << 14  # elements per parallel work item of the elementwise kernels


@jit(parallel=True, fastmath=FM)
def _gelu_tanh_fwd(x, y):
    n = x.size
    for b in prange((n + BLOCK - 1) // BLOCK):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        xb, yb = x[lo:hi], y[lo:hi]  # (over views the loop vectorises)
        for i in range(hi - lo):
            yb[i] = gelu_tanh(xb[i])


@jit(parallel=True, fastmath=FM)
def _gelu_tanh_bwd(x, g, gx):
    n = x.size
    for b in prange((n + BLOCK - 1) // BLOCK):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        xb, gb, gxb = x[lo:hi], g[lo:hi], gx[lo:hi]  # (over views the loop vectorises)
        for i in range(hi - lo):
            gxb[i] = gb[i] * gelu_tanh_grad(xb[i])[1]


@jit(parallel=True, fastmath=FM)
def _gelu_erf_fwd(x, y):
    n = x.size
    for b in prange((n + BLOCK - 1) // BLOCK):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        xb, yb = x[lo:hi], y[lo:hi]  # (over views the loop vectorises)
        for i in range(hi - lo):
            yb[i] = gelu_erf(xb[i])


@jit(parallel=True, fastmath=FM)
def _gelu_erf_bwd(x, g, gx):
    n = x.size
    for b in prange((n + BLOCK - 1) // BLOCK):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        xb, gb, gxb = x[lo:hi], g[lo:hi], gx[lo:hi]  # (over views the loop vectorises)
        for i in range(hi - lo):
            gxb[i] = gb[i] * gelu_erf_grad(xb[i])[1]


@register(
    "gelu",
    "cpu",
    name="cpu.numba.gelu",
    priority=20,
    takes="float32, C-contiguous, tanh or exact",
    when=lambda x, approximate="tanh": _f32(x) and approximate in ("tanh", "none"),
)
class NumbaGelu(Op):
    """GELU of float32 x ('tanh' as x·σ(2u), or 'none'), one pass each way; saves only x."""

    def forward(self, x, approximate="tanh"):
        self.approximate = approximate
        y = np.empty_like(x)
        kernel = _gelu_tanh_fwd if approximate == "tanh" else _gelu_erf_fwd
        run_kernel(kernel, x.size, x.reshape(-1), y.reshape(-1))
        self.save(x)
        return y

    def backward(self, g):
        (x,) = self.saved
        gx = np.empty_like(x)
        kernel = _gelu_tanh_bwd if self.approximate == "tanh" else _gelu_erf_bwd
        run_kernel(kernel, x.size, x.reshape(-1), contiguous(g).reshape(-1), gx.reshape(-1))
        return gx


_start_pool()
