"""A node-local cache of remote objects, shared by every process on the node.

    cache = NodeCache("/nvme/cache", limit="200GB")
    path = cache.fetch(store, "train-000042.tar", size=..., crc32=...)   # local path, complete
    with cache.open(store, "train-000042.tar") as path:                   # ... and pinned while used
        ...

Guarantees, across processes (DataLoader workers, DDP ranks, separate jobs)
that share ``cache_dir``:

* no torn file: an object is downloaded to ``<name>.partial`` and renamed
  when complete and verified (size, and CRC-32 when the caller knows it);
* never stale: beside each entry ``<name>.ident`` records what was
  downloaded (size, CRC-32, and the store's identity of the object: ETag and
  modification time). A cached copy is served only if it matches what the
  caller expects now: the CRC-32 the dataset's index records (no request
  needed), or, when the index records none or the copy was downloaded
  without one, the object's identity as the store reports it now (one
  HEAD). Otherwise it is downloaded again: a dataset overwritten under the
  same URL never yields the old bytes, or a mix;
* no full disk surprise: before a download the free space of the cache's
  file system is checked, and running out of space while writing is one
  :class:`CacheFullError` naming the cache folder, the bytes needed and what
  to do;
* downloaded once: a per-object download lock (``flock``) serialises
  fetches, a process that finds a download in progress waits for it and
  then uses its result;
* an interrupted download (killed process, network down) is resumed by the
  next fetch, part by part (see :mod:`readers.remote.download`);
* bounded: before a download, least-recently-used entries are evicted until
  the new object fits under ``limit`` (``"200GB"``, ``"500MiB"``, bytes);
  recency is the file's mtime, touched on every fetch;
* an entry in use is never evicted: :meth:`open` holds a shared ``flock`` on
  the entry's pin lock while the caller uses it, eviction only removes
  entries whose pin and download locks it can take exclusively without
  waiting. If pinned entries alone exceed the limit the cache goes over it
  (with a warning) rather than waiting, since the pinning process may be
  waiting on this one;
* a fetch never waits on a pin: the download lock and the pin lock are
  separate files. (With one lock, a fetch that found the object missing and
  queued for the download lock could end up behind the pins readers take
  the moment the download completes; a DataLoader worker holding such a pin
  while idle, waiting for its next batch request, then deadlocked the
  loader whose other worker was that fetch.)

Layout: ``<cache_dir>/objects/<store>/<name>`` (``<store>`` is a readable
slug of the URL plus a hash of the URL and endpoint) and
``<cache_dir>/locks/<hash>.lock`` (pins) and ``<hash>.fetch.lock`` (downloads);
lock files are empty and kept.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from readers.remote.config import parse_size
from readers.contract.safeio import atomic_write
from readers.remote.download import DEFAULT_PART_SIZE, TransferProgress, download_ranged, partial_paths
from readers.remote.errors import RemoteError, RemoteIntegrityError
from readers.remote.store import ObjectInfo, Store

log = logging.getLogger(__name__)

__all__ = ["NodeCache", "CacheFullError", "Pin"]

_SUFFIXES = (".partial", ".parts", ".ident")
_IDENT = ".ident"
#: Attempts of one fetch when the object changes while it is downloaded (replaced mid-download).
_CHANGED_TRIES = 2


class CacheFullError(RemoteError):
    """No room: an object larger than the whole cache limit, or the cache's disk is full."""


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def _try_flock(path: Path) -> int | None:
    """An exclusive lock on ``path`` if nobody holds it (fd to close), else None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class NodeCache:
    """Local copies of remote objects under ``cache_dir``, at most ``limit`` bytes (None: no limit)."""

    def __init__(self, cache_dir: str | os.PathLike, limit: int | str | None = None) -> None:
        self.dir = Path(cache_dir)
        self.limit = parse_size(limit) if limit is not None else None
        self.objects = self.dir / "objects"
        self.locks = self.dir / "locks"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"NodeCache({str(self.dir)!r}, limit={self.limit})"

    # ------------------------------------------------------------ names
    def path_for(self, store: Store, name: str) -> Path:
        """Where object ``name`` of ``store`` lives in the cache (whether or not it is there)."""
        digest = hashlib.sha1(store.identity.encode()).hexdigest()[:12]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", store.url.split("://", 1)[-1]).strip("_")[-60:]
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts or not parts:
            raise ValueError(f"{name!r}: not a valid object name")
        if parts[-1].endswith(_SUFFIXES):
            raise ValueError(f"{name!r}: names ending in {' or '.join(_SUFFIXES)} are reserved by the cache")
        return self.objects.joinpath(f"{slug}-{digest}", *parts)

    def _lock_path(self, entry: Path) -> Path:
        """The entry's pin lock: shared while readers use the entry, exclusive while it is evicted."""
        rel = entry.relative_to(self.objects).as_posix()
        return self.locks / (hashlib.sha1(rel.encode()).hexdigest() + ".lock")

    def _fetch_lock_path(self, entry: Path) -> Path:
        """The entry's download lock: exclusive while one process downloads it (or evicts it)."""
        return self._lock_path(entry).with_suffix(".fetch.lock")

    # ------------------------------------------------------------ fetch
    def fetch(self, store: Store, name: str, *, size: int | None = None, crc32: int | None = None,
              workers: int = 4, part_size: int = DEFAULT_PART_SIZE, progress: TransferProgress | None = None) -> Path:
        """Local path of a complete copy of ``name``, downloading it first if needed.

        ``size`` and ``crc32`` (from the dataset's index) are what the copy
        must be: a cached copy recorded with another size or CRC-32 (the
        dataset was overwritten) is downloaded again; without ``crc32`` the
        cached copy must match the object's identity (size, ETag, mtime) the
        store reports now. Both are checked on download. Not pinned: use
        :meth:`open` to keep the entry from being evicted while it is used.
        """
        path = self.path_for(store, name)
        if self._valid(store, name, path, size, crc32):
            _touch(path)
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        # Waits while another process downloads it, never behind readers' pins (see the module notes).
        with _flock(self._fetch_lock_path(path), fcntl.LOCK_EX):
            if self._valid(store, name, path, size, crc32):
                _touch(path)
                return path
            for attempt in range(1, _CHANGED_TRIES + 1):
                info = store.stat(name)
                if size is not None and info.size != size:
                    raise RemoteIntegrityError(f"{store.url_of(name)}: the object holds {info.size} bytes, the "
                                               f"index says {size} (replaced or damaged object)")
                _ident_path(path).unlink(missing_ok=True)
                path.unlink(missing_ok=True)  # a stale copy
                try:
                    self._download(store, name, path, info, crc32, workers, part_size, progress)
                except RemoteIntegrityError:
                    if attempt == _CHANGED_TRIES or store.stat(name).identity() == info.identity():
                        raise
                    log.warning("cache: %s changed while it was downloaded; downloading it again",
                                store.url_of(name))
                    continue
                if crc32 is None and store.stat(name).identity() != info.identity():
                    # Nothing to check the bytes against but the store's word: a change under us may have mixed them.
                    path.unlink(missing_ok=True)
                    if attempt == _CHANGED_TRIES:
                        raise RemoteIntegrityError(f"{store.url_of(name)}: the object changed while it was "
                                                   "downloaded, twice; try again when it is no longer being written")
                    log.warning("cache: %s changed while it was downloaded; downloading it again",
                                store.url_of(name))
                    continue
                _write_ident(path, {"size": info.size, "crc32": crc32, "remote": info.identity()})
                _touch(path)
                return path
        raise AssertionError("unreachable")  # the loop returns or raises

    def _download(self, store: Store, name: str, path: Path, info: ObjectInfo, crc32: int | None, workers: int,
                  part_size: int, progress: TransferProgress | None) -> None:
        self._reserve(path, info.size)
        self._check_free(store, name, path, info.size)
        log.info("cache: downloading %s (%d bytes)", store.url_of(name), info.size)
        try:
            download_ranged(store, name, path, info.size, crc32=crc32, identity=info.identity(), workers=workers,
                            part_size=part_size, progress=progress)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise self._full(store, name, path, info.size) from exc

    def _check_free(self, store: Store, name: str, path: Path, size: int) -> None:
        """CacheFullError now, before any request, when the cache's file system cannot hold the download."""
        partial, _ = partial_paths(path)
        try:
            allocated = partial.stat().st_blocks * 512  # what a resumed download already wrote
        except FileNotFoundError:
            allocated = 0
        if shutil.disk_usage(self.dir).free < size - allocated:
            raise self._full(store, name, path, size)

    def _full(self, store: Store, name: str, path: Path, size: int) -> CacheFullError:
        free = shutil.disk_usage(self.dir).free
        limit = (f"cache_limit is {self.limit} bytes: set it below the free space" if self.limit is not None
                 else "no cache_limit is set: set one below the free space")
        return CacheFullError(f"{self.dir}: no space left on the cache's disk for {store.url_of(name)} "
                              f"({size} bytes needed, {free} free); {limit}, or free disk space "
                              f"(pinned entries and read-ahead can take the cache over its limit)")

    @contextlib.contextmanager
    def open(self, store: Store, name: str, **fetch_kw) -> Iterator[Path]:
        """``fetch`` and keep the entry pinned (never evicted) until the block ends."""
        pin = self.pin(store, name, **fetch_kw)
        try:
            yield pin.path
        finally:
            pin.release()

    def pin(self, store: Store, name: str, **fetch_kw) -> "Pin":
        """``fetch`` and pin the entry until ``Pin.release()`` (or the process ends).

        The pin is a shared ``flock`` on the entry's lock file, held by an open
        file descriptor: eviction skips the entry while any process holds one.
        """
        while True:
            path = self.fetch(store, name, **fetch_kw)
            fd = os.open(self._lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            if path.exists():  # not evicted between fetch and the lock
                return Pin(path, fd)
            os.close(fd)

    @staticmethod
    def _valid(store: Store, name: str, path: Path, size: int | None, crc32: int | None) -> bool:
        """Whether the cached copy at ``path`` is the object the caller expects now (see the module notes)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        if size is not None and st.st_size != size:
            return False
        rec = _read_ident(path)
        if rec is None or rec.get("size") != st.st_size:
            return False  # no record of what it is (an entry from an older version, or a crash): fetch again
        if crc32 is not None and rec.get("crc32") is not None:
            return rec["crc32"] == crc32
        # Unverified (downloaded without a CRC-32, as verify does to report damage itself), or nothing to
        # verify against: the copy must be the object the store holds now.
        return rec.get("remote") == store.stat(name).identity()

    # ------------------------------------------------------------ size limit
    def entries(self) -> list[tuple[Path, int, float]]:
        """(path, bytes, mtime) of every file in the cache, partial downloads included."""
        out = []
        for dirpath, _dirs, files in os.walk(self.objects):
            listed = set(files)
            for f in files:
                p = Path(dirpath, f)
                try:
                    st = p.stat()
                except FileNotFoundError:
                    # A download completed between the listing and this stat: its .partial was renamed to
                    # the final name, which the listing may not have. Count it there, or a reservation
                    # made now misses a whole object and the cache goes over its limit.
                    final = f[: -len(_SUFFIXES[0])] if f.endswith(_SUFFIXES[0]) else None
                    if final is None or final in listed:
                        continue  # evicted, or the final name is counted on its own
                    p = p.with_name(final)
                    try:
                        st = p.stat()
                    except FileNotFoundError:
                        continue
                out.append((p, st.st_size, st.st_mtime))
        return out

    def usage(self) -> int:
        """Bytes the cache holds now (partial downloads count at their full size)."""
        return sum(n for _, n, _ in self.entries())

    def _reserve(self, path: Path, size: int) -> None:
        """Make room for ``size`` more bytes and claim it by creating ``path``'s preallocated .partial.

        Runs under a cache-wide lock so that two processes filling the cache at
        once both count each other's claims. Called holding ``path``'s download lock.
        """
        partial, _ = partial_paths(path)
        if self.limit is not None and size > self.limit:
            raise CacheFullError(f"{path.name}: {size} bytes is more than the whole cache limit "
                                 f"({self.limit} bytes in {self.dir}); raise cache_limit")
        with _flock(self.locks / "_evict.lock", fcntl.LOCK_EX):
            have = partial.stat().st_size if partial.exists() else 0
            if self.limit is not None:
                self._evict(self.usage() - have + size - self.limit, keep=path)
            with open(partial, "ab") as f:  # a resumable download keeps its bytes
                f.truncate(size)

    def _evict(self, need: int, keep: Path) -> int:
        """Remove least-recently-used unpinned entries until ``need`` bytes are freed."""
        if need <= 0:
            return 0
        freed = 0
        groups: dict[Path, list[tuple[Path, int, float]]] = {}
        for p, n, mtime in self.entries():
            base = p.with_name(p.name[: -len(s)]) if (s := next((x for x in _SUFFIXES if p.name.endswith(x)), "")) \
                else p
            groups.setdefault(base, []).append((p, n, mtime))
        order = sorted(groups, key=lambda b: max(m for _, _, m in groups[b]))
        for base in order:
            if freed >= need:
                break
            if base == keep:
                continue
            fd = _try_flock(self._lock_path(base))
            if fd is None:
                continue  # pinned by a reader
            fetch_fd = _try_flock(self._fetch_lock_path(base))
            if fetch_fd is None:
                os.close(fd)
                continue  # being downloaded
            try:
                for p, n, _ in groups[base]:
                    p.unlink(missing_ok=True)
                    freed += n
                log.info("cache: evicted %s", base.relative_to(self.objects))
            finally:
                os.close(fetch_fd)
                os.close(fd)
        if freed < need:
            log.warning("cache %s: %d bytes over its limit (%d bytes); the rest is in use", self.dir,
                        need - freed, self.limit)
        return freed


class Pin:
    """A cache entry that is not evicted until :meth:`release` (closing the lock's descriptor)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd  # None once released

    def release(self) -> None:
        # In a forked child this closes the child's copy only; the lock lasts while any copy is open.
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"Pin({str(self.path)!r}, {'held' if self._fd is not None else 'released'})"


def _ident_path(path: Path) -> Path:
    return path.with_name(path.name + _IDENT)


def _read_ident(path: Path) -> dict | None:
    try:
        rec = json.loads(_ident_path(path).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _write_ident(path: Path, rec: dict) -> None:
    """Record what the entry at ``path`` holds (written whole: a temp file renamed over the old record)."""
    with atomic_write(_ident_path(path), "w", durable=False, unique=True) as f:
        f.write(json.dumps(rec, sort_keys=True))


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except FileNotFoundError:
        pass
