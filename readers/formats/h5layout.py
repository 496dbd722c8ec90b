"""What ``data.h5`` must look like for the readers to trust it (torch-free: ``verify`` runs it in a child).

``/images`` must be a plain one-dimensional ``uint8`` dataset whose bytes
live in ``data.h5`` itself: an external link, a soft link, a virtual dataset
or external raw storage would make HDF5 read other files, and is refused.
Its storage must be what the packer writes (``packer/formats/hdf5.py``):
chunked in chunks of ``spec.HDF5_CHUNK_BYTES``, with no filter. Anything
else is refused before a sample is read: a gzip-filtered dataset with one
huge chunk costs seconds and gigabytes of inflating per sample read (a
"gzip bomb"), and the packer never writes one.

The chunk table (each chunk's byte offset in the file, in chunk order) is
built in one pass over HDF5's chunk index (``chunk_iter``), by the writer
and by ``verify``: ``get_chunk_info(k)`` walks the whole index on each
call, which made the table cost chunks².
"""

from __future__ import annotations

import array

import h5py
import numpy as np

from readers.contract import spec

__all__ = ["check_images", "check_chunks", "chunk_table"]

_LAYOUTS = {h5py.h5d.COMPACT: "compact", h5py.h5d.CONTIGUOUS: "contiguous", h5py.h5d.CHUNKED: "chunked",
            h5py.h5d.VIRTUAL: "virtual"}

_FILTERS = {h5py.h5z.FILTER_DEFLATE: "gzip", h5py.h5z.FILTER_SHUFFLE: "shuffle",
            h5py.h5z.FILTER_FLETCHER32: "fletcher32", h5py.h5z.FILTER_SZIP: "szip",
            h5py.h5z.FILTER_NBIT: "nbit", h5py.h5z.FILTER_SCALEOFFSET: "scaleoffset"}


def _filter_name(code: int, _flags: int, _values: tuple, name: bytes) -> str:
    text = name.decode("ascii", "replace")
    return _FILTERS.get(code) or f"filter {code}" + (f" ({text})" if text else "")


def check_images(f: h5py.File, file: str, chunk_bytes: int = spec.HDF5_CHUNK_BYTES) -> h5py.Dataset:
    """``/images`` of the open file ``f``, after checking it is stored in ``file`` itself, chunked in
    ``chunk_bytes`` chunks with no filter (what the packer writes)."""
    link = f.get("images", getlink=True)
    if not isinstance(link, h5py.HardLink):
        kind = {h5py.ExternalLink: "an external link", h5py.SoftLink: "a soft link"}.get(type(link), "not a link")
        kind = "missing" if link is None else f"{kind} (it would read another file or object)"
        raise spec.DatasetFormatError(f"{file}: /images is {kind}; refusing it")
    images = f["images"]
    if not isinstance(images, h5py.Dataset) or images.dtype != np.uint8 or images.ndim != 1:
        raise spec.DatasetFormatError(f"{file}: /images is not a one-dimensional uint8 dataset")
    if images.is_virtual or images.external:
        raise spec.DatasetFormatError(f"{file}: /images stores its bytes in other files (virtual dataset or "
                                      "external storage); refusing it")
    dcpl = images.id.get_create_plist()
    layout = dcpl.get_layout()
    if layout != h5py.h5d.CHUNKED:
        raise spec.DatasetFormatError(f"{file}: /images has {_LAYOUTS.get(layout, f'layout {layout}')} storage, "
                                      f"not the {chunk_bytes}-byte chunks the packer writes; refusing it")
    filters = [_filter_name(*dcpl.get_filter(k)) for k in range(dcpl.get_nfilters())]
    if filters:
        raise spec.DatasetFormatError(f"{file}: /images is stored through HDF5 filters ({', '.join(filters)}); "
                                      "the packer writes it unfiltered: refusing it (reading it would inflate "
                                      "whole chunks per sample)")
    if images.chunks != (chunk_bytes,):
        raise spec.DatasetFormatError(f"{file}: /images has chunks of {images.chunks[0]} bytes, not the "
                                      f"{chunk_bytes} the packer writes; refusing it")
    return images


def chunk_table(images: h5py.Dataset, chunk_bytes: int) -> np.ndarray | None:
    """The byte offset in the file of each chunk of ``images``, in chunk order (``<i8``): one pass over
    HDF5's chunk index. None unless every chunk is stored, unfiltered and ``chunk_bytes`` long."""
    rows = array.array("q")  # (logical offset, file offset, stored size, filter mask) per chunk
    images.id.chunk_iter(lambda c: rows.extend((c.chunk_offset[0], c.byte_offset, c.size, c.filter_mask)))
    info = np.frombuffer(rows, dtype=np.int64).reshape(-1, 4)
    info = info[np.argsort(info[:, 0], kind="stable")]
    n = -(-images.shape[0] // chunk_bytes)
    if (len(info) != n or np.any(info[:, 0] != np.arange(n, dtype=np.int64) * chunk_bytes)
            or np.any(info[:, 2] != chunk_bytes) or np.any(info[:, 3] != 0)):
        return None
    return np.ascontiguousarray(info[:, 1], dtype="<i8")


def check_chunks(images: h5py.Dataset, file: str, table: np.ndarray, chunk_bytes: int) -> None:
    """Every chunk of ``images`` unfiltered at the byte offset the chunk table gives."""
    got = chunk_table(images, chunk_bytes)
    if got is None or not np.array_equal(got, np.asarray(table, dtype=np.int64)):
        raise spec.DatasetFormatError(f"{file}: the chunk table does not match where /images keeps its chunks")
