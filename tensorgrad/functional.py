"""Neural-network functions (``import tensorgrad.functional as F``), each one fused op.

Every function here is a single recorded Function with a hand-written backward,
so a GPT step runs a few large array passes instead of a chain of small ones.
Each has a composed twin built from primitive ops in the tests, and the two are
checked against each other and against float64 finite differences.
"""

from __future__ import annotations

import math

from .autograd import Function, unbroadcast
from .backend import device_of, errstate, get_array_module, kernels_for, matmul, rng
from .ops.linalg import Linear
from .parallel import chunked, n_chunks
from .tensor import Tensor, as_array


def _cpu(xp) -> bool:
    """True for NumPy: chunk the passes for the cache and the threads (GPU: one pass)."""
    return getattr(xp, "__name__", "") == "numpy"


def _contig(xp, a):
    """a, or a C-contiguous copy (unlike ascontiguousarray, keeps 0-d arrays 0-d)."""
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)


def _rows(a):
    """a as (rows, last dim) (a view for contiguous arrays)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def _softmax_rows(xp, x2, y2, cpu):
    """y2 = softmax(x2) along the last axis, chunk by chunk (y2 may be x2)."""

    def body(i, s, e):
        ys = y2[s:e]
        xp.subtract(x2[s:e], x2[s:e].max(axis=1, keepdims=True), out=ys)
        xp.exp(ys, out=ys)
        ys /= ys.sum(axis=1, keepdims=True)

    chunked(body, x2.shape[0], x2.shape[1], cpu=cpu)


def _softmax_rows_backward(xp, g2, y2, out2, cpu, scale=None):
    """out2 = y2 * (g2 - sum(g2 * y2)) [* scale] row by row (out2 may be g2)."""

    def body(i, s, e):
        gs, ys, o = g2[s:e], y2[s:e], out2[s:e]
        dot = xp.einsum("ij,ij->i", gs, ys)
        xp.subtract(gs, dot[:, None], out=o)
        o *= ys
        if scale is not None:
            o *= scale

    chunked(body, g2.shape[0], g2.shape[1], cpu=cpu)

# ----------------------------------------------------------------------------- softmax family


class Softmax(Function):
    def forward(self, x, dim=-1):
        xp = get_array_module(x)
        self.dim = dim
        K = kernels_for(xp, "softmax")
        if K is not None and K.softmax_supported(x, dim):
            y = K.softmax_forward(x)  # one CUDA block per row
        elif dim in (-1, x.ndim - 1):
            y = xp.empty_like(x)
            _softmax_rows(xp, _rows(x), _rows(y), _cpu(xp))
        else:
            y = x - x.max(axis=dim, keepdims=True)
            xp.exp(y, out=y)
            y /= y.sum(axis=dim, keepdims=True)
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        xp = get_array_module(g)
        if self.dim in (-1, y.ndim - 1):
            gx = xp.empty_like(y)
            _softmax_rows_backward(xp, _rows(_contig(xp, g)), _rows(y), _rows(gx),
                                   _cpu(xp))
            return gx
        gx = g * y
        gx -= y * gx.sum(axis=self.dim, keepdims=True)
        return gx


class LogSoftmax(Function):
    def forward(self, x, dim=-1):
        xp = get_array_module(x)
        self.dim = dim
        y = x - x.max(axis=dim, keepdims=True)
        y -= xp.log(xp.exp(y).sum(axis=dim, keepdims=True))
        self.save(y)
        return y

    def backward(self, g):
        (y,) = self.saved
        xp = get_array_module(g)
        return g - xp.exp(y) * g.sum(axis=self.dim, keepdims=True)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``dim``; finite for any finite input.

    A row that is entirely -inf has no defined softmax and gives NaN, as in PyTorch.
    """
    return Softmax.apply(x, dim=dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """x - logsumexp(x) along ``dim`` (max-shifted, so ±1e4 logits stay finite)."""
    return LogSoftmax.apply(x, dim=dim)


class CrossEntropy(Function):
    """Softmax + negative log-likelihood over the last axis of (N, C) logits."""

    def forward(self, x, target, ignore_index=-100, reduction="mean"):
        xp = get_array_module(x)
        n, c = x.shape
        valid = target != ignore_index
        t = xp.where(valid, target, 0)
        if t.size and (int(t.min()) < 0 or int(t.max()) >= c):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise IndexError(f"cross_entropy: target {bad} is out of range for {c} classes")
        rows = xp.arange(n)
        K = kernels_for(xp, "cross_entropy")
        self.kernels = K if K is not None and K.cross_entropy_supported(x) else None
        if self.kernels is not None:
            nll, lse = K.cross_entropy_forward(x, t)  # logsumexp(row) - x[t]; no (N, C) probs
            logp = -nll
            self.save(x, lse)
        else:
            # probabilities and logsumexp per row, one cache-sized chunk at a time
            p = xp.empty_like(x)
            # logsumexp = m + log(tot), kept apart: x[t] - m is exact even for logits of 1e4
            mx, logtot = xp.empty(n, dtype=x.dtype), xp.empty(n, dtype=x.dtype)

            def body(i, s, e):
                xs, ps = x[s:e], p[s:e]
                m = xs.max(axis=1, keepdims=True)
                xp.subtract(xs, m, out=ps)
                xp.exp(ps, out=ps)
                tot = ps.sum(axis=1, keepdims=True)
                ps /= tot
                mx[s:e] = m[:, 0]
                logtot[s:e] = xp.log(tot[:, 0])

            chunked(body, n, c, cpu=_cpu(xp))
            logp = (x[rows, t] - mx) - logtot
            self.save(p)
        losses = xp.where(valid, -logp, xp.zeros((), x.dtype))
        self.reduction = reduction
        self.t, self.valid, self.rows = t, valid, rows
        if reduction == "none":
            return losses
        if reduction == "sum":
            return losses.sum()
        self.count = valid.sum()
        with errstate(xp, invalid="ignore", divide="ignore"):  # all ignored: NaN, as PyTorch
            return losses.sum() / self.count.astype(x.dtype)

    def backward(self, g):
        p = self.saved[0]  # the probabilities (the logits when fused)
        coef = self.valid.astype(p.dtype)
        if self.reduction == "mean":
            coef *= g / self.count.astype(p.dtype)
        else:
            coef *= g
        if self.kernels is not None:
            return self.kernels.cross_entropy_backward(p, self.t, self.saved[1], coef)
        xp = get_array_module(p)
        gx = xp.empty_like(p)
        chunked(lambda i, s, e: xp.multiply(p[s:e], coef[s:e, None], out=gx[s:e]),
                p.shape[0], p.shape[1], cpu=_cpu(xp))
        gx[self.rows, self.t] -= coef
        return gx


def cross_entropy(logits: Tensor, target, ignore_index: int = -100, reduction: str = "mean"):
    """Cross-entropy of ``logits`` (N, C) against class ids ``target`` (N,), fused.

    Positions whose target equals ``ignore_index`` contribute nothing; 'mean' divides
    by the number of the others (NaN when every target is ignored, as in PyTorch).
    Logits of shape (N, C, d1, ...) take targets (N, d1, ...), with classes on dim 1.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    t = as_array(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold integer class ids, got {t.dtype}")
    x = logits
    if x.ndim == 1:
        x, t = x.unsqueeze(0), t.reshape(1)
    elif x.ndim > 2:
        x = x.movedim(1, -1).reshape(-1, x.shape[1])
        t = t.reshape(-1)
    if t.shape != (x.shape[0],):
        raise ValueError(
            f"cross_entropy: target shape {tuple(as_array(target).shape)} does not match logits "
            f"shape {tuple(logits.shape)}"
        )
    out = CrossEntropy.apply(x, t, ignore_index=ignore_index, reduction=reduction)
    if reduction == "none":
        if logits.ndim == 1:
            return out.reshape(())
        if logits.ndim > 2:
            return out.reshape(as_array(target).shape)
    return out


# ----------------------------------------------------------------------------- normalisation


class LayerNorm(Function):
    def forward(self, x, w, b, nd=1, eps=1e-5):
        xp = get_array_module(x)
        K = kernels_for(xp, "layer_norm")
        self.kernels = K if K is not None and K.layer_norm_supported(x, w, b) else None
        self.has_w, self.has_b, self.nd = w is not None, b is not None, nd
        if self.kernels is not None:
            y, mean, rstd = K.layer_norm_forward(x, w, b, nd, eps)  # one CUDA block per row
            self.save(x, mean, rstd, w)
            return y
        # over rows of the trailing nd dims, one cache-sized chunk of rows at a time
        C = math.prod(x.shape[x.ndim - nd :])
        x2 = _contig(xp, x).reshape(-1, C)
        w1 = None if w is None else w.reshape(C)
        b1 = None if b is None else b.reshape(C)
        xhat, y = xp.empty_like(x2), xp.empty_like(x2)
        rstd = xp.empty((x2.shape[0], 1), dtype=x.dtype)
        eps = x.dtype.type(eps)

        def body(i, s, e):
            xs, xh, ys = x2[s:e], xhat[s:e], y[s:e]
            xp.subtract(xs, xs.mean(axis=1, keepdims=True), out=xh)
            var = xp.einsum("ij,ij->i", xh, xh) / x.dtype.type(C)
            r = rstd[s:e]
            xp.sqrt(var[:, None] + eps, out=r)
            xp.divide(1, r, out=r)
            xh *= r  # x-hat
            if w1 is not None:
                xp.multiply(xh, w1, out=ys)
            else:
                ys[...] = xh
            if b1 is not None:
                ys += b1

        chunked(body, x2.shape[0], C, cpu=_cpu(xp))
        self.save(xhat, rstd, w)
        self.shape = x.shape
        return y.reshape(x.shape)

    def backward(self, g):
        if self.kernels is not None:
            x, mean, rstd, w = self.saved
            return self.kernels.layer_norm_backward(g, x, w, mean, rstd, self.nd, self.has_w,
                                                    self.has_b)
        xhat, rstd, w = self.saved
        xp = get_array_module(xhat)
        n, C = xhat.shape
        g2 = _contig(xp, g).reshape(n, C)
        w1 = None if w is None else w.reshape(C)
        gx = xp.empty_like(g2)
        cpu = _cpu(xp)
        parts = n_chunks(n, C) if cpu else 1
        gw_part = xp.zeros((parts, C), dtype=g.dtype)  # per-chunk sums, added at the end
        gb_part = xp.zeros((parts, C), dtype=g.dtype)

        def body(i, s, e):
            gs, xh, o = g2[s:e], xhat[s:e], gx[s:e]
            xp.multiply(gs, xh, out=o)
            gw_part[i] = o.sum(axis=0)
            gb_part[i] = gs.sum(axis=0)
            if w1 is not None:
                xp.multiply(gs, w1, out=o)  # ∂L/∂x-hat
            else:
                o[...] = gs
            # ∂L/∂x = rstd·(gxh - mean(gxh) - x-hat·mean(gxh·x-hat))
            a = o.mean(axis=1, keepdims=True)
            c = xp.einsum("ij,ij->i", o, xh)[:, None] / g.dtype.type(C)
            o -= a
            o -= xh * c
            o *= rstd[s:e]

        chunked(body, n, C, cpu=cpu)
        wshape = self.shape[len(self.shape) - self.nd :]
        gw = gw_part.sum(axis=0).reshape(wshape) if self.has_w else None
        gb = gb_part.sum(axis=0).reshape(wshape) if self.has_b else None
        return gx.reshape(self.shape), gw, gb


def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims
    (biased variance, as PyTorch)."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.ndim - len(ns) :]) != ns:
        raise ValueError(
            f"layer_norm: normalized_shape {ns} does not match the input's trailing dims "
            f"{tuple(x.shape)}"
        )
    return LayerNorm.apply(x, weight, bias, nd=len(ns), eps=eps)


# ----------------------------------------------------------------------------- activations

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def erf(xp, x):
    """Error function to ~1.2e-7 relative error (NumPy has none; CuPy's is used on GPU).

    Uses the Chebyshev-fitted erfc of Numerical Recipes (2nd ed., section 6.2).
    """
    special = getattr(xp, "_tg_erf", None)
    if special is not None:
        return special(x)
    z = xp.abs(x)
    t = 1 / (1 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    erfc = t * xp.exp(poly)
    return xp.where(x >= 0, 1 - erfc, erfc - 1).astype(x.dtype, copy=False)


class Gelu(Function):
    def forward(self, x, approximate="tanh"):
        xp = get_array_module(x)
        self.approximate = approximate
        K = kernels_for(xp, "gelu")
        self.kernels = K if K is not None and K.gelu_supported(x) else None
        if self.kernels is not None:
            self.save(x)  # backward recomputes tanh / erf from x in the same single pass
            return K.gelu_forward(x, approximate)
        if approximate == "tanh":
            # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), keeping t = tanh(...) for backward
            xc = _contig(xp, x)
            x1, y, t = xc.reshape(-1), xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
            y1, t1 = y.reshape(-1), t.reshape(-1)

            def body(i, s, e):
                xs, u, ys = x1[s:e], t1[s:e], y1[s:e]
                xp.multiply(xs, xs, out=u)
                u *= _GELU_C
                u += 1
                u *= xs
                u *= _SQRT_2_OVER_PI
                xp.tanh(u, out=u)
                xp.add(u, 1, out=ys)
                ys *= xs
                ys *= 0.5

            chunked(body, x1.size, 1, cpu=_cpu(xp))
            self.save(xc, t)
            return y
        cdf = 0.5 * (1 + erf(xp, x * (1 / math.sqrt(2.0))))
        self.save(x, cdf)
        return x * cdf

    def backward(self, g):
        if self.kernels is not None:
            return self.kernels.gelu_backward(g, self.saved[0], self.approximate)
        x, a = self.saved
        xp = get_array_module(x)
        if self.approximate == "tanh":
            # d/dx = 0.5(1+t) + 0.5·x·(1-t²)·√(2/π)·(1 + 3·0.044715·x²)
            x1, t1 = x.reshape(-1), a.reshape(-1)
            g1 = _contig(xp, g).reshape(-1)
            gx = xp.empty(x.shape, x.dtype)
            o1 = gx.reshape(-1)

            def body(i, s, e):
                xs, ts, o = x1[s:e], t1[s:e], o1[s:e]
                b = xp.multiply(ts, ts)
                xp.subtract(1, b, out=b)  # 1 - t²
                xp.multiply(xs, xs, out=o)
                o *= 3 * _GELU_C
                o += 1
                o *= xs
                o *= 0.5 * _SQRT_2_OVER_PI
                o *= b
                xp.add(ts, 1, out=b)
                b *= 0.5
                o += b
                o *= g1[s:e]

            chunked(body, x1.size, 1, cpu=_cpu(xp))
            return gx
        # d/dx x·Φ(x) = Φ(x) + x·φ(x)
        pdf = xp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
        return g * (a + x * pdf)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: exact x·Φ(x) ('none') or the tanh approximation used by GPT-2 ('tanh')."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(x, approximate=approximate)


def relu(x: Tensor) -> Tensor:
    return x.relu()


class Dropout(Function):
    def forward(self, x, p=0.5):
        keep = rng(device_of(x)).random(x.shape, dtype=x.dtype) >= p
        self.mask = keep.astype(x.dtype) * x.dtype.type(1 / (1 - p))
        return x * self.mask

    def backward(self, g):
        return g * self.mask


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (when training)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    return Dropout.apply(x, p=p)


# ----------------------------------------------------------------------------- layers


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias with weight of shape (out, in), as one 2-D GEMM over all rows."""
    return Linear.apply(x, weight, bias)


class Embedding(Function):
    def forward(self, w, idx):
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= w.shape[0]):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise IndexError(f"embedding: index {bad} is out of range for {w.shape[0]} rows")
        self.idx, self.wshape = idx, w.shape
        return w[idx]

    def backward(self, g):
        xp = get_array_module(g)
        K = kernels_for(xp, "embedding")
        if K is not None and g.dtype == "float32":
            return K.embedding_backward(self.idx, g, self.wshape), None  # deterministic sums
        gw = xp.zeros(self.wshape, dtype=g.dtype)
        idx = self.idx.reshape(-1)
        g2 = g.reshape(-1, self.wshape[1])
        if xp.__name__ == "numpy" and idx.size:
            # sort rows by index and sum runs: much faster than add.at on CPU
            order = xp.argsort(idx, kind="stable")
            sidx = idx[order]
            first = xp.concatenate((xp.ones(1, dtype=bool), sidx[1:] != sidx[:-1]))
            starts = xp.flatnonzero(first)
            gw[sidx[starts]] = xp.add.reduceat(g2[order], starts, axis=0)
        else:
            xp.add.at(gw, idx, g2)
        return gw, None


def embedding(idx, weight: Tensor) -> Tensor:
    """Rows of ``weight`` picked by integer ``idx``; repeated ids add up in the gradient."""
    idx = as_array(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    return Embedding.apply(weight, idx)


# ----------------------------------------------------------------------------- attention


def causal_mask(xp, L: int, S: int):
    """Boolean (L, S) mask, True where query i may attend key j.

    Aligned to the bottom right (query i sits at position S - L + i), which is the
    top-left tril when L == S and the right mask for a query block after a KV cache.
    """
    return xp.tril(xp.ones((L, S), dtype=bool), k=S - L)


class Attention(Function):
    """softmax(q·kᵀ·scale + mask)·v with its own backward (scores are kept, not re-derived)."""

    def forward(self, q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        xp = get_array_module(q, k, v)
        L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
        if k.shape[-1] != E or v.shape[-2] != S:
            raise ValueError(
                f"scaled_dot_product_attention: q {tuple(q.shape)}, k {tuple(k.shape)} and "
                f"v {tuple(v.shape)} do not line up"
            )
        self.scale = q.dtype.type(1 / math.sqrt(E) if scale is None else scale)
        self.shapes = (q.shape, k.shape, v.shape)
        K = kernels_for(xp, "attention")
        self.kernels = K if K is not None and K.flash_supported(q, k, v, mask, dropout_p) else None
        if self.kernels is not None:
            # tiled online softmax: keeps the logsumexp per query, never the (L, S) scores
            o, lse = K.flash_attention_forward(q, k, v, is_causal, float(self.scale))
            self.is_causal = is_causal
            self.save(q, k, v, o, lse)
            return o
        s = matmul(q, k.swapaxes(-1, -2))
        s *= self.scale
        allowed = causal_mask(xp, L, S) if is_causal else None
        if mask is not None:
            if mask.dtype == bool:
                allowed = mask if allowed is None else (allowed & mask)
            else:
                s += mask
        if allowed is not None:
            xp.copyto(s, q.dtype.type(-xp.inf), where=~allowed)
        if allowed is None and mask is None:
            _softmax_rows(xp, _rows(s), _rows(s), _cpu(xp))  # no row can be fully masked
        else:
            m = s.max(axis=-1, keepdims=True)
            # a query with every key masked gets zero output (not NaN)
            m = xp.where(xp.isfinite(m), m, q.dtype.type(0))
            s -= m
            xp.exp(s, out=s)
            den = s.sum(axis=-1, keepdims=True)
            den[den == 0] = 1
            s /= den
        self.drop = None
        if dropout_p > 0.0:
            keep = rng(device_of(q)).random(s.shape, dtype=s.dtype) >= dropout_p
            self.drop = keep.astype(s.dtype) * s.dtype.type(1 / (1 - dropout_p))
        self.save(q, k, v, s)
        return matmul(s * self.drop if self.drop is not None else s, v)

    def backward(self, g):
        sq, sk, sv = self.shapes
        if self.kernels is not None:
            q, k, v, o, lse = self.saved
            gq, gk, gv = self.kernels.flash_attention_backward(
                q, k, v, o, lse, g, self.is_causal, float(self.scale)
            )
            return unbroadcast(gq, sq), unbroadcast(gk, sk), unbroadcast(gv, sv), None
        q, k, v, p = self.saved
        xp = get_array_module(p)
        pd = p * self.drop if self.drop is not None else p
        gv = matmul(pd.swapaxes(-1, -2), g)
        gp = matmul(g, v.swapaxes(-1, -2))
        if self.drop is not None:
            gp *= self.drop
        # softmax backward, in place: gs = p * (gp - sum(gp * p)) * scale
        _softmax_rows_backward(xp, _rows(gp), _rows(p), _rows(gp), _cpu(xp), self.scale)
        gq = matmul(gp, k)
        gk = matmul(gp.swapaxes(-1, -2), q)
        return unbroadcast(gq, sq), unbroadcast(gk, sk), unbroadcast(gv, sv), None


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask=None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None,
) -> Tensor:
    """Attention over (..., L, E) queries and (..., S, E) keys/values as one fused op.

    ``attn_mask`` is boolean (True = may attend, as PyTorch) or additive float, and
    broadcasts to (..., L, S). ``is_causal`` masks future keys (bottom-right aligned when
    L != S). Queries whose keys are all masked output zeros.
    """
    m = None if attn_mask is None else as_array(attn_mask)
    return Attention.apply(q, k, v, m, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
