"""HDF5 writer: one file ``data.h5`` in the dataset folder.

Counterpart: ``readers/formats/hdf5.py``. Layout::

    /images   uint8   (total_bytes,)  chunked (1 MiB), no filters:
              encoded image bytes of every sample, back to back
    /offsets  int64   (N + 1,)        sample i is images[offsets[i]:offsets[i+1]]
    /labels   int32   (N,)
    /fields/<name>          fixed field: (N, *shape) of its dtype
    /fields/<name>/data     variable field: uint8, the blobs back to back (chunked like /images)
    /fields/<name>/offsets  <i8 (N + 1,): sample i is data[offsets[i]:offsets[i+1]]
    /         attrs["dataset-packer"] = the index metadata (JSON; index.json adds
              file sizes, spec_version and checksum)

Beside it, ``h5chunks.npy`` (<i8, one entry per 1 MiB chunk) gives each
chunk's byte offset inside ``data.h5`` (index.json: ``storage.chunk_table``),
so readers ``pread`` samples directly; h5py reads the same bytes.

One flat byte dataset plus an offsets index, not one variable-length object
per sample: vlen reads go through the HDF5 global heap and are several times
slower. Checkpoints flush the library's buffers and fsync the file; resume
cuts ``/images`` back to the checkpoint's length.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any, Callable

import h5py
import numpy as np

from packer.formats.base import FormatWriter, merged
from packer.prepare.images import Prepared
from packer.output import start_writeback
from readers.contract.fields import hdf5_field_path
from readers.formats.h5layout import chunk_table
from readers.contract.messages import one_line
from readers.contract.spec import DATA_FILE, HDF5_CHUNK_BYTES, HDF5_CHUNK_TABLE, atomic_write

__all__ = ["HDF5Writer"]

#: Free space kept back before every write: libhdf5 cannot recover from a full disk (its close and
#: its exit handler retry the failed flush and can crash the process), so the writer stops first.
ROOM_MARGIN = 2 * HDF5_CHUNK_BYTES + (4 << 20)
_BLOCK_BYTES = 16 * HDF5_CHUNK_BYTES  # samples are written to /images up to this many bytes at a time


def _room(path: os.PathLike, nbytes: int) -> None:
    """Raise ENOSPC unless ``nbytes`` plus :data:`ROOM_MARGIN` fit on ``path``'s filesystem."""
    st = os.statvfs(os.path.dirname(path))
    if st.f_bavail * st.f_frsize < nbytes + ROOM_MARGIN:
        raise OSError(errno.ENOSPC, "No space left on device (checked before HDF5 writes)", str(path))


def _h5_error(exc: Exception, path: os.PathLike) -> OSError:
    """h5py reports I/O failures as RuntimeError/OSError with errno only in the text."""
    code = errno.ENOSPC if "errno = 28" in str(exc) or "No space left" in str(exc) else errno.EIO
    return OSError(code, f"HDF5: {one_line(exc, first=True)}", str(path))


def _on_file(path: os.PathLike, call: Callable[[int], Any]) -> None:
    """``call(fd)`` on a descriptor of a file h5py has open (any descriptor reaches its pages):
    ``os.fsync`` flushes them, ``start_writeback`` starts writing them."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        call(fd)
    finally:
        os.close(fd)


class HDF5Writer(FormatWriter):
    format = "hdf5"
    location_fields = ("offsets",)
    variable_blobs = True

    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        self.path = self.root / DATA_FILE[self.format]
        # Samples are copied into one reused block of whole chunks, which go to /images as raw chunks
        # (H5Dwrite_chunk: one write each, no selection or chunk cache) once the block is full: a new
        # 16 MB buffer per write (b"".join) paid a page fault per 4 KB, 0.13-0.5 s per 5,000 images,
        # and h5py's slice writes cost 20% more than raw chunks. The block starts at a chunk
        # boundary (``_base``); a partial chunk at its end is written at checkpoints, its tail zeroed.
        self._block = np.empty(_BLOCK_BYTES, dtype=np.uint8)
        self._view = self._block.data  # a memoryview of it
        if state and self.path.exists():
            self.h5 = h5py.File(self.path, "r+")
            self.pos = int(state["bytes"])
            self.images = self.h5["images"]
            self.images.resize((self.pos,))
            self._base = self.pos // HDF5_CHUNK_BYTES * HDF5_CHUNK_BYTES
            self._fill = self.pos - self._base
            if self._fill:  # the partial last chunk, rewritten whole with what follows it
                self.images.read_direct(self._block, np.s_[self._base:self.pos], np.s_[:self._fill])
        else:
            self.h5 = h5py.File(self.path, "w", track_order=False)
            self.images = self.h5.create_dataset("images", shape=(0,), maxshape=(None,), dtype=np.uint8,
                                                 chunks=(HDF5_CHUNK_BYTES,), track_times=False)
            self.pos = self._base = self._fill = 0
        self._since = 0
        if self.field_store is not None:
            self.field_store.open(samples)

    def _drain(self) -> None:
        """Write the block's bytes to /images (whole chunks; the last one's tail zeroed, as HDF5 fills an
        unwritten part) and keep a partial last chunk at the block's start, to be written again whole."""
        if not self._fill:
            return
        chunk = HDF5_CHUNK_BYTES
        end = -(-self._fill // chunk) * chunk
        self._block[self._fill:end] = 0
        _room(self.path, end)
        try:
            self.images.resize((self._base + self._fill,))
            write = self.images.id.write_direct_chunk
            for at in range(0, end, chunk):
                write((self._base + at,), self._block[at:at + chunk])
        except (RuntimeError, OSError, ValueError) as exc:
            raise _h5_error(exc, self.path) from exc
        whole = self._fill // chunk * chunk
        if whole:
            rest = self._fill - whole
            self._block[:rest] = self._block[whole:self._fill]
            self._base, self._fill = self._base + whole, rest
        _on_file(self.path, start_writeback)  # the disk works while the packer does; the fsync waits less

    def append(self, sample_no: int, prepared: Prepared, label: int,
               fields: tuple[bytes, ...] | None = None) -> tuple[int]:
        if fields is not None or self.extra:
            self.store_fields(fields)
        data, offset, fill = prepared.data, self.pos, self._fill
        n = len(data)
        if fill + n < len(self._view):  # it fits in the block (a memoryview's slice copy: a memcpy)
            self._view[fill:fill + n] = data
            self._fill = fill + n
        else:  # it fills the block, and may run over more than one
            array, block, done = np.frombuffer(data, dtype=np.uint8), self._block, 0
            while done < n:
                k = min(n - done, len(block) - self._fill)
                block[self._fill:self._fill + k] = array[done:done + k]
                self._fill += k
                done += k
                if self._fill == len(block):
                    self._drain()
        self.pos += n
        self._since += n
        return (offset,)

    def at_checkpoint_boundary(self) -> bool:
        return self._since >= self.options.checkpoint_bytes

    def checkpoint(self) -> dict[str, Any]:
        self._drain()
        _room(self.path, 0)
        try:
            self.h5.flush()
        except (RuntimeError, OSError) as exc:
            raise _h5_error(exc, self.path) from exc
        _on_file(self.path, os.fsync)
        if self.field_store is not None:
            self.field_store.checkpoint()
        self._since = 0
        return {"bytes": self.pos}

    def finalize(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        self._drain()
        offsets = np.empty(len(arrays["labels"]) + 1, dtype="<i8")
        offsets[:-1] = arrays["offsets"]
        offsets[-1] = self.pos
        text = json.dumps(merged(meta, {"storage": {}}), sort_keys=True)
        _room(self.path, 2 * offsets.nbytes + len(text) + 8 * (self.pos // HDF5_CHUNK_BYTES + 1))
        try:
            for name, values in (("offsets", offsets), ("labels", arrays["labels"])):
                if name in self.h5:
                    del self.h5[name]
                self.h5.create_dataset(name, data=values, track_times=False)
            field_files = self._write_fields(len(offsets) - 1)
            storage = {"chunk_table": self._chunk_table(), "chunk_bytes": HDF5_CHUNK_BYTES}
            self.h5.attrs["dataset-packer"] = json.dumps(merged(meta, {"storage": storage}), sort_keys=True)
            self.h5.close()
        except (RuntimeError, OSError) as exc:
            raise _h5_error(exc, self.path) from exc
        _on_file(self.path, os.fsync)
        if self.field_store is not None:
            self.field_store.discard()
        return {"storage": storage, "files": {self.path.name: self.path.stat().st_size, **field_files}}

    def _write_fields(self, n: int) -> dict[str, int]:
        """``/fields``: the extra fields' columns and blobs, copied from the side files (``FieldStore``)."""
        if self.field_store is None:
            return {}
        store = self.field_store
        files = store.finalize(n, keep_columns=False)
        if "fields" in self.h5:
            del self.h5["fields"]
        self.h5.create_group("fields", track_order=False)
        for _, f in store.fixed:
            column = store.column(f, n)
            _room(self.path, column.nbytes)
            self.h5.create_dataset(hdf5_field_path(f.name), data=column, track_times=False)
            del column
        for _, f in store.variable:
            offsets = store.offsets(f, n)
            _room(self.path, int(offsets[-1]) + offsets.nbytes)
            self.h5.create_group(hdf5_field_path(f.name), track_order=False)
            data = self.h5.create_dataset(hdf5_field_path(f.name, "data"), shape=(int(offsets[-1]),), maxshape=(None,), dtype=np.uint8,
                                      chunks=(max(1, min(HDF5_CHUNK_BYTES, int(offsets[-1]))),),
                                      track_times=False)
            with open(store.blob_path(f), "rb") as fh:
                pos = 0
                while chunk := fh.read(_BLOCK_BYTES):
                    data[pos:pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
                    pos += len(chunk)
            self.h5.create_dataset(hdf5_field_path(f.name, "offsets"), data=offsets, track_times=False)
        return files

    def _chunk_table(self) -> str | None:
        """Write ``h5chunks.npy``: the file offset of each 1 MiB chunk of /images, in order.

        Readers then ``pread`` a sample straight from the file (one call, two
        when it straddles chunks) instead of going through the chunk B-tree and
        cache, which read a whole 1 MiB chunk per ~100 KB sample. Written only
        when every chunk is stored raw (no filters), as this writer makes them.
        The table is built in one pass over the chunk index
        (``readers.formats.h5layout.chunk_table``; verify checks it with the same function).
        """
        table = chunk_table(self.images, HDF5_CHUNK_BYTES)
        if table is None:
            return None
        with atomic_write(self.root / HDF5_CHUNK_TABLE) as f:  # renamed over: an append's readers keep theirs
            np.save(f, table)
        return HDF5_CHUNK_TABLE

    def abort(self) -> None:
        if self.field_store is not None:
            self.field_store.close()
        try:
            self.h5.close()
        except (OSError, ValueError, AttributeError):
            pass
