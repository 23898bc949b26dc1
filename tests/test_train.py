"""gpt-train end to end on a tiny synthetic corpus: files, exact resume, faults, signals, CLI.

Runs main(argv) in-process (a tiny model trains in well under a second); only the signal
test starts a subprocess. Nothing here needs the network: the corpus is written by the test.
"""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
from gpt import train
from gpt.store import run_checkpoint as rc
from gpt.store.checkpoint import load_arrays
from gpt.train import loop as train_loop

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
    "0.1",
    "--warmup-iters",
    "2",
    "--no-sample",
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few KB of text in a folder of two .txt files, and a private data cache."""
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


def run(corpus, out, *args, capsys=None):
    """main() on the tiny model; returns (exit code, stdout, stderr)."""
    rc_ = train.main(["--data", str(corpus), "--out-dir", str(out), *TINY, *args])
    if capsys is None:
        return rc_, "", ""
    cap = capsys.readouterr()
    return rc_, cap.out, cap.err


def records(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def step_records(out):
    return [r for r in records(out) if "loss" in r]


@pytest.fixture(scope="module")
def full_run(corpus, tmp_path_factory):
    """6 uninterrupted iterations: the reference for every resume test."""
    out = tmp_path_factory.mktemp("full")
    assert run(corpus, out, "--max-iters", "6", "--eval-interval", "3")[0] == 0
    return out


def assert_same_steps(a, b):
    ra, rb = step_records(a), step_records(b)
    assert [r["iter"] for r in rb] == list(range(6))
    for x, y in zip(ra, rb):
        for key in ("loss", "lr", "grad_norm"):
            assert x[key] == y[key], f"iter {x['iter']}: {key} {x[key]!r} != {y[key]!r}"
    _, wa, _ = rc.load(a)
    _, wb, _ = rc.load(b)
    for name in wa:
        np.testing.assert_array_equal(wa[name], wb[name], err_msg=name)


def test_end_to_end_files_and_no_pickle(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run(
        corpus,
        out,
        "--max-iters",
        "6",
        "--eval-interval",
        "3",
        "--sample-tokens",
        "20",
        capsys=capsys,
    )
    assert code == 0, err
    assert "final val loss" in stdout and "--out-dir" in stdout
    names = {p.name for p in out.iterdir()}
    assert {
        "ckpt.json",
        "model-000006.safetensors",
        "optim-000006.safetensors",
        "metrics.jsonl",
        "best",
    } <= names
    assert not any(n.endswith(".tmp") for n in names)
    for f in out.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert not data.startswith(b"\x80"), f"{f} looks like a pickle"
            if f.suffix == ".json":
                json.loads(data)
            elif f.suffix == ".jsonl":
                [json.loads(line) for line in data.decode().splitlines()]
            elif f.suffix == ".safetensors":
                assert load_arrays(f)
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["iter"] == 6 and ckpt["train_config"]["max_iters"] == 6
    assert ckpt["model_config"]["n_embd"] == 16
    assert {"train", "val", "train_eval"} <= set(ckpt["samplers"])
    assert "exp_avg" in " ".join(load_arrays(out / "optim-000006.safetensors"))
    recs = records(out)
    assert [r["iter"] for r in recs if "val_loss" in r] == [0, 3, 6]
    steps = [r for r in recs if "loss" in r]
    assert len(steps) == 6
    assert {"iter", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"} <= set(steps[0])
    model, tok, _, d = rc.load_model(out, "best")
    assert d.name == "best" and tok.vocab_size == model.config.vocab_size
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_resume_is_bitwise_exact(corpus, full_run, tmp_path):
    out = tmp_path / "split"
    sched = ["--eval-interval", "3", "--lr-decay-iters", "6"]
    assert run(corpus, out, "--max-iters", "3", *sched)[0] == 0
    assert json.loads((out / "ckpt.json").read_text())["iter"] == 3
    assert train.main(["--resume", "--out-dir", str(out), "--max-iters", "6"]) == 0
    assert_same_steps(full_run, out)


def test_resume_drops_metrics_logged_after_the_checkpoint(corpus, full_run, tmp_path):
    """A run killed between checkpoints logged steps that the resumed run redoes."""
    out = tmp_path / "killed"
    assert (
        run(corpus, out, "--max-iters", "3", "--eval-interval", "3", "--lr-decay-iters", "6")[0]
        == 0
    )
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"iter": 3, "loss": 9.0}) + "\n" + '{"iter": 4, "lo')  # cut short
    assert train.main(["--resume", "--out-dir", str(out), "--max-iters", "6"]) == 0
    assert_same_steps(full_run, out)


def test_sigint_in_process_then_resume_is_exact(corpus, full_run, tmp_path, monkeypatch, capsys):
    """A signal during step 2 finishes it, saves at iter 3 and the resume matches the full run.

    gpt-train puts back the SIGINT handler it found: here one the test installs, since the
    one a test process inherits depends on how it was started (a shell's background job,
    such as a second suite run beside this one, starts with SIGINT ignored)."""
    calls = []
    real = train_loop.clip_grad_norm_

    def clip(params, max_norm):
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)
        return real(params, max_norm)

    def outside(signum, frame):
        raise AssertionError("SIGINT reached the handler gpt-train should have replaced")

    monkeypatch.setattr(train_loop, "clip_grad_norm_", clip)
    out = tmp_path / "int"
    found = signal.signal(signal.SIGINT, outside)
    try:
        code, _, err = run(corpus, out, "--max-iters", "6", "--eval-interval", "3", capsys=capsys)
        assert signal.getsignal(signal.SIGINT) is outside  # restored
    finally:
        signal.signal(signal.SIGINT, found)
    assert code == 130
    assert "--resume" in err and str(out) in err
    assert json.loads((out / "ckpt.json").read_text())["iter"] == 3
    monkeypatch.setattr(train_loop, "clip_grad_norm_", real)
    assert train.main(["--resume", "--out-dir", str(out)]) == 0
    assert_same_steps(full_run, out)


@pytest.mark.parametrize("victim", ["model-", "optim-", "ckpt.json"])
def test_interrupted_checkpoint_write_keeps_previous(corpus, tmp_path, monkeypatch, capsys, victim):
    out = tmp_path / "w"
    assert run(corpus, out, "--max-iters", "3", "--eval-interval", "3")[0] == 0
    real = os.replace

    def replace(src, dst, *a, **k):
        if Path(dst).name.startswith(victim) and Path(dst).parent == out:
            raise OSError(28, "No space left on device (simulated)")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    code, _, err = run(corpus, out, "--resume", "--max-iters", "6", capsys=capsys)
    assert code == 1 and "No space left" in err
    monkeypatch.setattr(os, "replace", real)
    ckpt, weights, optim = rc.load(out)  # the previous checkpoint, whole
    assert ckpt["iter"] == 3 and weights and optim["state"]
    assert not list(out.glob(".*.tmp"))
    assert train.main(["--resume", "--out-dir", str(out), "--max-iters", "6"]) == 0
    assert json.loads((out / "ckpt.json").read_text())["iter"] == 6
    assert sorted(p.name for p in out.glob("*.safetensors")) == [
        "model-000006.safetensors",
        "optim-000006.safetensors",
    ]


def test_nan_gradient_stops_and_keeps_last_good_checkpoint(corpus, tmp_path, monkeypatch, capsys):
    calls = []
    real = train_loop.clip_grad_norm_

    def clip(params, max_norm):
        calls.append(1)
        if len(calls) == 5:  # iteration 4
            params[0].grad.data = params[0].grad.data * np.float32("nan")
        return real(params, max_norm)

    monkeypatch.setattr(train_loop, "clip_grad_norm_", clip)
    out = tmp_path / "nan"
    code, _, err = run(corpus, out, "--max-iters", "6", "--eval-interval", "3", capsys=capsys)
    assert code == 1
    line = next(ln for ln in err.splitlines() if "non-finite" in ln)
    assert "iter 4" in line and "gradient norm" in line
    ckpt, _, _ = rc.load(out)
    assert ckpt["iter"] == 3
    assert rc.load_model(out, "latest")[2]["iter"] == 3
    assert not (out / "model-000004.safetensors").exists()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_subprocess_saves_and_says_how_to_resume(corpus, tmp_path, sig, code):
    out = tmp_path / "sig"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [
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
        "20",
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            if (out / "ckpt.json").exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "--resume" in err and "python -m gpt.train --resume --out-dir" in err
    ckpt, weights, optim = rc.load(out)
    assert ckpt["iter"] >= 20 and weights and optim is not None
    steps = step_records(out)
    assert steps[-1]["iter"] == ckpt["iter"] - 1  # every finished step is in the checkpoint


def test_diagnose_logs_and_reports(corpus, tmp_path, capsys):
    out = tmp_path / "diag"
    code, _, err = run(
        corpus, out, "--max-iters", "4", "--eval-interval", "2", "--diagnose", capsys=capsys
    )
    assert code == 0
    assert "DIAGNOSE: all" in err
    diags = [r for r in records(out) if "diag" in r]
    assert [r["iter"] for r in diags] == [0, 2]
    d = diags[0]["diag"]
    assert {"wte", "wpe", "h.0", "ln_f"} <= set(d["grad_norm"]) == set(d["update_ratio"])
    assert all(0 < v < 1 for v in d["update_ratio"].values())


def test_diagnostics_functions_name_dead_params():
    from gpt import diagnostics
    from gpt.config import GPTConfig
    from gpt.model import GPT

    model = GPT(GPTConfig.from_preset("tiny"))
    x = np.random.randint(0, 32, (2, 8))
    _, loss = model(x, x)
    loss.backward()
    assert diagnostics.dead_params(model) == []
    model.transformer.h[0].mlp.c_fc.weight.grad = None
    model.transformer.h[1].attn.c_proj.bias.grad.data[:] = 0
    model.transformer.ln_f.weight.grad.data[0] = np.nan
    dead = {r["name"]: r["status"] for r in diagnostics.dead_params(model)}
    assert dead == {
        "transformer.h.0.mlp.c_fc.weight": "no grad",
        "transformer.h.1.attn.c_proj.bias": "zero",
        "transformer.ln_f.weight": "non-finite",
    }
    assert "no grad" in diagnostics.format_report(diagnostics.dead_params(model))
    before = diagnostics.snapshot(model)
    model.transformer.wte.weight.data = model.transformer.wte.weight.data * np.float32(1.01)
    ratios = diagnostics.update_ratios(before, diagnostics.snapshot(model))
    assert math.isclose(ratios["wte"], 0.01, rel_tol=1e-3) and ratios["h.0"] == 0.0


def test_config_file_and_flag_precedence(corpus, tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"max_iters": 2, "eval-interval": 1, "lr": 0.01}))
    out = tmp_path / "c"
    assert run(corpus, out, "--config", str(cfg), "--lr", "0.002")[0] == 0
    tc = json.loads((out / "ckpt.json").read_text())["train_config"]
    assert (tc["max_iters"], tc["eval_interval"], tc["lr"]) == (2, 1, 0.002)


def test_grad_accum_and_bpe(corpus, tmp_path):
    out = tmp_path / "bpe"
    assert (
        run(
            corpus,
            out,
            "--tokenizer",
            "bpe",
            "--vocab-size",
            "300",
            "--max-iters",
            "2",
            "--eval-interval",
            "2",
            "--grad-accum",
            "2",
        )[0]
        == 0
    )
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["tokenizer"]["type"] == "bpe" and ckpt["model_config"]["vocab_size"] <= 300


def test_existing_checkpoint_needs_resume_or_overwrite(corpus, full_run, tmp_path, capsys):
    out = tmp_path / "again"
    assert run(corpus, out, "--max-iters", "2", "--eval-interval", "2")[0] == 0
    code, _, err = run(corpus, out, "--max-iters", "2", capsys=capsys)
    assert code == 2 and "--resume" in err and "--overwrite" in err
    assert run(corpus, out, "--max-iters", "3", "--eval-interval", "3", "--overwrite")[0] == 0
    assert json.loads((out / "ckpt.json").read_text())["iter"] == 3
    assert [r["iter"] for r in step_records(out)] == [0, 1, 2]


def _bad_cases(corpus, tmp):
    bad_json = tmp / "bad.json"
    bad_json.write_text(json.dumps({"max_iters": 3, "learning_rate": 1}))
    empty = tmp / "empty"
    empty.mkdir()
    return [
        ["--n-embd", "18", "--n-head", "4"],
        ["--batch-size", "0"],
        ["--max-iters", "-5"],
        ["--lr", "-1e-3"],
        ["--preset", "gpt5"],
        ["--eval-iters", "0"],
        ["--dropout", "1.5"],
        ["--beta2", "1.0"],
        ["--tokenizer", "word"],
        ["--vocab-size", "500"],  # char tokenizer
        ["--tokenizer", "bpe", "--vocab-size", "100"],
        ["--resume", "--out-dir", str(tmp / "nothing-here")],
        ["--config", str(tmp / "missing.json")],
        ["--config", str(bad_json)],
        ["--max-iters", "ten"],
        ["--frobnicate"],
        ["--data", str(tmp / "no-such-file.txt")],
        ["--block-size", "5000"],
        ["--init-from", str(tmp / "no-gpt2")],
        ["--resume", "--overwrite"],
    ]


def test_cli_validation_one_line_exit_2(corpus, tmp_path, capsys):
    small = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--max-iters", "1"]
    for args in _bad_cases(corpus, tmp_path):
        argv = ["--data", str(corpus), "--out-dir", str(tmp_path / "o"), *small, *args]
        if "--data" in args:
            argv = argv[2:]
        code = train.main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert len(err.splitlines()) == 1 and err.startswith("gpt-train: error:"), (args, err)
        assert not (tmp_path / "o" / "ckpt.json").exists()


def test_block_size_larger_than_the_val_split(corpus, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("abcdefghij" * 30)  # 300 characters: train 270 tokens, val 30
    argv = [
        "--data",
        str(short),
        "--out-dir",
        str(tmp_path / "o"),
        "--block-size",
        "64",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
    ]
    for _ in range(2):  # the first run also says that it prepares the data
        code = train.main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and "val split" in err.splitlines()[-1]
    assert len(err.splitlines()) == 1


def test_resume_refuses_a_different_model(corpus, full_run, capsys):
    code = train.main(["--resume", "--out-dir", str(full_run), "--n-layer", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--n-layer" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(
    tg.cuda.is_available(),
    reason="CuPy is present: this checks the error without it (run elsewhere)",
)
def test_cuda_without_cupy_is_one_line(corpus, tmp_path, capsys):
    code = train.main(["--data", str(corpus), "--out-dir", str(tmp_path / "o"), "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cuda" in err.lower() and len(err.splitlines()) == 1


def test_fine_tune_from_a_gpt2_directory(corpus, tmp_path, capsys):
    """--init-from: a HuggingFace-layout GPT-2 directory (weights + its BPE files) fine-tunes."""
    from safetensors.numpy import save_file

    from gpt.config import GPTConfig
    from gpt.model import GPT
    from gpt.tokenizer import BPETokenizer

    texts = [p.read_text() for p in sorted(Path(corpus).glob("*.txt"))]
    tok = BPETokenizer.train(texts, 300)
    src = tmp_path / "gpt2-mini"
    tok.save(src)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    conv1d = ("c_attn.weight", "c_proj.weight", "c_fc.weight")  # HF stores these as (in, out)
    arrays = {
        k.removeprefix("transformer."): np.ascontiguousarray(v.T if k.endswith(conv1d) else v)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(arrays, str(src / "model.safetensors"))
    (src / "config.json").write_text(
        json.dumps(
            dict(
                n_layer=1,
                n_head=2,
                n_embd=16,
                n_positions=32,
                vocab_size=tok.vocab_size,
                layer_norm_epsilon=1e-5,
                activation_function="gelu_new",
            )
        )
    )
    out = tmp_path / "ft"
    code = train.main(
        [
            "--data",
            str(corpus),
            "--init-from",
            str(src),
            "--out-dir",
            str(out),
            "--batch-size",
            "4",
            "--block-size",
            "16",
            "--max-iters",
            "3",
            "--eval-interval",
            "3",
            "--eval-iters",
            "1",
            "--no-sample",
        ]
    )
    assert code == 0, capsys.readouterr().err
    losses = [r["loss"] for r in step_records(out)]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["iter"] == 3


def test_gpt_train_compiles_by_default_and_says_what(corpus, tmp_path, capsys):
    """The default run compiles the model and says what after its second step; --no-compile
    runs eagerly and says nothing of it; both give the same losses (to float32 rounding)."""
    args = ["--data", str(corpus), *TINY, "--dropout", "0.0", "--max-iters", "4"]
    args += ["--eval-interval", "4"]
    assert train.main([*args, "--out-dir", str(tmp_path / "c")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "compiled" in line]
    assert len(said) == 1 and said[0].startswith("compiled: the model's forward, ")
    if tg.kernels.is_enabled():
        assert "1 GPT-2 blocks as the fused block kernel" in said[0]
    assert train.main([*args, "--out-dir", str(tmp_path / "e"), "--no-compile"]) == 0
    assert "compiled" not in capsys.readouterr().err
    losses = [
        [json.loads(r)["loss"] for r in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
         if '"loss"' in r]
        for d in ("c", "e")
    ]  # fmt: skip
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
