"""``verify`` of the typed fields: the CRC-32 of every extra field's blob (``Schema.extra_fields``) per
sample, against ``field_checksums.npy``, read straight from each format's layout (``docs/fields.md``).

A damaged field is one line naming the file, the sample and the field:
``.../train-000000.tar sample 3 field 'caption': checksum differs from the index``.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from packer.formats.fieldstore import FIELD_CHECKSUMS, blob_file, field_file, offsets_file
from packer.verify_report import VerifyReport
from readers import spec
from readers.fields import Field, FieldValueError, NumericType, Schema

__all__ = ["verify_fields", "StoredFields"]


class StoredFields:
    """Random access to the stored blob of every extra field of a packed dataset (``Schema.extra_fields``),
    straight from the format's layout: :meth:`blobs` ``(i)`` gives one tuple per sample, a blob or the
    exception that says why it cannot be read. ``verify`` checks them against ``field_checksums.npy``;
    ``convert`` carries them to the new format. wds shards are indexed one at a time (samples are asked
    for in order, so each shard's tar headers are parsed once)."""

    def __init__(self, root: Path, meta: dict) -> None:
        self.root, self.meta = Path(root), meta
        self.schema = Schema.from_index(meta, str(self.root / spec.INDEX_NAME))
        self.fields: tuple[Field, ...] = self.schema.extra_fields
        self.format, self.n = meta["format"], int(meta["num_samples"])
        self._fixed: dict[str, np.ndarray] = {}
        self._var: dict[str, Any] = {}
        self._ds = self._h5 = None
        self._lmdb_names: list[str] = []
        self._shard: tuple[int, dict, Any] | None = None  # (k, (sample, field) -> (offset, size), file)
        self._shard_of = np.load(self.root / "shards.npy", mmap_mode="r") if self.format == "wds" else None

    def where(self, f: Field, i: int) -> str:
        if self.format == "wds" and not f.type.fixed:
            return str(self.root / self.meta["shards"][int(self._shard_of[i])]["name"])
        if self.format == "hdf5":
            return f"{self.root / spec.DATA_FILE['hdf5']}:/fields/{f.name}"
        if self.format == "lmdb" and not f.type.fixed:
            return str(self.root / spec.DATA_FILE["lmdb"])
        return str(self.root / (field_file(f.name) if f.type.fixed else blob_file(f.name)))

    def blobs(self, i: int) -> tuple[Any, ...]:
        return tuple(self._blob(f, i) for f in self.fields)

    def _blob(self, f: Field, i: int) -> Any:
        try:
            if f.type.fixed:
                return np.ascontiguousarray(self._column(f)[i], dtype=f.type.dtype).tobytes()
            if self.format == "wds":
                return self._wds(f, i)
            if self.format == "lmdb":  # through the reader: one LMDB environment per process and path
                value = self._lmdb()[i][self._lmdb_names.index(f.name)]
                return f.type.encode(value, f.name)
            off, data = self._blob_column(f)
            return bytes(data[int(off[i]):int(off[i + 1])])
        except (OSError, ValueError, KeyError, tarfile.TarError, FieldValueError, spec.DatasetFormatError) as exc:
            return exc

    def _column(self, f: Field) -> np.ndarray:
        col = self._fixed.get(f.name)
        if col is None:
            if self.format == "hdf5":
                col = self._hdf5()["fields"][f.name][...]
            else:
                col = np.load(self.root / field_file(f.name), mmap_mode="r", allow_pickle=False)
            self._fixed[f.name] = col
        return col

    def _blob_column(self, f: Field) -> tuple[np.ndarray, Any]:
        got = self._var.get(f.name)
        if got is None:
            if self.format == "hdf5":
                group = self._hdf5()["fields"][f.name]
                got = (group["offsets"][...], group["data"])
            else:
                path = self.root / blob_file(f.name)
                data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else b""
                got = (np.load(self.root / offsets_file(f.name), mmap_mode="r"), data)
            self._var[f.name] = got
        return got

    def _hdf5(self) -> Any:
        if self._h5 is None:
            import h5py

            self._h5 = h5py.File(self.root / spec.DATA_FILE["hdf5"], "r")
        return self._h5

    def _lmdb(self) -> Any:
        if self._ds is None:
            from readers.registry import open_dataset

            self._lmdb_names = [f.name for f in self.fields if not f.type.fixed]
            self._ds = open_dataset(self.root, decode=False, fields=tuple(self._lmdb_names))
        return self._ds

    def _wds(self, f: Field, i: int) -> Any:
        k = int(self._shard_of[i])
        if self._shard is None or self._shard[0] != k:
            if self._shard is not None:
                self._shard[2].close()
            path = self.root / self.meta["shards"][k]["name"]
            fh = open(path, "rb")
            members: dict[tuple[int, str], tuple[int, int]] = {}
            try:
                with tarfile.open(fileobj=fh, mode="r:") as tar:
                    for m in tar:
                        key, _, suffix = m.name.partition(".")
                        g = self.schema.field_of_member(suffix)
                        if g is not None and key.isdigit():
                            members[(int(key), g.name)] = (m.offset_data, m.size)
            except BaseException:
                fh.close()
                raise
            self._shard = (k, members, fh)
        _, members, fh = self._shard
        at = members.get((i, f.name))
        if at is None:
            return LookupError("member missing")
        fh.seek(at[0])
        data = fh.read(at[1])
        return f.type.encode(f.type.from_member(data, f.name), f.name) if isinstance(f.type, NumericType) else data

    def close(self) -> None:
        if self._shard is not None:
            self._shard[2].close()
            self._shard = None
        if self._ds is not None:
            self._ds.close()
            self._ds = None
        self._var.clear()
        self._fixed.clear()
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None


def _one_line(exc: Exception) -> str:
    text = str(exc).strip("'\"")
    return text.splitlines()[0] if text else type(exc).__name__


def verify_fields(root: Path, meta: dict, report: VerifyReport, tick: Callable[[int], None] | None = None) -> None:
    """Compare each extra field's blob CRC with ``field_checksums.npy``; add a problem per mismatch."""
    schema = Schema.from_index(meta, str(root / spec.INDEX_NAME))
    fields = schema.extra_fields
    if not fields:
        return
    try:
        crcs = np.load(root / FIELD_CHECKSUMS, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        report.problem(str(root / FIELD_CHECKSUMS), f"cannot be read ({exc})")
        return
    n = meta["num_samples"]
    if crcs.shape != (n, len(fields)):
        report.problem(str(root / FIELD_CHECKSUMS), f"shape {crcs.shape}, expected ({n}, {len(fields)})")
        return
    stored = StoredFields(root, meta)
    try:
        for i in range(n):
            for j, (f, blob) in enumerate(zip(fields, stored.blobs(i))):
                where = f"{stored.where(f, i)} sample {i} field {f.name!r}"
                if isinstance(blob, Exception):
                    report.problem(where, f"cannot be read ({_one_line(blob)})")
                elif spec.checksum(blob) != int(crcs[i, j]):
                    report.problem(where, "checksum differs from the index")
            if tick is not None:
                tick(1)
    finally:
        stored.close()
