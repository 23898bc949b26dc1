"""An exclusive lock on a run directory, so that two gpt-train processes never write one run.

The lock is the OS's (``fcntl.flock`` on ``<dir>/gpt-train.lock``), held for the life of the
process: it cannot outlive its holder, even one killed with SIGKILL. The file also records
the holder's PID, for the message a second writer gets, and a PID left behind by a process
that died without releasing (the OS has already dropped its lock) tells the next run that it
takes over a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .errors import LockError

LOCK_FILE = "gpt-train.lock"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs now (another user's counts; a pid no system has, not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def in_use(directory) -> str | None:
    """The message a second writer gets if another gpt-train holds ``directory`` now (a
    probe: the lock is taken and given back at once), else None."""
    path = Path(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None  # no lock file (or none we may open): nobody to name
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _busy(path, _read_pid(fd))
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _busy(path: Path, holder) -> str:
    who = f"PID {holder}" if holder else "another process"
    return (
        f"{path.parent} is in use by another gpt-train ({who} holds {path}); wait for it to "
        "finish, stop it, or choose another --out-dir"
    )


class RunLock:
    """``with RunLock(dir) as lock``: lock.note is a message when a stale lock was taken over."""

    def __init__(self, directory):
        self.path = Path(directory) / LOCK_FILE
        self.fd: int | None = None
        self.note: str | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise LockError(_busy(self.path, holder)) from None
        except OSError as e:  # e.g. a file system without locks
            os.close(fd)
            raise LockError(
                f"cannot lock {self.path} ({e.strerror}); put --out-dir on a local file system"
            ) from None
        old = _read_pid(fd)
        if old and old != os.getpid():
            state = "still running but not holding it" if pid_alive(old) else "no longer running"
            self.note = (
                f"taking over the stale lock {self.path} of PID {old} ({state}; it "
                "did not exit cleanly)"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)  # a clean exit leaves no PID behind (no "stale" next time)
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunLock:  # noqa: PYI034 (no typing.Self on 3.10)
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
