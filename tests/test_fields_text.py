"""readers/contract/fieldtypes.py and numeric.py: what the field types own for importers and formats.

The from_text table was captured from ``packer/importers/manifest.py`` before the CSV rules moved onto
the types (issue 32 item 2): a CSV cell of each type gives the same value or the same reject reason."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from readers.contract.fields import FieldValueError, Schema, parse_type

DEEP = "[" * 300 + "]" * 300
# (type, cell, expected value, or the reject reason as a str inside a 1-tuple)
CASES = [
    ("text", "", ""), ("text", " 12 ", " 12 "), ("text", "null", "null"),
    ("bytes", "", ("empty cell",)), ("bytes", "\u0663", b"\xd9\xa3"), ("bytes", "[1,", b"[1,"),
    ("json", "", ("empty cell",)), ("json", " ", ("malformed JSON (Expecting value at column 2)",)),
    ("json", " 12 ", 12), ("json", "null", None), ("json", "true", True), ("json", '"q"', "q"),
    ("json", '{"a":1}', {"a": 1}), ("json", '{"a":1,"a":2}', ("the key 'a' is given twice in one JSON object",)),
    ("json", "-Infinity", ("-inf is not valid JSON",)), ("json", "1e400", ("inf is not valid JSON",)),
    ("json", DEEP, ("JSON nested more than 200 levels deep",)),
    ("json", "1" * 5000, ("an integer of more than 4,300 digits",)),
    ("json", "1_000", ("malformed JSON (Extra data at column 2)",)),
    ("int", "", ("empty cell",)), ("int", " ", ("' ' is not an integer",)), ("int", " 12 ", 12), ("int", "+7", 7),
    ("int", "1.5", ("'1.5' is not an integer",)), ("int", "1_000", ("'1_000' is not an integer (ASCII digits only, no '_')",)),
    ("int", "\u0663", ("'\u0663' is not an integer (ASCII digits only, no '_')",)),
    ("int", "9" * 25, ("'9999999999999999999999999': an integer of 25 digits is out of range for int64",)),
    ("int8", "300", ("300 is out of range [-128, 127]",)), ("uint8", "-3", ("-3 is out of range [0, 255]",)),
    ("float", "", ("empty cell",)), ("float", ".5", 0.5), ("float", "-Infinity", -math.inf), ("float", "1e400", math.inf),
    ("float", "abc", ("'abc' is not a number",)), ("float", "9" * 25, 1e25),
    ("float16", "9" * 25, ("1e+25 is out of range for float16",)),
    ("float32[2]", "", ("empty cell",)), ("float32[2]", "[1.5,2]", np.array([1.5, 2], "<f4")),
    ("float32[2]", "0", ("shape () does not fit float32[2]",)), ("float32[2]", "null", ("expected an array of numbers, got NoneType None",)),
    ("float32[2]", DEEP, ("not a rectangular array of numbers (ValueError: ragged or mixed values)",)),
    ("int32[*]", "[]", np.zeros(0, "<i4")), ("int32[*]", "[1.5,2]", ("1.5 is not an integer",)),
    ("int32[*]", "[" * 1100 + "]" * 1100, ("JSON nested more than 200 levels deep",)),
    ("float32[*,2]", '{"a":1,"a":2}', ("the key 'a' is given twice in one JSON object",)),
]


def _from_cell(type_name: str, cell: str):
    """What a manifest does with a CSV cell of that type (packer.importers.manifest.Manifest._value)."""
    t = parse_type(type_name)
    value = t.from_text(cell, "v")
    t.check_nesting(value, "v")
    return t.check(value, "v")


@pytest.mark.parametrize("type_name,cell,expected", CASES, ids=[f"{t}-{c[:12]!r}" for t, c, _ in CASES])
def test_from_text_gives_what_the_manifest_gave(type_name, cell, expected):
    if isinstance(expected, tuple):
        with pytest.raises(FieldValueError) as ei:
            _from_cell(type_name, cell)
        assert ei.value.reason == expected[0]
        assert ei.value.field == "v"
        assert str(ei.value) == f"field 'v' ({type_name}): {expected[0]}"
        return
    got = _from_cell(type_name, cell)
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape and (got == expected).all()
    else:
        assert type(got) is type(expected) and got == expected


@pytest.mark.parametrize("type_name", ["text", "bytes", "int", "float32[*,4]", "image"])
def test_only_json_is_nullable(type_name):
    t = parse_type(type_name)
    assert not t.nullable
    with pytest.raises(FieldValueError):
        t.check(None, "v")
    assert parse_type("json").nullable and parse_type("json").check(None) is None
    assert t.is_image == (type_name == "image")


def test_image_has_no_text_form():
    with pytest.raises(TypeError, match="no text form"):
        parse_type("image").from_text("a.jpg")


def test_field_value_error_carries_field_and_reason():
    with pytest.raises(FieldValueError) as ei:
        parse_type("float32[*,4]").check([[1, 2, 3]], "boxes")
    exc = ei.value
    assert str(exc) == "field 'boxes' (float32[*,4]): shape (1, 3) does not fit float32[*,4]"
    assert (exc.field, exc.reason) == ("boxes", "shape (1, 3) does not fit float32[*,4]")
    again = pickle.loads(pickle.dumps(exc))  # crosses a worker process as it is
    assert (str(again), again.field, again.reason) == (str(exc), exc.field, exc.reason)
    schema = Schema.of({"image": "image", "boxes": "float32[*,4]"})
    with pytest.raises(FieldValueError) as ei:
        schema.check_sample({"image": b"\xff\xd8\xff", "boxes": [[1, 2, 3]]}, "row 3")
    assert str(ei.value) == "row 3: field 'boxes' (float32[*,4]): shape (1, 3) does not fit float32[*,4]"
    assert (ei.value.field, ei.value.reason) == ("boxes", "shape (1, 3) does not fit float32[*,4]")
    with pytest.raises(FieldValueError) as ei:
        schema.check_sample({"image": b"\xff\xd8\xff"}, "row 3")
    assert (ei.value.field, ei.value.reason) == (None, "missing 'boxes'")
    plain = FieldValueError("field 'image': expected encoded bytes")
    assert (plain.field, plain.reason) == (None, "field 'image': expected encoded bytes")


def test_column_layout_rows_and_range():
    fixed, var, text = parse_type("uint8[3]"), parse_type("float32[*,4]"), parse_type("text")
    assert fixed.column_layout(5) == (np.dtype("<u1"), (5, 3))
    assert parse_type("int").column_layout(2) == (np.dtype("<i8"), (2,))
    for t in (var, text):
        with pytest.raises(TypeError, match="variable-size"):
            t.column_layout(5)
    assert var.blob_rows(48) == 3 and fixed.blob_rows(3) is None and text.blob_rows(10) is None
    assert fixed.value_range(np.array([[1, 9, 3], [0, 4, 4]], "<u1")) == (0, 9)
    f = parse_type("float16")
    assert f.value_range(np.array([np.nan, -np.inf, 2.5, -1.0], "<f2")) == (-1.0, 2.5)
    assert f.value_range(np.array([np.nan, np.inf], "<f2")) is None
    assert text.value_range(np.zeros(3)) is None
