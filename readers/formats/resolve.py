"""The one index resolver: a dataset folder, a URL, a ``Store`` or an :class:`~readers.contract.spec.Index` -> its Index.

``open_dataset``, every reader, ``pack-dataset verify`` / ``info`` /
``convert`` call :func:`resolve_index`; none decides "local or remote" on
its own. Locations are parsed by :func:`readers.contract.location.parse_location`
(``file://`` is a local path; an unsupported scheme such as ``gs://`` is
refused with :class:`readers.contract.location.UnsupportedLocationError`).

A local folder imports nothing more than :mod:`readers.contract.spec`; a URL imports
:mod:`readers.remote` (and its client library) on first use.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from readers.contract import spec

__all__ = ["resolve_index"]


def resolve_index(source: str | os.PathLike | spec.Index | Any, storage_options: Mapping[str, Any] | None = None,
                  retry: Any = None) -> spec.Index:
    """The index of ``source``: itself when already an Index; read through the store for a
    ``Store``; read through :mod:`readers.remote` for an ``s3://`` / ``http(s)://`` URL; else read
    from the local folder (``file://`` URLs included). ``storage_options`` / ``retry`` apply to URLs."""
    if isinstance(source, spec.Index):
        return source
    if not isinstance(source, (str, os.PathLike)) and spec.is_remote(source):
        return spec.read_index(source)  # a Store
    location = spec.parse_location(source)
    if isinstance(location, str):
        from readers.remote import read_index

        return read_index(location, storage_options, retry)
    return spec.read_index(location)  # storage_options and retry are ignored for a local folder
