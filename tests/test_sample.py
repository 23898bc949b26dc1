"""gpt-sample: from a gpt-train run and from a GPT-2 (HF) directory; streaming decode; CLI.

Also fine-tunes the tiny HF directory with `gpt-train --init-from`, the path that tokenizes
the data with a tokenizer given from outside. Everything is tiny and offline.
"""

import io
import json
import random
import re

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpt import sample, train
from gpt.config import GPTConfig
from gpt.model import GPT
from gpt.store import run_checkpoint as rc
from gpt.tokenizer import BPETokenizer

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
    "--no-sample",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    rnd = random.Random(1)
    words = [
        "to",
        "be",
        "or",
        "not",
        "that",
        "is",
        "the",
        "question",
        "whether",
        "tis",
        "nobler",
        "in",
        "the",
        "mind",
        "café",
    ]
    text = "\n".join(" ".join(rnd.choice(words) for _ in range(10)) for _ in range(100))
    (d / "text.txt").write_text(text + "\n")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT_CACHE_DIR", str(cache))
        yield d / "text.txt"


@pytest.fixture(scope="module")
def run_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert (
        train.main(
            [
                "--data",
                str(corpus),
                "--out-dir",
                str(out),
                *TINY,
                "--max-iters",
                "4",
                "--eval-interval",
                "2",
            ]
        )
        == 0
    )
    return out


def sample_main(capsys, *argv):
    code = sample.main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_sample_from_run_streams_prompt_and_samples(run_dir, capsys):
    code, out, err = sample_main(
        capsys,
        "--out-dir",
        str(run_dir),
        "--prompt",
        "to be",
        "--num-samples",
        "2",
        "--max-new-tokens",
        "30",
    )
    assert code == 0, err
    first, second = out.split("\n---------------\n")
    assert first.startswith("to be") and second.startswith("to be")
    assert len(first) > len("to be")
    assert "best" in err  # which checkpoint was used
    assert re.search(r"val loss \d+\.\d{4}\)", err), err  # rounded for people


def test_sample_is_reproducible_with_seed_and_which_latest(run_dir, capsys):
    args = ["--out-dir", str(run_dir), "--max-new-tokens", "25", "--num-samples", "1"]
    a = sample_main(capsys, *args, "--seed", "7")[1]
    b = sample_main(capsys, *args, "--seed", "7")[1]
    c = sample_main(capsys, *args, "--seed", "8", "--temperature", "0")[1]
    assert a == b and len(a) > 1 and c
    code, _, err = sample_main(capsys, *args, "--which", "latest")
    assert code == 0 and "iter 4" in err


def test_prompt_file(run_dir, tmp_path, capsys):
    f = tmp_path / "p.txt"
    f.write_text("whether")
    code, out, _ = sample_main(
        capsys,
        "--out-dir",
        str(run_dir),
        "--prompt-file",
        str(f),
        "--max-new-tokens",
        "5",
        "--num-samples",
        "1",
    )
    assert code == 0 and out.startswith("whether")


@pytest.mark.parametrize(
    "args",
    [
        ["--num-samples", "0"],
        ["--max-new-tokens", "-1"],
        ["--temperature", "-0.5"],
        ["--top-k", "-3"],
        ["--top-p", "0"],
        ["--top-p", "1.5"],
        ["--which", "worst"],
        ["--prompt", "a", "--prompt-file", "b"],
        ["--init-from", "/no/such/gpt2"],
        ["--out-dir", "/no/such/run"],
        ["--out-dir", "x", "--init-from", "y"],
        ["--prompt-file", "/no/such/prompt.txt"],
        ["--bogus"],
    ],
)
def test_bad_flags_one_line_exit_2(run_dir, capsys, args):
    if "--out-dir" not in args and "--init-from" not in args:
        args = ["--out-dir", str(run_dir), *args]
    code, _, err = sample_main(capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gpt-sample: error:"), err


# ----------------------------------------------------------------------------- streaming decode
class _ScriptedModel:
    """Stands in for GPT: generate_stream yields a fixed list of token ids."""

    def __init__(self, ids):
        self.ids = ids

    def generate_stream(self, idx, max_new_tokens, **kw):
        for t in self.ids[:max_new_tokens]:
            yield np.array([t])


class _Chunks(io.StringIO):
    def __init__(self):
        super().__init__()
        self.chunks = []

    def write(self, s):
        self.chunks.append(s)
        return super().write(s)


def test_stream_never_prints_half_a_character():
    """Byte-level BPE: 'é' and '🙂' arrive one byte token at a time; no U+FFFD is printed and
    nothing printed is ever taken back."""
    tok = BPETokenizer.train("plain ascii text only", 260)
    text = "café 🙂 ok"
    ids = [tok._byte_ids[b] for b in text.encode()]
    out = _Chunks()
    got = sample.stream_sample(_ScriptedModel(ids), tok, [tok.eot_token_id], len(ids), out=out)
    assert got == text and out.getvalue() == text
    assert all("\ufffd" not in c for c in out.chunks)
    assert len(out.chunks) > 5  # it really streamed


def test_stream_stops_at_endoftext_and_flushes_a_dangling_byte():
    tok = BPETokenizer.train("plain ascii text only", 260)
    ids = [tok._byte_ids[b] for b in b"ab"] + [tok._byte_ids[0xC3]]  # 'Ã' cut short
    out = _Chunks()
    got = sample.stream_sample(
        _ScriptedModel([*ids, tok.eot_token_id, ids[0]]), tok, [tok.eot_token_id], 10, out=out
    )
    assert got == "ab\ufffd" and out.getvalue() == "ab\ufffd"


# ----------------------------------------------------------------------------- GPT-2 directories
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def write_hf_dir(path, tok, block_size=32):
    """A tiny GPT-2 in HuggingFace layout: config.json, model.safetensors (Conv1D weights as
    (in, out)), vocab.json and merges.txt."""
    config = GPTConfig(
        block_size=block_size, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16
    )
    model = GPT(config)
    weights = {}
    for name, w in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        name = name.removeprefix("transformer.")
        weights[name] = np.ascontiguousarray(w.T if name.endswith(_CONV1D) else w)
    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
                "vocab_size": tok.vocab_size,
                "n_positions": block_size,
                "n_layer": 1,
                "n_head": 2,
                "n_embd": 16,
                "activation_function": "gelu_new",
            }
        )
    )
    tok.save(path)
    return model


@pytest.fixture(scope="module")
def hf_dir(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2-tiny")
    tok = BPETokenizer.train(corpus.read_text(), 300)
    write_hf_dir(path, tok)
    return path


def test_sample_init_from_gpt2_dir(hf_dir, capsys):
    code, out, err = sample_main(
        capsys,
        "--init-from",
        str(hf_dir),
        "--prompt",
        "to be",
        "--max-new-tokens",
        "8",
        "--num-samples",
        "1",
    )
    assert code == 0, err
    assert out.startswith("to be")


def test_finetune_init_from_then_sample(hf_dir, corpus, tmp_path, capsys):
    out = tmp_path / "ft"
    code = train.main(
        [
            "--init-from",
            str(hf_dir),
            "--data",
            str(corpus),
            "--out-dir",
            str(out),
            "--block-size",
            "16",
            "--dropout",
            "0.1",
            "--batch-size",
            "2",
            "--max-iters",
            "2",
            "--eval-interval",
            "2",
            "--eval-iters",
            "1",
            "--lr",
            "1e-4",
            "--sample-tokens",
            "5",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    model, tok, ckpt, _ = rc.load_model(out, "latest")
    assert ckpt["tokenizer"]["type"] == "bpe" and tok.vocab_size == 300
    assert model.config.block_size == 16 and model.config.dropout == 0.1
    code, text, _ = sample_main(
        capsys,
        "--out-dir",
        str(out),
        "--prompt",
        "is",
        "--max-new-tokens",
        "5",
        "--num-samples",
        "1",
    )
    assert code == 0 and text.startswith("is")
    # the fine-tuned run resumes like any other
    assert train.main(["--resume", "--out-dir", str(out), "--max-iters", "3"]) == 0


def test_a_run_without_best_says_it_samples_the_latest_and_not_a_stale_loss(
    run_dir, tmp_path, capsys
):
    """A run stopped before its first best/ (or --overwrite, then Ctrl-C early): gpt-sample
    takes the latest checkpoint and says so, and a loss measured at another iteration is
    not shown as this checkpoint's."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    shutil.rmtree(out / "best")
    ckpt = json.loads((out / rc.CKPT_JSON).read_text())
    ckpt["evaluated"] = False  # (stopped between evaluations: val_loss is an older one's)
    (out / rc.CKPT_JSON).write_text(json.dumps(ckpt))
    code, _, err = sample_main(capsys, "--out-dir", str(out), "--max-new-tokens", "5")
    assert code == 0, err
    assert "iter 4, not evaluated at this iteration" in err
    assert "best/ holds no checkpoint yet, so the latest" in err
