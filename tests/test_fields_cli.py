"""Typed fields through ``pack-dataset`` (issue 24): manifest and COCO sources on the command line, usage
errors as one line with exit 2, rejects with exit 3, ``verify`` finding a flipped byte in a text field
and in a boxes array in every format, ``info`` printing the schema, ``convert`` keeping every field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packer import PackOptions, pack
from packer.cli import main
from packer.tools.convert import convert
from readers.contract import spec
from test_fields_pack import (COCO_EXPECTED, _rows, _same, coco_instances, photos,  # noqa: F401
                              stored_fields, write_manifest)

FORMATS = spec.FORMATS
pytest_plugins = ["servers"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_fields_type_is_a_one_line_usage_error(tmp_path, capsys, photos):
    path = write_manifest(tmp_path, "csv", _rows(photos))
    code, out, err = _run(capsys, path, "-f", "wds", "-o", tmp_path / "out", "-q", "--fields", "score:flaot")
    assert code == 2
    assert err.count("\n") == 1 and "unknown field type 'flaot' for field 'score'" in err and str(path) in err
    assert not (tmp_path / "out").exists()


def test_coco_annotation_of_no_image_is_a_one_line_usage_error(tmp_path, capsys, real_images):
    path = coco_instances(tmp_path / "coco", real_images)
    obj = json.loads(path.read_text())
    obj["annotations"][1]["image_id"] = 999
    path.write_text(json.dumps(obj))
    code, out, err = _run(capsys, path, "--images", tmp_path / "coco/val", "-f", "lmdb", "-o", tmp_path / "out", "-q")
    assert code == 2
    assert err.count("\n") == 1 and str(path) in err and "annotation id 102: image_id 999 matches no image" in err
    assert not (tmp_path / "out").exists()


def test_coco_and_manifest_on_the_command_line(tmp_path, capsys, real_images, photos):
    path = coco_instances(tmp_path / "coco", real_images)
    code, out, err = _run(capsys, path, "--images", tmp_path / "coco/val", "-f", "hdf5", "-o", tmp_path / "coco-h5",
                          "-q", "--order", "source")
    assert code == 0, err
    assert out.startswith("val: 3 samples, ") and "classes" not in out  # COCO: no classes to count
    _, got = stored_fields(tmp_path / "coco-h5")
    assert all(_same(g["boxes"], e["boxes"]) for g, e in zip(got, COCO_EXPECTED))
    rows = _rows(photos) + [dict(_rows(photos)[0], image="imgs/nowhere.jpg")]
    manifest = write_manifest(tmp_path, "jsonl", rows)
    code, out, err = _run(capsys, manifest, "-f", "mmap", "-o", tmp_path / "m", "-q", "--fields", "tags:int32[*]")
    assert code == 3, err  # done, one row rejected
    (reject,) = [json.loads(line) for line in (tmp_path / "m" / spec.REJECTS_NAME).read_text().splitlines()]
    assert reject["reason"].startswith(f"{manifest} row 5 column 'image': image 'imgs/nowhere.jpg' not found")
    code, out, err = _run(capsys, "info", tmp_path / "m")
    assert code == 0, err
    assert "  fields       5" in out
    assert "    caption  text" in out and "    tags     int32[*]" in out and "0..3 rows" in out
    assert "values 0..30" in out  # count
    assert "classes" not in out  # no label field


def _flip(path: Path, needle: bytes, at: int = 0) -> None:
    """Flip a bit of ``needle`` where it lies in ``path`` (every copy: LMDB's freed pages keep old ones)."""
    data = bytearray(path.read_bytes())
    pos = data.find(needle)
    assert pos >= 0, (path, needle)
    while pos >= 0:
        data[pos + at] ^= 0x20
        pos = data.find(needle, pos + 1)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_finds_a_flipped_byte_in_a_text_field_and_in_a_boxes_array(tmp_path, capsys, photos, fmt):
    rows = [dict(r, boxes=json.dumps([[i + 0.125, 2.5, 3.75, 1000.0 + i]] * (i + 1)))
            for i, r in enumerate(_rows(photos))]
    path = write_manifest(tmp_path, "csv", rows)
    out = tmp_path / "out"
    pack(path, out, PackOptions(format=fmt, workers=1, order="source", fields="tags:int32[*],boxes:float32[*,4]"))
    code, text, err = _run(capsys, "verify", out, "-q")
    assert code == 0, text + err
    files = {"wds": next(out.glob("*.tar"), None), "lmdb": out / "data.mdb", "hdf5": out / "data.h5"}
    caption_file = files.get(fmt, out / "field-caption.bin")
    boxes_file = files.get(fmt, out / "field-boxes.bin")
    _flip(caption_file, "Grace Hopper, in uniform".encode())  # sample 1
    _flip(boxes_file, np.array([[2.125, 2.5, 3.75, 1002.0]] * 3, "<f4").tobytes(), at=17)  # sample 2
    code, text, err = _run(capsys, "verify", out, "-q")
    assert code == 1
    damaged = [line for line in text.splitlines() if line.startswith("DAMAGED")]
    assert any(f"sample 1 field 'caption': checksum differs from the index" in line for line in damaged), damaged
    assert any(f"sample 2 field 'boxes': checksum differs from the index" in line for line in damaged), damaged
    assert not any("sample 0 " in line or "sample 3 " in line for line in damaged), damaged


@pytest.fixture(scope="module")
def coco_packed(tmp_path_factory, real_images):
    root = tmp_path_factory.mktemp("coco")
    path = coco_instances(root / "coco", real_images)
    out = {}
    for fmt in FORMATS:
        out[fmt] = root / fmt
        pack(path, out[fmt], PackOptions(format=fmt, workers=1, order="source", images=str(root / "coco/val")))
    return out


@pytest.mark.parametrize("src, dst", [(a, b) for a in FORMATS for b in FORMATS if a != b],
                         ids=[f"{a}-{b}" for a in FORMATS for b in FORMATS if a != b])
def test_convert_between_every_pair_keeps_every_field(tmp_path, coco_packed, src, dst):
    out = tmp_path / "out"
    (result,) = convert(coco_packed[src], out, PackOptions(format=dst, workers=1))
    assert result.images == 3
    meta_in, before = stored_fields(coco_packed[src])
    meta_out, after = stored_fields(out)
    assert meta_out["fields"] == meta_in["fields"] and meta_out["spec_version"] == 2
    for b, a, e in zip(before, after, COCO_EXPECTED):
        image_b, image_a = b.pop("image"), a.pop("image")
        if "mmap" not in (src, dst):
            assert image_a == image_b
        assert a.keys() == b.keys() == e.keys()
        for name in e:
            assert _same(a[name], e[name]), (name, a[name], e[name])
    code = main(["verify", str(out), "-q"])
    assert code == 0


def test_a_manifest_whose_every_row_is_rejected_leaves_only_the_rejects(tmp_path, capsys, photos):
    rows = [dict(r, image="imgs/none.jpg") for r in _rows(photos)]
    path = write_manifest(tmp_path, "jsonl", rows)
    code, out, err = _run(capsys, path, "-f", "mmap", "-o", tmp_path / "out", "-q", "--fields", "tags:int32[*]")
    assert code == 1 and "every image" in err and err.count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [spec.REJECTS_NAME]


@pytest.mark.slow  # nginx
def test_manifest_images_by_http_url(tmp_path, photos, http_prefix):
    import shutil

    folder, url = http_prefix
    for p in photos:
        shutil.copyfile(p, folder / p.name)
    rows = [dict(r, image=f"{url}/{p.name}") for r, p in zip(_rows(photos), photos)]
    rows.append(dict(rows[0], image=f"{url}/missing.jpg"))
    path = write_manifest(tmp_path, "jsonl", rows)
    out = tmp_path / "out"
    (result,) = pack(path, out, PackOptions(format="lmdb", workers=1, fields="tags:int32[*]"))
    assert result.images == 4 and result.rejected == 1
    (reject,) = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert reject["reason"] == f"{path} row 5 column 'image': image {url}/missing.jpg not found"
    _, got = stored_fields(out)
    assert [g["image"] for g in got] == [p.read_bytes() for p in photos]
    assert [g["caption"] for g in got] == [r["caption"] for r in rows[:4]]
    assert json.loads((out / spec.NAMES_FILE).read_text().splitlines()[0]) == f"{url}/{photos[0].name}"


def test_a_manifest_without_o_packs_beside_it_named_without_its_suffix(tmp_path, capsys, photos):
    path = write_manifest(tmp_path, "csv", _rows(photos))
    code, out, err = _run(capsys, path, "-f", "lmdb", "-q", "--fields", "tags:int32[*]")
    assert code == 0, err
    assert out.rstrip().endswith(f"-> {tmp_path / 'rows-lmdb'}")
