"""What a first run shows: a finished run says so on --resume, the closing hint matches
--no-sample, evaluation has a progress bar, loss.png is drawn or its absence explained, and
gpt-plot redraws it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from test_train import TINY, corpus, records, run  # noqa: F401  (corpus is a fixture)

from gpt import diagnostics, plot

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def test_resume_of_a_finished_run_says_it_is_finished(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert run(corpus, out, "--max-iters", "3", "--eval-interval", "3")[0] == 0
    n = len(records(out))
    code, _, err = run(
        corpus, out, "--max-iters", "3", "--eval-interval", "3", "--resume", capsys=capsys
    )
    assert code == 0
    assert "is finished (iter 3 of --max-iters 3)" in err and "--max-iters" in err
    assert len(records(out)) == n  # nothing trained, nothing logged


def test_closing_hint_follows_no_sample(corpus, tmp_path, capsys):  # noqa: F811
    code, out, _ = run(
        corpus, tmp_path / "r", "--max-iters", "2", "--eval-interval", "2", capsys=capsys
    )
    assert code == 0
    assert "sample it:" in out and "sample again" not in out  # TINY has --no-sample


def test_evaluation_shows_progress(corpus, tmp_path, capsys):  # noqa: F811
    code, _, err = run(
        corpus, tmp_path / "r", "--max-iters", "2", "--eval-interval", "2", capsys=capsys
    )
    assert code == 0 and "eval" in err


def test_loss_png_or_one_line_saying_how(corpus, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(diagnostics, "plot_metrics", lambda records, path: False)  # no mpl
    code, _, err = run(
        corpus, tmp_path / "r", "--max-iters", "4", "--eval-interval", "2", capsys=capsys
    )
    assert code == 0
    assert err.count("loss.png skipped: matplotlib is not installed") == 1
    assert "gpt-plot OUT_DIR" in err


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed (pip install -e '.[plot]')")
def test_gpt_plot_redraws_loss_png(tmp_path, capsys):
    lines = [{"iter": i, "loss": 4.0 - i / 10} for i in range(5)]
    lines.append({"iter": 4, "train_loss": 3.6, "val_loss": 3.7})
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n{torn")
    assert plot.main([str(tmp_path)]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "6 records" in capsys.readouterr().out


def test_gpt_plot_bad_dir_is_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gpt.plot", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "metrics.jsonl does not exist" in r.stderr


def test_python_m_gpt_lists_the_commands():
    r = subprocess.run([sys.executable, "-m", "gpt"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for name in ("gpt-train", "gpt-sample", "gpt-explain", "gpt-plot"):
        assert name in r.stdout


def test_every_config_field_is_one_flag_with_its_type_and_help():
    """TrainConfig is the one source: each field is a flag of the annotated type, with help
    (and its default in the help when there is one)."""
    import dataclasses

    from gpt.train import TrainConfig, build_parser
    from gpt.train.config import kind

    actions = {}
    for a in build_parser()._actions:
        actions.setdefault(a.dest, a)  # --sample-tokens before --no-sample
    for f in dataclasses.fields(TrainConfig):
        a = actions.get(f.name)
        assert a is not None and a.help, f"--{f.name.replace('_', '-')} is not a flag with help"
        assert a.option_strings[0] == "--" + f.name.replace("_", "-")
        if kind(f) is not bool:
            assert a.type is kind(f), f"--{f.name}: type {a.type} for a {f.type} field"
        if f.default not in (None, False):
            assert f"(default {f.default})" in a.help or "default" in a.help, f.name


def test_slow_first_step_is_explained_once_and_not_counted_in_the_eta(capsys, monkeypatch):
    """numba builds the CPU kernels in the first step of a fresh install (seconds): one line
    says so (what was compiled, what came from the cache), and the bar's rate starts after
    it (it showed an ETA of hours)."""
    from types import SimpleNamespace

    from gpt.train import progress as pg
    from gpt.train.progress import SLOW_FIRST_STEP_S, Progress

    counts = {"compiled": 31, "loaded": 2, "generated": 0}
    monkeypatch.setattr(pg.kernels, "compile_counts", lambda: dict(counts))

    def progress(device):
        c = SimpleNamespace(max_iters=100, device=device)
        return Progress(SimpleNamespace(c=c, state=SimpleNamespace(iter=0)))

    p = progress("cpu")
    p.bar.start_t -= 9.0  # as if the first step had taken 9 s (no refresh meanwhile)
    p.bar.last_print_t -= 9.0
    p.step(2.0, 1e-3, 1000.0, 9.0)
    p.step(2.0, 1e-3, 1000.0, 9.0)
    assert p.bar.format_dict["elapsed"] < 5.0  # the first step's time is not in the rate
    p.close()
    err = capsys.readouterr().err
    assert err.count("first step took 9.0 s: 31 CPU kernels compiled and cached (2 loaded") == 1
    counts.update(compiled=0, loaded=33, generated=4)  # a later run: all from the cache
    w = progress("cpu")
    w.step(2.0, 1e-3, 1000.0, 3.0)
    w.close()
    err = capsys.readouterr().err
    assert "3.0 s: the CPU kernels came from the cache (33 loaded), 4 generated for this" in err
    q = progress("cpu")
    q.step(2.0, 1e-3, 1000.0, SLOW_FIRST_STEP_S / 2)
    q.close()
    assert "first step" not in capsys.readouterr().err
