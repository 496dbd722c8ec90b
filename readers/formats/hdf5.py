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

Safety: ``data.h5`` and the chunk table must be regular files inside the
dataset folder (``data.h5`` at least the size index.json records); every
chunk table entry must leave a whole chunk inside ``data.h5``. With the
chunk table, libhdf5 never parses ``data.h5`` in a reader. Without it,
each process opens ``data.h5`` with h5py (lazily, before its first sample)
and ``/images`` must be a plain one-dimensional ``uint8`` dataset stored in
``data.h5`` itself, chunked and unfiltered as the packer writes it: an
external link, a virtual dataset or external raw storage (all of which make
HDF5 read other files), a filter (a gzip bomb inflates a whole chunk per
sample read) or another layout is refused at that open, in one line naming
the file, before any sample is read (``readers.formats.h5layout``).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Iterator, Sequence

import h5py
import numpy as np

from readers.contract import spec
from readers.formats.base import MapReader
from readers.contract.fields import Field, hdf5_field_path
from readers.formats.batch import Allocator, byte_offsets, copy_runs, finish_batch, index_array, new_byte_batch
from readers.formats.h5layout import check_images
from readers.contract.perprocess import PerProcess

__all__ = ["HDF5Dataset"]


# Module-level (not lambdas) so readers pickle for spawn/forkserver workers.
def _open_fd(file: Callable[[], str], size: int | None = None) -> int:
    """A descriptor of the data file, checked by :func:`readers.contract.safeio.open_data_file` (regular, never
    blocking, at least ``size`` bytes); ``file`` names it only when it is opened."""
    return spec.open_data_file(file(), size)


def _open_h5(file: Callable[[], str], size: int | None = None) -> h5py.File:
    os.close(_open_fd(file, size))
    path = file()
    try:
        f = h5py.File(path, "r", rdcc_nbytes=0)
    except OSError as exc:
        raise spec.DatasetFormatError(f"{path}: not a readable HDF5 file ({exc})") from None
    try:
        check_images(f, path)
    except BaseException:
        f.close()
        raise
    return f


def _field_dataset(f: h5py.File, file: str, name: str) -> h5py.Dataset:
    """``/fields/<name>`` (a fixed field) or ``/fields/<name>/data`` / ``offsets``, checked as
    ``/images`` is: a hard link to a dataset stored in ``file`` itself, without filters."""
    link = f.get(name, getlink=True)
    if not isinstance(link, h5py.HardLink) or not isinstance(f.get(name), h5py.Dataset):
        raise spec.DatasetFormatError(f"{file}: /{name} is missing or not a dataset stored in this file; refusing it")
    ds = f[name]
    if ds.is_virtual or ds.external:
        raise spec.DatasetFormatError(f"{file}: /{name} stores its bytes in other files; refusing it")
    dcpl = ds.id.get_create_plist()
    if dcpl.get_nfilters():
        raise spec.DatasetFormatError(f"{file}: /{name} is stored through HDF5 filters; the packer writes it "
                                      "unfiltered: refusing it")
    return ds


def _close_h5(f: h5py.File) -> None:
    f.close()


def _map_file(file: Callable[[], str], size: int | None = None) -> np.ndarray:
    """The data file mapped read-only, from a descriptor checked as ``_open_fd`` checks it."""
    fd = _open_fd(file, size)
    try:
        return spec.map_file(fd)
    finally:
        os.close(fd)


class HDF5Dataset(MapReader):
    format = "hdf5"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._offsets = self.index.arrays["offsets"]
        self._sizes = self.index.arrays["sizes"]
        storage = self.meta["storage"]
        size = (self.meta.get("files") or {}).get(self.data_name)
        if self.remote is None:  # a symlink leaving the folder is refused before anything opens it
            spec.member_path(self.root, self.data_name, "data file")
        table = storage.get("chunk_table")
        self._chunk_bytes = int(storage.get("chunk_bytes") or 0)
        self._chunks = self._load_table(table, size) if table else None
        #: Remote without a cache: samples are read by range requests (needs the chunk table).
        self.ranged = self.remote is not None and not self.remote.cached and self._chunks is not None
        if self.remote is not None and not self.ranged:
            self._fetch_data()
        file = self.file_ref(self.data_name)
        if self._chunks is not None:
            self._fd = PerProcess(functools.partial(_open_fd, file, size), os.close)
            # whole batches (get_batch) copy out of a read-only mapping: page cache, not private memory
            self._mapped = PerProcess(functools.partial(_map_file, file, size))
        self._h5 = PerProcess(functools.partial(_open_h5, file, size), _close_h5)

    def _load_table(self, name: str, data_size: int | None) -> np.ndarray:
        """The chunk table, checked: every entry leaves a whole chunk inside data.h5."""
        where = self.location_of(name)
        if self.remote is None:
            path = spec.member_path(self.root, name, "chunk table")
            raw = spec.read_regular(path, "chunk table")
            fd = _open_fd(self.file_ref(self.data_name), data_size)
            try:
                data_size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        else:
            raw = bytearray(self.remote.store.read(spec.check_member_name(name, f"{where}: chunk table")))
        table = spec.parse_npy(where, raw, np.dtype("<i8"), what="chunk table")
        if data_size is not None:
            bad = np.flatnonzero((table < 0) | (table > data_size - self._chunk_bytes))
            if len(bad):
                raise spec.DatasetFormatError(
                    f"{where}: chunk {bad[0]} at byte {table[bad[0]]} does not lie inside "
                    f"{self.data_name} ({data_size} bytes)")
        return table

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
        try:
            return images[start:start + size].tobytes()
        except OSError as exc:  # HDF5 cannot read the chunk (damaged B-tree or chunk)
            raise spec.DatasetFormatError(f"{self.data_location} sample {i}: unreadable ({exc})") from None

    def _runs(self, i: int, start: int, end: int) -> Iterator[tuple[int, int, int]]:
        """``(file address, pos, run_end)`` for each run of adjacent chunks holding /images[start:end]."""
        cb, pos, chunks = self._chunk_bytes, start, self._chunks
        assert chunks is not None, "read with the chunk table"
        while pos < end:
            k = pos // cb
            if k >= len(chunks):
                raise spec.DatasetFormatError(
                    f"{self.data_location}: sample {i} (bytes {start}..{end} of /images) lies past the "
                    f"last chunk: the file is truncated or damaged")
            addr, run_end = int(chunks[k]) + pos % cb, min(end, (k + 1) * cb)
            while run_end < end and k + 1 < len(chunks) and chunks[k + 1] == chunks[k] + cb:
                k += 1
                run_end = min(end, (k + 1) * cb)
            yield addr, pos, run_end
            pos = run_end

    def _pread(self, i: int, start: int, size: int) -> bytes:
        """Read /images[start:start+size] with one pread per run of adjacent chunks."""
        pieces = []
        for addr, pos, run_end in self._runs(i, start, start + size):
            piece = self._read_at(addr, run_end - pos)
            if len(piece) != run_end - pos:
                raise spec.DatasetFormatError(
                    f"{self.data_location}: sample {i} at byte {addr} is cut short: the file is truncated")
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _read_at(self, addr: int, n: int) -> bytes:
        if self.ranged:
            assert self.remote is not None, "ranged: remote without a cache"
            return self.remote.read_range(self.data_name, addr, n)
        return os.pread(self._fd.get(), n, addr)

    def _check_crc(self, i: int, data: bytes) -> None:
        want, got = int(self.index.arrays["checksums"][i]), spec.checksum(data)
        if got != want:
            from readers.remote.errors import RemoteIntegrityError

            raise RemoteIntegrityError(f"{self.data_location} sample {i}: checksum mismatch (CRC-32 {got:08x}, "
                                       f"the index says {want:08x}): damaged object")

    # ------------------------------------------------------------ fields (docs/fields.md)
    def _h5_field(self, name: str) -> h5py.Dataset:
        if self.ranged:
            raise ValueError(f"{self.data_location}: fields other than image and label of a remote hdf5 "
                             "dataset are read from its cached copy: open it with cache_dir=...")
        return _field_dataset(self._h5.get(), self.data_location, name)

    def field_location(self, field: Any, i: int) -> str:
        return f"{self.data_location}:/fields/{field.name}"

    def _open_column(self, field: Any) -> np.ndarray:
        """``/fields/<name>`` (N, *shape); ``label`` of a dataset packed before fields: ``labels.npy``."""
        f = self._h5.get() if not self.ranged else None
        if field.name == "label" and (f is None or hdf5_field_path(field.name) not in f):
            return self.labels
        ds = self._h5_field(hdf5_field_path(field.name))
        want = (len(self.labels), *field.type.shape)
        if ds.dtype != field.type.dtype or ds.shape != want:
            raise spec.DatasetFormatError(
                f"{self.data_location}: /fields/{field.name} holds {ds.dtype.str} {ds.shape}; the schema says "
                f"{field.type.name} for {want[0]} samples ({field.type.dtype.str} {want})")
        offset = ds.id.get_offset()
        if offset is not None and ds.size:  # contiguous: mapped, the page cache shared by every worker
            return np.memmap(self._h5.get().filename, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
        return ds[()]

    def _read_blobs(self, i: int, fields: Sequence[Field]) -> dict[str, bytes]:
        """Variable fields: ``/fields/<name>/data[off[i]:off[i+1]]`` with ``off`` = ``/fields/<name>/offsets``."""
        out = {}
        for f in fields:
            offsets = self._column_offsets(f.name)
            start, end = int(offsets[i]), int(offsets[i + 1])
            data = self._field_data(f.name)
            if not 0 <= start <= end <= data.shape[0]:
                raise spec.DatasetFormatError(f"{self.data_location}: sample {i} field {f.name!r} spans bytes "
                                              f"{start}..{end}, outside /fields/{f.name}/data ({data.shape[0]})")
            try:
                out[f.name] = data[start:end].tobytes()
            except OSError as exc:
                raise spec.DatasetFormatError(f"{self.data_location} sample {i} field {f.name!r}: unreadable "
                                              f"({exc})") from None
        return out

    def _field_data(self, name: str) -> h5py.Dataset:
        """``/fields/<name>/data``, checked once per process (the check opens its creation property
        list: ~0.3 ms, more than the read of a caption itself)."""
        columns = self._columns.get()
        key = name + "/data"
        ds = columns.get(key)
        if ds is None:
            ds = columns[key] = self._h5_field(hdf5_field_path(name, "data"))
        return ds

    def _column_offsets(self, name: str) -> np.ndarray:
        columns = self._columns.get()
        key = name + "/offsets"
        arr = columns.get(key)
        if arr is None:
            ds = self._h5_field(hdf5_field_path(name, "offsets"))
            if ds.shape != (len(self.labels) + 1,) or ds.dtype.kind not in "iu":
                raise spec.DatasetFormatError(f"{self.data_location}: /fields/{key} must hold "
                                              f"{len(self.labels) + 1} integers, holds {ds.dtype.str} {ds.shape}")
            offset = ds.id.get_offset()
            if offset is not None and ds.dtype == np.dtype("<i8"):  # contiguous: mapped, shared page cache
                arr = np.memmap(self._h5.get().filename, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
            else:
                arr = np.asarray(ds[()], dtype=np.int64)
            columns[key] = arr
        return arr

    def batchable(self) -> bool:
        return not self.decode and self.fields is None and self._chunks is not None and not self.ranged

    def get_batch(self, indices: list[int], alloc: Allocator | None = None) -> tuple | None:
        """``decode=False`` with a chunk table: each sample copied from a read-only mapping of the
        file straight into one ByteBatch buffer, no per-sample ``bytes``; see ``readers.formats.batch``.
        (A copy out of mapped page cache costs a memcpy; ``os.pread`` costs ~2x that.) Remote
        without a cache: None (each sample is a range request with its CRC checked)."""
        if not self.batchable():
            return None
        idx = index_array(indices, len(self.labels))
        sizes = self._sizes[idx]
        offsets = byte_offsets(sizes)
        batch, data = new_byte_batch(offsets, alloc)
        mapped = self._mapped.get()
        starts = self._offsets[idx]
        addrs = self._addresses(starts, sizes)
        cut = np.flatnonzero((addrs >= 0) & (addrs + sizes > len(mapped)))
        if len(cut):
            raise spec.DatasetFormatError(f"{self.data_location}: sample {idx[cut[0]]} at byte {addrs[cut[0]]} is "
                                          "cut short: the file is truncated")
        sources, which, at = [mapped], np.zeros(len(idx), dtype=np.int64), addrs.copy()
        for k in np.flatnonzero(addrs < 0).tolist():  # spans chunks that are not adjacent in the file
            piece = np.empty(int(sizes[k]), dtype=np.uint8)
            self._copy_out(mapped, int(idx[k]), int(starts[k]), piece)
            which[k], at[k] = len(sources), 0
            sources.append(piece)
        copy_runs(data, sources, which, at, sizes)
        return finish_batch(self, batch, idx)

    def _addresses(self, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """The file address of each sample /images[start:start+size] that lies in one chunk or two
        adjacent ones (all of them, as the packer writes); -1 for any other (read run by run)."""
        cb, chunks = self._chunk_bytes, self._chunks
        assert chunks is not None
        first = starts // cb
        last = (starts + np.maximum(sizes, 1) - 1) // cb
        inside = last < len(chunks)
        a, b = np.minimum(first, len(chunks) - 1), np.minimum(last, len(chunks) - 1)
        whole = inside & ((b == a) | ((b == a + 1) & (chunks[b] == chunks[a] + cb)))
        return np.where(whole, chunks[a] + starts % cb, -1)

    def _copy_out(self, mapped: np.ndarray, i: int, start: int, out: np.ndarray) -> None:
        """Copy /images[start:start+len(out)] into ``out``, one slice per run of adjacent chunks."""
        for addr, pos, run_end in self._runs(i, start, start + len(out)):
            if addr + run_end - pos > len(mapped):
                raise spec.DatasetFormatError(
                    f"{self.data_location}: sample {i} at byte {addr} is cut short: the file is truncated")
            out[pos - start:run_end - start] = mapped[addr:addr + run_end - pos]

    def close(self) -> None:
        self._h5.close()
        if self._chunks is not None:
            self._fd.close()
            self._mapped.close()
        super().close()
