"""Manifest sources: a CSV, JSONL or Parquet file with one row per sample.

One column holds the image (``image`` by default): a path relative to the
manifest's folder, an absolute path, or an ``s3://`` / ``http(s)://`` URL
(kept as a string for the caller to fetch); in Parquet it may also be a
binary column holding the encoded bytes. Every other column becomes a field
of the :class:`readers.contract.fields.Schema`, its type stated (``fields=``, the
``--fields name:type,...`` option) or inferred from the values.

Reading is streaming, memory stays bounded whatever the row count: CSV and
JSONL are read line by line, Parquet by record batches within row groups.

Type inference (CSV and JSONL) is a **first full pass** over the file, which
also counts the rows; :meth:`Manifest.rows` is the second pass. A full pass
(rather than the first K rows) means that a column whose type changes at row
90,000,000 is reported before anything is packed, not hours into the pack; the
cost is parsing the manifest twice, small beside reading and encoding the
images. Parquet needs no first pass: its columns are typed.

Inference rules:

* CSV cells are text: a column is ``int`` when every non-empty cell parses as
  an integer, ``float`` when every one parses as a number, else ``text`` (with
  a log warning when most cells were numbers: state the type to reject such
  rows instead).
* JSONL values keep their JSON type: ``int``, ``float`` (ints and floats
  mixed give float), ``text``, ``uint8`` for booleans, ``json`` for lists and
  objects; null and missing cells are not counted. Any other mix (numbers and
  strings, objects and strings, ...) is a :class:`~packer.errors.SourceError`
  naming the column and the first row that disagrees.
* Parquet: integer and float columns keep their width (``int32``, ``float32``;
  ``int64`` and ``double`` are ``int`` and ``float``), bool is ``uint8``,
  string is ``text``, binary is ``bytes``, fixed-size lists are fixed arrays
  (``float32[4]``, nested: ``float32[3,4]``), lists are variable arrays
  (``int32[*]``, lists of fixed-size lists: ``float32[*,4]``), structs, maps
  and other lists are ``json``.

A row that cannot become a sample -- no image, an image file that does not
exist, a cell that does not fit its column's type (malformed JSON, a box of
the wrong width, text in an int column, an empty cell) -- is yielded as a
:class:`RowReject` naming the file, row and column; the rows after it continue.
Row numbers count data rows from 1 (CSV: the header is not a row; JSONL: the
line number, blank lines skipped; Parquet: the row's position + 1).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

from packer.errors import SourceError
from readers.contract.fields import (Field, FieldType, FieldTypeError, FieldValueError, ImageType, JsonType, NumericType,
                                     Schema, TextType, as_field_type, check_field_name, parse_fields_option, parse_type)
from readers.contract.jsontext import (JSON_ERRORS, MAX_JSON_DEPTH, json_loads, json_locate, json_problem,
                                       json_too_deep, short_repr)
from readers.contract.messages import one_line
from readers.contract.numeric import INT_TEXT, NUMBER_TEXT
from readers.contract.spec import is_remote

__all__ = ["MANIFEST_KINDS", "MAX_COLUMNS", "Manifest", "Row", "RowReject", "read_manifest", "manifest_kind",
           # strict JSON text, defined in readers.contract.jsontext (the field types' text form uses it too)
           "MAX_JSON_DEPTH", "JSON_ERRORS", "json_loads", "json_locate", "json_problem", "json_too_deep"]

log = logging.getLogger(__name__)

#: file suffix -> manifest kind
MANIFEST_KINDS: Mapping[str, str] = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                                     ".pq": "parquet"}
#: Parquet rows converted to Python per batch (bounded memory).
PARQUET_BATCH_ROWS = 4096
_IMAGE = "image"  # the schema's name of the image field, whatever the column is called
#: A manifest may have this many columns. Each becomes a field, and each field is a file of its own
#: that the pack and every reader process keep open (a variable one two, in mmap and hdf5): 256
#: columns stay below 1,024 descriptors, the usual ``ulimit -n``. More values belong in one array
#: column (``float32[N]``), not in N fields.
MAX_COLUMNS = 256


class Row(NamedTuple):
    """One sample: its row number, image reference (a path or URL string, or the encoded bytes)
    and the values of the other fields (checked, canonical form of their type)."""

    row: int
    image: str | bytes
    values: dict[str, Any]


@dataclass(frozen=True)
class RowReject:
    """A row that cannot become a sample (not a tuple: it cannot be unpacked as a :class:`Row` by mistake)."""

    path: str
    row: int
    column: str | None
    reason: str
    #: the row's image (a path or URL, as :class:`Row` gives it), where the row names one
    image: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path} row {self.row}" + (f" column {self.column!r}" if self.column else "")

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def manifest_kind(path: str | os.PathLike) -> str | None:
    """``"csv"``, ``"jsonl"`` or ``"parquet"`` by the file's suffix (any case), else None."""
    return MANIFEST_KINDS.get(Path(path).suffix.lower())


# ------------------------------------------------------------------------------------- raw records
class _Bad(Exception):
    """A record-level problem while reading raw rows (becomes a RowReject)."""


class _Problem(NamedTuple):
    """A raw row that is not read, with the column where that is known (and the cells that were read)."""

    column: str | None
    reason: str
    cells: Mapping[str, Any]


def _too_many_columns(path: Path, what: str) -> SourceError:
    return SourceError(f"{path}: {what}; a manifest may have at most {MAX_COLUMNS} (each column is a field, a "
                       f"file that the pack and every reader keep open): put such values in one array column "
                       f"(a JSON array cell typed --fields NAME:float32[N], or a Parquet list column)")


def _csv_records(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(row, {column: cell} or a reason string) for each data row; the header first as row 0."""
    row = 0
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise SourceError(f"{path}: empty CSV file (the first line must name the columns)")
            if len(set(header)) != len(header):
                dup = next(c for c in header if header.count(c) > 1)
                raise SourceError(f"{path}: column names repeat ({dup!r} is given {header.count(dup)} times)")
            if len(header) > MAX_COLUMNS:
                raise _too_many_columns(path, f"the header names {len(header):,} columns")
            yield 0, dict.fromkeys(header, None)  # column order
            for cells in reader:
                if not cells:
                    continue  # blank line
                row += 1
                if len(cells) != len(header):
                    yield row, f"has {len(cells)} cells, the header has {len(header)}"
                    continue
                yield row, dict(zip(header, cells))
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text after row {row} (byte {exc.start} of a read block); "
                          f"save the CSV as UTF-8") from None
    except csv.Error as exc:
        raise SourceError(f"{path} row {row + 1}: malformed CSV ({exc})") from None


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any] | str | _Problem]]:
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = line.decode(json.detect_encoding(line), "surrogatepass")  # as json.loads decodes bytes
                obj = json_loads(text)
            except UnicodeDecodeError:
                yield lineno, "not UTF-8"
                continue
            except json.JSONDecodeError as exc:
                yield lineno, json_problem(exc)
                continue
            except JSON_ERRORS as exc:  # nested too deep, a huge integer, a key twice: in which column?
                cells: dict[str, Any] = {}
                found = json_locate(text, parsed=cells)
                keys, why = found if found is not None else ([], exc)
                yield lineno, _Problem(str(keys[0]) if keys else None, json_problem(why), cells)
                continue
            if not isinstance(obj, dict):
                yield lineno, f"expected a JSON object, got {type(obj).__name__}"
                continue
            yield lineno, obj


def _parquet_file(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with datasets
        raise SourceError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise SourceError(f"{path}: not a readable Parquet file ({one_line(exc, first=True)})") from None


def _parquet_records(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    pf = _parquet_file(path)
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for rec in batch.to_pylist():
                row += 1
                yield row, rec
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: Parquet read failed after row {row} ({one_line(exc, first=True)})") from None
    finally:
        pf.close()


_READERS = {"csv": _csv_records, "jsonl": _jsonl_records, "parquet": _parquet_records}


# ---------------------------------------------------------------------------------------- inference
def _csv_kind(cell: str) -> str | None:
    if cell == "":
        return None
    if INT_TEXT.match(cell):
        return "int"
    return "float" if NUMBER_TEXT.match(cell) else "text"


def _json_kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "text"
    return "json"  # list or dict


_KIND_TYPE = {"int": "int", "float": "float", "text": "text", "bool": "uint8", "json": "json"}
_MERGE = {frozenset({"int", "float"}): "float", frozenset({"bool", "int"}): "int",
          frozenset({"bool", "float"}): "float"}


class _Column:
    """What one column's values were so far (O(1) state: bounded memory)."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.first_row = 0  # where the current kind was first seen
        self.numeric = 0  # CSV: cells that parsed as numbers
        self.first_text: tuple[int, str] | None = None  # CSV: first non-numeric cell

    def see_csv(self, row: int, cell: str) -> None:
        k = _csv_kind(cell)
        if k is None:
            return
        if k == "text":
            self.first_text = self.first_text or (row, cell)
        else:
            self.numeric += 1
        if self.kind is None or self.kind == "int" and k == "float":
            self.kind, self.first_row = k, row
        elif k == "text":
            self.kind = "text"

    def see_json(self, path: Path, column: str, row: int, value: Any) -> None:
        k = _json_kind(value)
        if k is None or k == self.kind:
            return
        if self.kind is None:
            self.kind, self.first_row = k, row
            return
        merged = _MERGE.get(frozenset({self.kind, k}))
        if merged is None:
            raise SourceError(f"{path}: column {column!r} has mixed types: {self.kind} from row {self.first_row}, "
                              f"then {k} at row {row} ({short_repr(value)}); fix the row or state the column's type "
                              f"with --fields {column}:TYPE")
        if merged != self.kind:
            self.kind = merged

    def type_name(self, csv_source: bool) -> str:
        if self.kind is None:
            return "text" if csv_source else "json"
        return _KIND_TYPE[self.kind]


def _arrow_type(path: Path, column: str, t) -> FieldType:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _arrow_type(path, column, t.value_type)
    if pa.types.is_boolean(t):
        return NumericType("uint8")
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return NumericType(t.to_pandas_dtype())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return TextType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return parse_type("bytes")
    dims: list[int | None] = []
    inner = t
    while pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
        fixed = pa.types.is_fixed_size_list(inner)
        if not fixed and dims:
            break  # a list inside a list: ragged, json
        dims.append(inner.list_size if fixed else None)
        inner = inner.value_type
    else:
        if dims and (pa.types.is_integer(inner) or pa.types.is_floating(inner)):
            return NumericType(inner.to_pandas_dtype(), dims)
    if dims or pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_null(t):
        return JsonType()
    raise SourceError(f"{path}: column {column!r} has Parquet type {t}, which no field type holds; convert it "
                      f"(e.g. to a string) or drop the column")


# ------------------------------------------------------------------------------------------ manifest
class Manifest:
    """A manifest file read for packing: its :class:`Schema` and its rows (:meth:`rows`)."""

    def __init__(self, path: Path, kind: str, image_column: str, schema: Schema, columns: Mapping[str, str],
                 num_rows: int) -> None:
        self.path = path
        self.kind = kind
        self.image_column = image_column
        self.schema = schema
        #: field name -> column name (``image`` -> the image column; the others are the same name)
        self.columns = dict(columns)
        #: data rows in the file, rejects included
        self.num_rows = num_rows
        self._root = path.parent

    def __repr__(self) -> str:
        return f"Manifest({str(self.path)!r}, {self.kind}, {self.num_rows} rows, {', '.join(self.schema.names)})"

    def describe(self) -> dict[str, Any]:
        """JSON-able record for index.json's ``source``."""
        return {"kind": "manifest", "file": self.path.name, "format": self.kind, "image_column": self.image_column,
                "rows": self.num_rows}

    def rows(self) -> Iterator[Row | RowReject]:
        """Each data row in file order: a :class:`Row`, or a :class:`RowReject` saying why not."""
        for row, rec in _READERS[self.kind](self.path):
            if row == 0:
                continue
            if isinstance(rec, str):
                yield RowReject(str(self.path), row, None, rec)
                continue
            if isinstance(rec, _Problem):
                yield RowReject(str(self.path), row, rec.column, rec.reason,
                                self._image_named(rec.cells.get(self.image_column)))
                continue
            try:
                yield self._row(row, rec)
            except _Bad as exc:
                column, reason = exc.args
                yield RowReject(str(self.path), row, column, reason, self._image_named(rec.get(self.image_column)))

    def _image_named(self, cell: Any) -> str | None:
        """The image a rejected row names (a path as :class:`Row` gives it, or its URL), if any."""
        if not isinstance(cell, str) or not cell:
            return None
        return cell if is_remote(cell) or os.path.isabs(cell) else str(self._root / cell)

    def _row(self, row: int, rec: Mapping[str, Any]) -> Row:
        image = self._image(self.image_column, rec.get(self.image_column))
        values = {}
        for f in self.schema.fields[1:]:
            column = self.columns[f.name]
            values[f.name] = self._value(f, column, rec.get(column))
        return Row(row, image, values)

    def _image(self, column: str, cell: Any) -> str | bytes:
        if isinstance(cell, (bytes, bytearray)):
            if not cell:
                raise _Bad(column, "empty image bytes")
            return bytes(cell)
        if cell is None or cell == "":
            raise _Bad(column, "no image (empty cell)")
        if not isinstance(cell, str):
            raise _Bad(column, f"expected an image path or URL, got {type(cell).__name__} {short_repr(cell)}")
        if is_remote(cell):
            return cell
        p = Path(cell)
        p = p if p.is_absolute() else self._root / p
        try:
            st = os.stat(p)
        except OSError as exc:
            raise _Bad(column, f"image {cell!r} not found ({exc.strerror}: {p})") from None
        if not os.path.isfile(p) or st.st_size == 0:
            raise _Bad(column, f"image {cell!r} is {'empty' if st.st_size == 0 else 'not a regular file'} ({p})")
        return str(p)

    def _value(self, f: Field, column: str, cell: Any) -> Any:
        t = f.type
        if t.is_image:
            return self._image(column, cell)
        try:
            if self.kind == "csv":
                cell = t.from_text(cell, column)
            elif cell is None and not t.nullable:
                raise _Bad(column, "no value (null or missing)")
            t.check_nesting(cell, column)
            return t.check(cell, column)
        except FieldValueError as exc:
            raise _Bad(column, exc.reason) from None


def _explicit(fields: str | Mapping[str, FieldType | str] | None) -> dict[str, FieldType]:
    if fields is None:
        return {}
    if isinstance(fields, str):
        return parse_fields_option(fields)
    return {name: as_field_type(t, name) for name, t in fields.items()}


def read_manifest(path: str | os.PathLike, *, image_column: str = "image",
                  fields: str | Mapping[str, FieldType | str] | None = None) -> Manifest:
    """Open a manifest: check its columns, infer the types (first pass), and return it.

    ``fields``: types stated for some or all columns (the ``--fields`` text or name -> type);
    the others are inferred. Raises :class:`~packer.errors.SourceError` (one line naming the
    file, and the column and row where it applies) when the manifest cannot be packed at all:
    missing or unknown file, no image column, a bad column name, a mixed-type column, a
    ``--fields`` entry naming no column or an unknown type.
    """
    p = Path(path)
    kind = manifest_kind(p)
    if kind is None:
        raise SourceError(f"{p}: not a manifest (expected a .csv, .jsonl or .parquet file)")
    if not p.is_file():
        raise SourceError(f"{p}: no such manifest file")
    try:
        stated = _explicit(fields)
    except FieldTypeError as exc:
        raise SourceError(f"{p}: {exc}") from None
    if kind == "parquet":
        pf = _parquet_file(p)
        try:
            arrow = pf.schema_arrow
            num_rows = pf.metadata.num_rows
        finally:
            pf.close()
        columns = list(arrow.names)
        if len(columns) > MAX_COLUMNS:
            raise _too_many_columns(p, f"{len(columns):,} columns")
        inferred: dict[str, str] = {}  # Parquet columns are typed: _arrow_type
    else:
        columns, inferred, num_rows = _first_pass(p, kind, image_column, stated)
    if image_column not in columns:
        raise SourceError(f"{p}: no image column {image_column!r} (columns: {', '.join(map(str, columns))}); "
                          f"name it with --image-column")
    if len(set(columns)) != len(columns):
        raise SourceError(f"{p}: column names repeat ({', '.join(map(str, columns))})")
    unknown = [n for n in stated if n not in columns]
    if unknown:
        raise SourceError(f"{p}: --fields names {', '.join(map(repr, unknown))}, not a column of the manifest "
                          f"(columns: {', '.join(map(str, columns))})")
    if image_column in stated and not stated[image_column].is_image:
        raise SourceError(f"{p}: --fields gives the image column {image_column!r} type "
                          f"{stated[image_column].name}; it holds the image")
    if image_column != _IMAGE and _IMAGE in columns:
        raise SourceError(f"{p}: column 'image' is not the image column ({image_column!r} is); the image field is "
                          f"named 'image': rename the column")
    out = [Field(_IMAGE, ImageType())]
    names = {_IMAGE: image_column}
    for c in columns:
        if c == image_column:
            continue
        try:
            check_field_name(c)
        except FieldTypeError as exc:
            raise SourceError(f"{p}: column {c!r} cannot be a field: {exc}") from None
        if c in stated:
            t = stated[c]
        elif kind == "parquet":
            t = _arrow_type(p, c, arrow.field(c).type)
        else:
            t = parse_type(inferred[c])
        out.append(Field(c, t))
        names[c] = c
    if kind == "parquet":
        import pyarrow as pa

        it = arrow.field(image_column).type
        if not (pa.types.is_string(it) or pa.types.is_large_string(it) or pa.types.is_binary(it)
                or pa.types.is_large_binary(it)):
            raise SourceError(f"{p}: image column {image_column!r} has Parquet type {it}; expected paths/URLs "
                              f"(string) or encoded images (binary)")
    try:
        schema = Schema(tuple(out))
    except FieldTypeError as exc:
        raise SourceError(f"{p}: {exc}") from None
    log.info("%s: %d rows, fields %s", p, num_rows, ", ".join(f"{f.name}:{f.type.name}" for f in schema))
    return Manifest(p, kind, image_column, schema, names, num_rows)


def _first_pass(p: Path, kind: str, image_column: str,
                stated: Mapping[str, FieldType]) -> tuple[list[str], dict[str, str], int]:
    """Columns in order, inferred type name per column, data row count (rejected rows included)."""
    cols: dict[str, _Column] = {}
    num_rows = 0
    for row, rec in _READERS[kind](p):
        if row == 0:
            cols = {c: _Column() for c in rec} if isinstance(rec, dict) else {}  # the header: columns in order
            continue
        num_rows += 1
        if not isinstance(rec, dict):
            continue  # a malformed row: rejected in the second pass
        for c, v in rec.items():
            col = cols.get(c)
            if col is None:
                if kind == "csv":
                    continue
                col = cols[c] = _Column()
                if len(cols) > MAX_COLUMNS:
                    raise _too_many_columns(p, f"more than {MAX_COLUMNS} columns (keys) by row {row}")
            if c == image_column or c in stated:
                continue
            if kind == "csv":
                col.see_csv(row, v)
            else:
                col.see_json(p, c, row, v)
    if num_rows == 0:
        raise SourceError(f"{p}: the manifest has no rows")
    inferred = {}
    for c, col in cols.items():
        inferred[c] = col.type_name(kind == "csv")
        if kind == "csv" and col.kind == "text" and col.first_text and col.numeric > 0:
            r, cell = col.first_text
            log.warning("%s: column %r is stored as text: %d cells are numbers but row %d is %s; state its type "
                        "(--fields %s:float) to reject such rows instead", p, c, col.numeric, r, short_repr(cell), c)
    return list(cols), inferred, num_rows
