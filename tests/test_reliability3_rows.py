"""Issue 33, items 3, 6 and the manifest/COCO parts of 13: hostile manifest and COCO cells through the
real ``pack-dataset`` (subprocess): one line naming the file, row and column (a row reject, the rest
packed, exit 3) or the file and place (a refusal, exit 2), never a traceback."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from reliability_helpers import assert_one_line, cli

from readers.contract import spec

DEEP = "[" * 100_000 + "]" * 100_000  # past the recursion limit: json.loads raises RecursionError
MID = "[" * 500 + "]" * 500  # parses, but past MAX_JSON_DEPTH (200)
HUGE = "1" * 5000  # past Python's 4,300-digit int-str limit


@pytest.fixture()
def images(tmp_path, real_images) -> Path:
    d = tmp_path / "data" / "images"
    d.mkdir(parents=True)
    for k in range(3):
        shutil.copyfile(real_images / "animals" / "ocelot.jpg", d / f"{k}.jpg")
    return d.parent


def _rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]


def _pack_rejects(src: Path, out: Path, *args) -> list[dict]:
    """Pack ``src``: it must finish with rejects (exit 3), the good rows packed, no traceback."""
    r = cli(src, "-f", "wds", "-o", out, "-q", *args)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 3, (r.returncode, r.stderr)
    return sorted(_rejects(out), key=lambda x: x["reason"])


@pytest.mark.parametrize("cell, column, why", [
    (DEEP, "meta", "JSON nested more than 200 levels deep"),
    (MID, "meta", "JSON nested more than 200 levels deep"),
    (HUGE, "n", "an integer of more than 4,300 digits"),
], ids=["deep", "past-depth-limit", "huge-int"])
def test_jsonl_cell_nested_deep_or_huge_is_a_row_reject(images, tmp_path, cell, column, why):
    lines = ['{"image": "images/0.jpg", "meta": [1], "n": 1}', '{"image": "images/1.jpg", "meta": [1], "n": 1}',
             '{"image": "images/2.jpg", "meta": [3], "n": 3}']
    lines[1] = lines[1].replace('"meta": [1]', f'"meta": {cell}' if column == "meta" else '"meta": [1]')
    lines[1] = lines[1].replace('"n": 1', f'"n": {cell}' if column == "n" else '"n": 1')
    path = images / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (reject,) = _pack_rejects(path, tmp_path / "out")
    assert reject == {"path": "images/1.jpg", "reason": f"{path} row 2 column {column!r}: {why}"}
    assert (tmp_path / "out" / spec.INDEX_NAME).is_file()


def test_csv_json_cell_nested_deep_is_a_row_reject(images, tmp_path):
    path = images / "rows.csv"
    path.write_text("image,meta\nimages/0.jpg,[1]\nimages/1.jpg," + "[" * 50_000 + "]" * 50_000 + "\nimages/2.jpg,[2]\n")
    (reject,) = _pack_rejects(path, tmp_path / "out", "--fields", "meta:json")
    assert reject == {"path": "images/1.jpg",
                      "reason": f"{path} row 2 column 'meta': JSON nested more than 200 levels deep"}


def test_duplicate_jsonl_keys_are_a_row_reject_naming_the_key(images, tmp_path):
    path = images / "rows.jsonl"
    path.write_text('{"image": "images/0.jpg", "n": 1, "m": {}}\n{"image": "images/1.jpg", "n": 1, "n": 2, "m": {}}\n'
                    '{"image": "images/2.jpg", "n": 3, "m": {"a": 1, "a": 2}}\n')
    got = _pack_rejects(path, tmp_path / "out")
    assert got == [
        {"path": "images/1.jpg", "reason": f"{path} row 2 column 'n': the key 'n' is given twice in one JSON object"},
        {"path": "images/2.jpg", "reason": f"{path} row 3 column 'm': the key 'a' is given twice in one JSON object"}]


def test_csv_integers_are_ascii_decimals(images, tmp_path):
    path = images / "rows.csv"
    path.write_text("image,n\nimages/0.jpg,7\nimages/1.jpg,1_000\nimages/2.jpg,\u0663\n", encoding="utf-8")
    got = _pack_rejects(path, tmp_path / "out", "--fields", "n:int")
    assert got == [
        {"path": "images/1.jpg", "reason": f"{path} row 2 column 'n': '1_000' is not an integer (ASCII digits only, "
                                           f"no '_')"},
        {"path": "images/2.jpg", "reason": f"{path} row 3 column 'n': '\u0663' is not an integer (ASCII digits only, "
                                           f"no '_')"}]
    # inferred: the column is text, the cells kept as written (not 1000 and 3)
    from packer.importers.manifest import read_manifest
    m = read_manifest(path)
    assert m.schema["n"].type.name == "text"
    assert [r.values["n"] for r in m.rows()] == ["7", "1_000", "\u0663"]


def test_a_row_reject_records_the_image_and_the_manifest_row(images, tmp_path):
    path = images / "rows.jsonl"
    path.write_text('{"image": "images/0.jpg", "n": 1}\n{"image": "images/1.jpg", "n": "x"}\n{"image": "", "n": 2}\n')
    got = _pack_rejects(path, tmp_path / "out", "--fields", "n:int")
    assert got == [{"path": "images/1.jpg", "reason": f"{path} row 2 column 'n': expected a number, got str 'x'"},
                   {"path": f"{path} row 3", "reason": f"{path} row 3 column 'image': no image (empty cell)"}]


def test_a_csv_with_20000_columns_is_refused_up_front(images, tmp_path):
    n = 20_000
    path = images / "wide.csv"
    path.write_text("image," + ",".join(f"c{i}" for i in range(n)) + "\n"
                    + "".join(f"images/{k}.jpg," + ",".join(map(str, range(n))) + "\n" for k in range(3)))
    # under the usual descriptor limit (the old code opened one file per column and failed mid-pack)
    prefix = [sys.executable, "-c", ("import os, resource, sys; "
              "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
              "os.execv(sys.argv[1], sys.argv[1:])")]
    r = cli(path, "-f", "mmap", "-o", tmp_path / "out", "-q", prefix=prefix)
    assert_one_line(r, 2, f"{path}: the header names 20,001 columns; a manifest may have at most 256",
                    "one array column")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ COCO
def _coco(tmp_path: Path, real_images: Path, raw: str | None = None, change=None) -> Path:
    root = tmp_path / "coco"
    (root / "val").mkdir(parents=True, exist_ok=True)
    for name in ("a.jpg", "b.jpg"):
        shutil.copyfile(real_images / "animals" / "ocelot.jpg", root / "val" / name)
    shutil.copyfile(real_images / "animals" / "ocelot.jpg", root / "outside.jpg")
    obj = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
           "annotations": [{"id": 10, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]},
                           {"id": 11, "image_id": 2, "category_id": 1, "bbox": [1, 2, 3, 4]}],
           "categories": [{"id": 1, "name": "cat"}]}
    if change:
        change(obj)
    path = root / "instances_val.json"
    path.write_text(raw(json.dumps(obj)) if raw else json.dumps(obj))
    return path


@pytest.mark.parametrize("raw, change, want", [
    (lambda t: t[:-1] + ', "info": ' + DEEP + "}", None, "info[0][0]: JSON nested more than 200 levels deep"),
    (lambda t: t.replace('"id": 11,', f'"id": {HUGE},'), None, "annotations[1].id: an integer of more than 4,300 digits"),
    (lambda t: t.replace('"id": 11,', '"id": 11, "id": 12,'), None,
     "annotations[1].id: the key 'id' is given twice in one JSON object"),
    (None, lambda o: (o["images"][1].update(id=2**70), o["annotations"][1].update(image_id=2**70)),
     "images[1]: id 1180591620717411303424 is out of range for int64"),
    (None, lambda o: o["annotations"][1].update(image_id=2**70),
     "annotation id 11: 'image_id' is 1180591620717411303424, out of range for int64"),
    (None, lambda o: o["categories"][0].update(id=2**70),
     "categories[0]: id 1180591620717411303424 is out of range for int32 (category ids must fit int32)"),
    (None, lambda o: o["annotations"][1].update(bbox=[1, 2, float("nan"), 4]),
     "annotation id 11: bbox [1, 2, nan, 4] holds NaN or infinity"),
    (None, lambda o: o["annotations"][1].update(bbox=[1, 2, 3, float("inf")]),
     "annotation id 11: bbox [1, 2, 3, inf] holds NaN or infinity"),
    (None, lambda o: o["annotations"][1].update(bbox=[1, 2, -3, 4]),
     "annotation id 11: bbox [1, 2, -3, 4] has a negative width or height"),
], ids=["deep", "huge-int", "dup-key", "image-id-past-int64", "ann-image-id-past-int64", "category-id-past-int64",
        "nan-box", "inf-box", "negative-width"])
def test_coco_problems_are_one_line_naming_the_place(tmp_path, real_images, raw, change, want):
    path = _coco(tmp_path, real_images, raw, change)
    r = cli(path, "--images", path.parent / "val", "-f", "wds", "-o", tmp_path / "out", "-q")
    assert_one_line(r, 2, f"{path}: {want}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../outside.jpg", "ABS"], ids=["dotdot", "absolute"])
def test_coco_file_name_leaving_the_images_folder_is_a_row_reject(tmp_path, real_images, name):
    name = str(tmp_path / "coco" / "outside.jpg") if name == "ABS" else name
    path = _coco(tmp_path, real_images, change=lambda o: o["images"][1].update(file_name=name))
    (reject,) = _pack_rejects(path, tmp_path / "out", "--images", path.parent / "val")
    assert reject["path"] == f"{path} row 2"
    assert reject["reason"].startswith(f"{path} row 2 column 'file_name': image id 2: file_name {name[:20]!r}"[:-1])
    assert reject["reason"].endswith(f" leaves the images folder {path.parent / 'val'} (absolute paths, '..', '.' "
                                     f"and empty parts are refused)")
    assert json.loads((tmp_path / "out" / spec.NAMES_FILE).read_text()) == "a.jpg"
