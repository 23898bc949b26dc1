"""Reference op against its numba kernel, interleaved in one process: python -m benchmarks.kernels_ab

For each kernel of tensorgrad.kernels.cpu_numba, at the shapes of the benchmarks' ops
table: the best of ``--reps`` rounds of forward + backward (Function.forward/backward on
raw arrays, no tape), the reference and the kernel taking turns so that background load
hits both alike, at each thread count of ``--threads`` (NumPy's BLAS through threadpoolctl
and numba's pool together). Attention is also timed with its two threading modes
(``cpu_numba_attention.THREADS_OVER``). Meant for choosing defaults on a quiet machine;
the comparison with PyTorch is ``python -m benchmarks.run --only ops``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def cases():
    """(name, reference Function, kernel Function, inputs, keywords)."""
    import tensorgrad.functional as F
    from tensorgrad.kernels import cpu_numba as K
    from tensorgrad.kernels import cpu_numba_attention as KA

    g = np.random.default_rng(0)

    def f32(*shape):
        return g.standard_normal(shape, dtype=np.float32)

    B, nh, T, hs = 8, 6, 256, 64
    N, V, C = 512, 50304, 768
    return [
        ("softmax", F.Softmax, K.NumbaSoftmax, [f32(B, nh, T, T)], {}),
        ("log_softmax", F.LogSoftmax, K.NumbaLogSoftmax, [f32(N, V)], {}),
        (
            "cross_entropy",
            F.CrossEntropy,
            K.NumbaCrossEntropy,
            [f32(N, V), g.integers(0, V, N)],
            {},
        ),
        ("layer_norm", F.LayerNorm, K.NumbaLayerNorm, [f32(N, C), f32(C), f32(C)], {}),
        ("gelu (tanh)", F.Gelu, K.NumbaGelu, [f32(N, 4 * C)], {"approximate": "tanh"}),
        (
            "sdpa (causal)",
            F.Attention,
            KA.NumbaFlashAttention,
            [f32(B, nh, T, hs), f32(B, nh, T, hs), f32(B, nh, T, hs), None],
            {"is_causal": True},
        ),
        (
            "sdpa T=1024",
            F.Attention,
            KA.NumbaFlashAttention,
            [f32(1, 12, 1024, hs), f32(1, 12, 1024, hs), f32(1, 12, 1024, hs), None],
            {"is_causal": True},
        ),
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
    import numba
    from threadpoolctl import threadpool_limits

    from tensorgrad.kernels import cpu_numba as K
    from tensorgrad.kernels import cpu_numba_attention as KA
    from tensorgrad.optim import adamw_update

    threads = [min(int(t), numba.config.NUMBA_NUM_THREADS) for t in args.threads.split(",")]
    rows = []
    for name, ref, ker, arrays, kw in cases():
        y = ref().forward(*arrays, **kw)
        g = np.random.default_rng(1).standard_normal(np.shape(y)).astype(np.float32)
        variants = {"reference": (ref, None), "numba": (ker, None)}
        if ker is KA.NumbaFlashAttention:
            variants = {
                "reference": (ref, None),
                "numba heads": (ker, "heads"),
                "numba rows": (ker, "rows"),
            }
        for n in threads:
            with threadpool_limits(limits=n):
                numba.set_num_threads(n)
                times = {k: [] for k in variants}
                for _ in range(args.reps):  # interleaved rounds
                    for label, (cls, mode) in variants.items():
                        if mode:
                            KA.THREADS_OVER = mode
                        times[label].append(
                            best(lambda c=cls, a=arrays, k=kw, g=g: fwd_bwd(c, a, k, g), 1)
                        )
                KA.THREADS_OVER = "heads"
            base = min(times["reference"])
            rows.append((name, n, {k: min(v) for k, v in times.items()}, base))
    # AdamW over 10M float32 parameters
    gen = np.random.default_rng(2)
    arrs = [gen.standard_normal(10_000_000, dtype=np.float32) for _ in range(3)]
    arrs.append(gen.random(10_000_000, dtype=np.float32))
    hp = {"lr": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1, "step": 3}
    for n in threads:
        with threadpool_limits(limits=n):
            numba.set_num_threads(n)
            times = {"reference": [], "numba": []}
            for _ in range(args.reps):
                times["reference"].append(best(lambda: adamw_update(*arrs, **hp), 1))
                times["numba"].append(best(lambda: K.numba_adamw_update(*arrs, **hp), 1))
            rows.append(
                ("adamw 10M", n, {k: min(v) for k, v in times.items()}, min(times["reference"]))
            )
    print(
        f"numba {numba.__version__}, threading layer {numba.threading_layer()}; "
        "best of rounds, forward + backward, ms (kernel / reference)"
    )
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
