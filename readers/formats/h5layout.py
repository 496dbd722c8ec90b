"""What ``data.h5`` must look like for the readers to trust it (torch-free: ``verify`` runs it in a child).

``/images`` must be a plain one-dimensional ``uint8`` dataset whose bytes
live in ``data.h5`` itself: an external link, a soft link, a virtual dataset
or external raw storage would make HDF5 read other files, and is refused.
When the index has a chunk table, every chunk of ``/images`` must be stored
unfiltered exactly where the table says.
"""

from __future__ import annotations

import h5py
import numpy as np

from readers import spec

__all__ = ["check_images", "check_chunks"]


def check_images(f: h5py.File, file: str) -> h5py.Dataset:
    """``/images`` of the open file ``f``, after checking it is stored in ``file`` itself."""
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
    return images


def check_chunks(images: h5py.Dataset, file: str, table: list[int], chunk_bytes: int) -> None:
    """Every chunk of ``images`` unfiltered at the byte offset the chunk table gives."""
    dsid = images.id
    info = [dsid.get_chunk_info(k) for k in range(dsid.get_num_chunks())]
    got = sorted((int(c.chunk_offset[0]), int(c.byte_offset)) for c in info)
    want = [(k * chunk_bytes, int(offset)) for k, offset in enumerate(table)]
    if got != want or any(c.filter_mask for c in info):
        raise spec.DatasetFormatError(f"{file}: the chunk table does not match where /images keeps its chunks")
