"""The BPE tokenizer's two encoders give the same ids: its own Python code (always tested,
against GPT-2's encoder.py loop written out below) and tiktoken's (the `tiktoken` extra; those
tests skip, saying so, where it is not installed). Also the faster split (`split_gpt2`)."""

import functools
import itertools
import json
import pickle
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt.pretokenize as P
import gpt.tokenizer as T
from gpt.tokenizer import EOT, BPETokenizer, byte_to_unicode, gpt2_split_pattern, split_gpt2

try:
    import tiktoken
except ImportError:
    tiktoken = None

needs_tiktoken = pytest.mark.skipif(
    tiktoken is None,
    reason="tiktoken is not installed: pip install tiktoken (or pip install -e '.[tiktoken]')",
)

# Characters assigned after Unicode 14.0 (Python 3.11's unicodedata), letters in tiktoken's
# newer tables: U+105C0 (Todhri, 16.0), U+1E030 (Cyrillic modifier, 15.0), U+31350 (CJK ext H)
NEW_LETTERS = "\U000105c0\U000105c1\U0001e030\U00031350"

VARIED = [
    "Hello world, hello World. HELLO!",
    "  leading, trailing and   inner   runs of spaces   ",
    "line one\nline two\n\n\nthree\r\nfour \n five\n",
    "\t\ttabs\tand  double  spaces\u00a0nbsp \u2028 \x85 \u3000end",
    "1234567890 3.14159 2024-01-01 ½ ² ٣٤ 𝟘𝟙",
    "don't can't I'll we'd they're you've he's I'm DON'T 'tis o' the 're",
    "naïve café déjà vu — ünïcödé ÅÆØ",
    "日本語のテキスト 中文文本 한국어 텍스트",
    "emoji 🙂🙃👍🏽 👨‍👩‍👧 flags 🇫🇷🇯🇵 !!🙂?",
    f"doc one{EOT}doc two {EOT}",
    f"new letters: x{NEW_LETTERS}y {NEW_LETTERS}! ab{NEW_LETTERS}",
    "a\x1cb\x00c\x7f\x1f",
    "",
    " ",
    "\n",
]
CORPUS = "\n".join(VARIED * 4)


def reference_encode(tok: BPETokenizer, s: str) -> list[int]:
    """GPT-2's encoder.py, on token strings: split, spell bytes with byte_to_unicode, then merge
    every occurrence of the lowest-ranked pair until no pair is a merge."""
    ranks = {}
    for rank, pair in enumerate(tok.merges):
        ranks.setdefault(pair, rank)
    b2u = byte_to_unicode()
    ids = []
    for piece in gpt2_split_pattern().findall(s):
        word = [b2u[b] for b in piece.encode("utf-8", "surrogatepass")]
        while len(word) > 1:
            pairs = list(zip(word, word[1:]))
            first, second = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if (first, second) not in ranks:
                break
            new, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    new.append(first + second)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = new
        ids.extend(tok.vocab[t] for t in word)
    return ids


@functools.cache
def trained() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=700)


def handmade_gpt2(tmp_path) -> BPETokenizer:
    """A file pair in GPT-2's exact format: 256 byte tokens, merges by rank, EOT last."""
    vocab = {u: i for i, u in enumerate(byte_to_unicode().values())}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("n", "d"), ("Ġa", "nd")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab[EOT] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), "utf-8")
    lines = ["#version: 0.2", *(f"{a} {b}" for a, b in merges)]
    (tmp_path / "merges.txt").write_text("\n".join(lines) + "\n", "utf-8")
    return BPETokenizer.load(tmp_path, use_tiktoken=False)


def both(tok: BPETokenizer) -> tuple[BPETokenizer, BPETokenizer]:
    """The same vocabulary on each encoder: (Python, tiktoken)."""
    return (
        BPETokenizer(tok.vocab, tok.merges, use_tiktoken=False),
        BPETokenizer(tok.vocab, tok.merges, use_tiktoken=True),
    )


# --------------------------------------------------------------------------- split_gpt2

MIXED = st.text(
    alphabet=st.sampled_from(
        [*"ab Z'st\n\t19.!-", "é", "日", "\u00a0", "\u2028", "\x85", "\x1c", "🙂", "𝟘"]
        + ["\U00010330", NEW_LETTERS[0], "\ud800"]  # Gothic (a letter in 14.0), new, surrogate
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(MIXED, st.text()), st.integers(1, 12))
def test_split_gpt2_gives_the_patterns_pieces(s, chunk):
    # small chunks: many cuts, each between a character that is not whitespace and whitespace
    assert split_gpt2(s, chunk) == gpt2_split_pattern().findall(s)


def test_split_gpt2_on_the_varied_text():
    for chunk in (1, 7, 100, P._SPLIT_CHUNK):
        assert split_gpt2(CORPUS, chunk) == gpt2_split_pattern().findall(CORPUS)


# --------------------------------------------------------------------------- Python encoder


@settings(max_examples=200, deadline=None)
@given(st.one_of(MIXED, st.text()))
def test_python_encoder_is_gpt2s_loop(s):
    tok = BPETokenizer(trained().vocab, trained().merges, use_tiktoken=False)
    assert tok.encode_ordinary(s) == reference_encode(tok, s)


def test_python_encoder_on_the_varied_text(tmp_path):
    for base in (trained(), handmade_gpt2(tmp_path)):
        tok = BPETokenizer(base.vocab, base.merges, use_tiktoken=False)
        assert tok.backend == "python" and tok.backend_reason == "use_tiktoken=False"
        for s in [*VARIED, CORPUS]:
            assert tok.encode_ordinary(s) == reference_encode(tok, s)
            assert tok.encode_ordinary(s) == reference_encode(tok, s)  # from the cache
            ids = tok.encode(s, allowed_special="all")
            assert tok.decode(ids) == s


def test_python_encoder_with_a_full_cache(monkeypatch):
    monkeypatch.setattr(T, "_CACHE_LIMIT", 5)
    tok = BPETokenizer(trained().vocab, trained().merges, use_tiktoken=False)
    assert tok.encode_ordinary("ab ab") == reference_encode(tok, "ab ab")  # 2 pieces: cached
    assert len(tok._cache) == 2
    assert tok.encode_ordinary(CORPUS) == reference_encode(tok, CORPUS)  # 3 more, then none
    assert len(tok._cache) == 5
    assert tok.encode_ordinary(CORPUS) == reference_encode(tok, CORPUS)


def test_merges_repeated_pairs_left_to_right():
    # "aaaa" with the merge (a, a): both pairs merge in one step; "aaa" leaves the last one
    vocab = {u: i for i, u in enumerate(byte_to_unicode().values())}
    vocab["aa"], vocab["aaaa"] = 256, 257
    tok = BPETokenizer(vocab, [("a", "a"), ("aa", "aa")], use_tiktoken=False)
    assert tok.encode("aaaa") == [257] and tok.encode("aaa") == [256, vocab["a"]]
    assert tok.encode("aaaaaaa") == [257, 256, vocab["a"]] == reference_encode(tok, "aaaaaaa")
    # every (a, b) merges before the pairs that the first one makes are looked at: "abab" is
    # ab + ab though (ab, a) ranks before (a, b) (a file may order merges so; training doesn't)
    vocab = {u: i for i, u in enumerate(byte_to_unicode().values())}
    vocab["aba"], vocab["ab"] = 256, 257
    tok = BPETokenizer(vocab, [("ab", "a"), ("a", "b")], use_tiktoken=False)
    assert tok.encode("abab") == [257, 257] == reference_encode(tok, "abab")


def test_asking_for_tiktoken_without_it_says_how(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken raises ImportError
    tok = BPETokenizer(trained().vocab, trained().merges, use_tiktoken=True)
    with pytest.raises(ValueError, match=r"use_tiktoken=True, but .*pip install"):
        tok.encode("hello")
    tok = BPETokenizer(trained().vocab, trained().merges)
    assert tok.backend == "python" and "pip install" in tok.backend_reason
    assert tok.encode_ordinary(CORPUS) == reference_encode(tok, CORPUS)
    with pytest.raises(ValueError, match="use_tiktoken must be"):
        BPETokenizer(trained().vocab, trained().merges, use_tiktoken="yes")


# --------------------------------------------------------------------------- tiktoken


@needs_tiktoken
@pytest.mark.parametrize("which", ["trained", "handmade_gpt2"])
def test_tiktoken_gives_the_same_ids_and_text(which, tmp_path):
    slow, fast = both(trained() if which == "trained" else handmade_gpt2(tmp_path))
    assert fast.backend == "tiktoken" and fast.backend_reason == ""
    for s in [*VARIED, CORPUS]:
        ids = slow.encode(s)
        assert fast.encode(s) == ids
        assert fast.encode(s, allowed_special="all") == slow.encode(s, allowed_special="all")
        assert fast.decode(ids) == slow.decode(ids) == s
        assert fast._tiktoken.decode(ids) == s  # tiktoken's own decode agrees
    eot = slow.eot_token_id
    ids = [eot, *slow.encode("日本🙂"), eot]
    for cut in range(len(ids) + 1):  # a cut through a character decodes as U+FFFD either way
        assert fast._tiktoken.decode(ids[:cut]) == slow.decode(ids[:cut])


@needs_tiktoken
@settings(max_examples=200, deadline=None)
@given(st.one_of(MIXED, st.text()))
def test_tiktoken_gives_the_same_ids_on_any_text(s):
    # lone surrogates (not valid Unicode) go through the Python encoder
    slow, fast = _trained_pair()
    assert fast.encode(s, allowed_special="all") == slow.encode(s, allowed_special="all")


@functools.cache
def _trained_pair():
    return both(trained())


@needs_tiktoken
def test_tiktoken_splits_with_pythons_unicode():
    # tiktoken's \p{L} knows Unicode 16, Python 3.11's 14: the pattern given to tiktoken takes
    # the newer letters out, so they stay "other" in both encoders
    slow, fast = _trained_pair()
    text = f"ab{NEW_LETTERS}cd {NEW_LETTERS}! x{NEW_LETTERS}"
    ranks, _ = slow._tiktoken_ranks()
    naive = tiktoken.Encoding(
        name="naive",
        pat_str=r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        mergeable_ranks=ranks,
        special_tokens={},
    )
    assert naive.encode_ordinary(text) != slow.encode(text)  # the text tells them apart
    assert fast.encode(text) == slow.encode(text) == reference_encode(slow, text)


@needs_tiktoken
def test_tiktoken_classes_are_pythons():
    # each class of the pattern given to tiktoken, run by tiktoken's engine on every character
    every = P._every_character()
    letters, numbers = map(set, P._unicode_classes())
    space = set(P._WHITE_SPACE)
    L, N, S = P._tiktoken_classes()
    assert P._tiktoken_matches(f"[{L}]", every) == letters
    assert P._tiktoken_matches(f"[{N}]", every) == numbers
    assert P._tiktoken_matches(f"[{S}]", every) == space
    other = set(map(ord, every)) - letters - numbers - space
    assert P._tiktoken_matches(f"[^{S}{L}{N}]", every) == other


def _vocab(merges: list[tuple[str, str]], ids: list[int] | None = None) -> dict[str, int]:
    vocab = {u: i for i, u in enumerate(byte_to_unicode().values())}
    for k, (a, b) in enumerate(merges):
        vocab.setdefault(a + b, 256 + k if ids is None else ids[k])
    return vocab


@needs_tiktoken
def test_vocabularies_tiktoken_would_encode_otherwise_stay_in_python():
    # (a b) comes first, so "abc" is ab + c in GPT-2's loop; tiktoken would merge ab + c into
    # "abc", a token (made from a + bc), though (ab, c) is no merge
    merges = [("a", "b"), ("b", "c"), ("a", "bc")]
    tok = BPETokenizer(_vocab(merges), merges)
    assert tok.backend == "python" and "merge back" in tok.backend_reason
    ranks = {tok._id_bytes[i]: i for i in range(259)}
    raw = tiktoken.Encoding(name="raw", pat_str=r"\w+", mergeable_ranks=ranks, special_tokens={})
    v = tok.vocab
    assert raw.encode_ordinary("abc") == [v["abc"]]
    assert tok.encode("abc") == [v["ab"], v["c"]] == reference_encode(tok, "abc")
    with pytest.raises(ValueError, match="use_tiktoken=True, but .*merge back"):
        BPETokenizer(tok.vocab, merges, use_tiktoken=True).encode("abc")

    # two merges that make one token; ids not in merge order; a merge of a later token
    twice = [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]
    late = [("ab", "c"), ("a", "b")]
    for merges, ids, why in [
        (twice, None, "two merges make"),
        ([("a", "b"), ("c", "d")], [257, 256], "is made after"),
        (late, None, "joins a token made after it"),
    ]:
        tok = BPETokenizer(_vocab(merges, ids), merges)
        assert tok.backend == "python" and why in tok.backend_reason
        for s in ["abc", "abcd", "aabcbc", "cdab"]:
            assert tok.encode(s) == reference_encode(tok, s)


@st.composite
def merge_lists(draw):
    """Up to 10 merges over the bytes a b c, each joining tokens made before it."""
    tokens, merges = ["a", "b", "c"], []
    for _ in range(draw(st.integers(1, 10))):
        a, b = draw(st.sampled_from(tokens)), draw(st.sampled_from(tokens))
        if a + b not in tokens and len(a + b) <= 6:
            merges.append((a, b))
            tokens.append(a + b)
    return merges


ABC_WORDS = ["".join(w) for n in range(1, 7) for w in itertools.product("abc", repeat=n)]


@needs_tiktoken
@settings(max_examples=60, deadline=None)
@given(merge_lists())
def test_tiktoken_only_where_it_agrees_on_every_word(merges):
    # the check in `_tiktoken_ranks` against every word of up to 6 letters: where it lets
    # tiktoken run, tiktoken's ids are GPT-2's; where it does not, Python's are
    tok = BPETokenizer(_vocab(merges), merges)
    # choose now: short texts would otherwise go through Python for the first 4 M characters
    assert tok.backend in ("tiktoken", "python")
    for word in ABC_WORDS:
        assert tok.encode_ordinary(word) == reference_encode(tok, word)


@needs_tiktoken
def test_default_switches_to_tiktoken_after_enough_text(monkeypatch):
    monkeypatch.setattr(T, "_TIKTOKEN_AFTER", 100)
    slow = BPETokenizer(trained().vocab, trained().merges, use_tiktoken=False)
    tok = BPETokenizer(trained().vocab, trained().merges)
    assert tok.encode("a short prompt") == slow.encode("a short prompt")
    assert tok._backend is None  # not chosen yet: the prompt went through Python
    assert tok.encode(CORPUS) == slow.encode(CORPUS)
    assert tok._backend == "tiktoken"


@needs_tiktoken
def test_pickles_without_tiktoken_inside(monkeypatch):
    slow = _trained_pair()[0]
    tok = BPETokenizer(trained().vocab, trained().merges)
    assert tok.backend == "tiktoken"
    blob = pickle.dumps(tok)
    again = pickle.loads(blob)
    assert again.backend == "tiktoken" and again.encode(CORPUS) == slow.encode(CORPUS)
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # unpickled where it is not installed
    again = pickle.loads(blob)
    assert again.encode(CORPUS) == slow.encode(CORPUS) and again.backend == "python"
