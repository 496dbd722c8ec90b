"""``Store`` over S3 (s3fs), Google Cloud Storage (gcsfs), Azure Blob Storage (adlfs) and HTTP(S)
(fsspec's aiohttp filesystem).

Why fsspec + s3fs and not obstore: see docs/remote.md (measured with
benchmarks/bench_remote_clients.py). In short: obstore is faster for many
small requests, but a forked child of a process that used it hangs on its
first request, and PyTorch DataLoader workers are forked; for the large
sequential GETs that streaming and caching use, the two are equally fast.

The filesystem object is built lazily, once per process (s3fs refuses to be
used across ``fork``), with the client's own retries switched off: every
call goes through :class:`readers.remote.retry.Retrier`. Reads (GET, HEAD,
LIST) run as coroutines on fsspec's event loop with the time the call has
left as a timeout (cancelled when it runs out: the wall-clock deadline), and
GETs read the body in pieces up to the byte cap of the read (a range: its
length; a whole object: :func:`readers.remote.store.read_limit`), so neither
a trickling nor an endless response holds a call or memory without bound. Request signing,
credential lookup (environment, profiles, ``storage_options``) and multipart
uploads are s3fs's and botocore's. GCS and Azure go through the same
primitives of their fsspec filesystems (``_info``, ``_find``, ``_cat_file``
with a byte range, ``put_file``): gcsfs's plain JSON-API client
(``gcsfs.core.GCSFileSystem``; the package's default class first probes each
bucket's type over gRPC, which waits 60 s on an emulator or a network
without it) and adlfs's ``AzureBlobFileSystem``, their retries off as well.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from readers.remote.config import OBJECT_STORES, RemoteURL, store_settings
from readers.remote.errors import (
    BucketNotFoundError,
    ObjectNotFoundError,
    ReadOnlyStoreError,
    RemoteAuthError,
    RemoteError,
    RemoteIntegrityError,
)
from readers.remote.retry import Retrier, RetryPolicy
from readers.remote.store import ObjectInfo, Store

__all__ = ["FsspecStore", "close_filesystem"]

T = TypeVar("T")

#: Bytes taken from a response body per read while filling a bounded buffer.
_PIECE = 1 << 20

log = logging.getLogger(__name__)

#: Clients inherited from a parent process through fork (see FsspecStore.fs).
_INHERITED: list[Any] = []
#: botocore sessions by the settings they were made with (see _share_session).
_SESSIONS: dict[str, Any] = {}


def _share_session(fs: Any) -> None:
    """Give ``fs`` the botocore session earlier clients with the same settings used.

    A new session parses botocore's S3 service model and endpoint rules again
    (0.1-0.3 s here); a session holds no connection and no event loop, so one
    per process serves every client, and DataLoader workers forked after the
    parent read the index start their clients from the parent's session
    (measured: a worker's first request 0.20 s -> 0.11 s).
    """
    if not hasattr(fs, "_session_is_owned") or getattr(fs, "session", None) is not None:
        return  # another s3fs version: let it make its own
    import json

    import aiobotocore.session

    # A session caches the credentials it resolved: one made under other AWS_* variables is not this one's.
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    key = json.dumps([fs.kwargs, env], sort_keys=True, default=str)
    session = _SESSIONS.get(key)
    if session is None:
        session = _SESSIONS[key] = aiobotocore.session.AioSession(**fs.kwargs)
    fs.session, fs._session_is_owned = session, False


class FsspecStore(Store):
    """Objects under ``s3://`` / ``gs://bucket/prefix``, ``az://`` / ``abfs://container/prefix`` or
    ``http(s)://host/prefix``."""

    def __init__(self, url: RemoteURL, storage_options: Mapping[str, Any] | None = None,
                 retry: RetryPolicy | None = None) -> None:
        super().__init__()
        self.remote = url
        self.url = url.root
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.read_only = url.scheme not in OBJECT_STORES
        self.object_store = url.scheme in OBJECT_STORES
        self._fs_pid: int | None = None
        self._fs: Any = None
        self._bucket_seen = False  # the bucket answered once: a 404 is then about the object
        self._lock = threading.Lock()
        self._retrier = Retrier(self.retry, self._credential_sources)
        if self.object_store:  # validate options now (cheap), not in a worker
            try:
                self._settings = store_settings(url.scheme, self.storage_options,
                                                connect_timeout_s=self.retry.connect_timeout_s,
                                                read_timeout_s=self.retry.read_timeout_s)
            except RemoteAuthError as exc:  # no account named (az://): say which URL asked
                raise RemoteAuthError(f"{self.url}: {exc}") from None

    # ------------------------------------------------------------ client per process
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _fs_pid=None, _lock=None, _retrier=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._retrier = Retrier(self.retry, self._credential_sources)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of this process (built on first use after start or fork)."""
        pid = os.getpid()
        if self._fs is None or self._fs_pid != pid:
            if self._fs_pid != pid:
                self._lock = threading.Lock()  # an inherited lock may be held by a thread that is gone
                if self._fs is not None:
                    # The parent's client, inherited through fork: never used or closed here. Dropping it
                    # would run its session finalizer against the parent's event loop, which does not run
                    # in this process (asyncio logs "attached to a different loop" errors); keep it.
                    _INHERITED.append(self._fs)
                    self._fs = None
            with self._lock:
                if self._fs is None or self._fs_pid != pid:
                    self._fs, self._fs_pid = self._make_fs(), pid
        return self._fs

    def close(self) -> None:
        """Close this process's client and its connections now (not at garbage collection)."""
        if self._fs_pid != os.getpid():
            self._fs = None  # another process's client (inherited through fork): never closed here
            return
        with self._lock:  # not while another thread makes this process's client
            fs, self._fs = self._fs, None
        if fs is None:
            return
        try:
            close_filesystem(fs)
        except Exception as exc:  # noqa: BLE001 - closing must not fail a caller that is done
            log.debug("%s: closing the client: %s", self.url, exc)

    def _make_fs(self) -> Any:
        if self.remote.scheme == "s3":
            try:
                import s3fs
            except ImportError:
                raise RemoteError(f"{self.url}: reading s3:// needs s3fs: pip install 'dataset-packer[remote]'") \
                    from None
            fs = s3fs.S3FileSystem(**self._settings.kwargs)
            fs.retries = 1  # s3fs's own retry loop: off, Retrier decides
            _share_session(fs)
            return fs
        if self.remote.scheme == "gs":
            try:
                from gcsfs.core import GCSFileSystem
            except ImportError:
                raise RemoteError(f"{self.url}: reading gs:// needs gcsfs: pip install 'dataset-packer[remote]'") \
                    from None
            with warnings.catch_warnings():  # "project not set": only listing or making buckets needs one
                warnings.filterwarnings("ignore", "GCS project not set", UserWarning)
                return GCSFileSystem(**self._settings.kwargs)
        if self.object_store:  # az://, abfs://
            try:
                from adlfs import AzureBlobFileSystem
            except ImportError:
                raise RemoteError(f"{self.url}: reading {self.remote.scheme}:// needs adlfs: "
                                  "pip install 'dataset-packer[remote]'") from None
            return AzureBlobFileSystem(**self._settings.kwargs)
        try:
            import aiohttp
            from fsspec.implementations.http import HTTPFileSystem
        except ImportError:
            raise RemoteError(f"{self.url}: reading http(s):// needs fsspec and aiohttp: "
                              "pip install 'dataset-packer[remote]'") from None
        opts = dict(self.storage_options)
        client_kwargs = dict(opts.pop("client_kwargs", None) or {})
        client_kwargs.setdefault("timeout", aiohttp.ClientTimeout(
            total=None, connect=self.retry.connect_timeout_s, sock_read=self.retry.read_timeout_s))
        return HTTPFileSystem(client_kwargs=client_kwargs, skip_instance_cache=True, **opts)

    @property
    def identity(self) -> str:
        # The same bucket name on two S3 endpoints is two different datasets.
        return f"{self.url} @ {self._settings.endpoint}" if self.object_store else self.url

    def _credential_sources(self) -> str:
        if self.object_store:
            return f"{self._settings.credential_sources}; endpoint {self._settings.endpoint}"
        given = "headers given" if self.storage_options.get("headers") else "no headers given"
        return f"storage_options ({given}); an HTTP URL carries no other credentials"

    def _call(self, name: str, what: str, fn: Callable[[], T]) -> T:
        return self._retrier.call(fn, self.url_of(name), what)

    def _run(self, name: str, what: str, coro_fn: Callable[..., Any], *args: Any, bucket_seen: bool = True) -> Any:
        """``await coro_fn(fs, *args)`` on fsspec's loop, retried; each attempt is cancelled at the call's deadline."""
        def attempt(timeout_s: float) -> Any:
            return _sync(self.fs, coro_fn, timeout_s, *args)

        try:
            out = self._retrier.call(attempt, self.url_of(name), what, deadline=True)
        except ObjectNotFoundError as exc:
            if self._bucket_missing(exc):
                raise self._no_bucket() from exc
            raise
        if bucket_seen and self.remote.scheme == "s3":
            self._bucket_seen = True  # an answer about an object: the bucket is there
        return out

    def _bucket_missing(self, exc: ObjectNotFoundError | None = None) -> bool:
        """For s3: whether the bucket itself is missing (a 404 on HEAD does not say which; ask the bucket)."""
        if self.remote.scheme != "s3" or self._bucket_seen:
            return False
        if exc is not None and "no such bucket" in str(exc):
            return True

        async def head_bucket(fs: Any) -> bool:
            try:
                await fs._call_s3("head_bucket", Bucket=self.remote.netloc)
            except FileNotFoundError:
                return False
            return True

        try:
            exists = self._retrier.call(lambda t: _sync(self.fs, head_bucket, t), self.url, "HEAD bucket",
                                        deadline=True)
        except RemoteError:
            self._bucket_seen = True  # cannot tell (denied, down): keep the error there was, and do not ask again
            return False
        self._bucket_seen = exists
        return not exists

    def _no_bucket(self) -> BucketNotFoundError:
        return BucketNotFoundError(f"{self.url}: no such bucket {self.remote.netloc!r} at {self._settings.endpoint}; "
                                   "check the URL and the endpoint (endpoint_url, AWS_ENDPOINT_URL)")

    def _path(self, name: str) -> str:
        """The path fsspec takes: ``bucket/key`` for an object store, the full URL for http."""
        if self.object_store:
            return f"{self.remote.netloc}/{self.remote.key(name)}"
        return self.remote.child(name)

    # ------------------------------------------------------------ primitives
    def _read(self, name: str, limit: int) -> bytes:
        return self._run(name, "GET", self._get, name, None, limit)

    def _read_range(self, name: str, start: int, length: int) -> bytes:
        return self._run(name, f"GET bytes {start}-{start + length - 1}", self._get, name, start, length)

    async def _get(self, fs: Any, name: str, start: int | None, limit: int) -> bytes:
        """At most ``limit + 1`` bytes of the object (from ``start``, or all of it when ``start`` is None)."""
        if self.remote.scheme == "s3":
            bucket, key = self.remote.netloc, self.remote.key(name)
            rng = {"Range": f"bytes={start}-{start + limit - 1}"} if start is not None else {}
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **rng)
            body = resp["Body"]
            try:
                declared = resp.get("ContentLength")
                if start is None and declared is not None and int(declared) > limit:
                    raise self.too_large(name, limit, int(declared))
                return await _bounded(body.read, limit)
            finally:
                body.close()
        if self.object_store:  # gs, az: a ranged GET of at most limit + 1 bytes
            path = self._path(name)
            if start is None:
                declared = (await self._head(fs, name)).size
                if declared > limit:
                    raise self.too_large(name, limit, declared)
                if declared == 0:
                    return b""
                return await fs._cat_file(path, start=0, end=min(declared, limit + 1))
            return await fs._cat_file(path, start=start, end=start + limit)
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        if start is not None:
            headers["Range"] = f"bytes={start}-{start + limit - 1}"
        session = await fs.set_session()
        url = self._path(name)
        async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
            fs._raise_not_found_for_status(r, url)
            if start is not None and r.status != 206:
                raise RemoteIntegrityError(
                    f"{self.url_of(name)}: asked for bytes {start}-{start + limit - 1}, the server ignored the "
                    f"Range header (HTTP {r.status} instead of 206 Partial Content); serve the dataset from a "
                    "server that supports range requests")
            if start is None and r.content_length is not None and r.content_length > limit:
                raise self.too_large(name, limit, r.content_length)
            return await _bounded(r.content.read, limit)

    def _stat(self, name: str) -> ObjectInfo:
        return self._run(name, "HEAD", self._head, name)

    async def _head(self, fs: Any, name: str) -> ObjectInfo:
        if self.remote.scheme == "gs":  # the object's metadata alone: gcsfs's _info also races a folder listing
            info = await fs._get_object(self._path(name))  # against it and cancels the loser, leaking its socket
        else:
            info = await fs._info(self._path(name))
        if info.get("type") == "directory":
            raise FileNotFoundError(self._path(name))
        if info.get("size") is None:
            raise RemoteError(f"{self.url_of(name)}: the server does not report a size (no Content-Length)")
        etag = next((info[k] for k in ("ETag", "etag") if info.get(k)), None)
        # the object's generation (gs) or last write (s3: LastModified, az: last_modified, http: Last-Modified)
        mtime = next((info[k] for k in ("generation", "LastModified", "Last-Modified", "last_modified", "updated")
                      if info.get(k)), None)
        return ObjectInfo(int(info["size"]), etag=str(etag) if etag else None, mtime=str(mtime) if mtime else None)

    def _list(self, prefix: str) -> list[str]:
        base = self._path("")
        root = base.rstrip("/")
        # List the deepest folder that contains the prefix, then filter.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        target = f"{root}/{folder}" if folder else root

        async def find(fs: Any) -> list[str]:
            try:
                found = await fs._find(target)
            except FileNotFoundError:
                return []
            return [f[len(root):].lstrip("/") for f in found if f.startswith(root)]

        names = self._run(prefix or "", "LIST", find, bucket_seen=False)  # some stores list a missing bucket as empty
        if not names and self._bucket_missing():
            raise self._no_bucket()
        return names

    def list_sizes(self) -> dict[str, int]:
        """``name -> size`` of every object under the prefix, in one listing (paged by the client),
        through this store's retries: an S3 listing carries the sizes, a HEAD per object would not."""
        root = self._path("").rstrip("/")

        def find() -> dict[str, int]:
            try:
                found = self.fs.find(root, detail=True)
            except FileNotFoundError:
                return {}
            return {path[len(root):].lstrip("/"): int(info.get("size") or 0) for path, info in found.items()
                    if path.startswith(root + "/") and info.get("type") != "directory"}

        return self._call("", "LIST", find)

    def _writable(self, name: str) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.url_of(name)}: {self.remote.scheme}:// datasets are read-only "
                                     "(upload to s3://, gs:// or az:// instead)")

    def _put(self, name: str, local_path: Path, part_size: int,
             progress: Callable[[int], None] | None = None) -> None:
        self._writable(name)
        if not local_path.is_file():
            raise RemoteError(f"{local_path}: no such file to upload to {self.url_of(name)}")
        kwargs: dict[str, Any] = {"chunksize": part_size} if self.remote.scheme in ("s3", "gs") else {}
        if progress is not None:
            kwargs["callback"] = _progress_callback(progress)
        # s3fs uploads in parts of `chunksize` (from 2 parts up, several at once) and completes the
        # multipart upload last, so the object appears whole or not at all.
        self._call(name, "PUT", lambda: self.fs.put_file(str(local_path), self._path(name), **kwargs))

    def _put_bytes(self, name: str, data: bytes) -> None:
        self._writable(name)
        self._call(name, "PUT", lambda: self.fs.pipe_file(self._path(name), data))

    def _delete(self, name: str) -> None:
        self._writable(name)

        def rm() -> None:
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                pass

        self._call(name, "DELETE", rm)


def close_filesystem(fs: Any) -> None:
    """Close an fsspec filesystem's connections now, not at garbage collection: s3fs, gcsfs and fsspec's
    HTTP filesystem hold an aiohttp session, adlfs a blob service client (each also registers the same
    call as a finalizer; running it twice is harmless)."""
    creator = getattr(fs, "_s3creator", None)
    if creator is not None:
        type(fs).close_session(fs.loop, creator)
        return
    session = getattr(fs, "_session", None)  # aiohttp (gcsfs, http): closed on the loop, waited for here
    if session is not None and not session.closed:  # (gcsfs's close_session only schedules it)
        async def close_session(_fs: Any) -> None:
            await session.close()

        _sync(fs, close_session, 10.0)
        return
    client = getattr(fs, "service_client", None)
    if client is not None:
        async def close(_fs: Any) -> None:
            await client.close()

        _sync(fs, close, 10.0)


def _sync(fs: Any, coro_fn: Callable[..., Any], timeout_s: float, *args: Any) -> Any:
    from fsspec.asyn import sync

    return sync(fs.loop, coro_fn, fs, *args, timeout=timeout_s)


async def _bounded(read: Callable[[int], Any], limit: int) -> bytes:
    """Read a body with ``await read(n)`` until it ends or holds more than ``limit`` bytes (then ``limit + 1``)."""
    pieces, got = [], 0
    while got <= limit:
        piece = await read(min(_PIECE, limit + 1 - got))
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)  # one copy, as the client's own read() of a whole body makes


def _progress_callback(progress: Callable[[int], None]) -> Any:
    """An fsspec ``Callback`` that reports each increment to ``progress(nbytes)``."""
    from fsspec.callbacks import Callback

    class Increments(Callback):
        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            progress(inc)

    return Increments()
