"""AdamW's update compiled (numba): one vectorised pass over x, g, m, v per parameter, both
cores from PARALLEL_MIN elements, and a list of small parameters in a few calls
(``adamw_foreach``, as torch.optim's foreach). ``tests/test_kernels.py`` checks both against
``tensorgrad.optim``'s formula.

Imports: math, numba, numpy, .cpu_numba, .formulas, .numba_math, .on_cpu, .register.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from . import on_cpu, register
from .cpu_numba import BLOCK, FLOATS, PARALLEL_MIN, contiguous, numpy_array, run_kernel
from .formulas import FM
from .numba_math import jit

# ----------------------------------------------------------------------------- AdamW


@jit(fastmath=FM)
def _adamw_run(xb, gb, mb, vb, decay, b1, c1, b2, c2, bc2, eps, step_size):
    """The update over one run of flat arrays (slices: over views the loop vectorises)."""
    for i in range(xb.size):
        gi = gb[i]
        mi = mb[i] * b1 + c1 * gi
        vi = vb[i] * b2 + c2 * (gi * gi)
        mb[i] = mi
        vb[i] = vi
        xb[i] = xb[i] * decay - (mi / (np.sqrt(vi) / bc2 + eps)) * step_size


@jit(parallel=True, fastmath=FM)
def _adamw(x, g, m, v, decay, b1, c1, b2, c2, bc2, eps, step_size):
    n = x.size
    for b in prange((n + BLOCK - 1) // BLOCK):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        xb, gb, mb, vb = x[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        _adamw_run(xb, gb, mb, vb, decay, b1, c1, b2, c2, bc2, eps, step_size)


# The same loop without the pool, for parameters below PARALLEL_MIN elements (most of a small
# model's): one thread either way, but no thread count to set and restore around the call
# (two numba.set_num_threads per parameter and step: 0.1 ms of gpt-nano's 5 ms step)
_adamw_serial = jit(fastmath=FM)(_adamw.py_func)


def _adamw_when(x, g, m, v, **kw):
    arrays = [numpy_array(a) for a in (x, g, m, v)]
    if any(a is None for a in arrays):
        return False
    return arrays[0].dtype in (np.float32, np.float64) and all(
        a.dtype == arrays[0].dtype and a.shape == arrays[0].shape and a.flags.c_contiguous
        for a in arrays
    )


def _adamw_scalars(lr, b1, b2, eps, wd, step) -> tuple:
    """The update's constants (Python floats, rounded to x's dtype by the caller): decay, β1,
    1-β1, β2, 1-β2, √(1-β2^t), eps, and the step size lr/(1-β1^t)."""
    decay = 1 - lr * wd if wd else 1.0
    return decay, b1, 1 - b1, b2, 1 - b2, math.sqrt(1 - b2**step), eps, lr / (1 - b1**step)


# Registered since its loop vectorises (numba_math.jit's error model) and the pool runs
# two threads from PARALLEL_MIN elements: against the chunked NumPy update, family 25
# model 17 (Zen 4), 2 cores, 2.3k / 100k / 2M / 10M parameters: 9 / 50 / 544 / 4,491 µs
# against 13 / 149 / 3,645 / 19,523 (benchmarks/kernels_ab.py times both). Before that the
# chunked update was the faster (26.5 vs 40.1 ms for 10M on one numba thread).
@register(
    "adamw",
    "cpu",
    name="cpu.numba.adamw",
    priority=20,
    takes="x, g, m, v float32 or float64 of one shape, C-contiguous",
    when=_adamw_when,
)
def numba_adamw_update(x, g, m, v, *, lr, b1, b2, eps, wd, step) -> None:
    """tensorgrad.optim.adamw_update in one pass over x, g, m, v (in place, same order)."""
    args = (x.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1))
    t = x.dtype.type
    args += tuple(t(c) for c in _adamw_scalars(lr, b1, b2, eps, wd, step))
    if x.size < PARALLEL_MIN:
        _adamw_serial(*args)
    else:
        run_kernel(_adamw, x.size, *args)


# ----------------------------------------------------------------------------- AdamW, many
# A small model's optimizer step is mostly the Python around its tiny updates (gpt-nano: 40
# parameters, 6 µs each). Parameters below PARALLEL_MIN elements go through one compiled loop
# FOREACH at a time (tuples of arrays: one signature per dtype, padded with empty arrays),
# as torch.optim's foreach implementation groups them; larger ones run numba_adamw_update.
FOREACH = 16


@jit(fastmath=FM)
def _adamw_many(xs, gs, ms, vs, hp):
    """_adamw_run over each (x, g, m, v) of the tuples, hp[k] the k-th one's scalars."""
    for k in range(len(xs)):
        x, g, m, v, h = xs[k], gs[k], ms[k], vs[k], hp[k]
        n = x.size
        _adamw_run(x[:n], g[:n], m[:n], v[:n], h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])


_NDARRAY = np.ndarray


def _adamw_foreach_when(xs, gs, ms, vs, hyper) -> bool:
    """Every x, g, m, v a NumPy array of x's float dtype and shape; x, m, v contiguous."""
    nd = _NDARRAY
    for x, g, m, v in zip(xs, gs, ms, vs):
        if type(x) is not nd or type(g) is not nd or type(m) is not nd or type(v) is not nd:
            if not (on_cpu(x) and on_cpu(g) and on_cpu(m) and on_cpu(v)):  # (Specs: which)
                return False
        dt, shape = x.dtype, x.shape
        if dt not in FLOATS or g.dtype != dt or m.dtype != dt or v.dtype != dt:
            return False
        if g.shape != shape or m.shape != shape or v.shape != shape:
            return False
        if not (x.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous):
            return False
    return True


@register(
    "adamw_foreach",
    "cpu",
    name="cpu.numba.adamw_foreach",
    priority=20,
    takes="every x, g, m, v as cpu.numba.adamw takes them",
    when=_adamw_foreach_when,
)
def numba_adamw_foreach(xs, gs, ms, vs, hyper) -> None:
    """tensorgrad.optim.adamw_foreach: every update in place, small ones FOREACH per call."""
    batches: dict = {}  # dtype -> ([x], [g], [m], [v], [scalars]) of the small parameters
    for x, g, m, v, hp in zip(xs, gs, ms, vs, hyper):
        g = contiguous(g)
        if x.size >= PARALLEL_MIN:
            numba_adamw_update(x, g, m, v, **hp)
            continue
        b = batches.get(x.dtype)
        if b is None:
            b = batches[x.dtype] = ([], [], [], [], [])
        for part, a in zip(b, (x, g, m, v)):
            part.append(a.reshape(-1))
        b[4].append(_adamw_scalars(**hp))
    for dt, (bx, bg, bm, bv, bh) in batches.items():
        empty = np.empty(0, dt)
        for lo in range(0, len(bx), FOREACH):
            pad = [empty] * (lo + FOREACH - len(bx))
            hp = np.array(bh[lo : lo + FOREACH] + [(0,) * 8] * len(pad), dt)
            _adamw_many(*(tuple(part[lo : lo + FOREACH] + pad) for part in (bx, bg, bm, bv)), hp)
