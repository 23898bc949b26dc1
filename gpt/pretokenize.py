"""GPT-2's pre-tokenization: the regular expression that cuts text into the pieces BPE merges
within, a faster split for text without characters beyond U+FFFF (``split_gpt2``), the same
classes for tiktoken's engine (``tiktoken_split_pattern``), and GPT-2's byte-to-character map.
gpt.tokenizer's BPE uses them; gpt.prepare cuts long texts where no piece can cross.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata

# Unicode's White_Space property. Python's `\s` also matches U+001C..U+001F (ASCII record
# separators), which GPT-2's `regex`-based pattern treats as punctuation, so we spell it out.
_WHITE_SPACE = [
    *range(0x09, 0x0E),
    0x20,
    0x85,
    0xA0,
    0x1680,
    *range(0x2000, 0x200B),
    0x2028,
    0x2029,
    0x202F,
    0x205F,
    0x3000,
]


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, in GPT-2's id order.

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68
    (control characters, space, DEL, NBSP, soft hyphen) are moved to U+0100 onwards, so the
    space byte becomes 'Ġ' and newline 'Ċ'. Iteration order = the first 256 ids of GPT-2.
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept = set(keep)
    moved = [b for b in range(256) if b not in kept]
    table = {b: chr(b) for b in keep}
    table.update({b: chr(0x100 + i) for i, b in enumerate(moved)})
    return table


def _runs(codepoints) -> list[tuple[int, int]]:
    """Sorted code points as (first, last) runs of consecutive ones."""
    cps = sorted(codepoints)
    runs, start, prev = [], cps[0], cps[0]
    for cp in [*cps[1:], -1]:
        if cp != prev + 1:
            runs.append((start, prev))
            start = cp
        prev = cp
    return runs


def _class_body(codepoints: list[int]) -> str:
    """Character-class text for code points, as `\\Uxxxxxxxx-\\Uyyyyyyyy` runs."""
    return "".join(f"\\U{a:08x}" + ("" if a == b else f"-\\U{b:08x}") for a, b in _runs(codepoints))


@functools.cache
def _unicode_classes() -> tuple[list[int], list[int]]:
    """The code points of \\p{L} (letters) and \\p{N} (numbers) in Python's `unicodedata`."""
    letters, numbers = [], []
    for cp, cat in enumerate(map(unicodedata.category, map(chr, range(0x110000)))):
        if cat[0] == "L":
            letters.append(cp)
        elif cat[0] == "N":
            numbers.append(cp)
    return letters, numbers


def _compile_split(letters: list[int], numbers: list[int]) -> re.Pattern[str]:
    L, N, S = _class_body(letters), _class_body(numbers), _class_body(_WHITE_SPACE)
    return re.compile(
        r"'s|'t|'re|'ve|'m|'ll|'d"
        rf"| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+"
        rf"|[{S}]+(?![^{S}])|[{S}]+"
    )


@functools.cache
def gpt2_split_pattern() -> re.Pattern[str]:
    """GPT-2's pre-tokenizer regex, rebuilt for the standard `re` module.

    GPT-2 splits text into contractions ('s 't 're 've 'm 'll 'd), runs of letters, runs of
    numbers and runs of other symbols (each with one optional leading space), and whitespace.
    It uses the `regex` package for \\p{L} and \\p{N}; here those classes are enumerated from
    `unicodedata` once (~0.3 s, on first use), and whitespace is Unicode's White_Space set.
    The only difference from GPT-2 is the Unicode version: characters assigned after the
    version Python's `unicodedata` knows (14.0 for Python 3.11) count as "other".
    `split_gpt2(s)` gives the same pieces as `findall(s)`, about 5x faster.
    """
    return _compile_split(*_unicode_classes())


@functools.cache
def _bmp_split_pattern() -> re.Pattern[str]:
    # The same pattern without the classes' ranges above U+FFFF: `re` tests a character of the
    # Basic Multilingual Plane against a bitmap, then against every range beyond it (hundreds),
    # so this one matches text without such characters about 5x faster, with the same pieces.
    letters, numbers = _unicode_classes()
    return _compile_split([c for c in letters if c <= 0xFFFF], [c for c in numbers if c <= 0xFFFF])


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
SURROGATE = re.compile("[\ud800-\udfff]")
_SPLIT_CHUNK = 1 << 12  # characters per part of a text with characters beyond U+FFFF


@functools.cache
def _cut_pattern() -> re.Pattern[str]:
    # A character that is not whitespace, followed by whitespace: no piece of GPT-2's pattern
    # spans that boundary (only a whitespace piece holds whitespace past its first character,
    # and it holds nothing else) and matching after it never looks back, so the text can be
    # cut there and the pieces of the parts are the pieces of the whole.
    S = _class_body(_WHITE_SPACE)
    return re.compile(f"[^{S}](?=[{S}])")


def split_gpt2(s: str, chunk: int = _SPLIT_CHUNK) -> list[str]:
    """`gpt2_split_pattern().findall(s)`, faster: text without characters beyond U+FFFF is
    split by a pattern without those ranges; other text is cut into parts of about `chunk`
    characters at boundaries no piece spans, and only the parts that hold such characters
    take the full pattern."""
    if s.isascii() or not _ASTRAL.search(s):
        return _bmp_split_pattern().findall(s)
    full, bmp, cut = gpt2_split_pattern(), _bmp_split_pattern(), _cut_pattern()
    pieces: list[str] = []
    start, n = 0, len(s)
    while start < n:
        m = cut.search(s, start + chunk) if start + chunk < n else None
        end = m.end() if m else n
        part = s[start:end]
        pieces += (full if _ASTRAL.search(part) else bmp).findall(part)
        start = end
    return pieces


def _rust_class_body(codepoints) -> str:
    """Character-class text for code points in the syntax of tiktoken's regex engine (Rust's
    `regex`, through `fancy-regex`): `\\x{61}-\\x{7A}` runs."""
    return "".join(
        f"\\x{{{a:X}}}" + ("" if a == b else f"-\\x{{{b:X}}}") for a, b in _runs(codepoints)
    )


def _every_character() -> str:
    """Every code point but the surrogates, in order."""
    return "".join(map(chr, itertools.chain(range(0xD800), range(0xE000, 0x110000))))


def _tiktoken_matches(pattern: str, text: str) -> set[int]:
    """The code points of `text` that tiktoken's regex engine matches with `pattern` (tiktoken
    drops the text between matches; with one token per byte, the rest decodes back)."""
    import tiktoken

    single_bytes = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding(
        name="probe", pat_str=pattern, mergeable_ranks=single_bytes, special_tokens={}
    )
    return set(map(ord, enc.decode_bytes(enc.encode_ordinary(text)).decode("utf-8")))


@functools.cache
def _tiktoken_classes() -> tuple[str, str, str]:
    """Letters, numbers and whitespace for tiktoken's engine, exactly `gpt2_split_pattern`'s,
    each as an item of a character class (`\\p{L}`, or a `[...]` set).

    tiktoken's engine knows a newer Unicode than Python's `unicodedata` (16.0 against 14.0 for
    tiktoken 0.14 and Python 3.11: 9,272 more letters). Its \\p{L}, \\p{N} and \\s run
    faster than the ranges spelled out, so the classes keep them and take away (or add) what
    they hold beyond (or lack against) Python's, found by asking the engine (~0.3 s, once).
    """
    every = _every_character()

    def engine_class(prop: str, ours: list[int]) -> str:
        matched, ours_set = _tiktoken_matches(prop, every), set(ours)
        extra, lacking = matched - ours_set, ours_set - matched
        cls = f"[{prop}--[{_rust_class_body(extra)}]]" if extra else prop
        return f"[{cls}{_rust_class_body(lacking)}]" if lacking else cls

    letters, numbers = _unicode_classes()
    return (
        engine_class(r"\p{L}", letters),
        engine_class(r"\p{N}", numbers),
        engine_class(r"\s", _WHITE_SPACE),
    )


@functools.cache
def tiktoken_split_pattern() -> str:
    """`gpt2_split_pattern` for tiktoken, with its classes (`_tiktoken_classes`): GPT-2's own
    pattern, where the classes are the engine's \\p{L}, \\p{N} and \\s."""
    L, N, S = _tiktoken_classes()
    return (
        r"'(?:[sdmt]|ll|ve|re)"
        rf"| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+"
        rf"|[{S}]+(?![^{S}])|[{S}]+"
    )
