"""Fused CUDA kernels, each the twin of a reference op in ``ops/nn.py`` / ``optim.py``.

These are the raw array functions; ``tensorgrad/cuda/ops.py`` wraps them as kernels
registered for the 'cuda' device, so they run only on CuPy arrays, and
``tensorgrad.kernels.set_enabled(False)`` runs the reference ops on CuPy instead.

    gelu_forward / gelu_backward          ElementwiseKernel, tanh and exact-erf GELU
    layer_norm_forward / _backward        RawKernel, one block per row (+ column partials)
    softmax_forward                       RawKernel, one block per row (online max/sum-exp)
    cross_entropy_forward / _backward     per-row logsumexp and loss; grad = (p - onehot)·coef
    embedding_backward                    sorted ids, one block per id: deterministic sums
    adamw_update                          ElementwiseKernel, the whole update in one pass
    (flash attention is in flash.py)
    matmul                                cuBLAS GEMM with a TF32 or BF16 compute type

Everything is float32 (callers fall back to the NumPy-style path otherwise). CuPy comes
from ``devices.require_cupy()``; kernels compile on first use and are cached. The CUDA
sources are module constants so that tests can compile them with nvcc and run them on the
CPU through a small emulation shim.

Imports: math, numpy, ..devices, ..ops.
"""

from __future__ import annotations

import math

import numpy as np  # host-side scalars and shapes only, never tensor data

from ..devices import require_cublas, require_cupy
from ..ops.nn import GELU_C, SQRT_2_OVER_PI

_cache: dict = {}


def _float32(*arrays) -> bool:
    return all(a is None or a.dtype == np.float32 for a in arrays)


# ----------------------------------------------------------------------------- CUDA sources

COMMON_SRC = r"""
#define TG_FULL 0xffffffffu
#define TG_INF __int_as_float(0x7f800000)
#define TG_LOG2E 1.4426950408889634f
#define TG_LN2 0.6931471805599453f

// Sum over the block (blockDim a multiple of 32); every thread gets the same total.
__device__ __forceinline__ float tg_block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();  // red may still be read by the previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < nw; ++w) t += red[w];  // same order everywhere: same bits
    return t;
}

// Online softmax statistics: running max m and sum s of exp(x - m).
__device__ __forceinline__ void tg_ms_add(float& m, float& s, float x) {
    if (x > m) { s = s * expf(m - x) + 1.f; m = x; }
    else if (x != -TG_INF) s += expf(x - m);  // NaN propagates through s
}

__device__ __forceinline__ void tg_ms_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -TG_INF) { s = s + s2; m = mn; return; }
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

// (max, sum-exp) over the block; every thread gets the same pair.
__device__ __forceinline__ void tg_block_ms(float& m, float& s, float* red_m, float* red_s) {
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(TG_FULL, m, o), s2 = __shfl_xor_sync(TG_FULL, s, o);
        tg_ms_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
    __syncthreads();
    m = -TG_INF; s = 0.f;
    for (int w = 0; w < nw; ++w) tg_ms_merge(m, s, red_m[w], red_s[w]);
}
"""

ROWS_SRC = r"""
// ---- layer norm: one block per row of x (N, C)
extern "C" __global__ void tg_ln_forward(
    const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
    float* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
    const int C, const float eps, const int has_w, const int has_b)
{
    __shared__ float red[32];
    const long long row = blockIdx.x;
    const float* xr = x + row * C;
    float* yr = y + row * C;
    float acc = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) acc += xr[c];
    const float mu = tg_block_sum(acc, red) / C;
    acc = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) { const float d = xr[c] - mu; acc += d * d; }
    const float var = tg_block_sum(acc, red) / C;
    const float rs = 1.f / sqrtf(var + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = (xr[c] - mu) * rs;
        if (has_w) v *= w[c];
        if (has_b) v += b[c];
        yr[c] = v;
    }
    if (threadIdx.x == 0) { mean[row] = mu; rstd[row] = rs; }
}

// gx = rstd * (gxh - mean(gxh) - xhat * mean(gxh * xhat)), gxh = g * w
extern "C" __global__ void tg_ln_backward_x(
    const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ w,
    const float* __restrict__ mean, const float* __restrict__ rstd, float* __restrict__ gx,
    const int C, const int has_w)
{
    __shared__ float red[32];
    const long long row = blockIdx.x;
    const float* gr = g + row * C;
    const float* xr = x + row * C;
    const float mu = mean[row], rs = rstd[row];
    float a = 0.f, bsum = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float gh = has_w ? gr[c] * w[c] : gr[c];
        a += gh;
        bsum += gh * (xr[c] - mu) * rs;
    }
    a = tg_block_sum(a, red) / C;
    bsum = tg_block_sum(bsum, red) / C;
    float* gxr = gx + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float gh = has_w ? gr[c] * w[c] : gr[c];
        gxr[c] = (gh - a - (xr[c] - mu) * rs * bsum) * rs;
    }
}

// Column partial sums of g * xhat (pw) and g (pb) over blocks of rows: block (32, 8),
// grid (ceil(C / 32), ceil(N / rows)); the caller adds the partials up.
extern "C" __global__ void tg_ln_backward_params(
    const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ rstd, float* __restrict__ pw, float* __restrict__ pb,
    const int N, const int C, const int rows)
{
    __shared__ float sw[8][33];
    __shared__ float sb[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows;
    const int r1 = min(N, r0 + rows);
    float aw = 0.f, ab = 0.f;
    if (col < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const long long i = (long long)r * C + col;
            aw += g[i] * (x[i] - mean[r]) * rstd[r];
            ab += g[i];
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        float tw = 0.f, tb = 0.f;
        for (int k = 0; k < 8; ++k) { tw += sw[k][threadIdx.x]; tb += sb[k][threadIdx.x]; }
        pw[(long long)blockIdx.y * C + col] = tw;
        pb[(long long)blockIdx.y * C + col] = tb;
    }
}

// ---- softmax over the last axis: one block per row
extern "C" __global__ void tg_softmax_forward(
    const float* __restrict__ x, float* __restrict__ y, const int C)
{
    __shared__ float red_m[32];
    __shared__ float red_s[32];
    const long long row = blockIdx.x;
    const float* xr = x + row * C;
    float m = -TG_INF, s = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) tg_ms_add(m, s, xr[c]);
    tg_block_ms(m, s, red_m, red_s);
    float* yr = y + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = expf(xr[c] - m) / s;
}

// ---- cross-entropy: lse = logsumexp(x_row), loss = lse - x[t]; one block per row
extern "C" __global__ void tg_ce_forward(
    const float* __restrict__ x, const long long* __restrict__ t, float* __restrict__ loss,
    float* __restrict__ lse, const int C)
{
    __shared__ float red_m[32];
    __shared__ float red_s[32];
    const long long row = blockIdx.x;
    const float* xr = x + row * C;
    float m = -TG_INF, s = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) tg_ms_add(m, s, xr[c]);
    tg_block_ms(m, s, red_m, red_s);
    if (threadIdx.x == 0) {
        const float l = m + logf(s);
        lse[row] = l;
        loss[row] = l - xr[t[row]];
    }
}

// ---- embedding backward: ids sorted (stable), one block per distinct id sums its rows in
// their original order, so the result does not depend on scheduling
extern "C" __global__ void tg_embedding_backward(
    const long long* __restrict__ order, const long long* __restrict__ sorted_ids,
    const long long* __restrict__ starts, const int nruns, const long long n,
    const float* __restrict__ g, float* __restrict__ gw, const int C)
{
    const int run = blockIdx.x;
    const long long j0 = starts[run];
    const long long j1 = run + 1 < nruns ? starts[run + 1] : n;
    float* out = gw + sorted_ids[j0] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.f;
        for (long long j = j0; j < j1; ++j) acc += g[order[j] * C + c];
        out[c] = acc;
    }
}
"""


def rows_source() -> str:
    return COMMON_SRC + ROWS_SRC


_K, _C = f"{SQRT_2_OVER_PI!r}f", f"{GELU_C!r}f"  # GELU's constants as CUDA float literals

# name -> (in_params, out_params, operation) of each cupy.ElementwiseKernel
ELEMENTWISE = {
    "tg_gelu_tanh_fwd": (
        "float32 x",
        "float32 y",
        (f"const float u = {_K} * (x + {_C} * x * x * x);y = 0.5f * x * (1.f + tanhf(u));"),
    ),
    "tg_gelu_tanh_bwd": (
        "float32 g, float32 x",
        "float32 gx",
        (
            "const float x2 = x * x;"
            f"const float t = tanhf({_K} * x * (1.f + {_C} * x2));"
            "gx = g * (0.5f * (1.f + t)"
            f" + 0.5f * x * (1.f - t * t) * {_K} * (1.f + 3.f * {_C} * x2));"
        ),
    ),
    "tg_gelu_erf_fwd": (
        "float32 x",
        "float32 y",
        "y = 0.5f * x * (1.f + erff(x * 0.7071067811865476f));",
    ),
    "tg_gelu_erf_bwd": (
        "float32 g, float32 x",
        "float32 gx",
        (
            "const float cdf = 0.5f * (1.f + erff(x * 0.7071067811865476f));"
            "gx = g * (cdf + x * expf(-0.5f * x * x) * 0.3989422804014327f);"
        ),
    ),
    # gx = (softmax(x) - onehot(t)) * coef, lse / t / coef broadcast per row
    "tg_ce_backward": (
        "float32 x, float32 lse, float32 coef, int64 t, int64 ncls",
        "float32 gx",
        "gx = (expf(x - lse) - ((long long)(i % ncls) == t ? 1.f : 0.f)) * coef;",
    ),
    # the order of gpt/optim.adamw_update, each float32 op rounded as NumPy rounds it
    "tg_adamw": (
        (
            "float32 g, float32 decay, float32 b1, float32 omb1, float32 b2, float32 omb2, "
            "float32 bc2, float32 eps, float32 step"
        ),
        "float32 x, float32 m, float32 v",
        (
            "x = __fmul_rn(x, decay);"
            "m = __fadd_rn(__fmul_rn(m, b1), __fmul_rn(g, omb1));"
            "v = __fadd_rn(__fmul_rn(v, b2), __fmul_rn(__fmul_rn(g, g), omb2));"
            "const float d = __fadd_rn(__fdiv_rn(sqrtf(v), bc2), eps);"
            "x = __fsub_rn(x, __fmul_rn(__fdiv_rn(m, d), step));"
        ),
    ),
}


# ----------------------------------------------------------------------------- compilation


def _elementwise(name: str):
    k = _cache.get(name)
    if k is None:
        cp = require_cupy()
        ins, outs, op = ELEMENTWISE[name]
        k = _cache[name] = cp.ElementwiseKernel(ins, outs, op, name)
    return k


def _raw(name: str):
    """A function of the RawModule built from rows_source()."""
    mod = _cache.get("rows")
    if mod is None:
        cp = require_cupy()
        mod = _cache["rows"] = cp.RawModule(code=rows_source())
    return mod.get_function(name)


def _i32(v):
    return np.int32(v)


def _row_threads(C: int) -> int:
    """Threads of a one-block-per-row kernel: a few elements each, a multiple of 32."""
    return 32 if C <= 256 else 128 if C <= 2048 else 256 if C <= 8192 else 512


LN_ROWS_PER_BLOCK = 256  # rows summed by one block of tg_ln_backward_params


# ----------------------------------------------------------------------------- GELU


def gelu_supported(x) -> bool:
    return _float32(x)


def gelu_forward(x, approximate: str):
    return _elementwise("tg_gelu_tanh_fwd" if approximate == "tanh" else "tg_gelu_erf_fwd")(x)


def gelu_backward(g, x, approximate: str):
    name = "tg_gelu_tanh_bwd" if approximate == "tanh" else "tg_gelu_erf_bwd"
    return _elementwise(name)(g, x)


# ----------------------------------------------------------------------------- layer norm


def layer_norm_supported(x, w, b) -> bool:
    return _float32(x, w, b) and x.size > 0


def layer_norm_forward(x, w, b, nd: int, eps: float):
    """Layer norm over the trailing ``nd`` dims of float32 x -> (y, mean, rstd) per row."""
    cp = require_cupy()
    C = math.prod(x.shape[x.ndim - nd :])
    x2 = cp.ascontiguousarray(x).reshape(-1, C)
    N = x2.shape[0]
    y, mean, rstd = cp.empty_like(x2), cp.empty(N, cp.float32), cp.empty(N, cp.float32)
    wa = cp.ascontiguousarray(w).reshape(-1) if w is not None else x2  # x2: never read
    ba = cp.ascontiguousarray(b).reshape(-1) if b is not None else x2
    _raw("tg_ln_forward")(
        (N,),
        (_row_threads(C),),
        (
            x2,
            wa,
            ba,
            y,
            mean,
            rstd,
            _i32(C),
            np.float32(eps),
            _i32(w is not None),
            _i32(b is not None),
        ),
    )
    return y.reshape(x.shape), mean, rstd


def layer_norm_backward(g, x, w, mean, rstd, nd: int, need_w: bool, need_b: bool):
    """Gradients of layer_norm_forward: gx, and gw / gb of the normalized shape (or None)."""
    cp = require_cupy()
    shape = x.shape[x.ndim - nd :]
    C = math.prod(shape)
    N = x.size // C
    x2 = cp.ascontiguousarray(x).reshape(N, C)
    g2 = cp.ascontiguousarray(g, dtype=cp.float32).reshape(N, C)
    gx = cp.empty_like(x2)
    wa = cp.ascontiguousarray(w).reshape(-1) if w is not None else x2
    _raw("tg_ln_backward_x")(
        (N,), (_row_threads(C),), (g2, x2, wa, mean, rstd, gx, _i32(C), _i32(w is not None))
    )
    gw = gb = None
    if need_w or need_b:
        rows = LN_ROWS_PER_BLOCK
        nb = -(-N // rows)
        pw, pb = cp.empty((nb, C), cp.float32), cp.empty((nb, C), cp.float32)
        _raw("tg_ln_backward_params")(
            (-(-C // 32), nb), (32, 8), (g2, x2, mean, rstd, pw, pb, _i32(N), _i32(C), _i32(rows))
        )
        gw = pw.sum(axis=0).reshape(shape) if need_w else None
        gb = pb.sum(axis=0).reshape(shape) if need_b else None
    return gx.reshape(x.shape), gw, gb


# ----------------------------------------------------------------------------- softmax family


def softmax_supported(x, dim) -> bool:
    return _float32(x) and x.ndim > 0 and x.size > 0 and dim in (-1, x.ndim - 1)


def softmax_forward(x):
    """Softmax over the last axis of a float32 array."""
    cp = require_cupy()
    xc = cp.ascontiguousarray(x)
    C = xc.shape[-1]
    y = cp.empty_like(xc)
    if xc.size:
        _raw("tg_softmax_forward")((xc.size // C,), (_row_threads(C),), (xc, y, _i32(C)))
    return y


def cross_entropy_supported(x) -> bool:
    return _float32(x) and x.size > 0


def cross_entropy_forward(x, t):
    """x (N, C) float32 logits, t (N,) int64 class ids in range -> losses (N,), lse (N,)."""
    cp = require_cupy()
    x = cp.ascontiguousarray(x)
    N, C = x.shape
    t = cp.ascontiguousarray(t, dtype=cp.int64)
    loss, lse = cp.empty(N, cp.float32), cp.empty(N, cp.float32)
    _raw("tg_ce_forward")((N,), (_row_threads(C),), (x, t, loss, lse, _i32(C)))
    return loss, lse


def cross_entropy_backward(x, t, lse, coef):
    """(softmax(x) - onehot(t)) * coef[:, None], written in one pass over x."""
    cp = require_cupy()
    t = t.astype(cp.int64, copy=False)
    coef = coef.astype(cp.float32, copy=False)
    return _elementwise("tg_ce_backward")(
        x, lse[:, None], coef[:, None], t[:, None], np.int64(x.shape[1])
    )


# ----------------------------------------------------------------------------- embedding


def embedding_backward(idx, g, wshape):
    """Rows of g (idx.shape + (C,)) added into a zero (V, C) array at idx, deterministically."""
    cp = require_cupy()
    gw = cp.zeros(wshape, cp.float32)
    ids = idx.reshape(-1).astype(cp.int64, copy=False)
    n, C = ids.size, wshape[1]
    if n == 0:
        return gw
    order = cp.argsort(ids)
    sids = ids[order]
    first = cp.ones(n, dtype=bool)
    first[1:] = sids[1:] != sids[:-1]
    starts = cp.flatnonzero(first)
    g2 = cp.ascontiguousarray(g.reshape(n, C), dtype=cp.float32)
    _raw("tg_embedding_backward")(
        (starts.size,),
        (128,),
        (order, sids, starts, _i32(starts.size), np.int64(n), g2, gw, _i32(C)),
    )
    return gw


# ----------------------------------------------------------------------------- AdamW


def adamw_update(x, g, m, v, *, lr, b1, b2, eps, wd, step) -> None:
    """gpt.optim.adamw_update in one elementwise pass (x, m, v float32, updated in place)."""
    f = np.float32
    decay = 1 - lr * wd if wd else 1.0
    _elementwise("tg_adamw")(
        g,
        f(decay),
        f(b1),
        f(1 - b1),
        f(b2),
        f(1 - b2),
        f(math.sqrt(1 - b2**step)),
        f(eps),
        f(lr / (1 - b1**step)),
        x,
        m,
        v,
    )


# ----------------------------------------------------------------------------- matmul

CUBLAS_COMPUTE = {"tf32": 77, "bf16": 75}  # CUBLAS_COMPUTE_32F_FAST_TF32 / _FAST_16BF
CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 0, 0, 1, 99


def _batch_stride(shape, strides):
    """One element stride that walks all batch dims in order, or None when there is none."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return 0
    base, size = dims[-1][1], dims[-1][0]
    for n, s in reversed(dims[:-1]):
        if s != base * size:
            return None
        size *= n
    return base


def _operand(shape, strides):
    """How cuBLAS (column-major) reads the last two dims: ('row'|'col', ld) or None."""
    r, c = shape[-2:]
    sr, sc = strides[-2:]
    if sc == 1 and sr >= max(1, c):
        return "row", sr
    if sr == 1 and sc >= max(1, r):
        return "col", sc
    return None


def gemm_plan(x_shape, x_strides, y_shape, y_strides):
    """cublasGemmStridedBatchedEx arguments for row-major C = x @ y, or None.

    Shapes are (..., M, K) and (..., K, N) with broadcast batch dims; strides in elements.
    cuBLAS is column-major, so it computes Cᵀ = yᵀ·xᵀ: a row-major operand is already the
    transpose it needs (op N), a column-major one (e.g. w.T) takes op T.
    """
    M, K = x_shape[-2:]
    N = y_shape[-1]
    batch = tuple(np.broadcast_shapes(tuple(x_shape[:-2]), tuple(y_shape[:-2])))
    plan = {
        "m": N,
        "n": M,
        "k": K,
        "ldc": N,
        "stride_c": M * N,
        "batch": batch,
        "count": math.prod(batch),
    }
    for name, shape, strides in (("a", y_shape, y_strides), ("b", x_shape, x_strides)):
        pad = len(batch) - (len(shape) - 2)
        bshape = (1,) * pad + tuple(shape[:-2])
        bstrides = (0,) * pad + tuple(strides[:-2])
        # a size-1 batch dim is broadcast: it repeats with stride 0
        bstrides = tuple(0 if n == 1 else s for n, s in zip(bshape, bstrides))
        op = _operand(shape, strides)
        bs = _batch_stride(batch, bstrides)
        if op is None or bs is None:
            return None
        plan["op_" + name] = CUBLAS_OP_N if op[0] == "row" else CUBLAS_OP_T
        plan["ld" + name] = op[1]
        plan["stride_" + name] = bs
    return plan


def _elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def matmul(x, y, precision: str):
    """x @ y for float32 CuPy arrays through cuBLAS with a TF32 or BF16 compute type
    (float32 in and out: only the products inside the GEMM are rounded)."""
    cp = require_cupy()
    if precision not in CUBLAS_COMPUTE or x.ndim < 2 or y.ndim < 2 or not _float32(x, y):
        return x @ y
    M, K = x.shape[-2:]
    if y.shape[-2] != K:
        return x @ y  # let CuPy raise its error
    plan = None
    for _ in range(2):
        plan = gemm_plan(x.shape, _elem_strides(x), y.shape, _elem_strides(y))
        if plan is not None:
            break
        x, y = cp.ascontiguousarray(x), cp.ascontiguousarray(y)
    if plan is None:
        return x @ y  # batch dims that no single stride walks: CuPy's own matmul
    out = cp.empty(plan["batch"] + (M, y.shape[-1]), cp.float32)
    if out.size == 0 or K == 0:
        out.fill(0)
        return out
    cublas = require_cublas()
    alpha, beta = np.ones((), np.float32), np.zeros((), np.float32)
    cublas.gemmStridedBatchedEx(
        cp.cuda.device.get_cublas_handle(),
        plan["op_a"],
        plan["op_b"],
        plan["m"],
        plan["n"],
        plan["k"],
        alpha.ctypes.data,
        y.data.ptr,
        CUDA_R_32F,
        plan["lda"],
        plan["stride_a"],
        x.data.ptr,
        CUDA_R_32F,
        plan["ldb"],
        plan["stride_b"],
        beta.ctypes.data,
        out.data.ptr,
        CUDA_R_32F,
        plan["ldc"],
        plan["stride_c"],
        plan["count"],
        CUBLAS_COMPUTE[precision],
        CUBLAS_GEMM_DEFAULT_TENSOR_OP,
    )
    return out
