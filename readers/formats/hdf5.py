"""HDF5 reader. Counterpart: ``packer/formats/hdf5.py`` (layout there).

Sample ``i`` is ``/images[offsets[i]:offsets[i+1]]``. The offsets come from
``offsets.npy``/``sizes.npy`` (loaded once, small). With the packer's chunk
table (``storage.chunk_table``, normally ``spec.HDF5_CHUNK_TABLE``: each
chunk's byte offset in the file)
a sample is one ``os.pread`` (two when it straddles non-adjacent chunks);
without it the file is opened with h5py, lazily per process, without a
chunk cache.

Remote (``s3://``, ``http(s)://``): with ``cache_dir`` (or for a pack
without a chunk table, which h5py must open as a file) ``data.h5`` is
downloaded into the cache when the dataset is opened and read from there;
without a cache each sample is one range request (two when it straddles
non-adjacent chunks), its CRC-32 checked (see docs/remote.md).
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from readers import spec
from readers.base import LazyHandle, MapReader

__all__ = ["HDF5Dataset"]


# Module-level (not lambdas) so readers pickle for spawn/forkserver workers.
def _open_h5(file: Callable[[], str]) -> h5py.File:
    return h5py.File(file(), "r", rdcc_nbytes=0)


def _close_h5(f: h5py.File) -> None:
    f.close()


def _open_fd(file: Callable[[], str]) -> int:
    return os.open(file(), os.O_RDONLY)


class HDF5Dataset(MapReader):
    format = "hdf5"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._offsets = self.index.arrays["offsets"]
        self._sizes = self.index.arrays["sizes"]
        table = self.meta["storage"].get("chunk_table")
        self._chunks = self._load_table(table) if table else None
        self._chunk_bytes = int(self.meta["storage"].get("chunk_bytes") or 0)
        #: Remote without a cache: samples are read by range requests (needs the chunk table).
        self.ranged = self.remote is not None and not self.remote.cached and self._chunks is not None
        if self.remote is not None and not self.ranged:
            self._fetch_data()
        file = self.file_ref(self.data_name)
        if self._chunks is not None:
            self._fd = LazyHandle(functools.partial(_open_fd, file), os.close)
        self._h5 = LazyHandle(functools.partial(_open_h5, file), _close_h5)

    def _load_table(self, name: str) -> np.ndarray:
        if self.remote is None:
            return np.load(Path(self.root) / name)
        return np.load(io.BytesIO(self.remote.store.read(name)), allow_pickle=False)

    @property
    def chunk_table(self) -> np.ndarray | None:
        """Byte offset in the data file of each chunk of /images (``spec.HDF5_CHUNK_TABLE``);
        None for a pack without one (then samples are read through h5py)."""
        return self._chunks

    @property
    def chunk_bytes(self) -> int:
        """Bytes per chunk of /images as the index records it (0 when unrecorded)."""
        return self._chunk_bytes

    def read(self, i: int) -> bytes:
        start, size = int(self._offsets[i]), int(self._sizes[i])
        if self._chunks is not None:
            data = self._pread(i, start, size)
            if self.ranged:
                self._check_crc(i, data)
            return data
        images = self._h5.get()["images"]
        if start + size > images.shape[0]:
            raise spec.DatasetFormatError(
                f"{self.data_location}: sample {i} spans bytes {start}..{start + size}, "
                f"past the end of /images ({images.shape[0]} bytes): the file is truncated or damaged"
            )
        return images[start:start + size].tobytes()

    def _pread(self, i: int, start: int, size: int) -> bytes:
        """Read /images[start:start+size] with one pread per run of adjacent chunks."""
        cb, pieces = self._chunk_bytes, []
        pos, end = start, start + size
        while pos < end:
            k = pos // cb
            if k >= len(self._chunks):
                raise spec.DatasetFormatError(
                    f"{self.data_location}: sample {i} (bytes {start}..{end} of /images) lies past the "
                    f"last chunk: the file is truncated or damaged")
            addr, run_end = int(self._chunks[k]) + pos % cb, min(end, (k + 1) * cb)
            while run_end < end and k + 1 < len(self._chunks) and self._chunks[k + 1] == self._chunks[k] + cb:
                k += 1
                run_end = min(end, (k + 1) * cb)
            piece = self._read_at(addr, run_end - pos)
            if len(piece) != run_end - pos:
                raise spec.DatasetFormatError(
                    f"{self.data_location}: sample {i} at byte {addr} is cut short: the file is truncated")
            pieces.append(piece)
            pos = run_end
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _read_at(self, addr: int, n: int) -> bytes:
        if self.ranged:
            return self.remote.read_range(self.data_name, addr, n)
        return os.pread(self._fd.get(), n, addr)

    def _check_crc(self, i: int, data: bytes) -> None:
        want, got = int(self.index.arrays["checksums"][i]), spec.checksum(data)
        if got != want:
            from readers.remote.errors import RemoteIntegrityError

            raise RemoteIntegrityError(f"{self.data_location} sample {i}: checksum mismatch (CRC-32 {got:08x}, "
                                       f"the index says {want:08x}): damaged object")

    def close(self) -> None:
        self._h5.close()
        if self._chunks is not None:
            self._fd.close()
        super().close()
