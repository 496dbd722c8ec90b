"""packer/importers/coco.py: a hand-made COCO instances.json over the bundled photos (one image with zero
boxes), grouping checked against a plain-Python oracle, and each bad input as a one-line error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.importers.coco import coco_schema, is_coco_instances, read_coco
from packer.errors import SourceError
from packer.importers.manifest import Row, RowReject

FILES = ["ocelot.jpg", "chelsea.png", "china.jpg"]

CATEGORIES = [{"id": 1, "name": "cat", "supercategory": "animal"}, {"id": 18, "name": "dog", "supercategory": "animal"},
              {"id": 90, "name": "roof", "supercategory": "building"}]


def _instances() -> dict:
    """Three images (ids out of order), annotations interleaved; china.jpg (id 7) has none."""
    return json.loads(json.dumps({  # a fresh copy each time: tests change it
        "info": {"description": "hand-made"},
        "images": [{"id": 42, "file_name": "ocelot.jpg", "height": 10, "width": 10},
                   {"id": 3, "file_name": "chelsea.png", "height": 10, "width": 10},
                   {"id": 7, "file_name": "china.jpg", "height": 10, "width": 10}],
        "annotations": [
            {"id": 101, "image_id": 42, "category_id": 1, "bbox": [10.5, 20.25, 30, 40], "area": 1100.5, "iscrowd": 0,
             "segmentation": [[10.5, 20.25, 40.5, 20.25, 40.5, 60.25]]},
            {"id": 102, "image_id": 3, "category_id": 18, "bbox": [0, 0, 5, 5], "area": 25.0, "iscrowd": 1,
             "segmentation": {"counts": [0, 5, 20], "size": [5, 5]}},
            {"id": 103, "image_id": 42, "category_id": 90, "bbox": [1, 2, 3, 4], "iscrowd": 0,
             "segmentation": [[1, 2, 4, 2, 4, 6]]},  # no area: width * height
            {"id": 104, "image_id": 42, "category_id": 18, "bbox": [5, 6, 7, 8], "area": 50.0,
             "segmentation": []},  # no iscrowd: 0
        ],
        "categories": CATEGORIES,
    }))


@pytest.fixture()
def coco(tmp_path, real_images) -> Path:
    """tmp/coco/{annotations/instances_val.json, val/<photos>}; returns tmp/coco."""
    root = tmp_path / "coco"
    (root / "val").mkdir(parents=True)
    (root / "annotations").mkdir()
    for name in FILES:
        src = next(real_images.rglob(name))
        shutil.copyfile(src, root / "val" / name)
    _write(root, _instances())
    return root


def _write(root: Path, obj: dict) -> Path:
    path = root / "annotations" / "instances_val.json"
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_one_record_per_image(coco):
    c = read_coco(coco / "annotations" / "instances_val.json", coco / "val")
    assert (c.num_images, c.num_annotations) == (3, 4)
    assert [(f.name, f.type.name) for f in c.schema] == [
        ("image", "image"), ("image_id", "int"), ("file_name", "text"), ("boxes", "float32[*,4]"),
        ("category_ids", "int32[*]"), ("areas", "float32[*]"), ("iscrowd", "uint8[*]"), ("segmentation", "json")]
    assert c.schema["category_ids"].classes == {1: "cat", 18: "dog", 90: "roof"}
    assert c.categories == CATEGORIES
    rows = list(c.rows())
    assert all(isinstance(r, Row) for r in rows) and [r.row for r in rows] == [1, 2, 3]
    assert [r.image for r in rows] == [str(coco / "val" / n) for n in FILES]
    ocelot, chelsea, china = (r.values for r in rows)

    assert ocelot["image_id"] == 42 and ocelot["file_name"] == "ocelot.jpg"
    assert ocelot["boxes"].dtype == np.float32 and ocelot["boxes"].shape == (3, 4)
    assert ocelot["boxes"].tolist() == [[10.5, 20.25, 30, 40], [1, 2, 3, 4], [5, 6, 7, 8]]  # file order kept
    assert ocelot["category_ids"].dtype == np.int32 and ocelot["category_ids"].tolist() == [1, 90, 18]
    assert ocelot["areas"].dtype == np.float32 and ocelot["areas"].tolist() == [1100.5, 12.0, 50.0]
    assert ocelot["iscrowd"].dtype == np.uint8 and ocelot["iscrowd"].tolist() == [0, 0, 0]
    assert ocelot["segmentation"] == [[[10.5, 20.25, 40.5, 20.25, 40.5, 60.25]], [[1, 2, 4, 2, 4, 6]], []]

    assert chelsea["boxes"].tolist() == [[0, 0, 5, 5]] and chelsea["iscrowd"].tolist() == [1]
    assert chelsea["segmentation"] == [{"counts": [0, 5, 20], "size": [5, 5]}]

    # the image with zero annotations: empty arrays of the right shape and dtype
    assert china["image_id"] == 7
    for name, shape, dtype in [("boxes", (0, 4), np.float32), ("category_ids", (0,), np.int32),
                               ("areas", (0,), np.float32), ("iscrowd", (0,), np.uint8)]:
        assert china[name].shape == shape and china[name].dtype == dtype
    assert china["segmentation"] == []


def test_records_fit_the_schema_and_encode(coco):
    c = read_coco(coco / "annotations" / "instances_val.json", coco / "val")
    for r in c.rows():
        sample = dict(r.values, image=Path(r.image).read_bytes())
        checked = c.schema.check_sample(sample, f"row {r.row}")
        for f in c.schema:
            back = f.type.decode(f.type.encode(checked[f.name], f.name))
            if isinstance(back, np.ndarray):
                assert back.dtype == checked[f.name].dtype and np.array_equal(back, checked[f.name])
            else:
                assert back == checked[f.name]


def test_default_images_folder_is_cocos_layout(coco):
    c = read_coco(coco / "annotations" / "instances_val.json")
    assert c.images_dir == coco / "val"
    assert is_coco_instances("instances_train2017.json") and not is_coco_instances("captions_train2017.json")


def test_grouping_matches_a_plain_python_oracle(coco):
    """Many images and annotations in random order: each image gets exactly its own, in file order."""
    rng = np.random.default_rng(0)
    images = [{"id": int(i), "file_name": FILES[k % 3]} for k, i in enumerate(rng.permutation(200) * 3 + 5)]
    anns = []
    for a in range(1500):
        im = images[int(rng.integers(0, 150))]  # images 150..199 have none
        anns.append({"id": 10_000 + a, "image_id": im["id"], "category_id": int(rng.choice([1, 18, 90])),
                     "bbox": rng.integers(0, 100, 4).tolist(), "area": float(a), "iscrowd": int(a % 7 == 0),
                     "segmentation": [[a, a]]})
    _write(coco, {"images": images, "annotations": anns, "categories": CATEGORIES})
    c = read_coco(coco / "annotations" / "instances_val.json", coco / "val")
    rows = list(c.rows())
    assert len(rows) == 200
    for im, r in zip(images, rows):
        mine = [a for a in anns if a["image_id"] == im["id"]]
        v = r.values
        assert v["image_id"] == im["id"]
        assert v["boxes"].shape == (len(mine), 4) and v["boxes"].tolist() == [a["bbox"] for a in mine]
        assert v["category_ids"].tolist() == [a["category_id"] for a in mine]
        assert v["areas"].tolist() == [a["area"] for a in mine]
        assert v["iscrowd"].tolist() == [a["iscrowd"] for a in mine]
        assert v["segmentation"] == [a["segmentation"] for a in mine]


def test_missing_image_file_is_a_row_reject(coco):
    (coco / "val" / "chelsea.png").unlink()
    path = coco / "annotations" / "instances_val.json"
    rows = list(read_coco(path, coco / "val").rows())
    assert isinstance(rows[0], Row) and isinstance(rows[2], Row)
    assert isinstance(rows[1], RowReject)
    assert str(rows[1]) == f"{path} row 2 column 'file_name': image id 3: {coco / 'val' / 'chelsea.png'} not found"


def _broken(coco, change) -> str:
    obj = _instances()
    change(obj)
    path = _write(coco, obj)
    with pytest.raises(SourceError) as ei:
        read_coco(path, coco / "val")
    msg = str(ei.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg and ei.value.exit_code == 2
    return msg[len(f"{path}: "):]


def test_annotation_of_no_image(coco):
    def change(obj):
        obj["annotations"][2]["image_id"] = 999
    assert _broken(coco, change) == "annotation id 103: image_id 999 matches no image"


@pytest.mark.parametrize("bbox, what", [
    ([1, 2, 3], "[1, 2, 3] (expected [x, y, width, height])"),
    ([1, 2, 3, 4, 5], "[1, 2, 3, 4, 5] (expected [x, y, width, height])"),
    (["1", 2, 3, 4], "['1', 2, 3, 4] (expected [x, y, width, height])"),
    (None, "missing"),
])
def test_box_not_of_width_4(coco, bbox, what):
    def change(obj):
        if bbox is None:
            del obj["annotations"][1]["bbox"]
        else:
            obj["annotations"][1]["bbox"] = bbox
    assert _broken(coco, change) == f"annotation id 102: bbox is {what}"


def test_every_box_of_width_5_is_caught(coco):
    def change(obj):
        for a in obj["annotations"]:
            a["bbox"] = a["bbox"] + [0]
    assert _broken(coco, change).startswith("annotation id 101: bbox is [10.5, 20.25, 30, 40, 0]")


@pytest.mark.parametrize("change, want", [
    (lambda o: o["annotations"][0].update(category_id=5), "annotation id 101: category_id 5 matches no category"),
    (lambda o: o["annotations"][3].update(iscrowd=2), "annotation id 104: iscrowd is 2, expected 0 or 1"),
    (lambda o: o["annotations"][0].pop("image_id"), "annotation id 101: 'image_id' is missing; expected an integer"),
    (lambda o: o["annotations"][1].update(area="big"), "annotation id 102: 'area' is 'big'; expected a number"),
    (lambda o: o["annotations"][2].update(category_id="18"), "annotation id 103: 'category_id' is '18'; expected an "
                                                             "integer"),
    (lambda o: o["annotations"][2].update(image_id=42.0), "annotation id 103: 'image_id' is 42.0; expected an integer"),
    (lambda o: o["annotations"][3].update(iscrowd=None),
     "annotation id 104: 'iscrowd' is missing; expected an integer"),
    (lambda o: o["images"].append({"id": 3, "file_name": "x.jpg"}), "image id 3 is given more than once in 'images'"),
    (lambda o: o["images"][0].pop("id"), "images[0] has no integer 'id'"),
    (lambda o: o["categories"].append({"id": 1, "name": "again"}), "category ids repeat"),
    (lambda o: o["categories"].append({"name": "no id"}), "categories[3] needs an integer 'id' and a string 'name'"),
    (lambda o: o.pop("images"), "not a COCO instances json (no 'images' list)"),
], ids=["category", "iscrowd", "no-image-id", "area", "str-category", "float-image-id", "null-iscrowd",
        "dup-image", "image-no-id", "dup-category", "category-no-id", "no-images"])
def test_inconsistent_json(coco, change, want):
    assert _broken(coco, change) == want


def test_unreadable_files(coco, tmp_path):
    bad = tmp_path / "instances_x.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(SourceError, match="not a COCO json"):
        read_coco(bad, coco / "val")
    with pytest.raises(SourceError, match="no such COCO annotations file"):
        read_coco(tmp_path / "nope.json", coco / "val")
    with pytest.raises(SourceError, match="--images must be the folder of the COCO images"):
        read_coco(coco / "annotations" / "instances_val.json", tmp_path / "nope")
    plain = tmp_path / "boxes.json"
    plain.write_text(json.dumps(_instances()), encoding="utf-8")
    with pytest.raises(SourceError, match="where are the images"):
        read_coco(plain)


def test_schema_without_annotations():
    s = coco_schema()
    assert s["category_ids"].classes == {} and s.names[0] == "image"
