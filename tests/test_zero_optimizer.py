"""ZeroRedundancyOptimizer (ZeRO-1, issue 50) against plain AdamW: in one process it is the
plain optimizer, bitwise; over 2 ranks (`mpiexec -n 2` on tests/zero_worker.py) each rank holds
the state of its own partition only, the parameters stay bitwise those of one process's AdamW
on the averaged gradients, and the consolidated state dict is the plain one and restores.

An AdamW update is elementwise, so a parameter updated on its owner rank gets exactly the
arithmetic the plain optimizer would apply to it, and the broadcast copies bits: every
comparison here is bitwise.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zero_worker as w
from test_distributed import MPIEXEC

import tensorgrad as tg
from tensorgrad.distributed.optim import ZeroRedundancyOptimizer

ROOT = Path(__file__).resolve().parents[1]
OWNERS = {0: [0, 2, 4, 6], 1: [1, 3, 5]}  # PyTorch's greedy partition of w.SHAPES over 2 ranks


def plain(steps: int, n: int = 1):
    """(parameters, AdamW) after ``steps`` steps of one process on n ranks' averaged grads."""
    params = [tg.nn.Parameter(a) for a in w.initial()]
    opt = w.build(params, zero=False)
    w.train(opt, params, range(steps), lambda k, i: w.mean_grad(k, i, n))
    return params, opt


def assert_same_state_dict(got: dict, want: dict) -> None:
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"])
    for i, st in want["state"].items():
        assert got["state"][i].keys() == st.keys()
        for k, v in st.items():
            if hasattr(v, "shape"):
                assert np.array_equal(got["state"][i][k].array, v.array), (i, k)
            else:
                assert got["state"][i][k] == v, (i, k)


def assert_same_params(got, want) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = getattr(a, "array", a), getattr(b, "array", b)
        assert np.array_equal(a, b), f"parameter {i} {w.SHAPES[i]}: worst {np.abs(a - b).max()}"


# ----------------------------------------------------------------------------- one process
def test_one_process_is_the_plain_optimizer_bitwise():
    params = [tg.nn.Parameter(a) for a in w.initial()]
    zero = w.build(params, zero=True)
    w.train(zero, params, range(w.STEPS), lambda k, i: w.mean_grad(k, i, 1))
    want, opt = plain(w.STEPS)
    assert_same_params(params, want)
    assert [dict(g, params=None) for g in zero.param_groups] == [
        dict(g, params=None) for g in opt.param_groups
    ]
    assert sum(len(g["params"]) for g in zero.param_groups) == len(w.SHAPES)


def test_state_dict_is_consolidated_then_round_trips():
    params = [tg.nn.Parameter(a) for a in w.initial()]
    zero = w.build(params, zero=True)
    w.train(zero, params, range(w.STEPS), lambda k, i: w.mean_grad(k, i, 1))
    with pytest.raises(RuntimeError, match=r"consolidate_state_dict\(to=0\)"):
        zero.state_dict()  # PyTorch's rule, in one process too: a script runs the same on N
    zero.consolidate_state_dict(to=0)
    want, opt = plain(w.STEPS)
    assert_same_state_dict(zero.state_dict(), opt.state_dict())

    again = [tg.nn.Parameter(p.array.copy()) for p in params]
    restored = w.build(again, zero=True)
    restored.load_state_dict(zero.state_dict())
    assert restored.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    more = range(w.STEPS, w.STEPS + w.MORE)
    w.train(restored, again, more, lambda k, i: w.mean_grad(k, i, 1))
    w.train(opt, want, more, lambda k, i: w.mean_grad(k, i, 1))
    assert_same_params(again, want)


def test_zero_grad_and_what_is_refused():
    params = [tg.nn.Parameter(a) for a in w.initial()]
    zero = w.build(params, zero=True)
    for p in params:
        p.grad = tg.ones(*p.shape)
    zero.zero_grad()
    assert all(p.grad is None for p in params)
    with pytest.raises(ValueError, match="only the world group"):
        ZeroRedundancyOptimizer(params, tg.optim.AdamW, process_group=object())
    with pytest.raises(ValueError, match="overlap_with_ddp"):
        ZeroRedundancyOptimizer(params, tg.optim.AdamW, overlap_with_ddp=True)


# ----------------------------------------------------------------------------- two ranks
@pytest.mark.skipif(
    MPIEXEC is None,
    reason='mpi4py or mpiexec missing: pip install -e ".[mpi]" to run the 2-rank test',
)
def test_two_ranks_shard_the_state_and_match_plain_adamw(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env["TG_DIST_TIMEOUT"] = "30"  # a rank that fails stops the other in bounded time
    cmd = [*MPIEXEC, "-n", "2", sys.executable, str(ROOT / "tests" / "zero_worker.py")]
    p = subprocess.run(
        [*cmd, str(tmp_path)],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    sizes = [int(np.prod(s)) for s in w.SHAPES]
    for r in (0, 1):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["world"] == 2
        held = {int(i): n for i, n in res["held"].items()}
        assert held == {i: sizes[i] for i in OWNERS[r]}, f"rank {r} holds state for {held}"
    assert "consolidate_state_dict(to=1)" in res["error"]  # rank 1 did not consolidate

    want5, opt = plain(w.STEPS, n=2)
    assert_same_state_dict(tg.load(tmp_path / "state.pt"), opt.state_dict())
    want7, _ = plain(w.STEPS + w.MORE, n=2)
    for r in (0, 1):
        with np.load(tmp_path / f"params5.{r}.npz") as f:
            assert_same_params([f[f"arr_{i}"] for i in range(len(w.SHAPES))], want5)
        with np.load(tmp_path / f"params7.{r}.npz") as f:  # after load_state_dict
            assert_same_params([f[f"arr_{i}"] for i in range(len(w.SHAPES))], want7)
