"""``verify`` of the typed fields: every extra field (``Schema.extra_fields``) of every sample read
through the readers' own field access (``PackedDataset.field_blob``: the format's field layout,
with every check a read makes, then decoded as a read decodes it) and its blob's CRC-32 compared
with ``field_checksums.npy`` (``docs/fields.md``). So a dataset ``verify`` calls OK is one whose
every field of every sample reads: offsets past a blob, a column whose shape contradicts the
schema, a per-sample array of the wrong length, a ``.npy`` member whose header claims more
than it holds are reported as the readers refuse them.

A damaged field is one line naming the file, the sample and the field:
``.../train-000000.tar sample 3 field 'caption': checksum differs from the index``; a field that
no sample can be read of (its column or offsets damaged) is one line too, at the first sample,
saying how many more samples the same damage hides.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from packer.formats.fieldstore import FIELD_CHECKSUMS
from packer.tools.verify_report import VerifyReport, reason
from readers.contract import spec
from readers.contract.fields import Field, Schema
from readers.contract.messages import one_line
from readers.contract.safeio import map_pages, npy_header

__all__ = ["verify_fields", "StoredFields", "load_field_checksums"]

_CRC = np.dtype("<u4")
#: What a read of a damaged field raises: the readers' one-line errors (FieldValueError is a ValueError).
_UNREADABLE = (spec.DatasetFormatError, OSError, ValueError)


def load_field_checksums(root: Any, n: int, width: int) -> np.ndarray:
    """``field_checksums.npy`` of a local dataset: ``<u4 (n, width)``, its header checked against the
    file's bytes (:func:`readers.contract.safeio.npy_header`) before it is mapped; DatasetFormatError otherwise."""
    path = os.path.join(root, FIELD_CHECKSUMS)
    fd = spec.open_regular(path, "field checksums")
    try:
        size = os.fstat(fd).st_size
        buf = memoryview(map_pages(fd, size)).cast("B") if size else memoryview(b"")
    finally:
        os.close(fd)
    try:
        head = npy_header(buf)
    except ValueError as exc:
        raise spec.DatasetFormatError(f"{path}: cannot be read ({exc})") from None
    if head.dtype != _CRC or head.fortran or head.shape != (n, width):
        raise spec.DatasetFormatError(f"{path}: holds {head.dtype.str} {head.shape}, expected {_CRC.str} "
                                      f"({n}, {width})")
    return np.frombuffer(buf, dtype=_CRC, count=head.count, offset=head.offset).reshape(n, width)


class StoredFields:
    """The stored blob of every extra field of a packed local dataset, sample by sample, read by the
    dataset's own reader (``field_blob``). :meth:`blobs` ``(i)`` gives one entry per field: its blob,
    or the exception that says why a read of it fails. ``verify`` checks them against
    ``field_checksums.npy``; ``convert`` carries them to the new format."""

    def __init__(self, index: spec.Index) -> None:
        self.root = index.root
        self.schema = Schema.from_index(index.meta, str(index.location) + "/" + spec.INDEX_NAME)
        self.fields: tuple[Field, ...] = self.schema.extra_fields
        self._ds: Any = None
        if self.fields:
            from readers.formats.registry import open_dataset  # imports torch

            self._ds = open_dataset(index, decode=False, fields=tuple(f.name for f in self.fields))

    def where(self, f: Field, i: int) -> str:
        """The file (HDF5: and dataset) holding field ``f`` of sample ``i`` (the reader's field layout)."""
        return self._ds.field_location(f, i)

    def blob(self, i: int, f: Field) -> bytes | Exception:
        try:
            return self._ds.field_blob(i, f)
        except _UNREADABLE as exc:
            return exc

    def blobs(self, i: int) -> tuple[Any, ...]:
        return tuple(self.blob(i, f) for f in self.fields)

    def close(self) -> None:
        if self._ds is not None:
            self._ds.close()
            self._ds = None


def verify_fields(index: spec.Index, report: VerifyReport, tick: Callable[[int], None] | None = None) -> None:
    """Read every extra field of every sample as the readers do and compare each blob's CRC with
    ``field_checksums.npy``; add one problem per damaged sample and field (one per field for damage
    that every sample of it shares, such as a column of the wrong shape)."""
    schema = Schema.from_index(index.meta, str(index.location) + "/" + spec.INDEX_NAME)
    fields = schema.extra_fields
    if not fields:
        return
    n = index.num_samples
    try:
        crcs = load_field_checksums(index.root, n, len(fields))
    except spec.DatasetFormatError as exc:
        path = os.path.join(index.root, FIELD_CHECKSUMS)
        report.problem(path, reason(exc, path))
        return
    stored = StoredFields(index)
    shared: dict[tuple[str, str], list[int]] = {}  # (field, reason) -> [its problem's position, samples]
    try:
        for i in range(n):
            for j, f in enumerate(fields):
                blob = stored.blob(i, f)
                if isinstance(blob, Exception):
                    file = stored.where(f, i).split(":/", 1)[0]  # hdf5: data.h5:/fields/<name>
                    what = one_line(reason(blob, file).strip("'\""), first=True)
                    seen = shared.get((f.name, what))
                    if seen is not None:  # the same damage as an earlier sample: counted, not repeated
                        seen[1] += 1
                        continue
                    shared[(f.name, what)] = [len(report.problems), 1]
                    report.problem(f"{stored.where(f, i)} sample {i} field {f.name!r}", f"cannot be read ({what})")
                elif spec.checksum(blob) != int(crcs[i, j]):
                    report.problem(f"{stored.where(f, i)} sample {i} field {f.name!r}",
                                   "checksum differs from the index")
            if tick is not None:
                tick(1)
    finally:
        stored.close()
    for at, count in shared.values():
        if count > 1:
            prob = report.problems[at]
            report.problems[at] = dataclasses.replace(prob, what=f"{prob.what}; the same for {count - 1} more "
                                                                 "samples")
