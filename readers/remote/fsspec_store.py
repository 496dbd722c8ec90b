"""``Store`` over S3 (s3fs) and HTTP(S) (fsspec's aiohttp filesystem).

Why fsspec + s3fs and not obstore: see docs/remote.md (measured with
benchmarks/bench_remote_clients.py). In short: obstore is faster for many
small requests, but a forked child of a process that used it hangs on its
first request, and PyTorch DataLoader workers are forked; for the large
sequential GETs that streaming and caching use, the two are equally fast.

The filesystem object is built lazily, once per process (s3fs refuses to be
used across ``fork``), with the client's own retries switched off: every
call goes through :class:`readers.remote.retry.Retrier`. Request signing,
credential lookup (environment, profiles, ``storage_options``) and multipart
uploads are s3fs's and botocore's.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from readers.remote.config import RemoteURL, s3_settings
from readers.remote.errors import ReadOnlyStoreError, RemoteError
from readers.remote.retry import Retrier, RetryPolicy
from readers.remote.store import Store

__all__ = ["FsspecStore"]

T = TypeVar("T")

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
    """Objects under ``s3://bucket/prefix`` or ``http(s)://host/prefix``."""

    def __init__(self, url: RemoteURL, storage_options: Mapping[str, Any] | None = None,
                 retry: RetryPolicy | None = None) -> None:
        super().__init__()
        self.remote = url
        self.url = url.root
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.read_only = url.scheme != "s3"
        self._fs_pid: int | None = None
        self._fs: Any = None
        self._lock = threading.Lock()
        self._retrier = Retrier(self.retry, self._credential_sources)
        if url.scheme == "s3":  # validate options now (cheap), not in a worker
            self._settings = s3_settings(self.storage_options, connect_timeout_s=self.retry.connect_timeout_s,
                                         read_timeout_s=self.retry.read_timeout_s)

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
        fs = self._fs if self._fs_pid == os.getpid() else None
        self._fs = None
        if fs is None:
            return
        # s3fs and fsspec's HTTP filesystem register these same calls as finalizers; running one twice is harmless.
        session = getattr(fs, "_s3creator", None) or getattr(fs, "_session", None)
        if session is not None:
            try:
                type(fs).close_session(fs.loop, session)
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
        return f"{self.url} @ {self._settings.endpoint}" if self.remote.scheme == "s3" else self.url

    def _credential_sources(self) -> str:
        if self.remote.scheme == "s3":
            return f"{self._settings.credential_sources}; endpoint {self._settings.endpoint}"
        given = "headers given" if self.storage_options.get("headers") else "no headers given"
        return f"storage_options ({given}); an HTTP URL carries no other credentials"

    def _call(self, name: str, what: str, fn: Callable[[], T]) -> T:
        return self._retrier.call(fn, self.url_of(name), what)

    def _path(self, name: str) -> str:
        """The path fsspec takes: ``bucket/key`` for s3, the full URL for http."""
        if self.remote.scheme == "s3":
            return f"{self.remote.netloc}/{self.remote.key(name)}"
        return self.remote.child(name)

    # ------------------------------------------------------------ primitives
    def _read(self, name: str) -> bytes:
        return self._call(name, "GET", lambda: self.fs.cat_file(self._path(name)))

    def _read_range(self, name: str, start: int, length: int) -> bytes:
        return self._call(name, f"GET bytes {start}-{start + length - 1}",
                          lambda: self.fs.cat_file(self._path(name), start=start, end=start + length))

    def _size(self, name: str) -> int:
        def head() -> int:
            info = self.fs.info(self._path(name))
            if info.get("type") == "directory":
                raise FileNotFoundError(self._path(name))
            if info.get("size") is None:
                raise RemoteError(f"{self.url_of(name)}: the server does not report a size (no Content-Length)")
            return int(info["size"])

        return self._call(name, "HEAD", head)

    def _list(self, prefix: str) -> list[str]:
        base = self._path("")
        root = base.rstrip("/")
        # List the deepest folder that contains the prefix, then filter.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        target = f"{root}/{folder}" if folder else root

        def find() -> list[str]:
            try:
                found = self.fs.find(target)
            except FileNotFoundError:
                return []
            return [f[len(root):].lstrip("/") for f in found if f.startswith(root)]

        return self._call(prefix or "", "LIST", find)

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
                                     "(upload to s3:// instead)")

    def _put(self, name: str, local_path: Path, part_size: int,
             progress: Callable[[int], None] | None = None) -> None:
        self._writable(name)
        if not local_path.is_file():
            raise RemoteError(f"{local_path}: no such file to upload to {self.url_of(name)}")
        kwargs: dict[str, Any] = {"chunksize": part_size}
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


def _progress_callback(progress: Callable[[int], None]) -> Any:
    """An fsspec ``Callback`` that reports each increment to ``progress(nbytes)``."""
    from fsspec.callbacks import Callback

    class Increments(Callback):
        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            progress(inc)

    return Increments()
