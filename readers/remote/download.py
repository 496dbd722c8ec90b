"""Parallel, resumable ranged download of one object into a local file.

For the big single data files (``data.mdb``, ``data.h5``, ``images.npy``)
and for cache fills: the object is split into parts of ``part_size`` bytes,
``workers`` threads fetch parts with range GETs and write each at its offset
into ``<dest>.partial`` (preallocated to the full size), and every finished
part is recorded in ``<dest>.parts``. An interrupted download (exception,
Ctrl-C, SIGKILL, network down past the retry budget) leaves both files; the
next call with the same ``dest`` fetches only the missing parts. At the end
the size (and the CRC-32, when given) is verified and ``.partial`` is renamed
to ``dest``: a reader never sees a torn file under the final name.

Callers that share ``dest`` between processes must serialise calls (the
cache does, with a per-object lock).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from readers.contract import spec
from readers.contract.safeio import publish
from readers.remote.errors import RemoteIntegrityError
from readers.remote.store import Store

log = logging.getLogger(__name__)

__all__ = ["download_ranged", "partial_paths", "DEFAULT_PART_SIZE"]

DEFAULT_PART_SIZE = 16 << 20
#: At most one fdatasync of the partial file per this many seconds (before recording parts).
SYNC_EVERY_S = 1.0

#: ``progress(bytes done, bytes in all)`` of a download (readers.remote.cache and .files pass it on)
TransferProgress = Callable[[int, int], None]


def partial_paths(dest: Path) -> tuple[Path, Path]:
    """(data file being filled, parts journal) of a download to ``dest``."""
    return dest.with_name(dest.name + ".partial"), dest.with_name(dest.name + ".parts")


def _load_journal(journal: Path, header: dict) -> set[int]:
    """Parts already on disk, if the journal belongs to this very download (same object, size, parts)."""
    try:
        lines = journal.read_text().split("\n")
    except FileNotFoundError:
        return set()
    try:
        if not _same_download(json.loads(lines[0]), header):
            log.info("%s: the parts on disk belong to another download (another version of the object, or "
                     "other part sizes); starting over", header["url"])
            return set()
    except (json.JSONDecodeError, IndexError):
        return set()
    # The last element is "" after a complete line, or a torn line after a kill: skip it.
    return {int(x) for x in lines[1:-1] if x.isdigit()}


def _same_download(old: object, new: dict) -> bool:
    """Whether a journal header describes this download: same URL, size, part size and object identity.

    A CRC-32 only one side knows does not tell them apart (the caller may learn it later).
    """
    if not isinstance(old, dict):
        return False
    if any(old.get(k) != new.get(k) for k in ("url", "size", "part_size", "identity")):
        return False
    return old.get("crc32") is None or new.get("crc32") is None or old.get("crc32") == new.get("crc32")


def download_ranged(store: Store, name: str, dest: str | os.PathLike, size: int, *,
                    crc32: int | None = None, identity: dict | None = None, workers: int = 4,
                    part_size: int = DEFAULT_PART_SIZE, progress: TransferProgress | None = None) -> Path:
    """Download object ``name`` of ``store`` (``size`` bytes) to ``dest``, resuming a previous attempt.

    ``identity`` (the object's ``ObjectInfo.identity()``: size, ETag, mtime)
    and ``crc32`` go into the ``.parts`` header with the URL and the part
    size: parts left by a download of another version of the object (replaced
    since) are never reused, the download starts over instead.

    ``progress(done_bytes, total_bytes)`` is called in this thread after each
    part (and once at the start); an exception it raises stops the download,
    which a later call resumes.
    """
    dest = Path(dest)
    if workers < 1 or part_size < 1:
        raise ValueError(f"workers and part_size must be >= 1, got {workers}, {part_size}")
    partial, journal = partial_paths(dest)
    header = {"url": store.url_of(name), "size": size, "part_size": part_size, "crc32": crc32,
              "identity": identity}
    nparts = -(-size // part_size)
    done = _load_journal(journal, header) if partial.exists() else set()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != size:
            done = set()
            os.ftruncate(fd, size)
        if not done:
            journal.write_text(json.dumps(header) + "\n")
        else:
            log.info("%s: resuming download, %d of %d parts already here", store.url_of(name), len(done), nparts)
        _fetch_parts(store, name, fd, journal, size, part_size, sorted(set(range(nparts)) - done),
                     workers, progress)
    finally:
        os.close(fd)
    _verify(store, name, partial, journal, size, crc32)
    publish(partial, dest, durable=False)  # its CRC checked above; a cache file: atomic for readers
    journal.unlink(missing_ok=True)
    return dest


def _part_bytes(i: int, size: int, part_size: int) -> int:
    return min(part_size, size - i * part_size)


def _fetch_parts(store: Store, name: str, fd: int, journal: Path, size: int, part_size: int,
                 todo: list[int], workers: int, progress: TransferProgress | None) -> None:
    done_bytes = size - sum(_part_bytes(i, size, part_size) for i in todo)
    if progress is not None:
        progress(done_bytes, size)

    def fetch(i: int) -> int:
        start, n = i * part_size, _part_bytes(i, size, part_size)
        data = store.read_range(name, start, n)
        view, off = memoryview(data), 0
        while off < n:
            off += os.pwrite(fd, view[off:], start + off)
        return i

    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ranged-download")
    unsynced: list[int] = []
    last_sync = time.monotonic()
    try:
        # At most `workers` parts in memory: submit as slots free up.
        pending: set[cf.Future] = set()
        queue = iter(todo)
        with open(journal, "a") as jf:

            def record(force: bool) -> None:
                # The journal must never name a part whose bytes could still be lost, so parts are
                # recorded after an fdatasync; one sync per second at most keeps that cheap.
                nonlocal last_sync
                if unsynced and (force or time.monotonic() - last_sync > SYNC_EVERY_S):
                    os.fdatasync(fd)
                    jf.write("".join(f"{i}\n" for i in unsynced))
                    jf.flush()
                    unsynced.clear()
                    last_sync = time.monotonic()

            try:
                while True:
                    while len(pending) < workers and (i := next(queue, None)) is not None:
                        pending.add(pool.submit(fetch, i))
                    if not pending:
                        break
                    finished, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    for fut in finished:
                        i = fut.result()
                        unsynced.append(i)
                        done_bytes += _part_bytes(i, size, part_size)
                    record(force=False)
                    if progress is not None:
                        progress(done_bytes, size)
            finally:
                record(force=True)  # keep what arrived, even when stopping on an error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _verify(store: Store, name: str, partial: Path, journal: Path, size: int, crc32: int | None) -> None:
    got = partial.stat().st_size
    if got != size:
        raise RemoteIntegrityError(f"{store.url_of(name)}: downloaded {got} bytes, expected {size}")
    if crc32 is not None:
        actual = spec.file_checksum(partial)
        if actual != crc32:
            partial.unlink(missing_ok=True)
            journal.unlink(missing_ok=True)
            raise RemoteIntegrityError(f"{store.url_of(name)}: CRC-32 of the download is {actual:08x}, "
                                       f"expected {crc32:08x} (damaged object)")
