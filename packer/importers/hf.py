"""Import a Hugging Face ``datasets`` image classification dataset: saved with ``save_to_disk``, or Parquet.

Recognized sources:

* a folder written by ``Dataset.save_to_disk`` (``state.json``, ``dataset_info.json``,
  ``*.arrow``): one split, named after the folder;
* a folder written by ``DatasetDict.save_to_disk`` (``dataset_dict.json``): one split per entry;
* a ``.parquet`` file, or a folder of them (``Dataset.to_parquet``, or the Hub's
  ``data/<split>-00000-of-00003.parquet`` layout: files are grouped into splits by that prefix).

The dataset needs one image column (``datasets.Image``) and one ``ClassLabel``
column; class names come from the ClassLabel, labels are its indexes. Rows
keep their order; a row whose label is -1 (no label) is ignored, as a
non-image file in a folder is. The stored image bytes (or the file an image
``path`` points to) go through the same validation as a folder's files.
``names.jsonl`` records ``<row>`` or ``<row>:<path>`` when the image has a path.

**Every column as a field.** A dataset with columns beyond its image and ClassLabel (or with no
ClassLabel) is imported with typed fields (``readers.contract.fields``), each column by its feature type:
the first ``Image`` column is the field ``image`` (any other ``Image`` a second image), ``Value``
strings ``text``, numbers their dtype (``bool`` as ``uint8``), ``binary`` ``bytes``, a ``ClassLabel``
``int32`` with its names as the field's classes (named ``label``: kept in ``labels.npy`` as
before), ``Sequence`` of numbers ``DTYPE[*]`` (of fixed-length sequences ``DTYPE[*,k]``; a fixed
length ``DTYPE[k]``), ``Array2D``/``Array3D`` their shape, anything else ``json``. A value that does
not fit its field is a one-line reject naming the row and column.

``datasets`` (and its ``pyarrow``) is an optional dependency
(``pip install 'dataset-packer[hf]'``), imported only when such a source is packed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from packer.errors import SourceError
from packer.prepare.images import ImageOptions, RejectedImage, check_file_size
from packer.prepare.stage import Unreadable, bytes_stage, fields_stage
from packer.sources.columns import IntBuilder, StringBuilder
from packer.sources.source import Source, list_folder
from packer.prepare.workers import read_source
from readers.contract.fields import (NUMERIC_DTYPES, Field, FieldType, FieldTypeError, FieldValueError, ImageType, JsonType,
                            NumericType, Schema, check_field_name, parse_type)

__all__ = ["is_hf_source", "scan_hf"]

_BATCH = 256
_HUB_SPLIT = re.compile(r"^(?P<split>[A-Za-z0-9_.]+?)-\d{5}-of-\d{5}\.parquet$")


def _parquet_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src] if src.suffix.lower() == ".parquet" else []
    def parquet(folder: Path) -> list[Path]:  # glob("*.parquet") over the one listing of the folder
        return [Path(e.path) for e in list_folder(folder) if e.name.endswith(".parquet")
                and not e.name.startswith(".") and e.is_file()]

    here = parquet(src)
    return parquet(src / "data") if not here and (src / "data").is_dir() else here


def is_hf_source(src: Path) -> bool:
    if src.is_dir() and ((src / "dataset_dict.json").is_file()
                         or ((src / "state.json").is_file() and (src / "dataset_info.json").is_file())):
        return True
    return bool(_parquet_files(src))


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise SourceError("reading a Hugging Face dataset needs the 'datasets' package: "
                          "pip install 'dataset-packer[hf]'") from None
    return datasets


@dataclass
class _Columns:
    image: str
    label: str
    classes: list[str]
    #: every column as a field (None: image + label, as before fields existed)
    schema: Schema | None = None


_VALUE_TYPES = {"string": "text", "large_string": "text", "bool": "uint8", "binary": "bytes", "large_binary": "bytes",
                "float": "float32", "double": "float64"}


def _numeric(dtype: str) -> str | None:
    name = _VALUE_TYPES.get(dtype, dtype)
    return name if name in NUMERIC_DTYPES else None


def _feature_type(f: Any) -> tuple[FieldType, dict[int, str] | None]:
    """The field type of a ``datasets`` feature (and class names for a ClassLabel)."""
    ds = _datasets()
    if isinstance(f, ds.Image):
        return ImageType(), None
    if isinstance(f, ds.ClassLabel):
        return NumericType("int32"), dict(enumerate(f.names))
    if isinstance(f, ds.Value):
        name = _VALUE_TYPES.get(f.dtype, f.dtype)
        return (parse_type(name), None) if name in ("text", "bytes") or name in NUMERIC_DTYPES else (JsonType(), None)
    arrays = tuple(getattr(ds, n) for n in ("Array2D", "Array3D", "Array4D", "Array5D") if hasattr(ds, n))
    if arrays and isinstance(f, arrays) and (dtype := _numeric(f.dtype)) is not None:
        shape = tuple(f.shape)
        if all(isinstance(d, int) and d >= 1 for d in shape):
            return NumericType(dtype, shape), None
        if shape[0] is None and all(isinstance(d, int) and d >= 1 for d in shape[1:]):
            return NumericType(dtype, shape), None
    seq = getattr(ds, "Sequence", None)
    lists = tuple(t for t in (seq, getattr(ds, "List", None), getattr(ds, "LargeList", None)) if t is not None)
    if lists and isinstance(f, lists):
        inner = f.feature
        length = getattr(f, "length", -1)
        if isinstance(inner, ds.Value) and (dtype := _numeric(inner.dtype)) is not None:
            return NumericType(dtype, (None if length in (-1, None) else length,)), None
        if isinstance(inner, lists) and isinstance(inner.feature, ds.Value) \
                and (dtype := _numeric(inner.feature.dtype)) is not None and getattr(inner, "length", -1) not in (-1, None):
            return NumericType(dtype, (None if length in (-1, None) else length, inner.length)), None
    return JsonType(), None


def _schema(features: Any, image: str, where: Path) -> Schema:
    out = [Field("image", ImageType())]
    for name, f in features.items():
        if name == image:
            continue
        if name == "image":
            raise SourceError(f"{where}: column 'image' is not the first Image column ({image!r} is); the image "
                              "field is named 'image': rename the column")
        try:
            t, classes = _feature_type(f)
            out.append(Field(check_field_name(name), t, classes))
        except FieldTypeError as exc:
            raise SourceError(f"{where}: column {name!r} cannot be a field ({exc})") from None
    try:
        return Schema(tuple(out))
    except FieldTypeError as exc:
        raise SourceError(f"{where}: {exc}") from None


def _columns(features: Any, where: Path) -> _Columns:
    ds = _datasets()
    image = next((k for k, f in features.items() if isinstance(f, ds.Image)), None)
    label = next((k for k, f in features.items() if isinstance(f, ds.ClassLabel)), None)
    if image is not None and (label is None or len(features) > 2):
        return _Columns(image, label or "", [], schema=_schema(features, image, where))
    if image is None or label is None:
        missing = "an Image column" if image is None else "a ClassLabel column"
        columns = ", ".join(f"{k} {type(f).__name__}" for k, f in features.items())
        raise SourceError(f"{where}: needs {missing} (columns: {columns})")
    return _Columns(image, label, list(features[label].names))


# ---------------------------------------------------------------------------- tables: arrow on disk or parquet
class _ArrowTable:
    """A ``save_to_disk`` dataset, memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ds = _datasets().load_from_disk(str(path))
        self.columns = _columns(self.ds.features, path)
        self.rows = len(self.ds)

    def batches(self, start: int, columns: list[str]) -> Iterator[Any]:
        arrow = self.ds.with_format("arrow")
        for a in range(start, self.rows, _BATCH):
            yield arrow[a:a + _BATCH].select(columns)

    def take(self, rows: list[int], column: str) -> list[Any]:
        """Column ``column`` of ``rows`` (any order: the table is memory-mapped)."""
        return self.ds.with_format("arrow")[rows].column(column).to_pylist()


class _ParquetTable:
    """Parquet files of one split, read a row group at a time."""

    def __init__(self, files: list[Path]) -> None:
        import pyarrow.parquet as pq

        self.path = files[0].parent
        self.files = [pq.ParquetFile(f) for f in files]
        meta = self.files[0].schema_arrow.metadata or {}
        if b"huggingface" not in meta:
            raise SourceError(f"{files[0]}: a Parquet file without Hugging Face features (no 'huggingface' "
                              "schema metadata: write it with datasets' Dataset.to_parquet)")
        features = _datasets().Features.from_dict(json.loads(meta[b"huggingface"])["info"]["features"])
        self.columns = _columns(features, files[0])
        self.rows = sum(f.metadata.num_rows for f in self.files)

    def take(self, rows: list[int], column: str) -> list[Any]:
        """Column ``column`` of ``rows``, a row group at a time, the last few decoded ones kept: in scan
        order each group is decoded once; a shuffled order decodes groups again (slow for big files)."""
        import bisect

        if not hasattr(self, "_starts"):
            self._groups = [(f, g) for f in self.files for g in range(f.num_row_groups)]
            sizes = [f.metadata.row_group(g).num_rows for f, g in self._groups]
            self._starts = [sum(sizes[:k]) for k in range(len(sizes))]
            self._cache: dict[int, list[Any]] = {}
        out = []
        for row in rows:
            k = bisect.bisect_right(self._starts, row) - 1
            if k not in self._cache:
                if len(self._cache) >= 4:
                    self._cache.pop(next(iter(self._cache)))
                f, g = self._groups[k]
                self._cache[k] = f.read_row_group(g, columns=[column]).column(column).to_pylist()
            out.append(self._cache[k][row - self._starts[k]])
        return out

    def batches(self, start: int, columns: list[str]) -> Iterator[Any]:
        skip = start
        for f in self.files:
            for g in range(f.num_row_groups):
                n = f.metadata.row_group(g).num_rows
                if skip >= n:
                    skip -= n
                    continue
                table = f.read_row_group(g, columns=columns)
                yield table.slice(skip)
                skip = 0


def _tables(src: Path) -> list[tuple[str, Any]]:
    """(split name, table) of each split in ``src``."""
    if (src / "dataset_dict.json").is_file():
        splits = json.loads((src / "dataset_dict.json").read_text())["splits"]
        return [(s, _ArrowTable(src / s)) for s in splits]
    if (src / "state.json").is_file():
        return [(src.name, _ArrowTable(src))]
    files = _parquet_files(src)
    groups: dict[str, list[Path]] = {}
    for f in files:
        m = _HUB_SPLIT.match(f.name)
        groups.setdefault(m["split"] if m and not src.is_file() else src.stem, []).append(f)
    if len(groups) > 1 and any(not _HUB_SPLIT.match(f.name) for f in files):
        groups = {src.name: files}  # not the Hub's naming throughout: one split
    return [(name, _ParquetTable(fs)) for name, fs in groups.items()]


# ---------------------------------------------------------------------------- scan and read
def _resolve(path: str, base: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base / p


def _fields(batch: Any, column: str) -> tuple[list[int | None], list[str | None]]:
    """Byte lengths (None: no bytes) and paths of the images of ``batch``, without reading the bytes."""
    import pyarrow.compute as pc

    images = batch.column(column).combine_chunks()
    return pc.binary_length(images.field("bytes")).to_pylist(), images.field("path").to_pylist()


def _scan_table(split: str, table: Any) -> Source:
    cols = table.columns
    if cols.schema is not None:
        return _scan_fields(split, table)
    # compact columns, no Python object per row (see packer.sources.source.StringColumn)
    paths, labels, sizes, rows = StringBuilder(), IntBuilder("i"), IntBuilder("q"), IntBuilder("q")
    ignored: list[str] = []
    row = 0
    for batch in table.batches(0, [cols.image, cols.label]):
        lengths, names = _fields(batch, cols.image)
        for length, path, label in zip(lengths, names, batch.column(cols.label).to_pylist()):
            name = f"{row}:{path}" if path else str(row)
            if label is None or label < 0 or (length is None and not path):
                ignored.append(name)
            elif label >= len(cols.classes):
                raise SourceError(f"{table.path}: row {row}: label {label:,} is not one of the "
                                  f"{len(cols.classes):,} classes of column {cols.label!r}")
            else:
                paths.append(name)
                labels.append(int(label))
                if length is None:  # no bytes in the table: the file's size
                    assert path, "a row with neither bytes nor a path is ignored above"
                    length = _file_size(path, table.path)
                sizes.append(length)
                rows.append(row)
            row += 1
    if not len(paths):
        raise SourceError(f"{table.path}: no labelled images in split {split!r}")
    source = Source(table.path, cols.classes, paths.build(), labels.build(), sizes.build(), ignored=ignored, kind="hf",
                    details={"split": split, "image_column": cols.image, "label_column": cols.label,
                             "rows": table.rows})
    row_of = rows.build()
    source.prepare = bytes_stage(lambda positions, opts: _read(table, row_of, positions, opts))
    return source


def _file_size(path: str, base: Path) -> int:
    try:
        return _resolve(path, base).stat().st_size
    except OSError:
        return 0


def _read(table: Any, rows: Sequence[int], positions: Sequence[int], opts: ImageOptions) -> Iterator[Any]:
    """The image bytes of the samples at ``positions`` (scan positions), in that order (a rejection
    reason when an image's bytes and file are missing, or over the byte budget)."""
    for a in range(0, len(positions), _BATCH):
        wanted = [rows[p] for p in positions[a:a + _BATCH]]
        for image in table.take(wanted, table.columns.image):
            yield _image_bytes(image or {}, table.path, opts)


def _image_bytes(image: dict, base: Path, opts: ImageOptions | None) -> Any:
    """An image's bytes, embedded in the table or read from the file it names (not read when the file
    is over the byte budget: ``packer.prepare.workers.read_source``)."""
    if image.get("bytes") is not None:
        try:
            if opts is not None:
                check_file_size(len(image["bytes"]), opts)  # before it goes to a worker
        except RejectedImage as exc:
            return str(exc)
        return image["bytes"]
    path = _resolve(image["path"], base)
    try:
        return read_source(path, opts)
    except RejectedImage as exc:
        return str(exc)
    except FileNotFoundError:
        return f"image file {path} not found"
    except OSError as exc:
        return Unreadable(f"{path}: read error: {exc.strerror or exc}")


def _scan_fields(split: str, table: Any) -> Source:
    """Every column as a field: the checked values held, each image read (by row) when it is packed."""
    cols = table.columns
    schema = cols.schema
    extra = schema.extra_fields
    label = schema.labels_field
    names = [f.name for f in schema.fields[1:]]
    paths, labels, sizes, entries, ignored = [], [], [], [], []
    row = 0
    for batch in table.batches(0, [cols.image] + names):
        lengths, image_paths = _fields(batch, cols.image)
        values = {n: batch.column(n).to_pylist() for n in names}
        for j, (length, path) in enumerate(zip(lengths, image_paths)):
            where = f"{table.path} row {row + 1}"
            name = f"{row}:{path}" if path else str(row)
            if label is not None:  # a ClassLabel named label: as before fields, -1 (no label) is ignored
                value = values["label"][j]
                if value is None or value < 0:
                    ignored.append(name)
                    row += 1
                    continue
                if value >= len(label.classes):
                    raise SourceError(f"{table.path}: row {row}: label {value:,} is not one of the "
                                      f"{len(label.classes):,} classes of column 'label'")
            paths.append(name)
            sizes.append(length if length is not None else _file_size(path, table.path) if path else 0)
            labels.append(0)
            entries.append(_entry(schema, extra, {n: values[n][j] for n in names}, row, where, table.path))
            if label is not None and isinstance(entries[-1], tuple):
                labels[-1] = int(values["label"][j])
            row += 1
    if not paths:
        raise SourceError(f"{table.path}: no rows in split {split!r}")
    classes = [label.classes.get(i, str(i)) for i in range(len(label.classes))] if label is not None else []
    source = Source(table.path, classes, paths, labels, sizes, ignored=ignored, kind="hf", schema=schema,
                    details={"split": split, "image_column": cols.image, "rows": table.rows})
    source.prepare = fields_stage(entries, extra, reader=lambda: _RowReader(table))
    return source


def _entry(schema: Schema, extra: tuple, values: dict[str, Any], row: int, where: str, base: Path) -> Any:
    """``(row, checked values, where)``, or a reject's one-line reason naming the row and column."""
    out = []
    for f in schema.fields[1:]:
        value = values[f.name]
        if value is None and not f.type.nullable:
            return f"{where} column {f.name!r}: no value (null)"
        if f.type.is_image:
            if not value or (value.get("bytes") is None and not value.get("path")):
                return f"{where} column {f.name!r}: no image (null)"
            got = _image_bytes(value, base, None)
            if not isinstance(got, bytes):
                return f"{where} column {f.name!r}: {got}"
            value = got
        try:
            value = f.type.check(value, f.name)
        except FieldValueError as exc:
            return f"{where} column {f.name!r}: {exc.reason}"
        if f in extra:
            out.append(value)
    return (row, tuple(out), where)


class _RowReader:
    """A fields source's image, read by row (``packer.prepare.stage.fields_stage``)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def read(self, row: int, opts: ImageOptions) -> Any:
        (image,) = self.table.take([row], self.table.columns.image)
        if not image or (image.get("bytes") is None and not image.get("path")):
            return "no image (null)"
        got = _image_bytes(image, self.table.path, opts)
        if isinstance(got, Unreadable):
            raise OSError(str(got))
        return got

    def values(self, values: tuple) -> tuple:
        return values

    def where(self, row: int) -> str:
        return f"{self.table.path} row {row + 1}"

    def close(self) -> None:
        pass


def scan_hf(src: Path) -> list[tuple[str, Source]]:
    """One :class:`Source` per split of the dataset at ``src``."""
    try:
        return [(split, _scan_table(split, table)) for split, table in _tables(src)]
    except (OSError, ValueError, KeyError, RecursionError) as exc:  # RecursionError: JSON metadata nested too deep
        if isinstance(exc, SourceError):
            raise
        raise SourceError(f"{src}: cannot read this Hugging Face dataset ({type(exc).__name__}: {exc})") from None
