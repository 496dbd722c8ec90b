"""packer/importers/manifest.py: CSV, JSONL and Parquet manifests of the bundled photos (captions and
numeric columns made up), type inference, and each bad input as a one-line error or row reject."""

from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.importers import manifest as manifest_mod
from packer.errors import SourceError, UsageError
from packer.importers.manifest import Row, RowReject, manifest_kind, read_manifest

PHOTOS = ["animals/ocelot.jpg", "animals/chelsea.png", "objects_scenes/china.jpg", "people/astronaut.png",
          "objects_scenes/coffee.png", "animals/domestic_dog.jpg"]
CAPTIONS = ["an ocelot on a branch", "a cat, \"Chelsea\"", "a temple roof", "an astronaut in a white suit",
            "a cup of coffee", "un chien qui court"]


@pytest.fixture()
def photos(tmp_path, real_images) -> Path:
    """tmp/data/images/<name> copies of a few bundled photos; manifests go to tmp/data/."""
    d = tmp_path / "data" / "images"
    d.mkdir(parents=True)
    for rel in PHOTOS:
        shutil.copyfile(real_images / rel, d / Path(rel).name)
    return d.parent


def _rows() -> list[dict]:
    """The made-up table: image (relative path), caption, score (float), clicks (int), tags, boxes."""
    out = []
    for i, (rel, cap) in enumerate(zip(PHOTOS, CAPTIONS)):
        out.append({"image": f"images/{Path(rel).name}", "caption": cap, "score": 0.25 * i - 0.5, "clicks": 10 * i,
                    "tags": [i, i + 1], "boxes": [[float(i), 1.0, 2.0, 3.0]] * (i % 3)})
    return out


def _write_csv(path: Path, rows: list[dict], columns=("image", "caption", "score", "clicks")) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([r[c] if not isinstance(r[c], list) else json.dumps(r[c]) for c in columns])
    return path


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list[dict], row_group_size: int = 4) -> Path:
    table = pa.table({
        "image": pa.array([r["image"] for r in rows], pa.string()),
        "caption": pa.array([r["caption"] for r in rows], pa.string()),
        "score": pa.array([r["score"] for r in rows], pa.float32()),
        "clicks": pa.array([r["clicks"] for r in rows], pa.int64()),
        "tags": pa.array([r["tags"] for r in rows], pa.list_(pa.int32())),
        "boxes": pa.array([r["boxes"] for r in rows], pa.list_(pa.list_(pa.float32(), 4))),
        "rgb": pa.array([[i, i, i] for i in range(len(rows))], pa.list_(pa.uint8(), 3)),
        "meta": pa.array([{"k": i, "s": "x"} for i in range(len(rows))], pa.struct([("k", pa.int64()),
                                                                                    ("s", pa.string())])),
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _good(m) -> list[Row]:
    items = list(m.rows())
    assert all(isinstance(r, Row) for r in items), [str(r) for r in items if isinstance(r, RowReject)]
    return items


def _rejects(m) -> list[RowReject]:
    return [r for r in m.rows() if isinstance(r, RowReject)]


# ---------------------------------------------------------------------------------------- the three kinds
def test_csv_manifest(photos):
    rows = _rows()
    m = read_manifest(_write_csv(photos / "rows.csv", rows))
    assert m.kind == "csv" and m.num_rows == len(rows)
    assert [(f.name, f.type.name) for f in m.schema] == [("image", "image"), ("caption", "text"), ("score", "float"),
                                                         ("clicks", "int")]
    got = _good(m)
    assert [r.row for r in got] == list(range(1, len(rows) + 1))
    for r, want in zip(got, rows):
        assert r.image == str(photos / want["image"]) and Path(r.image).is_file()
        assert r.values == {"caption": want["caption"], "score": want["score"], "clicks": want["clicks"]}
        assert type(r.values["clicks"]) is int and type(r.values["score"]) is float


def test_jsonl_manifest(photos):
    rows = _rows()
    m = read_manifest(_write_jsonl(photos / "rows.jsonl", rows))
    assert [(f.name, f.type.name) for f in m.schema] == [
        ("image", "image"), ("caption", "text"), ("score", "float"), ("clicks", "int"), ("tags", "json"),
        ("boxes", "json")]
    got = _good(m)
    for r, want in zip(got, rows):
        assert r.image == str(photos / want["image"])
        assert r.values == {k: v for k, v in want.items() if k != "image"}


def test_jsonl_manifest_with_stated_array_types(photos):
    rows = _rows()
    m = read_manifest(_write_jsonl(photos / "rows.jsonl", rows), fields="tags:int32[2],boxes:float32[*,4]")
    assert m.schema["tags"].type.name == "int32[2]" and m.schema["boxes"].type.name == "float32[*,4]"
    for r, want in zip(_good(m), rows):
        assert r.values["tags"].dtype == np.int32 and r.values["tags"].tolist() == want["tags"]
        b = r.values["boxes"]
        assert b.dtype == np.float32 and b.shape == (len(want["boxes"]), 4) and b.tolist() == want["boxes"]


def test_parquet_manifest(photos):
    rows = _rows()
    m = read_manifest(_write_parquet(photos / "rows.parquet", rows))
    assert m.kind == "parquet" and m.num_rows == len(rows)
    assert [(f.name, f.type.name) for f in m.schema] == [
        ("image", "image"), ("caption", "text"), ("score", "float32"), ("clicks", "int"), ("tags", "int32[*]"),
        ("boxes", "float32[*,4]"), ("rgb", "uint8[3]"), ("meta", "json")]
    got = _good(m)
    assert [r.row for r in got] == list(range(1, len(rows) + 1))
    for i, (r, want) in enumerate(zip(got, rows)):
        assert r.image == str(photos / want["image"])
        v = r.values
        assert v["caption"] == want["caption"] and v["score"] == want["score"] and v["clicks"] == want["clicks"]
        assert v["tags"].dtype == np.int32 and v["tags"].tolist() == want["tags"]
        assert v["boxes"].dtype == np.float32 and v["boxes"].shape == (i % 3, 4)
        assert v["boxes"].tolist() == want["boxes"]
        assert v["rgb"].dtype == np.uint8 and v["rgb"].tolist() == [i, i, i]
        assert v["meta"] == {"k": i, "s": "x"}


def test_parquet_is_read_batch_by_batch(photos, monkeypatch):
    """Streaming: the first row comes after one record batch, not after the whole file."""
    monkeypatch.setattr(manifest_mod, "PARQUET_BATCH_ROWS", 2)
    pulled = []
    real = pq.ParquetFile.iter_batches

    def counting(self, *a, **kw):
        for b in real(self, *a, **kw):
            pulled.append(b.num_rows)
            yield b

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    m = read_manifest(_write_parquet(photos / "rows.parquet", _rows(), row_group_size=2))
    assert pulled == []  # the schema comes from the footer: no first pass over a Parquet file
    it = m.rows()
    first = next(it)
    assert first.row == 1 and pulled == [2]
    rest = list(it)
    assert len(rest) == 5 and pulled == [2, 2, 2]


def test_parquet_binary_image_column(photos):
    data = [(photos / "images" / Path(p).name).read_bytes() for p in PHOTOS[:2]]
    path = photos / "bin.parquet"
    pq.write_table(pa.table({"jpeg": pa.array(data, pa.binary()), "label": pa.array([1, 2], pa.int16())}), path)
    m = read_manifest(path, image_column="jpeg")
    assert [(f.name, f.type.name) for f in m.schema] == [("image", "image"), ("label", "int16")]
    assert m.columns == {"image": "jpeg", "label": "label"}
    got = _good(m)
    assert [r.image for r in got] == data and [r.values["label"] for r in got] == [1, 2]


def test_parquet_null_cell_is_a_row_reject(photos):
    path = photos / "nulls.parquet"
    pq.write_table(pa.table({"image": ["images/ocelot.jpg", None, "images/china.jpg"],
                             "score": pa.array([1.0, 2.0, None], pa.float64())}), path)
    out = list(read_manifest(path).rows())
    assert isinstance(out[0], Row)
    assert str(out[1]) == f"{path} row 2 column 'image': no image (empty cell)"
    assert str(out[2]) == f"{path} row 3 column 'score': no value (null or missing)"


def test_kind_by_suffix():
    assert [manifest_kind(n) for n in ("a.CSV", "b.jsonl", "c.ndjson", "d.parquet", "e.json")] == [
        "csv", "jsonl", "jsonl", "parquet", None]


# -------------------------------------------------------------------------------------- image references
def test_absolute_paths_and_urls(photos):
    ocelot = photos / "images" / "ocelot.jpg"
    path = _write_jsonl(photos / "rows.jsonl", [
        {"image": str(ocelot), "caption": "abs"},
        {"image": "https://example.com/a.jpg", "caption": "url"},
        {"image": "s3://bucket/key/b.png", "caption": "s3"},
    ])
    got = _good(read_manifest(path))
    assert [r.image for r in got] == [str(ocelot), "https://example.com/a.jpg", "s3://bucket/key/b.png"]


def test_custom_image_column_and_second_image_field(photos):
    path = _write_jsonl(photos / "rows.jsonl", [
        {"path": "images/ocelot.jpg", "mask": "images/chelsea.png", "caption": "a"},
        {"path": "images/china.jpg", "mask": "images/gone.png", "caption": "b"},
    ])
    m = read_manifest(path, image_column="path", fields={"mask": "image"})
    assert [(f.name, f.type.name) for f in m.schema] == [("image", "image"), ("mask", "image"), ("caption", "text")]
    out = list(m.rows())
    assert out[0].image == str(photos / "images/ocelot.jpg") and out[0].values["mask"] == str(
        photos / "images/chelsea.png")
    assert isinstance(out[1], RowReject) and out[1].row == 2 and out[1].column == "mask"
    assert "image 'images/gone.png' not found" in out[1].reason


# ---------------------------------------------------------------------------------------------- rejects
def test_missing_image_is_a_row_reject_and_the_rest_continues(photos):
    rows = _rows()
    rows[2]["image"] = "images/nope.jpg"
    rows[4]["image"] = ""
    path = _write_csv(photos / "rows.csv", rows)
    out = list(read_manifest(path).rows())
    assert len(out) == len(rows)
    rej = [r for r in out if isinstance(r, RowReject)]
    assert [str(r) for r in rej] == [
        f"{path} row 3 column 'image': image 'images/nope.jpg' not found (No such file or directory: "
        f"{photos / 'images/nope.jpg'})",
        f"{path} row 5 column 'image': no image (empty cell)"]
    assert [r.row for r in out if isinstance(r, Row)] == [1, 2, 4, 6]


def test_image_that_is_a_folder_or_empty_is_a_reject(photos):
    (photos / "images" / "empty.jpg").write_bytes(b"")
    path = _write_jsonl(photos / "rows.jsonl", [{"image": "images"}, {"image": "images/empty.jpg"}, {"image": 7}])
    reasons = [r.reason for r in _rejects(read_manifest(path))]
    assert reasons[0].startswith("image 'images' is not a regular file")
    assert reasons[1].startswith("image 'images/empty.jpg' is empty")
    assert reasons[2] == "expected an image path or URL, got int 7"


def test_malformed_json_cell_in_csv(photos):
    path = photos / "rows.csv"
    path.write_text('image,meta\nimages/ocelot.jpg,"{""a"": 1}"\nimages/china.jpg,"{a: 1}"\n'
                    'images/chelsea.png,[1]\n', encoding="utf-8")
    out = list(read_manifest(path, fields="meta:json").rows())
    assert out[0].values == {"meta": {"a": 1}} and out[2].values == {"meta": [1]}
    assert str(out[1]) == (f"{path} row 2 column 'meta': malformed JSON (Expecting property name enclosed in "
                           f"double quotes at column 2)")


def test_malformed_jsonl_line(photos):
    path = photos / "rows.jsonl"
    path.write_text('{"image": "images/ocelot.jpg", "n": 1}\n\n{"image": "images/china.jpg", "n": \n'
                    '[1, 2]\n{"image": "images/chelsea.png", "n": 3}\n', encoding="utf-8")
    m = read_manifest(path)
    assert m.num_rows == 4 and m.schema["n"].type.name == "int"
    out = list(m.rows())
    assert [r.row for r in out] == [1, 3, 4, 5]  # JSONL rows are line numbers; the blank line is skipped
    assert str(out[1]).startswith(f"{path} row 3: malformed JSON (Expecting value")
    assert str(out[2]) == f"{path} row 4: expected a JSON object, got list"
    assert isinstance(out[3], Row) and out[3].values == {"n": 3}


def test_box_of_the_wrong_width_is_a_row_reject(photos):
    path = _write_jsonl(photos / "rows.jsonl", [
        {"image": "images/ocelot.jpg", "boxes": [[1, 2, 3, 4]]},
        {"image": "images/china.jpg", "boxes": [[1, 2, 3]]},
        {"image": "images/chelsea.png", "boxes": []},
    ])
    out = list(read_manifest(path, fields="boxes:float32[*,4]").rows())
    assert str(out[1]) == f"{path} row 2 column 'boxes': shape (1, 3) does not fit float32[*,4]"
    assert out[2].values["boxes"].shape == (0, 4)


def test_cell_that_does_not_fit_a_stated_type(photos):
    path = photos / "rows.csv"
    path.write_text("image,n,s\nimages/ocelot.jpg,3,1.5\nimages/china.jpg,x,2\nimages/chelsea.png,4,\n"
                    "images/coffee.png,300,1\nimages/astronaut.png,1,2,3\n", encoding="utf-8")
    out = list(read_manifest(path, fields={"n": "uint8", "s": "float32"}).rows())
    assert out[0].values == {"n": 3, "s": 1.5}
    assert [str(r) for r in out[1:]] == [
        f"{path} row 2 column 'n': 'x' is not an integer",
        f"{path} row 3 column 's': empty cell",
        f"{path} row 4 column 'n': 300 is out of range [0, 255]",
        f"{path} row 5: has 4 cells, the header has 3"]


# ------------------------------------------------------------------------------------------ inference
def test_mixed_types_in_jsonl_name_the_column_and_first_bad_row(photos):
    path = _write_jsonl(photos / "rows.jsonl", [
        {"image": "images/ocelot.jpg", "score": 1}, {"image": "images/china.jpg", "score": 2.5},
        {"image": "images/chelsea.png", "score": None}, {"image": "images/coffee.png", "score": "high"},
        {"image": "images/coffee.png", "score": "low"}])
    with pytest.raises(SourceError) as ei:
        read_manifest(path)
    assert str(ei.value) == (f"{path}: column 'score' has mixed types: float from row 1, then text at row 4 "
                             f"('high'); fix the row or state the column's type with --fields score:TYPE")
    assert ei.value.exit_code == 2
    # stating the type turns the bad rows into rejects
    out = list(read_manifest(path, fields="score:float").rows())
    assert [type(r).__name__ for r in out] == ["Row", "Row", "RowReject", "RowReject", "RowReject"]


@pytest.mark.parametrize("values, want", [
    ([1, 2, 3], "int"), ([1, 2.5], "float"), ([True, False], "uint8"), ([True, 3], "int"), (["a", "b"], "text"),
    ([{"a": 1}, [1]], "json"), ([None, None], "json"), ([None, 4], "int"),
], ids=str)
def test_jsonl_inference(photos, values, want):
    path = _write_jsonl(photos / "rows.jsonl", [{"image": "images/ocelot.jpg", "c": v} for v in values])
    assert read_manifest(path).schema["c"].type.name == want


@pytest.mark.parametrize("cells, want", [
    (["1", "2"], "int"), (["1", "2.5"], "float"), (["1e3", "-4"], "float"), (["a", "2"], "text"),
    (["", "3"], "int"), (["", ""], "text"),
], ids=str)
def test_csv_inference(photos, cells, want):
    path = photos / "rows.csv"
    path.write_text("image,c\n" + "".join(f"images/ocelot.jpg,{c}\n" for c in cells), encoding="utf-8")
    assert read_manifest(path).schema["c"].type.name == want


def test_csv_numbers_with_one_word_become_text_with_a_warning(photos, caplog):
    path = photos / "rows.csv"
    path.write_text("image,score\nimages/ocelot.jpg,1.5\nimages/china.jpg,n/a\nimages/chelsea.png,2\n",
                    encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="packer.importers.manifest"):
        m = read_manifest(path)
    assert m.schema["score"].type.name == "text"
    assert [r.values["score"] for r in m.rows()] == ["1.5", "n/a", "2"]
    assert "column 'score' is stored as text: 2 cells are numbers but row 2 is 'n/a'" in caplog.text


def test_explicit_types_override_inference(photos):
    path = _write_csv(photos / "rows.csv", _rows())
    m = read_manifest(path, fields="clicks:float32,caption:json")
    assert m.schema["clicks"].type.name == "float32" and m.schema["caption"].type.name == "json"
    out = list(m.rows())
    assert isinstance(out[0], RowReject) and out[0].column == "caption"  # "an ocelot ..." is not JSON


# ----------------------------------------------------------------------------------- file-level errors
@pytest.mark.parametrize("fields, needle", [
    ("score:flaot", "--fields: unknown field type 'flaot' for field 'score'; known: image, text"),
    ("nope:text", "--fields names 'nope', not a column of the manifest (columns: image, caption, score, clicks)"),
    ("image:text", "--fields gives the image column 'image' type text"),
    ("caption", "--fields: 'caption' is not NAME:TYPE"),
])
def test_bad_fields_option_is_a_usage_error(photos, fields, needle):
    path = _write_csv(photos / "rows.csv", _rows())
    with pytest.raises(UsageError) as ei:
        read_manifest(path, fields=fields)
    assert str(ei.value).startswith(f"{path}: ") and needle in str(ei.value) and "\n" not in str(ei.value)
    assert ei.value.exit_code == 2


def test_file_level_errors(photos):
    with pytest.raises(SourceError, match=r"not a manifest \(expected a .csv, .jsonl or .parquet file\)"):
        read_manifest(photos / "rows.txt")
    with pytest.raises(SourceError, match="no such manifest file"):
        read_manifest(photos / "missing.csv")
    path = photos / "rows.csv"
    path.write_text("path,caption\nimages/ocelot.jpg,a\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"no image column 'image' \(columns: path, caption\); name it with "
                                          r"--image-column"):
        read_manifest(path)
    (photos / "empty.csv").write_text("", encoding="utf-8")
    with pytest.raises(SourceError, match="empty CSV file"):
        read_manifest(photos / "empty.csv")
    (photos / "header.csv").write_text("image,caption\n", encoding="utf-8")
    with pytest.raises(SourceError, match="the manifest has no rows"):
        read_manifest(photos / "header.csv")
    (photos / "latin1.csv").write_bytes("image,caption\nimages/ocelot.jpg,caf\xe9\n".encode("latin-1"))
    with pytest.raises(SourceError, match="not UTF-8 text"):
        read_manifest(photos / "latin1.csv")
    (photos / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        read_manifest(photos / "bad.parquet")


def test_column_names_must_be_field_names(photos):
    path = photos / "rows.csv"
    path.write_text("image,a.b\nimages/ocelot.jpg,1\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"column 'a.b' cannot be a field: field name 'a.b' is not allowed"):
        read_manifest(path)
    path.write_text("path,image\nimages/ocelot.jpg,1\n", encoding="utf-8")
    with pytest.raises(SourceError, match="column 'image' is not the image column"):
        read_manifest(path, image_column="path")
    path.write_text("image,c,c\nimages/ocelot.jpg,1,2\n", encoding="utf-8")
    with pytest.raises(SourceError, match="column names repeat"):
        read_manifest(path)


def test_parquet_column_of_an_unsupported_type(photos):
    path = photos / "ts.parquet"
    pq.write_table(pa.table({"image": ["images/ocelot.jpg"], "when": pa.array([1], pa.timestamp("s"))}), path)
    with pytest.raises(SourceError, match=r"column 'when' has Parquet type timestamp\[m?s\], which no field type"):
        read_manifest(path)


# ------------------------------------------------------------------------------------- property test
_cells = st.tuples(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\x00"), max_size=12),
    st.integers(-2**63, 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.lists(_cells, min_size=1, max_size=8), kind=st.sampled_from(["csv", "jsonl", "parquet"]))
def test_any_table_reads_back_exactly(photos, table, kind):
    """Whatever the text, ints and floats, every kind of manifest gives back the same values."""
    rows = [{"image": "images/ocelot.jpg", "t": t, "i": i, "f": f} for t, i, f in table]
    path = photos / f"prop.{kind}"
    if kind == "csv":
        _write_csv(path, rows, columns=("image", "t", "i", "f"))
    elif kind == "jsonl":
        _write_jsonl(path, rows)
    else:
        pq.write_table(pa.table({"image": [r["image"] for r in rows], "t": [r["t"] for r in rows],
                                 "i": pa.array([r["i"] for r in rows], pa.int64()),
                                 "f": pa.array([r["f"] for r in rows], pa.float64())}), path)
    m = read_manifest(path, fields="t:text,i:int,f:float")
    got = _good(m)
    assert [r.values for r in got] == [{"t": t, "i": i, "f": f} for t, i, f in table]
