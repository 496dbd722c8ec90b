"""HDF5 reader. Counterpart: ``packer/formats/hdf5.py`` (layout there).

Sample ``i`` is ``/images[offsets[i]:offsets[i+1]]``. The offsets come from
``offsets.npy``/``sizes.npy`` (loaded once, small). With the packer's chunk
table (``storage.chunk_table``, normally ``spec.HDF5_CHUNK_TABLE``: each
chunk's byte offset in the file)
a sample is one ``os.pread`` (two when it straddles non-adjacent chunks);
without it the file is opened with h5py, lazily per process, without a
chunk cache.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import h5py
import numpy as np
import torch

from readers import spec
from readers.base import LazyHandle, MapReader
from readers.batch import Allocator, batch_buffer, finish_batch, index_array
from readers.shmring import ByteBatch

__all__ = ["HDF5Dataset"]


# Module-level (not lambdas) so readers pickle for spawn/forkserver workers.
def _open_h5(file: str) -> h5py.File:
    return h5py.File(file, "r", rdcc_nbytes=0)


def _close_h5(f: h5py.File) -> None:
    f.close()


def _map_file(file: str) -> np.ndarray:
    if os.path.getsize(file) == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(file, dtype=np.uint8, mode="r")


class HDF5Dataset(MapReader):
    format = "hdf5"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._offsets = self.index.arrays["offsets"]
        self._sizes = self.index.arrays["sizes"]
        file = str(self.data_file)
        table = self.meta["storage"].get("chunk_table")
        self._chunks = np.load(self.root / table) if table else None
        self._chunk_bytes = int(self.meta["storage"].get("chunk_bytes") or 0)
        if self._chunks is not None:
            self._fd = LazyHandle(functools.partial(os.open, file, os.O_RDONLY), os.close)
            # whole batches (get_batch) copy out of a read-only mapping: page cache, not private memory
            self._mapped = LazyHandle(functools.partial(_map_file, file))
        self._h5 = LazyHandle(functools.partial(_open_h5, file), _close_h5)

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
            return self._pread(i, start, size)
        images = self._h5.get()["images"]
        if start + size > images.shape[0]:
            raise spec.DatasetFormatError(
                f"{self.data_file}: sample {i} spans bytes {start}..{start + size}, "
                f"past the end of /images ({images.shape[0]} bytes): the file is truncated or damaged"
            )
        return images[start:start + size].tobytes()

    def _pread(self, i: int, start: int, size: int) -> bytes:
        """Read /images[start:start+size] with one pread per run of adjacent chunks."""
        fd, cb, pieces = self._fd.get(), self._chunk_bytes, []
        pos, end = start, start + size
        while pos < end:
            k = pos // cb
            if k >= len(self._chunks):
                raise spec.DatasetFormatError(
                    f"{self.data_file}: sample {i} (bytes {start}..{end} of /images) lies past the "
                    f"last chunk: the file is truncated or damaged")
            addr, run_end = int(self._chunks[k]) + pos % cb, min(end, (k + 1) * cb)
            while run_end < end and k + 1 < len(self._chunks) and self._chunks[k + 1] == self._chunks[k] + cb:
                k += 1
                run_end = min(end, (k + 1) * cb)
            piece = os.pread(fd, run_end - pos, addr)
            if len(piece) != run_end - pos:
                raise spec.DatasetFormatError(
                    f"{self.data_file}: sample {i} at byte {addr} is cut short: the file is truncated")
            pieces.append(piece)
            pos = run_end
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def batchable(self) -> bool:
        return not self.decode and self._chunks is not None

    def get_batch(self, indices: list[int], alloc: Allocator | None = None) -> tuple | None:
        """``decode=False`` with a chunk table: each sample copied from a read-only mapping of the
        file straight into one ByteBatch buffer, no per-sample ``bytes``; see ``readers.batch``.
        (A copy out of mapped page cache costs a memcpy; ``os.pread`` costs ~2x that.)"""
        if not self.batchable():
            return None
        idx = index_array(indices, len(self.labels))
        sizes = self._sizes[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = batch_buffer(int(offsets[-1]), alloc)
        mapped = self._mapped.get()
        for k, i in enumerate(idx.tolist()):
            self._copy_out(mapped, i, int(self._offsets[i]), data[offsets[k]:offsets[k + 1]])
        return finish_batch(self, ByteBatch(torch.from_numpy(data), torch.from_numpy(offsets)), idx)

    def _copy_out(self, mapped: np.ndarray, i: int, start: int, out: np.ndarray) -> None:
        """Copy /images[start:start+len(out)] into ``out``, one slice per run of adjacent chunks."""
        cb, end, pos = self._chunk_bytes, start + len(out), start
        while pos < end:
            k = pos // cb
            if k >= len(self._chunks):
                raise spec.DatasetFormatError(
                    f"{self.data_file}: sample {i} (bytes {start}..{end} of /images) lies past the "
                    f"last chunk: the file is truncated or damaged")
            addr, run_end = int(self._chunks[k]) + pos % cb, min(end, (k + 1) * cb)
            while run_end < end and k + 1 < len(self._chunks) and self._chunks[k + 1] == self._chunks[k] + cb:
                k += 1
                run_end = min(end, (k + 1) * cb)
            if addr + run_end - pos > len(mapped):
                raise spec.DatasetFormatError(
                    f"{self.data_file}: sample {i} at byte {addr} is cut short: the file is truncated")
            out[pos - start:run_end - start] = mapped[addr:addr + run_end - pos]
            pos = run_end

    def close(self) -> None:
        self._h5.close()
        if self._chunks is not None:
            self._fd.close()
            self._mapped.close()
