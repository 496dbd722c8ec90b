"""HDF5 reader. Counterpart: ``packer/formats/hdf5.py`` (layout there).

Sample ``i`` is ``/images[offsets[i]:offsets[i+1]]``. The offsets come from
``offsets.npy``/``sizes.npy`` (loaded once, small); the file is opened
lazily per process with a small chunk cache (reads are random).
"""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from readers import spec
from readers.base import LazyHandle, MapReader

__all__ = ["HDF5Dataset"]


class HDF5Dataset(MapReader):
    format = "hdf5"

    def __init__(self, path: str | os.PathLike, **kw: Any) -> None:
        super().__init__(path, **kw)
        self._offsets = self._arrays["offsets"]
        self._sizes = self._arrays["sizes"]
        file = str(self.root / "data.h5")
        self._h5 = LazyHandle(lambda: h5py.File(file, "r", rdcc_nbytes=0), lambda f: f.close())

    def read(self, i: int) -> np.ndarray:
        images = self._h5.get()["images"]
        start, size = int(self._offsets[i]), int(self._sizes[i])
        if start + size > images.shape[0]:
            raise spec.DatasetFormatError(
                f"{self.root / 'data.h5'}: sample {i} spans bytes {start}..{start + size}, "
                f"past the end of /images ({images.shape[0]} bytes): the file is truncated or damaged"
            )
        return images[start:start + size]

    def close(self) -> None:
        self._h5.close()
