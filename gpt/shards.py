"""Pre-tokenized GPT-2 token shards, as the GPT-2 reproduction scripts write them.

`gpt-train --data DIR` reads them when DIR holds `.npy` or `.bin` files (one format a folder):

- build-nanogpt's fineweb.py: `.npy` files (``edufineweb_train_000001.npy``), each a 1-D uint16
  array of GPT-2 token ids, every document starting with <|endoftext|> (50256);
- llm.c's dev/data scripts: `.bin` files (``tiny_shakespeare_train.bin``,
  ``fineweb_train_000001.bin``): a header of 256 little-endian int32 (magic 20240520, version
  1, the number of tokens), then the tokens as uint16. Version 1 is the only one llm.c writes
  for GPT-2; its Llama 3 shards (magic 20240801, uint32 ids) are another vocabulary, refused.

A file whose name contains "train" is training data, one with "val" validation, as those
scripts name them. The shards of a split, in sorted name order, are one token stream (fineweb.py
cuts its stream into shards mid-document), and `ShardSampler` draws (x, y) windows from it as
`gpt.data.BatchSampler` draws them from one prepared file: the same seeded generator, the same
draws, the same state in a checkpoint; the files are memory-mapped, so only the windows drawn
are read. `check_shards` reads every header, then every token once in bounded chunks (ids below
the vocabulary size, and a CRC-32 for the fingerprint a resumed run compares); each problem is
one `DataError` naming the file. No pickle: a .npy header is parsed, never unpickled.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import zlib
from pathlib import Path

import numpy as np

from .data import BatchSampler, DataError
from .store.errors import CheckpointError

FORMATS = {".npy": "fineweb .npy", ".bin": "llm.c .bin"}
LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_BYTES = 20240520, 1, 256 * 4
OTHER_MAGICS = {  # llm.c's other files, named when they are passed as shards
    20240801: "an llm.c Llama 3 token file (uint32 ids of Llama 3's vocabulary, not GPT-2's)",
    20240522: "an llm.c evaluation file (HellaSwag/MMLU examples), not training tokens",
}
GPT2_VOCAB_SIZE = 50257
CHUNK_TOKENS = 1 << 22  # tokens per read while checking the ids (8 MiB)
SAY_CHECKING = 1 << 30  # bytes of shards above which checking them is announced
_SPLITS = ("train", "val")


def shard_files(root: str | os.PathLike) -> list[Path] | None:
    """The shard files directly in the folder `root` (names starting with '.' skipped), sorted;
    None when root is not a folder or holds no .npy or .bin file (it is then read as text).
    A folder with both kinds, or a shard named instead of its folder, is a DataError."""
    root = Path(root)
    if root.suffix in FORMATS and root.is_file():
        raise DataError(
            f"{root} is a {FORMATS[root.suffix]} token shard: pass the folder that holds the "
            "shards (gpt-train reads its train and val shards)"
        )
    if not root.is_dir():
        return None
    files = sorted(p for p in root.iterdir() if p.suffix in FORMATS and not p.name.startswith("."))
    if not files:
        return None
    kinds = sorted({p.suffix for p in files})
    if len(kinds) > 1:
        first = {k: next(p.name for p in files if p.suffix == k) for k in kinds}
        raise DataError(
            f"{root} holds both .npy shards ({first['.npy']}) and .bin shards ({first['.bin']}): "
            "keep one format in a folder"
        )
    return files


def split_of(path: Path) -> str:
    """'train' or 'val', from the file name, as build-nanogpt's loader reads it."""
    found = [s for s in _SPLITS if s in path.name]
    if len(found) != 1:
        what = "both 'train' and 'val'" if found else "neither 'train' nor 'val'"
        raise DataError(
            f"{path}: the name holds {what}; a shard's name says its split (e.g. "
            "edufineweb_train_000001.npy, tiny_shakespeare_val.bin): rename it or move it out"
        )
    return found[0]


def read_header(path: Path) -> tuple[int, int, np.dtype]:
    """(byte offset of the tokens, number of tokens, their dtype) from a shard's header, the
    file's size checked against them. Reads only the header."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise DataError(f"{path} is not a regular file (a FIFO, device or socket)")
            if path.suffix == ".npy":
                offset, n, dtype = _npy_header(f, path)
            else:
                offset, n, dtype = _llmc_header(f, path, st.st_size)
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e.strerror}.") from None
    want = offset + n * dtype.itemsize
    if st.st_size < want:
        raise DataError(
            f"{path} is truncated: its header says {n:,} tokens ({want:,} bytes with the "
            f"header) but the file has {st.st_size:,} bytes; write it again"
        )
    if st.st_size > want:
        raise DataError(
            f"{path} has {st.st_size - want:,} bytes after the {n:,} tokens its header "
            "says: not a shard written whole (or the header is wrong); write it again"
        )
    return offset, n, dtype


def _npy_header(f, path: Path) -> tuple[int, int, np.dtype]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version[0]}.{version[1]} (np.save writes 1.0)")
    except (ValueError, SyntaxError, TypeError, EOFError) as e:
        msg = " ".join(str(e).split())[:200]
        raise DataError(f"{path} is not a readable .npy file ({msg})") from None
    if len(shape) != 1:
        raise DataError(
            f"{path} holds a {len(shape)}-D array of shape {shape}; a fineweb shard is a "
            "1-D uint16 array of GPT-2 token ids"
        )
    if dtype.kind != "u" or dtype.itemsize != 2:
        raise DataError(
            f"{path} holds {dtype} values; a fineweb shard is a 1-D uint16 array of GPT-2 "
            "token ids (np.save(path, tokens.astype(np.uint16)))"
        )
    return f.tell(), int(shape[0]), dtype


def _llmc_header(f, path: Path, size: int) -> tuple[int, int, np.dtype]:
    raw = f.read(LLMC_HEADER_BYTES)
    if len(raw) < LLMC_HEADER_BYTES:
        raise DataError(
            f"{path} has {size:,} bytes, fewer than llm.c's {LLMC_HEADER_BYTES}-byte header: "
            "not an llm.c token shard"
        )
    magic, version, n = (int(v) for v in np.frombuffer(raw, "<i4", count=3))
    if magic != LLMC_MAGIC:
        what = OTHER_MAGICS.get(magic, "not an llm.c GPT-2 token shard")
        raise DataError(f"{path} starts with magic {magic}, not llm.c's {LLMC_MAGIC}: {what}")
    if version != LLMC_VERSION:
        raise DataError(
            f"{path} is version {version} of llm.c's format; gpt-train reads version "
            f"{LLMC_VERSION} (uint16 GPT-2 token ids)"
        )
    if n < 0:
        raise DataError(f"{path}: its header says {n:,} tokens, a negative count")
    return LLMC_HEADER_BYTES, n, np.dtype("<u2")


def _scan(path: Path, offset: int, n: int, dtype: np.dtype, vocab_size: int) -> int:
    """CRC-32 of the tokens, reading them once in chunks of CHUNK_TOKENS; a DataError names
    the first id that is not below vocab_size."""
    crc, done = 0, 0
    buf = bytearray(CHUNK_TOKENS * dtype.itemsize)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while done < n:
                want = min(CHUNK_TOKENS, n - done) * dtype.itemsize
                got = f.readinto(memoryview(buf)[:want])
                if got != want:
                    raise DataError(f"{path} became shorter while it was read; write it again")
                ids = np.frombuffer(buf, dtype, count=want // dtype.itemsize)
                if int(ids.max()) >= vocab_size:
                    at = int(np.argmax(ids >= vocab_size))
                    raise DataError(
                        f"{path}: token {done + at:,} is id {int(ids[at])}, outside the "
                        f"vocabulary of {vocab_size:,} tokens; the shards must hold GPT-2 "
                        f"token ids (0..{GPT2_VOCAB_SIZE - 1}) and the tokenizer be GPT-2's"
                    )
                crc = zlib.crc32(memoryview(buf)[:want], crc)
                done += want // dtype.itemsize
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e.strerror}.") from None
    return crc


def read_headers(root: str | os.PathLike, files: list[Path]) -> list[tuple]:
    """(path, split, offset, tokens, dtype) of every shard, each header checked, and both
    splits present. Reads only the headers."""
    headers = [(p, split_of(p), *read_header(p)) for p in files]
    have = {s: sum(h[1] == s for h in headers) for s in _SPLITS}
    for split, other in (("val", "train"), ("train", "val")):
        if not have[split]:
            raise DataError(
                f"{root} has {have[other]} {other} shard(s) but no {split} shard (a "
                f"{FORMATS[files[0].suffix]} file whose name contains '{split}'); gpt-train "
                "trains on the train shards and evaluates on the val shards"
            )
    return headers


def check_shards(root: str | os.PathLike, files: list[Path], vocab_size: int) -> dict:
    """The meta of a folder of shards (as `gpt.data.prepare` returns one for text): token
    counts per split, a fingerprint (`source_hash`: the names, token counts and CRC-32 of the
    shards) and `shards`, each split's list of (path, offset, tokens, dtype) for
    `ShardSampler`. Every header is checked before any token is read."""
    return scan_shards(root, read_headers(root, files), vocab_size)


def scan_shards(root: str | os.PathLike, headers: list[tuple], vocab_size: int) -> dict:
    """check_shards after the headers: every token read once (ids below vocab_size)."""
    files = [h[0] for h in headers]
    counts = {s: sum(h[3] for h in headers if h[1] == s) for s in _SPLITS}
    total = sum(h[0].stat().st_size for h in headers)
    if total > SAY_CHECKING:
        print(
            f"checking the token ids of {len(files)} shards ({total / 2**30:,.1f} GiB) in "
            f"{root} ...",
            file=sys.stderr,
            flush=True,
        )
    h = hashlib.sha256(FORMATS[files[0].suffix].encode())
    shards: dict[str, list] = {s: [] for s in _SPLITS}
    for path, split, offset, n, dtype in headers:
        crc = _scan(path, offset, n, dtype, vocab_size)
        h.update(f"\0{path.name}\0{n}\0{crc}".encode())
        shards[split].append((str(path), offset, n, dtype.str))
    return {
        "source_hash": h.hexdigest(),
        "format": FORMATS[files[0].suffix],
        "train_tokens": counts["train"],
        "val_tokens": counts["val"],
        "n_shards": {s: len(v) for s, v in shards.items()},
        "shards": shards,
    }


def shard_tokenizer(root: str | os.PathLike):
    """GPT-2's tokenizer for a folder of shards: its vocab.json + merges.txt if it has them,
    else the hub's gpt2's two files alone, not its weights (needs the hf extra)."""
    from .hub import tokenizer_dir
    from .tokenizer import load_tokenizer_dir

    root = Path(root)
    if (root / "vocab.json").is_file() and (root / "merges.txt").is_file():
        source = root
    else:
        try:
            source = tokenizer_dir("gpt2")
        except CheckpointError as e:
            raise DataError(
                f"{root} holds GPT-2 token ids but not GPT-2's tokenizer (vocab.json and "
                f"merges.txt), and the hub's gpt2 cannot give it: {e}. Copy GPT-2's vocab.json "
                f"and merges.txt into {root}, or pass --init-from with a GPT-2 directory"
            ) from None
    try:
        return load_tokenizer_dir(source)
    except (OSError, ValueError) as e:
        raise DataError(f"Cannot load the tokenizer in {source}: {e}") from None


def load_shards(root: str | os.PathLike, files: list[Path], tok=None) -> tuple[dict, object]:
    """(meta, tokenizer) for a folder of shards: `tok` (--init-from's) or GPT-2's. The
    headers are checked first, then the tokenizer found, then the ids read."""
    headers = read_headers(root, files)
    if tok is None:
        tok = shard_tokenizer(root)
    meta = scan_shards(root, headers, tok.vocab_size)
    return {**meta, "vocab_size": tok.vocab_size, "tokenizer": tok.kind}, tok


def _open(path: str, offset: int, n: int, dtype: str) -> np.ndarray:
    """A checked shard's tokens, memory-mapped (np.load's mmap for .npy, no pickle)."""
    try:
        if path.endswith(".npy"):
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            arr = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(n,))
    except (OSError, ValueError) as e:
        raise DataError(f"Cannot map {path} ({e}); was it changed while training?") from None
    if arr.shape != (n,) or arr.dtype != np.dtype(dtype):
        raise DataError(f"{path} changed since it was checked; start again")
    return arr


class ShardSampler(BatchSampler):
    """Random (x, y) windows from one split's shards, as `BatchSampler` draws them from one file.

    The shards, in order, are one stream of n tokens; each row starts at a uniformly random
    position of it (a window may run from one shard into the next, as the stream does), drawn
    by the same generator calls, so one shard gives BatchSampler's batches exactly, and
    `state_dict` / `load_state_dict` (inherited) resume it bitwise.
    """

    def __init__(self, shards: list, split: str, block_size: int, batch_size: int, seed: int = 0):
        arrays = [_open(*s) for s in shards if s[2] > 0]  # (an empty file cannot be mapped)
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        self.n_tokens = int(lengths.sum())
        if self.n_tokens < block_size + 1:
            raise DataError(
                f"The block size {block_size} is larger than the data: the {split} shards "
                f"hold {self.n_tokens} tokens and one example needs block_size + 1 = "
                f"{block_size + 1}. Use a smaller --block-size."
            )
        self.split, self.block_size, self.batch_size = split, block_size, batch_size
        self.arrays = arrays
        self._ends = np.cumsum(lengths)
        self._starts = self._ends - lengths
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._offsets = np.arange(block_size + 1)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y), both int64 of shape (batch_size, block_size), with y[:, t] == x[:, t + 1]."""
        starts = self.rng.integers(0, self.n_tokens - self.block_size, size=self.batch_size)
        at = starts[:, None] + self._offsets  # (B, T+1) positions in the stream
        which = np.searchsorted(self._ends, at, side="right")  # the shard of each position
        windows = np.empty(at.shape, dtype=np.int64)
        for k in np.unique(which):
            mask = which == k
            windows[mask] = self.arrays[k][at[mask] - self._starts[k]]
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])


def make_sampler(data_dir, meta: dict, split: str, block_size: int, batch_size: int, seed: int):
    """The run's sampler: over the shards when meta comes from `load_shards`, else over the
    prepared file (`BatchSampler`)."""
    if "shards" in meta:
        return ShardSampler(meta["shards"][split], split, block_size, batch_size, seed)
    return BatchSampler(data_dir, split, block_size, batch_size, seed=seed)
