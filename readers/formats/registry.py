"""``open_dataset(path)``: read the index's ``format`` field, build the matching reader."""

from __future__ import annotations

import os
from typing import Any

from readers.contract import spec
from readers.contract.generations import open_generation
from readers.formats.hdf5 import HDF5Dataset
from readers.formats.lmdb import LMDBDataset
from readers.formats.mmap import MemmapDataset
from readers.formats.wds import ShardDataset
from readers.formats.resolve import resolve_index

__all__ = ["READERS", "open_dataset"]

#: format name (as stored in index.json) -> reader class
READERS: dict[str, type] = {
    "wds": ShardDataset,
    "lmdb": LMDBDataset,
    "hdf5": HDF5Dataset,
    "mmap": MemmapDataset,
}


def open_dataset(path: str | os.PathLike | spec.Index, *, storage_options: dict[str, Any] | None = None,
                 retry: Any = None, generation: int | None = None, **kwargs: Any) -> Any:
    """Open the dataset folder or URL ``path`` with the reader its index names.

    The index is read once and handed to the reader (``reader.index``);
    ``path`` may also be an index already read with :func:`readers.contract.spec.read_index`.
    Keyword arguments go to the reader (``transform=``, ``decode=``, and for
    ``wds`` ``shuffle=``, ``seed=``, ``buffer_size=``, ``pad=``).

    ``file:///abs/path`` is the local folder ``/abs/path``; other schemes (``gs://``, ...) raise
    :class:`readers.contract.location.UnsupportedLocationError` (a ``ValueError``).

    Remote datasets: ``path`` is ``s3://bucket/prefix`` or ``http(s)://host/path``;
    ``storage_options`` (s3fs's: ``endpoint_url``, ``key``, ``secret``, ...;
    the ``AWS_*`` environment fills in the rest), ``retry`` (a
    :class:`readers.remote.RetryPolicy`), and for the reader ``cache_dir``,
    ``cache_limit`` (``"200GB"``) and ``progress``. See docs/remote.md.

    ``generation``: of a dataset grown by appends, open that generation (its first samples, as a
    reader opened then saw them: for a job resuming from a saved loader state); default the newest
    (``reader.index.meta`` says which: :func:`readers.contract.generations.generation_of`).
    """
    index = resolve_index(path, storage_options, retry)
    if generation is not None:
        index = open_generation(index, generation)
    try:
        cls = READERS[index.format]
    except KeyError:
        raise spec.DatasetFormatError(f"{index.root}: no reader for format {index.format!r}") from None
    if spec.is_inplace(index.meta):  # its shards may live in a store too (readers.formats.inplace)
        kwargs.update(storage_options=storage_options, retry=retry)
    return cls(index, **kwargs)
