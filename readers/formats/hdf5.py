"""HDF5 reader. Counterpart: ``packer/formats/hdf5.py`` (layout there).

Sample ``i`` is ``/images[offsets[i]:offsets[i+1]]``. The offsets come from
``offsets.npy``/``sizes.npy`` (loaded once, small). When the packer found
/images' chunks back to back in the file (``storage.raw_offset``), a sample
is one ``os.pread`` at ``raw_offset + offsets[i]``; otherwise the file is
opened with h5py, lazily per process, without a chunk cache.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import h5py
import numpy as np

from readers import spec
from readers.base import LazyHandle, MapReader

__all__ = ["HDF5Dataset"]


# Module-level (not lambdas) so readers pickle for spawn/forkserver workers.
def _open_h5(file: str) -> h5py.File:
    return h5py.File(file, "r", rdcc_nbytes=0)


def _close_h5(f: h5py.File) -> None:
    f.close()


class HDF5Dataset(MapReader):
    format = "hdf5"

    def __init__(self, path: str | os.PathLike, **kw: Any) -> None:
        super().__init__(path, **kw)
        self._offsets = self._arrays["offsets"]
        self._sizes = self._arrays["sizes"]
        file = str(self.root / "data.h5")
        self._raw_offset = self.meta["storage"].get("raw_offset")
        if self._raw_offset is not None:
            self._fd = LazyHandle(functools.partial(os.open, file, os.O_RDONLY), os.close)
        self._h5 = LazyHandle(functools.partial(_open_h5, file), _close_h5)

    def read(self, i: int) -> bytes | np.ndarray:
        start, size = int(self._offsets[i]), int(self._sizes[i])
        if self._raw_offset is not None:
            data = os.pread(self._fd.get(), size, self._raw_offset + start)
            if len(data) != size:
                raise spec.DatasetFormatError(
                    f"{self.root / 'data.h5'}: sample {i} at byte {self._raw_offset + start} is cut short "
                    f"({len(data)} of {size} bytes): the file is truncated or damaged"
                )
            return data
        images = self._h5.get()["images"]
        if start + size > images.shape[0]:
            raise spec.DatasetFormatError(
                f"{self.root / 'data.h5'}: sample {i} spans bytes {start}..{start + size}, "
                f"past the end of /images ({images.shape[0]} bytes): the file is truncated or damaged"
            )
        return images[start:start + size]

    def close(self) -> None:
        self._h5.close()
        if self._raw_offset is not None:
            self._fd.close()
