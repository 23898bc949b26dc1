"""Into the Hugging Face format: save_pretrained / gpt-export, read back by GPT.from_pretrained
(bitwise) and, where torch and transformers are installed, by transformers itself."""

import json
import os
import re
import string
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from test_train import TINY, corpus, run  # noqa: F401  (corpus is a fixture)

from gpt import GPT, GPTConfig, export
from gpt.hf_format import hf_arrays
from gpt.store import run_checkpoint as rc
from gpt.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer_dir

SMALL = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16)


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    """A small GPT whose every parameter (biases and LayerNorms too) is random."""
    model = GPT(GPTConfig(**{**SMALL, **overrides}))
    g = np.random.default_rng(seed)
    for _, p in model.named_parameters():
        p.data = (0.3 * g.standard_normal(p.shape)).astype(np.float32)
    return model


def weights(model) -> dict:
    return {k: np.asarray(v.data) for k, v in model.named_parameters()}


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype == np.float32, k
        assert np.array_equal(wa[k], wb[k]), f"{k}: differs after the round trip"


def logits(model, ids):
    out, _ = model(ids, targets=ids)
    return np.asarray(out.data)


IDS = np.random.default_rng(1).integers(0, 32, (2, 16))


# ----------------------------------------------------------------------------- round trip
@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_weights": False}, {"gelu": "none", "layer_norm_eps": 1e-6}],
    ids=["tied", "untied", "exact-gelu"],
)
def test_save_pretrained_round_trip_is_bitwise(tmp_path, overrides):
    model = tiny_gpt(**overrides)
    model.save_pretrained(tmp_path / "hf")
    back = GPT.from_pretrained(tmp_path / "hf")
    assert back.config == model.config
    assert_same_weights(model, back)


def test_bias_free_model_exports_zero_biases_with_the_same_logits(tmp_path):
    model = tiny_gpt(bias=False)
    model.save_pretrained(tmp_path / "hf")
    back = GPT.from_pretrained(tmp_path / "hf")
    assert back.config.bias  # GPT-2 always has biases
    for k, w in weights(back).items():
        if k.endswith(".bias"):
            assert not w.any(), k
        else:
            assert np.array_equal(w, weights(model)[k]), k
    np.testing.assert_allclose(logits(back, IDS), logits(model, IDS), rtol=0, atol=1e-5)


def test_config_json_has_gpt2_keys(tmp_path):
    model = tiny_gpt(gelu="none")
    tok = CharTokenizer("abcdefghij")
    model.save_pretrained(tmp_path / "hf", tok)
    c = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert c["model_type"] == "gpt2" and c["architectures"] == ["GPT2LMHeadModel"]
    assert (c["n_embd"], c["n_layer"], c["n_head"], c["vocab_size"]) == (16, 2, 2, 32)
    assert c["n_positions"] == c["n_ctx"] == 16
    assert c["activation_function"] == "gelu"  # exact GELU; tanh is gelu_new
    assert c["layer_norm_epsilon"] == 1e-5 and c["tie_word_embeddings"] is True
    assert c["bos_token_id"] == c["eos_token_id"] == tok.eot_token_id == 1
    tiny_gpt().save_pretrained(tmp_path / "tanh")
    c = json.loads((tmp_path / "tanh" / "config.json").read_text())
    assert c["activation_function"] == "gelu_new" and c["eos_token_id"] is None


@pytest.mark.parametrize("tied", [True, False])
def test_safetensors_has_gpt2_names_conv1d_layout_and_one_tied_matrix(tmp_path, tied):
    model = tiny_gpt(tie_weights=tied)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt"}  # as transformers writes (and may check)
        names = set(f.keys())
        c_fc = f.get_tensor("transformer.h.0.mlp.c_fc.weight")
        wte = f.get_tensor("transformer.wte.weight")
    assert ("lm_head.weight" in names) == (not tied)
    ours = weights(model)
    assert c_fc.shape == (16, 64)  # Conv1D: (in, out), the transpose of nn.Linear's
    assert np.array_equal(c_fc, ours["transformer.h.0.mlp.c_fc.weight"].T)
    assert np.array_equal(wte, ours["transformer.wte.weight"])
    assert names == set(hf_arrays(model))


def test_save_pretrained_refuses_a_tokenizer_larger_than_the_model(tmp_path):
    with pytest.raises(ValueError, match="tokenizer has 36 ids but the model's vocabulary only 32"):
        tiny_gpt().save_pretrained(
            tmp_path, CharTokenizer("abcdefghijklmnopqrstuvwxyz0123456789"[:34])
        )
    assert not (tmp_path / "config.json").exists()


# ----------------------------------------------------------------------------- tokenizers
def test_char_tokenizer_json_round_trip_and_loader_order(tmp_path):
    tok = CharTokenizer("hello world\n")
    d = tok.to_hf_json()
    assert CharTokenizer.from_hf_json(json.loads(json.dumps(d))).to_dict() == tok.to_dict()
    d["model"]["vocab"]["zz"] = 99
    with pytest.raises(ValueError, match="not a gpt character tokenizer"):
        CharTokenizer.from_hf_json(d)
    with pytest.raises(ValueError, match="Hugging Face BPE tokenizer; gpt reads"):
        CharTokenizer.from_hf_json({"model": {"type": "BPE", "vocab": {}}})
    # a hub repo holds vocab.json + merges.txt and a tokenizer.json of its own: GPT-2's pair wins
    bpe = BPETokenizer.train("the cat sat on the mat " * 20, 270)
    bpe.save(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    assert load_tokenizer_dir(tmp_path).to_dict() == bpe.to_dict()


def test_char_tokenizer_json_encodes_like_ours_in_the_tokenizers_library():
    tokenizers = pytest.importorskip(
        "tokenizers", reason="tokenizers is not installed: pip install -e '.[hf]'"
    )
    tok = CharTokenizer("ab\n c\u00e9\U0001f600")
    hf = tokenizers.Tokenizer.from_str(json.dumps(tok.to_hf_json()))
    text = "a b\n\n\u00e9c?\U0001f600<|endoftext|>ba  "  # '?' is unknown: <|unk|> = 0
    ids = tok.encode(text, allowed_special="all")
    assert 0 in ids and 1 in ids
    assert hf.encode(text).ids == ids
    assert hf.decode(ids) == tok.decode([i for i in ids if i > 1])


def test_an_export_over_another_replaces_the_other_tokenizer(tmp_path):
    model = tiny_gpt(vocab_size=300)
    model.save_pretrained(tmp_path, BPETokenizer.train("the cat sat on the mat " * 20, 270))
    char = CharTokenizer("the cat")
    model.save_pretrained(tmp_path, char)
    assert not (tmp_path / "vocab.json").exists() and not (tmp_path / "merges.txt").exists()
    assert load_tokenizer_dir(tmp_path).to_dict() == char.to_dict()


# ----------------------------------------------------------------------------- gpt-export
@pytest.fixture(scope="module", params=["char", "bpe"])
def trained(request, corpus, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp(f"run-{request.param}")
    args = ["--max-iters", "4", "--eval-interval", "2"]
    if request.param == "bpe":
        args += ["--tokenizer", "bpe", "--vocab-size", "300"]
    assert run(corpus, out, *args)[0] == 0
    return out


def test_gpt_export_writes_a_run_that_loads_back_bitwise(trained, tmp_path, capsys):
    to = tmp_path / "hf"
    assert export.main(["--out-dir", str(trained), "--to", str(to), "--which", "latest"]) == 0
    out = capsys.readouterr().out
    model, tok, ckpt, _ = rc.load_model(trained, which="latest")
    kind = tok.kind
    names = {p.name for p in to.iterdir()}
    want = {"vocab.json", "merges.txt"} if kind == "bpe" else {"tokenizer.json"}
    manifest = "gpt-export.json"  # the files it wrote, so that a re-export may replace them
    assert names == {"config.json", "model.safetensors", "tokenizer_config.json", manifest, *want}
    assert ("char tokenizer: tokenizer.json" in out) == (kind == "char")
    assert f"from_pretrained({str(to)!r})" in out and f"iter {ckpt['iter']}" in out
    back = GPT.from_pretrained(to)
    assert_same_weights(model, back)
    assert load_tokenizer_dir(to).to_dict() == tok.to_dict()
    # and the exported directory is a checkpoint --init-from takes
    from gpt import sample

    assert sample.main(["--init-from", str(to), "--max-new-tokens", "3", "--prompt", "the"]) == 0


def test_gpt_export_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert export.main(["--out-dir", str(tmp_path), "--to", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpt-export: error: --to {tmp_path / 'file'} exists and is not a directory"
    )
    assert export.main(["--out-dir", str(tmp_path / "none"), "--to", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint in" in err
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- transformers
def _hf():
    hf = "is not installed: pip install -e '.[hf]'"
    torch = pytest.importorskip("torch", reason=f"torch {hf}")
    transformers = pytest.importorskip("transformers", reason=f"transformers {hf}")
    return torch, transformers


def test_transformers_loads_an_export_with_equal_logits_and_greedy_text(trained, tmp_path):
    torch, transformers = _hf()
    to = tmp_path / "hf"
    assert export.main(["--out-dir", str(trained), "--to", str(to)]) == 0
    model, tok, _, _ = rc.load_model(trained, which="best")
    hf = transformers.GPT2LMHeadModel.from_pretrained(to).eval()
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (3, 16))
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(logits(model, ids), theirs, rtol=0, atol=1e-4)

    prompt = np.array([tok.encode("the king")], dtype=np.int64)[:, :6]
    n = 16 - prompt.shape[1]  # GPT-2 has no positions past n_positions
    eot = tok.eot_token_id
    ours = model.generate(prompt, n, temperature=0, eos_token_id=eot)
    with torch.no_grad():
        g = hf.generate(
            torch.tensor(prompt), max_new_tokens=n, do_sample=False, pad_token_id=eot
        ).numpy()
    assert ours.tolist() == g.tolist()
    # and transformers' tokenizer from the same directory gives our ids
    at = transformers.AutoTokenizer.from_pretrained(to)
    text = "the queen rode out\nat dawn"
    assert at(text)["input_ids"] == tok.encode(text)


@pytest.mark.parametrize("overrides", [{"tie_weights": False}, {"gelu": "none", "bias": False}])
def test_transformers_matches_every_config_variant(tmp_path, overrides):
    torch, transformers = _hf()
    model = tiny_gpt(**overrides)
    model.save_pretrained(tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(logits(model, IDS), theirs, rtol=0, atol=1e-4)


def test_an_export_is_safetensors_and_json_readable_by_others(tmp_path):
    umask = os.umask(0o022)
    try:
        tiny_gpt().save_pretrained(tmp_path, CharTokenizer("ab"))
    finally:
        os.umask(umask)
    for p in tmp_path.iterdir():
        assert p.suffix in (".json", ".safetensors"), p.name  # no pickle
        assert p.stat().st_mode & 0o777 == 0o644, p.name  # a server may run as another user


def test_the_docs_python_examples_run(tmp_path, monkeypatch, capsys):
    """docs/huggingface.md's two Python blocks, on a small export in place of hf/tiny."""
    _hf()
    doc = Path(__file__).resolve().parents[1] / "docs" / "huggingface.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert len(blocks) == 2
    tok = CharTokenizer(string.printable)
    monkeypatch.chdir(tmp_path)
    tiny_gpt(vocab_size=tok.vocab_size, block_size=64).save_pretrained("hf/tiny", tok)
    exec(compile(blocks[0], str(doc), "exec"), {})
    assert capsys.readouterr().out.startswith("ROMEO:")
    exec(compile(blocks[1], str(doc), "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("largest logit difference: ") and float(out.split()[-1]) < 1e-4
