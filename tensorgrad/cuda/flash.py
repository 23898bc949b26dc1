"""Flash attention on the GPU: tiled online softmax in CUDA, the twin of functional.attention.

    flash_supported            whether the kernels take this call (float32, no mask, no dropout,
                               head size <= 128); otherwise the batched-GEMM path runs
    flash_attention_forward    o = softmax(q kᵀ·scale [causal]) v, and the logsumexp per row
    flash_attention_backward   gq, gk, gv, with the probabilities recomputed from that logsumexp

Only the logsumexp per query row is kept: the (L, S) scores never reach global memory. The
backward pass writes every gradient element once (no atomics), so it is deterministic.
``tensorgrad/cuda/ops.py`` registers them as the 'attention' kernel for the 'cuda' device;
the shared CUDA helpers (COMMON_SRC) live in ``kernels.py``. CuPy comes from ``devices.require_cupy()``;
a module compiles on first use for each padded head size and is cached.

Imports: math, numpy, .kernels, ..devices.
"""

from __future__ import annotations

import math

import numpy as np  # host-side scalars and shapes only, never tensor data

from ..devices import require_cupy
from .kernels import COMMON_SRC

_cache: dict = {}
_i32 = np.int32  # the kernels' int parameters

# Flash attention. A block of NT = 128 threads is TR = 16 row groups x TC = 8 column groups;
# the TC threads of a row group are consecutive lanes of one warp, so row statistics are
# reduced with shuffles. Tiles are padded to HD (head size rounded up to 8) and sized so that
# static shared memory stays under 48 KiB. Scores are kept in log2 units (exp2f).
FLASH_SRC = r"""
#define NT 128
#define TC 8
#define TR 16
#define DPT (HD / TC)
#define FRPT (FWD_BR / TR)
#define FCPT (FWD_BC / TC)
#define BRPT (BWD_BR / TR)
#define BCPT (BWD_BC / TC)
#define KPT (BWD_BC / TR)
#define QPT (BWD_BR / TC)

__device__ __forceinline__ float tg_group_max(float v) {
    for (int o = TC / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TG_FULL, v, o));
    return v;
}

__device__ __forceinline__ float tg_group_sum(float v) {
    for (int o = TC / 2; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
    return v;
}

// The two products of a backward tile in one pass over e: x = A Bᵀ and y = A2 B2ᵀ for this
// thread's R rows (row group rg) by C columns (column group cg) of shared-memory tiles.
template <int R, int C>
__device__ __forceinline__ void tg_two_products(
    float (&x)[R][C], float (&y)[R][C], const float (*A)[HD + 1], const float (*A2)[HD + 1],
    const float (*B)[HD + 1], const float (*B2)[HD + 1], const int rg, const int cg)
{
    #pragma unroll
    for (int i = 0; i < R; ++i)
        #pragma unroll
        for (int j = 0; j < C; ++j) { x[i][j] = 0.f; y[i][j] = 0.f; }
    #pragma unroll 4
    for (int e = 0; e < HD; ++e) {
        float ar[R], a2r[R], bc[C], b2c[C];
        #pragma unroll
        for (int i = 0; i < R; ++i) { ar[i] = A[rg * R + i][e]; a2r[i] = A2[rg * R + i][e]; }
        #pragma unroll
        for (int j = 0; j < C; ++j) { bc[j] = B[cg + TC * j][e]; b2c[j] = B2[cg + TC * j][e]; }
        #pragma unroll
        for (int i = 0; i < R; ++i)
            #pragma unroll
            for (int j = 0; j < C; ++j) {
                x[i][j] = fmaf(ar[i], bc[j], x[i][j]);
                y[i][j] = fmaf(a2r[i], b2c[j], y[i][j]);
            }
    }
}

// o = softmax(q k^T * scale) v per (batch, head); lse = logsumexp of each query's scores
// (+inf for a query that sees no key, whose output is 0). q, k, v: [b, h, t, e] with
// element strides (sb, sh, st) and unit stride on e; o: contiguous [B*H, L, E].
extern "C" __global__ void __launch_bounds__(NT) tg_flash_fwd(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    float* __restrict__ o, float* __restrict__ lse,
    const int H, const int L, const int S, const int E,
    const long long qsb, const long long qsh, const long long qst,
    const long long ksb, const long long ksh, const long long kst,
    const long long vsb, const long long vsh, const long long vst,
    const float scale, const int causal)
{
    __shared__ float Qs[FWD_BR][HD + 1];
    __shared__ float Ks[FWD_BC][HD + 1];
    __shared__ float Vs[FWD_BC][HD + 1];
    __shared__ float Ps[FWD_BR][FWD_BC + 1];
    const int tid = threadIdx.x, rg = tid / TC, cg = tid % TC;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FWD_BR;  // longest causal rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const float* qb = q + b * qsb + h * qsh;
    const float* kb = k + b * ksb + h * ksh;
    const float* vb = v + b * vsb + h * vsh;
    const int off = S - L;  // causal: key j is visible to query i when j <= i + off
    const float sl2 = scale * TG_LOG2E;

    for (int idx = tid; idx < FWD_BR * HD; idx += NT) {
        const int r = idx / HD, e = idx % HD, i = q0 + r;
        Qs[r][e] = (i < L && e < E) ? qb[(long long)i * qst + e] : 0.f;
    }
    float m[FRPT], l[FRPT], acc[FRPT][DPT];
    #pragma unroll
    for (int i = 0; i < FRPT; ++i) {
        m[i] = -TG_INF; l[i] = 0.f;
        #pragma unroll
        for (int d = 0; d < DPT; ++d) acc[i][d] = 0.f;
    }
    const int kv_end = causal ? min(S, q0 + FWD_BR + off) : S;
    for (int k0 = 0; k0 < kv_end; k0 += FWD_BC) {
        __syncthreads();  // the previous tile is used up (and Qs is written)
        for (int idx = tid; idx < FWD_BC * HD; idx += NT) {
            const int r = idx / HD, e = idx % HD, j = k0 + r;
            const bool in = j < S && e < E;
            Ks[r][e] = in ? kb[(long long)j * kst + e] : 0.f;
            Vs[r][e] = in ? vb[(long long)j * vst + e] : 0.f;
        }
        __syncthreads();
        float s[FRPT][FCPT];
        #pragma unroll
        for (int i = 0; i < FRPT; ++i)
            #pragma unroll
            for (int j = 0; j < FCPT; ++j) s[i][j] = 0.f;
        #pragma unroll 8
        for (int e = 0; e < HD; ++e) {
            float qr[FRPT], kc[FCPT];
            #pragma unroll
            for (int i = 0; i < FRPT; ++i) qr[i] = Qs[rg * FRPT + i][e];
            #pragma unroll
            for (int j = 0; j < FCPT; ++j) kc[j] = Ks[cg + TC * j][e];
            #pragma unroll
            for (int i = 0; i < FRPT; ++i)
                #pragma unroll
                for (int j = 0; j < FCPT; ++j) s[i][j] = fmaf(qr[i], kc[j], s[i][j]);
        }
        #pragma unroll
        for (int i = 0; i < FRPT; ++i) {
            const int qi = q0 + rg * FRPT + i;
            float mx = -TG_INF;
            #pragma unroll
            for (int j = 0; j < FCPT; ++j) {
                const int kj = k0 + cg + TC * j;
                const bool ok = kj < S && (!causal || kj <= qi + off);
                s[i][j] = ok ? s[i][j] * sl2 : -TG_INF;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = tg_group_max(mx);
            const float mnew = fmaxf(m[i], mx);
            const float mref = mnew == -TG_INF ? 0.f : mnew;
            const float alpha = exp2f(m[i] - mref);
            float rs = 0.f;
            #pragma unroll
            for (int j = 0; j < FCPT; ++j) {
                const float p = exp2f(s[i][j] - mref);
                Ps[rg * FRPT + i][cg + TC * j] = p;
                rs += p;
            }
            rs = tg_group_sum(rs);
            l[i] = l[i] * alpha + rs;
            m[i] = mnew;
            #pragma unroll
            for (int d = 0; d < DPT; ++d) acc[i][d] *= alpha;
        }
        __syncthreads();
        for (int c = 0; c < FWD_BC; ++c) {
            float vr[DPT];
            #pragma unroll
            for (int d = 0; d < DPT; ++d) vr[d] = Vs[c][cg + TC * d];
            #pragma unroll
            for (int i = 0; i < FRPT; ++i) {
                const float p = Ps[rg * FRPT + i][c];
                #pragma unroll
                for (int d = 0; d < DPT; ++d) acc[i][d] = fmaf(p, vr[d], acc[i][d]);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < FRPT; ++i) {
        const int qi = q0 + rg * FRPT + i;
        if (qi < L) {
            const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
            float* orow = o + ((long long)bh * L + qi) * E;
            #pragma unroll
            for (int d = 0; d < DPT; ++d) {
                const int e = cg + TC * d;
                if (e < E) orow[e] = acc[i][d] * inv;
            }
            if (cg == 0)
                lse[(long long)bh * L + qi] = l[i] > 0.f ? (m[i] + log2f(l[i])) * TG_LN2 : TG_INF;
        }
    }
}

// dq = scale * sum_j dS_ij k_j with dS = P * (dP - D), P recomputed from lse; one block per
// query tile. go, lse, D, gq are contiguous [B*H, L, (E)].
extern "C" __global__ void __launch_bounds__(NT) tg_flash_bwd_dq(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ go, const float* __restrict__ lse, const float* __restrict__ D,
    float* __restrict__ gq,
    const int H, const int L, const int S, const int E,
    const long long qsb, const long long qsh, const long long qst,
    const long long ksb, const long long ksh, const long long kst,
    const long long vsb, const long long vsh, const long long vst,
    const float scale, const int causal)
{
    __shared__ float Qs[BWD_BR][HD + 1];
    __shared__ float dOs[BWD_BR][HD + 1];
    __shared__ float Ks[BWD_BC][HD + 1];
    __shared__ float Vs[BWD_BC][HD + 1];
    __shared__ float dSs[BWD_BR][BWD_BC + 1];
    const int tid = threadIdx.x, rg = tid / TC, cg = tid % TC;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BWD_BR;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const float* qb = q + b * qsb + h * qsh;
    const float* kb = k + b * ksb + h * ksh;
    const float* vb = v + b * vsb + h * vsh;
    const float* gob = go + (long long)bh * L * E;
    const int off = S - L;
    const float sl2 = scale * TG_LOG2E;

    for (int idx = tid; idx < BWD_BR * HD; idx += NT) {
        const int r = idx / HD, e = idx % HD, i = q0 + r;
        const bool in = i < L && e < E;
        Qs[r][e] = in ? qb[(long long)i * qst + e] : 0.f;
        dOs[r][e] = in ? gob[(long long)i * E + e] : 0.f;
    }
    float lse2[BRPT], Di[BRPT], acc[BRPT][DPT];
    #pragma unroll
    for (int i = 0; i < BRPT; ++i) {
        const int qi = q0 + rg * BRPT + i;
        lse2[i] = qi < L ? lse[(long long)bh * L + qi] * TG_LOG2E : TG_INF;
        Di[i] = qi < L ? D[(long long)bh * L + qi] : 0.f;
        #pragma unroll
        for (int d = 0; d < DPT; ++d) acc[i][d] = 0.f;
    }
    const int kv_end = causal ? min(S, q0 + BWD_BR + off) : S;
    for (int k0 = 0; k0 < kv_end; k0 += BWD_BC) {
        __syncthreads();
        for (int idx = tid; idx < BWD_BC * HD; idx += NT) {
            const int r = idx / HD, e = idx % HD, j = k0 + r;
            const bool in = j < S && e < E;
            Ks[r][e] = in ? kb[(long long)j * kst + e] : 0.f;
            Vs[r][e] = in ? vb[(long long)j * vst + e] : 0.f;
        }
        __syncthreads();
        float s[BRPT][BCPT], dp[BRPT][BCPT];
        tg_two_products<BRPT, BCPT>(s, dp, Qs, dOs, Ks, Vs, rg, cg);  // s = q kᵀ, dp = dO vᵀ
        #pragma unroll
        for (int i = 0; i < BRPT; ++i) {
            const int qi = q0 + rg * BRPT + i;
            #pragma unroll
            for (int j = 0; j < BCPT; ++j) {
                const int kj = k0 + cg + TC * j;
                const bool ok = kj < S && (!causal || kj <= qi + off);
                const float p = ok ? exp2f(s[i][j] * sl2 - lse2[i]) : 0.f;
                dSs[rg * BRPT + i][cg + TC * j] = p * (dp[i][j] - Di[i]);
            }
        }
        __syncthreads();
        for (int c = 0; c < BWD_BC; ++c) {
            float kr[DPT];
            #pragma unroll
            for (int d = 0; d < DPT; ++d) kr[d] = Ks[c][cg + TC * d];
            #pragma unroll
            for (int i = 0; i < BRPT; ++i) {
                const float ds = dSs[rg * BRPT + i][c];
                #pragma unroll
                for (int d = 0; d < DPT; ++d) acc[i][d] = fmaf(ds, kr[d], acc[i][d]);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < BRPT; ++i) {
        const int qi = q0 + rg * BRPT + i;
        if (qi < L) {
            float* row = gq + ((long long)bh * L + qi) * E;
            #pragma unroll
            for (int d = 0; d < DPT; ++d) {
                const int e = cg + TC * d;
                if (e < E) row[e] = acc[i][d] * scale;
            }
        }
    }
}

// dk = scale * sum_i dS_ij q_i and dv = sum_i P_ij dO_i; one block per key tile, so every
// gradient element is written once (no atomics: the same inputs give the same bits).
extern "C" __global__ void __launch_bounds__(NT) tg_flash_bwd_dkv(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ go, const float* __restrict__ lse, const float* __restrict__ D,
    float* __restrict__ gk, float* __restrict__ gv,
    const int H, const int L, const int S, const int E,
    const long long qsb, const long long qsh, const long long qst,
    const long long ksb, const long long ksh, const long long kst,
    const long long vsb, const long long vsh, const long long vst,
    const float scale, const int causal)
{
    __shared__ float Ks[BWD_BC][HD + 1];
    __shared__ float Vs[BWD_BC][HD + 1];
    __shared__ float Qs[BWD_BR][HD + 1];
    __shared__ float dOs[BWD_BR][HD + 1];
    __shared__ float Pt[BWD_BC][BWD_BR + 1];
    __shared__ float dSt[BWD_BC][BWD_BR + 1];
    __shared__ float Ls[BWD_BR];
    __shared__ float Ds[BWD_BR];
    const int tid = threadIdx.x, rg = tid / TC, cg = tid % TC;
    const int k0 = blockIdx.x * BWD_BC;  // early key tiles see the most queries: first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const float* qb = q + b * qsb + h * qsh;
    const float* kb = k + b * ksb + h * ksh;
    const float* vb = v + b * vsb + h * vsh;
    const float* gob = go + (long long)bh * L * E;
    const int off = S - L;
    const float sl2 = scale * TG_LOG2E;

    for (int idx = tid; idx < BWD_BC * HD; idx += NT) {
        const int r = idx / HD, e = idx % HD, j = k0 + r;
        const bool in = j < S && e < E;
        Ks[r][e] = in ? kb[(long long)j * kst + e] : 0.f;
        Vs[r][e] = in ? vb[(long long)j * vst + e] : 0.f;
    }
    float dk[KPT][DPT], dv[KPT][DPT];
    #pragma unroll
    for (int i = 0; i < KPT; ++i)
        #pragma unroll
        for (int d = 0; d < DPT; ++d) { dk[i][d] = 0.f; dv[i][d] = 0.f; }
    int q_start = causal ? max(0, k0 - off) : 0;
    q_start = (q_start / BWD_BR) * BWD_BR;
    for (int q0 = q_start; q0 < L; q0 += BWD_BR) {
        __syncthreads();  // the previous query tile is used up (and Ks, Vs are written)
        for (int idx = tid; idx < BWD_BR * HD; idx += NT) {
            const int r = idx / HD, e = idx % HD, i = q0 + r;
            const bool in = i < L && e < E;
            Qs[r][e] = in ? qb[(long long)i * qst + e] : 0.f;
            dOs[r][e] = in ? gob[(long long)i * E + e] : 0.f;
        }
        for (int r = tid; r < BWD_BR; r += NT) {
            const int i = q0 + r;
            Ls[r] = i < L ? lse[(long long)bh * L + i] * TG_LOG2E : TG_INF;
            Ds[r] = i < L ? D[(long long)bh * L + i] : 0.f;
        }
        __syncthreads();
        float st[KPT][QPT], dpt[KPT][QPT];
        tg_two_products<KPT, QPT>(st, dpt, Ks, Vs, Qs, dOs, rg, cg);  // transposed: k qᵀ, v dOᵀ
        #pragma unroll
        for (int i = 0; i < KPT; ++i) {
            const int kj = k0 + rg * KPT + i;
            #pragma unroll
            for (int j = 0; j < QPT; ++j) {
                const int cq = cg + TC * j, qi = q0 + cq;
                const bool ok = kj < S && qi < L && (!causal || kj <= qi + off);
                const float p = ok ? exp2f(st[i][j] * sl2 - Ls[cq]) : 0.f;
                Pt[rg * KPT + i][cq] = p;
                dSt[rg * KPT + i][cq] = p * (dpt[i][j] - Ds[cq]);
            }
        }
        __syncthreads();
        for (int c = 0; c < BWD_BR; ++c) {
            float dr[DPT], qr[DPT];
            #pragma unroll
            for (int d = 0; d < DPT; ++d) { dr[d] = dOs[c][cg + TC * d]; qr[d] = Qs[c][cg + TC * d]; }
            #pragma unroll
            for (int i = 0; i < KPT; ++i) {
                const float p = Pt[rg * KPT + i][c], ds = dSt[rg * KPT + i][c];
                #pragma unroll
                for (int d = 0; d < DPT; ++d) {
                    dv[i][d] = fmaf(p, dr[d], dv[i][d]);
                    dk[i][d] = fmaf(ds, qr[d], dk[i][d]);
                }
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < KPT; ++i) {
        const int kj = k0 + rg * KPT + i;
        if (kj < S) {
            float* krow = gk + ((long long)bh * S + kj) * E;
            float* vrow = gv + ((long long)bh * S + kj) * E;
            #pragma unroll
            for (int d = 0; d < DPT; ++d) {
                const int e = cg + TC * d;
                if (e < E) { krow[e] = dk[i][d] * scale; vrow[e] = dv[i][d]; }
            }
        }
    }
}
"""


def flash_config(E: int) -> dict:
    """Tile sizes for head size E (<= 128): HD is E rounded up to a multiple of 8."""
    hd = max(8, -(-E // 8) * 8)
    if hd <= 64:
        return {"HD": hd, "FWD_BR": 64, "FWD_BC": 32, "BWD_BR": 32, "BWD_BC": 32}
    return {"HD": hd, "FWD_BR": 32, "FWD_BC": 16, "BWD_BR": 16, "BWD_BC": 16}


def flash_source(E: int) -> str:
    """The CUDA source for head size E: the tile sizes as #defines, then the kernels."""

    defines = "".join(f"#define {k} {v}\n" for k, v in flash_config(E).items())
    return defines + COMMON_SRC + FLASH_SRC


def _raw(hd: int, name: str):
    """A function of the RawModule built from flash_source(hd), one module per padded size."""
    mod = _cache.get(hd)
    if mod is None:
        cp = require_cupy()
        mod = _cache[hd] = cp.RawModule(code=flash_source(hd))
    return mod.get_function(name)


# ----------------------------------------------------------------------------- wrappers


def flash_supported(q, k, v, mask, dropout_p) -> bool:
    """True when the flash kernels handle this call (else the batched-GEMM path runs)."""
    if mask is not None or dropout_p > 0.0 or any(a.dtype != np.float32 for a in (q, k, v)):
        return False
    if not (q.ndim == k.ndim == v.ndim and q.ndim in (3, 4)):
        return False
    E = q.shape[-1]
    if k.shape[-1] != E or v.shape[-1] != E or not 0 < E <= 128:
        return False
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        return False
    return q.shape[-2] > 0 and k.shape[-2] > 0 and 0 < math.prod(batch) <= 65535


def _as4d(a, batch):
    """a broadcast to (B, H, T, E) with unit stride on E, and its (b, h, t) element strides."""
    cp = require_cupy()
    if a.strides[-1] != a.itemsize:
        a = cp.ascontiguousarray(a)
    if len(batch) == 1:
        a = a[:, None]
        batch = (batch[0], 1)
    a = cp.broadcast_to(a, batch + a.shape[-2:])
    return a, tuple(np.int64(s // a.itemsize) for s in a.strides[:3])


def _flash_args(q, k, v):
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q4, qs = _as4d(q, batch)
    k4, ks = _as4d(k, batch)
    v4, vs = _as4d(v, batch)
    B, H = q4.shape[:2]
    return batch, (B, H), (q4, k4, v4), (*qs, *ks, *vs)


def flash_attention_forward(q, k, v, is_causal: bool, scale: float):
    """softmax(q kᵀ·scale [causal]) v -> (o of shape batch + (L, E), lse of (B, H, L))."""
    cp = require_cupy()
    batch, (B, H), (q4, k4, v4), strides = _flash_args(q, k, v)
    L, E, S = q.shape[-2], q.shape[-1], k.shape[-2]
    cfg = flash_config(E)
    o = cp.empty((B, H, L, E), cp.float32)
    lse = cp.empty((B, H, L), cp.float32)
    _raw(cfg["HD"], "tg_flash_fwd")(
        (-(-L // cfg["FWD_BR"]), B * H),
        (128,),
        (
            q4,
            k4,
            v4,
            o,
            lse,
            _i32(H),
            _i32(L),
            _i32(S),
            _i32(E),
            *strides,
            np.float32(scale),
            _i32(bool(is_causal)),
        ),
    )
    return o.reshape(batch + (L, E)), lse


def flash_attention_backward(q, k, v, o, lse, g, is_causal: bool, scale: float):
    """Gradients (gq, gk, gv) over the broadcast batch shape; the caller unbroadcasts."""
    cp = require_cupy()
    batch, (B, H), (q4, k4, v4), strides = _flash_args(q, k, v)
    L, E, S = q.shape[-2], q.shape[-1], k.shape[-2]
    cfg = flash_config(E)
    go = cp.ascontiguousarray(cp.broadcast_to(g, batch + (L, E)), dtype=cp.float32)
    D = (go * o).sum(axis=-1)  # rowsum(dO ∘ O), (batch..., L)
    gq = cp.empty((B, H, L, E), cp.float32)
    gk = cp.empty((B, H, S, E), cp.float32)
    gv = cp.empty((B, H, S, E), cp.float32)
    args = (_i32(H), _i32(L), _i32(S), _i32(E), *strides, np.float32(scale), _i32(bool(is_causal)))
    _raw(cfg["HD"], "tg_flash_bwd_dq")(
        (-(-L // cfg["BWD_BR"]), B * H), (128,), (q4, k4, v4, go, lse, D, gq, *args)
    )
    _raw(cfg["HD"], "tg_flash_bwd_dkv")(
        (-(-S // cfg["BWD_BC"]), B * H), (128,), (q4, k4, v4, go, lse, D, gk, gv, *args)
    )
    return gq.reshape(batch + (L, E)), gk.reshape(batch + (S, E)), gv.reshape(batch + (S, E))
