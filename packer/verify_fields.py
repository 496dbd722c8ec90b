"""``verify`` of the typed fields: the CRC-32 of every extra field's blob (``Schema.extra_fields``) per
sample, against ``field_checksums.npy``, read straight from each format's layout (``docs/fields.md``).

A damaged field is one line naming the file, the sample and the field:
``.../train-000000.tar sample 3 field 'caption': checksum differs from the index``.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from packer.formats.fieldstore import FIELD_CHECKSUMS, blob_file, field_file, offsets_file
from packer.verify_report import VerifyReport
from readers import spec
from readers.fields import Field, FieldValueError, NumericType, Schema

__all__ = ["verify_fields", "field_blobs"]

Blobs = Iterator[tuple[int, Field, str, Any]]  # (sample, field, where, blob bytes or an Exception)


def _npy(root: Path, name: str) -> np.ndarray:
    return np.load(root / name, mmap_mode="r", allow_pickle=False)


def _fixed_blobs(root: Path, fields: tuple[Field, ...], n: int) -> Blobs:
    for f in fields:
        if f.type.fixed:
            col = _npy(root, field_file(f.name))
            for i in range(n):
                yield i, f, str(root / field_file(f.name)), np.ascontiguousarray(col[i], dtype=f.type.dtype).tobytes()


def _wds_blobs(root: Path, meta: dict, schema: Schema, fields: tuple[Field, ...]) -> Blobs:
    want = {f.name for f in fields if not f.type.fixed}
    for shard in meta["shards"]:
        path = root / shard["name"]
        seen: dict[int, set[str]] = {}
        with tarfile.open(path, "r:") as tar:
            for m in tar:
                key, _, suffix = m.name.partition(".")
                f = schema.field_of_member(suffix)
                if f is None or f.name not in want or not key.isdigit():
                    continue
                i = int(key)
                seen.setdefault(i, set()).add(f.name)
                data = tar.extractfile(m).read()
                try:
                    blob = f.type.encode(f.type.from_member(data, f.name), f.name) \
                        if isinstance(f.type, NumericType) else data
                except FieldValueError as exc:
                    yield i, f, str(path), exc
                    continue
                yield i, f, str(path), blob
        first = int(shard.get("first", 0))
        for i in range(first, first + int(shard["samples"])):
            for name in sorted(want - seen.get(i, set())):
                yield i, schema[name], str(path), LookupError("member missing")
    yield from _fixed_blobs(root, fields, meta["num_samples"])


def _lmdb_blobs(root: Path, meta: dict, fields: tuple[Field, ...]) -> Blobs:
    import lmdb

    n = meta["num_samples"]
    where = str(root / spec.DATA_FILE["lmdb"])
    env = lmdb.open(str(root), readonly=True, lock=False, subdir=True, readahead=False)
    try:
        with env.begin(buffers=False) as txn:
            for f in fields:
                if f.type.fixed:
                    continue
                for i in range(n):
                    blob = txn.get(spec.lmdb_key(i) + b"/" + f.name.encode())
                    yield i, f, where, LookupError("value missing") if blob is None else blob
    finally:
        env.close()
    yield from _fixed_blobs(root, fields, n)


def _blob_files(root: Path, fields: tuple[Field, ...], n: int) -> Blobs:
    for f in fields:
        if f.type.fixed:
            continue
        off = _npy(root, offsets_file(f.name))
        data = np.memmap(root / blob_file(f.name), dtype=np.uint8, mode="r") \
            if (root / blob_file(f.name)).stat().st_size else np.zeros(0, np.uint8)
        for i in range(n):
            yield i, f, str(root / blob_file(f.name)), data[int(off[i]):int(off[i + 1])].tobytes()
        del data
    yield from _fixed_blobs(root, fields, n)


def _hdf5_blobs(root: Path, meta: dict, fields: tuple[Field, ...]) -> Blobs:
    import h5py

    n, path = meta["num_samples"], root / spec.DATA_FILE["hdf5"]
    with h5py.File(path, "r") as h5:
        for f in fields:
            where = f"{path}:/fields/{f.name}"
            if f.type.fixed:
                col = h5["fields"][f.name][...]
                for i in range(n):
                    yield i, f, where, np.ascontiguousarray(col[i], dtype=f.type.dtype).tobytes()
            else:
                off, data = h5["fields"][f.name]["offsets"][...], h5["fields"][f.name]["data"][...]
                for i in range(n):
                    yield i, f, where, data[int(off[i]):int(off[i + 1])].tobytes()


def field_blobs(root: Path, meta: dict) -> Blobs:
    """Every extra field's stored blob of every sample, as the format keeps it."""
    schema = Schema.from_index(meta, str(root / spec.INDEX_NAME))
    fields = schema.extra_fields
    fmt = meta["format"]
    if fmt == "wds":
        return _wds_blobs(root, meta, schema, fields)
    if fmt == "lmdb":
        return _lmdb_blobs(root, meta, fields)
    if fmt == "hdf5":
        return _hdf5_blobs(root, meta, fields)
    return _blob_files(root, fields, meta["num_samples"])


def verify_fields(root: Path, meta: dict, report: VerifyReport, tick: Callable[[int], None] | None = None) -> None:
    """Compare each extra field's blob CRC with ``field_checksums.npy``; add a problem per mismatch."""
    schema = Schema.from_index(meta, str(root / spec.INDEX_NAME))
    fields = schema.extra_fields
    if not fields:
        return
    try:
        crcs = _npy(root, FIELD_CHECKSUMS)
    except (OSError, ValueError) as exc:
        report.problem(str(root / FIELD_CHECKSUMS), f"cannot be read ({exc})")
        return
    n = meta["num_samples"]
    if crcs.shape != (n, len(fields)):
        report.problem(str(root / FIELD_CHECKSUMS), f"shape {crcs.shape}, expected ({n}, {len(fields)})")
        return
    column = {f.name: j for j, f in enumerate(fields)}
    try:
        for i, f, where, blob in field_blobs(root, meta):
            if isinstance(blob, Exception):
                report.problem(f"{where} sample {i} field {f.name!r}", str(blob).split(": ", 1)[-1])
            elif spec.checksum(blob) != int(crcs[i, column[f.name]]):
                report.problem(f"{where} sample {i} field {f.name!r}", "checksum differs from the index")
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        report.problem(str(root), f"the fields cannot be read ({exc})")
