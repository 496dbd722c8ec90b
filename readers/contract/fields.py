"""Typed sample fields: the field types by name (:func:`parse_type`) and the :class:`Schema` of a dataset.

The packer (``packer/importers/manifest.py``, ``packer/importers/coco.py``, the format writers) and
every reader import this module. The type classes are :mod:`readers.contract.fieldtypes` (image,
text, json, bytes; the errors) and :mod:`readers.contract.numeric` (scalars and arrays); this
module re-exports them, names them, and says where each format keeps a field (the field layout).
Models: FFCV ``ffcv/fields/`` (one class per field type: its dtype, how it encodes, how it
decodes) and mosaicml-streaming ``streaming/base/format/mds/encodings.py`` (a registry name ->
encoding, each fixed-size or variable-size). The design, and what is not wired yet, is in
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

import math
import re
from functools import cached_property
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from readers.contract.fieldtypes import (BytesType, FieldType, FieldTypeError, FieldValueError, ImageType, JsonType,
                                         TextType, image_extension)
from readers.contract.jsontext import short_repr
from readers.contract.numeric import DTYPE_ALIASES, NUMERIC_DTYPES, NumericType
from readers.contract.spec import DatasetFormatError, field_array_name
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
    "as_field_type",
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


#: The names of the non-numeric types, then the numeric forms (for error messages).
KNOWN_TYPES = ("image", "text", "json", "bytes", "int", "float") + tuple(NUMERIC_DTYPES) + (
    "DTYPE[N,...]", "DTYPE[*,...]")
_MAX_DIMS = 8
_MAX_ELEMENTS = 2**31 - 1
#: A field name: also a WebDataset key suffix (no dot), an HDF5 dataset name and a JSON key.
_NAME_RE = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")

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
    base = m.group(1) if m else ""
    dtype = DTYPE_ALIASES.get(base, base)
    if m is None or (base not in _SIMPLE and dtype not in NUMERIC_DTYPES):
        raise FieldTypeError(f"unknown field type {short_repr(text, 60)}{where}; known: {_known()}")
    dims = m.group(2)
    if base in _SIMPLE:
        if dims is not None:
            raise FieldTypeError(f"field type {short_repr(text, 60)}{where}: {base} takes no shape; known: {_known()}")
        return _SIMPLE[base]
    if dims is None:
        return NumericType(dtype)
    shape: list[int | None] = []
    for i, d in enumerate(dims.split(",")):
        if d == "*" and i == 0:
            shape.append(None)
        elif _DIM_RE.match(d) and int(d) >= 1:  # ASCII digits only: '²'.isdigit(), int('²') fails
            shape.append(int(d))
        else:
            raise FieldTypeError(f"field type {short_repr(text, 60)}{where}: bad dim {short_repr(d, 20)} (each dim "
                                 f"is a number >= 1; the first may be *)")
    if len(shape) > _MAX_DIMS or math.prod(d or 1 for d in shape) > _MAX_ELEMENTS:
        raise FieldTypeError(f"field type {short_repr(text, 60)}{where}: at most {_MAX_DIMS} dims and "
                             f"{_MAX_ELEMENTS} elements")
    return NumericType(dtype, shape)


def as_field_type(t: FieldType | str, field: str | None = None) -> FieldType:
    """``t`` itself when it is a FieldType, else :func:`parse_type` of it (a type given either way)."""
    return t if isinstance(t, FieldType) else parse_type(t, field)


def check_field_name(name: Any) -> str:
    """``name`` if it can name a field (1-64 letters, digits, ``_``, ``-``; no dot, no leading ``__``)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise FieldTypeError(f"field name {short_repr(name)} is not allowed: use 1-64 letters, digits, '_' or '-', "
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
def column_file(name: str, meta: Mapping[str, Any] | None = None) -> str:
    """A fixed field's ``(N, *shape)`` column beside the index (wds, lmdb, mmap), of the generation
    ``meta`` is (``field-<name>.gNNNNNN.npy`` after an append, as the index arrays)."""
    return spec_array_file(field_array_name(name), meta)


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
        return cls(tuple(Field(n, as_field_type(t, n)) for n, t in items))

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
    @cached_property
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

    @cached_property  # a frozen schema: looked up per sample by the writers
    def labels_field(self) -> Field | None:
        """The field kept in ``labels.npy`` (and ``/labels``, ``key.cls``) as before fields existed: an
        ``int32`` scalar named ``label``; None when the schema has none (then ``labels.npy`` holds zeros)."""
        for f in self.fields:
            if f.name == "label" and f.type == _INT32:
                return f
        return None

    @cached_property
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
            raise FieldValueError(f"{where}: {what}", reason=what)
        out = {}
        for f in self.fields:
            try:
                out[f.name] = f.type.check(values[f.name], f.name)
            except FieldValueError as exc:
                raise FieldValueError(f"{where}: {exc}", field=exc.field, reason=exc.reason) from None
        return out
