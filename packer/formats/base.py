"""What every format writer implements; ``packer.pipeline`` drives it.

A writer only knows how to open its files, append one sample, make what it
has written durable (a checkpoint) and finish. The pipeline owns the rest:
the source, parallel preparation, index arrays, journal, resume, progress.

The pipeline calls, in this order::

    open(samples, state)                      fresh (0, None) or resumed from a checkpoint
    append(sample_no, prepared, label[, fields])  once per sample, sample_no = 0, 1, 2, ...
      -> at_checkpoint_boundary()?  -> checkpoint() -> state (saved in the journal)
    end_samples(); checkpoint()               no more samples
    finalize(meta, arrays) -> extra meta      the index arrays are final
    abort()                                   instead of the above, after any error

Each sample's index record holds labels, checksums, sizes, heights and
widths (the pipeline knows them) plus the writer's ``location_fields``:
where the sample sits in the writer's files, returned by ``append``.
``readers.contract.spec.REQUIRED_ARRAYS`` decides which of them the index keeps.

Typed fields: a writer made with a ``schema`` that has extra fields
(``Schema.extra_fields``: every field but ``image`` and the ``label`` kept in
``labels.npy``) gets their encoded blobs in ``append(..., fields)``, one per
extra field in schema order. :attr:`FormatWriter.field_store`
(``packer.formats.fieldstore``) keeps the fixed ones as columns, their CRCs,
and (``variable_blobs``) the variable ones as blob + offsets; each format
stores the rest its own way (``docs/fields.md``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from packer.formats.fieldstore import FieldStore
from packer.prepare.images import Prepared
from packer.options import PackOptions
from readers.contract.fields import Schema

__all__ = ["FormatWriter", "merged"]


class FormatWriter(ABC):
    #: the format's name in ``index.json`` (one of ``readers.contract.spec.FORMATS``)
    format: ClassVar[str] = ""
    #: index arrays that ``append`` fills, in the order of the values it returns
    location_fields: ClassVar[tuple[str, ...]] = ()
    #: True when samples are decoded pixels rather than encoded bytes
    pixels: ClassVar[bool] = False
    #: True when :attr:`field_store` keeps variable fields as blob + offsets (formats without records)
    variable_blobs: ClassVar[bool] = False
    #: True when the writer's commits and syncs are long calls without the GIL, wrapped in
    #: ``packer.prepare.readahead.outside_gil``: a ``packer.Writer`` then gates its caller on them
    gil_free_commits: ClassVar[bool] = False

    def __init__(self, root: Path, split: str, options: PackOptions, estimated_bytes: int,
                 schema: Schema | None = None) -> None:
        self.root = root
        self.split = split
        self.options = options
        self.estimated_bytes = estimated_bytes
        #: the samples' fields (None: image + label, as before fields existed)
        self.schema = schema
        self.extra = schema.extra_fields if schema is not None else ()
        self.field_store = FieldStore(root, schema, self.variable_blobs) if schema is not None and self.extra \
            else None

    @abstractmethod
    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        """Start writing. On resume, ``samples`` are durable as of the checkpoint that
        returned ``state``: drop anything written after it."""

    @abstractmethod
    def append(self, sample_no: int, prepared: Prepared, label: int,
               fields: tuple[bytes, ...] | None = None) -> tuple[int, ...]:
        """Append sample number ``sample_no`` (``fields``: the blobs of :attr:`extra`); return one value per
        ``location_fields`` name."""

    @abstractmethod
    def at_checkpoint_boundary(self) -> bool:
        """True when this is a good moment for a checkpoint (e.g. a shard just closed)."""

    @abstractmethod
    def checkpoint(self) -> dict[str, Any]:
        """Make all samples appended so far durable; return the state ``open`` resumes from."""

    def end_samples(self) -> None:
        """No more samples: reach a durable boundary (wds closes its open shard)."""

    @abstractmethod
    def finalize(self, meta: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
        """Finish the data files durably, given the final index metadata and arrays.

        ``meta`` is not modified. Returns what to add to it: top-level keys
        (``files``: data file name -> bytes, ...), and under ``storage``,
        keys to add to ``meta["storage"]``.
        """

    def abort(self) -> None:
        """Release handles after an error; the journal keeps the output resumable."""

    def store_fields(self, fields: tuple[bytes, ...] | None) -> tuple[bytes, ...]:
        """``append``'s ``fields`` (one blob per :attr:`extra` field, in order) handed to
        :attr:`field_store`; returns them (``()`` for a writer without extra fields). A ValueError,
        before anything is written, when there are not as many as :attr:`extra`."""
        blobs = fields or ()
        if len(blobs) != len(self.extra):
            raise ValueError(f"append() got {len(blobs)} field blobs for {len(self.extra)} extra fields "
                             f"({', '.join(f.name for f in self.extra) or 'none'})")
        if self.field_store is not None:
            self.field_store.append(blobs)
        return blobs


def merged(meta: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``meta`` plus what ``finalize`` returned (``storage`` merged key by key); a new dict."""
    out = dict(meta, **{k: v for k, v in extra.items() if k != "storage"})
    if "storage" in extra:
        out["storage"] = {**meta.get("storage", {}), **extra["storage"]}
    return out
