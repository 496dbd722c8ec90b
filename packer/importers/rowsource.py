"""Sources of samples with typed fields: a manifest (CSV / JSONL / Parquet) or COCO instances, as a
:class:`packer.sources.source.Source` with its own prepare stage.

:func:`scan_rows` recognizes the source by its file (``rows.csv``, ``rows.jsonl``, ``rows.parquet``
without Hugging Face metadata, ``instances_*.json`` or any ``.json`` with ``--images``), reads its
rows (``packer.importers.manifest`` / ``packer.importers.coco``) and returns one source. Each row becomes one
source entry, rejected rows too (their reason is the entry's reject, so ``rejects.jsonl`` names
the row and column and the rest of the pack goes on). The prepare stage
(``packer.prepare.stage.fields_stage``, as for imports with fields) validates the image as a
folder's in the workers, then encodes every extra field (``Schema.extra_fields``); the outcome
carries the blobs to the writer.

The checked field values of every row are held in memory until the pack ends (a COCO json is
anyway; a manifest of 10M captions takes a few GB).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable

from packer.errors import SourceError
from packer.prepare.images import ImageOptions, RejectedImage, check_file_size, max_image_bytes
from packer.prepare.stage import fields_stage, label_names
from packer.importers.wds import MIN_CLASS_LIMIT
from packer.importers.manifest import Row, RowReject, manifest_kind, read_manifest
from packer.options import PackOptions
from packer.sources.source import Source
from packer.prepare.workers import read_source
from readers.contract.fields import Field, Schema
from readers.contract.spec import is_remote

__all__ = ["scan_rows", "rows_source"]

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
        from packer.importers.coco import read_coco

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
        if isinstance(r, RowReject):  # rejects.jsonl: the image as "path" (the file and row in the reason)
            entries.append(str(r))
            paths.append(_rel(root, r.image, r.row) if r.image is not None else f"{path} row {r.row}")
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
    classes = label_names(label_field, labels, path, MIN_CLASS_LIMIT) if label_field is not None else []
    source = Source(root, classes, paths, labels, sizes, kind=kind, details=details, schema=schema, file=path)
    source.prepare = fields_stage(entries, extra, reader=lambda: _FileReader(extra))
    return source


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

    def read(self, url: str, max_bytes: int | None = None) -> bytes:
        from readers.remote import open_store

        folder, _, name = url.rpartition("/")
        store = self._stores.get(folder)
        if store is None:
            store = self._stores[folder] = open_store(folder)
        return store.read(name, max_bytes=max_bytes)

    def close(self) -> None:
        for store in self._stores.values():
            close = getattr(store, "close", None)
            if close:
                close()
        self._stores.clear()


def _read_image(ref: str | bytes, opts: ImageOptions | None, remote: _Remote) -> Any:
    """The bytes of an image reference (a path, URL or the bytes), or a reason to reject it (str)."""
    if isinstance(ref, bytes):
        return ref
    try:
        if is_remote(ref):
            return _read_remote(ref, opts, remote)
        return read_source(Path(ref), opts)
    except RejectedImage as exc:
        return str(exc)
    except FileNotFoundError:
        return f"image {ref} not found"


def _read_remote(url: str, opts: ImageOptions | None, remote: _Remote) -> bytes:
    """The bytes at ``url``, read up to the image budget a local file gets (``max_image_bytes``; without
    ``opts`` the store's own cap): RejectedImage past it, an endless body cut at budget + 1 bytes."""
    from readers.remote.errors import RemoteTooLargeError

    limit = max_image_bytes(opts) if opts is not None else None
    try:
        return remote.read(url, limit)
    except RemoteTooLargeError as exc:
        if opts is None:
            raise RejectedImage(str(exc)) from None
        if exc.declared is not None:
            check_file_size(exc.declared, opts)  # the local file's message: "file too large (N bytes > ...)"
        raise RejectedImage(f"file too large (the server sent more than {max_image_bytes(opts):,} bytes, 3 bytes "
                            f"per pixel of max_pixels {opts.max_pixels:,}); not read further") from None


class _FileReader:
    """The reader of a manifest's or COCO json's rows (``packer.prepare.stage.fields_stage``): the image
    a path, URL or bytes, the values checked already, image-typed ones (a mask) read here too."""

    def __init__(self, extra: tuple[Field, ...]) -> None:
        self.images = [i for i, f in enumerate(extra) if f.type.is_image]
        self.names = [f.name for f in extra]
        self.remote = _Remote()

    def read(self, ref: str | bytes, opts: ImageOptions) -> Any:
        return _read_image(ref, opts, self.remote)

    def values(self, values: tuple) -> tuple | str:
        if not self.images:
            return values
        out = list(values)
        for i in self.images:
            if isinstance(out[i], str):
                got = _read_image(out[i], None, self.remote)
                if isinstance(got, str):
                    return f"column {self.names[i]!r}: {got}"
                out[i] = got
        return tuple(out)

    def where(self, ref: str | bytes) -> str:
        return ref if isinstance(ref, str) else "image bytes"

    def close(self) -> None:
        self.remote.close()
