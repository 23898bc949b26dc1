"""`--data hf:NAME[:CONFIG][@SIZE]`: a Hugging Face dataset's text, streamed once into the cache.

    gpt-train --data hf:roneneldan/TinyStories@200MB
    gpt-train --data hf:HuggingFaceFW/fineweb-edu:sample-10BT@1GB --tokenizer bpe

`text_file` streams the dataset's train split with the `datasets` library's streaming mode
(an optional dependency: `pip install datasets`), record by record, and writes each record's
`text` field into one UTF-8 file in the cache, records separated by a blank line, until the
split ends or the text reaches SIZE (decimal units: 200MB is 200,000,000 bytes; the record
that crosses it is the last). The file is written as a hidden `.partial` file and renamed when
complete, so a run killed midway leaves nothing that counts as streamed; a later run with the
same spec reads the file and never touches the network (offline-safe). From there the text is
prepared as any `--data` text file is (gpt/prepare.py): tokenizer, train/val split, shards.
NAME may also be a local folder of data files (.jsonl, .parquet, ...) that `datasets` reads.

Imports: hashlib, json, os, re, sys, pathlib, .prepare, .store, .textfiles; `datasets` inside
`text_file`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from .prepare import remove_stale_partials
from .store.checkpoint import atomic_write_bytes as atomic_write
from .textfiles import DataError

PREFIX = "hf:"
SEPARATOR = "\n\n"  # between records
_SPEC = re.compile(r"hf:(?P<name>[^:@\s]+)(?::(?P<config>[^:@\s]+))?(?:@(?P<size>[^@]+))?")
_SIZE = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]?)B?", re.IGNORECASE)
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def is_spec(data: str | None) -> bool:
    return bool(data) and data.startswith(PREFIX)


def parse(spec: str) -> tuple[str, str | None, int | None]:
    """(name, config or None, size limit in bytes or None); ValueError with the reason."""
    m = _SPEC.fullmatch(spec)
    if m is None:
        raise ValueError(
            f"{spec!r} is not hf:NAME[:CONFIG][@SIZE] (e.g. hf:roneneldan/TinyStories@200MB)"
        )
    size = None
    if m["size"] is not None:
        s = _SIZE.fullmatch(m["size"].strip())
        size = int(float(s["n"]) * _UNITS[s["unit"].upper()]) if s else 0
        if size < 1:
            raise ValueError(f"{spec!r}: the size after @ must be like 200MB, 2GB or 500KB")
    return m["name"], m["config"], size


def absolute(spec: str) -> str:
    """The spec with a local folder's NAME made absolute (a run resumed elsewhere finds it);
    a spec that does not parse is returned as it is (gpt-train's checks say why)."""
    try:
        name = parse(spec)[0]
    except ValueError:
        return spec
    if not Path(name).expanduser().exists():
        return spec
    rest = spec[len(PREFIX) + len(name) :]
    return PREFIX + str(Path(name).expanduser().resolve()) + rest


def slug(spec: str) -> str:
    """A file name for what `spec` streams: the dataset's name, its config and its size
    ('' for a spec that does not parse)."""
    try:
        name, config, size = parse(spec)
    except ValueError:
        return ""
    words = [name.rstrip("/").rsplit("/", 1)[-1], config, size and _size_text(size)]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(w for w in words if w)).strip("_.")[-80:]


def _size_text(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n}B"


def cache_path(spec: str, cache_dir: Path) -> Path:
    """Where the streamed text of `spec` lives: one folder per (name, config, size), so the
    spellings of one size (@4KB, @4kb, @4000) share it."""
    digest = hashlib.sha1(repr(parse(spec)).encode()).hexdigest()[:8]
    return cache_dir / "hf" / f"{slug(spec) or 'data'}-{digest}" / "text.txt"


def _open_stream(name: str, config: str | None):
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"--data {PREFIX}{name} streams through the `datasets` library, which is not "
            "installed: pip install datasets"
        ) from None
    try:
        return datasets.load_dataset(name, config, split="train", streaming=True)
    except Exception as e:  # not found, offline, no train split, a bad config: one line
        raise DataError(f"Cannot stream {name!r} from the Hugging Face hub: {_line(e)}") from None


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def text_file(spec: str, cache_dir: Path) -> Path:
    """The text of `spec`, streamed into the cache the first time (see the module docstring)."""
    name, config, size = parse(spec)
    path = cache_path(spec, cache_dir)
    if path.is_file():
        return path
    stream = _open_stream(name, config)
    columns = getattr(stream, "column_names", None)
    if columns is not None and "text" not in columns:
        raise DataError(
            f"{name!r} has no 'text' column (its columns: {', '.join(map(str, columns))}); "
            f"--data {PREFIX} trains on a dataset's text"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent)  # (of streams that were killed: nothing renamed them)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    print(f"streaming {spec} into {path} ...", file=sys.stderr)
    n_bytes = records = skipped = 0
    try:
        with open(partial, "w", encoding="utf-8", newline="\n") as f:
            for i, record in enumerate(stream):
                text = record.get("text") if isinstance(record, dict) else None
                if text is not None and not isinstance(text, str):
                    raise DataError(
                        f"record {i} of {name!r} has no text (its 'text' field is "
                        f"{type(text).__name__}); --data {PREFIX} trains on a dataset's text"
                    )
                if not text or "\x00" in text:  # NUL: not text (prepare refuses it)
                    skipped += 1
                    continue
                piece = (SEPARATOR if records else "") + text
                f.write(piece)
                n_bytes += len(piece.encode("utf-8", "surrogatepass"))
                records += 1
                if size is not None and n_bytes >= size:
                    break
            f.flush()
            os.fsync(f.fileno())  # the text is on disk before its name says it is complete
        if not records:
            raise DataError(f"{name!r} streamed no text (its train split is empty)")
        meta = dict(spec=spec, records=records, bytes=n_bytes, skipped_records=skipped)
        atomic_write(path.with_name("source.json"), json.dumps(meta, indent=1).encode())
        os.replace(partial, path)
    except Exception as e:  # the network failed midway, the disk filled up, ...
        if type(e).__module__.split(".")[0] == "gpt":  # ours: DataError, a signal's Interrupted
            raise
        raise DataError(f"Cannot stream {name!r} into {path.parent}: {_line(e)}") from None
    finally:
        partial.unlink(missing_ok=True)
    note = f" (skipped {skipped} empty, null or NUL-holding records)" if skipped else ""
    print(f"streamed {records:,} records, {_size_text(n_bytes)} of text{note}", file=sys.stderr)
    return path
