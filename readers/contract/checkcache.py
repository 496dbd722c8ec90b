"""A once-per-machine record of index checks that passed, so that opening an unchanged local
dataset again skips the O(N) checksum and value checks (:mod:`readers.contract.spec`, :mod:`readers.contract.checks`).

A record names what was checked (its ``kind`` and :data:`VERSION`), the dataset's folder, a hash
of its ``index.json`` as parsed, and the identity of each checked file: (device, inode, size,
mtime_ns, ctime_ns) from ``fstat`` and a CRC-32 of :data:`SAMPLED_PAGES` of its pages (the first,
the last and pages spread evenly between; all of them in a file of that many pages or fewer).
Users cannot set ctime: a ``write()`` to a file, or a rename into its place, changes it, so a
file edited that way (even with its mtime put back by ``os.utime``) no longer matches and is
checked in full again. A write through a shared writable mapping (``np.load(mmap_mode="r+")``)
changes ctime only at the first write fault of a page: later writes to a page already dirty
change no stat field, so a record written while another process holds such a mapping may
outlive the edits it makes afterwards; the sampled pages catch those that touch one of them,
and the labels are range-checked on every open whatever is recorded
(:func:`readers.contract.checks.check_index`), so no label outside the classes is ever served.

Records live in ``$DATASET_PACKER_CACHE/checked/`` (default ``$XDG_CACHE_HOME/dataset-packer``
or ``~/.cache/dataset-packer``), one small file per record, written atomically. A folder that
cannot be made or written means no record, never an error. Records are opened without blocking
and without following a link, and used only when they are regular files owned by the user; a
record folder (or a folder above it, without the sticky bit) that other users can write, or that
is not the user's, is not used: every open then checks in full, and one warning per process
names the folder. ``DATASET_PACKER_CHECK_CACHE=off``
turns the record off (every open checks in full); :func:`full_checks` does so for one call
(``pack-dataset verify`` checks in full whatever is recorded: it is the command that finds
damage that changes no file's metadata, such as a failing disk).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from readers.contract.safeio import DatasetFormatError, atomic_write, checksum, member_path

__all__ = ["ENV_DIR", "ENV_SWITCH", "SAMPLED_PAGES", "VERSION", "files_key", "folder", "full_checks", "meta_digest",
           "passed", "record", "stat_key"]

log = logging.getLogger(__name__)

ENV_DIR = "DATASET_PACKER_CACHE"
ENV_SWITCH = "DATASET_PACKER_CHECK_CACHE"
#: Bump when what a check covers changes: records of older checks then no longer match.
VERSION = 2  # 2: each file's identity holds a CRC-32 of sampled pages
#: Pages of 4 KiB whose CRC-32 a file's identity holds (first, last, spread evenly between).
SAMPLED_PAGES = 16
_PAGE = 4096
_OFF = {"off", "0", "no", "false"}
_FULL: contextvars.ContextVar[bool] = contextvars.ContextVar("dataset_packer_full_checks", default=False)

F = TypeVar("F", bound=Callable[..., Any])


def full_checks(func: F) -> F:
    """Decorator: inside ``func`` every check runs in full and nothing is recorded."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = _FULL.set(True)
        try:
            return func(*args, **kwargs)
        finally:
            _FULL.reset(token)
    return wrapper  # type: ignore[return-value]


def folder() -> Path | None:
    """Where records live; None when the record is off, or when the folder is not safe to use
    (:func:`_unsafe`: then one warning per process names it, and every open checks in full)."""
    if _FULL.get() or os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF:
        return None
    base = os.environ.get(ENV_DIR)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "dataset-packer") if xdg else os.path.join(os.path.expanduser("~"), ".cache",
                                                                            "dataset-packer")
    path = Path(base) / "checked"
    why = _unsafe(path)
    if why is None:
        return path
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        log.warning("%s: %s, so the record of passed index checks is not used (every open checks in full): "
                    "make it yours and writable by you alone (chmod 700), or set %s to another folder",
                    path, why, ENV_DIR)
    return None


_WARNED: set[str] = set()


def _unsafe(path: Path) -> str | None:
    """Why the record folder ``path`` must not be used, or None: anyone who can write it (or swap
    it: write a folder above it that has no sticky bit) could make a damaged dataset open
    unchecked. A folder not made yet is judged once :func:`record` made it (mode 0o700)."""
    uid = os.getuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror or exc})"
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            return "is not a folder (a link or a file)"
        if st.st_uid != uid:
            return f"belongs to another user (uid {st.st_uid})"
        if _others_write(st):
            return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    for above in path.parents:
        try:
            up = os.stat(above)
        except OSError:
            continue  # not made yet (record makes it), or not ours to look at: the folders below decide
        if _others_write(up) and not up.st_mode & stat.S_ISVTX:
            return f"lies in {above}, which other users can write (mode {stat.S_IMODE(up.st_mode):o})"
    return None


def _others_write(st: os.stat_result) -> bool:
    """Writable by all users, or by a group other than the user's own (a user-private group's
    ``umask 002`` folders stay usable)."""
    return bool(st.st_mode & 0o002 or st.st_mode & 0o020 and st.st_gid != os.getgid())


def stat_key(path: str | os.PathLike) -> tuple[int, int, int, int, int, int] | None:
    """(device, inode, size, mtime_ns, ctime_ns, CRC-32 of the sampled pages) of the regular file
    ``path`` (opened without blocking; see the module docstring); None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        pages = -(-st.st_size // _PAGE)
        crc = 0
        for k in sorted({round(i * (pages - 1) / (SAMPLED_PAGES - 1)) for i in range(SAMPLED_PAGES)}
                        if pages > SAMPLED_PAGES else range(pages)):
            crc = checksum(os.pread(fd, _PAGE, k * _PAGE), crc)
    except OSError:
        return None
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, crc


def meta_digest(meta: Any) -> str:
    """A hash of a parsed ``index.json``: a record holds for exactly that metadata."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()


def files_key(root: str | os.PathLike[str], meta: Any, files: Mapping[str, str]) -> list[Any] | None:
    """What a record for the local dataset ``root`` is made of (the ``parts`` of :func:`passed` and
    :func:`record`): its folder, :func:`meta_digest` of ``meta`` (or ``meta`` itself when it is that
    digest), and ``[name, stat_key]`` of each of its ``files`` (name -> file name in ``root``), by
    name; None when one cannot be stat'ed or leaves the folder (the open check refuses it)."""
    out = []
    for name in sorted(files):
        try:  # a name that leaves the folder (a link out) is never opened here
            path = member_path(root, files[name], "dataset file")
        except (DatasetFormatError, OSError):
            return None
        key = stat_key(path)
        if key is None:
            return None
        out.append([name, list(key)])
    return [os.path.abspath(root), meta if isinstance(meta, str) else meta_digest(meta), out]


def _text(kind: str, parts: list) -> str:
    return json.dumps([VERSION, kind, parts], default=str)


def _file(base: Path, kind: str, parts: list) -> Path:
    """One record per check kind and dataset (``parts[0]``, its folder): a re-pack replaces it,
    so the folder holds at most one small file per kind for each dataset opened on this machine."""
    slot = json.dumps([VERSION, kind, parts[0] if parts else None], default=str)
    return base / (hashlib.sha256(slot.encode()).hexdigest() + ".json")


def passed(kind: str, parts: list) -> bool:
    """Whether a check ``kind`` of exactly ``parts`` (``parts[0]``: the dataset) passed on this machine before."""
    base = folder()
    if base is None:
        return False
    text = _text(kind, parts)
    try:  # never blocks (a FIFO in its place) nor follows a link; only the user's own regular file
        fd = os.open(_file(base, kind, parts), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # no record, an unreadable folder, a link
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return False
        return os.read(fd, len(text) + 1) == text.encode()
    except OSError:  # a damaged record
        return False
    finally:
        os.close(fd)


def record(kind: str, parts: list) -> None:
    """Note that check ``kind`` of ``parts`` passed (nothing when the folder cannot be written)."""
    base = folder()
    if base is None:
        return
    text = _text(kind, parts)
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        with atomic_write(_file(base, kind, parts), "w", durable=False, unique=True, perm=0o600,
                          encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        log.debug("cannot record a passed index check in %s: %s", base, exc)
