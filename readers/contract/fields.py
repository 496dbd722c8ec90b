"""Typed sample fields: one class per field type and the :class:`Schema` of a dataset.

The packer (``packer/importers/manifest.py``, ``packer/importers/coco.py``, the format writers) and
every reader import this module; it imports only :mod:`readers.contract.spec` and
:func:`readers.contract.spec.is_jpeg`. Models: FFCV ``ffcv/fields/`` (one class per
field type: its dtype, how it encodes, how it decodes) and mosaicml-streaming
``streaming/base/format/mds/encodings.py`` (a registry name -> encoding, each
fixed-size or variable-size). The design, and what is not wired yet, is in
``docs/fields.md``.

Type names (what ``--fields name:type`` and index.json's ``"fields"`` say)::

    image                     encoded image bytes (JPEG or PNG, told by content)
    text                      UTF-8 string
    json                      any JSON value (dict, list, str, number, bool, null)
    bytes                     opaque bytes
    int, float                scalars: int64 and float64
    int8 ... uint64,          scalars of that numpy dtype (stored little-endian)
    float16 ... float64
    DTYPE[d1,d2,...]          fixed-shape array:   int32[80], float32[4], uint8[3,4]
    DTYPE[*,d2,...]           leading dim varies:  float32[*,4] (boxes), int32[*]

Fixed-size types (numeric scalars and fixed-shape arrays) have one numpy
``dtype`` and ``shape`` per sample, so a format stores a whole column as one
``(N, *shape)`` array. Variable-size types (everything else) are stored as one
blob per sample (``encode`` / ``decode``), or in a format with offsets as one
concatenated blob plus an ``<i8`` offsets array.

Each type converts a Python value with :meth:`FieldType.check` (a one-line
``ValueError`` naming the field when the value does not fit: wrong width,
wrong dtype kind, NaN where ints are expected, non-UTF-8 text, ...) and gives
the WebDataset member for it (:meth:`FieldType.to_member`): ``jpg``/``png``
for images, ``txt``, ``json``, ``cls`` (decimal text) for integer scalars,
``json`` for float scalars (webdataset has no float extension; a JSON number
round-trips exactly), ``npy`` for arrays, ``bin`` for bytes -- so the
official ``webdataset`` reader decodes our shards with its default handlers.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Iterator, Mapping

import numpy as np

from readers.contract.messages import one_line
from readers.contract.safeio import npy_header
from readers.contract.spec import DatasetFormatError, field_array_name, is_jpeg
from readers.contract.spec import array_file as spec_array_file

__all__ = [
    "FieldValueError",
    "FieldTypeError",
    "FieldType",
    "ImageType",
    "TextType",
    "JsonType",
    "BytesType",
    "NumericType",
    "Field",
    "Schema",
    "parse_type",
    "parse_fields_option",
    "check_field_name",
    "member_suffix",
    "image_extension",
    "NUMERIC_DTYPES",
    "KNOWN_TYPES",
    "blob_member",
    "column_file",
    "blob_file",
    "offsets_file",
    "lmdb_field_key",
    "hdf5_field_path",
]


#: Scalar dtype names a numeric type may use, with ``int`` = int64 and ``float`` = float64.
NUMERIC_DTYPES: Mapping[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
}
_ALIASES = {"int": "int64", "float": "float64"}
_CANONICAL = {v: k for k, v in _ALIASES.items()}  # int64 scalar -> "int", float64 scalar -> "float"
#: The names of the non-numeric types, then the numeric forms (for error messages).
KNOWN_TYPES = ("image", "text", "json", "bytes", "int", "float") + tuple(NUMERIC_DTYPES) + (
    "DTYPE[N,...]", "DTYPE[*,...]")
_MAX_DIMS = 8
_MAX_ELEMENTS = 2**31 - 1
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: A field name: also a WebDataset key suffix (no dot), an HDF5 dataset name and a JSON key.
_NAME_RE = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")


class FieldValueError(ValueError):
    """A value does not fit its field's type; ``str(exc)`` is one line naming the field."""


class FieldTypeError(ValueError):
    """A type string or a ``--fields`` option cannot be parsed; one line naming it."""


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def image_extension(data: bytes | bytearray | memoryview) -> str:
    """``"jpg"`` or ``"png"`` by the content's magic bytes; ValueError for anything else."""
    if is_jpeg(data):
        return "jpg"
    if bytes(memoryview(data)[:8]) == _PNG_SIGNATURE:
        return "png"
    raise ValueError("image bytes are neither JPEG nor PNG")


# ---------------------------------------------------------------------------------------- field types
class FieldType:
    """What one field of a sample holds. Subclasses are immutable values (compared by ``name``).

    ``fixed``: every sample's value has the numpy ``dtype`` and ``shape`` (a format stores the
    column as one array); otherwise the value is a blob of varying length.
    """

    fixed: ClassVar[bool] = False
    #: fixed types: the numpy dtype and shape of one sample's value (None for the others)
    dtype: np.dtype | None = None
    shape: tuple[int | None, ...] | None = None
    #: the WebDataset extension(s) the member of this type can have
    extensions: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, field: str = "?") -> Any:
        """The value in its canonical Python form (what ``decode`` returns); FieldValueError if it does not fit."""
        raise NotImplementedError

    def encode(self, value: Any, field: str = "?") -> bytes:
        """Blob bytes of ``value`` (checked first). Fixed types: exactly ``itemsize * prod(shape)`` bytes."""
        raise NotImplementedError

    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """The value from blob bytes written by ``encode``."""
        raise NotImplementedError

    def extension(self, encoded: bytes | bytearray | memoryview) -> str:
        """WebDataset extension of a member holding this field's blob ``encoded``."""
        return self.extensions[0]

    def to_member(self, value: Any, field: str = "?") -> tuple[str, bytes]:
        """``(extension, bytes)`` of the WebDataset member, decodable by webdataset's default handlers."""
        data = self.encode(value, field)
        return self.extension(data), data

    def from_member(self, data: bytes | bytearray | memoryview, field: str = "?") -> Any:
        """The value from a member written by ``to_member``."""
        try:
            return self.decode(data)
        except ValueError as exc:
            raise FieldValueError(f"field {field!r} ({self.name}): {exc}") from None

    def member_blob(self, data: bytes | bytearray | memoryview, value: Any) -> bytes:
        """The stored blob (what ``encode`` gives, what ``field_checksums.npy`` covers) of the member
        ``data`` whose value :meth:`from_member` gave as ``value``: the member itself, but for numbers."""
        return bytes(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _bad(self, field: str, what: str) -> FieldValueError:
        return FieldValueError(f"field {field!r} ({self.name}): {what}")


class ImageType(FieldType):
    """Encoded image bytes (JPEG or PNG; ``packer.prepare.images`` decides what is stored). Decoded form: bytes."""

    extensions = ("jpg", "png")

    @property
    def name(self) -> str:
        return "image"

    def check(self, value: Any, field: str = "?") -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise self._bad(field, f"expected encoded image bytes, got {type(value).__name__}")
        data = bytes(value)
        try:
            image_extension(data)
        except ValueError as exc:
            raise self._bad(field, str(exc)) from None
        return data

    def encode(self, value: Any, field: str = "?") -> bytes:
        return self.check(value, field)

    def decode(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)

    def extension(self, encoded: bytes | bytearray | memoryview) -> str:
        return image_extension(encoded)


class TextType(FieldType):
    """A UTF-8 string (``str``, or ``bytes`` that are valid UTF-8). Decoded form: str."""

    extensions = ("txt",)

    @property
    def name(self) -> str:
        return "text"

    def check(self, value: Any, field: str = "?") -> str:
        if isinstance(value, (bytes, bytearray, memoryview)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise self._bad(field, f"not UTF-8 (byte {exc.start})") from None
        if not isinstance(value, str):
            raise self._bad(field, f"expected a string, got {type(value).__name__} {_short(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise self._bad(field, f"not encodable as UTF-8 (character {exc.start}: a lone surrogate)") from None
        return value

    def encode(self, value: Any, field: str = "?") -> bytes:
        return self.check(value, field).encode("utf-8")

    def decode(self, data: bytes | bytearray | memoryview) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"stored text is not UTF-8 (byte {exc.start})") from None


def _json_walk(value: Any, field: str, bad) -> None:
    """Reject what ``json.dumps`` would change or refuse: non-str keys, NaN/inf, non-JSON types."""
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, (str, bool, int)):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise bad(field, f"{v} is not valid JSON")
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise bad(field, f"JSON object key {_short(k)} is not a string")
                stack.append(item)
        else:
            raise bad(field, f"{type(v).__name__} is not a JSON value")


class JsonType(FieldType):
    """Any JSON value; stored as compact UTF-8 JSON. Decoded form: what ``json.loads`` gives."""

    extensions = ("json",)

    @property
    def name(self) -> str:
        return "json"

    def check(self, value: Any, field: str = "?") -> Any:
        _json_walk(value, field, self._bad)
        return value

    def encode(self, value: Any, field: str = "?") -> bytes:
        self.check(value, field)
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except RecursionError:
            raise self._bad(field, "JSON nested too deeply") from None
        return text.encode("utf-8")

    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        try:
            return json.loads(bytes(data))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"stored JSON does not parse ({exc})") from None
        except RecursionError:  # json's parser recurses once per nesting level
            raise ValueError("stored JSON is nested too deeply to parse") from None


class BytesType(FieldType):
    """Opaque bytes. Decoded form: bytes."""

    extensions = ("bin",)

    @property
    def name(self) -> str:
        return "bytes"

    def check(self, value: Any, field: str = "?") -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise self._bad(field, f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def encode(self, value: Any, field: str = "?") -> bytes:
        return self.check(value, field)

    def decode(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)


class NumericType(FieldType):
    """A numeric scalar (``shape == ()``) or array; ``shape[0] is None`` for a varying leading dim.

    Decoded form: a Python ``int``/``float`` for scalars, a C-contiguous ``np.ndarray`` of exactly
    ``dtype`` (little-endian) and the shape for arrays. ``check`` returns the array it is given
    when that already is one (no copy); ``decode`` and ``from_row`` return new writable arrays.
    """

    def __init__(self, dtype: str | np.dtype, shape: Iterable[int | None] = ()) -> None:
        dt = np.dtype(dtype)
        if dt.name not in NUMERIC_DTYPES:
            raise FieldTypeError(f"{dt.name}: not a numeric field dtype (known: {', '.join(NUMERIC_DTYPES)})")
        self.dtype: np.dtype = NUMERIC_DTYPES[dt.name]
        self.shape: tuple[int | None, ...] = tuple(shape)
        if any(d is None for d in self.shape[1:]) or any(d is not None and d < 1 for d in self.shape):
            raise FieldTypeError(f"{self.shape}: only the leading dim may vary, the others must be >= 1")

    # fixed is a property here (class attribute elsewhere)
    @property
    def fixed(self) -> bool:  # type: ignore[override]
        return not self.shape or self.shape[0] is not None

    @property
    def scalar(self) -> bool:
        return not self.shape

    @property
    def integer(self) -> bool:
        return self.dtype.kind in "iu"

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape after the varying leading dim (the whole shape of a fixed type)."""
        return tuple(self.shape[1:] if not self.fixed else self.shape)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        """Bytes per sample (fixed) or per leading-dim row (variable)."""
        return int(self.dtype.itemsize * math.prod(self.row_shape))

    @property
    def extensions(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.scalar:
            return ("cls",) if self.integer else ("json",)
        return ("npy",)

    @property
    def name(self) -> str:
        if self.scalar:
            return _CANONICAL.get(self.dtype.name, self.dtype.name)
        return f"{self.dtype.name}[{','.join('*' if d is None else str(d) for d in self.shape)}]"

    # ---- checking
    def check(self, value: Any, field: str = "?") -> Any:
        if self.scalar:
            return self._check_scalar(value, field)
        return self._check_array(value, field)

    def _check_scalar(self, value: Any, field: str) -> int | float:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        if isinstance(value, (np.integer, np.floating)):
            value = value.item()
        if not isinstance(value, (int, float)):
            raise self._bad(field, f"expected a number, got {type(value).__name__} {_short(value)}")
        if self.integer:
            if isinstance(value, float):
                if math.isnan(value):
                    raise self._bad(field, "NaN where an integer is expected")
                if not value.is_integer():
                    raise self._bad(field, f"{value} is not an integer")
                value = int(value)
            info = np.iinfo(self.dtype)
            if not info.min <= value <= info.max:
                raise self._bad(field, f"{value} is out of range [{info.min}, {info.max}]")
            return value
        try:
            f64 = float(value)
        except OverflowError:
            raise self._bad(field, f"{_short(value)} is out of range for {self.dtype.name}") from None
        if self.dtype.itemsize == 8:
            return f64
        with np.errstate(over="ignore"):
            out = float(np.float64(f64).astype(self.dtype))
        if math.isinf(out) and not math.isinf(f64):
            raise self._bad(field, f"{value} is out of range for {self.dtype.name}")
        return out

    def _check_array(self, value: Any, field: str) -> np.ndarray:
        if isinstance(value, (str, bytes, bytearray, dict)) or value is None:
            raise self._bad(field, f"expected an array of numbers, got {type(value).__name__} {_short(value)}")
        try:
            with np.errstate(all="ignore"):
                arr = np.asarray(value)
        except (ValueError, TypeError, OverflowError) as exc:
            raise self._bad(field, f"not a rectangular array of numbers ({type(exc).__name__}: ragged or mixed "
                                   f"values)") from None
        if arr.dtype.kind not in "biuf":
            raise self._bad(field, f"expected numbers, got {arr.dtype.name if arr.dtype.kind != 'O' else 'objects'} "
                                   f"{_short(value)}")
        want_rest = self.row_shape if not self.fixed else None
        if arr.size == 0 and want_rest is not None:
            arr = arr.reshape((0,) + want_rest)
        if self.fixed:
            if arr.shape != self.shape:
                raise self._bad(field, f"shape {arr.shape} does not fit {self.name}")
        elif arr.ndim != len(self.shape) or arr.shape[1:] != want_rest:
            raise self._bad(field, f"shape {arr.shape} does not fit {self.name}")
        return self._cast(arr, field)

    def _cast(self, arr: np.ndarray, field: str) -> np.ndarray:
        if self.integer:
            if arr.dtype.kind == "f":
                if np.isnan(arr).any():
                    raise self._bad(field, "NaN where integers are expected")
                if not np.isfinite(arr).all() or (arr != np.floor(arr)).any():
                    bad = arr[~np.isfinite(arr) | (arr != np.floor(arr))].flat[0]
                    raise self._bad(field, f"{bad} is not an integer")
            if arr.size and arr.dtype.kind != "b" and arr.dtype != self.dtype:
                info = np.iinfo(self.dtype)
                lo, hi = int(arr.min().item()), int(arr.max().item())
                if lo < info.min or hi > info.max:
                    raise self._bad(field, f"{lo if lo < info.min else hi} is out of range [{info.min}, {info.max}]")
            out = arr.astype(self.dtype, copy=False)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                out = arr.astype(self.dtype, copy=False)
            if arr.size and arr.dtype != self.dtype:
                over = np.isinf(out) & np.isfinite(arr)
                if over.any():
                    raise self._bad(field, f"{arr[over].flat[0]} is out of range for {self.dtype.name}")
        return np.ascontiguousarray(out)  # no copy when the value already is that array

    # ---- rows (fixed types) and blobs
    def to_row(self, value: Any, field: str = "?") -> np.ndarray:
        """The value as an array of ``dtype`` and ``shape`` (one row of the column); fixed types only."""
        if not self.fixed:
            raise TypeError(f"{self.name} is variable-size: it has no fixed row")
        return np.asarray(self.check(value, field), dtype=self.dtype).reshape(self.shape)

    def from_row(self, row: np.ndarray) -> Any:
        """The decoded value of one row of a fixed column."""
        if self.scalar:
            return np.asarray(row).reshape(()).item()
        return np.array(row, dtype=self.dtype, copy=True).reshape(self.shape)

    def encode(self, value: Any, field: str = "?") -> bytes:
        return np.asarray(self.check(value, field), dtype=self.dtype).tobytes()

    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        buf = memoryview(data).cast("B")
        if self.fixed:
            if len(buf) != self.nbytes:
                raise ValueError(f"stored value has {len(buf)} bytes, {self.name} has {self.nbytes}")
            return self.from_row(np.frombuffer(buf, dtype=self.dtype))
        if len(buf) % self.nbytes:
            raise ValueError(f"stored value has {len(buf)} bytes, not a multiple of {self.nbytes} ({self.name} row)")
        return np.frombuffer(buf, dtype=self.dtype).reshape((-1,) + self.row_shape).copy()

    def to_member(self, value: Any, field: str = "?") -> tuple[str, bytes]:
        checked = self.check(value, field)
        if self.scalar:
            if self.integer:
                return "cls", str(checked).encode("ascii")
            return "json", json.dumps(checked).encode("ascii")  # repr: exact round trip; NaN/Infinity as Python writes
        out = io.BytesIO()
        np.lib.format.write_array(out, checked, allow_pickle=False)
        return "npy", out.getvalue()

    def from_member(self, data: bytes | bytearray | memoryview, field: str = "?") -> Any:
        """The value of a member: decimal text (``cls``), a JSON number, or a ``.npy`` array whose
        header (:func:`readers.contract.safeio.npy_header`) is checked against the member's bytes before
        anything is allocated; a big-endian array of the field's dtype is read as little-endian."""
        buf = memoryview(data).cast("B")
        try:
            if self.scalar:
                text = bytes(buf).decode("ascii").strip()
                if len(text) > 400:  # no int64/float64 needs more; int() of 5,000 digits is refused anyway
                    raise ValueError(f"{len(text)} characters for one number")
                return self.check(int(text) if self.integer else float(json.loads(text)), field)
            head = npy_header(buf)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise self._bad(field, f"member does not parse ({one_line(exc, first=True)})") from None
        if head.dtype.newbyteorder("<") != self.dtype:
            raise self._bad(field, f"member holds {head.dtype.name} ({head.dtype.str}), not {self.dtype.name} "
                                   f"({self.dtype.str})")
        arr = np.frombuffer(buf, dtype=head.dtype, count=head.count, offset=head.offset)
        arr = arr.reshape(head.shape, order="F" if head.fortran else "C")
        return self.check(np.array(arr, dtype=self.dtype, order="C"), field)  # a new, writable array

    def member_blob(self, data: bytes | bytearray | memoryview, value: Any) -> bytes:
        return self.encode(value)


_SIMPLE: Mapping[str, FieldType] = {"image": ImageType(), "text": TextType(), "json": JsonType(),
                                    "bytes": BytesType()}
_TYPE_RE = re.compile(r"([a-z][a-z0-9]*)(?:\[([^\[\]]*)\])?\Z")
_DIM_RE = re.compile(r"[0-9]{1,10}\Z")  # more digits pass _MAX_ELEMENTS anyway (and int() of 4,300+ fails)


_INT32 = NumericType("int32")


def blob_member(t: FieldType, blob: bytes | bytearray | memoryview) -> tuple[str, bytes]:
    """``(extension, bytes)`` of the WebDataset member of a field whose stored blob (``encode``) is ``blob``:
    the blob itself for text, json, bytes and images, ``t.to_member`` of the value for numbers."""
    if isinstance(t, NumericType):
        return t.to_member(t.decode(blob))
    return t.extension(blob), bytes(blob)


def _known() -> str:
    return ", ".join(KNOWN_TYPES)


def parse_type(text: str, field: str | None = None) -> FieldType:
    """The field type named by ``text`` (``"float32[*,4]"``); FieldTypeError naming it and the known types."""
    where = f" for field {field!r}" if field else ""
    if not isinstance(text, str):
        raise FieldTypeError(f"field type{where} must be a string, got {type(text).__name__}")
    m = _TYPE_RE.match(text.replace(" ", ""))
    base = m.group(1) if m else None
    if m is None or (base not in _SIMPLE and _ALIASES.get(base, base) not in NUMERIC_DTYPES):
        raise FieldTypeError(f"unknown field type {_short(text, 60)}{where}; known: {_known()}")
    dims = m.group(2)
    if base in _SIMPLE:
        if dims is not None:
            raise FieldTypeError(f"field type {_short(text, 60)}{where}: {base} takes no shape; known: {_known()}")
        return _SIMPLE[base]
    dtype = _ALIASES.get(base, base)
    if dims is None:
        return NumericType(dtype)
    shape: list[int | None] = []
    for i, d in enumerate(dims.split(",")):
        if d == "*" and i == 0:
            shape.append(None)
        elif _DIM_RE.match(d) and int(d) >= 1:  # ASCII digits only: '²'.isdigit(), int('²') fails
            shape.append(int(d))
        else:
            raise FieldTypeError(f"field type {_short(text, 60)}{where}: bad dim {_short(d, 20)} (each dim is a "
                                 f"number >= 1; the first may be *)")
    if len(shape) > _MAX_DIMS or math.prod(d or 1 for d in shape) > _MAX_ELEMENTS:
        raise FieldTypeError(f"field type {_short(text, 60)}{where}: at most {_MAX_DIMS} dims and "
                             f"{_MAX_ELEMENTS} elements")
    return NumericType(dtype, shape)


def check_field_name(name: Any) -> str:
    """``name`` if it can name a field (1-64 letters, digits, ``_``, ``-``; no dot, no leading ``__``)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise FieldTypeError(f"field name {_short(name)} is not allowed: use 1-64 letters, digits, '_' or '-', "
                             f"starting with a letter or '_' (not '__'), no dot")
    return name


def parse_fields_option(text: str) -> dict[str, FieldType]:
    """``"caption:text,boxes:float32[*,4]"`` (the ``--fields`` option) -> ordered name -> type."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    out: dict[str, FieldType] = {}
    for item in items:
        name, sep, type_text = item.strip().partition(":")
        name = name.strip()
        if not sep or not name or not type_text.strip():
            raise FieldTypeError(f"--fields: {item.strip()!r} is not NAME:TYPE (e.g. caption:text,boxes:float32[*,4])")
        try:
            check_field_name(name)
        except FieldTypeError as exc:
            raise FieldTypeError(f"--fields: {exc}") from None
        if name in out:
            raise FieldTypeError(f"--fields: {name!r} is given twice")
        try:
            out[name] = parse_type(type_text.strip(), name)
        except FieldTypeError as exc:
            raise FieldTypeError(f"--fields: {exc}") from None
    return out


# --------------------------------------------------------------------------------------- field layout
# Where each format keeps an extra field (docs/fields.md, "How each format stores fields"): the one
# place the writers (packer.formats.*, FieldStore), the readers, verify and convert take it from.
def column_file(name: str) -> str:
    """A fixed field's ``(N, *shape)`` column beside the index (wds, lmdb, mmap)."""
    return spec_array_file(field_array_name(name))


def blob_file(name: str) -> str:
    """A variable field's blobs back to back (mmap)."""
    return field_array_name(name) + ".bin"


def offsets_file(name: str) -> str:
    """A variable field's ``<i8 (N + 1,)`` offsets into :func:`blob_file` (mmap)."""
    return field_array_name(name) + ".offsets.npy"


def lmdb_field_key(sample_key: bytes, name: str) -> bytes:
    """The LMDB key of a variable field's value: the sample's image key, ``/``, the name (sorts right after it)."""
    return sample_key + b"/" + name.encode()


def hdf5_field_path(name: str, part: str | None = None) -> str:
    """``fields/<name>`` (a fixed column) or ``fields/<name>/data`` / ``offsets`` (a variable field) in data.h5."""
    return f"fields/{name}" + (f"/{part}" if part else "")


# --------------------------------------------------------------------------------------------- schema
def member_suffix(name: str, ext: str) -> str:
    """WebDataset member suffix (after ``key.``) of field ``name`` stored with extension ``ext``.

    ``image`` -> ``jpg``/``png``, ``label`` -> ``cls`` and a field named like its extension
    (``txt``, ``json``) get the bare extension, as img2dataset and ImageNet shards have them;
    every other field gets ``<name>.<ext>`` (``boxes.npy``, ``caption.txt``).
    """
    if name == ext or (name == "image" and ext in ImageType.extensions) or (name == "label" and ext == "cls"):
        return ext
    return f"{name}.{ext}"


def _classes_from_json(obj: Any, where: str) -> dict[int, str]:
    if isinstance(obj, list) and all(isinstance(c, str) for c in obj):
        return dict(enumerate(obj))
    if isinstance(obj, dict) and all(isinstance(v, str) for v in obj.values()):
        try:
            return {int(k): v for k, v in obj.items()}
        except ValueError:
            pass
    raise DatasetFormatError(f"{where}: 'classes' must be a list of names or an object id -> name")


@dataclass(frozen=True, eq=True)
class Field:
    """A named, typed field. ``classes``: names of the values of an integer field (id -> name)."""

    name: str
    type: FieldType
    classes: Mapping[int, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        check_field_name(self.name)
        if not isinstance(self.type, FieldType):
            raise FieldTypeError(f"field {self.name!r}: type must be a FieldType (parse_type(...)), got "
                                 f"{type(self.type).__name__}")
        if self.classes is not None:
            if not (isinstance(self.type, NumericType) and self.type.integer):
                raise FieldTypeError(f"field {self.name!r}: class names need an integer type, not {self.type.name}")
            object.__setattr__(self, "classes", {int(k): str(v) for k, v in dict(self.classes).items()})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type.name}
        if self.classes is not None:
            keys = sorted(self.classes)
            dense = keys == list(range(len(keys)))
            out["classes"] = [self.classes[k] for k in keys] if dense else {str(k): self.classes[k] for k in keys}
        return out

    def suffixes(self) -> tuple[str, ...]:
        """Every WebDataset member suffix this field can be stored under."""
        return tuple(member_suffix(self.name, ext) for ext in self.type.extensions)


@dataclass(frozen=True)
class Schema:
    """The ordered fields of every sample of a dataset (index.json ``{"fields": [...]}``)."""

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        fields = tuple(self.fields)
        object.__setattr__(self, "fields", fields)
        if not fields:
            raise FieldTypeError("a schema needs at least one field")
        seen: dict[str, str] = {}
        for f in fields:
            if not isinstance(f, Field):
                raise FieldTypeError(f"schema entries must be Field, got {type(f).__name__}")
            key = f.name.lower()
            if key in seen:
                raise FieldTypeError(f"field name {f.name!r} is given twice (names are compared ignoring case)")
            seen[key] = f.name
        owner: dict[str, str] = {}
        for f in fields:
            for s in f.suffixes():
                if s.lower() in owner:
                    raise FieldTypeError(f"fields {owner[s.lower()]!r} and {f.name!r} would both be stored as "
                                         f"WebDataset member 'key.{s}'; rename one")
                owner[s.lower()] = f.name

    # ---- construction
    @classmethod
    def of(cls, pairs: Mapping[str, FieldType | str] | Iterable[tuple[str, FieldType | str]]) -> Schema:
        """A schema from ``name -> type`` (a FieldType or a type string), in order."""
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        return cls(tuple(Field(n, t if isinstance(t, FieldType) else parse_type(t, n)) for n, t in items))

    @classmethod
    def default(cls, classes: Iterable[str] = ()) -> Schema:
        """What an ImageFolder source gives: ``image`` and ``label`` (``int32``, as ``labels.npy``
        stores it, class index -> class name)."""
        return cls((Field("image", _SIMPLE["image"]), Field("label", NumericType("int32"), dict(enumerate(classes)))))

    @classmethod
    def from_json(cls, obj: Any, where: str = "index.json") -> Schema:
        """Parse index.json's ``{"fields": [...]}``; DatasetFormatError naming ``where`` when it is malformed."""
        entries = obj.get("fields") if isinstance(obj, dict) else None
        if not isinstance(entries, list):
            raise DatasetFormatError(f"{where}: 'fields' must be a list of {{\"name\": ..., \"type\": ...}}")
        fields = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or not {"name", "type"} <= e.keys() or e.keys() - {"name", "type", "classes"}:
                raise DatasetFormatError(f"{where}: fields[{i}] must be "
                                         f"{{\"name\": ..., \"type\": ...[, \"classes\": ...]}}")
            try:
                classes = _classes_from_json(e["classes"], f"{where}: field {e['name']!r}") if "classes" in e else None
                fields.append(Field(e["name"], parse_type(e["type"], e["name"]), classes))
            except FieldTypeError as exc:
                raise DatasetFormatError(f"{where}: {exc}") from None
        try:
            return cls(tuple(fields))
        except FieldTypeError as exc:
            raise DatasetFormatError(f"{where}: {exc}") from None

    @classmethod
    def from_index(cls, meta: Mapping[str, Any], where: str = "index.json") -> Schema:
        """The schema of a dataset: its ``"fields"``, or :meth:`default` for an index written before them."""
        if "fields" in meta:
            return cls.from_json(meta, where)
        return cls.default(meta.get("classes") or ())

    def to_json(self) -> dict[str, Any]:
        return {"fields": [f.to_json() for f in self.fields]}

    # ---- access
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no field {name!r}; the fields are {', '.join(self.names)}")

    def select(self, names: Iterable[str]) -> tuple[Field, ...]:
        """The fields named, in that order; ValueError naming an unknown one and listing the fields."""
        out = []
        for n in names:
            if n not in self:
                raise ValueError(f"no field {n!r}; the fields are {', '.join(self.names)}")
            out.append(self[n])
        return tuple(out)

    @property
    def fixed_fields(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.type.fixed)

    @property
    def variable_fields(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if not f.type.fixed)

    @property
    def labels_field(self) -> Field | None:
        """The field kept in ``labels.npy`` (and ``/labels``, ``key.cls``) as before fields existed: an
        ``int32`` scalar named ``label``; None when the schema has none (then ``labels.npy`` holds zeros)."""
        for f in self.fields:
            if f.name == "label" and f.type == _INT32:
                return f
        return None

    @property
    def extra_fields(self) -> tuple[Field, ...]:
        """The fields stored beside the ``image`` field and :attr:`labels_field`, in schema order: the
        ones each format stores by the field layout (``docs/fields.md``) and ``field_checksums.npy`` covers."""
        keep = self.labels_field
        return tuple(f for f in self.fields if f.name != "image" and f is not keep)

    @property
    def is_default(self) -> bool:
        """True for ``image`` + ``label`` (int32): what the previous release wrote (``spec_version`` 1)."""
        return self.names == ("image", "label") and self.fields[0].type == _SIMPLE["image"] \
            and self.labels_field is not None

    def field_of_member(self, suffix: str) -> Field | None:
        """The field stored as WebDataset member ``key.<suffix>``, or None."""
        low = suffix.lower()
        for f in self.fields:
            if low in (s.lower() for s in f.suffixes()):
                return f
        return None

    def check_sample(self, values: Mapping[str, Any], where: str = "sample") -> dict[str, Any]:
        """Every field's value checked (canonical form); FieldValueError naming ``where`` and the field."""
        missing = [n for n in self.names if n not in values]
        extra = [n for n in values if n not in self]
        if missing or extra:
            what = (f"missing {', '.join(map(repr, missing))}" if missing else "") + \
                   ("; " if missing and extra else "") + (f"not in the schema: {', '.join(map(repr, extra))}"
                                                         if extra else "")
            raise FieldValueError(f"{where}: {what}")
        out = {}
        for f in self.fields:
            try:
                out[f.name] = f.type.check(values[f.name], f.name)
            except FieldValueError as exc:
                raise FieldValueError(f"{where}: {exc}") from None
        return out
