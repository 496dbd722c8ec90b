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
from packer.images import ImageOptions, RejectedImage, check_file_size
from packer.importers.stage import Unreadable, bytes_stage
from packer.columns import IntBuilder, StringBuilder
from packer.source import Source, list_folder
from packer.workers import read_source

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


def _columns(features: Any, where: Path) -> _Columns:
    ds = _datasets()
    image = next((k for k, f in features.items() if isinstance(f, ds.Image)), None)
    label = next((k for k, f in features.items() if isinstance(f, ds.ClassLabel)), None)
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
    # compact columns, no Python object per row (see packer.source.StringColumn)
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
                sizes.append(length if length is not None else _file_size(path, table.path))
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


def _image_bytes(image: dict, base: Path, opts: ImageOptions) -> Any:
    """An image's bytes, embedded in the table or read from the file it names (not read when the file
    is over the byte budget: ``packer.workers.read_source``)."""
    if image.get("bytes") is not None:
        try:
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


def scan_hf(src: Path) -> list[tuple[str, Source]]:
    """One :class:`Source` per split of the dataset at ``src``."""
    try:
        return [(split, _scan_table(split, table)) for split, table in _tables(src)]
    except (OSError, ValueError, KeyError, RecursionError) as exc:  # RecursionError: JSON metadata nested too deep
        if isinstance(exc, SourceError):
            raise
        raise SourceError(f"{src}: cannot read this Hugging Face dataset ({type(exc).__name__}: {exc})") from None
