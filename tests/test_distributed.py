"""Data-parallel training on localhost: `mpiexec -n 2` against one process, collectives, faults.

Every multi-rank test starts `mpiexec -n 2` (the MPI of the [mpi] extra, next to this Python)
on tests/mpi_worker.py with a tiny model and corpus; they skip, saying why, when mpi4py or
mpiexec is missing (pip install -e ".[test,mpi]"). The last test needs no MPI.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpt import train
from gpt.store import run_checkpoint as rc

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "mpi_worker.py")
TINY = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--eval-iters",
    "2",
    "--dropout",
    "0",
    "--warmup-iters",
    "2",
    "--no-sample",
]
RUN = ["--max-iters", "20", "--eval-interval", "10"]
TIMEOUT = 120  # per launch; a hang fails the test instead of blocking CI


def _mpiexec() -> list[str] | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    exe = Path(sys.executable).parent / "mpiexec"
    exe = str(exe) if exe.exists() else shutil.which("mpiexec")
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
    extra = ["--allow-run-as-root", "--oversubscribe"] if "Open MPI" in out else []
    return [exe, *extra]


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(
    MPIEXEC is None,
    reason='mpi4py or mpiexec missing: pip install -e ".[test,mpi]" to run the multi-rank tests',
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few KB of text and a private data cache (as in test_train.py)."""
    d = tmp_path_factory.mktemp("corpus")
    rnd = random.Random(0)
    words = [
        "the",
        "king",
        "and",
        "queen",
        "of",
        "a",
        "far",
        "land",
        "rode",
        "out",
        "at",
        "dawn",
        "to",
        "see",
        "what",
        "lay",
        "beyond",
    ]
    for name in ("a.txt", "b.txt"):
        lines = (" ".join(rnd.choice(words) for _ in range(10)) for _ in range(60))
        (d / name).write_text("\n".join(lines) + "\n")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT_CACHE_DIR", str(cache))
        yield d


def _env(dist_timeout=30):
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        TG_DIST_TIMEOUT=str(dist_timeout),
    )


def mpirun(n, *worker_args, dist_timeout=30, waiting_for="the ranks to finish"):
    """mpiexec -n n python tests/mpi_worker.py ARGS; returns the CompletedProcess. A launch
    still running after TIMEOUT s is killed with its ranks and fails the test, saying what it
    was waiting for."""
    cmd = [*MPIEXEC, "-n", str(n), sys.executable, WORKER, *worker_args]
    env = _env(dist_timeout)
    with subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as p:
        try:
            out, err = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            p.terminate()  # mpiexec passes SIGTERM on to the ranks and cleans up
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = "", "(mpiexec ignored SIGTERM: killed, its output lost)"
            pytest.fail(
                f"waited {TIMEOUT} s for {waiting_for}; killed `mpiexec -n {n} "
                f"mpi_worker.py {' '.join(worker_args[:2])}`\n{(out + err)[-2000:]}",
                pytrace=False,
            )
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def gpt_train(n, corpus, out, *args, fault=None, dist_timeout=30, waiting_for=None):
    return mpirun(
        n,
        "train",
        *([fault] if fault else []),
        "--",
        "--data",
        str(corpus),
        "--out-dir",
        str(out),
        *TINY,
        *args,
        dist_timeout=dist_timeout,
        waiting_for=waiting_for or "the ranks to finish",
    )


def records(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def losses(out):
    """(iter, kind, value) for every step loss and evaluation in metrics.jsonl."""
    rows = []
    for r in records(out):
        for k in ("loss", "train_loss", "val_loss"):
            if r.get(k) is not None:
                rows.append((r["iter"], k, r[k]))
    return rows


def assert_close(a, b, exact=False):
    la, lb = losses(a), losses(b)
    assert [x[:2] for x in la] == [x[:2] for x in lb]
    va, vb = np.array([x[2] for x in la]), np.array([x[2] for x in lb])
    if exact:
        np.testing.assert_array_equal(va, vb)
    else:  # float32 reduction order only
        np.testing.assert_allclose(va, vb, rtol=2e-5, atol=0)


@pytest.fixture(scope="module")
def one_rank(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    assert train.main(["--data", str(corpus), "--out-dir", str(out), *TINY, *RUN]) == 0
    return out


@pytest.fixture(scope="module")
def two_ranks(corpus, tmp_path_factory):
    if MPIEXEC is None:
        pytest.skip('mpi4py or mpiexec missing: pip install -e ".[test,mpi]"')
    out = tmp_path_factory.mktemp("two")
    p = gpt_train(2, corpus, out, *RUN)
    assert p.returncode == 0, p.stderr
    return out, p


@needs_mpi
def test_collectives_and_bucketed_all_reduce_match_numpy(tmp_path):
    res_path = tmp_path / "res.json"
    p = mpirun(2, "collectives", str(res_path))
    assert p.returncode == 0, p.stderr
    res = json.loads(res_path.read_text())
    assert res["world"] == 2 and res["buckets"] >= 3 and res["broadcast_ok"]
    assert res["grad_worst"] <= 1e-6, "bucketed gradient mean differs from the NumPy mean"
    assert res["sum"] == [3.0 * i for i in range(6)] and res["max"] == [1]
    assert res["mean_tensor"] == [1.5] * 3 and res["broadcast_from_1"] == [1.0] * 4
    assert res["through_data"] == [[6.0] * 3, [2.0] * 3]  # written into the tensors' memory
    assert res["json"] == {"from": 1} and res["gather"] == [{"r": 0, "s": ""}, {"r": 1, "s": "x"}]


@needs_mpi
def test_gpu_arrays_reduce_through_nccl(tmp_path):
    """The NCCL path on stand-ins (no GPU here): a host array registered as the 'cuda' device
    and a fake cupy.cuda.nccl whose communicator reduces the memory behind each pointer over
    MPI; checks the unique-id broadcast, the pointers, counts, dtypes and ops passed."""
    res_path = tmp_path / "res.json"
    p = mpirun(2, "fake-nccl", str(res_path))
    assert p.returncode == 0, p.stderr
    res = json.loads(res_path.read_text())
    assert res["on_gpu"] and res["broadcast_ok"] and res["grad_worst"] <= 1e-6
    assert res["max"] == [1, 1, 1]
    assert res["calls"][0] == "init" and "bcast" in res["calls"] and "allReduce" in res["calls"]


@needs_mpi
def test_two_ranks_reproduce_one_rank(one_rank, two_ranks):
    out, p = two_ranks
    assert_close(one_rank, out)
    assert p.stdout.count("final val loss") == 1  # only rank 0 prints
    assert p.stderr.count("iter 20: train loss") == 1 and "distributed: 2 ranks" in p.stderr
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["world_size"] == 2 and len(ckpt["rng_ranks"]) == 2
    _, w1, _ = rc.load(one_rank)
    _, w2, _ = rc.load(out)
    for k in w1:
        np.testing.assert_allclose(w1[k], w2[k], rtol=1e-4, atol=1e-5, err_msg=k)  # key biases:
        # no gradient in exact arithmetic, so AdamW turns rounding noise into ~1e-6 steps
    assert not list(out.glob(".*.tmp"))


@needs_mpi
def test_two_rank_checkpoint_loads_in_one_process(two_ranks, capsys):
    from gpt import sample

    out, _ = two_ranks
    model, tok, ckpt, _ = rc.load_model(out, "latest")
    assert ckpt["iter"] == 20 and tok.vocab_size == model.config.vocab_size
    assert sample.main(["--out-dir", str(out), "--num-samples", "1", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.strip()


@needs_mpi
def test_resume_same_ranks_is_exact_and_other_ranks_close(corpus, two_ranks, tmp_path):
    full, _ = two_ranks
    half = ["--max-iters", "10", "--eval-interval", "10", "--lr-decay-iters", "20"]
    two = tmp_path / "two"
    p = gpt_train(2, corpus, two, *half)
    assert p.returncode == 0, p.stderr
    two_then_one = tmp_path / "two-then-one"
    shutil.copytree(two, two_then_one)
    p = mpirun(2, "train", "--", "--resume", "--out-dir", str(two), "--max-iters", "20")
    assert p.returncode == 0, p.stderr
    assert_close(full, two, exact=True)  # same N: bitwise
    assert train.main(["--resume", "--out-dir", str(two_then_one), "--max-iters", "20"]) == 0
    assert_close(full, two_then_one)  # 2 ranks -> 1 process: same data, float32 tolerance
    one_then_two = tmp_path / "one-then-two"
    assert train.main(["--data", str(corpus), "--out-dir", str(one_then_two), *TINY, *half]) == 0
    p = mpirun(2, "train", "--", "--resume", "--out-dir", str(one_then_two), "--max-iters", "20")
    assert p.returncode == 0, p.stderr
    assert_close(full, one_then_two)  # 1 process -> 2 ranks


@needs_mpi
def test_grad_accum_splits_into_micro_steps(corpus, tmp_path):
    args = ["--batch-size", "4", "--grad-accum", "3", "--max-iters", "4", "--eval-interval", "4"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert train.main(["--data", str(corpus), "--out-dir", str(a), *TINY, *args]) == 0
    p = gpt_train(2, corpus, b, *args)  # 12 sequences a step: 6 per rank, micro-batches 3 + 3
    assert p.returncode == 0, p.stderr
    assert "micro-batches of [3, 3]" in p.stderr
    assert_close(a, b)


@needs_mpi
def test_uneven_batch_is_refused_in_one_line(corpus, tmp_path):
    p = gpt_train(2, corpus, tmp_path / "o", "--batch-size", "3", "--max-iters", "2")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("gpt-train: error:") and "split evenly over 2 ranks" in lines[0]


@needs_mpi
def test_a_rank_that_raises_stops_all_with_one_line(corpus, tmp_path):
    p = gpt_train(
        2,
        corpus,
        tmp_path / "o",
        "--max-iters",
        "1000",
        "--eval-interval",
        "500",
        fault="raise",
        waiting_for="both ranks to stop after rank 1 raised at step 4 (of 1000)",
    )
    assert p.returncode == 1, p.stderr
    err = [ln for ln in p.stderr.replace("\r", "\n").splitlines() if "error:" in ln]
    assert err and "gpt-train: error: rank 1: [Errno 5] Input/output error (injected)" in err[0]


@needs_mpi
def test_a_killed_rank_stops_the_run(corpus, tmp_path):
    p = gpt_train(
        2,
        corpus,
        tmp_path / "o",
        "--max-iters",
        "100000",
        "--eval-interval",
        "500",
        fault="kill",
        waiting_for="the surviving rank to stop after rank 1 was killed at step 4 (of 100000)",
    )
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "rank 1" in out or "BAD TERMINATION" in out or "exited" in out, out[-2000:]


@needs_mpi
def test_a_hung_rank_stops_the_run_after_the_timeout(corpus, tmp_path):
    p = gpt_train(
        2,
        corpus,
        tmp_path / "o",
        "--max-iters",
        "1000",
        "--eval-interval",
        "500",
        fault="hang",
        dist_timeout=3,
        waiting_for="rank 0 to give up its all-reduce (TG_DIST_TIMEOUT=3) on hung rank 1",
    )
    assert p.returncode == 1, p.stderr
    assert "rank 0: all-reduce" in p.stderr and "waited more than 3 s" in p.stderr, p.stderr


@needs_mpi
def test_sigterm_on_one_rank_saves_once_and_stops_all(corpus, tmp_path):
    out, pids = tmp_path / "sig", tmp_path / "pid"
    cmd = [
        *MPIEXEC,
        "-n",
        "2",
        sys.executable,
        WORKER,
        "train",
        f"pidfile={pids}",
        "--",
        "--data",
        str(corpus),
        "--out-dir",
        str(out),
        *TINY,
        "--max-iters",
        "100000",
        "--eval-interval",
        "20",
    ]
    proc = subprocess.Popen(
        cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and not (out / "ckpt.json").exists():
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        os.kill(int(Path(f"{pids}.1").read_text()), signal.SIGTERM)  # rank 1 only
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert err.count("SIGTERM: stopped at iter") == 1 and "--resume" in err
    ckpt, weights, optim = rc.load(out)
    assert ckpt["iter"] >= 20 and weights and optim is not None
    steps = [r for r in records(out) if "loss" in r]
    assert steps[-1]["iter"] == ckpt["iter"] - 1  # every finished step is in the checkpoint


def test_multi_rank_launch_without_mpi4py_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    """What a user without the [mpi] extra sees under a system mpiexec (simulated)."""
    import tensorgrad.distributed as dist

    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now fails
    monkeypatch.setattr(dist, "_group", None)
    code = train.main(["--data", str(corpus), "--out-dir", str(tmp_path / "o"), *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert 'pip install -e ".[mpi]"' in err and "2 ranks" in err
