"""Where a dataset lives: the one parser of a path-or-URL that every CLI and ``open_dataset`` use.

A location is a local folder or a URL. Served here:

* a plain path (``out/train-wds``, ``/data/x``) -> a local folder;
* ``file:///abs/path`` -> the local folder ``/abs/path`` (``file://localhost/abs/path`` too);
* ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix`` (``abfs://`` too),
  ``http://host/path``, ``https://host/path`` -> a remote dataset, read through :mod:`readers.remote`.

Any other ``scheme://`` (``hf://``, ``oci://``, ...) is refused with
:class:`UnsupportedLocationError` naming the scheme and the ones served: it
never becomes a local folder named ``hf:``.

Plain string parsing: deciding that a path is local imports nothing (this
module imports nothing of ``readers``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["REMOTE_SCHEMES", "SERVED_SCHEMES", "UnsupportedLocationError", "scheme_of", "parse_location",
           "is_remote", "is_url"]

#: URL schemes read through ``readers.remote``.
REMOTE_SCHEMES = ("s3", "gs", "az", "abfs", "http", "https")
#: Every scheme a location may have (``file://`` is a local path).
SERVED_SCHEMES = ("file", *REMOTE_SCHEMES)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


class UnsupportedLocationError(ValueError):
    """A ``scheme://`` location whose scheme this dataset-packer does not serve."""


def scheme_of(text: str) -> str | None:
    """The lower-case scheme of ``scheme://...``, or None for a plain path."""
    m = _SCHEME.match(text)
    return m.group(1).lower() if m else None


def _served() -> str:
    return ", ".join(f"{s}://" for s in SERVED_SCHEMES) + " and local paths"


def parse_location(location: str | os.PathLike) -> Path | str:
    """A local folder as a :class:`~pathlib.Path`, or a remote URL as a ``str``.

    ``file://`` URLs become local paths; an unsupported scheme raises
    :class:`UnsupportedLocationError` (a ``ValueError``) with a one-line reason.
    """
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if isinstance(location, bytes):
        location = os.fsdecode(location)
    if not isinstance(location, str):
        raise TypeError(f"a dataset location is a path or URL string, not {type(location).__name__}")
    scheme = scheme_of(location)
    if scheme is None:
        return Path(location)
    if scheme in REMOTE_SCHEMES:
        return location
    if scheme == "file":
        rest = location[len("file://"):]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        if not rest.startswith("/"):
            raise UnsupportedLocationError(
                f"{location}: a file:// URL names an absolute local path (file:///abs/path); "
                "a host in it is not supported")
        return Path(rest)
    raise UnsupportedLocationError(f"{location}: the {scheme}:// scheme is not supported (served: {_served()})")


def is_remote(path: Any) -> bool:
    """True for a location in :data:`REMOTE_SCHEMES` (``s3://``, ``gs://``, ...), or a remote ``Store``.

    False for a local path or a ``file://`` URL; :class:`UnsupportedLocationError`
    for another scheme (there is no right answer for ``hf://``: it is neither).
    """
    if hasattr(path, "read_range") and not isinstance(path, (str, os.PathLike)):
        return True
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        return False
    return isinstance(parse_location(text), str)


def is_url(path: Any) -> bool:
    """True for the :data:`REMOTE_SCHEMES` paths (what the remote layer reads)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    return isinstance(text, str) and scheme_of(text) in REMOTE_SCHEMES
