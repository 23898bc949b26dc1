"""Data-parallel training across processes: MPI process groups, all-reduce and broadcast.

    mpiexec -n 2 python train.py      # each process: one rank

    import tensorgrad.distributed as dist
    dist.init()                                   # from the MPI environment; 1 rank without one
    ddp = dist.DataParallel(model.parameters())   # broadcasts rank 0's weights
    ddp.backward(loss)                            # backward, then every gradient averaged
    dist.all_reduce(x, op="mean")                 # a Tensor or an array, in place

PyTorch's names work too (``init_process_group``, ``get_rank``, ``all_reduce(t,
op=ReduceOp.SUM)``, ``destroy_process_group``; DDP is ``tensorgrad.nn.parallel``), and
``python -m tensorgrad.distributed.run --nproc_per_node N script.py`` starts a script written for
``torchrun`` under mpiexec with RANK, LOCAL_RANK and WORLD_SIZE set (see run.py).

The process group is MPI (mpi4py, the ``[mpi]`` extra), imported only when the environment
shows an MPI launch of more than one rank, so ``import tensorgrad`` and one-process runs never
touch it. Arrays on a GPU (CuPy) reduce with NCCL (``cupy.cuda.nccl``) on device buffers, the
NCCL unique id broadcast over MPI; each rank then uses the GPU of its local rank. Only MPI's
buffer methods (``Allreduce``, ``Bcast`` of arrays) are used, never pickle; small objects
travel as JSON bytes.

Faults: a collective that waits longer than ``timeout`` seconds (``TG_DIST_TIMEOUT``, default
600) ends the process with one line naming the rank and the collective, so a rank that died or
hung stops the others in bounded time even under a launcher that does not clean up; while it
waits, a rank also watches the other ranks of its machine and stops as soon as one has exited.

Imports: contextlib, hashlib, json, numpy, os, sys, threading, time, ..devices, ..tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np

from ..devices import get_array_module, require_cupy, require_nccl, to_numpy
from ..tensor import Tensor

DEFAULT_TIMEOUT_S = 600.0
INSTALL_HINT = 'pip install -e ".[mpi]" (mpi4py and an MPI runtime)'
# (size, rank) variables that MPI launchers set: Open MPI, MPICH / Intel MPI (PMI), MVAPICH
_LAUNCH_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("PMI_SIZE", "PMI_RANK"),
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"),
)
_OPS = ("mean", "sum", "max", "min")


class DistributedError(RuntimeError):
    """The process group cannot be set up (message says why and what to do)."""


# ----------------------------------------------------------------------------- the launch
def launch_world_size() -> int:
    """Ranks in this launch according to the environment (1 when not under mpiexec)."""
    for size, _ in _LAUNCH_VARS:
        if os.environ.get(size, "").isdigit():
            return int(os.environ[size])
    return 1


def launch_rank() -> int:
    """This process's rank according to the environment, without initialising MPI."""
    for _, rank in _LAUNCH_VARS:
        if os.environ.get(rank, "").isdigit():
            return int(os.environ[rank])
    return 0


class _Group:
    """The world: MPI.COMM_WORLD (or nothing for one rank), its local ranks, NCCL once asked."""

    def __init__(self, comm, timeout: float):
        self.comm, self.timeout = comm, timeout
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.local_rank, self.local_size, self.peers = 0, 1, {}
        self.nccl = None
        self.watchdog = None
        if comm is not None:
            MPI = _mpi()
            local = comm.Split_type(MPI.COMM_TYPE_SHARED)
            self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
            me = {"rank": self.rank, "pid": os.getpid(), "host": os.uname().nodename}
            everyone = _all_gather_json(comm, me)
            self.peers = {
                p["rank"]: p["pid"]
                for p in everyone
                if p["host"] == me["host"] and p["rank"] != self.rank
            }
            self.watchdog = _Watchdog(self)


_group: _Group | None = None


def init(timeout: float | None = None) -> int:
    """Join the process group of this MPI launch (once; later calls do nothing); returns
    the world size. Without an MPI launch (no mpiexec, or -n 1) it is a group of one rank
    and mpi4py is not imported. Raises DistributedError when a multi-rank launch lacks
    mpi4py or mpi4py belongs to another MPI than the launcher."""
    global _group
    if _group is not None:
        return _group.size
    if timeout is None:
        timeout = float(os.environ.get("TG_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    n = launch_world_size()
    if n <= 1:
        _group = _Group(None, timeout)
        return 1
    try:
        MPI = _mpi()
    except ImportError:
        raise DistributedError(
            f"this is a launch of {n} ranks, but mpi4py is not installed: {INSTALL_HINT}"
        ) from None
    got = MPI.COMM_WORLD.Get_size()
    if got != n:
        raise DistributedError(
            f"the launcher started {n} ranks but mpi4py sees {got}: mpiexec and mpi4py come "
            f"from different MPIs; use the venv's mpiexec (after {INSTALL_HINT}) or rebuild "
            "mpi4py against the system MPI (see the README)"
        )
    _group = _Group(MPI.COMM_WORLD, timeout)
    return _group.size


def is_initialized() -> bool:
    return _group is not None


def _g() -> _Group:
    if _group is None:
        init()
    return _group


def rank() -> int:
    return _g().rank


def world_size() -> int:
    return _g().size


def local_rank() -> int:
    """This rank's index among the ranks on its machine (its GPU, on CUDA)."""
    return _g().local_rank


def local_world_size() -> int:
    return _g().local_size


def use_local_gpu() -> int:
    """Make the GPU of this rank's local rank CuPy's current device; returns its index."""
    cp = require_cupy()
    n = cp.cuda.runtime.getDeviceCount()
    if local_world_size() > n:
        raise DistributedError(
            f"{local_world_size()} ranks on this machine but {n} GPU(s): "
            "start at most one rank per GPU"
        )
    cp.cuda.Device(local_rank()).use()
    if world_size() > 1:
        _nccl_module()  # fail now, in one line, rather than at the first gradient reduction
    return local_rank()


def _mpi():
    """mpi4py's MPI module, imported on first use: only multi-rank launches load MPI."""
    from mpi4py import MPI  # noqa: PLC0415  (lazy on purpose)

    return MPI


def _nccl_module():
    try:
        nccl = require_nccl()
    except ImportError as e:
        nccl, why = None, str(e).strip().splitlines()[0] if str(e).strip() else "ImportError"
    else:
        why = "CuPy was built without it"
    if nccl is None or not getattr(nccl, "available", True):
        raise DistributedError(
            f"GPU ranks reduce with NCCL, but CuPy cannot load it ({why}); "
            "install NCCL for CuPy (python -m cupyx.tools.install_library "
            "--library nccl --cuda 12.x, or the system's libnccl)"
        )
    return nccl


def abort(code: int = 1, message: str | None = None) -> None:
    """Print ``message`` (one line) and end this process now, without waiting for the other
    ranks; the launcher then stops them (and the watchdog would, in bounded time). The line
    goes to file descriptor 2, whatever sys.stderr has been redirected to."""
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if message:
        os.write(2, (message.rstrip("\n") + "\n").encode())
    os._exit(code)


# ----------------------------------------------------------------------------- watchdog
class _Watchdog:
    """A daemon thread that ends the process when a collective waits too long, or when
    another rank of this machine has exited while we wait for it."""

    def __init__(self, group: _Group):
        self.group, self.what, self.since = group, None, 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name="tensorgrad-watchdog", daemon=True).start()

    @contextmanager
    def watch(self, what: str):
        with self.lock:
            self.what, self.since = what, time.monotonic()
        try:
            yield
        finally:
            with self.lock:
                self.what = None

    def _run(self):
        g = self.group
        while True:
            time.sleep(0.2)
            with self.lock:
                what, waited = self.what, time.monotonic() - self.since
            if what is None or waited < 1.0:
                continue
            for r, pid in g.peers.items():
                if not _alive(pid):
                    abort(
                        1,
                        f"tensorgrad.distributed: error: rank {g.rank}: rank {r} (pid "
                        f"{pid}) exited while rank {g.rank} waited in {what}; stopping",
                    )
            if waited > g.timeout:
                abort(
                    1,
                    f"tensorgrad.distributed: error: rank {g.rank}: {what} waited more "
                    f"than {g.timeout:g} s for the other ranks (one died, hung or skipped "
                    "it); stopping",
                )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by the launcher) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@contextmanager
def _watched(what: str):
    w = _g().watchdog
    if w is None:
        yield
    else:
        with w.watch(what):
            yield


# ----------------------------------------------------------------------------- collectives
def _mpi_op(op: str):
    MPI = _mpi()
    return {"mean": MPI.SUM, "sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def _is_gpu(a) -> bool:
    return get_array_module(a) is not np


def all_reduce(x, op: str = "sum", group=None, async_op: bool = False):
    """Reduce ``x`` over all ranks, elementwise; every rank gets the result, written into
    ``x``'s memory (as PyTorch: ``all_reduce(p.grad.data)`` changes p.grad). ``x``: a Tensor
    or a NumPy / CuPy array (reduced in place, so it must be contiguous). op: sum (the default, as in PyTorch), mean (floating point only),
    max or min, or a ``ReduceOp``. Returns ``x``. ``group`` must be None (the world);
    ``async_op`` must be False."""
    _check_world(group, async_op, "all_reduce")
    if op not in _OPS:
        raise ValueError(f"all_reduce: op must be one of {', '.join(_OPS)}, got {op!r}")
    is_tensor = isinstance(x, Tensor)
    a = x.array if is_tensor else x
    if op == "mean" and not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"all_reduce: op='mean' needs a floating-point array, got {a.dtype}")
    g = _g()
    if g.size == 1:
        return x
    if is_tensor:
        a = get_array_module(a).ascontiguousarray(a).copy()
    elif not a.flags.c_contiguous:
        raise ValueError("all_reduce: the array must be C-contiguous (it is reduced in place)")
    _all_reduce_inplace(a, op)
    if op == "mean":
        a *= a.dtype.type(1.0 / g.size)
    if is_tensor:
        _write_back(x, a)
    return x


def _write_back(t, a) -> None:
    """The result a into tensor t's own memory (a Tensor from .data shares it with its
    owner), counted as an in-place change."""
    get_array_module(a).copyto(t.array, a)
    t.mark_written()


def _all_reduce_inplace(a, op: str) -> None:
    """Sum / max / min of a contiguous array over the ranks, in place (no mean scaling)."""
    g = _g()
    with _watched(f"all-reduce of {a.size} x {a.dtype}"):
        if _is_gpu(a):
            _nccl(g).all_reduce(a, op)
        else:
            g.comm.Allreduce(_mpi().IN_PLACE, a, op=_mpi_op(op))


def broadcast(x, root: int = 0, group=None, async_op: bool = False, *, src: int | None = None):
    """Copy rank ``root``'s ``x`` (a Tensor or a contiguous array) to every rank, in place
    (``src`` is PyTorch's name for ``root``)."""
    _check_world(group, async_op, "broadcast")
    root = root if src is None else src
    g = _g()
    if g.size == 1:
        return x
    is_tensor = isinstance(x, Tensor)
    a = x.array if is_tensor else x
    if is_tensor:
        a = get_array_module(a).ascontiguousarray(a).copy()
    elif not a.flags.c_contiguous:
        raise ValueError("broadcast: the array must be C-contiguous (it is written in place)")
    with _watched(f"broadcast of {a.size} x {a.dtype}"):
        if _is_gpu(a):
            _nccl(g).broadcast(a, root)
        else:
            g.comm.Bcast(a, root=root)
    if is_tensor:
        _write_back(x, a)
    return x


def barrier(group=None, async_op: bool = False, device_ids=None) -> None:
    """Wait until every rank gets here."""
    _check_world(group, async_op, "barrier")
    g = _g()
    if g.size > 1:
        with _watched("barrier"):
            g.comm.Barrier()


def broadcast_json(obj, root: int = 0):
    """Rank ``root``'s JSON-able ``obj`` on every rank (sent as UTF-8 JSON bytes)."""
    g = _g()
    if g.size == 1:
        return obj
    data = json.dumps(obj).encode() if g.rank == root else b""
    n = np.array([len(data)], dtype=np.int64)
    with _watched("broadcast of a JSON object"):
        g.comm.Bcast(n, root=root)
        buf = np.frombuffer(data, np.uint8).copy() if g.rank == root else np.empty(n[0], np.uint8)
        g.comm.Bcast(buf, root=root)
    return json.loads(buf.tobytes().decode())


def _all_gather_json(comm, obj) -> list:
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.zeros(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([data.size], dtype=np.int64), sizes)
    out = np.empty(int(sizes.sum()), np.uint8)
    comm.Allgatherv(data, [out, sizes.tolist()])
    ends = np.cumsum(sizes)
    return [json.loads(out[e - s : e].tobytes().decode()) for s, e in zip(sizes, ends)]


def all_gather_json(obj) -> list:
    """Every rank's JSON-able ``obj``, as a list indexed by rank, on every rank."""
    g = _g()
    if g.size == 1:
        return [obj]
    with _watched("all-gather of JSON objects"):
        return _all_gather_json(g.comm, obj)


def same_on_all_ranks(arrays) -> bool:
    """Whether the arrays (a list, any device) are bitwise the same on every rank."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(to_numpy(a)).reshape(-1).view(np.uint8))
    digests = all_gather_json(h.hexdigest())
    return len(set(digests)) == 1


# ----------------------------------------------------------------------------- NCCL
class _Nccl:
    """One NCCL communicator over the world, on this rank's current GPU (untested here: the
    project's machines have no GPU)."""

    def __init__(self, g: _Group):
        self.nccl = nccl = _nccl_module()
        uid = np.zeros(
            nccl.NCCL_UNIQUE_ID_BYTES if hasattr(nccl, "NCCL_UNIQUE_ID_BYTES") else 128,
            dtype=np.int64,
        )
        if g.rank == 0:
            uid[:] = nccl.get_unique_id()
        g.comm.Bcast(uid, root=0)  # over MPI, so every rank joins the same NCCL clique
        self.comm = nccl.NcclCommunicator(g.size, tuple(int(v) for v in uid), g.rank)
        self.ops = {
            "mean": nccl.NCCL_SUM,
            "sum": nccl.NCCL_SUM,
            "max": nccl.NCCL_MAX,
            "min": nccl.NCCL_MIN,
        }
        self.types = {
            np.dtype(np.float32): nccl.NCCL_FLOAT32,
            np.dtype(np.float64): nccl.NCCL_FLOAT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16,
            np.dtype(np.int32): nccl.NCCL_INT32,
            np.dtype(np.int64): nccl.NCCL_INT64,
        }

    def _type(self, a):
        if a.dtype not in self.types:
            raise TypeError(f"NCCL cannot reduce {a.dtype} arrays")
        return self.types[a.dtype]

    def all_reduce(self, a, op: str) -> None:
        stream = require_cupy().cuda.get_current_stream()
        self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._type(a), self.ops[op], stream.ptr)
        stream.synchronize()  # inside the watched region: a hung peer shows up as a timeout

    def broadcast(self, a, root: int) -> None:
        stream = require_cupy().cuda.get_current_stream()
        self.comm.bcast(a.data.ptr, a.size, self._type(a), root, stream.ptr)
        stream.synchronize()


def _nccl(g: _Group) -> _Nccl:
    if g.nccl is None:
        g.nccl = _Nccl(g)  # a collective: every rank gets here at its first GPU reduction
    return g.nccl


# ----------------------------------------------------------------------------- PyTorch's names
class ReduceOp:
    """torch.distributed.ReduceOp: the reductions all_reduce takes (as its op strings)."""

    SUM, AVG, MAX, MIN = "sum", "mean", "max", "min"


BACKENDS = ("nccl", "gloo", "mpi")


def _check_world(group, async_op: bool, what: str) -> None:
    if group is not None:
        raise ValueError(f"{what}: only the world group (group=None) exists in tensorgrad")
    if async_op:
        raise ValueError(f"{what}: async_op=True is not supported (collectives are blocking)")


def is_available() -> bool:
    return True


def init_process_group(
    backend: str | None = None,
    init_method=None,
    timeout=None,
    world_size: int = -1,
    rank: int = -1,
    **kwargs,
) -> None:
    """PyTorch's name for ``init``: join this launch's process group. ``backend`` ('nccl',
    'gloo' or 'mpi') is checked and otherwise changes nothing: the group is MPI, and GPU
    arrays reduce with NCCL whatever was asked. ``timeout`` (seconds or a timedelta) bounds
    every collective. Start the processes with ``python -m tensorgrad.distributed.run``."""
    name = str(backend).split(":")[0].lower() if backend is not None else "mpi"
    if name not in BACKENDS:
        raise ValueError(f"init_process_group: backend must be one of {BACKENDS}, got {backend!r}")
    want = int(os.environ.get("WORLD_SIZE", world_size if world_size > 0 else 0) or 0)
    if want > 1 and launch_world_size() != want:
        raise DistributedError(
            f"WORLD_SIZE={want} but this process is not one of an MPI launch of {want} ranks: "
            f"start it with python -m tensorgrad.distributed.run --nproc_per_node {want} "
            "script.py (torchrun's TCP rendezvous is not supported)"
        )
    init(timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout)


def destroy_process_group(group=None) -> None:
    """Leave the process group (a later ``init_process_group`` joins it again)."""
    global _group
    _group = None


def get_rank(group=None) -> int:
    return rank()


def get_world_size(group=None) -> int:
    return world_size()


# ----------------------------------------------------------------------------- data parallel
class DataParallel:
    """Average the gradients of ``params`` over the ranks after each backward.

    A helper beside the model (the model is not wrapped, so its parameter names and
    checkpoints stay the same). The gradients are packed in parameter order into float32
    buckets of about ``bucket_mb`` MB and each bucket is summed with one all-reduce, then
    scaled by 1/world_size. A parameter whose gradient is None on some ranks counts as zero
    there; one with no gradient on any rank keeps None. For gradient accumulation pass
    ``sync=False`` on every micro-step but the last: the gradients then add up locally and
    are reduced once, as in nanoGPT. ``comm_seconds`` and ``comm_bytes`` add up the time spent
    inside the all-reduces and their payload (for benchmarks); packing is not counted.
    """

    def __init__(self, params, bucket_mb: float = 4.0, broadcast_from: int | None = 0):
        seen, self.params = set(), []
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        limit = max(1, int(bucket_mb * (1 << 20)) // 4)  # float32 elements per bucket
        self.buckets: list[list[int]] = [[]]
        n = 0
        for i, p in enumerate(self.params):
            if self.buckets[-1] and n + p.array.size > limit:
                self.buckets.append([])
                n = 0
            self.buckets[-1].append(i)
            n += p.array.size
        self.comm_seconds, self.comm_bytes, self.reductions = 0.0, 0, 0
        if broadcast_from is not None:
            self.broadcast_parameters(broadcast_from)

    def broadcast_parameters(self, root: int = 0) -> None:
        """Copy rank ``root``'s parameter values to every rank (bucketed, like the grads)."""
        if world_size() == 1:
            return
        for bucket in self.buckets:
            ps = [self.params[i] for i in bucket]
            xp = get_array_module(ps[0].array)
            flat = xp.concatenate([xp.ravel(p.array) for p in ps]).astype(np.float32, copy=False)
            broadcast(flat, root)
            o = 0
            for p in ps:
                n = p.array.size
                p.array[...] = flat[o : o + n].reshape(p.array.shape)  # in place: views stay valid
                o += n

    def backward(self, loss, sync: bool = True) -> None:
        """``loss.backward()``, then (with sync) average the gradients over the ranks."""
        loss.backward()
        if sync:
            self.reduce_gradients()

    def reduce_gradients(self) -> None:
        """Replace every parameter's gradient by its mean over the ranks."""
        n_ranks = world_size()
        if n_ranks == 1:
            return
        for bucket in self.buckets:
            ps = [self.params[i] for i in bucket]
            ref = next((p.grad.array for p in ps if p.grad is not None), ps[0].array)
            xp = get_array_module(ref)
            sizes = [p.array.size for p in ps]
            flat = xp.empty(sum(sizes) + len(ps), dtype=np.float32)  # grads, then has-grad flags
            o = 0
            for p, n in zip(ps, sizes):
                flat[o : o + n] = 0 if p.grad is None else xp.ravel(p.grad.array)
                o += n
            flat[o:] = xp.asarray([p.grad is not None for p in ps], dtype=np.float32)
            t0 = time.perf_counter()
            _all_reduce_inplace(flat, "sum")
            self.comm_seconds += time.perf_counter() - t0
            flags = flat[o:].tolist()
            flat *= np.float32(1.0 / n_ranks)
            o = 0
            for p, n, has in zip(ps, sizes, flags):
                if has > 0:
                    g = flat[o : o + n].reshape(
                        p.array.shape
                    )  # a fresh buffer each step: no aliasing
                    g = g if g.dtype == p.array.dtype else g.astype(p.array.dtype)
                    p.grad = Tensor(g)  # holds g itself: no copy
                o += n
            self.comm_bytes += flat.nbytes
        self.reductions += 1


__all__ = [
    "BACKENDS",
    "DataParallel",
    "ReduceOp",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "DistributedError",
    "abort",
    "all_gather_json",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_json",
    "init",
    "is_initialized",
    "launch_rank",
    "launch_world_size",
    "local_rank",
    "local_world_size",
    "rank",
    "same_on_all_ranks",
    "use_local_gpu",
    "world_size",
]
