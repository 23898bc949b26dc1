"""Nothing lost, nothing silently wrong: gpt-export and save_pretrained never delete or mix a
user's files, every GPT-2 config field that changes the math is honoured or refused, and a
reader of a run survives gpt-train rotating its checkpoint."""

import json
import os

import numpy as np
import pytest
from test_pretrained import HF_CONFIG, hf_weights, model_logits, reference_logits, write_dir

from gpt import GPT, GPTConfig, export, sample
from gpt.hub import HubError, is_hub_name, source_problem
from gpt.store import owned_dir
from gpt.store import run_checkpoint as rc
from gpt.store.errors import CheckpointError
from gpt.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer_dir

CHARS = "abcdefghij klmnop\n"


def make_run(out, seed: int, it: int = 3, tok=None):
    """A gpt-train run directory holding one checkpoint of a tiny random GPT (no training)."""
    tok = tok or CharTokenizer(CHARS)
    config = GPTConfig(block_size=16, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config)
    g = np.random.default_rng(seed)
    for _, p in model.named_parameters():
        p.data = (0.3 * g.standard_normal(p.shape)).astype(np.float32)
    ckpt = {"iter": it, "model_config": config.to_dict(), "tokenizer": tok.to_dict()}
    rc.save(out, ckpt, model)
    return model


def weights(model) -> dict:
    return {k: np.asarray(v.data) for k, v in model.named_parameters()}


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def snapshot(d) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def export_main(out, to, capsys):
    code = export.main(["--out-dir", str(out), "--to", str(to), "--which", "latest"])
    cap = capsys.readouterr()
    return code, cap.err


def one_line_error(code, err, *needles):
    assert code != 0 and err.count("\n") == 1 and err.startswith("gpt-export: error: "), err
    for n in needles:
        assert n in err, err


@pytest.fixture
def runs(tmp_path):
    """Two runs A and B of different weights, a char and a BPE tokenizer."""
    bpe = BPETokenizer.train("the cat sat on the mat " * 20, 270)
    return (
        (tmp_path / "A", make_run(tmp_path / "A", seed=1)),
        (tmp_path / "B", make_run(tmp_path / "B", seed=2, tok=bpe)),
    )


# ----------------------------------------------------------------------------- gpt-export
def test_export_refuses_a_directory_it_did_not_write_and_touches_nothing(runs, tmp_path, capsys):
    (a, _), _ = runs
    to = tmp_path / "mine"
    to.mkdir()
    (to / "vocab.json").write_text('{"mine": 0}')
    (to / "merges.txt").write_text("#version: mine\n")
    (to / "config.json").write_text('{"my": "config"}')
    before = snapshot(to)
    code, err = export_main(a, to, capsys)
    one_line_error(code, err, str(to), "not written by gpt-export")
    assert snapshot(to) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A", "B", "mine"]  # no temp left


@pytest.mark.parametrize("to", ["", "a" * 300, "x/" + "b" * 300 + "/y"])
def test_export_refuses_bad_targets_in_one_line(runs, tmp_path, monkeypatch, capsys, to):
    (a, _), _ = runs
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = export_main(a, to, capsys)
    one_line_error(code, err, "--to")
    assert len(err) < 300  # the name is shortened
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_into_a_new_an_empty_and_its_own_directory(runs, tmp_path, capsys):
    (a, model_a), (b, model_b) = runs
    to = tmp_path / "new" / "hf"
    assert export_main(a, to, capsys)[0] == 0
    assert same_weights(GPT.from_pretrained(to), model_a)
    manifest = json.loads((to / owned_dir.MANIFEST).read_text())
    assert set(manifest["files"]) == {p.name for p in to.iterdir()} - {owned_dir.MANIFEST}
    # again, with another run whose tokenizer is BPE: replaced whole, the char one is gone
    assert export_main(b, to, capsys)[0] == 0
    assert same_weights(GPT.from_pretrained(to), model_b)
    assert not (to / "tokenizer.json").exists()
    assert load_tokenizer_dir(to).kind == "bpe"
    assert sorted(p.name for p in to.parent.iterdir()) == ["hf"]  # no temporary left behind
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_main(a, empty, capsys)[0] == 0
    assert same_weights(GPT.from_pretrained(empty), model_a)


def test_export_refuses_its_own_directory_once_a_user_changed_or_added_a_file(
    runs, tmp_path, capsys
):
    (a, _), (b, _) = runs
    to = tmp_path / "hf"
    assert export_main(a, to, capsys)[0] == 0
    (to / "README.md").write_text("my notes")
    before = snapshot(to)
    code, err = export_main(b, to, capsys)
    one_line_error(code, err, "README.md")
    assert snapshot(to) == before
    (to / "README.md").unlink()
    (to / "config.json").write_text((to / "config.json").read_text().replace("2", "2 "))
    before = snapshot(to)
    code, err = export_main(b, to, capsys)
    one_line_error(code, err, "config.json", "changed")
    assert snapshot(to) == before


@pytest.mark.parametrize(
    "fmt", ["other-tool/hf-export/1", "tensorgrad-gpt/hf-export/2", None, 3], ids=str
)
def test_a_manifest_of_another_format_is_refused_in_one_line(runs, tmp_path, capsys, fmt):
    """A gpt-export.json that lists the directory's files, each unchanged, but whose format is
    not gpt-export's (another tool's file of the same name, a later version of this one, or
    none) is not taken for gpt's own: gpt-export refuses the directory in one line naming the
    format, and save_pretrained (which writes into a used directory in place) refuses to
    overwrite the manifest; nothing changes."""
    (a, _), (b, model_b) = runs
    to = tmp_path / "hf"
    assert export_main(a, to, capsys)[0] == 0
    path = to / owned_dir.MANIFEST
    manifest = json.loads(path.read_text())
    if fmt is None:
        del manifest["format"]
    else:
        manifest["format"] = fmt
    path.write_text(json.dumps(manifest))
    before = snapshot(to)
    code, err = export_main(b, to, capsys)
    one_line_error(
        code, err, str(path), "not written by gpt-export", f"its format is {json.dumps(fmt)}"
    )
    assert snapshot(to) == before
    with pytest.raises(ValueError, match=r"not written by gpt \(its format is ") as e:
        model_b.save_pretrained(to)
    assert "\n" not in str(e.value)
    assert snapshot(to) == before


def test_a_killed_reexport_leaves_the_first_export_whole(runs, tmp_path, monkeypatch, capsys):
    """Interrupted after the new weights are written (the tokenizer comes next), or between
    the two renames of the swap: the directory is the first export whole, never a mix (a
    SIGKILL between the renames would leave it absent, and the first export whole aside)."""
    (a, model_a), (b, _) = runs
    to = tmp_path / "hf"
    assert export_main(a, to, capsys)[0] == 0
    first = snapshot(to)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as a SIGINT would, right after the weights were written

    import gpt.hf_format

    with monkeypatch.context() as m:
        m.setattr(gpt.hf_format, "save_tokenizer", killed)
        with pytest.raises(KeyboardInterrupt):
            export.main(["--out-dir", str(b), "--to", str(to), "--which", "latest"])
    assert snapshot(to) == first
    assert same_weights(GPT.from_pretrained(to), model_a)

    real = os.rename
    calls = []

    def rename_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the old export is aside, the new one not yet in
            raise KeyboardInterrupt
        return real(src, dst)

    with monkeypatch.context() as m:
        m.setattr(owned_dir.os, "rename", rename_then_die)
        with pytest.raises(KeyboardInterrupt):
            export.main(["--out-dir", str(b), "--to", str(to), "--which", "latest"])
    assert len(calls) == 3 and snapshot(to) == first  # put back (3rd rename) whole, not mixed
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert export_main(b, to, capsys)[0] == 0  # and a new export proceeds


# ----------------------------------------------------------------------------- save_pretrained
def test_save_pretrained_never_deletes_files_it_did_not_write(runs, tmp_path):
    (_, model), _ = runs
    d = tmp_path / "d"
    d.mkdir()
    (d / "README.md").write_text("mine")
    (d / "vocab.json").write_text('{"mine": 0}')
    (d / "merges.txt").write_text("#version: mine\n")
    before = snapshot(d)
    # a char tokenizer here would be read second to the user's vocab.json + merges.txt: refused
    with pytest.raises(ValueError, match=r"(merges\.txt|vocab\.json) was not written by gpt"):
        model.save_pretrained(d, CharTokenizer(CHARS))
    assert snapshot(d) == before
    (d / "vocab.json").unlink()
    (d / "merges.txt").unlink()
    model.save_pretrained(d, CharTokenizer(CHARS))  # as transformers: into a used directory
    assert (d / "README.md").read_text() == "mine"
    assert same_weights(GPT.from_pretrained(d), model)


def test_save_pretrained_keeps_its_tokenizer_when_saved_again_without_one(runs, tmp_path):
    (_, model), _ = runs
    tok = CharTokenizer(CHARS)
    model.save_pretrained(tmp_path / "d", tok)
    model.save_pretrained(tmp_path / "d")  # as transformers: the tokenizer's files stay
    assert load_tokenizer_dir(tmp_path / "d").to_dict() == tok.to_dict()


def test_an_export_into_the_working_directory_keeps_it(runs, tmp_path, monkeypatch, capsys):
    (a, _), (b, model_b) = runs
    d = tmp_path / "hf"
    assert export_main(a, d, capsys)[0] == 0
    monkeypatch.chdir(d)
    assert export_main(b, ".", capsys)[0] == 0  # written in place: a renamed cwd would be lost
    assert os.getcwd() == str(d) and same_weights(GPT.from_pretrained("."), model_b)
    assert not (d / "tokenizer.json").exists() and load_tokenizer_dir(d).kind == "bpe"
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []


# ----------------------------------------------------------------------------- config fields
@pytest.mark.parametrize(
    "field",
    [
        {"scale_attn_by_inverse_layer_idx": True},
        {"scale_attn_weights": False},
        {"n_inner": 4 * 16 + 1},
        {"add_cross_attention": True},
        {"model_type": "gpt_neo"},
        {"n_embd": 16, "hidden_size": 32},
    ],
    ids=lambda f: list(f)[-1],
)
def test_config_fields_that_change_the_math_are_refused_by_name(tmp_path, field):
    d = write_dir(tmp_path / "m", hf_weights(), dict(HF_CONFIG, **field))
    with pytest.raises(CheckpointError, match=list(field)[-1]):
        GPT.from_pretrained(d)


@pytest.mark.parametrize(
    "field",
    [
        {"scale_attn_by_inverse_layer_idx": False},
        {"scale_attn_weights": True},
        {"n_inner": None},
        {"n_inner": 64},
        {"reorder_and_upcast_attn": True},  # the same math in float32
        {"add_cross_attention": False},
        {"model_type": "gpt2"},
        {"resid_pdrop": 0.3, "summary_type": "mean", "initializer_range": 1.0},
    ],
    ids=lambda f: list(f)[0],
)
def test_config_fields_that_keep_the_math_are_accepted(tmp_path, field):
    w = hf_weights()
    model = GPT.from_pretrained(write_dir(tmp_path / "m", w, dict(HF_CONFIG, **field)))
    idx = np.random.default_rng(1).integers(0, 32, (2, 16))
    np.testing.assert_allclose(model_logits(model, idx), reference_logits(w, idx), atol=1e-4)


def test_alias_names_of_config_fields_are_read_as_transformers_does(tmp_path):
    cfg = {k: v for k, v in HF_CONFIG.items() if k not in ("n_layer", "n_embd")}
    cfg |= {"num_hidden_layers": 2, "hidden_size": 16}
    model = GPT.from_pretrained(write_dir(tmp_path / "m", hf_weights(), cfg))
    assert (model.config.n_layer, model.config.n_embd) == (2, 16)


@pytest.mark.parametrize("tie", [True, None])
def test_a_tied_config_with_a_different_lm_head_loads_untied(tmp_path, tie):
    w = hf_weights()
    head = (0.3 * np.random.default_rng(5).standard_normal(w["wte.weight"].shape)).astype(
        np.float32
    )
    cfg = dict(HF_CONFIG) | ({} if tie is None else {"tie_word_embeddings": tie})
    d = write_dir(tmp_path / "m", w, cfg)
    from safetensors.numpy import save_file

    save_file({**w, "lm_head.weight": head}, str(d / "model.safetensors"))
    model = GPT.from_pretrained(d)
    assert not model.config.tie_weights
    assert np.array_equal(np.asarray(model.lm_head.weight.data), head)
    assert np.array_equal(np.asarray(model.transformer.wte.weight.data), w["wte.weight"])
    idx = np.random.default_rng(1).integers(0, 32, (2, 16))
    got = model_logits(model, idx)
    want = reference_logits(w, idx) @ np.linalg.pinv(w["wte.weight"].T.astype(np.float64))
    np.testing.assert_allclose(got, want @ head.T.astype(np.float64), atol=1e-3)
    # an equal copy stays tied
    save_file({**w, "lm_head.weight": w["wte.weight"]}, str(d / "model.safetensors"))
    assert GPT.from_pretrained(d).config.tie_weights


def test_transformers_agrees_on_an_untied_lm_head_under_a_tied_config(tmp_path):
    hf = "is not installed: pip install -e '.[hf]'"
    torch = pytest.importorskip("torch", reason=f"torch {hf}")
    transformers = pytest.importorskip("transformers", reason=f"transformers {hf}")
    w = {"transformer." + k: v for k, v in hf_weights().items()}
    w["lm_head.weight"] = (0.3 * np.random.default_rng(5).standard_normal((32, 16))).astype(
        np.float32
    )
    d = write_dir(tmp_path / "m", w)
    idx = np.random.default_rng(1).integers(0, 32, (2, 16))
    hf = transformers.GPT2LMHeadModel.from_pretrained(d).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(idx)).logits.numpy()
    np.testing.assert_allclose(model_logits(GPT.from_pretrained(d), idx), theirs, atol=1e-4)


def test_gpt_train_init_from_refuses_such_a_config_in_one_line(tmp_path, monkeypatch, capsys):
    from gpt.train import main as train_main

    monkeypatch.setenv("GPT_CACHE_DIR", str(tmp_path / "cache"))
    d = write_dir(tmp_path / "m", hf_weights(), dict(HF_CONFIG, scale_attn_weights=False))
    CharTokenizer(CHARS).save(d)
    (tmp_path / "t.txt").write_text("the cat sat on the mat\n" * 50)
    argv = ["--data", str(tmp_path / "t.txt"), "--init-from", str(d), "--max-iters", "1"]
    code = train_main([*argv, "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "scale_attn_weights" in err, err


# ----------------------------------------------------------------------------- rotation
def _rotating(monkeypatch, out, every: bool = False):
    """Make rc.load_arrays rotate the run's checkpoint (a newer iteration, as gpt-train
    saves it) just before the weights are opened: once, or on every call."""
    real = rc.load_arrays
    state = {"it": 3}
    newest = {}

    def rotate_then_load(path, *args, **kwargs):
        if every or state["it"] == 3:
            state["it"] += 1
            newest["model"] = make_run(out, seed=state["it"], it=state["it"])
        return real(path, *args, **kwargs)

    monkeypatch.setattr(rc, "load_arrays", rotate_then_load)
    return newest


def test_a_reader_gets_the_newer_checkpoint_when_the_run_rotates_under_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    make_run(out, seed=3, it=3)
    newest = _rotating(monkeypatch, out)
    model, tok, ckpt, d = rc.load_model(out, which="latest")
    assert ckpt["iter"] == 4 and same_weights(model, newest["model"])
    assert tok.to_dict() == CharTokenizer(CHARS).to_dict()


def test_a_reader_racing_a_writer_forever_gives_up_in_one_line(tmp_path, monkeypatch):
    out = tmp_path / "run"
    make_run(out, seed=3, it=3)
    _rotating(monkeypatch, out, every=True)
    with pytest.raises(CheckpointError, match="changed") as e:
        rc.load_model(out, which="latest")
    assert "\n" not in str(e.value)


def test_gpt_sample_survives_a_rotation(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    make_run(out, seed=3, it=3)
    _rotating(monkeypatch, out)
    code = sample.main(["--out-dir", str(out), "--which", "latest", "--max-new-tokens", "2"])
    assert code == 0, capsys.readouterr().err


# ----------------------------------------------------------------------------- hub names
@pytest.mark.parametrize("name", ["a" * 300, "a" * 300 + "/b", "x/" + "c" * 300])
def test_an_overlong_name_gets_the_hubs_one_line_error(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert not is_hub_name(name)
    assert "is neither a directory nor a Hugging Face hub name" in source_problem(name)
    with pytest.raises(HubError, match="is neither a directory nor a Hugging Face hub name") as e:
        GPT.from_pretrained(name)
    assert len(str(e.value)) < 300


# ----------------------------------------------------------------------------- HF files, round 4
def test_two_names_for_one_parameter_are_refused_naming_both(tmp_path):
    """``transformer.h.0.ln_1.weight`` and ``h.0.ln_1.weight`` are one parameter once the
    prefix is stripped: refused, rather than one copy silently winning."""
    w = hf_weights()
    w["transformer.h.0.ln_1.weight"] = w["h.0.ln_1.weight"] + 1
    d = write_dir(tmp_path / "m", w)
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(d)
    msg = str(e.value)
    assert "'h.0.ln_1.weight'" in msg and "'transformer.h.0.ln_1.weight'" in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "field",
    [
        {"scale_attn_weights": "false"},
        {"scale_attn_weights": 1},
        {"scale_attn_by_inverse_layer_idx": 0},
        {"scale_attn_by_inverse_layer_idx": "false"},
        {"add_cross_attention": ""},
        {"reorder_and_upcast_attn": "false"},
        {"tie_word_embeddings": None},  # transformers reads null as false: untied
        {"tie_word_embeddings": "true"},
    ],
    ids=lambda f: f"{list(f)[0]}={json.dumps(list(f.values())[0])}",
)
def test_boolean_config_fields_must_be_json_booleans(tmp_path, field):
    d = write_dir(tmp_path / "m", hf_weights(), dict(HF_CONFIG, **field))
    with pytest.raises(CheckpointError, match=f"{list(field)[0]} must be true or false") as e:
        GPT.from_pretrained(d)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "field",
    [{"scale_attn_by_inverse_layer_idx": None}, {"add_cross_attention": None}],
    ids=lambda f: list(f)[0],
)
def test_null_boolean_fields_that_mean_the_default_load(tmp_path, field):
    w = hf_weights()
    model = GPT.from_pretrained(write_dir(tmp_path / "m", w, dict(HF_CONFIG, **field)))
    idx = np.random.default_rng(1).integers(0, 32, (2, 16))
    np.testing.assert_allclose(model_logits(model, idx), reference_logits(w, idx), atol=1e-4)


@pytest.mark.parametrize(
    "name",
    [
        "transformer.h.99.attn.bias",  # a block the 2-layer config has not
        "h.2.attn.masked_bias",
        "junk.attn.bias",
        "transformer.h.01.attn.bias",
        "lm_head.attn.bias",
    ],
)
def test_a_mask_buffer_name_outside_the_model_is_an_unexpected_tensor(tmp_path, name):
    w = hf_weights()
    w[name] = np.ones((1, 1, 4, 4), np.float32)
    d = write_dir(tmp_path / "m", w)
    with pytest.raises(CheckpointError, match="unexpected tensor") as e:
        GPT.from_pretrained(d)
    assert repr(name) in str(e.value) and "\n" not in str(e.value)


def _write_raw_safetensors(path, arrays: dict, empty_names) -> None:
    """A safetensors file holding ``arrays`` and one empty F32 entry per name in empty_names."""
    header, blobs, pos = {}, [], 0
    for name in empty_names:
        header[name] = {"dtype": "F32", "shape": [1, 1, 0, 0], "data_offsets": [0, 0]}
    for name, a in arrays.items():
        b = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def test_a_header_with_too_many_entries_is_refused(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIG))
    _write_raw_safetensors(
        d / "model.safetensors", hf_weights(), (f"x{i}.attn.bias" for i in range(200_000))
    )
    with pytest.raises(CheckpointError, match="entries") as e:
        GPT.from_pretrained(d)
    assert "\n" not in str(e.value)
