"""Tests for the mutants the mutation run (tools/mutation.py, docs/testing.md "Mutation
testing") found alive that were real gaps: each fails with its mutant applied."""

import pickle
import zipfile

import numpy as np
import pytest

import tensorgrad as tg


def _deepest_saved(n_max: int = 400):
    """The most deeply nested list tg.save accepts (nested lists around 1) and its depth."""
    obj, depth = 1, 0
    while depth < n_max:
        deeper = [obj]
        try:
            tg.save(deeper, _deepest_saved.path)
        except ValueError:
            return obj, depth
        obj, depth = deeper, depth + 1
    raise AssertionError(f"tg.save accepted {n_max} levels: its nesting bound is gone")


def test_load_reads_back_the_deepest_object_save_writes(tmp_path):
    # serialization._decode's bound must be save's bound: a `depth == MAX_DEPTH` in load (for
    # `>`) refused, one level early, a file tg.save had written
    _deepest_saved.path = tmp_path / "probe"
    obj, depth = _deepest_saved()
    assert depth > 50
    tg.save(obj, tmp_path / "deepest")
    assert tg.load(tmp_path / "deepest") == obj


def test_load_names_the_torch_format_it_refuses(tmp_path):
    # the message says which of torch.save's two formats the file is, rightly (a `not` in
    # _no_header's test swapped "a zip archive" and "a pickle", and stayed green)
    with zipfile.ZipFile(tmp_path / "new.pt", "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
    (tmp_path / "old.pt").write_bytes(pickle.dumps({"w": 1}, protocol=2))
    with pytest.raises(ValueError, match="a zip archive, as torch.save writes"):
        tg.load(tmp_path / "new.pt")
    with pytest.raises(ValueError, match="a pickle, as torch.save writes"):
        tg.load(tmp_path / "old.pt")


def test_a_forward_traced_with_its_third_input_aliasing_the_first_then_the_second():
    # the aliasing guard records which earlier argument an argument shares its array with: a
    # guard that noted only "new array here" (guards._shared's test inverted) gave (a, b, a) and
    # (a, b, b) one signature, and the second call replayed z as a
    def f(x, y, z):
        return x + y * 2.0 + z * 4.0

    g = tg.compile(f)
    a, b = tg.randn(3), tg.randn(3)
    for _ in range(3):
        np.testing.assert_allclose(g(a, b, a).numpy(), f(a, b, a).numpy(), rtol=1e-6)
    np.testing.assert_allclose(g(a, b, b).numpy(), f(a, b, b).numpy(), rtol=1e-6)


def test_a_list_argument_is_guarded_by_its_items():
    # a list or tuple argument is guarded item by item: a guard that kept only its length (the
    # loop over its items emptied) replayed the first call's 2.0 and the first call's shapes
    def f(x, ks):
        return x * ks[0] + ks[1]

    g = tg.compile(f)
    x = tg.randn(3)
    for _ in range(3):
        np.testing.assert_allclose(g(x, [2.0, tg.ones(3)]).numpy(), f(x, [2.0, tg.ones(3)]).numpy())
    for ks in ([3.0, tg.ones(3)], [2.0, tg.ones(1)], (2.0, tg.ones(3))):
        np.testing.assert_allclose(g(x, ks).numpy(), f(x, ks).numpy(), rtol=1e-6)


def test_a_numpy_scalar_argument_is_guarded_by_value():
    # a NumPy scalar has a dtype and a shape but is a plain value: guarded by its value, as a
    # float is (an `or` for an `and` in guards._argument took it for an array)
    def f(x, s):
        return x * s

    g = tg.compile(f)
    x = tg.randn(3)
    for _ in range(3):
        np.testing.assert_allclose(g(x, np.float32(2.0)).numpy(), f(x, np.float32(2.0)).numpy())
    np.testing.assert_allclose(g(x, np.float32(3.0)).numpy(), f(x, np.float32(3.0)).numpy())


# ----------------------------------------------------------------------------- gpt.store.validate
def test_a_huggingface_config_without_its_optional_fields_gets_gpt2s_defaults():
    from gpt.store.validate import hf_model_config

    got = hf_model_config({"vocab_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8}, "config")
    assert got["block_size"] == 1024 and got["layer_norm_eps"] == 1e-5 and got["tie_weights"]


def test_a_checkpoint_file_larger_than_its_model_can_need_is_refused(tmp_path):
    from gpt.store.errors import CheckpointError
    from gpt.store.validate import plain_file

    (tmp_path / "model.safetensors").write_bytes(bytes(100))
    assert plain_file(tmp_path, "model.safetensors", "w", max_bytes=100).name == "model.safetensors"
    for limit in (99, 50, 0):
        with pytest.raises(CheckpointError, match="more than the"):
            plain_file(tmp_path, "model.safetensors", "w", max_bytes=limit)


def test_gib_names_the_unit_that_fits():
    from gpt.store.validate import gib

    assert gib(3 * 2**20) == "3.0 MiB"
    assert gib(2**40) == "1,024.0 GiB"
    assert gib(2**50 - 2**40) == "1,047,552.0 GiB"
    assert gib(2**50) == "1.0 PiB"
    assert gib(3 * 2**51) == "6.0 PiB"


def test_the_training_estimate_holds_a_batchs_logits_and_their_gradients():
    from gpt.config import GPTConfig
    from gpt.store.validate import estimate_bytes

    c = GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=2, n_embd=16)
    for batch in (1, 8):
        grown = estimate_bytes(c, batch) - estimate_bytes(c, 0)
        assert grown >= 4 * 3 * batch * c.block_size * c.vocab_size  # logits, probs, gradient


def test_a_refused_field_shows_its_value_as_json():
    from gpt.store.errors import CheckpointError
    from gpt.store.validate import hf_model_config

    with pytest.raises(CheckpointError, match='"many"'):
        hf_model_config({"vocab_size": "many", "n_layer": 2, "n_head": 2, "n_embd": 8}, "c")


def test_read_header_accepts_what_safetensors_writes_in_every_numpy_dtype(tmp_path):
    from safetensors.numpy import save_file

    from gpt.store.validate import read_header

    dtypes = [
        "float64",
        "float32",
        "float16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "uint16",
        "uint32",
        "uint64",
    ]
    save_file({d: np.ones((2, 3), dtype=d) for d in dtypes}, str(tmp_path / "all.safetensors"))
    header = read_header(tmp_path / "all.safetensors")
    assert set(dtypes) <= set(header)
