"""Remote datasets: ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` behind one small ``Store`` interface,
plus a node-local cache.

Nothing in ``readers`` imports this package for a local path, and importing
it imports no client library: s3fs / gcsfs / adlfs / fsspec / aiohttp load on the first
request to a remote URL. Install them with ``pip install "dataset-packer[remote]"``.

    from readers.remote import open_store, is_url
    store = open_store("s3://bucket/imagenet/train-wds",
                       storage_options={"endpoint_url": "http://127.0.0.1:8333"})
    meta = store.read("index.json")
    for chunk in store.stream("train-000000.tar"):
        ...

See docs/remote.md for the client choice, retries, the cache and figures.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from readers.contract.location import parse_location
from readers.remote.config import RemoteURL, is_url, parse_size, parse_url
from readers.remote.errors import (
    ObjectNotFoundError,
    ReadOnlyStoreError,
    RemoteAuthError,
    RemoteError,
    RemoteIntegrityError,
    RemoteUnavailableError,
)
from readers.remote.retry import RetryPolicy
from readers.remote.store import LocalStore, Store

__all__ = [
    "open_store",
    "read_index",
    "is_url",
    "parse_url",
    "parse_size",
    "RemoteURL",
    "Store",
    "LocalStore",
    "RetryPolicy",
    "RemoteError",
    "ObjectNotFoundError",
    "RemoteAuthError",
    "RemoteUnavailableError",
    "RemoteIntegrityError",
    "ReadOnlyStoreError",
]


def open_store(location: str | os.PathLike, storage_options: Mapping[str, Any] | None = None,
               retry: RetryPolicy | None = None) -> Store:
    """A :class:`Store` for a dataset folder: a local path, ``file://``, or a ``s3://``, ``gs://``, ``az://`` /
    ``abfs://`` or ``http(s)://`` URL.

    ``storage_options`` are s3fs's (``endpoint_url``, ``key``, ``secret``, ...)
    for s3, gcsfs's (``token``, ``project``, ``endpoint_url``) for gs, adlfs's
    (``account_name``, ``account_key``, ``sas_token``, ``connection_string``) for az / abfs,
    fsspec HTTP's (``headers``, ``client_kwargs``) for http; each cloud's usual
    environment variables fill in what they leave out (:mod:`readers.remote.config`). ``retry`` bounds
    retries and timeouts (default :class:`RetryPolicy`: transient failures retried for 30 s,
    no count limit; 10 s connect and 30 s read timeouts; see ``readers.remote.retry``).
    """
    parsed = parse_location(location)  # the one path-or-URL parser: hf:// and the like are refused here
    if not isinstance(parsed, str):
        if storage_options:
            raise ValueError(f"{location}: storage_options only apply to remote URLs "
                             "(s3://, gs://, az://, http(s)://)")
        return LocalStore(str(parsed))
    from readers.remote.fsspec_store import FsspecStore

    return FsspecStore(parse_url(parsed), storage_options, retry)


def read_index(location: str | os.PathLike | Store, storage_options: Mapping[str, Any] | None = None,
               retry: RetryPolicy | None = None):
    """:func:`readers.contract.spec.read_index` for a local folder, a URL or a :class:`Store`."""
    from readers.contract import spec

    store = location if isinstance(location, Store) else open_store(location, storage_options, retry)
    return spec.read_index(store)
