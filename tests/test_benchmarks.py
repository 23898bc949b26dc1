"""The benchmark scripts stay runnable: their gpt-train flags are valid and their timing child
processes run (no timings are checked: a test never measures speed)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import recipe, startup
from gpt.train import resolve_config, validate


def test_recipe_flags_are_valid_gpt_train_flags(tmp_path):
    data = tmp_path / "corpus.txt"
    data.write_text("to be or not to be, that is the question\n" * 50)
    c, _, control = resolve_config(recipe.recipe_argv(str(data), str(tmp_path / "out"), 2000))
    validate(c)
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.batch_size) == (4, 4, 128, 64, 12)
    assert (c.lr, c.min_lr, c.warmup_iters, c.beta2, c.dropout) == (1e-3, 1e-4, 100, 0.99, 0.0)
    assert (c.eval_interval, c.eval_iters, c.max_iters) == (250, 20, 2000)
    assert control["overwrite"]


@pytest.mark.slow
def test_startup_child_reports_each_phase():
    r = startup.child("char-small", 1, {"TG_KERNELS": "0"})
    assert set(r) == {"import_tensorgrad_s", "build_s", "first_step_s", "second_step_s"}
    assert all(v > 0 for v in r.values())


def _small_report(res: dict, same_process: bool) -> str:
    import argparse
    import datetime as dt

    from benchmarks import machine, small

    rounds = {fw: [r] for fw, r in res.items()}
    args = argparse.Namespace(
        threads=None, same_process=same_process, rounds=1, reps=1, blas_env="removed"
    )
    return small.report(
        small.summarize(rounds), rounds, args, {}, machine.describe(), dt.datetime.now()
    )


def test_small_tensor_cases_run_and_report():
    from benchmarks import small

    res = small.child("tensorgrad", reps=1, min_rep_s=0.0, threads=None)
    text = _small_report(res, same_process=False)
    for case in small.CASES:
        assert f"| {case} | tensorgrad |" in text
        assert np.isfinite(res["tensorgrad"][case]["check"])


def test_small_tensor_cases_compute_what_torch_computes():
    pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[bench]'")
    from benchmarks import small

    res = small.child("both", reps=1, min_rep_s=0.0, threads=None)  # taking turns
    for case in small.CASES:
        tg_value, torch_value = (res[fw][case]["check"] for fw in ("tensorgrad", "torch"))
        assert tg_value == pytest.approx(torch_value, rel=1e-5), case
        assert len(res["tensorgrad"][case]["ratio_to_last"]) == 1
    assert "| mlp | torch |" in _small_report(res, same_process=True)


def test_edits_benchmark_runs_each_edit_and_restores_the_model():
    """benchmarks.edits patches gpt.model's classes for a run and puts them back."""
    from benchmarks import edits
    from gpt import model as gm

    before = (gm.MLP.forward, gm.Block.forward, gm.nn.LayerNorm)
    for name, patches in edits._edits().items():
        assert edits.step_ms("gpt-nano", patches, True, reps=1) > 0, name
    assert (gm.MLP.forward, gm.Block.forward, gm.nn.LayerNorm) == before


def test_rounds_keep_the_median_round_and_every_rounds_time():
    from benchmarks.run import median_round

    rounds = [dict(median_s=0.007), None, dict(median_s=0.0044), dict(median_s=0.0046)]
    kept = median_round(rounds)
    assert kept["median_s"] == 0.0046  # the median of the three that ran
    assert kept["rounds_s"] == [0.007, None, 0.0044, 0.0046]
    assert median_round([None, None]) is None


def test_sample_benchmark_ways_run():
    """benchmarks/sample.py's tensorgrad ways each run past the block (two tokens each)."""
    from benchmarks import sample

    for way in sample.WAYS[:3]:
        r = sample.worker(way, "tiny", 2)
        assert r["way"] == way and r["tokens"] == 2 and r["per_token_s"] > 0


def test_gemm_floor_counts_exactly_the_steps_products():
    """benchmarks/floor.py's products carry the step's FLOPs: estimate_flops_per_token(T)·B·T
    less 6·B·T per 1-D parameter (biases and LayerNorm weights: no GEMM reads them)."""
    import tensorgrad as tg
    from benchmarks import floor
    from benchmarks.common import SHAPES, gpt_config
    from gpt.model import GPT

    _, _, _, T, B, _ = SHAPES["char-small"]
    tg.manual_seed(0)
    model = GPT(gpt_config("char-small", T, T))
    one_d = sum(p.numel() for p in model.parameters() if len(p.shape) == 1)
    products = floor.gemms("char-small")
    assert (
        sum(p.flops for p in products)
        == model.estimate_flops_per_token(T) * B * T - 6 * B * T * one_d
    )
    assert sum(p.bwd for p in products) == 2 * sum(not p.bwd for p in products)
