"""The field types: one class per kind of value a sample's field holds, and their errors.

:mod:`readers.contract.fields` names them (``parse_type``), puts them in a ``Schema`` and
re-exports every name here; the numeric types are :mod:`readers.contract.numeric`. Models: FFCV
``ffcv/fields/`` (one class per field type: its dtype, how it encodes, how it decodes).

What each type owns, so that no caller asks a type which class it is:

* checking a Python value (:meth:`FieldType.check`: the canonical form, or a
  :class:`FieldValueError` whose ``field`` and ``reason`` an importer puts after its row and column);
* its stored blob (``encode`` / ``decode``) and WebDataset member (``to_member`` / ``from_member``);
* its text form (:meth:`FieldType.from_text`: a CSV cell), whether ``None`` is a value
  (``nullable``: JSON null), whether it holds an image (``is_image``: a manifest's cell names a
  file to read), how deep its value may nest (:meth:`FieldType.check_nesting`);
* for the formats: a fixed type's column (:meth:`FieldType.column_layout`), rows in a variable
  array's blob (:meth:`FieldType.blob_rows`), a column's smallest and largest value
  (:meth:`FieldType.value_range`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, ClassVar

import numpy as np

from readers.contract.jsontext import JSON_ERRORS, json_loads, json_problem, json_too_deep, short_repr
from readers.contract.spec import is_jpeg

__all__ = ["FieldValueError", "FieldTypeError", "FieldType", "ImageType", "TextType", "JsonType", "BytesType",
           "image_extension"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class FieldValueError(ValueError):
    """A value does not fit its field's type; ``str(exc)`` is one line naming the field.

    ``field``: the field's name (None where the error is not one field's: a sample missing fields);
    ``reason``: what is wrong, without the field's name and type (``"shape (1, 3) does not fit
    float32[*,4]"``), what an importer writes after its own row and column; the whole message where
    the raiser gave no reason."""

    def __init__(self, message: str, *, field: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = message if reason is None else reason

    @classmethod
    def of(cls, field: str, type_name: str, reason: str) -> FieldValueError:
        """``field 'boxes' (float32[*,4]): <reason>``, with ``field`` and ``reason`` kept."""
        return cls(f"field {field!r} ({type_name}): {reason}", field=field, reason=reason)


class FieldTypeError(ValueError):
    """A type string or a ``--fields`` option cannot be parsed; one line naming it."""


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
    #: the value is an encoded image (which a manifest's cell names by its path or URL)
    is_image: ClassVar[bool] = False
    #: ``None`` is a value of this type (JSON null); for the others a null or missing cell has no value
    nullable: ClassVar[bool] = False

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
            raise self._bad(field, str(exc)) from None

    def member_blob(self, data: bytes | bytearray | memoryview, value: Any) -> bytes:
        """The stored blob (what ``encode`` gives, what ``field_checksums.npy`` covers) of the member
        ``data`` whose value :meth:`from_member` gave as ``value``: the member itself, but for numbers."""
        return bytes(data)

    # ---- what an importer asks of a cell
    def from_text(self, text: str, field: str = "?") -> Any:
        """The value a text cell (a CSV manifest's) stands for, to give to :meth:`check`: the text
        (text), its UTF-8 (bytes), a decimal number (numeric scalars), strict JSON (json, arrays:
        :func:`readers.contract.jsontext.json_loads`). FieldValueError when it stands for none (an
        empty cell, but for text; a number that does not parse; malformed JSON). Images have no
        text form (the cell names a file: the importer reads it): TypeError."""
        raise TypeError(f"a {self.name} field has no text form")

    def check_nesting(self, value: Any, field: str = "?") -> None:
        """FieldValueError when this type keeps ``value``'s lists and dicts as they are (json) and they
        nest more than :data:`readers.contract.jsontext.MAX_JSON_DEPTH` levels, which not every
        process could parse back; nothing for the other types."""

    def _nonempty(self, text: str, field: str) -> str:
        if text == "":
            raise self._bad(field, "empty cell")
        return text

    def _from_json_text(self, text: str, field: str) -> Any:
        self._nonempty(text, field)
        try:
            return json_loads(text)
        except JSON_ERRORS as exc:
            raise self._bad(field, json_problem(exc)) from None

    # ---- what a format asks of a column
    def column_layout(self, n: int) -> tuple[np.dtype, tuple[int, ...]]:
        """The dtype and shape of the ``(n, *shape)`` column of a fixed type; TypeError for a variable one."""
        raise TypeError(f"{self.name} is variable-size: it has no column")

    def blob_rows(self, nbytes: int) -> int | None:
        """How many leading-dim rows a stored blob of ``nbytes`` bytes holds: variable-size arrays
        only; None for every other type."""
        return None

    def value_range(self, column: np.ndarray) -> tuple[int | float, int | float] | None:
        """The smallest and largest value of a fixed column (the finite ones for floats); None where
        there are none or the type has no order."""
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _bad(self, field: str, what: str) -> FieldValueError:
        return FieldValueError.of(field, self.name, what)


class ImageType(FieldType):
    """Encoded image bytes (JPEG or PNG; ``packer.prepare.images`` decides what is stored). Decoded form: bytes."""

    extensions = ("jpg", "png")
    is_image = True

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
            raise self._bad(field, f"expected a string, got {type(value).__name__} {short_repr(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise self._bad(field, f"not encodable as UTF-8 (character {exc.start}: a lone surrogate)") from None
        return value

    def from_text(self, text: str, field: str = "?") -> str:
        return text  # an empty cell is the empty string

    def encode(self, value: Any, field: str = "?") -> bytes:
        return self.check(value, field).encode("utf-8")

    def decode(self, data: bytes | bytearray | memoryview) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"stored text is not UTF-8 (byte {exc.start})") from None


def _json_walk(value: Any, field: str, bad: Callable[[str, str], FieldValueError]) -> None:
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
                    raise bad(field, f"JSON object key {short_repr(k)} is not a string")
                stack.append(item)
        else:
            raise bad(field, f"{type(v).__name__} is not a JSON value")


class JsonType(FieldType):
    """Any JSON value; stored as compact UTF-8 JSON. Decoded form: what ``json.loads`` gives."""

    extensions = ("json",)
    nullable = True

    @property
    def name(self) -> str:
        return "json"

    def check(self, value: Any, field: str = "?") -> Any:
        _json_walk(value, field, self._bad)
        return value

    def from_text(self, text: str, field: str = "?") -> Any:
        return self._from_json_text(text, field)

    def check_nesting(self, value: Any, field: str = "?") -> None:
        if json_too_deep(value):
            raise self._bad(field, json_problem(RecursionError()))

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

    def from_text(self, text: str, field: str = "?") -> bytes:
        return self._nonempty(text, field).encode("utf-8")

    def encode(self, value: Any, field: str = "?") -> bytes:
        return self.check(value, field)

    def decode(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)
