"""Preparing text as a stream: memory bounded by fixed buffers, whatever the corpus's size.

`prepare` (also `gpt.data.prepare`) streams. Text is read in blocks of READ_BYTES and never held
whole (neither a document nor the token stream); the prepared files are byte for byte what
tokenizing each whole document in memory gave. The passes over the text:

1. hash: `source_hash`, sha256 over the names and texts, length-prefixed as it always was (a
   file's length in UTF-8 bytes comes from the pass of `read_text_path` that checked it, or
   is measured again if the file changed since). A folder prepared from the same inputs is
   reused here, before anything is trained or tokenized.
2. train the tokenizer: char, every character seen; bpe, the counts of its pre-tokens over all
   the text up to BPE_TRAIN_BYTES (as before), above that over BPE_SAMPLE_WINDOWS windows of
   the corpus spread evenly over it (whole pre-tokens only), so its memory and time are bounded.
3. tokenize and write: chunks of about CHUNK_CHARS characters, cut only where the tokenizer's
   pre-tokenization cannot cross (see `_bpe_cut`), are encoded by a pool of processes in order
   (one process for a small corpus, a single core, or the char tokenizer, whose table lookup
   costs less than sending the text to another process). Each document's tokens are held up
   to SPILL_BYTES and then spill into a temporary file until its end gives the train/val cut.
   train.bin and val.bin are written as hidden `.partial` files and renamed at the end;
   meta.json, the "ready" marker, is removed before the renames and written last, atomically.
   A process killed at any point leaves no meta.json that describes other files: prepare again
   (a restart; partial files of dead processes are removed).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from .store.checkpoint import atomic_write_bytes as atomic_write
from .store.lock import pid_alive
from .textfiles import DataError, as_source, hash_sources
from .tokenizer import EOT, BPETokenizer, CharTokenizer, Tokenizer

DEFAULT_BPE_VOCAB_SIZE = 4096
TOKENIZER_FILES = {"char": ("tokenizer.json",), "bpe": ("vocab.json", "merges.txt")}
CHUNK_CHARS = 1 << 20  # characters handed to the tokenizer at a time (about)
SPILL_BYTES = 16 << 20  # one document's tokens held in memory before they go to a file
BPE_TRAIN_BYTES = 64 << 20  # bpe trains on all the text up to this many UTF-8 bytes
BPE_SAMPLE_WINDOWS = 64  # ... and above it on this many windows of the corpus
BPE_SAMPLE_WINDOW_BYTES = 1 << 20  # of this size each
POOL_MIN_BYTES = 8 << 20  # a smaller corpus is tokenized in this process
MAX_WORKERS = 16

_PARTIAL = re.compile(r"\.(train\.bin|val\.bin|spill|text\.txt)\.(\d+)\.partial")  # (+ hfdata's)


# --------------------------------------------------------------------------- chunk boundaries

# GPT-2's pre-tokenizer (gpt.tokenizer.gpt2_split_pattern) splits text into contractions,
# runs of letters, of numbers and of other symbols (each with one optional leading space) and
# runs of whitespace. A position i with a non-whitespace character before it and a whitespace
# one at it is a boundary no match crosses: a match holding text[i-1] can hold whitespace only
# as its first character, and every match at i or before reads text[i] only to stop there, as
# it stops at the end of a string, so `findall(text) == findall(text[:i]) + findall(text[i:])`.
# (Cutting after a newline is not enough: "a \n" + "b" gives " \n" where the whole has " ", "\n".)
# `\S` is Python's non-whitespace, a subset of the pattern's (which lacks U+001C..U+001F).
_WS_CUT = re.compile(r"\S[\t\n ]")


def _last_ws_cut(s: str, end: int) -> int | None:
    """The largest i <= end with s[i-1] not whitespace and s[i] a tab, newline or space."""
    span = 256
    while True:
        start = max(0, end - span)
        last = None
        for last in _WS_CUT.finditer(s, start, end + 1):  # noqa: B007 (the last one is kept)
            pass
        if last is not None:
            return last.start() + 1
        if start == 0:
            return None
        span *= 8


def _ws_cut(s: str, target: int) -> int | None:
    """A whitespace cut in s (1 <= i < len(s)): the last at or before target, else the first
    after it; None if there is none."""
    i = _last_ws_cut(s, min(target, len(s) - 1))
    if i is None:
        m = _WS_CUT.search(s, max(target, 0))
        i = m.start() + 1 if m else None
    return i


def _class_cut_ok(a: str, b: str) -> bool:
    # Between a letter and a non-letter (neither whitespace) the letter run ends, unless the
    # non-letter before is the apostrophe of a contraction ('s 't 're 've 'm 'll 'd).
    # str.isalpha is the pattern's \p{L} (Unicode category L*).
    if a.isspace() or b.isspace():
        return False
    la, lb = a.isalpha(), b.isalpha()
    return la != lb and a != "'"


def _bpe_cut(s: str, target: int) -> int | None:
    """Where a BPE chunk may end: a whitespace cut, else (text without whitespace) the edge of
    a run of letters; None when neither is in s (the text is then held until one comes)."""
    i = _ws_cut(s, target)
    if i is not None:
        return i
    target = max(1, min(target, len(s) - 1))
    for i in (*range(target, 0, -1), *range(target + 1, len(s))):
        if _class_cut_ok(s[i - 1], s[i]):
            return i
    return None


def rechunk(pieces: Iterable[str], size: int, cut) -> Iterator[str]:
    """The text of `pieces` again, in chunks of about `size` characters that end where
    `cut(s, target)` allows (see `_bpe_cut`). Only new text is searched for a cut, so text
    without one is gathered (and held) until one comes, in linear time."""
    parts: list[str] = []
    n = 0
    for p in pieces:
        while p:
            if n + len(p) <= size:
                parts.append(p)
                n += len(p)
                break
            ctx = parts[-1][-1] if parts else ""  # a cut at the seam needs the char before
            i = cut(ctx + p, size - n + len(ctx))
            if i is None:
                parts.append(p)
                n += len(p)
                break
            k = i - len(ctx)
            if k:
                parts.append(p[:k])
            yield "".join(parts)
            parts, n, p = [], 0, p[k:]
    if parts:
        yield "".join(parts)


# --------------------------------------------------------------------------- training


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def train_char(sources: Sequence) -> CharTokenizer:
    """CharTokenizer.train over the sources' text, in one streaming pass."""
    seen = np.zeros(0x110000, dtype=bool)
    for s in sources:
        for piece in s.pieces():
            seen[_codepoints(piece)] = True
    return CharTokenizer(map(chr, np.flatnonzero(seen).tolist()))


def _sample(sources: Sequence) -> Iterator[str]:
    """BPE_SAMPLE_WINDOWS windows of about BPE_SAMPLE_WINDOW_BYTES, evenly spread over the
    corpus (by file size), each trimmed to whitespace cuts so that it holds whole pre-tokens."""
    sizes = [s.size for s in sources]
    total, k = sum(sizes), BPE_SAMPLE_WINDOWS
    starts = deque(j * total // k for j in range(k))
    base = 0
    for s, size in zip(sources, sizes):
        while starts and starts[0] < base + size:
            text, at_start, at_end = s.window(starts.popleft() - base, BPE_SAMPLE_WINDOW_BYTES)
            if not at_start:
                m = _WS_CUT.search(text)
                text = text[m.start() + 1 :] if m else ""
            if not at_end and text:
                i = _last_ws_cut(text, len(text) - 1)
                text = text[:i] if i else ""
            if text:
                yield text
        base += size


def train_bpe(sources: Sequence, nbytes: int, vocab_size: int) -> BPETokenizer:
    """BPETokenizer.train on all the text (chunks cut at whitespace, which no pre-token and no
    <|endoftext|> crosses: the same counts), or on a sample above BPE_TRAIN_BYTES."""
    assert not any(c.isspace() for c in EOT)  # the special token train() splits on
    if nbytes <= BPE_TRAIN_BYTES:
        texts = (c for s in sources for c in rechunk(s.pieces(), CHUNK_CHARS, _ws_cut))
    else:
        texts = _sample(sources)
    return BPETokenizer.train(texts, vocab_size)


# --------------------------------------------------------------------------- tokenizing


class Encoder:
    """A chunk of text to token ids (numpy, `dtype`) as `tok.encode` gives them; the char
    tokenizer through a table indexed by code point (the same ids, checked on its vocabulary)."""

    def __init__(self, tok: Tokenizer, dtype: np.dtype):
        self.tok, self.dtype, self.table = tok, np.dtype(dtype), None
        if type(tok) is CharTokenizer:
            chars = tok.chars
            ids = tok.encode("".join(chars))
            known = set(chars)
            unseen = next(chr(c) for c in range(len(chars) + 1) if chr(c) not in known)
            unk = tok.encode(unseen)
            if len(ids) == len(chars) and len(unk) == 1:
                table = np.full(0x110000, unk[0], dtype=self.dtype)
                table[[ord(c) for c in chars]] = ids
                self.table, self.tok = table, None

    def __call__(self, text: str) -> np.ndarray:
        if self.table is not None:
            return self.table.take(_codepoints(text))
        return np.array(self.tok.encode(text), dtype=self.dtype)

    def chunks(self, pieces: Iterator[str]) -> Iterator[str]:
        """A document's text (its pieces) in the chunks this tokenizer may take one at a time."""
        if self.table is not None:  # a character is a token
            return pieces
        if isinstance(self.tok, BPETokenizer):
            return rechunk(pieces, CHUNK_CHARS, _bpe_cut)
        text = "".join(pieces)  # another tokenizer: whole documents
        return iter([text] if text else [])


_WORKER: Encoder | None = None


def _init_worker(encoder: Encoder) -> None:
    global _WORKER
    _WORKER = encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    parent = os.getppid()

    def watch() -> None:  # a parent killed (SIGKILL) leaves its workers waiting: they go too
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _encode_in_worker(text: str) -> np.ndarray:
    return _WORKER(text)


def _can_fork() -> bool:
    # fork shares the loaded modules and the tokenizer at no cost; it is safe on Linux while no
    # other thread runs (tqdm's monitor aside: the workers never use tqdm), and not after MPI
    # has started (under mpiexec the ranks use the cores)
    monitor = getattr(sys.modules.get("tqdm._monitor"), "TMonitor", ())
    others = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not isinstance(t, monitor)
    ]
    return (
        sys.platform.startswith("linux")
        and "fork" in multiprocessing.get_all_start_methods()
        and not others
        and "mpi4py.MPI" not in sys.modules
    )


def n_workers(nbytes: int, workers: int | None = None, cheap: bool = False) -> int:
    """Processes to tokenize with: every core; one for a small corpus, a single core, a cheap
    encoder (the char table: shipping text to another process costs more than looking it up),
    or where forking is not safe (see _can_fork)."""
    if workers is None:
        if nbytes < POOL_MIN_BYTES or cheap:
            return 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        workers = min(cores or os.cpu_count() or 1, MAX_WORKERS)
    return max(1, int(workers)) if _can_fork() else 1


def _pool(n: int, encoder: Encoder) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        n,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_init_worker,
        initargs=(encoder,),
    )


class _Writer:
    """Appends each document's tokens to hidden partial train/val files: its tokens are held
    (up to SPILL_BYTES, then in a spill file) until its end gives the cut."""

    def __init__(self, out: Path, dtype: np.dtype, eot: int, val_fraction: float):
        pid = os.getpid()
        self.dtype, self.val_fraction = dtype, val_fraction
        self.eot = np.array([eot], dtype=dtype)
        self.paths = {s: out / f".{s}.bin.{pid}.partial" for s in ("train", "val")}
        self.spill_path = out / f".spill.{pid}.partial"
        self.files = {}
        self.spill = None
        self.counts = {"train": 0, "val": 0}
        self.parts: list[np.ndarray] = []
        self.n = self.held = 0

    def open(self) -> None:
        for s, p in self.paths.items():
            self.files[s] = open(p, "wb")

    def add(self, ids: np.ndarray) -> None:
        self.n += len(ids)
        if self.spill is not None:
            self.spill.write(memoryview(ids))
            return
        self.parts.append(ids)
        self.held += ids.nbytes
        if self.held > SPILL_BYTES:
            self.spill = open(self.spill_path, "w+b")
            for part in self.parts:
                self.spill.write(memoryview(part))
            self.parts, self.held = [], 0

    def _held(self) -> Iterator[np.ndarray]:
        if self.spill is None:
            yield from self.parts
            return
        self.spill.flush()
        self.spill.seek(0)
        step = max(1, SPILL_BYTES // self.dtype.itemsize)
        while True:
            block = np.fromfile(self.spill, dtype=self.dtype, count=step)
            if not len(block):
                break
            yield block

    def end_document(self) -> None:
        """The document is complete: its first tokens to train, the last val_fraction (of its
        token count, rounded as always) to val, each followed by <|endoftext|>."""
        n = self.n
        cut = n - round(n * self.val_fraction)
        at = 0
        for ids in self._held():
            a = min(max(cut - at, 0), len(ids))
            if a:
                self.files["train"].write(memoryview(ids[:a]))
            if a < len(ids):
                self.files["val"].write(memoryview(ids[a:]))
            at += len(ids)
        for s in ("train", "val"):
            self.files[s].write(memoryview(self.eot))
        self.counts["train"] += cut + 1
        self.counts["val"] += n - cut + 1
        self.parts, self.n, self.held = [], 0, 0
        if self.spill is not None:
            self.spill.close()
            self.spill = None

    def finish(self) -> None:
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        self.spill_path.unlink(missing_ok=True)

    def abort(self) -> None:
        for f in [*self.files.values(), self.spill]:
            if f is not None:
                f.close()
        for p in [*self.paths.values(), self.spill_path]:
            p.unlink(missing_ok=True)


def remove_stale_partials(out: Path) -> None:
    """The partial files of a prepare (or of an hf: stream, gpt/hfdata.py) that was killed
    (its process is gone)."""
    for p in out.glob(".*.partial"):
        m = _PARTIAL.fullmatch(p.name)
        if m and (int(m[2]) == os.getpid() or not pid_alive(int(m[2]))):
            p.unlink(missing_ok=True)


def tokenize(
    sources: Sequence,
    encoder: Encoder,
    writer: _Writer,
    workers: int,
    crcs: Sequence[int | None] = (),
    nbytes: int = 0,
) -> None:
    """Encode every source in order into `writer`, with `workers` processes."""

    def items() -> Iterator[str | None]:  # chunks of text; None ends a document
        for i, s in enumerate(sources):
            stats: dict = {}
            yield from encoder.chunks(s.pieces(stats))
            if i < len(crcs) and crcs[i] is not None and stats.get("crc") != crcs[i]:
                raise DataError(f"{s.label} changed while it was being prepared; run again.")
            yield None

    def take(entry) -> None:
        if entry is None:
            writer.end_document()
        else:
            writer.add(entry if isinstance(entry, np.ndarray) else entry.result())

    pool = bar = None
    pending: deque = deque()  # in order: token ids (or their futures), None ends a document
    try:
        if workers > 1:
            # a tokenizer that picks its encoder lazily (the BPE's tiktoken, set up once a text
            # is large) picks it here, once, and the forked workers share it
            getattr(encoder.tok, "backend", None)
            pool = _pool(workers, encoder)
            pool.submit(int).result()  # the workers start now, before any thread (tqdm's) does
        if nbytes >= 64 << 20 and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=nbytes, unit="B", unit_scale=True, desc="tokenizing",
                       leave=False, file=sys.stderr)  # fmt: skip
        depth = 2 * workers if pool else 0
        for text in items():
            if text is None:
                pending.append(None)
            else:
                pending.append(pool.submit(_encode_in_worker, text) if pool else encoder(text))
                if bar is not None:
                    bar.update(len(text))  # characters: about the bytes
            while len(pending) > depth:
                take(pending.popleft())
        while pending:
            take(pending.popleft())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()


# --------------------------------------------------------------------------- prepare


def source_hash(documents: Iterable) -> str:
    """sha256 over the documents' names and texts (length-prefixed, so it is unambiguous),
    read as a stream: (name, text) pairs and `read_text_path`'s files alike."""
    return hash_sources([as_source(d) for d in documents])[0]


def reusable(out: Path, want: dict) -> dict | None:
    """The existing meta.json if it was made from the same inputs and its files are intact."""
    try:
        meta = json.loads((out / "meta.json").read_text("utf-8"))
        if any(meta.get(k) != v for k, v in want.items()):
            return None
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in ("train", "val"):
            if (out / f"{split}.bin").stat().st_size != meta[f"{split}_tokens"] * itemsize:
                return None
        if not all((out / f).is_file() for f in TOKENIZER_FILES[meta["tokenizer"]]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta


def _tokenizer_settings(kind: str, vocab_size: int | None, tokenizer: Tokenizer | None):
    """(tokenizer kind, requested vocabulary size) of a prepare, checked."""
    if tokenizer is not None:
        kind, vocab_size = tokenizer.kind, None
    if kind not in TOKENIZER_FILES:
        raise ValueError(f"tokenizer_kind must be 'char' or 'bpe', not {kind!r}")
    if kind == "char" and vocab_size is not None:
        raise ValueError(
            "the char tokenizer's vocabulary is the corpus's characters; "
            "vocab_size applies to bpe only"
        )
    return kind, (DEFAULT_BPE_VOCAB_SIZE if kind == "bpe" and vocab_size is None else vocab_size)


def prepare(
    documents: Iterable,
    out_dir: str | os.PathLike,
    tokenizer_kind: str = "char",
    vocab_size: int | None = None,
    val_fraction: float = 0.1,
    tokenizer: Tokenizer | None = None,
    workers: int | None = None,
) -> dict:
    """Tokenize `documents` into `out_dir` and return the meta dict (plus 'reused': bool).

    The split is per document: the last `val_fraction` of each document's tokens (rounded)
    is validation, the rest training, so every play shows up in both and validation text is
    never seen in training. Each split is one stream, `doc0 EOT doc1 EOT ...`, stored flat as
    uint16 (uint32 when the vocabulary exceeds 65536) in train.bin / val.bin. The tokenizer is
    trained on the text (char: its characters; bpe: `vocab_size` tokens, default 4096, on all
    the text up to 64 MiB and on a sample of a larger corpus; char takes no vocab_size). A
    ready-made ``tokenizer`` (GPT-2's, when fine-tuning) is used as it is instead of training
    one. If meta.json shows the same documents, tokenizer and settings, and the files are
    intact, nothing is redone and the old meta is returned with reused=True.

    The text is streamed in blocks, tokenized by `workers` processes (default: every core; one
    for a corpus under POOL_MIN_BYTES) and written as it goes (the module's docstring): memory
    stays bounded whatever the size of the corpus; meta.json is written last, so a prepare
    that was killed leaves a folder that is not ready.
    """
    tokenizer_kind, vocab_size = _tokenizer_settings(tokenizer_kind, vocab_size, tokenizer)
    sources = [as_source(d) for d in documents]
    if not sources:
        raise DataError("There are no documents to prepare.")
    out = Path(out_dir)
    digest, sizes, crcs = hash_sources(sources)
    want = {
        "source_hash": digest,
        "tokenizer": tokenizer_kind,
        "vocab_size_requested": vocab_size,
        "val_fraction": val_fraction,
    }
    if tokenizer is not None:
        blob = json.dumps(tokenizer.to_dict(), sort_keys=True).encode()
        want["tokenizer_sha256"] = hashlib.sha256(blob).hexdigest()
    meta = reusable(out, want)
    if meta is not None:
        return {**meta, "reused": True}

    total = sum(sizes)
    tok: Tokenizer
    if tokenizer is not None:
        tok = tokenizer
    elif tokenizer_kind == "char":
        tok = train_char(sources)
    else:
        tok = train_bpe(sources, total, vocab_size)
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)

    out.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out)
    writer = _Writer(out, dtype, tok.eot_token_id, val_fraction)
    try:
        writer.open()
        encoder = Encoder(tok, dtype)
        n = n_workers(total, workers, cheap=encoder.table is not None)
        tokenize(sources, encoder, writer, n, crcs, total)
        writer.finish()
        # meta.json goes last and is removed first: while it is missing the folder is not ready
        (out / "meta.json").unlink(missing_ok=True)
        for split, path in writer.paths.items():
            os.replace(path, out / f"{split}.bin")
    except OSError as e:
        writer.abort()
        raise DataError(f"Cannot write the prepared data in {out}: {e.strerror or e}.") from None
    except BaseException:
        writer.abort()
        raise
    for kind, names in TOKENIZER_FILES.items():
        if kind != tokenizer_kind:  # a stale tokenizer of the other kind would confuse loading
            for name in names:
                (out / name).unlink(missing_ok=True)
    tok.save(out)
    meta = {
        **want,
        "vocab_size": tok.vocab_size,
        "eot_token_id": tok.eot_token_id,
        "dtype": dtype.name,
        "train_tokens": writer.counts["train"],
        "val_tokens": writer.counts["val"],
        "n_documents": len(sources),
        "split": f"last {val_fraction:.0%} of each document",
    }
    atomic_write(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return {**meta, "reused": False}
