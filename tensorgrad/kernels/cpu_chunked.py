"""The NumPy tier of the CPU kernels: the reference formulas run in cache-sized chunks, in
place. They are what runs without numba (its wheel missing for a platform, or uninstalled),
and, with numba, where a numba kernel declines: float64 softmax, cross-entropy and GELU,
strided inputs, attention with a mask or dropout (``kernels.table()`` lists both tiers, the
numba kernels at the higher priority). ``TG_KERNELS=0`` runs neither.

Each op of ``ops/nn.py`` runs several NumPy passes; over a whole activation every pass
streams through main memory, over a ~128 KiB chunk the later passes hit the cache
(``chunks.py``). The kernels here compute what the references compute, in fewer and
in-place passes, keep no more for backward than the references, and are registered
for the 'cpu' device; ``tests/test_kernels.py`` checks each one against its reference.

Imports: math, numpy, .chunks, .on_cpu, .register, ..autograd, ..devices, ..ops.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import Op, unbroadcast
from ..devices import device_of
from ..ops.nn import (
    GELU_C,
    SQRT_2_OVER_PI,
    Embedding,
    causal_mask,
    check_attention,
    check_classes,
    dropout_mask,
    loss_coef,
    mask_grad,
    reduce_losses,
    without_padding_row,
)
from . import on_cpu, register
from .chunks import chunked, n_chunks


def _contig(a):
    """a, or a C-contiguous copy (unlike ascontiguousarray, keeps 0-d arrays 0-d)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _rows(a):
    """a as (rows, last dim) (a view for contiguous arrays)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def _float(*arrays) -> bool:
    return all(a is None or (on_cpu(a) and a.dtype.kind == "f") for a in arrays)


def softmax_rows(x2, y2):
    """y2 = softmax(x2) along the last axis, chunk by chunk (y2 may be x2)."""

    def body(i, s, e):
        ys = y2[s:e]
        np.subtract(x2[s:e], x2[s:e].max(axis=1, keepdims=True), out=ys)
        np.exp(ys, out=ys)
        ys /= ys.sum(axis=1, keepdims=True)

    chunked(body, x2.shape[0], x2.shape[1])


def softmax_rows_backward(g2, y2, out2, scale=None):
    """out2 = y2 * (g2 - sum(g2 * y2)) [* scale] row by row (out2 may be g2)."""

    def body(i, s, e):
        gs, ys, o = g2[s:e], y2[s:e], out2[s:e]
        dot = np.einsum("ij,ij->i", gs, ys)
        np.subtract(gs, dot[:, None], out=o)
        o *= ys
        if scale is not None:
            o *= scale

    chunked(body, g2.shape[0], g2.shape[1])


# ----------------------------------------------------------------------------- softmax family


@register(
    "softmax",
    "cpu",
    name="cpu.chunked.softmax",
    priority=10,
    takes="float, any layout, over the last axis (NumPy tier)",
    when=lambda x, dim=-1: _float(x) and x.ndim > 0 and dim in (-1, x.ndim - 1),
)
class ChunkedSoftmax(Op):
    def forward(self, x, dim=-1):
        y = np.empty(x.shape, x.dtype)
        softmax_rows(_rows(_contig(x)), _rows(y))
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        gx = np.empty_like(y)
        softmax_rows_backward(_rows(_contig(g)), _rows(y), _rows(gx))
        return gx


@register(
    "cross_entropy",
    "cpu",
    name="cpu.chunked.cross_entropy",
    priority=10,
    takes="float (N, C) logits (NumPy tier)",
    when=lambda x, target, **kw: _float(x) and x.ndim == 2,
)
class ChunkedCrossEntropy(Op):
    def forward(self, x, target, ignore_index=-100, reduction="mean"):
        n, c = x.shape
        valid = target != ignore_index
        t = np.where(valid, target, 0)
        check_classes(np, t, c)
        x = _contig(x)
        # probabilities and logsumexp per row, one cache-sized chunk at a time;
        # logsumexp = m + log(tot), kept apart: x[t] - m is exact even for logits of 1e4
        p = np.empty_like(x)
        mx, logtot = np.empty(n, dtype=x.dtype), np.empty(n, dtype=x.dtype)

        def body(i, s, e):
            xs, ps = x[s:e], p[s:e]
            m = xs.max(axis=1, keepdims=True)
            np.subtract(xs, m, out=ps)
            np.exp(ps, out=ps)
            tot = ps.sum(axis=1, keepdims=True)
            ps /= tot
            mx[s:e] = m[:, 0]
            logtot[s:e] = np.log(tot[:, 0])

        chunked(body, n, c)
        logp = (x[np.arange(n), t] - mx) - logtot
        losses = np.where(valid, -logp, np.zeros((), x.dtype))
        self.reduction = reduction
        self.save(p, t, valid)
        return reduce_losses(np, losses, valid, reduction)

    def backward(self, g):
        p, t, valid = self.saved
        coef = loss_coef(g, valid, self.reduction, p.dtype)
        gx = np.empty_like(p)
        chunked(
            lambda i, s, e: np.multiply(p[s:e], coef[s:e, None], out=gx[s:e]),
            p.shape[0],
            p.shape[1],
        )
        gx[np.arange(p.shape[0]), t] -= coef
        return gx, None


# ----------------------------------------------------------------------------- normalisation


@register(
    "layer_norm",
    "cpu",
    name="cpu.chunked.layer_norm",
    priority=10,
    takes="float x, w, b (NumPy tier)",
    when=lambda x, w, b, nd=1, eps=1e-5: _float(x, w, b) and x.ndim >= nd,
)
class ChunkedLayerNorm(Op):
    def forward(self, x, w, b, nd=1, eps=1e-5):
        C = math.prod(x.shape[x.ndim - nd :])
        x2 = _contig(x).reshape(-1, C)
        w1 = None if w is None else w.reshape(C)
        b1 = None if b is None else b.reshape(C)
        xhat, y = np.empty_like(x2), np.empty_like(x2)
        rstd = np.empty((x2.shape[0], 1), dtype=x.dtype)
        eps = x.dtype.type(eps)

        def body(i, s, e):
            xs, xh, ys = x2[s:e], xhat[s:e], y[s:e]
            np.subtract(xs, xs.mean(axis=1, keepdims=True), out=xh)
            var = np.einsum("ij,ij->i", xh, xh) / x.dtype.type(C)
            r = rstd[s:e]
            np.sqrt(var[:, None] + eps, out=r)
            np.divide(1, r, out=r)
            xh *= r  # x-hat
            if w1 is not None:
                np.multiply(xh, w1, out=ys)
            else:
                ys[...] = xh
            if b1 is not None:
                ys += b1

        chunked(body, x2.shape[0], C)
        self.shape, self.nd = x.shape, nd
        self.has_w, self.has_b = w is not None, b is not None
        self.save(xhat, rstd, w)
        return y.reshape(x.shape)

    def backward(self, g):
        xhat, rstd, w = self.saved
        n, C = xhat.shape
        g2 = _contig(g).reshape(n, C)
        w1 = None if w is None else w.reshape(C)
        gx = np.empty_like(g2)
        parts = n_chunks(n, C)
        gw_part = np.zeros((parts, C), dtype=g.dtype)  # per-chunk sums, added at the end
        gb_part = np.zeros((parts, C), dtype=g.dtype)

        def body(i, s, e):
            gs, xh, o = g2[s:e], xhat[s:e], gx[s:e]
            np.multiply(gs, xh, out=o)
            gw_part[i] = o.sum(axis=0)
            gb_part[i] = gs.sum(axis=0)
            if w1 is not None:
                np.multiply(gs, w1, out=o)  # ∂L/∂x-hat
            else:
                o[...] = gs
            # ∂L/∂x = rstd·(gxh - mean(gxh) - x-hat·mean(gxh·x-hat))
            a = o.mean(axis=1, keepdims=True)
            c = np.einsum("ij,ij->i", o, xh)[:, None] / g.dtype.type(C)
            o -= a
            o -= xh * c
            o *= rstd[s:e]

        chunked(body, n, C)
        wshape = self.shape[len(self.shape) - self.nd :]
        gw = gw_part.sum(axis=0).reshape(wshape) if self.has_w else None
        gb = gb_part.sum(axis=0).reshape(wshape) if self.has_b else None
        return gx.reshape(self.shape), gw, gb


# ----------------------------------------------------------------------------- activations


@register(
    "gelu",
    "cpu",
    name="cpu.chunked.gelu_tanh",
    priority=10,
    takes="float, tanh form (NumPy tier)",
    when=lambda x, approximate="tanh": _float(x) and approximate == "tanh",
)
class ChunkedGeluTanh(Op):
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in place, chunk by chunk; saves only x
    and recomputes tanh in backward (one pass more, one activation less kept)."""

    def forward(self, x, approximate="tanh"):
        xc = _contig(x)
        x1, y = xc.reshape(-1), np.empty(x.shape, x.dtype)
        y1 = y.reshape(-1)

        def body(i, s, e):
            xs, ys = x1[s:e], y1[s:e]
            _tanh_arg(xs, ys)
            np.tanh(ys, out=ys)
            ys += 1
            ys *= xs
            ys *= 0.5

        chunked(body, x1.size, 1)
        self.save(xc)
        return y

    def backward(self, g):
        (x,) = self.saved
        x1, g1 = x.reshape(-1), _contig(g).reshape(-1)
        gx = np.empty(x.shape, x.dtype)
        o1 = gx.reshape(-1)

        def body(i, s, e):
            xs, o = x1[s:e], o1[s:e]
            t = np.empty_like(xs)
            _tanh_arg(xs, t)
            np.tanh(t, out=t)
            # d/dx = 0.5(1+t) + 0.5·x·(1-t²)·√(2/π)·(1 + 3·0.044715·x²)
            b = np.multiply(t, t)
            np.subtract(1, b, out=b)  # 1 - t²
            np.multiply(xs, xs, out=o)
            o *= 3 * GELU_C
            o += 1
            o *= xs
            o *= 0.5 * SQRT_2_OVER_PI
            o *= b
            t += 1
            t *= 0.5
            o += t
            o *= g1[s:e]

        chunked(body, x1.size, 1)
        return gx


def _tanh_arg(xs, u):
    """u = √(2/π)·(x + 0.044715·x³), in place."""
    np.multiply(xs, xs, out=u)
    u *= GELU_C
    u += 1
    u *= xs
    u *= SQRT_2_OVER_PI


# ----------------------------------------------------------------------------- lookup


@register(
    "embedding",
    "cpu",
    name="cpu.sorted.embedding",
    priority=10,
    takes="float weight, NumPy ids (NumPy tier)",
    when=lambda w, idx, **kw: _float(w) and on_cpu(idx),
)
class SortedEmbedding(Embedding):
    """The reference's forward; backward sorts the ids and sums runs (add.reduceat), much
    faster than add.at."""

    def backward(self, g):
        (idx,) = self.saved
        gw = np.zeros(self.wshape, dtype=g.dtype)
        idx = idx.reshape(-1)
        if idx.size:
            g2 = g.reshape(-1, self.wshape[1])
            order = np.argsort(idx, kind="stable")
            sidx = idx[order]
            first = np.concatenate((np.ones(1, dtype=bool), sidx[1:] != sidx[:-1]))
            starts = np.flatnonzero(first)
            gw[sidx[starts]] = np.add.reduceat(g2[order], starts, axis=0)
        return without_padding_row(gw, self.padding_idx), None


# ----------------------------------------------------------------------------- attention


@register(
    "attention",
    "cpu",
    name="cpu.inplace.attention",
    priority=10,
    takes="float q, k, v, masks and dropout too (NumPy tier)",
    when=lambda q, k, v, mask, **kw: _float(q, k, v),
)
class InplaceAttention(Op):
    """The reference's math with the (L, S) scores reused in place for probabilities and
    their gradient, and the row softmax run in chunks."""

    def forward(self, q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        check_attention(q, k, v)
        L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
        self.scale = q.dtype.type(1 / math.sqrt(E) if scale is None else scale)
        self.shapes = (q.shape, k.shape, v.shape)
        self.mask_meta = None if mask is None else (mask.shape, mask.dtype)
        s = q @ k.swapaxes(-1, -2)
        s *= self.scale
        allowed = causal_mask(np, L, S) if is_causal else None
        if mask is not None:
            if mask.dtype == bool:
                allowed = mask if allowed is None else (allowed & mask)
            else:
                s += mask
        if allowed is not None:
            np.copyto(s, q.dtype.type(-np.inf), where=~allowed)
        if allowed is None and mask is None:
            softmax_rows(_rows(s), _rows(s))  # no row can be fully masked
        else:
            m = s.max(axis=-1, keepdims=True)
            m = np.where(np.isfinite(m), m, q.dtype.type(0))  # fully masked rows: zeros
            s -= m
            np.exp(s, out=s)
            den = s.sum(axis=-1, keepdims=True)
            den[den == 0] = 1
            s /= den
        drop = None
        if dropout_p > 0.0:
            drop = dropout_mask(s.shape, dropout_p, s.dtype, device_of(q))
        self.save(q, k, v, s, drop)
        return (s * drop if drop is not None else s) @ v

    def backward(self, g):
        q, k, v, p, drop = self.saved
        sq, sk, sv = self.shapes
        pd = p * drop if drop is not None else p
        gv = pd.swapaxes(-1, -2) @ g
        gp = g @ v.swapaxes(-1, -2)
        if drop is not None:
            gp *= drop
        # softmax backward, in place: gs = p * (gp - sum(gp * p)) * scale
        gmask = None
        if self.mask_meta is not None and self.needs_input_grad[3]:
            softmax_rows_backward(_rows(gp), _rows(p), _rows(gp))
            gmask = mask_grad(self, gp)  # a float mask's gradient: before the scale
            gp *= self.scale
        else:
            softmax_rows_backward(_rows(gp), _rows(p), _rows(gp), self.scale)
        gq = gp @ k
        gk = gp.swapaxes(-1, -2) @ q
        return unbroadcast(gq, sq), unbroadcast(gk, sk), unbroadcast(gv, sv), gmask


# ----------------------------------------------------------------------------- AdamW

ADAMW_CHUNK = 1 << 17  # elements per pass: one chunk's temporaries stay in cache


@register(
    "adamw",
    "cpu",
    name="cpu.chunked.adamw",
    priority=10,
    takes="float, C-contiguous x (NumPy tier)",
    when=lambda x, g, m, v: _float(x, g, m, v) and x.flags.c_contiguous,
)
def chunked_adamw_update(x, g, m, v, *, lr, b1, b2, eps, wd, step) -> None:
    """``optim.adamw_update`` over the flat arrays in cache-sized chunks: the ten
    elementwise passes cost one trip through main memory, and no full-size temporary."""
    xf, mf, vf = x.reshape(-1), m.reshape(-1), v.reshape(-1)  # contiguous: views
    gf = _contig(g).reshape(-1)
    n = xf.size
    decay = 1 - lr * wd
    step_size = lr / (1 - b1**step)
    bc2_sqrt = math.sqrt(1 - b2**step)
    buf = np.empty(min(ADAMW_CHUNK, n), dtype=x.dtype)
    for s in range(0, n, ADAMW_CHUNK):
        e = min(s + ADAMW_CHUNK, n)
        xs, gs, ms, vs, b = xf[s:e], gf[s:e], mf[s:e], vf[s:e], buf[: e - s]
        if wd:
            xs *= decay  # decoupled weight decay
        ms *= b1  # m = β1·m + (1-β1)·g
        np.multiply(gs, 1 - b1, out=b)
        ms += b
        vs *= b2  # v = β2·v + (1-β2)·g²
        np.multiply(gs, gs, out=b)
        b *= 1 - b2
        vs += b
        np.sqrt(vs, out=b)  # denominator √v/√(1-β2^t) + eps
        b /= bc2_sqrt
        b += eps
        np.divide(ms, b, out=b)
        b *= step_size
        xs -= b
