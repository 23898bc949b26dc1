"""A run is what its checkpoint says it is: gpt-explain takes the step the run would take next
(its AdamW settings and moments, its learning rate at that iteration, its clipping), and a
checkpoint records the model code that trained it, so loading it into other code says so.

Runs gpt-train in-process on a tiny synthetic corpus (as tests/test_train.py does).
"""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.nn.functional as F
from gpt import export, sample, train
from gpt.data import BatchSampler
from gpt.explain import cli as explain_cli
from gpt.model import GPT, MLP
from gpt.optim import cosine_lr
from gpt.store import run_checkpoint as rc

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "the king rode out at dawn"  # characters of the corpus; cut to block_size + 1
RUN = [
    "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
    "--batch-size", "4", "--eval-iters", "2", "--dropout", "0", "--no-sample",
    # a schedule and optimizer unlike gpt-explain's old assumptions (lr 1e-3, betas
    # (0.9, 0.95), no clipping): warmup 2, cosine to iter 12, beta2 0.97, clip 0.05
    "--lr", "3e-3", "--min-lr", "2e-4", "--warmup-iters", "2", "--lr-decay-iters", "12",
    "--beta2", "0.97", "--weight-decay", "0.05", "--grad-clip", "0.05",
    "--max-iters", "5", "--eval-interval", "5",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    rnd = random.Random(0)
    words = "the king and queen of a far land rode out at dawn to see what lay beyond".split()
    (d / "a.txt").write_text(
        "\n".join(" ".join(rnd.choice(words) for _ in range(10)) for _ in range(120)) + "\n"
    )
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT_CACHE_DIR", str(cache))
        yield d


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A run stopped at iter 5 of a schedule planned to 12: its latest checkpoint."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert train.main(["--data", str(corpus), "--out-dir", str(out), *RUN]) == 0
    return out


@pytest.fixture
def run_dir(trained, tmp_path):
    """A private copy of the trained run."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def params_of(model) -> dict:
    return {n: np.array(tg.to_numpy(p.array)) for n, p in model.named_parameters()}


def explain_json(out_dir, *args, capsys=None) -> dict:
    code = explain_cli.main(
        ["--out-dir", str(out_dir), "--prompt", PROMPT, "--format", "json", *args]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- 2. the run's step
def test_explain_takes_exactly_the_step_the_resumed_run_takes(run_dir, tmp_path, monkeypatch):
    """gpt-explain's step on a prompt == gpt-train's next step with the prompt as its batch."""
    twin = Path(shutil.copytree(run_dir, tmp_path / "twin"))
    seen = {}
    real = explain_cli.explain

    def spy(model, *a, **k):
        seen["before"] = params_of(model)
        r = real(model, *a, **k)
        seen["after"] = params_of(model)
        return r

    monkeypatch.setattr(explain_cli, "explain", spy)
    page = tmp_path / "r.json"
    args = ["--out-dir", str(run_dir), "--which", "latest", "--prompt", PROMPT, "--checks", "0"]
    assert explain_cli.main([*args, "--format", "json", "-o", str(page)]) == 0
    report = json.loads(page.read_text())

    # gpt-train's own code resumes the twin for one step, on the prompt's tokens as its batch
    _, tok, ckpt, _ = rc.load_model(twin, "latest")
    assert ckpt["iter"] == 5
    ids = tok.encode(PROMPT)[: ckpt["model_config"]["block_size"] + 1]
    assert ids == report["tokens"]["ids"]
    x, y = np.asarray([ids[:-1]]), np.asarray([ids[1:]])
    orig = BatchSampler.next_batch
    monkeypatch.setattr(
        BatchSampler,
        "next_batch",
        lambda self: (x.copy(), y.copy()) if self.split == "train" else orig(self),
    )
    assert train.main(["--resume", "--out-dir", str(twin), "--max-iters", "6"]) == 0
    step = [json.loads(line) for line in (twin / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in step if r.get("iter") == 5 and "loss" in r][-1]
    _, stepped, _ = rc.load(twin)
    assert rc.read_ckpt(twin)["iter"] == 6

    # the same learning rate, gradient norm (before clipping) and loss as the run's step
    assert report["adamw"]["lr"] == step["lr"] == cosine_lr(5, 2, 12, 3e-3, 2e-4)
    assert report["adamw"]["grad_norm"] == pytest.approx(step["grad_norm"], rel=1e-5)
    assert report["adamw"]["grad_clip"] == 0.05 and report["adamw"]["clip_scale"] < 1
    assert report["loss"]["value"] == pytest.approx(step["loss"], rel=1e-6)
    moved = 0.0
    for name, w in stepped.items():
        before, after = seen["before"][name], seen["after"][name]
        moved = max(moved, float(np.abs(after - before).max()))
        # float32 rounding: gpt-train runs its forward fused (compiled where it can), explain op by op
        np.testing.assert_allclose(after, w, rtol=1e-6, atol=1e-7, err_msg=name)
    assert moved > 1e-3  # the step moved the weights ten thousand times the tolerance


def test_explain_reports_the_run_settings_in_one_line(run_dir, capsys):
    r = explain_json(run_dir, "--which", "latest", "--checks", "0", capsys=capsys)
    o, a = r["optimizer"], r["adamw"]
    assert o["source"] == "run" and o["iter"] == 5 and o["moments"] == "run"
    assert a["betas"] == [0.9, 0.97] and a["weight_decay"] == 0.05 and a["eps"] == 1e-8
    assert a["lr"] == cosine_lr(5, 2, 12, 3e-3, 2e-4)
    assert a["element"]["step"] == 6  # the run's moments took 5 steps; this is the sixth
    assert a["element"]["beta2"] == 0.97
    line = o["line"]
    for part in ("iter 5", "0.97", "clip", "0.05", "cosine", "moments"):
        assert part in line, part
    assert "\n" not in line
    assert explain_cli.main(["--out-dir", str(run_dir), "--which", "latest", "--prompt", PROMPT,
                             "--checks", "0"]) == 0  # fmt: skip
    out = capsys.readouterr().out.replace("\n    ", " ")  # a line wrapped at 100 columns
    assert sum(line in row for row in out.splitlines()) == 1


def test_best_without_optimizer_state_borrows_latest_or_says_so(run_dir, capsys):
    best = rc.read_ckpt(run_dir / "best")
    latest = rc.read_ckpt(run_dir)
    assert best["optim"] is None
    if best["iter"] == latest["iter"]:  # the same weights: the latest checkpoint's moments fit
        r = explain_json(run_dir, "--which", "best", "--checks", "0", capsys=capsys)
        assert r["optimizer"]["moments"] == "run" and r["adamw"]["element"]["step"] == 6
    # a best/ older than the latest checkpoint: no moments to be had, and the line says so
    model, tok, ckpt, _ = rc.load_model(run_dir, "latest")
    rc.save(run_dir / "best", dict(ckpt, iter=3, optim=None), model)
    r = explain_json(run_dir, "--which", "best", "--checks", "0", capsys=capsys)
    o = r["optimizer"]
    assert o["source"] == "run" and o["iter"] == 3 and o["moments"] == "fresh"
    assert r["adamw"]["lr"] == cosine_lr(3, 2, 12, 3e-3, 2e-4)
    assert r["adamw"]["element"]["step"] == 1
    assert "--which latest" in o["line"]


def test_a_fresh_model_says_what_it_assumed(capsys):
    assert explain_cli.main(["--prompt", "The capital of France is Paris"]) == 0
    out = capsys.readouterr().out.replace("\n    ", " ")  # a line wrapped at 100 columns
    lines = [row for row in out.splitlines() if row.startswith("optimizer:")]
    assert len(lines) == 1, out[:2000]
    for part in ("assumed", "lr 0.001", "(0.9, 0.95)", "1e-08", "weight decay 0.1", "clip"):
        assert part in lines[0], part
    assert explain_cli.main(["--format", "json", "--lr", "0.01"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["optimizer"]["source"] == "assumed" and r["adamw"]["lr"] == 0.01
    assert "--lr" in r["optimizer"]["line"]


def test_steps_follow_the_run_schedule(run_dir, capsys):
    code = explain_cli.main(["--out-dir", str(run_dir), "--which", "latest", "--prompt", PROMPT,
                             "--steps", "3", "--format", "json"])  # fmt: skip
    assert code == 0
    t = json.loads(capsys.readouterr().out)
    assert [s["lr"] for s in t["steps"]] == [cosine_lr(i, 2, 12, 3e-3, 2e-4) for i in (5, 6, 7)]
    assert t["optimizer"]["source"] == "run"


# ----------------------------------------------------------------------------- 3. the code
def relu_forward(self, x):
    return self.dropout(self.c_proj(F.relu(self.c_fc(x))))


def code_lines(err: str) -> list[str]:
    return [row for row in err.splitlines() if "model code" in row]


def test_a_checkpoint_records_its_model_code(run_dir):
    for d in (run_dir, run_dir / "best"):
        code = rc.read_ckpt(d)["model_code"]
        assert code["class"] == "gpt.model.GPT"
        assert len(code["digest"]) == 64 and int(code["digest"], 16) >= 0
        assert "gpt.model" in code["parts"] and "gpt.model.MLP" in code["parts"]


def test_the_digest_is_the_same_in_another_process(run_dir):
    from gpt.store.model_code import model_code

    saved = rc.read_ckpt(run_dir)["model_code"]
    model, *_ = rc.load_model(run_dir, "latest")
    assert model_code(model) == saved
    prog = (
        "from gpt.store import run_checkpoint as rc; from gpt.store.model_code import model_code;"
        f"print(model_code(rc.load_model({str(run_dir)!r}, 'latest')[0])['digest'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == saved["digest"]


def test_loading_into_other_code_says_so_in_one_line(run_dir, tmp_path, monkeypatch, capsys):
    hf = tmp_path / "hf"
    assert export.main(["--out-dir", str(run_dir), "--to", str(hf)]) == 0
    sample_args = ["--out-dir", str(run_dir), "--max-new-tokens", "3", "--prompt", "the"]
    # the same code: not a word about it
    assert sample.main(sample_args) == 0
    GPT.from_pretrained(hf)
    assert code_lines(capsys.readouterr().err) == []

    monkeypatch.setattr(MLP, "forward", relu_forward)  # an edit of gpt/model.py's MLP
    assert sample.main(sample_args) == 0
    err = capsys.readouterr().err
    assert len(code_lines(err)) == 1 and "gpt.model.MLP" in code_lines(err)[0]
    assert explain_cli.main(["--out-dir", str(run_dir), "--prompt", PROMPT, "--checks", "0"]) == 0
    err = capsys.readouterr().err
    assert len(code_lines(err)) == 1 and "gpt.model.MLP" in code_lines(err)[0]
    GPT.from_pretrained(hf)  # an export carries the run's record
    err = capsys.readouterr().err
    assert len(code_lines(err)) == 1 and "gpt.model.MLP" in code_lines(err)[0]


def test_from_pretrained_into_another_class_says_so(tmp_path, capsys):
    from gpt.config import GPTConfig

    class MyGPT(GPT):
        pass

    GPT(GPTConfig.from_preset("tiny", vocab_size=40)).save_pretrained(tmp_path)
    MyGPT.from_pretrained(tmp_path)
    lines = code_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "gpt.model.GPT" in lines[0] and "MyGPT" in lines[0]


def test_resume_into_changed_code_refuses_unless_asked(run_dir, monkeypatch, capsys):
    saved = rc.read_ckpt(run_dir)["model_code"]
    monkeypatch.setattr(MLP, "forward", relu_forward)
    code = train.main(["--resume", "--out-dir", str(run_dir), "--max-iters", "6"])
    err = capsys.readouterr().err
    assert code == 2 and "--allow-code-change" in err and "gpt.model.MLP" in err
    assert len(err.strip().splitlines()) == 1
    assert rc.read_ckpt(run_dir)["iter"] == 5  # nothing was trained or written

    args = ["--resume", "--out-dir", str(run_dir), "--max-iters", "6", "--allow-code-change"]
    assert train.main(args) == 0
    err = capsys.readouterr().err
    assert len(code_lines(err)) == 1
    new = rc.read_ckpt(run_dir)
    assert new["iter"] == 6 and new["model_code"]["digest"] != saved["digest"]
    assert new["model_code"]["parts"]["gpt.model.MLP"] != saved["parts"]["gpt.model.MLP"]


def test_allow_code_change_is_documented():
    from gpt.train.flags import build_parser

    assert "--allow-code-change" in build_parser().format_help()
    assert "--allow-code-change" in (ROOT / "docs" / "training.md").read_text()


def test_an_old_checkpoint_without_a_digest_loads_quietly(run_dir, monkeypatch, capsys):
    for d in (run_dir, run_dir / "best"):
        c = json.loads((d / "ckpt.json").read_text())
        c.pop("model_code", None)
        (d / "ckpt.json").write_text(json.dumps(c))
    monkeypatch.setattr(MLP, "forward", relu_forward)
    assert sample.main(["--out-dir", str(run_dir), "--max-new-tokens", "3"]) == 0
    assert train.main(["--resume", "--out-dir", str(run_dir), "--max-iters", "6"]) == 0
    assert code_lines(capsys.readouterr().err) == []


def test_a_malformed_code_record_is_refused_in_one_line(run_dir, capsys):
    c = json.loads((run_dir / "best" / "ckpt.json").read_text())
    c["model_code"] = "gpt.model.GPT"  # not the object model_code writes
    (run_dir / "best" / "ckpt.json").write_text(json.dumps(c))
    assert sample.main(["--out-dir", str(run_dir), "--max-new-tokens", "3"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model_code" in err
