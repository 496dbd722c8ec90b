"""The typed fields of a pack (``readers.contract.fields.Schema.extra_fields``) kept in side files while it runs,
and turned into the files every format shares at the end. Used by all four writers.

Counterpart: the readers of each format (``docs/fields.md``, "How each format stores fields").
While the pack runs, in the dataset folder::

    field-<name>.npy.part        fixed field: the raw little-endian rows, nbytes each, sample order
    field-<name>.bin.part        variable field (``variable=True``): the blobs back to back
    field-<name>.ends.part       ... and <i8 per sample: where its blob ends in the .bin.part
    field_checksums.part         <u4 x F per sample: CRC-32 of each extra field's blob
    field_sizes.part             <i8 x F per sample: each blob's length (for the stats in index.json)

A checkpoint fsyncs them; a resume cuts each back to the samples of the checkpoint
(``samples * row bytes``; a blob file to the last end kept). :meth:`FieldStore.finalize` writes::

    field-<name>.npy             (N, *shape) of the field's dtype (an .npy file; mapped by readers)
    field-<name>.bin             variable: the blobs (the .bin.part renamed)
    field-<name>.offsets.npy     variable: <i8 (N + 1,), sample i is bin[off[i]:off[i+1]]
    field_checksums.npy          <u4 (N, F): F = len(extra_fields), in schema order

HDF5 copies the columns into ``/fields`` and keeps none of these files but ``field_checksums.npy``
(``keep=False`` for the column files).
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import numpy as np

from readers.contract import spec
from readers.contract.fields import Field, Schema, blob_file, column_file, offsets_file

__all__ = ["FieldStore", "FIELD_CHECKSUMS", "CRC_PART", "SIZES_PART", "field_file", "offsets_file", "blob_file", "is_field_file"]

#: ``(N, F) <u4``: the CRC-32 of each extra field's stored blob per sample (``readers.contract.spec.checksum``).
FIELD_CHECKSUMS = "field_checksums.npy"
_CRC_PART = CRC_PART = "field_checksums.part"  # CRC_PART, SIZES_PART: packer.appending seeds them
_SIZES_PART = SIZES_PART = "field_sizes.part"
_OFFSET = np.dtype("<i8")  # byte positions: blobs of a large dataset pass 2**31
_CRC = np.dtype("<u4")
_END_ROW = struct.Struct("<q").pack  # a variable field's running end, one row of its .ends file


field_file = column_file  # the names are the contract's (readers.contract.fields, "field layout")


def _ends_part(name: str) -> str:
    """The side file of variable field ``name``'s running ends (``field-<name>.ends.part``)."""
    return blob_file(name).replace(".bin", ".ends") + ".part"


def is_field_file(name: str) -> bool:
    """A file name this module writes (final or in progress): ``--overwrite`` may delete it."""
    if name in (FIELD_CHECKSUMS, _CRC_PART, _SIZES_PART) or name == FIELD_CHECKSUMS + ".tmp":
        return True
    return name.startswith("field-") and name.endswith((".npy", ".bin", ".part", ".tmp"))


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with spec.atomic_write(path) as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)


def _raw_to_npy(raw: Path, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """The raw rows in ``raw`` as the .npy file ``path`` (header + the same bytes), durably; ``raw`` goes."""
    with spec.atomic_write(path) as out, open(raw, "rb") as src:
        np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                   "fortran_order": False, "shape": shape})
        while chunk := src.read(1 << 22):
            out.write(chunk)
    raw.unlink()


class FieldStore:
    """Side files of the extra fields of ``schema`` in ``root`` (see the module docstring).

    ``variable``: keep variable fields as blob + offsets too (mmap, hdf5); wds and lmdb store them
    as members / values and pass ``variable=False``.
    """

    def __init__(self, root: Path, schema: Schema, variable: bool) -> None:
        self.root = root
        self.fields: tuple[Field, ...] = schema.extra_fields
        self.fixed = [(i, f) for i, f in enumerate(self.fields) if f.type.fixed]
        self.variable = [(i, f) for i, f in enumerate(self.fields) if not f.type.fixed] if variable else []
        self._files: dict[str, BinaryIO] = {}
        self._ends: list[int] = []  # per variable field (self.variable's order): where its blobs end so far
        self._variable_out: list[tuple[int, int, Any, Any]] = []  # (blob index, ends position, writes)
        self.samples = 0
        #: after :meth:`finalize`: field name -> stats (bytes, min/max bytes, rows or values)
        self.stats: dict[str, dict[str, Any]] = {}

    def _part(self, name: str) -> Path:
        return self.root / name

    def open(self, samples: int) -> None:
        """Start, or resume with the first ``samples`` samples kept (a checkpoint vouched for them)."""
        self.samples = samples
        width = len(self.fields) * _CRC.itemsize
        self._open(_CRC_PART, samples * width)
        self._open(_SIZES_PART, samples * len(self.fields) * _OFFSET.itemsize)
        for _, f in self.fixed:
            dtype, shape = f.type.column_layout(samples)
            self._open(field_file(f.name) + ".part", dtype.itemsize * math.prod(shape))
        # append's targets, looked up once: per sample it only writes
        files = self._files
        self._ends, self._variable_out = [], []
        for k, (i, f) in enumerate(self.variable):
            ends, blob = _ends_part(f.name), blob_file(f.name) + ".part"
            end = 0
            if samples and self._part(ends).exists():
                with open(self._part(ends), "rb") as e:
                    e.seek((samples - 1) * _OFFSET.itemsize)
                    end = int(np.frombuffer(e.read(_OFFSET.itemsize), _OFFSET)[0])
            self._open(ends, samples * _OFFSET.itemsize)
            self._open(blob, end)
            self._ends.append(end)
            self._variable_out.append((i, k, files[blob].write, files[ends].write))
        self._rows = (files[_CRC_PART].write, files[_SIZES_PART].write,
                      struct.Struct(f"<{len(self.fields)}I").pack, struct.Struct(f"<{len(self.fields)}q").pack)
        self._fixed_out = [(i, files[field_file(f.name) + ".part"].write) for i, f in self.fixed]

    def _open(self, name: str, keep: int) -> None:
        path = self._part(name)
        fh = open(path, "r+b" if keep and path.exists() else "wb")
        fh.truncate(keep)
        fh.seek(keep)
        self._files[name] = fh

    def append(self, blobs: Sequence[bytes]) -> None:
        """One sample's blobs (one per extra field, in order). Once per sample: the rows are packed
        with ``struct`` (little-endian, as :data:`_CRC` and :data:`_OFFSET`), not small arrays, into
        the files :meth:`open` looked up."""
        write_crcs, write_sizes, crc_row, size_row = self._rows
        write_crcs(crc_row(*[spec.checksum(b) for b in blobs]))
        write_sizes(size_row(*[len(b) for b in blobs]))
        for i, write in self._fixed_out:
            write(blobs[i])
        if self._variable_out:
            ends = self._ends
            for i, k, write_blob, write_end in self._variable_out:
                blob = blobs[i]
                write_blob(blob)
                ends[k] = end = ends[k] + len(blob)
                write_end(_END_ROW(end))
        self.samples += 1

    def checkpoint(self) -> None:
        for fh in self._files.values():
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def finalize(self, n: int, keep_columns: bool = True, meta: dict[str, Any] | None = None) -> dict[str, int]:
        """Write the final files for ``n`` samples; data file name -> bytes (for index.json's ``files``).
        ``keep_columns=False``: the column files are left to :meth:`columns` / :meth:`blobs` and
        :meth:`discard` (HDF5 copies them); only ``field_checksums.npy`` is written. ``meta``: the
        index being written (an append's generation names the columns, as it names the index arrays)."""
        self.checkpoint()
        self.close()
        crcs = np.fromfile(self._part(_CRC_PART), dtype=_CRC).reshape(n, len(self.fields))
        _save_npy(self.root / FIELD_CHECKSUMS, crcs)
        self._part(_CRC_PART).unlink()
        sizes = np.fromfile(self._part(_SIZES_PART), dtype=_OFFSET).reshape(n, len(self.fields))
        self.stats = {f.name: self._stats(f, sizes[:, j], n) for j, f in enumerate(self.fields)}
        self._part(_SIZES_PART).unlink()
        files = {FIELD_CHECKSUMS: (self.root / FIELD_CHECKSUMS).stat().st_size}
        if not keep_columns:
            return files
        for _, f in self.fixed:
            path = self.root / field_file(f.name, meta)
            _raw_to_npy(self._part(field_file(f.name) + ".part"), path, *f.type.column_layout(n))
            files[path.name] = path.stat().st_size
        for _, f in self.variable:
            offsets = self.offsets(f, n)
            _save_npy(self.root / offsets_file(f.name), offsets)
            self._part(_ends_part(f.name)).unlink()
            blob = self.root / blob_file(f.name)
            with open(self._part(blob.name + ".part"), "rb+") as fh:
                os.fsync(fh.fileno())
            spec.publish(self._part(blob.name + ".part"), blob, durable=False)  # the folder: below
            files[blob.name] = blob.stat().st_size
            files[offsets_file(f.name)] = (self.root / offsets_file(f.name)).stat().st_size
        spec.fsync_dir(self.root)
        return files

    def _stats(self, f: Field, sizes: np.ndarray, n: int) -> dict[str, Any]:
        """Per-field stats for index.json's ``field_stats`` (``pack-dataset info`` prints them). A
        size of -1 is unknown (a sample an append found written: ``packer.appending`` adds its stats)."""
        known = sizes[sizes >= 0]
        out: dict[str, Any] = {"bytes": int(known.sum())}
        if not n or not len(known):
            return out
        sizes = known
        smallest, largest = int(sizes.min()), int(sizes.max())
        out.update(min_bytes=smallest, max_bytes=largest)
        fewest, most = f.type.blob_rows(smallest), f.type.blob_rows(largest)
        if fewest is not None and most is not None:  # a variable array: its rows per sample
            out.update(min_rows=fewest, max_rows=most)
        if f.type.fixed:
            col = self.column(f, n)
            span = f.type.value_range(col)
            if span is not None:
                out.update(min=span[0], max=span[1])
            del col
        return out

    # ---- for a writer that copies the columns elsewhere (HDF5), after finalize(keep_columns=False)
    def column(self, f: Field, n: int) -> np.ndarray:
        """A fixed field's ``(n, *shape)`` rows, mapped from its side file."""
        path = self._part(field_file(f.name) + ".part")
        dtype, shape = f.type.column_layout(n)
        if n == 0 or path.stat().st_size == 0:
            return np.zeros(shape, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=shape)

    def offsets(self, f: Field, n: int) -> np.ndarray:
        ends = self._part(_ends_part(f.name))
        out = np.zeros(n + 1, dtype=_OFFSET)
        out[1:] = np.fromfile(ends, dtype=_OFFSET, count=n)
        return out

    def blob_path(self, f: Field) -> Path:
        return self._part(blob_file(f.name) + ".part")

    def discard(self) -> None:
        """Remove the column side files (after a writer copied them)."""
        for _, f in self.fixed:
            self._part(field_file(f.name) + ".part").unlink(missing_ok=True)
        for _, f in self.variable:
            self._part(blob_file(f.name) + ".part").unlink(missing_ok=True)
            self._part(_ends_part(f.name)).unlink(missing_ok=True)

    def state(self) -> dict[str, Any]:
        return {"field_samples": self.samples}
