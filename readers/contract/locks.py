"""A pack writing a folder right now: the lock file it holds there, read by both sides.

A running pack holds an exclusive ``fcntl.flock`` on :data:`LOCK_NAME` in each folder it writes
(:class:`packer.output.OutputLock` takes it); the file holds the pack's pid, written when the pack
started. A killed pack leaves the file unlocked: stale, and ignored. The readers look here to say
"being packed by pid N" instead of "never finished" (:func:`readers.contract.spec.read_index`),
and ``pack-dataset info`` to tell a running pack from an interrupted one. Nothing here writes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_NAME", "try_lock", "lock_pid", "pack_in_progress", "lock_holder"]

#: The lock file a running pack holds in each folder it writes (its pid inside).
LOCK_NAME = ".pack-lock"


def try_lock(fd: int) -> bool:
    """Take the exclusive lock of the open lock file ``fd`` without waiting; False when a pack holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_pid(fd: int) -> int | str:
    """The pid written in the open lock file ``fd`` (``"unknown"`` before the holder wrote it)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else "unknown"


def pack_in_progress(folder: str | os.PathLike[str]) -> tuple[int | str, float] | None:
    """(pid, start time as a POSIX timestamp) of the pack holding ``folder``'s :data:`LOCK_NAME` right
    now; None when none does (no lock file, or a stale one a killed pack left). Writes nothing."""
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # no lock file (or an unreadable one: a pack would say why)
    try:
        if try_lock(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return lock_pid(fd), os.fstat(fd).st_mtime
    finally:
        os.close(fd)


def lock_holder(folder: str | os.PathLike[str]) -> int | str | None:
    """The pid of the pack holding ``folder``'s lock right now (``"unknown"`` if it wrote none yet), or None."""
    holder = pack_in_progress(folder)
    return None if holder is None else holder[0]
