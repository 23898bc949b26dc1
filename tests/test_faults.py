"""Fault injection on gpt-train and gpt-sample: each fault ends in one line and loses nothing.

Replays issue 13's faults: two writers on one run directory, tampered checkpoints (ckpt.json,
weight files, GPT-2 config.json / vocab.json), absurd sizes, divergence, signals during
evaluation and before training, FIFOs and devices as data. Each asserts the exit code, a
single error line (no traceback) and that the previous checkpoint still loads. Most run
in-process on a tiny model; the ones that could hang or allocate without bound run in a
subprocess with a timeout and an address-space limit.
"""

import hashlib
import json
import math
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_train import ROOT, TINY, records, run

from gpt import data as gdata
from gpt import sample, train
from gpt.store import run_checkpoint as rc
from gpt.store.errors import CheckpointError
from gpt.store.lock import LOCK_FILE, RunLock
from gpt.train import loop as train_loop
from gpt.train import setup as train_setup

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
MEM_LIMIT = 3 << 30  # address space of a subprocess: an allocation bug fails fast, not slowly


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few KB of text in a folder of two .txt files, and a private data cache."""
    d = tmp_path_factory.mktemp("corpus")
    words = ["the", "king", "and", "queen", "of", "a", "far", "land", "rode", "out", "at", "dawn"]
    g = np.random.default_rng(0)
    for name in ("a.txt", "b.txt"):
        lines = (" ".join(g.choice(words, 10)) for _ in range(60))
        (d / name).write_text("\n".join(lines) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield d


def error_line(err: str, prog: str = "gpt-train") -> str:
    """The one error line of a run that also printed progress."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(lines) == 1, err
    return lines[0]


def one_line(err: str, prog: str = "gpt-train") -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), err
    return lines[0]


def cli(*args, timeout=60, env=None):
    """python -m gpt.train|sample in a subprocess, with a timeout and an address-space limit."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))

    e = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", *args],
        env=e,
        cwd=ROOT,
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


@pytest.fixture(scope="module")
def base_run(corpus, tmp_path_factory):
    """A finished 4-iteration run (checkpoints at 2 and 4) to copy and tamper with."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert run(corpus, out, "--max-iters", "4", "--eval-interval", "2")[0] == 0
    return out


def copy_run(base_run, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(base_run, d)
    return d


def ckpt_of(d) -> dict:
    return json.loads((Path(d) / "ckpt.json").read_text())


def write_ckpt(d, ckpt) -> None:
    (Path(d) / "ckpt.json").write_text(json.dumps(ckpt))


def contents(d) -> dict:
    """{relative path: sha256} of every file under run directory d."""
    d = Path(d)
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def assert_untouched(d, before: dict) -> None:
    """Nothing in d was rewritten, removed or added (ckpt.json, weights, metrics, lock)."""
    after = contents(d)
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    assert not (changed or added or removed), f"changed {changed}, added {added}, removed {removed}"


# ----------------------------------------------------------------------------- 1. the lock
def test_a_second_run_on_a_new_out_dir_is_told_another_run_holds_it(corpus, tmp_path, capsys):
    """Two gpt-train started at once on one new --out-dir: the first has written
    metrics.jsonl but no checkpoint yet; the second is told the directory is in use, not that
    a file of the user's is in the way."""
    out = tmp_path / "new"
    with RunLock(out):  # the first run, holding the lock (this process: no race to wait for)
        (out / "metrics.jsonl").write_text("")
        code = train.main(["--data", str(corpus), "--out-dir", str(out), *TINY])
    line = one_line(capsys.readouterr().err)
    assert code == 2 and "in use by another gpt-train" in line, line


def test_second_writer_is_refused_and_a_stale_lock_is_taken_over(corpus, tmp_path, capsys):
    out = tmp_path / "busy"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpt.train",
            "--data",
            str(corpus),
            "--out-dir",
            str(out),
            *TINY,
            "--max-iters",
            "100000",
            "--eval-interval",
            "1",
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (out / "ckpt.json").exists():
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
        for extra in (["--resume"], ["--overwrite", "--data", str(corpus), *TINY]):
            code = train.main(["--out-dir", str(out), *extra])
            line = one_line(capsys.readouterr().err)
            assert code == 1 and f"PID {proc.pid}" in line and "in use" in line
        proc.send_signal(signal.SIGKILL)  # dies holding the lock: the OS releases it
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpt, weights, optim = rc.load(out)  # the writer's files were not touched by the others
    assert weights and optim is not None
    assert (
        train.main(["--resume", "--out-dir", str(out), "--max-iters", str(ckpt["iter"] + 1)]) == 0
    )
    err = capsys.readouterr().err
    assert "stale lock" in err and f"PID {proc.pid}" in err
    assert (out / LOCK_FILE).read_text() == ""  # a clean exit leaves no PID behind
    assert (
        train.main(["--resume", "--out-dir", str(out), "--max-iters", str(ckpt["iter"] + 2)]) == 0
    )
    assert "stale" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- 2. ckpt.json
def _set(path: str, value):
    """A mutation that sets ckpt[path] (dotted, list indices as numbers) to value (or to
    value(ckpt, d) when callable); DELETE removes the key."""

    def f(ckpt, d):
        *head, last = path.split(".")
        node = ckpt
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value(ckpt, d) if callable(value) else value
        return ckpt

    return f


DELETE = object()


def _fifo(ckpt, d):
    os.mkfifo(d / "model-fifo.safetensors")
    return "model-fifo.safetensors"


def _symlink(target):
    def f(ckpt, d):
        (d / "model-link.safetensors").symlink_to(target)
        return "model-link.safetensors"

    return f


def _smaller_tokenizer(ckpt, d):
    return dict(ckpt["tokenizer"], chars=ckpt["tokenizer"]["chars"][:-3])


CKPT_CASES = {
    "iter as a string": _set("iter", "10"),
    "negative iter": _set("iter", -1),
    "fractional iter": _set("iter", 1.5),
    "files as a list": _set("files", []),
    "files missing": _set("files", DELETE),
    "climbing file name": _set("files.model", "../../../../etc/passwd"),
    "absolute file name": _set("files.model", "/dev/zero"),
    "symlink to /dev/zero": _set("files.model", _symlink("/dev/zero")),
    "symlink outside": _set("files.model", _symlink("/etc/passwd")),
    "FIFO weights": _set("files.model", _fifo),
    "missing weights": _set("files.model", "model-999999.safetensors"),
    "climbing optim name": _set("files.optim", "../optim.safetensors"),
    "unknown files entry": _set("files.extra", "x"),
    "n_layer 1000000": _set("model_config.n_layer", 1000000),
    "n_embd 10**9": _set("model_config.n_embd", 10**9),
    "n_layer as a string": _set("model_config.n_layer", "2"),
    "n_layer 3 (weights have 1)": _set("model_config.n_layer", 3),
    "vocab_size smaller than the weights": _set("model_config.vocab_size", 5),
    "model_config as a list": _set("model_config", [1, 2]),
    "dropout 2": _set("model_config.dropout", 2),
    "bias as a string": _set("model_config.bias", "yes"),
    "unknown model_config key": _set("model_config.n_expert", 8),
    "smaller tokenizer than the weights": _set("tokenizer", _smaller_tokenizer),
    "tokenizer type": _set("tokenizer.type", "word"),
    "tokenizer as a string": _set("tokenizer", "char"),
    "chars as a list": _set("tokenizer.chars", ["a", "b"]),
    "rng seed as a string": _set("rng.seed", "x"),
    "rng state empty": _set("rng.cpu", {}),
    "sampler state a number": _set("samplers.train", 5),
    "samplers missing": _set("samplers", DELETE),
    "optim steps as strings": _set("optim.steps", {"0": "1"}),
    "optim param_groups a string": _set("optim.param_groups", "x"),
    "optim lr NaN": _set("optim.param_groups.0.lr", float("nan")),
    "train_config max_iters a string": _set("train_config.max_iters", "10"),
    "train_config lr a string": _set("train_config.lr", "fast"),
    "train_config negative batch": _set("train_config.batch_size", -4),
    "train_config as a list": _set("train_config", [1]),
    "val_loss a string": _set("val_loss", "low"),
    "elapsed_s negative": _set("elapsed_s", -5),
    "source_hash a number": _set("data.source_hash", 5),
    "wrong sha256": _set("sha256.model", "0" * 64),
    "sha256 not hex": _set("sha256.model", "zz"),
    "ckpt.json a list": lambda ckpt, d: [ckpt],
}
# what gpt-sample does not read, so it still samples
SAMPLE_OK = {
    "samplers missing",
    "train_config max_iters a string",
    "train_config lr a string",
    "train_config negative batch",
}


@pytest.mark.parametrize("case", sorted(CKPT_CASES))
def test_tampered_ckpt_json_is_one_line(base_run, tmp_path, capsys, case):
    d = copy_run(base_run, tmp_path)
    tampered = CKPT_CASES[case](ckpt_of(d), d)
    write_ckpt(d, tampered)
    before = contents(d)
    code = train.main(["--resume", "--out-dir", str(d), "--max-iters", "6"])
    line = one_line(capsys.readouterr().err)
    assert code == 1, line
    assert_untouched(d, before)  # nothing was overwritten or written
    code = sample.main(
        ["--out-dir", str(d), "--which", "latest", "--max-new-tokens", "2", "--num-samples", "1"]
    )
    err = capsys.readouterr().err
    if case in SAMPLE_OK:
        assert code == 0, err
    else:
        assert code == 1, err
        one_line(err, "gpt-sample")


@pytest.mark.parametrize("text", ["{not json", "", '{"format": "something else"}'])
def test_unreadable_ckpt_json(base_run, tmp_path, capsys, text):
    d = copy_run(base_run, tmp_path)
    (d / "ckpt.json").write_text(text)
    assert train.main(["--resume", "--out-dir", str(d)]) == 1
    one_line(capsys.readouterr().err)


def test_absurd_model_config_is_refused_fast_in_bounded_memory(base_run, tmp_path):
    """The issue's n_layer 1000000 took 38 s and 6 GB before a traceback."""
    for key, value in (("n_layer", 1000000), ("n_embd", 10**9), ("block_size", 10**6)):
        d = copy_run(base_run, tmp_path / key)
        ckpt = ckpt_of(d)
        ckpt["model_config"][key] = value
        write_ckpt(d, ckpt)
        for args in (
            ["gpt.train", "--resume", "--out-dir", str(d)],
            ["gpt.sample", "--out-dir", str(d), "--which", "latest"],
        ):
            p = cli(*args, timeout=30)
            assert p.returncode == 1, p.stderr
            one_line(p.stderr, args[0].replace(".", "-"))


# ----------------------------------------------------------------------------- 3. weights
def _data_start(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def _flip(path: Path, n=1000):
    raw = bytearray(path.read_bytes())
    start = _data_start(path)
    for i in np.random.default_rng(0).choice(len(raw) - start, n, replace=False):
        raw[start + i] ^= 0xFF
    path.write_bytes(bytes(raw))


def _relabel(path: Path):
    raw = path.read_bytes()
    head = raw[8 : _data_start(path)]
    i = head.index(b'"transformer.wte.weight":{"dtype":"F32"')
    head = head[:i] + head[i:].replace(b"F32", b"I32", 1)
    path.write_bytes(raw[:8] + head + raw[_data_start(path) :])


def _nan_consistent(d: Path):
    """NaN weights with a matching sha256: a bug that saved NaN, not a corrupt file."""
    from gpt.store.checkpoint import load_arrays, save_arrays

    ckpt = ckpt_of(d)
    path = d / ckpt["files"]["model"]
    arrays = load_arrays(path)
    arrays["transformer.ln_f.weight"][3] = np.nan
    ckpt["sha256"]["model"] = save_arrays(path, arrays)
    write_ckpt(d, ckpt)


@pytest.mark.parametrize(
    "fault",
    [
        "flip 1000 bytes",
        "wte relabelled I32",
        "truncated",
        "padded",
        "NaN weights",
        "optim flipped",
        "optim swapped",
    ],
)
def test_corrupt_weights_are_named_not_trained_on(base_run, tmp_path, capsys, fault):
    d = copy_run(base_run, tmp_path)
    files = ckpt_of(d)["files"]
    model, optim = d / files["model"], d / files["optim"]
    if fault == "flip 1000 bytes":
        _flip(model)
    elif fault == "wte relabelled I32":
        _relabel(model)
    elif fault == "truncated":
        model.write_bytes(model.read_bytes()[:-100])
    elif fault == "padded":
        model.write_bytes(model.read_bytes() + b"\0" * 64)
    elif fault == "NaN weights":
        _nan_consistent(d)
    elif fault == "optim flipped":
        _flip(optim, 100)
    else:
        shutil.copy(model, optim)
    before = contents(d)
    code = train.main(["--resume", "--out-dir", str(d), "--max-iters", "6"])
    line = one_line(capsys.readouterr().err)
    assert code == 1
    expect = {
        "flip 1000 bytes": "sha256",
        "wte relabelled I32": "I32",
        "NaN weights": "NaN",
        "optim flipped": "sha256",
        "optim swapped": "optim",
    }.get(fault, "safetensors")
    assert expect in line, line
    assert_untouched(d, before)  # not trained on, nothing overwritten or written
    if not fault.startswith("optim"):
        assert sample.main(["--out-dir", str(d), "--which", "latest"]) == 1
        assert expect in one_line(capsys.readouterr().err, "gpt-sample")


def test_checkpoints_record_sha256(base_run):
    import hashlib

    ckpt = ckpt_of(base_run)
    for k, name in ckpt["files"].items():
        assert ckpt["sha256"][k] == hashlib.sha256((base_run / name).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- GPT-2 dirs
@pytest.fixture
def hf_dir(corpus, tmp_path):
    """A HuggingFace-layout GPT-2 directory: config.json, model.safetensors, vocab + merges."""
    from safetensors.numpy import save_file

    from gpt.config import GPTConfig
    from gpt.model import GPT
    from gpt.tokenizer import BPETokenizer

    d = tmp_path / "gpt2"
    tok = BPETokenizer.train([p.read_text() for p in sorted(corpus.glob("*.txt"))], 270)
    tok.save(d)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    conv1d = ("c_attn.weight", "c_proj.weight", "c_fc.weight")  # HF stores these as (in, out)
    arrays = {
        k.removeprefix("transformer."): np.ascontiguousarray(v.T if k.endswith(conv1d) else v)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(arrays, str(d / "model.safetensors"))
    (d / "config.json").write_text(
        json.dumps(
            {
                "n_layer": 1,
                "n_head": 2,
                "n_embd": 16,
                "n_positions": 32,
                "vocab_size": tok.vocab_size,
                "layer_norm_epsilon": 1e-5,
                "activation_function": "gelu_new",
            }
        )
    )
    return d


def test_untampered_gpt2_directory_works(hf_dir, corpus, tmp_path, capsys):
    assert (
        sample.main(["--init-from", str(hf_dir), "--max-new-tokens", "3", "--num-samples", "1"])
        == 0
    )
    assert (
        train.main(
            [
                "--init-from",
                str(hf_dir),
                "--data",
                str(corpus),
                "--out-dir",
                str(tmp_path / "ft"),
                "--max-iters",
                "1",
                "--batch-size",
                "2",
                "--eval-iters",
                "1",
                "--no-sample",
            ]
        )
        == 0
    ), capsys.readouterr().err


def _hf_edit(name, fn):
    def f(d):
        p = d / name
        p.write_text(fn(p.read_text()))

    return f


def _hf_cfg(**kw):
    return _hf_edit("config.json", lambda t: json.dumps({**json.loads(t), **kw}))


HF_CASES = {
    "config.json a list": _hf_edit("config.json", lambda t: "[1, 2]"),
    "n_layer 1000000": _hf_cfg(n_layer=1000000),
    "n_layer 4000": _hf_cfg(n_layer=4000),
    "n_embd 10**9": _hf_cfg(n_embd=10**9),
    "n_head a string": _hf_cfg(n_head="2"),
    "n_positions 0": _hf_cfg(n_positions=0),
    "layer_norm_epsilon NaN": _hf_cfg(layer_norm_epsilon=float("nan")),
    "vocab_size larger than wte": _hf_cfg(vocab_size=400),
    "vocab_size smaller than the tokenizer": _hf_cfg(vocab_size=260),
    "vocab.json ids as strings": _hf_edit(
        "vocab.json", lambda t: json.dumps({k: str(v) for k, v in json.loads(t).items()})
    ),
    "vocab.json a list": _hf_edit("vocab.json", lambda t: "[1]"),
    "vocab.json huge id": _hf_edit(
        "vocab.json", lambda t: json.dumps({**json.loads(t), "x": 10**12})
    ),
    "merges.txt bad line": _hf_edit("merges.txt", lambda t: t + "a b c\n"),
    "wte relabelled I32": lambda d: _relabel_hf(d / "model.safetensors"),
    "config.json a FIFO": lambda d: ((d / "config.json").unlink(), os.mkfifo(d / "config.json")),
}


def _relabel_hf(path):
    raw = path.read_bytes()
    start = _data_start(path)
    head = raw[8:start].replace(b'"wte.weight":{"dtype":"F32"', b'"wte.weight":{"dtype":"I32"')
    path.write_bytes(raw[:8] + head + raw[start:])


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_tampered_gpt2_directory(hf_dir, corpus, tmp_path, capsys, case):
    from gpt.model import GPT

    HF_CASES[case](hf_dir)
    if case not in (
        "vocab.json ids as strings",
        "vocab.json a list",
        "vocab.json huge id",
        "merges.txt bad line",
    ):
        with pytest.raises(CheckpointError):
            GPT.from_pretrained(hf_dir)
    code = sample.main(["--init-from", str(hf_dir), "--max-new-tokens", "2"])
    assert code == 1, capsys.readouterr().err
    one_line(capsys.readouterr().err, "gpt-sample")
    code = train.main(
        [
            "--init-from",
            str(hf_dir),
            "--data",
            str(corpus),
            "--out-dir",
            str(tmp_path / "ft"),
            "--max-iters",
            "1",
            "--no-sample",
        ]
    )
    assert code in (1, 2)
    one_line(capsys.readouterr().err)
    assert not (tmp_path / "ft" / "ckpt.json").exists()


# ----------------------------------------------------------------------------- 4. divergence
def _blow_up_at(monkeypatch, call: int, factor=1e4):
    """Scale every weight by `factor` inside the call-th clip_grad_norm_ (before that step)."""
    calls, real = [], train_loop.clip_grad_norm_

    def clip(params, max_norm):
        calls.append(1)
        if len(calls) == call:
            for p in params:
                p.data = p.data * np.float32(factor)
        return real(params, max_norm)

    monkeypatch.setattr(train_loop, "clip_grad_norm_", clip)
    return real


def _advice_argv(line: str) -> list[str]:
    cmd = line.split("lower learning rate: ", 1)[1]
    return shlex.split(cmd)[3:]  # after 'python -m gpt.train'


@pytest.mark.parametrize("call,where", [(6, "eval"), (5, "step")])
def test_divergence_stops_keeps_the_sane_checkpoint_and_advice_works(
    corpus, tmp_path, monkeypatch, capsys, call, where
):
    """Weights blown up during step call-1: caught by the next step's loss, or by the
    evaluation that follows (iteration 6) before its checkpoint is written."""
    out = tmp_path / "div"
    real = _blow_up_at(monkeypatch, call)
    code, _, err = run(
        corpus,
        out,
        "--max-iters",
        "8",
        "--eval-interval",
        "2",
        "--lr-decay-iters",
        "8",
        capsys=capsys,
    )
    line = error_line(err)
    assert code == 1 and "diverged" in line, line
    assert ("validation loss" in line) == (where == "eval")
    assert ckpt_of(out)["iter"] == 4  # the last checkpoint whose evaluation was sane
    assert rc.load(out)[0]["iter"] == 4 and not (out / "model-000006.safetensors").exists()
    monkeypatch.setattr(train_loop, "clip_grad_norm_", real)
    argv = _advice_argv(line)
    assert "--resume" in argv and "--lr" in argv
    assert train.main(argv) == 0, capsys.readouterr().err
    assert ckpt_of(out)["iter"] == 8


def test_natural_divergence_with_a_huge_lr(corpus, tmp_path, capsys):
    code, _, err = run(
        corpus,
        tmp_path / "hot",
        "--lr",
        "100",
        "--min-lr",
        "0",
        "--grad-clip",
        "0",
        "--warmup-iters",
        "0",
        "--max-iters",
        "50",
        capsys=capsys,
    )
    line = error_line(err)
    assert code == 1 and ("diverged" in line or "non-finite" in line), err
    assert "--lr 50" in line


def test_divergence_factor_zero_turns_the_guard_off(corpus, tmp_path, monkeypatch, capsys):
    """Weights x100 during step 3: the evaluation at iteration 4 is finite but far above the
    run's best, which stops a run with a positive factor and not one with factor 0."""
    args = ("--max-iters", "4", "--eval-interval", "2")
    real = _blow_up_at(monkeypatch, 4, factor=1e2)
    on = tmp_path / "on"
    code, _, err = run(corpus, on, *args, "--divergence-factor", "4", capsys=capsys)
    line = error_line(err)
    assert code == 1 and "validation loss diverged" in line, line
    assert ckpt_of(on)["iter"] == 2
    monkeypatch.setattr(train_loop, "clip_grad_norm_", real)
    _blow_up_at(monkeypatch, 4, factor=1e2)
    off = tmp_path / "off"
    code, _, err = run(corpus, off, *args, "--divergence-factor", "0", capsys=capsys)
    assert code == 0, f"--divergence-factor 0 still stopped the run:\n{err[-800:]}"
    assert ckpt_of(off)["iter"] == 4  # the diverged state was evaluated and saved
    va, vb = val_losses(on), val_losses(off)
    assert va == vb and math.isfinite(vb[4]) and vb[4] > 4 * min(vb[2], vb[0]), vb


# ----------------------------------------------------------------------------- 5. evaluation
@pytest.fixture(scope="module")
def full6(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("full6") / "run"
    assert run(corpus, out, "--max-iters", "6", "--eval-interval", "2")[0] == 0
    return out


def val_losses(out) -> dict:
    return {r["iter"]: r["val_loss"] for r in records(out) if "val_loss" in r}


def assert_same_run(a, b, iters=(0, 2, 4, 6)):
    va, vb = val_losses(a), val_losses(b)
    assert [va[i] for i in iters] == [vb[i] for i in iters]
    sa = [r for r in records(a) if "loss" in r]
    sb = [r for r in records(b) if "loss" in r]
    assert [(r["iter"], r["loss"]) for r in sa] == [(r["iter"], r["loss"]) for r in sb]
    for which in ("latest", "best"):
        ma, mb = rc.load_model(a, which)[0], rc.load_model(b, which)[0]
        for (k, x), (_, y) in zip(ma.state_dict().items(), mb.state_dict().items()):
            np.testing.assert_array_equal(x, y, err_msg=f"{which} {k}")


def _signal_on_val_batch(monkeypatch, n: int, sig=signal.SIGTERM):
    calls, real = [], gdata.BatchSampler.next_batch

    def next_batch(self):
        if self.split == "val":
            calls.append(1)
            if len(calls) == n:
                signal.raise_signal(sig)
        return real(self)

    monkeypatch.setattr(gdata.BatchSampler, "next_batch", next_batch)
    return real


@pytest.mark.parametrize("n,saved", [(3, 2), (4, 3), (5, 4)])
def test_signal_during_evaluation_then_resume_is_exact(
    corpus, full6, tmp_path, monkeypatch, capsys, n, saved
):
    """eval_iters 2: val batches 3-4 are the evaluation at iter 2, 5-6 the one at iter 4. A
    signal before the last batch interrupts the evaluation (saved unevaluated, redone on
    resume); one during the last batch lets it finish, and the next step, as usual."""
    out = tmp_path / "sig"
    real = _signal_on_val_batch(monkeypatch, n)
    code, _, err = run(corpus, out, "--max-iters", "6", "--eval-interval", "2", capsys=capsys)
    assert code == 143 and "--resume" in err
    ckpt = ckpt_of(out)
    assert ckpt["iter"] == saved and ckpt["evaluated"] is False
    monkeypatch.setattr(gdata.BatchSampler, "next_batch", real)
    assert train.main(["--resume", "--out-dir", str(out)]) == 0
    assert_same_run(full6, out)


def test_signal_between_steps_on_an_eval_iteration_is_exact(
    corpus, full6, tmp_path, monkeypatch, capsys
):
    """A signal during step 1 saves at iter 2 before its evaluation; the resume does it."""
    calls, real = [], train_loop.clip_grad_norm_

    def clip(params, max_norm):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)
        return real(params, max_norm)

    monkeypatch.setattr(train_loop, "clip_grad_norm_", clip)
    out = tmp_path / "between"
    assert run(corpus, out, "--max-iters", "6", "--eval-interval", "2")[0] == 130
    assert ckpt_of(out)["iter"] == 2 and ckpt_of(out)["evaluated"] is False
    monkeypatch.setattr(train_loop, "clip_grad_norm_", real)
    assert train.main(["--resume", "--out-dir", str(out)]) == 0
    assert_same_run(full6, out)


def test_split_off_the_eval_grid_keeps_later_val_losses(corpus, full6, tmp_path):
    """3 + 3 resumed (eval every 2): the extra evaluation at 3 does not shift 4 and 6."""
    out = tmp_path / "off"
    assert (
        run(corpus, out, "--max-iters", "3", "--eval-interval", "2", "--lr-decay-iters", "6")[0]
        == 0
    )
    assert 3 in val_losses(out)
    assert train.main(["--resume", "--out-dir", str(out), "--max-iters", "6"]) == 0
    va, vb = val_losses(full6), val_losses(out)
    assert [va[i] for i in (0, 2, 4, 6)] == [vb[i] for i in (0, 2, 4, 6)]
    sa = [(r["iter"], r["loss"]) for r in records(full6) if "loss" in r]
    assert sa == [(r["iter"], r["loss"]) for r in records(out) if "loss" in r]


def test_signal_before_the_loop_exits_at_once(corpus, tmp_path, monkeypatch, capsys):
    """A run stuck before training (reading data) stops on the first SIGTERM."""

    def stuck(*a, **k):
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("the signal did not stop the run")

    monkeypatch.setattr(train_setup, "load_data", stuck)
    code, _, err = run(corpus, tmp_path / "early", "--max-iters", "2", capsys=capsys)
    assert code == 143 and "SIGTERM" in err and "Traceback" not in err
    assert not (tmp_path / "early" / "ckpt.json").exists()
    assert (tmp_path / "early" / LOCK_FILE).read_text() == ""  # released


# ----------------------------------------------------------------------------- 6. CLI inputs
def _bad_inputs(corpus, tmp):
    empty = tmp / "empty.txt"
    empty.write_bytes(b"")
    binary = tmp / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    fifo = tmp / "fifo.txt"
    os.mkfifo(fifo)
    a_file = tmp / "a-file"
    a_file.write_text("x")
    return {
        "--config FIFO": (2, ["--config", str(fifo)], "regular file"),
        "--out-dir a file": (2, ["--out-dir", str(a_file)], "not a directory"),
        "--block-size 100000": (2, ["--block-size", "100000"], "memory"),
        "--n-embd 65536": (2, ["--n-embd", "65536", "--n-head", "1"], "memory"),
        "--n-layer 100000": (2, ["--n-layer", "100000"], "--n-layer"),
        "--n-layer 1000 --n-embd 4096": (2, ["--n-layer", "1000", "--n-embd", "4096"], "memory"),
        "--batch-size 10**9": (2, ["--batch-size", str(10**9)], "memory"),
        "--seed -1": (2, ["--seed", "-1"], "--seed"),
        "--seed 2**64": (2, ["--seed", str(2**64)], "--seed"),
        "--min-lr nan": (2, ["--min-lr", "nan"], "--min-lr"),
        "--lr inf": (2, ["--lr", "inf"], "--lr"),
        "--grad-clip nan": (2, ["--grad-clip", "nan"], "--grad-clip"),
        "--dropout nan": (2, ["--dropout", "nan"], "--dropout"),
        "--divergence-factor -1": (2, ["--divergence-factor", "-1"], "--divergence-factor"),
        "--data /dev/zero": (2, ["--data", "/dev/zero"], "regular file"),
        "--data FIFO": (2, ["--data", str(fifo)], "regular file"),
        "--data empty": (2, ["--data", str(empty)], "empty"),
        "--data binary": (1, ["--data", str(binary)], "binary"),
    }


def test_bad_cli_inputs_one_line(corpus, tmp_path, capsys):
    for name, (want, args, word) in _bad_inputs(corpus, tmp_path).items():
        argv = [
            "--data",
            str(corpus),
            "--out-dir",
            str(tmp_path / "o"),
            *TINY[:-1],
            *args,
            "--max-iters",
            "1",
            "--no-sample",
        ]
        code = train.main(argv)
        line = one_line(capsys.readouterr().err)
        assert code == want and word in line, (name, line)
        assert not (tmp_path / "o" / "ckpt.json").exists()
        assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_worst_cli_inputs_in_a_subprocess(corpus, tmp_path):
    """The ones that allocated terabytes or hung: bounded time and memory, exit 2, one line."""
    cases = _bad_inputs(corpus, tmp_path)
    for name in ("--block-size 100000", "--n-embd 65536", "--data /dev/zero", "--data FIFO"):
        want, args, word = cases[name]
        p = cli(
            "gpt.train",
            "--data",
            str(corpus),
            "--out-dir",
            str(tmp_path / "o"),
            *args,
            "--max-iters",
            "1",
            timeout=30,
            env={"GPT_CACHE_DIR": str(tmp_path / "c")},
        )
        assert p.returncode == want, (name, p.stderr)
        assert word in one_line(p.stderr), name


def test_memory_estimate_refuses_what_cannot_fit(corpus, tmp_path, monkeypatch, capsys):
    from gpt.store import validate

    monkeypatch.setattr(validate, "available_memory", lambda: 1 << 10)  # 1 KiB
    code, _, err = run(corpus, tmp_path / "m", "--max-iters", "1", capsys=capsys)
    line = one_line(err)
    assert code == 2 and "MiB of memory" in line and "available" in line, line
    monkeypatch.setattr(validate, "available_memory", lambda: None)  # unknown: no check
    assert run(corpus, tmp_path / "m", "--max-iters", "1")[0] == 0


def test_expected_shapes_match_the_model():
    import math

    from gpt.config import GPTConfig
    from gpt.model import GPT
    from gpt.store import validate

    for c in (
        GPTConfig.from_preset("tiny"),
        GPTConfig(
            block_size=8,
            vocab_size=50,
            n_layer=2,
            n_head=4,
            n_embd=32,
            bias=False,
            tie_weights=False,
        ),
    ):
        state = {k: tuple(v.shape) for k, v in GPT(c).state_dict().items()}
        if c.tie_weights:
            state.pop("lm_head.weight")
        assert validate.expected_shapes(c) == state
        assert validate.n_params(c) == sum(math.prod(s) for s in state.values())


def test_sample_exit_codes(base_run, tmp_path, capsys):
    assert sample.main(["--out-dir", str(tmp_path / "none")]) == 2  # usage: no such run
    one_line(capsys.readouterr().err, "gpt-sample")
    assert sample.main(["--out-dir", str(base_run), "--seed", "-1"]) == 2
    one_line(capsys.readouterr().err, "gpt-sample")
    assert sample.main(["--out-dir", str(base_run), "--temperature", "nan"]) == 2
    one_line(capsys.readouterr().err, "gpt-sample")


def test_prompt_file_fifo_and_empty_or_binary_folders(base_run, tmp_path, capsys):
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    assert sample.main(["--out-dir", str(base_run), "--prompt-file", str(fifo)]) == 2
    one_line(capsys.readouterr().err, "gpt-sample")
    empty, binary = tmp_path / "empty", tmp_path / "binary"
    for d, data in ((empty, b""), (binary, b"text\0more")):
        d.mkdir()
        (d / "a.txt").write_bytes(data)
        with pytest.raises(gdata.DataError, match="empty|binary"):
            gdata.read_text_path(d)


def test_checkpoint_without_sha256_still_loads(base_run, tmp_path):
    """Checkpoints from before sha256 was recorded load (unverified)."""
    d = copy_run(base_run, tmp_path)
    ckpt = ckpt_of(d)
    del ckpt["sha256"]
    write_ckpt(d, ckpt)
    assert rc.load(d)[0]["iter"] == 4
    assert train.main(["--resume", "--out-dir", str(d), "--max-iters", "5"]) == 0
    assert "sha256" in ckpt_of(d)


def test_hand_edited_metrics_jsonl_is_tolerated_on_resume(base_run, tmp_path):
    d = copy_run(base_run, tmp_path)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('[1]\n"text"\n{"iter": "3"}\n{"iter": ' + "9" * 5000 + "}\n")
    assert train.main(["--resume", "--out-dir", str(d), "--max-iters", "5"]) == 0
