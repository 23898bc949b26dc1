"""gpt-explain stays bounded on long prompts and fails one line at a time, with exit codes."""

import json

import pytest

from gpt.explain import explain, main, prompt_tokenizer
from gpt.explain.steps import Session
from gpt.model import GPT

LONG = ("The quick brown fox jumps over the lazy dog while the cat sleeps. " * 80)[:5000]


@pytest.mark.parametrize("fmt", ["text", "json", "html"])
def test_a_5000_character_prompt_gives_a_small_output(fmt, tmp_path, capsys):
    out = tmp_path / f"x.{fmt}"
    assert main(["--prompt", LONG, "--tokenizer", "char", "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text()
    assert len(text) < 3_000_000, len(text)  # it was 245 MB to 1.19 GB before the bound
    assert "were cut to the first 64 (max_tokens)" in text
    if fmt == "json":
        r = json.loads(text)
        assert len(r["tokens"]["ids"]) == 64 and r["config"]["block_size"] == 63


def test_max_tokens_and_its_limit(capsys):
    assert (
        main(["--prompt", LONG, "--tokenizer", "char", "--format", "json", "--max-tokens", "10"])
        == 0
    )
    assert len(json.loads(capsys.readouterr().out)["tokens"]["ids"]) == 10
    with pytest.raises(SystemExit) as e:
        main(["--max-tokens", "100000"])
    assert e.value.code == 2 and "--max-tokens must be in 2..256" in capsys.readouterr().err


def test_the_block_size_cuts_a_long_prompt(capsys):
    from gpt.config import GPTConfig

    tok = prompt_tokenizer(LONG, "char")
    model = GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))
    r = explain(model, tok, LONG, checks=0)
    assert len(r["tokens"]["ids"]) == 17 and "block_size + 1" in r["notes"][0]


def test_every_block_maps_are_bounded(monkeypatch):
    import gpt.explain.report as ex
    from gpt.config import GPTConfig

    monkeypatch.setattr(ex, "MAX_MAP_CELLS", 2 * 25)  # room for one block of 2 heads, T = 5
    prompt = "The capital of France is Paris"
    tok = prompt_tokenizer(prompt)
    r = explain(
        GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size)),
        tok,
        prompt,
        checks=0,
        lens=False,
    )
    assert len(r["attention_all"]) == 1 and any("blocks 0..0 of 2" in n for n in r["notes"])


def test_graph_failure_keeps_the_explanation(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Graphviz `dot` on PATH
    code = main(["--graph", str(tmp_path / "g.svg")])
    out, err = capsys.readouterr()
    assert code == 1
    assert "== 8. one weight by hand" in out  # the whole explanation is still printed
    assert "the graph was not rendered" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "g.dot").read_text().startswith("digraph")  # the DOT text is kept


def test_exit_codes(tmp_path, capsys):
    assert main(["--layer", "7"]) == 2  # usage: the model has 2 blocks
    assert "layer 7" in capsys.readouterr().err
    assert main(["--prompt", "The"]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["--out-dir", str(tmp_path / "missing")]) == 1  # runtime: nothing to load
    err = capsys.readouterr().err
    assert err.startswith("gpt-explain: could not load the model") and err.count("\n") == 1
    with pytest.raises(SystemExit) as e:
        main(["--graph", "g.jpg"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["--steps", "2", "--serve"])
    assert e.value.code == 2
    assert main(["--steps", "5000"]) == 2
    assert "steps must be in 1..1000" in capsys.readouterr().err


def test_a_refused_step_leaves_the_session_as_it_was():
    prompt = "The capital of France is Paris"
    tok = prompt_tokenizer(prompt)
    from gpt.config import GPTConfig

    s = Session(GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size)), tok, prompt)
    with pytest.raises(ValueError, match="layer 9"):
        s.step(layer=9)
    assert s.layer == 0 and s.history == []


@pytest.mark.parametrize("prompt", [None, LONG[:400]])
def test_terminal_output_fits_100_columns_and_a_screenful_by_default(prompt, capsys):
    """The default listing is a summary (at most 150 lines for the default prompt, a few more
    for a 64-token one); --full prints every row; both fit 100 columns."""
    args = ["--tokenizer", "char", "--prompt", prompt] if prompt else []
    assert main(args) == 0
    brief = capsys.readouterr().out.splitlines()
    assert main([*args, "--full"]) == 0
    full = capsys.readouterr().out.splitlines()
    for lines in (brief, full):
        wide = [line for line in lines if len(line) > 100]
        assert not wide, f"{len(wide)} lines over 100 columns, e.g. {wide[0]!r}"
    assert len(brief) <= (150 if prompt is None else 170), len(brief)
    assert len(full) > len(brief) and not any("--full shows all" in line for line in full)
    last = "  transformer.h.1.mlp.c_proj.bias"  # the last parameter of the tables
    assert sum(line.startswith(last) for line in full) == 2  # gradients and AdamW
    assert not any(line.startswith(last) for line in brief)


def test_a_long_prompt_of_one_unspaced_word_says_why_it_is_one_token(capsys):
    """8,000 characters of Chinese with no punctuation: the BPE learned from the prompt makes
    its one word one token; the message says so and what to pass instead."""
    prompt = "我们学习语言模型" * 1000
    assert main(["--prompt", prompt]) == 2
    err = capsys.readouterr().err
    assert "one word of" in err and "--tokenizer char" in err, err
    assert main(["--prompt", prompt, "--tokenizer", "char", "--max-tokens", "16"]) == 0
