"""What a :class:`packer.writer.Writer` makes of a sample dict: its schema (:func:`infer_schema`: the
fields stated, else the types of the first sample's values) and its image's encoded bytes
(:func:`image_bytes`: bytes as they are, a PIL image or uint8 array as a lossless PNG)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Mapping

import numpy as np

from packer.errors import UsageError
from readers.contract.fields import Field, FieldType, FieldValueError, ImageType, NumericType, Schema, parse_type

__all__ = ["infer_schema", "image_bytes", "LABEL"]

LABEL = NumericType("int32")  # what labels.npy holds (Schema.labels_field)


# ------------------------------------------------------------------------------------ schema
def _infer_type(name: str, value: Any) -> FieldType:
    if name == "image":
        return ImageType()
    if name == "label" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return LABEL
    if isinstance(value, bool):
        return NumericType("uint8")
    if isinstance(value, np.generic) and value.dtype.kind in "iuf":
        return NumericType(value.dtype)
    if isinstance(value, int):
        return parse_type("int")
    if isinstance(value, float):
        return parse_type("float")
    if isinstance(value, str):
        return parse_type("text")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return parse_type("bytes")
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf" and value.ndim >= 1:
        return NumericType(value.dtype, (None, *value.shape[1:]))
    if isinstance(value, (dict, list, tuple)):
        return parse_type("json")
    raise UsageError(f"field {name!r}: cannot infer a type from {type(value).__name__}; state it with "
                     f"fields={{{name!r}: TYPE}}")


def infer_schema(sample: Mapping[str, Any], fields: Mapping[str, FieldType | str] | str | None = None,
                 classes: Sequence[str] | None = None) -> Schema:
    """The schema of a Writer: ``fields`` (``name -> type``, or ``"caption:text,boxes:float32[*,4]"``),
    else the types of ``sample``'s values (``__key__`` is no field). ``image`` is required; ``label``
    gets ``classes``."""
    if isinstance(fields, str):
        from readers.contract.fields import parse_fields_option

        fields = parse_fields_option(fields)
    pairs = dict(fields) if fields is not None else {n: _infer_type(n, v) for n, v in sample.items()
                                                     if n != "__key__"}
    if "image" not in pairs:
        raise UsageError(f"a Writer's samples need an 'image' field; the fields are {', '.join(pairs) or 'none'}")
    order = ["image"] + (["label"] if "label" in pairs else []) + [n for n in pairs if n not in ("image", "label")]
    out = []
    for n in order:
        given = pairs[n]
        t = given if isinstance(given, FieldType) else parse_type(str(given), n)
        names = dict(enumerate(classes)) if n == "label" and classes is not None and t == LABEL else None
        out.append(Field(n, t, names))
    return Schema(tuple(out))


# ------------------------------------------------------------------------------------ images
def image_bytes(value: Any) -> bytes:
    """Encoded bytes of an ``image`` value: bytes as they are; a PIL image or uint8 array as PNG."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    from PIL import Image

    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or not (value.ndim == 2 or value.ndim == 3 and value.shape[2] in (3, 4)):
            raise FieldValueError(f"field 'image': an array must be HxWx3 (RGB), HxWx4 (RGBA) or HxW uint8, got "
                                  f"{value.dtype} {value.shape}")
        value = Image.fromarray(np.ascontiguousarray(value))
    if not isinstance(value, Image.Image):
        raise FieldValueError(f"field 'image': expected encoded bytes, a PIL image or a uint8 array, got "
                              f"{type(value).__name__}")
    buf = io.BytesIO()
    try:
        value.save(buf, "PNG")  # lossless, as a pack stores any image that is neither JPEG nor PNG
    except (OSError, ValueError) as exc:
        raise FieldValueError(f"field 'image': cannot encode this {value.mode} image as PNG ({exc})") from None
    return buf.getvalue()
