"""The numeric field types: scalars (``int``, ``float``, ``uint8``, ...) and arrays (``float32[4]``,
``float32[*,4]``) of one numpy dtype, stored little-endian.

One class, :class:`NumericType` (a :class:`readers.contract.fieldtypes.FieldType`);
:mod:`readers.contract.fields` names it (``parse_type``) and re-exports it. A scalar or a
fixed-shape array is fixed-size (a format stores the column as one ``(N, *shape)`` array), an
array whose leading dim varies is a blob of whole rows. Its text form (a CSV cell): a decimal
number for a scalar (:data:`INT_TEXT`, :data:`NUMBER_TEXT`: ASCII only), JSON for an array.
"""

from __future__ import annotations

import io
import json
import math
import re
from typing import Any, Iterable, Mapping

import numpy as np

from readers.contract.fieldtypes import FieldType, FieldTypeError
from readers.contract.jsontext import short_repr
from readers.contract.messages import one_line
from readers.contract.safeio import npy_header

__all__ = ["NumericType", "NUMERIC_DTYPES", "DTYPE_ALIASES", "INT_TEXT", "NUMBER_TEXT"]

#: Scalar dtype names a numeric type may use, with ``int`` = int64 and ``float`` = float64.
NUMERIC_DTYPES: Mapping[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
}
#: The type names that stand for a dtype: ``int`` is int64, ``float`` float64.
DTYPE_ALIASES: Mapping[str, str] = {"int": "int64", "float": "float64"}
_CANONICAL = {v: k for k, v in DTYPE_ALIASES.items()}  # int64 scalar -> "int", float64 scalar -> "float"
#: an integer as text (a CSV cell): ASCII digits only (``int()`` also takes ``1_000`` and other scripts' digits, "\u0663")
INT_TEXT = re.compile(r"[ \t]*[+-]?[0-9]+[ \t]*\Z")
#: a number as text: what ``float()`` takes, in ASCII and without ``_``
NUMBER_TEXT = re.compile(r"[ \t]*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)[ \t]*\Z",
                         re.IGNORECASE)


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
        self._name = _CANONICAL.get(self.dtype.name, self.dtype.name) if not self.shape else \
            f"{self.dtype.name}[{','.join('*' if d is None else str(d) for d in self.shape)}]"  # compared per sample
        info = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
        #: an integer scalar's bounds (checked per sample, so not looked up per sample)
        self._int_range: tuple[int, int] | None = (int(info.min), int(info.max)) if info is not None and not self.shape else None

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
        return self._name

    # ---- text (a CSV cell) and a format's column
    def from_text(self, text: str, field: str = "?") -> Any:
        """A scalar: the decimal number (:data:`INT_TEXT` / :data:`NUMBER_TEXT`); an array: its JSON."""
        if not self.scalar:
            return self._from_json_text(text, field)
        self._nonempty(text, field)
        if not (INT_TEXT if self.integer else NUMBER_TEXT).match(text):
            hint = " (ASCII digits only, no '_')" if "_" in text or not text.isascii() else ""
            raise self._bad(field, f"{short_repr(text)} is not {'an integer' if self.integer else 'a number'}{hint}")
        if not self.integer:
            return float(text)
        digits = text.strip().lstrip("+-")
        if len(digits.lstrip("0")) > 20:  # past any int dtype, and int()'s limit
            raise self._bad(field, f"{short_repr(text)}: an integer of {len(digits):,} digits is out of range for "
                                   f"{self.dtype.name}")
        return int(text)

    def column_layout(self, n: int) -> tuple[np.dtype, tuple[int, ...]]:
        if not self.fixed:
            return super().column_layout(n)
        return self.dtype, (n, *self.row_shape)

    def blob_rows(self, nbytes: int) -> int | None:
        return None if self.fixed else nbytes // self.nbytes

    def value_range(self, column: np.ndarray) -> tuple[int | float, int | float] | None:
        values = np.asarray(column)
        if self.integer:
            return (values.min().item(), values.max().item()) if values.size else None
        finite = values[np.isfinite(values)]
        return (finite.min().item(), finite.max().item()) if finite.size else None

    # ---- checking
    def check(self, value: Any, field: str = "?") -> Any:
        bounds = self._int_range
        if bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
            return value  # the common case (a label): what _check_scalar returns for it
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
            raise self._bad(field, f"expected a number, got {type(value).__name__} {short_repr(value)}")
        if self.integer:
            if isinstance(value, float):
                if math.isnan(value):
                    raise self._bad(field, "NaN where an integer is expected")
                if not value.is_integer():
                    raise self._bad(field, f"{value} is not an integer")
                value = int(value)
            assert self._int_range is not None
            low, high = self._int_range
            if not low <= value <= high:
                raise self._bad(field, f"{value} is out of range [{low}, {high}]")
            return value
        try:
            f64 = float(value)
        except OverflowError:
            raise self._bad(field, f"{short_repr(value)} is out of range for {self.dtype.name}") from None
        if self.dtype.itemsize == 8:
            return f64
        with np.errstate(over="ignore"):
            out = float(np.float64(f64).astype(self.dtype))
        if math.isinf(out) and not math.isinf(f64):
            raise self._bad(field, f"{value} is out of range for {self.dtype.name}")
        return out

    def _check_array(self, value: Any, field: str) -> np.ndarray:
        if isinstance(value, (str, bytes, bytearray, dict)) or value is None:
            raise self._bad(field, f"expected an array of numbers, got {type(value).__name__} {short_repr(value)}")
        try:
            with np.errstate(all="ignore"):
                arr = np.asarray(value)
        except (ValueError, TypeError, OverflowError) as exc:
            raise self._bad(field, f"not a rectangular array of numbers ({type(exc).__name__}: ragged or mixed "
                                   f"values)") from None
        if arr.dtype.kind not in "biuf":
            raise self._bad(field, f"expected numbers, got {arr.dtype.name if arr.dtype.kind != 'O' else 'objects'} "
                                   f"{short_repr(value)}")
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
        return np.asarray(self.check(value, field), dtype=self.dtype).reshape(self.row_shape)

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

