"""What each rank runs in tests/test_distributed.py (started by mpiexec; not a test module).

    python tests/mpi_worker.py collectives OUT.json       # tensorgrad.distributed checks
    python tests/mpi_worker.py fake-nccl OUT.json         # the GPU (NCCL) path, on stand-ins
    python tests/mpi_worker.py train [FAULT] -- ARGS...   # gpt-train's main with ARGS

FAULT, on rank 1 at step 4 (the 5th clip_grad_norm_ call): kill (SIGKILL itself), raise
(an OSError), hang (sleep for 10 minutes); or pidfile=PATH: every rank writes its pid to
PATH.<rank> and trains on.
"""

import ctypes
import json
import os
import signal
import sys
import time
import types

import numpy as np


def collectives(out_path: str) -> None:
    import tensorgrad as tg
    import tensorgrad.distributed as dist

    assert "mpi4py" not in sys.modules  # import tensorgrad never imports it
    n = dist.init()
    r = dist.rank()
    res = {"world": n, "rank": r}
    # 7 parameters of varied shapes; bucket_mb small so that they spread over several buckets
    shapes = [(300, 40), (17,), (64, 64), (5, 3, 7), (1,), (2000,), (33, 9)]
    params = [tg.nn.Parameter(np.full(s, float(r), np.float32)) for s in shapes]
    ddp = dist.DataParallel(params, bucket_mb=0.02)
    res["buckets"] = len(ddp.buckets)
    res["broadcast_ok"] = all(float(abs(p.array).max()) == 0.0 for p in params)  # rank 0's zeros
    grads = [
        [
            np.random.default_rng([k, i]).standard_normal(s).astype(np.float32)
            for i, s in enumerate(shapes)
        ]
        for k in range(n)
    ]
    for i, p in enumerate(params):
        if not (i == 4 and r == 1):  # rank 1 has no gradient for parameter 4
            p.grad = tg.tensor(grads[r][i])
    ddp.reduce_gradients()
    worst = 0.0
    for i, p in enumerate(params):
        want = np.mean(
            [grads[k][i] if not (i == 4 and k == 1) else 0 * grads[k][i] for k in range(n)], axis=0
        )
        worst = max(worst, float(np.abs(p.grad.array - want).max()))
    res["grad_worst"] = worst
    res["grad_bytes"] = ddp.comm_bytes
    a = np.arange(6, dtype=np.float64) * (r + 1)
    res["sum"] = dist.all_reduce(a.copy(), "sum").tolist()
    res["max"] = dist.all_reduce(np.array([r], np.int64), "max").tolist()
    t = dist.all_reduce(tg.tensor(np.full(3, r + 1.0, np.float32)), "mean")
    res["mean_tensor"] = t.array.tolist()
    w = tg.nn.Parameter(np.full(3, r + 1.0, np.float32))
    w.grad = tg.tensor(np.full(3, 2.0 * (r + 1), np.float32))
    dist.all_reduce(w.grad.data, "sum")  # PyTorch's idiom: through .data, into p.grad
    dist.broadcast(w.data, root=1)
    res["through_data"] = [w.grad.array.tolist(), w.array.tolist()]
    b = np.full(4, float(r), np.float32)
    res["broadcast_from_1"] = dist.broadcast(b, root=1).tolist()
    res["json"] = dist.broadcast_json({"from": r}, root=1)
    res["gather"] = dist.all_gather_json({"r": r, "s": "x" * r})
    dist.barrier()
    if r == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


class GpuArray(np.ndarray):
    """A host array posing as a CuPy one: registered as the 'cuda' device, with .data.ptr."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self):
        return np.asarray(self).copy()


def _fake_cupy():
    """Modules cupy, cupy.cuda, cupy.cuda.nccl whose NCCL reduces host memory over MPI."""
    from mpi4py import MPI

    dtypes = {7: np.float32, 8: np.float64, 6: np.float16, 2: np.int32, 4: np.int64}
    ops = {0: MPI.SUM, 2: MPI.MAX, 3: MPI.MIN}
    calls = []

    def at(ptr, count, code):
        t = np.ctypeslib.as_ctypes_type(np.dtype(dtypes[code]))
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(t)), shape=(count,))

    class NcclCommunicator:
        def __init__(self, ndev, uid, rank):
            assert isinstance(uid, tuple) and len(uid) == 128 and ndev == MPI.COMM_WORLD.size
            calls.append(("init", list(uid[:4])))

        def allReduce(self, send, recv, count, dtype, op, stream):  # CuPy's name
            assert send == recv and stream == 12345
            MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, at(recv, count, dtype), op=ops[op])
            calls.append(("allReduce", count))

        def bcast(self, buff, count, dtype, root, stream):
            MPI.COMM_WORLD.Bcast(at(buff, count, dtype), root=root)
            calls.append(("bcast", count))

    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.__dict__.update(
        NcclCommunicator=NcclCommunicator,
        available=True,
        NCCL_SUM=0,
        NCCL_MAX=2,
        NCCL_MIN=3,
        NCCL_FLOAT32=7,
        NCCL_FLOAT64=8,
        NCCL_FLOAT16=6,
        NCCL_INT32=2,
        NCCL_INT64=4,
        get_unique_id=lambda: tuple(
            int(v) for v in np.random.default_rng().integers(-128, 128, 128)
        ),
    )
    stream = types.SimpleNamespace(ptr=12345, synchronize=lambda: None)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl, cuda.get_current_stream = nccl, lambda: stream
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl})
    return calls, cupy, nccl


class _FakeXP:
    """numpy, with every array it makes a GpuArray."""

    def __getattr__(self, name):
        fn = getattr(np, name)
        if not callable(fn) or isinstance(fn, type):
            return fn

        def call(*args, **kwargs):
            r = fn(*args, **kwargs)
            return r.view(GpuArray) if isinstance(r, np.ndarray) else r

        return call


def fake_nccl(out_path: str) -> None:
    import tensorgrad as tg
    import tensorgrad.distributed as dist
    from tensorgrad import devices

    calls, cupy, nccl = _fake_cupy()
    # tensorgrad reaches CuPy only through backend's require_* (bound into distributed)
    dist.require_cupy, dist.require_nccl = (lambda: cupy), (lambda: nccl)
    devices.register_array_module(GpuArray, _FakeXP())
    n, r = dist.init(), dist.rank()
    shapes = [(300, 40), (17,), (64, 64), (1,)]
    params = [tg.nn.Parameter(np.full(s, float(r), np.float32).view(GpuArray)) for s in shapes]
    ddp = dist.DataParallel(params, bucket_mb=0.02)
    grads = [
        [
            np.random.default_rng([k, i]).standard_normal(s).astype(np.float32)
            for i, s in enumerate(shapes)
        ]
        for k in range(n)
    ]
    for i, p in enumerate(params):
        p.grad = tg.Tensor(grads[r][i].copy().view(GpuArray))
    ddp.reduce_gradients()
    res = {
        "on_gpu": all(
            isinstance(p.grad.array, GpuArray) and isinstance(p.array, GpuArray) for p in params
        ),
        "broadcast_ok": all(float(np.abs(np.asarray(p.array)).max()) == 0.0 for p in params),
        "grad_worst": max(
            float(
                np.abs(
                    np.asarray(p.grad.array) - np.mean([grads[k][i] for k in range(n)], axis=0)
                ).max()
            )
            for i, p in enumerate(params)
        ),
        "max": np.asarray(dist.all_reduce(np.full(3, r, np.int64).view(GpuArray), "max")).tolist(),
        "calls": [c[0] for c in calls],
    }
    if r == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)


def train(fault: str | None, argv: list[str]) -> int:
    from gpt import train as gt
    from gpt.train import loop as gt_loop

    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if fault and fault.startswith("pidfile="):
        with open(f"{fault.split('=', 1)[1]}.{rank}", "w") as f:
            f.write(str(os.getpid()))
    elif fault and rank == 1:
        calls = []
        real = gt_loop.clip_grad_norm_

        def clip(params, max_norm):
            calls.append(1)
            if len(calls) == 5:
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault == "hang":
                    time.sleep(600)
                raise OSError(5, "Input/output error (injected)")
            return real(params, max_norm)

        gt_loop.clip_grad_norm_ = clip
    return gt.main(argv)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "collectives":
        collectives(rest[0])
    elif mode == "fake-nccl":
        fake_nccl(rest[0])
    else:
        cut = rest.index("--")
        sys.exit(train(rest[0] if cut else None, rest[cut + 1 :]))
