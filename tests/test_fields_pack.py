"""Typed fields, pack side (issue 24): caption manifests (CSV, JSONL, Parquet) over the bundled photos and
a hand-made COCO instances.json, each packed into all four formats, the stored fields read back straight
from the files (tarfile, lmdb, h5py, numpy) and compared field-exact; bad rows as one-line rejects."""

from __future__ import annotations

import csv
import io
import gc
import json
import shutil
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from packer import PackOptions, pack
from readers.contract import spec
from readers.contract.fields import Schema

FORMATS = spec.FORMATS
PHOTOS = ["coins.png", "grace_hopper.jpg", "clock_motion.png", "text.png"]


# ------------------------------------------------------------------------------- reading what was written
def stored_fields(root: Path) -> tuple[dict, list[dict]]:
    """(index.json, one dict per sample: every field as its type decodes it), read from the files directly."""
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    schema = Schema.from_index(meta)
    n, fmt = meta["num_samples"], meta["format"]
    out: list[dict] = [{} for _ in range(n)]
    extra = schema.extra_fields
    for f in extra:
        if f.type.fixed and fmt != "hdf5":
            col = np.load(root / f"field-{f.name}.npy")
            assert col.shape == (n, *f.type.shape) and col.dtype == f.type.dtype
            for i in range(n):
                out[i][f.name] = f.type.from_row(col[i])
    labels = np.load(root / "labels.npy")
    if schema.labels_field is not None:
        for i in range(n):
            out[i]["label"] = int(labels[i])
    if fmt == "wds":
        for shard in meta["shards"]:
            with tarfile.open(root / shard["name"]) as tar:
                for m in tar:
                    key, _, suffix = m.name.partition(".")
                    f = schema.field_of_member(suffix)
                    value = f.type.from_member(tar.extractfile(m).read(), f.name)
                    i = int(key)
                    if f.name in out[i] and f.type.fixed:  # also in the index array: the same value
                        assert _same(out[i][f.name], value), (m.name, out[i][f.name], value)
                    out[i][f.name] = value
    elif fmt == "lmdb":
        import lmdb

        env = lmdb.open(str(root), readonly=True, lock=False)
        with env.begin() as txn:
            for i in range(n):
                out[i]["image"] = txn.get(spec.lmdb_key(i))
                for f in extra:
                    if not f.type.fixed:
                        out[i][f.name] = f.type.decode(txn.get(spec.lmdb_key(i) + b"/" + f.name.encode()))
        env.close()
    elif fmt == "hdf5":
        import h5py

        with h5py.File(root / "data.h5") as h5:
            off, images = h5["offsets"][...], h5["images"]
            for i in range(n):
                out[i]["image"] = images[off[i]:off[i + 1]].tobytes()
            for f in extra:
                if f.type.fixed:
                    col = h5["fields"][f.name][...]
                    assert col.dtype == f.type.dtype and col.shape == (n, *f.type.shape)
                    for i in range(n):
                        out[i][f.name] = f.type.from_row(col[i])
                else:
                    data, off = h5["fields"][f.name]["data"][...], h5["fields"][f.name]["offsets"][...]
                    for i in range(n):
                        out[i][f.name] = f.type.decode(data[off[i]:off[i + 1]].tobytes())
    else:  # mmap: pixels for the image, blobs + offsets for variable fields
        heights, widths = np.load(root / "heights.npy"), np.load(root / "widths.npy")
        for i in range(n):
            out[i]["image"] = (int(heights[i]), int(widths[i]))
        for f in extra:
            if not f.type.fixed:
                blob = (root / f"field-{f.name}.bin").read_bytes()
                off = np.load(root / f"field-{f.name}.offsets.npy")
                assert off.dtype == np.dtype("<i8") and len(off) == n + 1
                for i in range(n):
                    out[i][f.name] = f.type.decode(blob[off[i]:off[i + 1]])
    crcs = np.load(root / "field_checksums.npy")
    assert crcs.shape == (n, len(extra)) and crcs.dtype == np.dtype("<u4")
    return meta, out


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
            and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def assert_samples(root: Path, expected: list[dict], image_files: list[Path]) -> dict:
    """Every sample once, in order, each field equal in value, dtype and shape."""
    meta, got = stored_fields(root)
    assert len(got) == len(expected)
    for i, (g, e, img) in enumerate(zip(got, expected, image_files)):
        if meta["format"] == "mmap":
            from PIL import Image

            with Image.open(img) as im:
                assert g.pop("image") == (im.height, im.width)
        else:
            assert g.pop("image") == img.read_bytes(), i
        assert g.keys() == e.keys(), (i, g.keys(), e.keys())
        for name in e:
            assert _same(g[name], e[name]), (i, name, g[name], e[name])
    return meta


# ------------------------------------------------------------------------------------------- manifests
@pytest.fixture()
def photos(tmp_path, real_images) -> list[Path]:
    d = tmp_path / "imgs"
    d.mkdir()
    out = []
    for name in PHOTOS:
        out.append(d / name)
        shutil.copyfile(next(real_images.rglob(name)), out[-1])
    return out


CAPTIONS = ["a stack of coins", "Grace Hopper, in uniform", "un reloj en movimiento, ¿no?", "a horse 🐎"]


def _rows(photos: list[Path]) -> list[dict]:
    return [{"image": f"imgs/{p.name}", "caption": CAPTIONS[i], "score": 0.25 * i - 1.0, "count": 10 * i,
             "tags": list(range(i))} for i, p in enumerate(photos)]


def write_manifest(folder: Path, kind: str, rows: list[dict]) -> Path:
    if kind == "csv":
        path = folder / "rows.csv"
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(rows[0].keys())
            for r in rows:
                w.writerow([json.dumps(v) if isinstance(v, list) else v for v in r.values()])
    elif kind == "jsonl":
        path = folder / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "rows.parquet"
        table = pa.table({"image": [r["image"] for r in rows], "caption": [r["caption"] for r in rows],
                          "score": pa.array([r["score"] for r in rows], pa.float64()),
                          "count": pa.array([r["count"] for r in rows], pa.int64()),
                          "tags": pa.array([r["tags"] for r in rows], pa.list_(pa.int32()))})
        pq.write_table(table, path)
    return path


def _expected(rows: list[dict]) -> list[dict]:
    return [{"caption": r["caption"], "score": r["score"], "count": r["count"],
             "tags": np.array(r["tags"], dtype="<i4")} for r in rows]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_caption_manifest_packs_into_every_format(tmp_path, photos, kind, fmt):
    path = write_manifest(tmp_path, kind, _rows(photos))
    out = tmp_path / f"out-{fmt}"
    # tags: CSV cells are text, JSONL lists would be inferred as json: state the type (Parquet's list<int32> is)
    fields = None if kind == "parquet" else "tags:int32[*]"
    (result,) = pack(path, out, PackOptions(format=fmt, workers=1, order="source", fields=fields))
    assert result.images == len(photos) and result.rejected == 0
    meta = assert_samples(out, _expected(_rows(photos)), photos)
    assert meta["spec_version"] == 2
    assert meta["fields"] == [{"name": "image", "type": "image"}, {"name": "caption", "type": "text"},
                              {"name": "score", "type": "float"}, {"name": "count", "type": "int"},
                              {"name": "tags", "type": "int32[*]"}]
    assert meta["classes"] == [] and "class_counts" not in meta
    assert json.loads((out / "names.jsonl").read_text().splitlines()[1]) == f"imgs/{photos[1].name}"
    assert not list(out.glob("*.part")) and not list(out.glob("*.tmp"))


def test_image_folder_index_keeps_version_1_with_the_default_schema(tmp_path, real_images):
    src = tmp_path / "folder" / "cats"
    src.mkdir(parents=True)
    shutil.copyfile(next(real_images.rglob(PHOTOS[0])), src / PHOTOS[0])
    pack(tmp_path / "folder", tmp_path / "out", PackOptions(format="lmdb", workers=1))
    meta = json.loads((tmp_path / "out" / spec.INDEX_NAME).read_text())
    assert meta["spec_version"] == 1
    assert meta["fields"] == [{"name": "image", "type": "image"}, {"name": "label", "type": "int32",
                                                                  "classes": ["cats"]}]
    assert meta["class_counts"] == [1] and "image_column" not in meta["options"]
    assert not list((tmp_path / "out").glob("field*"))


def test_bad_rows_are_one_line_rejects_naming_row_and_column(tmp_path, photos):
    rows = _rows(photos)
    (tmp_path / "imgs" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 20)
    bad = [dict(rows[0], image="imgs/missing.jpg"),  # row 5: no such file
           dict(rows[1], image="imgs/broken.jpg"),  # row 6: does not decode
           dict(rows[2], boxes="[[1, 2, 3]]"),  # row 7: a box of width 3
           dict(rows[3], meta="{not json")]  # row 8: malformed JSON cell
    good = [dict(r, boxes="[[0, 0, 1, 1]]" if i % 2 else "[]", meta=json.dumps({"i": i})) for i, r in enumerate(rows)]
    bad = [dict({k: v for k, v in good[0].items()}, **b) for b in bad]
    path = write_manifest(tmp_path, "csv", good + bad)
    out = tmp_path / "out"
    (result,) = pack(path, out, PackOptions(format="wds", workers=1, order="source",
                                            fields="tags:int32[*],boxes:float32[*,4],meta:json"))
    assert result.images == 4 and result.rejected == 4
    rejects = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    reasons = [r["reason"] for r in rejects]
    assert all("\n" not in r for r in reasons)
    assert reasons[0].startswith(f"{path} row 5 column 'image': image 'imgs/missing.jpg' not found")
    assert reasons[1].startswith(f"{path} row 6 column 'image': ")
    assert reasons[2].startswith(f"{path} row 7 column 'boxes': ") and "(1, 3)" in reasons[2]
    assert reasons[3].startswith(f"{path} row 8 column 'meta': malformed JSON")
    expected = [dict(e, boxes=np.array([[0, 0, 1, 1]] if i % 2 else [], dtype="<f4").reshape(-1, 4),
                     meta={"i": i}) for i, e in enumerate(_expected(rows))]
    assert_samples(out, expected, photos)


# ------------------------------------------------------------------------------------------------ COCO
COCO_FILES = ["coins.png", "grace_hopper.jpg", "text.png"]


def coco_instances(root: Path, real_images: Path) -> Path:
    (root / "val").mkdir(parents=True)
    (root / "annotations").mkdir()
    for name in COCO_FILES:
        shutil.copyfile(next(real_images.rglob(name)), root / "val" / name)
    obj = {
        "images": [{"id": 42, "file_name": "coins.png"}, {"id": 3, "file_name": "grace_hopper.jpg"},
                   {"id": 7, "file_name": "text.png"}],  # text.png (id 7): no annotations
        "annotations": [
            {"id": 101, "image_id": 42, "category_id": 1, "bbox": [10.5, 20.25, 30, 40], "area": 1100.5,
             "iscrowd": 0, "segmentation": [[10.5, 20.25, 40.5, 20.25, 40.5, 60.25]]},
            {"id": 102, "image_id": 3, "category_id": 18, "bbox": [0, 0, 5, 5], "area": 25.0, "iscrowd": 1,
             "segmentation": {"counts": [0, 5, 20], "size": [5, 5]}},
            {"id": 103, "image_id": 42, "category_id": 18, "bbox": [1, 2, 3, 4], "iscrowd": 0,
             "segmentation": [[1, 2, 4, 2, 4, 6]]},
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 18, "name": "dog"}],
    }
    path = root / "annotations" / "instances_val.json"
    path.write_text(json.dumps(obj))
    return path


COCO_EXPECTED = [
    {"image_id": 42, "file_name": "coins.png",
     "boxes": np.array([[10.5, 20.25, 30, 40], [1, 2, 3, 4]], "<f4"), "category_ids": np.array([1, 18], "<i4"),
     "areas": np.array([1100.5, 12], "<f4"), "iscrowd": np.array([0, 0], "u1"),
     "segmentation": [[[10.5, 20.25, 40.5, 20.25, 40.5, 60.25]], [[1, 2, 4, 2, 4, 6]]]},
    {"image_id": 3, "file_name": "grace_hopper.jpg", "boxes": np.array([[0, 0, 5, 5]], "<f4"),
     "category_ids": np.array([18], "<i4"), "areas": np.array([25], "<f4"), "iscrowd": np.array([1], "u1"),
     "segmentation": [{"counts": [0, 5, 20], "size": [5, 5]}]},
    {"image_id": 7, "file_name": "text.png", "boxes": np.zeros((0, 4), "<f4"),
     "category_ids": np.zeros(0, "<i4"), "areas": np.zeros(0, "<f4"), "iscrowd": np.zeros(0, "u1"),
     "segmentation": []},
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_coco_instances_pack_into_every_format(tmp_path, real_images, fmt):
    path = coco_instances(tmp_path / "coco", real_images)
    out = tmp_path / "out"
    (result,) = pack(path, out, PackOptions(format=fmt, workers=1, order="source", images=str(tmp_path / "coco/val")))
    assert result.images == 3 and result.rejected == 0
    meta = assert_samples(out, COCO_EXPECTED, [tmp_path / "coco/val" / n for n in COCO_FILES])
    cats = next(f for f in meta["fields"] if f["name"] == "category_ids")
    assert cats == {"name": "category_ids", "type": "int32[*]", "classes": {"1": "cat", "18": "dog"}}
    assert meta["source"]["kind"] == "coco"


def test_the_official_webdataset_reader_decodes_our_field_members(tmp_path, photos):
    wds = pytest.importorskip("webdataset")
    path = write_manifest(tmp_path, "parquet", _rows(photos))
    out = tmp_path / "out"
    pack(path, out, PackOptions(format="wds", workers=1, order="source"))
    shard = sorted(out.glob("*.tar"))[0]
    with warnings.catch_warnings():  # webdataset 1.0.2 leaves its shard files to the GC (test_pack_formats.py)
        warnings.simplefilter("ignore", ResourceWarning)
        samples = list(wds.WebDataset(str(shard), shardshuffle=False).decode())
        gc.collect()
    assert [s["caption.txt"] for s in samples] == CAPTIONS
    assert [s["count.cls"] for s in samples] == [0, 10, 20, 30]
    assert [s["score.json"] for s in samples] == [-1.0, -0.75, -0.5, -0.25]
    assert all(np.array_equal(s["tags.npy"], np.arange(i, dtype="<i4")) for i, s in enumerate(samples))


def test_field_side_files_resume_to_the_checkpoint(tmp_path):
    """FieldStore cut back to the samples a checkpoint vouched for: the rows after it are dropped."""
    from packer.formats.fieldstore import FieldStore

    schema = Schema.of({"image": "image", "caption": "text", "score": "float32", "boxes": "float32[*,4]"})
    store = FieldStore(tmp_path, schema, variable=True)
    store.open(0)
    blobs = [(f"c{i}".encode(), np.float32(i).tobytes(), np.ones((i, 4), "<f4").tobytes()) for i in range(5)]
    for b in blobs[:3]:
        store.append(b)
    store.checkpoint()
    store.append(blobs[3])  # not vouched for
    store.close()
    store = FieldStore(tmp_path, schema, variable=True)
    store.open(3)
    for b in blobs[3:]:
        store.append(b)
    files = store.finalize(5)
    assert set(files) == {"field_checksums.npy", "field-score.npy", "field-caption.bin", "field-caption.offsets.npy",
                          "field-boxes.bin", "field-boxes.offsets.npy"}
    assert np.load(tmp_path / "field-score.npy").tolist() == [0, 1, 2, 3, 4]
    off = np.load(tmp_path / "field-caption.offsets.npy")
    blob = (tmp_path / "field-caption.bin").read_bytes()
    assert [blob[off[i]:off[i + 1]] for i in range(5)] == [f"c{i}".encode() for i in range(5)]
    assert np.load(tmp_path / "field-boxes.offsets.npy").tolist() == [0, 0, 16, 48, 96, 160]
    crcs = np.load(tmp_path / "field_checksums.npy")
    assert crcs[4].tolist() == [spec.checksum(b) for b in blobs[4]]
    assert not list(tmp_path.glob("*.part"))


# ----------------------------------------------------------------------------- img2dataset-style shards
def write_img2dataset_shards(folder: Path, photos: list[Path]) -> list[dict]:
    """Two shards of ``key.jpg`` + ``key.txt`` + ``key.json`` (+ ``key.boxes.npy``), as img2dataset writes
    them (its keys: shard and position digits); returns the expected fields per sample."""
    import tarfile as tf

    folder.mkdir()
    expected = []
    for s in range(2):
        with tf.open(folder / f"{s:05d}.tar", "w") as tar:
            for j, p in enumerate(photos[s * 2:s * 2 + 2]):
                i = s * 2 + j
                key = f"{s:05d}{j:04d}"
                meta = {"url": f"https://example.com/{p.name}", "width": 10 + i, "caption": CAPTIONS[i],
                        "status": "success"}
                boxes = np.arange(4 * i, dtype="<f4").reshape(i, 4) + 0.5
                buf = io.BytesIO()
                np.save(buf, boxes)
                for suffix, data in ((p.suffix.lstrip("."), p.read_bytes()), ("txt", CAPTIONS[i].encode()),
                                     ("json", json.dumps(meta).encode()), ("boxes.npy", buf.getvalue())):
                    info = tf.TarInfo(f"{key}.{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                expected.append({"txt": CAPTIONS[i], "json": meta, "boxes": boxes})
    return expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_img2dataset_shards_keep_every_member_as_a_field(tmp_path, photos, fmt):
    expected = write_img2dataset_shards(tmp_path / "shards", photos)
    out = tmp_path / "out"
    (result,) = pack(tmp_path / "shards", out, PackOptions(format=fmt, workers=1, order="source"))
    assert result.images == 4 and result.rejected == 0
    meta = assert_samples(out, expected, photos)
    assert meta["fields"] == [{"name": "image", "type": "image"}, {"name": "txt", "type": "text"},
                              {"name": "json", "type": "json"}, {"name": "boxes", "type": "float32[*,4]"}]
    assert meta["source"]["kind"] == "wds" and meta["spec_version"] == 2


def test_img2dataset_sample_missing_a_member_is_a_one_line_reject(tmp_path, photos):
    write_img2dataset_shards(tmp_path / "shards", photos)
    import tarfile as tf

    with tf.open(tmp_path / "shards" / "00002.tar", "w") as tar:  # a third shard: its sample has no .txt
        data = photos[0].read_bytes()
        info = tf.TarInfo("000020000.png")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        data = b'{"url": "x"}'
        info = tf.TarInfo("000020000.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    (result,) = pack(tmp_path / "shards", out, PackOptions(format="lmdb", workers=1))
    assert result.images == 4 and result.rejected == 1
    (reject,) = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert reject["reason"] == f"{tmp_path / 'shards' / '00002.tar'}:000020000: no member 000020000.txt (field 'txt')"


# ------------------------------------------------------------------------------ Hugging Face datasets
@pytest.mark.parametrize("fmt", FORMATS)
def test_hf_dataset_keeps_every_column_by_its_feature_type(tmp_path, photos, fmt):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face 'datasets' package is not installed")
    datasets.disable_progress_bars()
    features = datasets.Features({
        "img": datasets.Image(), "label": datasets.ClassLabel(names=["paper", "person", "thing"]),
        "caption": datasets.Value("string"), "score": datasets.Value("float32"),
        "tags": datasets.Sequence(datasets.Value("int32")),
        "boxes": datasets.Sequence(datasets.Sequence(datasets.Value("float32"), length=4)),
        "meta": {"source": datasets.Value("string")}})
    labels = [2, 1, 2, 0]
    data = {"img": [{"bytes": p.read_bytes(), "path": p.name} for p in photos], "label": labels,
            "caption": CAPTIONS, "score": [0.5 * i for i in range(4)], "tags": [list(range(i)) for i in range(4)],
            "boxes": [[[i, 0.25, 1, 2]] * i for i in range(4)], "meta": [{"source": f"s{i}"} for i in range(4)]}
    datasets.Dataset.from_dict(data, features=features).save_to_disk(str(tmp_path / "hf"))
    out = tmp_path / "out"
    (result,) = pack(tmp_path / "hf", out, PackOptions(format=fmt, workers=1, order="source"))
    assert result.images == 4
    expected = [{"label": labels[i], "caption": CAPTIONS[i], "score": 0.5 * i, "tags": np.arange(i, dtype="<i4"),
                 "boxes": np.array([[i, 0.25, 1, 2]] * i, "<f4").reshape(-1, 4), "meta": {"source": f"s{i}"}}
                for i in range(4)]
    meta = assert_samples(out, expected, photos)
    assert [(f["name"], f["type"]) for f in meta["fields"]] == [
        ("image", "image"), ("label", "int32"), ("caption", "text"), ("score", "float32"), ("tags", "int32[*]"),
        ("boxes", "float32[*,4]"), ("meta", "json")]
    assert meta["classes"] == ["paper", "person", "thing"] and meta["class_counts"] == [1, 1, 2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_interrupted_manifest_pack_resumes_field_exact(tmp_path, photos, fmt):
    from reliability_helpers import interrupt_after

    rows = [dict(r, boxes=[[i, 1, 2, 3]] * i) for i, r in enumerate(_rows(photos))]
    path = write_manifest(tmp_path, "jsonl", rows)
    out = tmp_path / "out"
    opts = dict(format=fmt, workers=1, order="source", fields="tags:int32[*],boxes:float32[*,4]",
                checkpoint_bytes=1, shard_count=1)
    with pytest.raises(KeyboardInterrupt):
        pack(path, out, PackOptions(**opts), progress=interrupt_after(3))
    assert (out / spec.STATE_NAME).exists() and not (out / spec.INDEX_NAME).exists()
    (result,) = pack(path, out, PackOptions(**opts, resume=True))
    assert result.resumed_from >= 1 and result.images == 4
    expected = [dict(e, boxes=np.array([[i, 1, 2, 3]] * i, "<f4").reshape(-1, 4))
                for i, e in enumerate(_expected(rows))]
    assert_samples(out, expected, photos)
    assert not list(out.glob("*.part"))


def test_a_huge_label_in_a_manifest_is_one_line_not_500m_class_names(tmp_path, photos):
    from packer.errors import SourceError

    rows = [{"image": f"imgs/{p.name}", "label": 500_000_000 if i == 2 else i} for i, p in enumerate(photos)]
    path = write_manifest(tmp_path, "jsonl", rows)
    with pytest.raises(SourceError, match=r"label 500,000,000 is not a class index \(0 \.\. 999,999") as exc:
        pack(path, tmp_path / "out", PackOptions(format="lmdb", workers=1, fields="label:int32"))
    assert "\n" not in str(exc.value) and not (tmp_path / "out").exists()
    rows[2]["label"] = 2
    path = write_manifest(tmp_path, "jsonl", rows)
    (result,) = pack(path, tmp_path / "out", PackOptions(format="lmdb", workers=1, fields="label:int32"))
    meta = json.loads((tmp_path / "out" / spec.INDEX_NAME).read_text())
    assert meta["classes"] == ["0", "1", "2", "3"] and meta["class_counts"] == [1, 1, 1, 1]
    assert meta["spec_version"] == 1 and meta["fields"][1] == {"name": "label", "type": "int32",
                                                               "classes": ["0", "1", "2", "3"]}
    assert np.load(tmp_path / "out" / "labels.npy").tolist() == [0, 1, 2, 3]
    assert not list((tmp_path / "out").glob("field-label*"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_readers_read_what_the_packer_wrote(tmp_path, real_images, fmt):
    """open_dataset(path, fields=...) (the read side) gives the values the files hold, every field."""
    from readers import open_dataset

    path = coco_instances(tmp_path / "coco", real_images)
    out = tmp_path / "out"
    pack(path, out, PackOptions(format=fmt, workers=1, order="source", images=str(tmp_path / "coco/val")))
    names = tuple(f["name"] for f in json.loads((out / spec.INDEX_NAME).read_text())["fields"] if f["name"] != "image")
    ds = open_dataset(out, fields=names)
    try:  # wds is read shard by shard (an IterableDataset): compared by image id
        got = [dict(zip(names, s)) for s in (ds if fmt == "wds" else (ds[i] for i in range(len(ds))))]
    finally:
        ds.close()
    assert sorted(g["image_id"] for g in got) == sorted(e["image_id"] for e in COCO_EXPECTED)
    got.sort(key=lambda g: [e["image_id"] for e in COCO_EXPECTED].index(g["image_id"]))
    for g, e in zip(got, COCO_EXPECTED):
        assert g.keys() == e.keys()
        for name in e:
            assert _same(g[name], e[name]), (name, g[name], e[name])


@pytest.mark.parametrize("fmt", ["mmap", "hdf5"])
def test_a_second_image_column_is_stored_encoded(tmp_path, photos, fmt):
    """``--fields mask:image``: a second image per sample (a segmentation mask), kept as its encoded bytes
    (mmap too, beside the first image's pixels); a missing mask is a reject naming its column."""
    rows = [{"image": f"imgs/{p.name}", "mask": f"imgs/{photos[-1 - i].name}"} for i, p in enumerate(photos)]
    rows.append({"image": f"imgs/{photos[0].name}", "mask": "imgs/no-mask.png"})
    path = write_manifest(tmp_path, "csv", rows)
    out = tmp_path / "out"
    (result,) = pack(path, out, PackOptions(format=fmt, workers=1, order="source", fields="mask:image"))
    assert result.images == 4 and result.rejected == 1
    (reject,) = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert reject["reason"].startswith(f"{path} row 5 column 'mask': image 'imgs/no-mask.png' not found")
    expected = [{"mask": photos[-1 - i].read_bytes()} for i in range(4)]
    assert_samples(out, expected, photos)
