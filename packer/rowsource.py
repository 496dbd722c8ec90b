"""Sources of samples with typed fields: a manifest (CSV / JSONL / Parquet) or COCO instances, as a
:class:`packer.source.Source` with its own prepare stage.

:func:`scan_rows` recognizes the source by its file (``rows.csv``, ``rows.jsonl``, ``rows.parquet``
without Hugging Face metadata, ``instances_*.json`` or any ``.json`` with ``--images``), reads its
rows (``packer.manifest`` / ``packer.coco``) and returns one source. Each row becomes one
source entry, rejected rows too (their reason is the entry's reject, so ``rejects.jsonl`` names
the row and column and the rest of the pack goes on). The prepare stage (worker processes,
``packer.importers.stage``) validates the image as a folder's, then encodes every extra field
(``Schema.extra_fields``); the outcome carries the blobs to the writer.

The checked field values of every row are held in memory until the pack ends (a COCO json is
anyway; a manifest of 10M captions takes a few GB).
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Iterator

from packer.errors import SourceError
from packer.images import ImageOptions, RejectedImage, check_file_size
from packer.importers.stage import Unreadable, ordered_outcomes
from packer.manifest import Row, RowReject, manifest_kind, read_manifest
from packer.options import PackOptions
from packer.source import Source
from packer.workers import Outcome, outcome_of, read_source
from readers.fields import Field, FieldValueError, ImageType, Schema
from readers.spec import is_remote

__all__ = ["scan_rows", "rows_source", "fields_stage", "encode_fields"]

log = logging.getLogger(__name__)


def _is_hf_parquet(path: Path) -> bool:
    """A Parquet file written by Hugging Face ``datasets`` (its schema metadata says so)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with the test extras
        return False
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError):
        return False
    return b"huggingface" in meta


def scan_rows(src: Path, options: PackOptions) -> list[tuple[str, Source]] | None:
    """(split, source) for a manifest or COCO source file; None when ``src`` is neither."""
    if not src.is_file():
        if options.images is not None:
            raise SourceError(f"{src}: --images goes with a COCO instances .json file, not a folder")
        return None
    kind = manifest_kind(src)
    if kind == "parquet" and _is_hf_parquet(src):
        return None  # a Hugging Face dataset (packer.importers.hf)
    split = _split_name(src)
    if kind is not None:
        if options.images is not None:
            raise SourceError(f"{src}: --images goes with a COCO instances .json file; a manifest names "
                              "its images in its image column")
        manifest = read_manifest(src, image_column=options.image_column, fields=options.fields)
        return [(split, rows_source(src, src.parent, manifest.rows(), manifest.schema, "manifest",
                                    manifest.describe()))]
    if src.suffix.lower() == ".json":
        from packer.coco import read_coco

        if options.fields is not None or options.image_column != "image":
            raise SourceError(f"{src}: --fields and --image-column apply to manifests; a COCO source has "
                              "its own fields")
        coco = read_coco(src, options.images)
        return [(split, rows_source(src, coco.images_dir, coco.rows(), coco.schema, "coco", coco.describe()))]
    return None


def _split_name(path: Path) -> str:
    import re

    name = path.stem
    if name.startswith("instances_"):
        name = name[len("instances_"):]
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "data"


def _rel(root: Path, ref: str | bytes, row: int) -> str:
    if isinstance(ref, bytes):
        return f"row {row}"
    if is_remote(ref):
        return ref
    p = Path(ref)
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(p)


def rows_source(path: Path, root: Path, rows: Iterable[Row | RowReject], schema: Schema, kind: str,
                details: dict[str, Any]) -> Source:
    """A source of one entry per row of the file ``path`` (rejects included), images relative to ``root``,
    whose prepare stage encodes the fields."""
    extra = schema.extra_fields
    label_field = schema.labels_field
    entries: list[Any] = []  # per row: a RowReject's message, or (image ref, extra values, where)
    paths, labels, sizes = [], [], []
    for r in rows:
        if isinstance(r, RowReject):
            entries.append(str(r))
            paths.append(f"row {r.row}")
            labels.append(0)
            sizes.append(0)
            continue
        where = f"{path} row {r.row}"
        entries.append((r.image, tuple(r.values[f.name] for f in extra), where))
        paths.append(_rel(root, r.image, r.row))
        labels.append(int(r.values[label_field.name]) if label_field is not None else 0)
        sizes.append(len(r.image) if isinstance(r.image, bytes) else _size(r.image))
    if not entries:
        raise SourceError(f"{root}: the source has no rows")
    classes = label_names(label_field, labels, path) if label_field is not None else []
    source = Source(root, classes, paths, labels, sizes, kind=kind, details=details, schema=schema)
    source.prepare = fields_stage(entries, extra)
    return source


def label_names(label_field: Field, labels: list[int], where: Any) -> list[str]:
    """index.json's ``classes`` for the values of the ``label`` field: its class names, else ``"0"``,
    ``"1"``, ... up to the largest value, at most ``max(MIN_CLASS_LIMIT, samples)`` of them (a label
    of 500,000,000 is broken or hostile: one line naming ``where``, as for imported shards)."""
    from packer.importers.wds import MIN_CLASS_LIMIT

    low, high = (min(labels), max(labels)) if labels else (0, -1)
    limit = max(MIN_CLASS_LIMIT, len(labels))
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise SourceError(f"{where}: label {bad:,} is not a class index (0 .. {limit - 1:,}: the labels of the "
                          "'label' field name classes)")
    names = dict(label_field.classes or {})
    count = max(high + 1, max(names) + 1 if names else 0)
    return [names.get(i, str(i)) for i in range(count)]


def _size(ref: str) -> int:
    if is_remote(ref):
        return 0
    try:
        return os.stat(ref).st_size
    except OSError:
        return 0


class _Remote:
    """Images named by ``s3://`` / ``http(s)://`` URLs: one store per folder URL (``readers.remote``)."""

    def __init__(self) -> None:
        self._stores: dict[str, Any] = {}

    def read(self, url: str) -> bytes:
        from readers.remote import open_store

        folder, _, name = url.rpartition("/")
        store = self._stores.get(folder)
        if store is None:
            store = self._stores[folder] = open_store(folder)
        return store.read(name)

    def close(self) -> None:
        for store in self._stores.values():
            close = getattr(store, "close", None)
            if close:
                close()
        self._stores.clear()


def _read_image(ref: str | bytes, opts: ImageOptions | None, remote: _Remote, where: str, column: str) -> Any:
    """The bytes of an image reference, a reject reason (str) or an :class:`Unreadable`."""
    if isinstance(ref, bytes):
        return ref
    try:
        if is_remote(ref):
            return remote.read(ref)
        return read_source(Path(ref), opts)
    except RejectedImage as exc:
        return f"{where} column {column!r}: {exc}"
    except FileNotFoundError:
        return f"{where} column {column!r}: image {ref} not found"
    except OSError as exc:
        return Unreadable(f"{ref}: read error: {exc.strerror or exc}")


def fields_stage(entries: list[Any], extra: tuple[Field, ...], *, reader: Any = None, members: bool = False):
    """The prepare stage of a row source: reads each entry's image (and image-typed fields) in this
    process, then validates the image and encodes the fields in the workers (:func:`encode_fields`).

    ``entries[pos]``: a reject's one-line reason, or ``(image, values, where)``. Without ``reader`` the
    image is a path, URL or bytes and the values are checked values; with ``reader`` (a callable giving
    an object with ``read(ref, opts)`` -> the image bytes or a reason to reject it, ``values(values)``
    -> the values, ``where(ref)`` and ``close()``: WebDataset members, Hugging Face rows) the image and
    values are what it reads; ``members=True`` decodes the values as WebDataset members."""

    def read_refs(positions: list[int], opts: ImageOptions) -> Iterator[Any]:
        r = reader()
        try:
            for pos in positions:
                entry = entries[pos]
                if isinstance(entry, str):
                    yield (entry, (), "")
                    continue
                ref, values, where = entry
                try:
                    data = r.read(ref, opts)
                    yield (data, r.values(values), where) if isinstance(data, bytes) else \
                        (f"{where} column 'image': {data}", (), where)
                except RejectedImage as exc:
                    yield (f"{where} column 'image': {exc}", (), where)
                except OSError as exc:
                    yield (Unreadable(f"{r.where(ref)}: read error: {exc.strerror or exc}"), (), where)
        finally:
            r.close()

    def read(positions: list[int], opts: ImageOptions) -> Iterator[Any]:
        remote = _Remote()
        try:
            for pos in positions:
                entry = entries[pos]
                if isinstance(entry, str):
                    yield (entry, (), "")
                    continue
                ref, values, where = entry
                data = _read_image(ref, opts, remote, where, "image")
                if not isinstance(data, str):
                    values = list(values)
                    for i, f in enumerate(extra):
                        if isinstance(f.type, ImageType) and isinstance(values[i], str):
                            got = _read_image(values[i], None, remote, where, f.name)
                            if isinstance(got, str):
                                data = got
                                break
                            values[i] = got
                    values = tuple(values)
                yield (data, values, where)
        finally:
            remote.close()

    def stage(source: Any, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        items = (read_refs if reader is not None else read)(source.positions(start), opts)
        try:
            yield from ordered_outcomes(items, partial(encode_fields, extra, members), opts, workers,
                                        describe=lambda n: f"{source.root}/{source.paths[start + n]}")
        finally:
            items.close()

    return stage


def encode_fields(extra: tuple[Field, ...], members: bool, item: tuple[Any, tuple, str],
                  opts: ImageOptions) -> Outcome:
    """Runs in a worker: one row's image validated (``outcome_of``, as a folder's) and its extra fields
    encoded (``members``: each value is a WebDataset member, decoded first); a reject names the row
    (or shard and key) and the column (field)."""
    data, values, where = item
    if isinstance(data, Unreadable):
        return Outcome(None, problem=str(data), unreadable=True)
    if isinstance(data, str):
        return Outcome(None, problem=data)
    outcome = outcome_of(data, opts)
    if outcome.prepared is None:
        return outcome._replace(problem=f"{where} column 'image': {outcome.problem}")
    try:
        if members:
            values = tuple(f.type.from_member(v, f.name) for f, v in zip(extra, values, strict=True))
        blobs = tuple(f.type.encode(v, f.name) for f, v in zip(extra, values, strict=True))
    except FieldValueError as exc:
        return Outcome(None, problem=f"{where}: {exc}")
    return outcome._replace(fields=blobs)
