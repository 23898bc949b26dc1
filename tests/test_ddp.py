"""PyTorch's distributed names on tensorgrad (issue 28): init_process_group and friends,
DistributedDataParallel (sync after backward, require_backward_grad_sync, no_sync), and the
torchrun-style launcher: 2 ranks of a nanoGPT-style script log one process's losses."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.distributed as dist
from tensorgrad.nn.parallel import DistributedDataParallel as DDP

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "ddp_worker.py")


def _has_mpi() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return (Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec") is not None


needs_mpi = pytest.mark.skipif(not _has_mpi(), reason='pip install -e ".[test,mpi]" for mpiexec')


@pytest.fixture
def one_rank(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(dist, "_group", None)


def test_process_group_names_in_one_process(one_rank):
    dist.init_process_group(backend="nccl")
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    t = tg.tensor([1.0, 2.0])
    assert dist.all_reduce(t, op=dist.ReduceOp.SUM) is t and t.tolist() == [1.0, 2.0]
    dist.barrier()
    dist.destroy_process_group()
    assert not dist.is_initialized()


def test_process_group_errors(one_rank, monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of"):
        dist.init_process_group(backend="ucc")
    with pytest.raises(ValueError, match="only the world group"):
        dist.all_reduce(tg.zeros(1), group=object())
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would set, but no MPI launch
    with pytest.raises(dist.DistributedError, match="tensorgrad.distributed.run"):
        dist.init_process_group(backend="gloo")


class Counted(tg.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tg.nn.Linear(3, 1)

    def forward(self, x):
        return self.lin(x).sum()


def counted_ddp(one_rank_fixture=None):
    model = DDP(Counted(), device_ids=[0])
    seen = []
    # what the reducer sees: whether every gradient is already there when it runs
    model.reducer.reduce_gradients = lambda: seen.append(
        all(p.grad is not None for p in model.parameters())
    )
    return model, seen


def test_ddp_reduces_once_after_each_synced_backward(one_rank):
    model, seen = counted_ddp()
    x = tg.randn(2, 3)
    model(x).backward()
    assert seen == [True]
    model.require_backward_grad_sync = False
    model(x).backward()
    assert seen == [True]
    model.require_backward_grad_sync = True
    with model.no_sync():
        model(x).backward()
    assert seen == [True] and model.require_backward_grad_sync
    model(x).backward()
    assert seen == [True, True]
    with tg.no_grad():
        model(x)
    assert seen == [True, True]
    assert isinstance(model.module, Counted)
    assert list(model.state_dict()) == ["module.lin.weight", "module.lin.bias"]


def test_ddp_queued_reduction_is_dropped_when_backward_fails(one_rank):
    model, seen = counted_ddp()
    out = model(tg.randn(2, 3))
    with pytest.raises(RuntimeError):
        out.backward(tg.ones(5))  # wrong gradient shape
    tg.nn.Linear(1, 1)(tg.ones(1, 1)).sum().backward()  # another graph's backward
    assert seen == []


def run_worker(tmp_path, *launcher):
    out = tmp_path / f"out{len(launcher)}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env["TG_DIST_TIMEOUT"] = "30"  # a rank that fails stops the other in bounded time
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(v, None)
    p = subprocess.run(
        [sys.executable, *launcher, WORKER, str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


@needs_mpi
def test_two_ranks_give_one_process_losses(tmp_path):
    one = run_worker(tmp_path)
    two = run_worker(tmp_path, "-m", "tensorgrad.distributed.run", "--nproc_per_node", "2")
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=2e-5)
    assert one["losses"][-1] < one["losses"][0]
    for k, w in one["weights"].items():
        np.testing.assert_allclose(two["weights"][k], w, rtol=1e-4, atol=1e-6, err_msg=k)
    assert two["reductions"] == 6  # one all-reduce per optimizer step, not per micro-step


def test_launcher_refuses_multi_node():
    p = subprocess.run(
        [sys.executable, "-m", "tensorgrad.distributed.run", "--nnodes", "2", WORKER, "x"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode != 0 and "one machine only" in p.stderr
