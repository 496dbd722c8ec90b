"""Errors of the remote layer: one line each, naming the URL (and the object).

All are :class:`RemoteError`, an ``OSError``, so code that already handles
file errors handles these too; :class:`ObjectNotFoundError` is also a
``FileNotFoundError`` and :class:`RemoteAuthError` a ``PermissionError``.
"""

from __future__ import annotations

from readers.contract.messages import one_line  # re-exported: the stores quote errors with it

__all__ = [
    "RemoteError",
    "ObjectNotFoundError",
    "RemoteAuthError",
    "RemoteUnavailableError",
    "RemoteIntegrityError",
    "RemoteTooLargeError",
    "BucketNotFoundError",
    "ReadOnlyStoreError",
    "one_line",
]


class RemoteError(OSError):
    """Any failure talking to an object store or web server."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ObjectNotFoundError(RemoteError, FileNotFoundError):
    """The object (or bucket) does not exist (HTTP 404)."""


class BucketNotFoundError(RemoteError):
    """The bucket itself does not exist (S3 ``NoSuchBucket``): the URL is wrong, not the dataset.

    Deliberately not a ``FileNotFoundError``: code that turns a missing
    ``index.json`` into "no such dataset" must not hide that the whole bucket
    is missing (``info`` and ``verify`` then print this same line).
    """


class RemoteAuthError(RemoteError, PermissionError):
    """The server refused the credentials (HTTP 401/403). Never retried."""


class RemoteUnavailableError(RemoteError, ConnectionError):
    """Transient failures (5xx, resets, refused connections, timeouts) outlasted the retry budget."""


class RemoteIntegrityError(RemoteError):
    """Bytes arrived but are not what was expected (size or CRC-32 differs)."""


class RemoteTooLargeError(RemoteError):
    """A response body larger than the read accepts (an endless body, or a file that is not the dataset's).

    ``limit``: the bytes the read accepted; ``declared``: the size the server declared (Content-Length),
    None when it sent more than ``limit`` without declaring it."""

    def __init__(self, message: str, *, limit: int | None = None, declared: int | None = None) -> None:
        super().__init__(message)
        self.limit, self.declared = limit, declared


class ReadOnlyStoreError(RemoteError):
    """A write to a store that only reads (plain HTTP)."""
