"""Tests for gpt.tokenizer: round trips, special tokens, GPT-2 file format, BPE training."""

import functools
import itertools
import json
import unicodedata
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt.tokenizer import (
    EOT,
    BPETokenizer,
    CharTokenizer,
    byte_to_unicode,
    gpt2_split_pattern,
    load_tokenizer_dir,
    tokenizer_from_dict,
)

try:  # only to check our `re` version of GPT-2's pattern against the original
    import regex
except ImportError:
    regex = None

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak.\n"
    "All: Speak, speak. You're all resolved rather to die than to famish?\n"
    "Naïve café déjà vu — 12 345 6789 ½ ² ünïcödé 日本語のテキスト 🙂🙃\n"
    "\tTabs\tand  double  spaces, it's what we'd've done; they'll see.\r\n"
) * 3


@functools.cache
def small_bpe() -> BPETokenizer:
    return BPETokenizer.train(TEXT, vocab_size=400)


@functools.cache
def small_char() -> CharTokenizer:
    return CharTokenizer.train(["hello world", "Goodbye, moon!\n"])


# --------------------------------------------------------------------------- pre-tokenizer


@pytest.mark.parametrize(
    "text, pieces",
    [
        ("Hello world's 123 !!  \n", ["Hello", " world", "'s", " 123", " !!", "  \n"]),
        ("I'll  go\tnow", ["I", "'ll", " ", " go", "\t", "now"]),
        ("naïve café ²½ x\u00a0y", ["naïve", " café", " ²½", " x", "\u00a0", "y"]),
        ("a\x1cb", ["a", "\x1c", "b"]),  # a record separator is punctuation, not whitespace
    ],
)
def test_split_pattern_examples(text, pieces):
    assert gpt2_split_pattern().findall(text) == pieces


@pytest.mark.skipif(
    regex is None, reason="the `regex` package is not installed: pip install -e '.[test]'"
)
@settings(max_examples=300, deadline=None)
@given(st.text())
def test_split_pattern_matches_gpt2_regex(s):
    ref = regex.compile(
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    )
    # Only characters both Unicode databases know: `regex` may be on a newer Unicode version.
    s = "".join(c for c in s if unicodedata.category(c) != "Cn")
    assert gpt2_split_pattern().findall(s) == ref.findall(s)


# --------------------------------------------------------------------------- char tokenizer


def test_char_ids_layout():
    tok = small_char()
    assert tok.encode("") == []
    assert tok.eot_token_id == 1 and tok.unk_token_id == 0
    assert tok.vocab_size == 2 + len(set("hello worldGoodbye, moon!\n"))
    assert tok.encode("\n ") == [2, 3]  # characters in code point order from id 2
    assert tok.decode([1]) == EOT


@given(st.text(alphabet="hello worldGoodbye, moon!\n"))
def test_char_round_trip_over_alphabet(s):
    tok = small_char()
    assert tok.decode(tok.encode(s)) == s


def test_char_unknown_maps_to_unk():
    tok = small_char()
    ids = tok.encode("hé\U0001f642!")
    assert ids[1] == 0 and ids[2] == 0 and 0 not in (ids[0], ids[3])
    assert tok.decode(ids) == "h\ufffd\ufffd!"


def test_char_special_only_when_allowed():
    tok = small_char()
    text = f"hello{EOT}moon"
    assert tok.encode(text) == tok.encode_ordinary(text) and 1 not in tok.encode(text)
    ids = tok.encode(text, allowed_special="all")
    assert ids.count(1) == 1 and tok.decode(ids) == text
    with pytest.raises(ValueError):
        tok.encode(text, allowed_special={"<|nope|>"})


def test_char_save_load_and_dict(tmp_path):
    tok = CharTokenizer.train("weird \ud800 chars\x00\n")  # a lone surrogate survives JSON
    tok.save(tmp_path)
    for other in (
        CharTokenizer.load(tmp_path),
        load_tokenizer_dir(tmp_path),
        tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))),
    ):
        assert isinstance(other, CharTokenizer)
        assert other.chars == tok.chars
        assert other.encode("weird\ud800 x") == tok.encode("weird\ud800 x")


def test_decode_rejects_unknown_ids():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small_char().decode([1, 999])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small_bpe().decode([-1])


# --------------------------------------------------------------------------- BPE


def test_bpe_ids_layout():
    tok = small_bpe()
    assert tok.vocab_size == 400
    assert tok.eot_token_id == 399 and tok.special_tokens == {EOT: 399}
    # The first 256 ids are the bytes in GPT-2's order: '!' is 0, the space byte 'Ġ' is 220.
    assert tok.vocab["!"] == 0 and tok.vocab["Ġ"] == 220 and tok.vocab["Ċ"] == 198
    assert len(tok.merges) == 400 - 256 - 1
    assert len(tok.encode(TEXT)) < len(TEXT.encode()) / 2  # the merges compress


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_bpe_round_trip(s):
    tok = small_bpe()
    assert tok.decode(tok.encode(s)) == s
    assert tok.decode(tok.encode(s, allowed_special="all")) == s


def test_bpe_lone_surrogate_does_not_crash():
    tok = small_bpe()
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffd\ufffd\ufffdb"


def test_bpe_special_only_when_allowed():
    tok = small_bpe()
    text = f"speak.{EOT}Speak"
    assert tok.eot_token_id not in tok.encode(text)
    ids = tok.encode(text, allowed_special={EOT})
    assert ids.count(tok.eot_token_id) == 1
    assert tok.decode(ids) == text
    assert tok.decode([tok.eot_token_id]) == EOT


def naive_bpe_merges(text: str, n_merges: int) -> list[tuple[bytes, bytes]]:
    """Reference BPE training: recount every pair after every merge (slow but obvious)."""
    words = Counter(gpt2_split_pattern().findall(text))
    order = list(byte_to_unicode())
    tokens = [bytes([b]) for b in order]
    seqs = [([order.index(b) for b in w.encode()], n) for w, n in words.items()]
    merges = []
    for _ in range(n_merges):
        counts = Counter()
        for seq, n in seqs:
            for p in itertools.pairwise(seq):
                counts[p] += n
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        merged_bytes = tokens[best[0]] + tokens[best[1]]
        new = tokens.index(merged_bytes) if merged_bytes in tokens else len(tokens)
        if new == len(tokens):
            tokens.append(merged_bytes)
        merges.append((tokens[best[0]], tokens[best[1]]))
        for k, (seq, n) in enumerate(seqs):
            out, i = [], 0
            while i < len(seq):
                if seq[i : i + 2] == list(best):
                    out.append(new)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[k] = (out, n)
    return merges


def test_bpe_training_matches_naive_reference():
    text = TEXT + "aaaa abab baba aaab " * 5
    tok = BPETokenizer.train(text, vocab_size=256 + 60 + 1)
    u2b = {u: b for b, u in byte_to_unicode().items()}
    got = [(bytes(u2b[c] for c in a), bytes(u2b[c] for c in b)) for a, b in tok.merges]
    assert got == naive_bpe_merges(text, len(got))


def test_bpe_training_stops_when_pairs_run_out():
    tok = BPETokenizer.train("ab ab", vocab_size=1000)
    assert tok.vocab_size < 1000 and tok.eot_token_id == tok.vocab_size - 1
    assert tok.encode("ab ab") == [tok.vocab["ab"], tok.vocab["Ġab"]]


def test_bpe_save_load_and_dict(tmp_path):
    tok = small_bpe()
    tok.save(tmp_path)
    assert (tmp_path / "merges.txt").read_text("utf-8").startswith("#version: 0.2\n")
    assert json.loads((tmp_path / "vocab.json").read_text("utf-8"))[EOT] == 399
    for other in (
        BPETokenizer.load(tmp_path),
        load_tokenizer_dir(tmp_path),
        tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))),
    ):
        assert isinstance(other, BPETokenizer)
        assert other.encode(TEXT, allowed_special="all") == tok.encode(TEXT, allowed_special="all")
        assert other.vocab_size == tok.vocab_size and other.eot_token_id == tok.eot_token_id


def test_loads_hand_made_gpt2_directory(tmp_path):
    # A tiny file pair in GPT-2's exact format: 256 byte tokens, merges by rank, EOT last.
    vocab = {u: i for i, u in enumerate(byte_to_unicode().values())}
    for i, tok in enumerate(["Ġt", "he", "Ġthe", EOT]):
        vocab[tok] = 256 + i
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), "utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t\nh e\nĠt he\n", "utf-8")
    tok = load_tokenizer_dir(tmp_path)
    assert isinstance(tok, BPETokenizer)
    assert tok.vocab_size == 260 and tok.eot_token_id == 259
    assert tok.encode(" the") == [258]
    assert tok.encode("the") == [vocab["t"], 257]
    assert tok.encode(" theme\n") == [258, vocab["m"], vocab["e"], vocab["Ċ"]]
    assert tok.encode(f"{EOT}", allowed_special="all") == [259]
    assert tok.decode([258, 259, vocab["Ċ"]]) == f" the{EOT}\n"


def test_unknown_type_and_missing_dir(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        tokenizer_from_dict({"type": "wordpiece"})
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer_dir(tmp_path)
