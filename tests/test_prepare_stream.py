"""Streaming prepare (gpt.prepare): the bytes of the in-memory prepare it replaced, chunk cuts
that never change a token id, peak memory that does not grow with the corpus, and no folder
that loads as complete after a SIGKILL at any point."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt import prepare as gp
from gpt import textfiles as gt
from gpt.data import DataError, read_meta, read_text_path
from gpt.data import prepare as data_prepare
from gpt.textfiles import decode_text
from gpt.tokenizer import EOT, BPETokenizer, CharTokenizer, gpt2_split_pattern

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the reference
# gpt.data.prepare and source_hash as they were before streaming (commit d631702): every
# document whole in memory, tokenized whole, the streams concatenated (the reuse check left out).


def ref_source_hash(documents):
    h = hashlib.sha256()
    for name, text in documents:
        for part in (name, text):
            b = part.encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def ref_prepare(documents, out, kind="char", vocab_size=None, val_fraction=0.1, tokenizer=None):
    if tokenizer is not None:
        kind, vocab_size = tokenizer.kind, None
    if kind == "bpe" and vocab_size is None:
        vocab_size = 4096
    want = {
        "source_hash": ref_source_hash(documents),
        "tokenizer": kind,
        "vocab_size_requested": vocab_size,
        "val_fraction": val_fraction,
    }
    if tokenizer is not None:
        blob = json.dumps(tokenizer.to_dict(), sort_keys=True).encode()
        want["tokenizer_sha256"] = hashlib.sha256(blob).hexdigest()
    texts = [text for _, text in documents]
    if tokenizer is not None:
        tok = tokenizer
    elif kind == "char":
        tok = CharTokenizer.train(texts)
    else:
        tok = BPETokenizer.train(texts, vocab_size)
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)
    eot = np.array([tok.eot_token_id], dtype=dtype)
    parts = {"train": [], "val": []}
    for text in texts:
        ids = np.array(tok.encode(text), dtype=dtype)
        cut = len(ids) - round(len(ids) * val_fraction)
        parts["train"] += [ids[:cut], eot]
        parts["val"] += [ids[cut:], eot]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, chunks in parts.items():
        stream = np.concatenate(chunks)
        (out / f"{split}.bin").write_bytes(stream.tobytes())
        counts[split] = len(stream)
    tok.save(out)
    meta = {
        **want,
        "vocab_size": tok.vocab_size,
        "eot_token_id": tok.eot_token_id,
        "dtype": dtype.name,
        "train_tokens": counts["train"],
        "val_tokens": counts["val"],
        "n_documents": len(documents),
        "split": f"last {val_fraction:.0%} of each document",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def ref_read(path):
    """The documents as read_text_path used to return them: each file decoded whole."""
    return [(d.name, decode_text(d.path.read_bytes(), str(d.path))) for d in read_text_path(path)]


def files_of(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


@pytest.fixture
def tiny(monkeypatch):
    """Buffers of a few bytes, so that every document is larger than them."""
    monkeypatch.setattr(gt, "READ_BYTES", 5)
    monkeypatch.setattr(gp, "CHUNK_CHARS", 7)
    monkeypatch.setattr(gp, "SPILL_BYTES", 16)


# --------------------------------------------------------------------------- corpora

BIG = "".join(
    f"Line {i}: the king's men rode out, they'd said; café 中文 😀 {i * 7919}\n" for i in range(300)
)
CORPUS = {
    "a.txt": b"To be, or not to be, that is the question.\n" * 4,
    "crlf.txt": b"Now is the winter\r\nof our discontent\r\r\nMade glorious\rsummer\r",
    "crlf2.txt": b"abcd\r\n" * 10,  # a CR at every offset mod 5: CRLFs across block seams
    "bom.txt": b"\xef\xbb\xbfwith a BOM: na\xc3\xafve \xe2\x82\xac100\r\n",
    "empty.txt": b"",
    "sub/big.txt": BIG.encode(),
    "sub/tricky.txt": (
        "foo \nBar  baz\t\tqux\u00a0nbsp\u2028sep\x1crs it's we'll 'S\n"
        "<|endoftext|>literal" + "abc123def!?" * 40 + "\n   \n\n x"
    ).encode(),
    "z.txt": "ends without a newline 😀".encode(),
}
IN_MEMORY = [("x", "ab\ud800c lone surrogate"), ("y", ""), ("z", BIG[:500]), ("w", "\r\n kept")]


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    for name, raw in CORPUS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(raw)
    return root


def _other_char_tokenizer():
    return CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .\n")  # the rest: <|unk|>


def _other_bpe_tokenizer():
    return BPETokenizer.train(BIG[:3000], 320)


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize(
    "kind, vocab_size, fixed",
    [
        ("char", None, None),
        ("bpe", 300, None),
        (None, None, _other_char_tokenizer),
        (None, None, _other_bpe_tokenizer),
    ],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_files_identical_to_in_memory_prepare(corpus, tmp_path, tiny, kind, vocab_size, fixed,
                                              workers):  # fmt: skip
    tok = fixed() if fixed else None
    kw = {"tokenizer": tok} if tok else {"tokenizer_kind": kind, "vocab_size": vocab_size}
    ref = ref_prepare(ref_read(corpus), tmp_path / "ref", kind or "char", vocab_size, 0.1, tok)
    meta = gp.prepare(read_text_path(corpus), tmp_path / "new", workers=workers, **kw)
    assert not meta.pop("reused")
    assert meta == ref
    assert files_of(tmp_path / "new") == files_of(tmp_path / "ref")


@pytest.mark.parametrize("kind, vocab_size", [("char", None), ("bpe", 280)])
def test_in_memory_documents_identical(tmp_path, tiny, kind, vocab_size):
    ref = ref_prepare(IN_MEMORY, tmp_path / "ref", kind, vocab_size, val_fraction=0.25)
    meta = data_prepare(IN_MEMORY, tmp_path / "new", kind, vocab_size, val_fraction=0.25)
    assert {**meta, "reused": False} == {**ref, "reused": False}
    assert files_of(tmp_path / "new") == files_of(tmp_path / "ref")


def test_source_hash_streams_files_as_texts(corpus, tiny):
    docs = read_text_path(corpus)
    assert docs == ref_read(corpus)  # a TextFile is its (name, text) pair
    assert gt.hash_sources(docs)[0] == ref_source_hash(ref_read(corpus))


def test_shakespeare_identical(tmp_path):
    """The default run's data: the 42 plays, char, bit for bit (needs the cached corpus)."""
    from gpt.data import SHAKESPEARE_FILE, default_cache_dir, read_shakespeare

    if not (default_cache_dir() / SHAKESPEARE_FILE).is_file():
        pytest.skip(f"{SHAKESPEARE_FILE} is not in {default_cache_dir()}: run gpt-train once")
    docs = read_shakespeare()
    ref = ref_prepare(docs, tmp_path / "ref")
    meta = data_prepare(docs, tmp_path / "new")
    assert {**meta, "reused": False} == {**ref, "reused": False}
    assert files_of(tmp_path / "new") == files_of(tmp_path / "ref")


def test_a_file_that_changes_is_refused(corpus, tmp_path):
    docs = read_text_path(corpus)
    (corpus / "a.txt").write_bytes(b"other text of another length\n")
    meta = data_prepare(docs, tmp_path / "o")  # measured again: the hash is the new text's
    assert meta["source_hash"] == ref_source_hash(ref_read(corpus))
    crcs = [None if d.name != "a.txt" else 1 for d in docs]  # as if it changed since hashing
    writer = gp._Writer(tmp_path / "o", np.dtype(np.uint16), 1, 0.1)
    writer.open()
    with pytest.raises(DataError, match=r"a\.txt changed while it was being prepared"):
        gp.tokenize(docs, gp.Encoder(CharTokenizer.train("x"), np.uint16), writer, 1, crcs)
    writer.abort()


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"caf\xe9 ok" * 3, r"not UTF-8 text \(byte 3 is b'\\xe9'\)"),
        (b"\xef\xbb\xbfab\xff", r"not UTF-8 text \(byte 5 is b'\\xff'\)"),
        (b"ok \xe2\x82", r"not UTF-8 text \(byte 3 is b'\\xe2'\)"),  # cut short at the end
        (b"\xff" + b"abc" * 5 + b"\0", r"binary file, not text \(a NUL byte at offset 16\)"),
    ],
)
def test_bad_text_found_streaming(tmp_path, tiny, raw, message):
    (tmp_path / "bad.txt").write_bytes(raw)
    with pytest.raises(DataError, match=message):
        read_text_path(tmp_path / "bad.txt")


# --------------------------------------------------------------------------- chunk boundaries

PATTERN = gpt2_split_pattern()
ATOMS = [
    "a", "b", "Z", "é", "中", "😀", "1", "٣", "½", "'", "s", "ll", "t", " ", "  ", "\n", "\t",
    "\r", "\u00a0", "\u2028", "\x1c", "!", ".", "-", EOT, "<|", "Ġ",
]  # fmt: skip
TOKENIZER = BPETokenizer.train(
    "".join(random.Random(0).choice(ATOMS) for _ in range(4000)) + BIG[:4000], 400
)


def _pieces(text: str, sizes: list[int]):
    i = k = 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        yield text[i : i + n]
        i, k = i + n, k + 1


def check_cuts(text: str, size: int, piece_sizes: list[int]):
    chunks = list(gp.rechunk(_pieces(text, piece_sizes), size, gp._bpe_cut))
    assert "".join(chunks) == text and all(chunks)
    assert [p for c in chunks for p in PATTERN.findall(c)] == PATTERN.findall(text)
    assert [i for c in chunks for i in TOKENIZER.encode(c)] == TOKENIZER.encode(text)
    # training cuts (whitespace only) keep the pre-token counts, <|endoftext|> a boundary
    train = list(gp.rechunk(_pieces(text, piece_sizes), size, gp._ws_cut))
    assert "".join(train) == text
    assert BPETokenizer.train(train, 300).to_dict() == BPETokenizer.train(text, 300).to_dict()
    return chunks


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(ATOMS), max_size=120),
    st.integers(1, 12),
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_bpe_chunks_encode_as_the_whole(atoms, size, piece_sizes):
    check_cuts("".join(atoms), size, piece_sizes)


def test_bpe_chunk_cuts_examples():
    # "a \n" + "B" would give the pre-token " \n" where the whole text has " ", "\n": the cut
    # goes before whitespace that follows non-whitespace, never just after a newline
    assert PATTERN.findall("foo \nBar") == ["foo", " ", "\n", "Bar"]
    assert PATTERN.findall("foo \n") + PATTERN.findall("Bar") != PATTERN.findall("foo \nBar")
    for size in range(1, 9):
        check_cuts("foo \nBar  baz\n\n\tx it's  'll", size, [3])
    # text without whitespace is cut where a run of letters begins or ends...
    chunks = check_cuts("abc123def!?" * 30, 10, [7])
    assert max(map(len, chunks)) <= 14 and len(chunks) > 20
    # ...but never after the apostrophe of a contraction; a run with no cut at all is held
    check_cuts("x's" * 20, 4, [5])
    assert len(check_cuts("a" * 100 + " b", 10, [3])) == 2


def test_bpe_sample_windows_hold_whole_pretokens(tmp_path, monkeypatch):
    monkeypatch.setattr(gp, "BPE_TRAIN_BYTES", 1000)
    monkeypatch.setattr(gp, "BPE_SAMPLE_WINDOWS", 6)
    monkeypatch.setattr(gp, "BPE_SAMPLE_WINDOW_BYTES", 300)
    texts = {"a.txt": BIG[:2500], "b.txt": BIG[3000:9000].replace("\n", "\r\n"), "c.txt": "x y"}
    for name, text in texts.items():
        (tmp_path / name).write_bytes(text.encode())
    docs = read_text_path(tmp_path)
    windows = list(gp._sample(docs))
    assert 3 <= len(windows) <= 6 and sum(map(len, windows)) < 2000
    for w in windows:
        doc = next(t for t in (d.text for d in docs) if w in t)
        ends, at = {0}, 0
        for p in PATTERN.findall(doc):
            at += len(p)
            ends.add(at)
        starts = [i for i in range(len(doc)) if doc.startswith(w, i)]
        assert any(i in ends and i + len(w) in ends for i in starts), w
    out = tmp_path / "out"
    meta = data_prepare(docs, out, "bpe", 300)  # the tokenizer from the sample, all text encoded
    assert meta["n_documents"] == 3
    tok = BPETokenizer.load(out)
    eot = tok.eot_token_id
    splits = {}
    for split in ("train", "val"):
        ids = np.fromfile(out / f"{split}.bin", dtype=meta["dtype"]).tolist()
        ends = [i for i, t in enumerate(ids) if t == eot]
        splits[split] = [ids[a + 1 : b] for a, b in zip([-1, *ends], ends)]
    for d, train, val in zip(docs, splits["train"], splits["val"], strict=True):
        assert train + val == tok.encode(d.text)


# --------------------------------------------------------------------------- memory


def _write_corpus(path: Path, megabytes: int) -> None:
    rng = np.random.default_rng(0)
    words = np.array("the king and queen of a far land rode out at dawn café 中文 😀 \n".split(" "))
    block = " ".join(rng.choice(words, size=1 << 20).tolist()).encode()  # about 6 MB
    with open(path, "wb") as f:
        for _ in range(megabytes * (1 << 20) // len(block)):
            f.write(block)


def _peak_rss_mb(corpus: Path, out: Path) -> float:
    """Peak RSS of a process that prepares `corpus` (char), through a wrapper process whose
    only children are that one and its pool workers."""
    code = textwrap.dedent(
        f"""
        import resource, subprocess, sys
        prep = "from gpt.data import prepare, read_text_path; prepare(read_text_path({str(corpus)!r}), {str(out)!r})"
        subprocess.run([sys.executable, "-c", prep], check=True)
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return int(done.stdout.split()[-1]) / 1024  # KiB on Linux


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB: Linux only")
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path):
    """50 MB and 200 MB of text (one document each, so a whole document is never held) peak
    within a few MB of each other; the in-memory prepare took about 12 bytes per byte."""
    peaks = {}
    for mb in (50, 200):
        _write_corpus(tmp_path / f"c{mb}.txt", mb)
        peaks[mb] = _peak_rss_mb(tmp_path / f"c{mb}.txt", tmp_path / f"out{mb}")
        os.unlink(tmp_path / f"c{mb}.txt")
    assert peaks[200] < peaks[50] + 40, peaks
    assert peaks[200] < 400, peaks


# --------------------------------------------------------------------------- kill safety

DRIVER = """
import json, os, signal, sys, threading
from gpt import prepare as gp
from gpt import textfiles as gt
from gpt.data import read_text_path
from gpt.tokenizer import CharTokenizer

plan, corpus, workers = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
gt.READ_BYTES, gp.CHUNK_CHARS, gp.SPILL_BYTES = 64, 64, 256
OWNERS = {"add": gp._Writer, "end_document": gp._Writer, "finish": gp._Writer,
          "replace": gp.os, "save": CharTokenizer, "atomic_write": gp}

def kill_at_nth(obj, name, n):
    orig, calls = getattr(obj, name), [0]
    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return orig(*args, **kwargs)
    setattr(obj, name, wrapped)

def slow_workers(out):  # for a kill from outside: the workers say who they are, and dawdle
    init, encode = gp._init_worker, gp.Encoder.__call__
    def record(encoder):
        with open(os.path.join(out, ".workers"), "a") as f:
            f.write(f"{os.getpid()}\\n")
        init(encoder)
    def slow(self, text):
        threading.Event().wait(0.02)
        return encode(self, text)
    gp._init_worker, gp.Encoder.__call__ = record, slow

if plan[0][0] == "outside":  # this process prepares; the test kills it
    slow_workers(plan[0][2])
    gp.prepare(read_text_path(corpus), plan[0][2], workers=workers)
    sys.exit(0)
codes = []
for point, n, out in plan:  # a child per kill point, forked from this one (imports once)
    pid = os.fork()
    if pid == 0:
        try:
            kill_at_nth(OWNERS[point], point, n)
            gp.prepare(read_text_path(corpus), out, workers=workers)
        finally:
            os._exit(0)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""

KILL_POINTS = [
    ("add", 1),  # the first chunk of tokens
    ("add", 40),  # in the middle, a document spilled to disk
    ("end_document", 2),
    ("finish", 1),  # every token written, nothing renamed
    ("replace", 1),  # meta.json removed, train.bin about to be renamed
    ("replace", 2),  # train.bin in place, val.bin not
    ("save", 1),  # both .bin files in place, the tokenizer not
    ("atomic_write", 1),  # all but meta.json
]


@pytest.fixture
def two_corpora(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for d, seed in ((old, 1), (new, 2)):
        d.mkdir()
        rnd = random.Random(seed)
        for i in range(3):
            lines = (" ".join(rnd.choice(BIG.split()) for _ in range(12)) for _ in range(40))
            (d / f"{i}.txt").write_text("\n".join(lines) + "\n")
    return old, new


def check_left(out: Path, old_files: dict) -> None:
    """What a killed prepare left never loads as complete: no meta.json at all, or the old
    complete folder exactly, which the reuse check refuses for the new text."""
    try:
        meta = read_meta(out)
    except DataError:
        meta = None
    if meta is not None:
        left = {k: v for k, v in files_of(out).items() if not k.startswith(".")}
        assert left == old_files


def test_sigkill_never_leaves_a_complete_looking_folder(two_corpora, tmp_path):
    """A prepare killed (SIGKILL) at each point, over a complete folder of other text and
    into an empty one: what is left is not ready, and preparing again gives the right bytes."""
    old, new = two_corpora
    data_prepare(read_text_path(old), tmp_path / "old_out")
    old_files = files_of(tmp_path / "old_out")
    plan = []
    for point, n in KILL_POINTS:
        for start_empty in (False, True):
            out = tmp_path / f"out-{point}-{n}-{start_empty}"
            if not start_empty:
                shutil.copytree(tmp_path / "old_out", out)
            plan.append((point, n, str(out)))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(plan), str(new), "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    codes = json.loads(proc.stdout.split("\n")[-2])
    ref = tmp_path / "ref"
    ref_prepare(ref_read(new), ref)
    for (point, n, out), code in zip(plan, codes):
        out = Path(out)
        assert code == -signal.SIGKILL, (point, n, code)
        check_left(out, old_files if out.name.endswith("False") else {})
        meta = data_prepare(read_text_path(new), out)  # prepare again: the reference's bytes
        assert not meta["reused"], (point, n)
        assert files_of(out) == files_of(ref), (point, n)  # no partial file left either
        assert data_prepare(read_text_path(new), out)["reused"]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] in "ZX"  # a zombie nobody reaps is gone too
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigkill_from_outside_with_a_pool(two_corpora, tmp_path):
    """Killed from outside while two worker processes tokenize: the folder is not ready, the
    workers exit, and a new prepare gives the right bytes."""
    old, new = two_corpora
    out = tmp_path / "out"
    data_prepare(read_text_path(old), out)
    old_files = files_of(out)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps([["outside", 0, str(out)]]), str(new), "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(out.glob(".train.bin.*.partial")) or not (out / ".workers").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    check_left(out, old_files)
    workers = [int(p) for p in (out / ".workers").read_text().split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while not all(map(_gone, workers)):
        assert time.monotonic() < deadline, "the pool's workers outlived their parent"
        time.sleep(0.1)
    meta = data_prepare(read_text_path(new), out)
    ref = ref_prepare(ref_read(new), tmp_path / "ref")
    assert not meta["reused"] and meta["source_hash"] == ref["source_hash"]
    assert not list(out.glob(".*.partial"))
