"""Reference op against its kernels, interleaved in one process: python -m benchmarks.kernels_ab

For each op with a kernel (the chunked NumPy one of tensorgrad.kernels.cpu_chunked, which
runs without numba, and the numba one of tensorgrad.kernels.cpu_numba), at the shapes of the
benchmarks' ops table and attention at the three model shapes: the best of ``--reps`` rounds
of forward + backward (Function.forward/backward on raw arrays, no tape), the reference and
the kernels taking turns so that background load hits all alike, at each thread count of ``--threads`` (NumPy's BLAS through threadpoolctl
and numba's pool together). Attention is also timed with its two threading modes
(``cpu_numba_attention.THREADS_OVER``). Meant for choosing defaults on a quiet machine;
the comparison with PyTorch is ``python -m benchmarks.run --only ops``. malloc is tuned as
gpt-train tunes it (``tg.tune_cpu_malloc``); with glibc's default (TG_MALLOC_TUNING=0) every
large temporary is a fresh mmap and its page faults favour the chunked kernels.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def cases():
    """(name, reference Function, {variant: (Function, attention threading)}, inputs, keywords).

    Variants: the chunked NumPy kernel where there is one (tensorgrad.kernels.cpu_chunked,
    what runs without numba) and the numba kernel (where numba is installed)."""
    import tensorgrad.ops.nn as F  # the reference Ops, each F function's one op
    from tensorgrad.kernels import cpu_chunked as C

    try:
        from tensorgrad.kernels import cpu_numba as K
        from tensorgrad.kernels import cpu_numba_attention as KA
    except ImportError:  # numba not installed: reference against chunked only
        K = KA = None

    g = np.random.default_rng(0)

    def f32(*shape):
        return g.standard_normal(shape, dtype=np.float32)

    def variants(chunked, numba_name, attention=False):
        out = {"chunked": (chunked, None)} if chunked else {}
        if K is not None and attention:
            out["numba heads"] = (KA.NumbaFlashAttention, "heads")
            out["numba rows"] = (KA.NumbaFlashAttention, "rows")
        elif K is not None:
            out["numba"] = (getattr(K, numba_name), None)
        return out

    B, nh, T, hs = 8, 6, 256, 64
    N, V, C_ = 512, 50304, 768
    qkv = [f32(B, nh, T, hs), f32(B, nh, T, hs), f32(B, nh, T, hs), None]
    small = [f32(12, 4, 64, 32), f32(12, 4, 64, 32), f32(12, 4, 64, 32), None]
    long = [f32(1, 12, 1024, hs), f32(1, 12, 1024, hs), f32(1, 12, 1024, hs), None]
    causal = {"is_causal": True}
    return [
        ("softmax", F.Softmax, variants(C.ChunkedSoftmax, "NumbaSoftmax"), [f32(B, nh, T, T)], {}),
        ("log_softmax", F.LogSoftmax, variants(None, "NumbaLogSoftmax"), [f32(N, V)], {}),
        (
            "cross_entropy",
            F.CrossEntropy,
            variants(C.ChunkedCrossEntropy, "NumbaCrossEntropy"),
            [f32(N, V), g.integers(0, V, N)],
            {},
        ),
        (
            "layer_norm",
            F.LayerNorm,
            variants(C.ChunkedLayerNorm, "NumbaLayerNorm"),
            [f32(N, C_), f32(C_), f32(C_)],
            {},
        ),
        (
            "gelu (tanh)",
            F.Gelu,
            variants(C.ChunkedGeluTanh, "NumbaGelu"),
            [f32(N, 4 * C_)],
            {"approximate": "tanh"},
        ),
        ("sdpa (8,6,256,64)", F.Attention, variants(C.InplaceAttention, "", True), qkv, causal),
        ("sdpa (12,4,64,32)", F.Attention, variants(C.InplaceAttention, "", True), small, causal),
        ("sdpa (1,12,1024,64)", F.Attention, variants(C.InplaceAttention, "", True), long, causal),
    ]


def fwd_bwd(cls, arrays, kw, g):
    fn = cls()
    fn.forward(*arrays, **kw)
    fn.backward(g)


def best(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    import tensorgrad as tg

    tg.tune_cpu_malloc()  # as gpt-train and benchmarks.worker (TG_MALLOC_TUNING=0: glibc's default)

    from tensorgrad.kernels import cpu_chunked as C
    from tensorgrad.optim import adamw_update

    try:
        import numba

        from tensorgrad.kernels import cpu_numba as K
        from tensorgrad.kernels import cpu_numba_attention as KA
    except ImportError:
        numba = K = KA = None

    cap = numba.config.NUMBA_NUM_THREADS if numba else 64
    threads = [min(int(t), cap) for t in args.threads.split(",")]
    rows = []
    for name, ref, kernels, arrays, kw in cases():
        y = ref().forward(*arrays, **kw)
        g = np.random.default_rng(1).standard_normal(np.shape(y)).astype(np.float32)
        variants = {"reference": (ref, None), **kernels}
        for n in threads:
            with threadpool_limits(limits=n):
                if numba:
                    numba.set_num_threads(n)
                times = {k: [] for k in variants}
                for _ in range(args.reps):  # interleaved rounds
                    for label, (cls, mode) in variants.items():
                        if mode:
                            KA.THREADS_OVER = mode
                        times[label].append(
                            best(lambda c=cls, a=arrays, k=kw, g=g: fwd_bwd(c, a, k, g), 1)
                        )
                if KA:
                    KA.THREADS_OVER = "heads"
            base = min(times["reference"])
            rows.append((name, n, {k: min(v) for k, v in times.items()}, base))
    # AdamW over 10M float32 parameters
    gen = np.random.default_rng(2)
    arrs = [gen.standard_normal(10_000_000, dtype=np.float32) for _ in range(3)]
    arrs.append(gen.random(10_000_000, dtype=np.float32))
    hp = {"lr": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1, "step": 3}
    updates = {"reference": adamw_update, "chunked": C.chunked_adamw_update}
    if K:
        from tensorgrad.kernels.cpu_numba_adamw import numba_adamw_update

        updates["numba"] = numba_adamw_update
    for n in threads:
        with threadpool_limits(limits=n):
            if numba:
                numba.set_num_threads(n)
            times = {k: [] for k in updates}
            for _ in range(args.reps):
                for k, fn in updates.items():
                    times[k].append(best(lambda fn=fn: fn(*arrs, **hp), 1))
            rows.append(
                ("adamw 10M", n, {k: min(v) for k, v in times.items()}, min(times["reference"]))
            )
    where = (
        f"numba {numba.__version__}, threading layer {numba.threading_layer()}"
        if numba
        else "numba not installed"
    )
    print(f"{where}; best of rounds, forward + backward, ms (× the reference)")
    print("| op | threads | variant: ms (× reference) |\n|---|---|---|")
    for name, n, t, base in rows:
        cells = ", ".join(
            f"{k} {v * 1e3:.2f}" + ("" if k == "reference" else f" ({v / base:.2f}×)")
            for k, v in t.items()
        )
        print(f"| {name} | {n} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
