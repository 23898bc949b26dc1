"""Directories that gpt writes whole (gpt-export, GPT.save_pretrained), and how one replaces another.

Each holds a manifest, gpt-export.json, naming every file gpt wrote there with its sha256. A
directory whose entries are all on its own list, each unchanged, is gpt's own: a later export
may replace it. Any other non-empty directory is a user's: gpt-export refuses it, and
save_pretrained (which, as transformers', may write into a used directory) replaces only the
files of its own names there and deletes nothing it did not write.

The files are first written in full into a temporary sibling (.gpt-export-XXXX), which is then
renamed to the target. Over an earlier export the old directory is renamed aside
(.gpt-export-old-XXXX), the new one in, and the old one deleted. A process stopped at any point
leaves the old export whole or the new one whole (a SIGKILL between those two renames: nothing
at the target, and the old export whole aside), never the files of two exports mixed. Where
the directory cannot be replaced (a used one, the working directory), the files are renamed in
one by one, config.json removed first and put back last: stopped midway, it does not load.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from .checkpoint import atomic_write_json

MANIFEST = "gpt-export.json"
FORMAT = "tensorgrad-gpt/hf-export/1"
NOTE = "the files gpt wrote here; a later export may replace the directory while all are unchanged"


def shown(s: str) -> str:
    """s for an error line: quoted when empty, shortened when long."""
    if not s:
        return "''"
    return s if len(s) <= 80 else f"{s[:60]}... ({len(s)} characters)"


def check_target(directory) -> Path:
    """The absolute path of a directory to write; ValueError (one line, starting with the name
    as given) for an empty name, a name the filesystem refuses, a file or a symbolic link."""
    s = os.fspath(directory)
    if not s:
        raise ValueError("'' names no directory")
    d = Path(os.path.abspath(s))
    if not d.name:
        raise ValueError(f"{shown(s)} cannot be replaced by an export")
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        _check_new_names(d, s)
        return d
    except OSError as e:  # ENAMETOOLONG, ENOTDIR (a parent is a file), EACCES, ELOOP...
        raise ValueError(f"{shown(s)}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"{shown(s)} is a symbolic link: name the directory itself")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{shown(s)} exists and is not a directory")
    return d


def _check_new_names(d: Path, s: str) -> None:
    """The parts of d below its nearest existing ancestor fit the filesystem's name limit
    (checked before any of them is created)."""
    top = d
    while not os.path.lexists(top):
        top = top.parent
    try:
        limit = os.pathconf(top, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in d.relative_to(top).parts:
        if len(os.fsencode(part)) > limit:
            raise ValueError(
                f"{shown(s)}: file name too long (one part of it is over {limit} bytes)"
            )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(d: Path) -> dict | None:
    """name -> sha256 from d's manifest; None when it is absent or not one gpt wrote."""
    return _manifest(d)[0]


def _manifest(d: Path) -> tuple[dict | None, str]:
    """(name -> sha256, "") from d's manifest, or (None, why it is not one gpt wrote)."""
    try:
        st = os.lstat(d / MANIFEST)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return None, "not a regular file of at most 1 MiB"
        m = json.loads((d / MANIFEST).read_text("utf-8"))
    except FileNotFoundError:
        return None, "absent"
    except (OSError, ValueError, RecursionError):
        return None, "not JSON"
    if not isinstance(m, dict):
        return None, "not a JSON object"
    if m.get("format") != FORMAT:  # another tool's manifest of the same name
        fmt = shown(json.dumps(m.get("format"), ensure_ascii=True))
        return None, f"its format is {fmt}, not gpt-export's {json.dumps(FORMAT)}"
    files = m.get("files")
    ok = isinstance(files, dict) and all(
        isinstance(n, str)
        and "/" not in n
        and n not in (".", "..", MANIFEST, "")
        and isinstance(h, str)
        and len(h) == 64
        for n, h in files.items()
    )
    return (files, "") if ok else (None, "its list of files is malformed")


def inspect(d: Path) -> tuple[str, dict, str]:
    """(kind, ours, why) of a target directory: kind 'new' (absent or empty), 'ours' (every
    entry on its manifest, unchanged) or 'foreign'; ours, name -> sha256 of the entries gpt
    wrote that are unchanged; why, for 'foreign', the first reason in words."""
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return "new", {}, ""
    if not names:
        return "new", {}, ""
    listed, why = _manifest(d)
    if listed is None:
        if MANIFEST in names:
            return "foreign", {}, f"{d / MANIFEST} was not written by gpt-export ({why})"
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        why = f"{d} is not empty and was not written by gpt-export (it holds {names[0]}{more})"
        return "foreign", {}, why
    ours, why = {}, ""
    for name in names:
        if name == MANIFEST:
            continue
        p = d / name
        if name not in listed:
            why = why or f"{d} holds {name}, which gpt-export did not write"
        elif not stat.S_ISREG(os.lstat(p).st_mode) or sha256_file(p) != listed[name]:
            why = why or f"{p} changed since gpt-export wrote it"
        else:
            ours[name] = listed[name]
    return ("foreign" if why else "ours"), ours, why


def check(directory, strict: bool) -> tuple[Path, str, dict]:
    """(path, kind, ours) of a target (see inspect); strict refuses a foreign one (ValueError)."""
    d = check_target(directory)
    kind, ours, why = inspect(d)
    if strict and kind == "foreign":
        raise ValueError(f"{why}; nothing was changed: export to a new directory")
    return d, kind, ours


def write_dir(
    directory,
    fill: Callable[[Path], list[str]],
    *,
    strict: bool,
    stale=(),
    last: str | None = None,
) -> list[str]:
    """Write the files fill(dir) puts into dir (returning their names), and the manifest, as
    the directory ``directory``; returns the names written.

    A new or empty directory, or one gpt wrote (the files of it that fill does not write, nor
    names in ``stale``, are kept), is replaced whole (see the module docstring). A foreign one
    is refused with ``strict``; else written in place, as is the working directory (or one
    above it): stale names must be gpt's (they are deleted), ``last`` (the file that makes the
    directory usable) is removed first and renamed in last, so a process killed midway leaves
    it unusable rather than mixed.
    """
    d, kind, ours = check(directory, strict)
    if kind == "foreign" or _holds_cwd(d):  # (a renamed working directory would be lost)
        return _in_place(d, fill, ours, set(stale), last)
    carry = {n: h for n, h in ours.items() if n not in stale}
    tmp, files = _stage(d.parent, fill, d, carry)
    try:
        if kind == "new":
            os.rename(tmp, d)  # onto an empty directory too; refused if it filled meanwhile
        else:
            _swap(tmp, d, ours)
    except BaseException as e:  # (also a KeyboardInterrupt: no temporary directory is left)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise ValueError(
                f"{d} changed while the export was written; nothing was replaced"
            ) from None
        raise
    _fsync_dir(d.parent)
    return [*files, MANIFEST]


def _holds_cwd(d: Path) -> bool:
    """d exists and is the working directory or one above it."""
    try:
        cwd, d = Path.cwd(), d.resolve(strict=True)
    except OSError:
        return False
    return cwd == d or d in cwd.parents


def _stage(parent: Path, fill, src: Path, carry: dict) -> tuple[Path, dict]:
    """A temporary directory in parent holding fill's files, the carried files of src, and the
    manifest, each readable as a saved file is; (its path, name -> sha256)."""
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gpt-export-", dir=parent))
    try:
        files = {n: sha256_file(tmp / n) for n in fill(tmp)}
        for n in carry.keys() - files.keys():
            shutil.copyfile(src / n, tmp / n)
            files[n] = sha256_file(tmp / n)
        _write_manifest(tmp, files)
        for n in files:
            _readable(tmp / n)
        _readable(tmp, 0o777)
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, files


def _swap(tmp: Path, d: Path, ours: dict) -> None:
    """Rename d aside, tmp in, then delete what d held of gpt's (anything else stays aside)."""
    aside = d.parent / f".gpt-export-old-{secrets.token_hex(4)}"
    os.rename(d, aside)
    try:
        os.rename(tmp, d)
    except BaseException:  # put the old one back (only a SIGKILL here leaves it aside)
        os.rename(aside, d)
        raise
    for n in [*ours, MANIFEST]:
        (aside / n).unlink(missing_ok=True)
    try:
        aside.rmdir()
    except OSError:  # a file appeared while the export ran: it is kept there
        pass


def _in_place(d: Path, fill, ours: dict, stale: set, last: str | None) -> list[str]:
    for n in sorted(stale):
        if os.path.lexists(d / n) and n not in ours:
            raise ValueError(
                f"{d / n} was not written by gpt, and readers would take it for the tokenizer "
                "being saved; move it away or save to another directory"
            )
    listed, why = _manifest(d)
    if os.path.lexists(d / MANIFEST) and listed is None:
        raise ValueError(
            f"{d / MANIFEST} was not written by gpt ({why}); move it away or save elsewhere"
        )
    tmp, files = _stage(d, fill, d, {})  # inside d: the renames below stay on one filesystem
    try:
        if last in files:
            (d / last).unlink(missing_ok=True)
        for n in sorted(files, key=lambda n: n == last):
            os.replace(tmp / n, d / n)
        for n in stale & ours.keys():
            (d / n).unlink(missing_ok=True)
        kept = {n: h for n, h in ours.items() if n not in stale and n not in files}
        _write_manifest(d, {**kept, **files})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync_dir(d)
    return [*files, MANIFEST]


def _write_manifest(d: Path, files: dict) -> None:
    manifest = {"format": FORMAT, "note": NOTE, "files": dict(sorted(files.items()))}
    atomic_write_json(d / MANIFEST, manifest)
    _readable(d / MANIFEST)


def _readable(path: Path, mode: int = 0o666) -> None:
    """Readable as any saved file is (the atomic writer and mkdtemp make them private)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
