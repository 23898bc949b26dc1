"""Tokenizers for gpt: a character-level one and a GPT-2 style byte-level BPE.

Both share one interface (`Tokenizer`): `encode(s, allowed_special=())`, `decode(ids)`,
`vocab_size`, `eot_token_id`, `to_dict()` for embedding in checkpoints and `save(dir)`.

Special tokens (only `<|endoftext|>` is used by gpt) follow tiktoken's `encode_ordinary` rule:
by default the literal text "<|endoftext|>" in the input is ordinary text and encodes as the
characters or bytes it is made of, so a prompt can never smuggle in a document boundary.
Pass `allowed_special={"<|endoftext|>"}` (or "all") to turn the literal into the special id.
`decode` of the special id gives the literal text back, so with `allowed_special="all"` the
round trip `decode(encode(s)) == s` holds either way.

The BPE tokenizer reads and writes GPT-2's `vocab.json` + `merges.txt` pair, so a real GPT-2
tokenizer directory (50257 tokens, `<|endoftext|>` = 50256) loads unchanged. It encodes in
tiktoken when that is installed (the `tiktoken` extra), with the same ids as its own Python
code (`BPETokenizer.backend` says which runs; benchmarks/tokenizer.py measures both).
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import re
import stat
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from .pretokenize import (  # (gpt2_split_pattern: the pattern itself, named here too)
    SURROGATE,
    byte_to_unicode,
    gpt2_split_pattern,  # noqa: F401
    split_gpt2,
    tiktoken_split_pattern,
)
from .store.checkpoint import atomic_write_bytes as atomic_write

EOT = "<|endoftext|>"
UNK = "<|unk|>"


MAX_TOKEN_ID = 1 << 24  # far above any real vocabulary; bounds what a vocab.json can allocate
MAX_FILE_BYTES = 64 << 20  # GPT-2's vocab.json is 1 MB; bounds what a tokenizer file may hold


def _q(v) -> str:
    """A value from a file or a caller, quoted for a message and cut to about 80 characters."""
    r = repr(v)
    return r if len(r) <= 80 else f"{r[:60]}... ({len(r):,} characters)"


def read_text(path: str | os.PathLike) -> str:
    """A tokenizer file's UTF-8 text: a regular file (not a FIFO or device) of at most
    MAX_FILE_BYTES, refused with one ValueError line otherwise (OSError if unreadable)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path} is {st.st_size:,} bytes, more than {MAX_FILE_BYTES:,}")
        data = f.read(MAX_FILE_BYTES + 1)  # the file may grow after the check
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is more than {MAX_FILE_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_json(path: str | os.PathLike):
    """A tokenizer JSON file (see read_text); bad or too deeply nested JSON is a ValueError."""
    text = read_text(path)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be a tokenizer file") from None
    except ValueError as e:  # JSONDecodeError, or an integer of thousands of digits
        raise ValueError(f"{path} is not valid JSON ({e})") from None


class Tokenizer:
    """What gpt needs from a tokenizer. Subclasses implement `encode_ordinary` and `decode`."""

    kind: str = ""
    special_tokens: dict[str, int]

    def encode_ordinary(self, s: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    def save(self, directory: str | os.PathLike) -> None:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def eot_token_id(self) -> int:
        """Id of `<|endoftext|>`, the separator between packed documents."""
        if EOT not in self.special_tokens:
            raise ValueError(f"this {self.kind} tokenizer has no {EOT} token")
        return self.special_tokens[EOT]

    def encode(self, s: str, allowed_special: str | Iterable[str] = ()) -> list[int]:
        """Token ids of `s`. Literal special-token text becomes the special id only if allowed.

        `allowed_special` is "all" or a collection of special-token strings; the default treats
        every special token's text as ordinary text.
        """
        if allowed_special == "all":
            allowed = self.special_tokens
        else:
            allowed = {}
            for tok in allowed_special:
                if tok not in self.special_tokens:
                    raise ValueError(f"{_q(tok)} is not a special token of this tokenizer")
                allowed[tok] = self.special_tokens[tok]
        if not allowed:
            return self.encode_ordinary(s)
        # Longest first so that one special token that is a prefix of another never wins.
        alternatives = "|".join(re.escape(t) for t in sorted(allowed, key=len, reverse=True))
        ids: list[int] = []
        # With a capturing group, re.split puts the matched specials at the odd positions.
        for i, part in enumerate(re.split(f"({alternatives})", s)):
            if i % 2:
                ids.append(allowed[part])
            elif part:
                ids.extend(self.encode_ordinary(part))
        return ids


def _check_ids(ids: Sequence[int], table: Sequence) -> None:
    if len(ids) and (min(ids) < 0 or max(ids) >= len(table)):
        bad = next(i for i in ids if not 0 <= i < len(table))
        raise ValueError(f"token id {bad} is outside the vocabulary (size {len(table)})")


class CharTokenizer(Tokenizer):
    """One token per character of the training corpus.

    Ids: 0 = `<|unk|>` (any character not seen in training; it decodes to U+FFFD, the Unicode
    replacement character), 1 = `<|endoftext|>` (decodes to the literal text "<|endoftext|>"),
    and from 2 on the corpus characters in sorted (code point) order.
    """

    kind = "char"
    unk_token_id = 0

    def __init__(self, chars: Iterable[str]):
        chars = sorted(set(chars))
        if any(len(c) != 1 for c in chars):
            raise ValueError("a CharTokenizer vocabulary holds single characters only")
        self.chars = chars
        self.special_tokens = {EOT: 1}
        self._stoi = {c: i for i, c in enumerate(chars, start=2)}
        self._itos = ["\ufffd", EOT, *chars]

    @classmethod
    def train(cls, texts: str | Iterable[str]) -> CharTokenizer:
        """Vocabulary = every character that occurs in `texts` (one string or several)."""
        seen: set[str] = set()
        for text in [texts] if isinstance(texts, str) else texts:
            seen.update(text)
        return cls(seen)

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def encode_ordinary(self, s: str) -> list[int]:
        get = self._stoi.get
        return [get(c, 0) for c in s]

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        _check_ids(ids, self._itos)
        itos = self._itos
        return "".join([itos[i] for i in ids])

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        if d.get("type") != "char":
            raise ValueError(f"not a char tokenizer dict (type={_q(d.get('type'))})")
        if not isinstance(d.get("chars"), str):
            raise ValueError("a char tokenizer's 'chars' must be a string")  # noqa: TRY004 (callers catch ValueError)
        return cls(d["chars"])

    def save(self, directory: str | os.PathLike) -> None:
        """Write `tokenizer.json` into `directory` (created if missing)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # ensure_ascii keeps any odd character (even a lone surrogate) representable in JSON.
        atomic_write(directory / "tokenizer.json", json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CharTokenizer:
        return cls.from_dict(read_json(Path(directory, "tokenizer.json")))

    def to_hf_json(self) -> dict:
        """This vocabulary as a Hugging Face `tokenizers` tokenizer.json: a WordLevel model over
        single characters (the pre-tokenizer isolates each one), `<|unk|>` for the rest, and a
        decoder that joins tokens without spaces. It encodes to the same ids as `encode(s,
        allowed_special="all")`, except that the literal text "<|unk|>" is also special there."""
        vocab = {UNK: 0, EOT: 1, **self._stoi}
        added = [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False}
            | {"normalized": False, "special": True}
            for t, i in ((UNK, 0), (EOT, 1))
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Split",
                "pattern": {"Regex": "[\\s\\S]"},  # every character on its own
                "behavior": "Isolated",
                "invert": False,
            },
            "post_processor": None,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK},
        }

    @classmethod
    def from_hf_json(cls, d: dict) -> CharTokenizer:
        """The inverse of `to_hf_json`; anything else is refused with one line."""
        model = d.get("model") if isinstance(d, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if not isinstance(vocab, dict) or model.get("type") != "WordLevel":
            kind = model.get("type") if isinstance(model, dict) else None
            raise ValueError(
                f"tokenizer.json holds a Hugging Face {str(kind)[:40]} tokenizer; gpt reads GPT-2's "
                "vocab.json + merges.txt, or the character-level tokenizer.json gpt-export writes"
            )
        chars = sorted((i, t) for t, i in vocab.items() if t not in (UNK, EOT))
        ok = (
            vocab.get(UNK) == 0
            and vocab.get(EOT) == 1
            and all(isinstance(t, str) and len(t) == 1 for _, t in chars)
            and [i for i, _ in chars] == list(range(2, len(chars) + 2))
            and [t for _, t in chars] == sorted(t for _, t in chars)
        )
        if not ok:
            raise ValueError(
                "tokenizer.json is a WordLevel tokenizer but not a gpt character tokenizer "
                f"({UNK} = 0, {EOT} = 1, then single characters in sorted order)"
            )
        return cls(t for _, t in chars)


# --------------------------------------------------------------------------- byte-level BPE


def _learn_merges(
    word_counts: dict[str, int], n_tokens: int
) -> tuple[list[bytes], list[tuple[int, int]]]:
    """BPE training: merge the most frequent adjacent pair until there are `n_tokens` tokens.

    Works on unique pre-tokens with their counts, keeps a count per pair and, per pair, the
    words it occurs in, so a merge only revisits those words. A max-heap of (count, pair) with
    lazy deletion finds the best pair; ties go to the smallest (left id, right id).
    Returns each token's bytes (ids 0..255 are the bytes in GPT-2 order) and the merges in order.
    """
    order = list(byte_to_unicode())
    token_bytes = [bytes([b]) for b in order]
    byte_id = {b: i for i, b in enumerate(order)}
    token_of_bytes = {t: i for i, t in enumerate(token_bytes)}

    words = [[byte_id[b] for b in w.encode("utf-8", "surrogatepass")] for w in word_counts]
    freqs = list(word_counts.values())
    pair_count: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for p in itertools.pairwise(w):
            pair_count[p] += f
            where[p].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    merges: list[tuple[int, int]] = []
    done: set[tuple[int, int]] = set()
    while len(token_bytes) < n_tokens and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg:
            continue  # stale entry: the pair's count changed and was pushed again
        a, b = pair
        new_bytes = token_bytes[a] + token_bytes[b]
        # Two different splits can spell the same bytes ("ab"+"c", "a"+"bc"): reuse the token.
        new = token_of_bytes.get(new_bytes)
        if new is None:
            new = token_of_bytes[new_bytes] = len(token_bytes)
            token_bytes.append(new_bytes)
        if pair not in done:
            done.add(pair)
            merges.append(pair)

        delta: dict[tuple[int, int], int] = defaultdict(int)
        for wi in where.pop(pair):
            w = words[wi]
            merged, i, n = [], 0, len(w)
            while i < n:
                if i + 1 < n and w[i] == a and w[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            if len(merged) == n:
                continue  # the index is lazy: this word lost the pair in an earlier merge
            f = freqs[wi]
            for p in itertools.pairwise(w):
                delta[p] -= f
            for p in itertools.pairwise(merged):
                delta[p] += f
                where[p].add(wi)
            words[wi] = merged
        for p, d in delta.items():
            if d:
                c = pair_count[p] + d
                if c > 0:
                    pair_count[p] = c
                    heapq.heappush(heap, (-c, p))
                else:
                    del pair_count[p]
    return token_bytes, merges


_NO_MERGE = (float("inf"), -1, -1, -1)
_NO_MERGES = itertools.repeat(_NO_MERGE)  # the default of every rank lookup in `_bpe`
_CACHE_LIMIT = 200_000
_TIKTOKEN_AFTER = 4 << 20  # characters encoded in Python before tiktoken is set up
TIKTOKEN_INSTALL = "pip install tiktoken (or, in a checkout, pip install -e '.[tiktoken]')"


class BPETokenizer(Tokenizer):
    """Byte-level BPE in GPT-2's format.

    Text is split by `gpt2_split_pattern`, each piece is UTF-8 encoded and its bytes are merged
    by rank (lowest first) as in GPT-2. Tokens are held as bytes; `vocab`'s keys spell them with
    `byte_to_unicode`. A vocab entry that is neither a byte nor made by a merge is a special
    token (`<|endoftext|>` in GPT-2), whose bytes are its literal UTF-8 text. Strings with lone
    surrogates (not valid Unicode) still encode, via their 'surrogatepass' bytes; decoding uses
    errors='replace', so those and any id sequence that cuts a character in half give U+FFFD.

    Encoding runs in tiktoken (Rust) when it is installed (`pip install tiktoken`, or the
    `tiktoken` extra) and the vocabulary is one whose merges tiktoken reproduces (checked, see
    `_tiktoken_ranks`), else in Python; the ids are the same either way. By default texts
    go through Python until tiktoken pays for its set-up (about 1 s, once 4 M characters
    would have gone through Python), and text with lone surrogates always does.
    `use_tiktoken=False` keeps Python, True sets tiktoken up on first use or says why it
    cannot; `backend` says which one runs (asking sets it up) and `backend_reason` why not
    tiktoken.
    """

    kind = "bpe"

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        use_tiktoken: bool | None = None,
    ):
        # vocab.json is untrusted input: ids as strings or huge ids would fail obscurely below
        if not isinstance(vocab, dict) or not all(
            isinstance(t, str) and type(i) is int and 0 <= i < MAX_TOKEN_ID
            for t, i in vocab.items()
        ):
            raise ValueError(
                f"vocab must map token strings to integer ids in 0..{MAX_TOKEN_ID - 1}"
            )
        if len(set(vocab.values())) != len(vocab):
            raise ValueError("vocab maps two tokens to the same id")
        b2u = byte_to_unicode()
        u2b = {u: b for b, u in b2u.items()}
        self._byte_ids = [0] * 256
        for b, u in b2u.items():
            if u not in vocab:
                raise ValueError(f"vocab lacks the token for byte {b} ({u!r})")
            self._byte_ids[b] = vocab[u]
        # (left id, right id) -> (rank, merged id, left id, right id): `_bpe` takes the min
        self._ranks: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        made = set(b2u.values())
        for rank, (a, b) in enumerate(merges):
            missing = [t for t in (a, b, a + b) if t not in vocab]
            if missing:
                raise ValueError(
                    f"merge {rank} ({_q(a)} {_q(b)}) needs {_q(missing[0])}, not in vocab"
                )
            # A repeated merge keeps its first (highest priority) rank, as GPT-2's dict does.
            ia, ib = vocab[a], vocab[b]
            self._ranks.setdefault((ia, ib), (rank, vocab[a + b], ia, ib))
            made.add(a + b)
        self.vocab = dict(vocab)
        self.merges = [(a, b) for a, b in merges]
        self.special_tokens = {t: i for t, i in vocab.items() if t not in made}
        self._id_bytes: list[bytes | None] = [None] * (max(vocab.values()) + 1)
        for t, i in vocab.items():
            special = t in self.special_tokens
            self._id_bytes[i] = t.encode("utf-8") if special else bytes(u2b[c] for c in t)
        self._cache: dict[str, list[int]] = {}
        if use_tiktoken not in (None, True, False):
            raise ValueError(f"use_tiktoken must be None, True or False, not {_q(use_tiktoken)}")
        self._use_tiktoken = use_tiktoken
        self._tiktoken = None  # the tiktoken.Encoding, once `backend` has chosen it
        self._backend: str | None = None  # "tiktoken" or "python", once chosen
        self._backend_reason = ""  # why Python runs, when it does
        self._python_chars = 0  # encoded in Python before choosing (see `encode_ordinary`)

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int,
        special_tokens: Sequence[str] = (EOT,),
    ) -> BPETokenizer:
        """Learn merges on `texts` until the vocabulary, specials included, has `vocab_size` ids.

        Ids: 0..255 the bytes (GPT-2 order), then one per merge, then the special tokens (so
        `<|endoftext|>` is the last id, as 50256 is in GPT-2). Special-token text in `texts` is
        a boundary and is not learned from. If the text runs out of pairs first, the vocabulary
        is smaller than asked for.
        """
        n_tokens = vocab_size - len(special_tokens)
        if n_tokens < 256:
            raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256 byte tokens")
        splitter = re.compile("|".join(map(re.escape, special_tokens))) if special_tokens else None
        counts: Counter[str] = Counter()
        for text in [texts] if isinstance(texts, str) else texts:
            for chunk in splitter.split(text) if splitter else [text]:
                counts.update(split_gpt2(chunk))
        token_bytes, merge_ids = _learn_merges(counts, n_tokens)

        b2u = byte_to_unicode()
        names = ["".join(b2u[b] for b in t) for t in token_bytes]
        vocab = {name: i for i, name in enumerate(names)}
        for tok in special_tokens:
            vocab[tok] = len(vocab)
        return cls(vocab, [(names[a], names[b]) for a, b in merge_ids])

    @property
    def vocab_size(self) -> int:
        return len(self._id_bytes)

    def _bpe(self, piece: bytes) -> list[int]:
        """GPT-2's merge loop on one piece's bytes: merge every occurrence, left to right, of
        the adjacent pair with the lowest merge rank until no adjacent pair is a merge."""
        byte_ids = self._byte_ids
        ids = [byte_ids[b] for b in piece]
        get = self._ranks.get
        while len(ids) > 1:
            pairs = list(zip(ids, ids[1:]))
            _rank, new, a, b = min(map(get, pairs, _NO_MERGES))
            if new < 0:
                break
            if pairs.count((a, b)) == 1:  # the usual case
                i = pairs.index((a, b))
                ids[i : i + 2] = (new,)
                continue
            merged, i, n = [], 0, len(ids)
            while i < n:
                if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        return ids

    @property
    def backend(self) -> str:
        """Which code encodes: "tiktoken" or "python" (see the class doc; asking chooses)."""
        if self._backend is None:
            self._choose_backend()
        return self._backend

    @property
    def backend_reason(self) -> str:
        """Why `backend` is "python" (empty when it is "tiktoken")."""
        return "" if self.backend == "tiktoken" else self._backend_reason

    def _choose_backend(self) -> None:
        note = ""
        if self._use_tiktoken is False:
            note = "use_tiktoken=False"
        else:
            try:
                import tiktoken
            except ImportError:
                note = f"tiktoken is not installed: {TIKTOKEN_INSTALL}"
            else:
                ranks, note = self._tiktoken_ranks()
                if ranks is not None:
                    self._tiktoken = tiktoken.Encoding(
                        name=f"gpt-bpe-{self.vocab_size}",
                        pat_str=tiktoken_split_pattern(),
                        mergeable_ranks=ranks,
                        # only for tiktoken's own decode: `encode` splits them off before
                        special_tokens=dict(self.special_tokens),
                    )
            if self._tiktoken is None and self._use_tiktoken:
                raise ValueError(f"use_tiktoken=True, but {note}")
        self._backend = "python" if self._tiktoken is None else "tiktoken"
        self._backend_reason = note

    def _tiktoken_ranks(self) -> tuple[dict[bytes, int] | None, str]:
        """tiktoken's `mergeable_ranks` (token bytes -> id) for this vocabulary, or None and why
        not. tiktoken merges, among adjacent parts whose concatenation is a token, the one with
        the lowest id; GPT-2 (`_bpe`) merges the adjacent pair with the lowest merge rank. They
        agree when each merge makes a new token, ids grow with merge order, each merge joins
        tokens made before it, and every token's own bytes merge back into that token (then no
        pair of parts that is not a merge can ever be adjacent and spell a token: the bytes of
        that token would merge as those parts do and stop there). Vocabularies that `train`
        makes hold all four unless it made a token twice, from two different pairs; tiktoken's
        own GPT-2 encoding relies on GPT-2's holding them (the real files are not checked
        here: the tests cannot download them)."""
        made = set(self._byte_ids)
        last = -1
        for _rank, new, a, b in sorted(self._ranks.values()):
            if new in made:
                return None, f"two merges make token {new}"
            if new < last:
                return None, f"token {new} is made after token {last}, a higher id"
            if a not in made or b not in made:
                return None, f"the merge that makes token {new} joins a token made after it"
            made.add(new)
            last = new
        table = self._id_bytes
        for _rank, new, _a, _b in self._ranks.values():
            if self._bpe(table[new]) != [new]:
                return None, f"token {new}'s own bytes do not merge back into it"
        return {table[i]: i for i in made}, ""

    def encode_ordinary(self, s: str) -> list[int]:
        if self._backend is None:
            # Setting tiktoken up costs about a second (`_tiktoken_ranks` runs every token's
            # bytes through `_bpe`, `tiktoken_split_pattern` probes the engine), what Python
            # takes for about 4 MB: prompts and small corpora encode in Python, and a text
            # that would take Python past 4 M characters sets tiktoken up first.
            if self._use_tiktoken is None and self._python_chars + len(s) <= _TIKTOKEN_AFTER:
                self._python_chars += len(s)
                return self._encode_python(s)
            self._choose_backend()
        # tiktoken takes valid Unicode only (it would turn lone surrogates into U+FFFD)
        if self._tiktoken is not None and (s.isascii() or not SURROGATE.search(s)):
            return self._tiktoken.encode_ordinary(s)
        return self._encode_python(s)

    def _encode_python(self, s: str) -> list[int]:
        out: list[int] = []
        extend = out.extend
        cache = self._cache
        get = cache.get
        for piece in split_gpt2(s):
            ids = get(piece)
            if ids is None:
                ids = self._bpe(piece.encode("utf-8", "surrogatepass"))
                if len(cache) < _CACHE_LIMIT:
                    cache[piece] = ids
            extend(ids)
        return out

    def __getstate__(self) -> dict:
        # Without the tiktoken.Encoding: the copy chooses again where it is unpickled, so it
        # loads (and runs in Python) where tiktoken is not installed.
        return {**self.__dict__, "_tiktoken": None, "_backend": None}

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        _check_ids(ids, self._id_bytes)
        table = self._id_bytes
        parts = [table[i] for i in ids]
        if None in parts:
            raise ValueError(f"token id {ids[parts.index(None)]} is not in the vocabulary")
        return b"".join(parts).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        """JSON-able dict: the vocab (token -> id) and the merges as "a b" lines."""
        return {"type": "bpe", "vocab": self.vocab, "merges": [f"{a} {b}" for a, b in self.merges]}

    @classmethod
    def from_dict(cls, d: dict) -> BPETokenizer:
        if d.get("type") != "bpe":
            raise ValueError(f"not a bpe tokenizer dict (type={_q(d.get('type'))})")
        if not isinstance(d.get("merges"), list):
            raise ValueError("a bpe tokenizer's 'merges' must be a list of strings")  # noqa: TRY004 (callers catch ValueError)
        return cls(d.get("vocab"), [_split_merge(m) for m in d["merges"]])

    def save(self, directory: str | os.PathLike) -> None:
        """Write GPT-2's `vocab.json` (token -> id) and `merges.txt` into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab = dict(sorted(self.vocab.items(), key=lambda kv: kv[1]))
        atomic_write(directory / "vocab.json", json.dumps(vocab, ensure_ascii=False) + "\n")
        lines = ["#version: 0.2", *(f"{a} {b}" for a, b in self.merges)]
        atomic_write(directory / "merges.txt", "\n".join(lines) + "\n")

    @classmethod
    def load(
        cls, directory: str | os.PathLike, *, use_tiktoken: bool | None = None
    ) -> BPETokenizer:
        """Read `vocab.json` + `merges.txt` (ours or a real GPT-2 tokenizer directory)."""
        directory = Path(directory)
        vocab = read_json(directory / "vocab.json")
        # Split on "\n" only: str.splitlines would also break on U+0085 and friends.
        lines = read_text(directory / "merges.txt").split("\n")
        merges = [
            _split_merge(line.rstrip("\r"))
            for line in lines
            if line.strip() and not line.startswith("#version")
        ]
        return cls(vocab, merges, use_tiktoken=use_tiktoken)


def _split_merge(line: str) -> tuple[str, str]:
    # Byte-level tokens never hold a real space (the space byte is spelled 'Ġ').
    if not isinstance(line, str):
        raise ValueError(f"bad merge {_q(line)}: expected a string 'a b'")  # noqa: TRY004 (callers catch ValueError)
    parts = line.split(" ")
    if len(parts) != 2:
        raise ValueError(f"bad merge line {_q(line)}: expected two tokens separated by one space")
    return parts[0], parts[1]


_TYPES: dict[str, type[CharTokenizer | BPETokenizer]] = {
    "char": CharTokenizer,
    "bpe": BPETokenizer,
}


def tokenizer_from_dict(d: dict) -> Tokenizer:
    """Rebuild a tokenizer from its `to_dict()` form, dispatching on d['type'] ('char'|'bpe')."""
    if not isinstance(d, dict):
        raise ValueError(f"a tokenizer must be a JSON object, got {type(d).__name__}")  # noqa: TRY004 (callers catch ValueError)
    kind = d.get("type")
    if kind not in _TYPES:
        raise ValueError(f"unknown tokenizer type {_q(kind)}; expected one of {sorted(_TYPES)}")
    return _TYPES[kind].from_dict(d)


load_tokenizer = tokenizer_from_dict  # the name some callers use


def load_tokenizer_dir(path: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer saved in `path`: `vocab.json`+`merges.txt` (bpe) or `tokenizer.json`
    (char: ours, or the `tokenizers` form `CharTokenizer.to_hf_json` writes)."""
    path = Path(path)
    # GPT-2's pair first: a hub repo such as gpt2 also has a Hugging Face tokenizer.json
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return BPETokenizer.load(path)
    if (path / "tokenizer.json").is_file():
        d = read_json(path / "tokenizer.json")
        if isinstance(d, dict) and "model" in d:  # the `tokenizers` format (gpt-export's)
            return CharTokenizer.from_hf_json(d)
        return tokenizer_from_dict(d)
    raise FileNotFoundError(
        f"no tokenizer in {path}: expected tokenizer.json (char) or vocab.json + merges.txt (bpe)"
    )
