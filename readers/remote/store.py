"""The ``Store`` interface the readers and the packer use, and its local-folder implementation.

A store is a dataset folder seen as named objects (``index.json``,
``labels.npy``, ``train-000000.tar``, ...): names are relative to the
dataset's root, ``/``-separated. The same calls work on a local folder
(:class:`LocalStore`), on S3 and over HTTP
(:class:`readers.remote.fsspec_store.FsspecStore`), so code paths are shared
and a local folder tests them without a server.

Reads: :meth:`read` (at most ``max_bytes``: 256 MB for ``index.json``, as
locally, :data:`MAX_READ_BYTES` for anything else unless the caller says how
much it expects), :meth:`read_range`, :meth:`size`, :meth:`stat` (size and the
object's identity: ETag, modification time), :meth:`exists`, :meth:`list`,
and :meth:`stream` for large sequential reads (consecutive range requests of
``chunk_size`` bytes, the next ones fetched in the background while the
caller consumes the current one; each chunk is retried on its own, so a
stream survives the server going away and coming back).
Writes: :meth:`put` (a local file; multipart above ``part_size``),
:meth:`put_bytes`, :meth:`delete`. An object written by ``put`` appears
whole or not at all.

Stores pickle (DataLoader workers, DDP) and are safe to use after ``fork``:
remote clients are rebuilt per process.
"""

from __future__ import annotations

import builtins
import collections
import concurrent.futures as cf
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from readers.contract import spec
from readers.remote.errors import ObjectNotFoundError, RemoteError, RemoteIntegrityError, RemoteTooLargeError

__all__ = ["Store", "LocalStore", "RequestStats", "ObjectInfo", "DEFAULT_CHUNK", "DEFAULT_PART", "MAX_READ_BYTES",
           "read_limit"]

#: stream(): bytes per range request (large sequential GETs).
DEFAULT_CHUNK = 16 << 20
#: put(): multipart part size (S3's minimum is 5 MiB, maximum 10,000 parts).
DEFAULT_PART = 64 << 20
#: read(): the most bytes a whole-object read accepts when the caller does not say (an endless or
#: oversized response body is refused there instead of growing the process without bound).
MAX_READ_BYTES = 1 << 31


def read_limit(name: str, max_bytes: int | None = None) -> int:
    """The byte cap of ``read(name)``: ``max_bytes``, else 256 MB for index.json (as locally), else MAX_READ_BYTES."""
    if max_bytes is not None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        return max_bytes
    return spec.MAX_INDEX_JSON_BYTES if name.rsplit("/", 1)[-1] == spec.INDEX_NAME else MAX_READ_BYTES


@dataclass(frozen=True)
class ObjectInfo:
    """What a store says about one object: its size and, where the store gives them, its ETag and mtime.

    Two infos with the same ``identity()`` describe the same stored bytes as far
    as the store can tell (an overwrite changes the ETag or the modification time).
    """

    size: int
    etag: str | None = None
    mtime: str | None = None

    def identity(self) -> dict:
        return {"size": self.size, "etag": self.etag, "mtime": self.mtime}


class RequestStats:
    """Requests made and bytes received by one store in this process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reads = 0
        self.bytes_read = 0
        self.writes = 0

    def add_read(self, nbytes: int) -> None:
        with self._lock:
            self.reads += 1
            self.bytes_read += nbytes

    def add_write(self) -> None:
        with self._lock:
            self.writes += 1

    def __getstate__(self) -> dict:
        return {"reads": 0, "bytes_read": 0, "writes": 0}

    def __setstate__(self, state: dict) -> None:
        RequestStats.__init__(self)


class Store:
    """Named objects under one root URL. Subclasses implement the ``_``-prefixed primitives."""

    url: str = ""

    def __init__(self) -> None:
        self.stats = RequestStats()

    # ------------------------------------------------------------ names
    def url_of(self, name: str) -> str:
        """The full URL (or path) of object ``name``, as shown in messages."""
        return f"{self.url.rstrip('/')}/{name.lstrip('/')}"

    @property
    def identity(self) -> str:
        """What tells this store's objects apart from any other's (the cache keys on it)."""
        return self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # ------------------------------------------------------------ reads
    def read(self, name: str, *, max_bytes: int | None = None) -> bytes:
        """The whole object; :class:`RemoteTooLargeError` if it holds more than its cap (see :func:`read_limit`)."""
        limit = read_limit(name, max_bytes)
        data = self._read(name, limit)
        self.stats.add_read(len(data))
        if len(data) > limit:  # a primitive returns at most limit + 1 bytes
            raise self.too_large(name, limit)
        return data

    def too_large(self, name: str, limit: int, declared: int | None = None) -> RemoteTooLargeError:
        """The error for an object bigger than the ``limit`` bytes a read accepts."""
        what = f"declares {declared} bytes, more" if declared is not None else "sent more"
        return RemoteTooLargeError(f"{self.url_of(name)}: the object {what} than the {limit} bytes this read "
                                   f"accepts; refused (not a file of this dataset, or a misbehaving server)",
                                   limit=limit, declared=declared)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``start``; :class:`RemoteIntegrityError` if the object ends first."""
        if start < 0 or length < 0:
            raise ValueError(f"{self.url_of(name)}: bad range start={start} length={length}")
        if length == 0:
            return b""
        data = self._read_range(name, start, length)
        self.stats.add_read(len(data))
        if len(data) < length:
            raise RemoteIntegrityError(f"{self.url_of(name)}: asked for {length} bytes at {start}, got "
                                       f"{len(data)} (the object is shorter than expected)")
        if len(data) > length:
            raise RemoteIntegrityError(f"{self.url_of(name)}: asked for {length} bytes at {start}, the server "
                                       f"sent more (it ignored or misread the Range header)")
        return data

    def size(self, name: str) -> int:
        return self._stat(name).size

    def stat(self, name: str) -> ObjectInfo:
        """Size and identity (ETag, modification time where the store reports them) of ``name``."""
        return self._stat(name)

    def exists(self, name: str) -> bool:
        try:
            self._stat(name)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        """Sorted names of the objects whose name starts with ``prefix`` (recursive)."""
        return sorted(n for n in self._list(prefix) if n.startswith(prefix))

    def stream(self, name: str, start: int = 0, length: int | None = None, *,
               chunk_size: int = DEFAULT_CHUNK, readahead: int = 1) -> Iterator[bytes]:
        """Bytes ``[start, start + length)`` of the object as consecutive chunks of ``chunk_size``.

        Up to ``readahead`` further chunks are requested in the background while
        the caller consumes one, so the consumer never waits a round trip between
        chunks. Close the generator (or exhaust it) to stop the background requests.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        end = self.size(name) if length is None else start + length
        ranges = [(s, min(chunk_size, end - s)) for s in range(start, end, chunk_size)]
        if readahead < 1 or len(ranges) < 2:
            for s, n in ranges:
                yield self.read_range(name, s, n)
            return
        yield from self._stream_ahead(name, ranges, readahead)

    # inside Store, ``list`` names the method above: annotations below spell the type builtins.list
    def _stream_ahead(self, name: str, ranges: builtins.list[tuple[int, int]], readahead: int) -> Iterator[bytes]:
        pending: collections.deque[cf.Future] = collections.deque()
        todo = iter(ranges)
        pool = cf.ThreadPoolExecutor(max_workers=readahead, thread_name_prefix="store-readahead")
        try:
            for s, n in (r for _, r in zip(range(readahead + 1), todo)):
                pending.append(pool.submit(self.read_range, name, s, n))
            while pending:
                data = pending.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(self.read_range, name, *nxt))
                yield data
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ writes
    def put(self, name: str, local_path: str | os.PathLike, *, part_size: int = DEFAULT_PART,
            progress: Callable[[int], None] | None = None) -> None:
        """Upload the file ``local_path`` as ``name`` (multipart above ``part_size``); whole or not at all.

        ``progress(nbytes)`` is called with each increment sent (a retried
        attempt starts again from zero, so increments may add up to more).
        """
        self._put(name, Path(local_path), part_size, progress)
        self.stats.add_write()

    def put_bytes(self, name: str, data: bytes) -> None:
        self._put_bytes(name, bytes(data))
        self.stats.add_write()

    def delete(self, name: str) -> None:
        """Remove ``name``; a missing object is not an error."""
        self._delete(name)

    def close(self) -> None:
        """Release this process's connections (the store stays usable: they reopen on the next call)."""

    # ------------------------------------------------------------ primitives
    def _read(self, name: str, limit: int) -> bytes:
        """The object's bytes, at most ``limit + 1`` of them (more than ``limit``: the caller refuses it)."""
        raise NotImplementedError

    def _read_range(self, name: str, start: int, length: int) -> bytes:
        """The range's bytes, at most ``length + 1`` of them (more: the server ignored the range)."""
        raise NotImplementedError

    def _stat(self, name: str) -> ObjectInfo:
        raise NotImplementedError

    def _list(self, prefix: str) -> builtins.list[str]:
        raise NotImplementedError

    def _put(self, name: str, local_path: Path, part_size: int,
             progress: Callable[[int], None] | None = None) -> None:
        raise NotImplementedError

    def _put_bytes(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def _delete(self, name: str) -> None:
        raise NotImplementedError


class LocalStore(Store):
    """A local folder behind the :class:`Store` interface (writes: temp file, fsync, rename)."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__()
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, name: str) -> Path:
        path = self.root / name.lstrip("/")
        if ".." in Path(name).parts:
            raise ValueError(f"{name!r}: object names may not contain '..'")
        return path

    def _missing(self, name: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"{self.url_of(name)}: no such file")

    def _read(self, name: str, limit: int) -> bytes:
        try:
            with open(self._path(name), "rb") as f:
                return f.read(limit + 1)
        except FileNotFoundError:
            raise self._missing(name) from None

    def _read_range(self, name: str, start: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(name), os.O_RDONLY)
        except FileNotFoundError:
            raise self._missing(name) from None
        try:
            parts, got = [], 0
            while got < length:
                block = os.pread(fd, length - got, start + got)
                if not block:
                    break
                parts.append(block)
                got += len(block)
            return b"".join(parts)
        finally:
            os.close(fd)

    def _stat(self, name: str) -> ObjectInfo:
        try:
            st = self._path(name).stat()
        except FileNotFoundError:
            raise self._missing(name) from None
        if not os.path.isfile(self._path(name)):
            raise self._missing(name)
        # A replaced file (written to a temp file and renamed) has another inode and mtime.
        return ObjectInfo(st.st_size, etag=f"{st.st_dev}:{st.st_ino}", mtime=str(st.st_mtime_ns))

    def _list(self, prefix: str) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file()]

    def _write_atomic(self, name: str, write) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with spec.atomic_write(path, unique=True) as f:
            write(f)

    def _put(self, name: str, local_path: Path, part_size: int,
             progress: Callable[[int], None] | None = None) -> None:
        if not local_path.is_file():
            raise RemoteError(f"{local_path}: no such file to upload to {self.url_of(name)}")

        def copy(f) -> None:
            with open(local_path, "rb") as src:
                while block := src.read(8 << 20):
                    f.write(block)
                    if progress is not None:
                        progress(len(block))

        self._write_atomic(name, copy)

    def _put_bytes(self, name: str, data: bytes) -> None:
        self._write_atomic(name, lambda f: f.write(data))

    def _delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
