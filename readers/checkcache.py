"""A once-per-machine record of index checks that passed, so that opening an unchanged local
dataset again skips the O(N) checksum and value checks (:mod:`readers.spec`, :mod:`readers.checks`).

A record names what was checked (its ``kind`` and :data:`VERSION`), the dataset's folder, a hash
of its ``index.json`` as parsed, and the identity of each checked file from ``os.stat``:
(device, inode, size, mtime_ns, ctime_ns). Users cannot set ctime: any write to a file, or a
rename into its place, changes it, so a file that was edited (even with its mtime put back by
``os.utime``) no longer matches and is checked in full again.

Records live in ``$DATASET_PACKER_CACHE/checked/`` (default ``$XDG_CACHE_HOME/dataset-packer``
or ``~/.cache/dataset-packer``), one small file per record, written atomically. A folder that
cannot be made or written means no record, never an error. ``DATASET_PACKER_CHECK_CACHE=off``
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
import tempfile
from pathlib import Path
from typing import Any, Callable, TypeVar

__all__ = ["ENV_DIR", "ENV_SWITCH", "VERSION", "folder", "full_checks", "meta_digest", "passed", "record",
           "stat_key"]

log = logging.getLogger(__name__)

ENV_DIR = "DATASET_PACKER_CACHE"
ENV_SWITCH = "DATASET_PACKER_CHECK_CACHE"
#: Bump when what a check covers changes: records of older checks then no longer match.
VERSION = 1
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
    """Where records live; None when the record is off."""
    if _FULL.get() or os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF:
        return None
    base = os.environ.get(ENV_DIR)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "dataset-packer") if xdg else os.path.join(os.path.expanduser("~"), ".cache",
                                                                            "dataset-packer")
    return Path(base) / "checked"


def stat_key(path: str | os.PathLike) -> tuple[int, int, int, int, int] | None:
    """(device, inode, size, mtime_ns, ctime_ns) of ``path``; None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def meta_digest(meta: Any) -> str:
    """A hash of a parsed ``index.json``: a record holds for exactly that metadata."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()


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
    try:
        with open(_file(base, kind, parts), encoding="utf-8") as f:
            return f.read(len(text) + 1) == text
    except (OSError, ValueError):  # no record, an unreadable folder, a damaged record
        return False


def record(kind: str, parts: list) -> None:
    """Note that check ``kind`` of ``parts`` passed (nothing when the folder cannot be written)."""
    base = folder()
    if base is None:
        return
    text = _text(kind, parts)
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=base, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, _file(base, kind, parts))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.debug("cannot record a passed index check in %s: %s", base, exc)
