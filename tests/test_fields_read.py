"""Reading samples with typed fields (issue 24, docs/fields.md): every format, every field type.

The datasets are packed by ``pack-dataset``'s own sources: a JSONL manifest over generated
images (:func:`pack_fields`) and a hand-made COCO instances json (:func:`pack_coco`).
"""

from __future__ import annotations

import gc
import io
import json
import shutil
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_image_folder
from packer import PackOptions, pack
from readers.contract import spec
from readers.formats.collate import FieldCollate, Sample, collate_fields
from readers.contract.fields import Schema, parse_type
from readers.loader.dataloader import collate, make_loader
from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS, DatasetFormatError
from reference import pil_rgb, stored_samples

N = 7


def _mask_png(i: int) -> bytes:
    arr = np.zeros((6, 5), dtype=np.uint8)
    arr[: i % 6 + 1] = 255
    out = io.BytesIO()
    Image.fromarray(arr, "L").save(out, "PNG")
    return out.getvalue()


#: field -> (type, value of sample i)
COLUMNS = {
    "caption": ("text", lambda i: f"photo {i}: a caf\u00e9 \u2713" * (i % 3)),  # "" for sample 0
    "boxes": ("float32[*,4]", lambda i: [[i + 0.5, i, 10.25, 20]] * (i % 3)),  # 0 boxes for sample 0
    "tags": ("int32[5]", lambda i: [int(b) for b in np.binary_repr(i, 5)]),
    "score": ("float32", lambda i: i / 4),
    "meta": ("json", lambda i: None if i == 3 else {"i": i, "src": ["x", i * 1.5]}),
    "image_id": ("int", lambda i: 10**12 + i),
    "mask": ("image", _mask_png),
}


def pack_fields(images: list[Path], labels: list[int], out: Path, fmt: str, columns: dict,
                keep_label: bool = True) -> Path:
    """``images`` (with their class ``labels``) and the fields ``columns`` (name -> ``(type, value of
    sample i)``) packed into ``fmt`` by ``pack-dataset``'s manifest source: a JSONL manifest, one row
    per sample in order, the types stated with ``fields=`` (an image column: a PNG file's path)."""
    work = out.with_name(out.name + "-src")
    work.mkdir(parents=True)
    types = (["label:int32"] if keep_label else []) + [f"{name}:{t}" for name, (t, _) in columns.items()]
    with open(work / "rows.jsonl", "w", encoding="utf-8") as f:
        for i, image in enumerate(images):
            row: dict = {"image": str(image)}
            if keep_label:
                row["label"] = labels[i]
            for name, (t, fn) in columns.items():
                value = fn(i)
                if t == "image":
                    (work / f"{name}-{i}.png").write_bytes(value)
                    value = f"{name}-{i}.png"
                row[name] = value
            f.write(json.dumps(row) + "\n")
    pack(work / "rows.jsonl", out, PackOptions(format=fmt, workers=1, order="source", fields=",".join(types),
                                               **({"shard_count": 3} if fmt == "wds" else {})))
    return out


def pack_coco(images: list[Path], out: Path, fmt: str, annotations) -> Path:
    """``images`` as a COCO instances json (``annotations(i)``: ``[(bbox, category_id), ...]`` of image
    i; categories 1 person, 3 car) packed into ``fmt`` by ``pack-dataset``'s COCO source."""
    work = out.with_name(out.name + "-src")
    (work / "images").mkdir(parents=True)
    ims, anns = [], []
    for i, image in enumerate(images):
        name = f"{i:03d}{image.suffix}"
        shutil.copyfile(image, work / "images" / name)
        with Image.open(image) as im:
            ims.append({"id": 100 + i, "file_name": name, "width": im.width, "height": im.height})
        for box, cat in annotations(i):
            anns.append({"id": len(anns) + 1, "image_id": 100 + i, "category_id": cat, "bbox": box,
                         "area": box[2] * box[3], "iscrowd": 0})
    instances = work / "instances_val.json"
    instances.write_text(json.dumps({"images": ims, "annotations": anns,
                                     "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}]}))
    pack(instances, out, PackOptions(format=fmt, workers=1, order="source", images=str(work / "images"),
                                     **({"shard_count": 3} if fmt == "wds" else {})))
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[list[Path], list[int]]:
    """N generated images (two classes) and their class indices, in ImageFolder order."""
    src = make_image_folder(tmp_path_factory.mktemp("fields-src") / "src", classes=2, per_class=4, size=(30, 26),
                            seed=3)
    files = [(p, label) for label, d in enumerate(sorted(p for p in src.iterdir() if p.is_dir()))
             for p in sorted(d.iterdir()) if p.suffix.lower() in (".jpeg", ".png")][:N]
    return [p for p, _ in files], [label for _, label in files]


@pytest.fixture(scope="module")
def rich(source, tmp_path_factory) -> dict[str, Path]:
    """format -> dataset with image, label and every kind of field."""
    root = tmp_path_factory.mktemp("fields-rich")
    return {fmt: pack_fields(*source, root / fmt, fmt, COLUMNS) for fmt in FORMATS}


@pytest.fixture(scope="module")
def captions(source, tmp_path_factory) -> dict[str, Path]:
    """format -> dataset of image + caption only (no label)."""
    root = tmp_path_factory.mktemp("fields-captions")
    return {fmt: pack_fields(*source, root / fmt, fmt, {"caption": COLUMNS["caption"]}, keep_label=False)
            for fmt in FORMATS}


def stored_images(root: Path) -> list[bytes]:
    """Each sample's stored ``image`` (``reference.stored_samples``; for wds only the ``key.jpg`` /
    ``key.png`` members, not the other fields' members), read without ``readers``."""
    meta = json.loads((root / "index.json").read_text())
    if meta["format"] != "wds":
        return stored_samples(root)
    out = {}
    for shard in meta["shards"]:
        with tarfile.open(root / shard["name"]) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                if ext in ("jpg", "png"):
                    out[int(key)] = tar.extractfile(m).read()
    return [out[i] for i in range(len(out))]


def items(ds) -> list:
    """Every item of a reader, sorted by sample index (the last entry, or ``__index__``)."""
    got = list(ds) if isinstance(ds, torch.utils.data.IterableDataset) else [ds[i] for i in range(len(ds))]
    return sorted(got, key=lambda t: t["__index__"] if isinstance(t, dict) else t[-1])


def expected(name: str, i: int):
    t, fn = COLUMNS[name]
    return parse_type(t, name).check(fn(i), name)


def assert_value(name: str, got, want) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape, (name, got)
        assert np.array_equal(got, want) and got.flags.writeable, name
    else:
        assert type(got) is type(want) and got == want, (name, got, want)


# ------------------------------------------------------------------------------------ reading
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_field_reads_back_exactly(rich, fmt):
    names = ("caption", "boxes", "tags", "score", "meta", "image_id", "label")
    ds = open_dataset(rich[fmt], fields=names, return_index=True)
    try:
        assert ds.index.meta["spec_version"] == 2 and ds.schema.names[:2] == ("image", "label")
        got = items(ds)
        assert [t[-1] for t in got] == list(range(N)), "each sample once"
        labels = np.asarray(spec.read_index(rich[fmt]).labels)
        for item in got:
            i = item[-1]
            assert isinstance(item, Sample) and len(item) == len(names) + 1
            for name, value in zip(names, item):
                assert_value(name, value, int(labels[i]) if name == "label" else expected(name, i))
        assert got[0][1].shape == (0, 4) and got[2][1].shape == (2, 4)  # variable-length boxes, none in sample 0
        assert got[3][4] is None  # a JSON null
    finally:
        ds.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_images_decoded_or_bytes_and_a_second_image_field(rich, fmt):
    stored = stored_images(rich[fmt])
    raw = open_dataset(rich[fmt], fields=("mask", "image"), decode=False, return_index=True)
    dec = open_dataset(rich[fmt], fields=("image", "mask"), return_index=True)
    try:
        for (mask_b, img_b, i), (img, mask, j) in zip(items(raw), items(dec)):
            assert i == j and mask_b == _mask_png(i) and img_b == stored[i]
            assert mask.dtype == torch.uint8 and np.array_equal(mask.permute(1, 2, 0).numpy(), pil_rgb(mask_b))
            want = np.frombuffer(img_b, np.uint8).reshape(img.shape[1], img.shape[2], 3) if fmt == "mmap" \
                else pil_rgb(img_b)
            assert np.array_equal(img.permute(1, 2, 0).numpy(), want)
    finally:
        raw.close()
        dec.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fields_none_keeps_image_label_or_gives_a_dict(rich, captions, fmt):
    old = open_dataset(rich[fmt], decode=False, return_index=True)
    cap = open_dataset(captions[fmt], decode=False, return_index=True)
    try:
        assert old.fields is None  # the (image, label) fast path, unchanged
        first = items(old)[0]
        assert type(first) is tuple and len(first) == 3 and isinstance(first[1], int)
        got = items(cap)
        assert cap.index.meta["spec_version"] == 2 and cap.fields == ("image", "caption")
        assert [sorted(d) for d in got] == [["__index__", "caption", "image"]] * N
        assert [d["caption"] for d in got] == [expected("caption", i) for i in range(N)]
        assert [d["image"] for d in got] == stored_images(captions[fmt])
    finally:
        old.close()
        cap.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_unknown_field_is_one_line_listing_the_fields(rich, fmt):
    with pytest.raises(ValueError) as info:
        open_dataset(rich[fmt], fields=("image", "captoin"))
    msg = str(info.value)
    assert "\n" not in msg and "'captoin'" in msg and "image, label, caption, boxes" in msg
    with pytest.raises(ValueError, match="sequence of field names"):
        open_dataset(rich[fmt], fields="caption")


def test_a_label_of_another_type_reads_its_own_column(source, tmp_path):
    """labels.npy is the label only for an int32 ``label`` (zeros otherwise): an int64 label is read
    from its field column, and ``fields=None`` still gives ``(image, label)``."""
    root = pack_fields(*source, tmp_path / "ds", "lmdb", {"label": ("int64", lambda i: 2**40 + i)}, keep_label=False)
    ds = open_dataset(root, decode=False, return_index=True)
    try:
        assert not spec.has_label(ds.meta) and ds.fields == ("image", "label")
        assert [t[1] for t in items(ds)] == [2**40 + i for i in range(N)]
    finally:
        ds.close()


def test_a_schema_without_label_may_leave_out_labels_npy(captions, tmp_path):
    root = Path(shutil.copytree(captions["lmdb"], tmp_path / "nolabels"))
    meta = json.loads((root / "index.json").read_text())
    del meta[spec.ARRAYS_KEY]["labels"]
    meta.pop("class_counts", None)
    (root / "index.json").write_text(json.dumps(meta))
    (root / "labels.npy").unlink()
    assert spec.required_arrays(meta) == ("checksums", "sizes")
    ds = open_dataset(root, return_index=True)
    try:
        assert "labels" not in ds.index.arrays and len(ds) == N and ds.labels.tolist() == [0] * N
        assert [d["caption"] for d in items(ds)] == [expected("caption", i) for i in range(N)]
    finally:
        ds.close()


def test_spec_version_2_reads_and_3_is_refused(rich, tmp_path):
    root = Path(shutil.copytree(rich["lmdb"], tmp_path / "v3"))
    meta = json.loads((root / "index.json").read_text())
    assert meta["spec_version"] == 2
    meta["spec_version"] = 3
    (root / "index.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetFormatError, match="spec_version 3, this dataset-packer reads version 1 or 2"):
        open_dataset(root)


def test_version_written_is_1_for_the_default_schema_and_2_otherwise():
    classes = ["cat", "dog"]
    default = {"classes": classes, "fields": Schema.default(classes).to_json()["fields"]}
    assert spec.spec_version_for({"classes": classes}) == 1
    assert spec.spec_version_for(default) == 1
    assert spec.spec_version_for(dict(default, fields=default["fields"] + [{"name": "c", "type": "text"}])) == 2
    assert spec.spec_version_for(dict(default, classes=["cat"])) == 2  # the field's classes are not the index's


# ------------------------------------------------------------------------------------ no I/O for unselected fields
class _CountingTxn:
    def __init__(self, txn, keys: list) -> None:
        self.txn, self.keys = txn, keys

    def __enter__(self):
        self.txn.__enter__()
        return self

    def __exit__(self, *exc):
        return self.txn.__exit__(*exc)

    def get(self, key):
        self.keys.append(bytes(key))
        return self.txn.get(key)


def test_lmdb_reads_only_the_selected_fields(rich, monkeypatch):
    ds = open_dataset(rich["lmdb"], fields=("caption", "score"))
    keys: list = []
    real = ds._txn
    monkeypatch.setattr(ds, "_txn", lambda: _CountingTxn(real(), keys))
    try:
        assert ds[4][0] == expected("caption", 4)
        assert keys == [spec.lmdb_key(4) + b"/caption"]  # no image, no boxes, no meta; score is a column
        keys.clear()
        ds2 = open_dataset(rich["lmdb"], fields=("tags", "label"))
        monkeypatch.setattr(ds2, "_txn", lambda: _CountingTxn(real(), keys))
        ds2[4]
        assert keys == []  # fixed fields only: the index arrays, no value of data.mdb
        ds2.close()
    finally:
        ds.close()


@pytest.mark.parametrize("fmt", ["mmap", "hdf5"])
def test_map_formats_open_only_the_selected_variable_fields(rich, fmt, monkeypatch):
    ds = open_dataset(rich[fmt], fields=("boxes",))
    seen: list = []
    real = ds._read_blobs
    monkeypatch.setattr(ds, "_read_blobs", lambda i, fs: seen.append([f.name for f in fs]) or real(i, fs))
    monkeypatch.setattr(ds, "read", lambda i: pytest.fail("the image was read"))
    try:
        assert ds[2][0].shape == (2, 4)
        assert seen == [["boxes"]]
        opened = set(ds._blobs.get()) if fmt == "mmap" else set(ds._columns.get())
        assert opened == ({"boxes"} if fmt == "mmap" else {"boxes/offsets", "boxes/data"})
    finally:
        ds.close()


def test_wds_reads_headers_and_the_selected_members_only(rich, monkeypatch):
    ds = open_dataset(rich["wds"], fields=("caption",), shuffle=False)
    reads: list = []
    real = ds._pread_of

    def counting(shard, fd):
        pread = real(shard, fd)
        return lambda pos, n: reads.append(n) or pread(pos, n)

    monkeypatch.setattr(ds, "_pread_of", counting)
    try:
        got = [c for (c,) in ds]
        assert sorted(got) == sorted(expected("caption", i) for i in range(N))
        data = [n for n in reads if n != spec.TAR_BLOCK]
        assert sorted(data) == sorted(len(expected("caption", i).encode()) for i in range(N))
    finally:
        ds.close()


# ------------------------------------------------------------------------------------ transforms
def flip(sample: dict) -> dict:
    """A torchvision-v2-style joint transform: mirror the image and its xywh boxes."""
    image, boxes = sample["image"], sample["boxes"].copy()
    width = image.shape[-1]
    boxes[:, 0] = width - boxes[:, 0] - boxes[:, 2]
    return dict(sample, image=image.flip(-1), boxes=boxes)


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_sample_transform_gets_the_whole_sample(rich, fmt):
    plain = open_dataset(rich[fmt], fields=("image", "boxes"), return_index=True)
    flipped = open_dataset(rich[fmt], fields=("image", "boxes"), return_index=True, sample_transform=flip,
                           transform=lambda img: img[:, :20, :20])
    try:
        for (img, boxes, i), (img2, boxes2, j) in zip(items(plain), items(flipped)):
            assert i == j and img2.shape[1:] == (20, 20)
            assert torch.equal(img2, img[:, :20, :20].flip(-1))  # transform first, then the sample transform
            assert np.array_equal(boxes2[:, 0], 20 - boxes[:, 0] - boxes[:, 2])
            assert np.array_equal(boxes2[:, 1:], boxes[:, 1:])
        other = open_dataset(rich[fmt], fields=("caption",), sample_transform=lambda s: len(s["caption"]))
        assert sorted(items_plain(other)) == sorted(len(expected("caption", i)) for i in range(N))
        other.close()
    finally:
        plain.close()
        flipped.close()


def items_plain(ds) -> list:
    return list(ds) if isinstance(ds, torch.utils.data.IterableDataset) else [ds[i] for i in range(len(ds))]


# ------------------------------------------------------------------------------------ collate
def test_collate_stacks_fixed_fields_and_lists_variable_ones(rich):
    ds = open_dataset(rich["lmdb"], fields=("image", "caption", "boxes", "tags", "score", "meta", "image_id"),
                      transform=lambda img: img[:, :16, :16], return_index=True)
    try:
        batch = [ds[i] for i in range(4)]
        image, caption, boxes, tags, score, meta, image_id, index = collate(batch)
        assert image.shape == (4, 3, 16, 16) and image.dtype == torch.uint8
        assert caption == [expected("caption", i) for i in range(4)]
        assert isinstance(boxes, list) and [tuple(b.shape) for b in boxes] == [(0, 4), (1, 4), (2, 4), (0, 4)]
        assert tags.shape == (4, 5) and tags.dtype == torch.int32
        assert score.dtype == torch.float64 and score.tolist() == [0, 0.25, 0.5, 0.75]
        assert meta == [expected("meta", i) for i in range(4)] and meta[3] is None
        assert image_id.dtype == torch.int64 and image_id.tolist() == [10**12 + i for i in range(4)]
        assert index.tolist() == [0, 1, 2, 3]
        padded, lengths = FieldCollate(pad=True, pad_value=-1)(batch)[2]
        assert padded.shape == (4, 2, 4) and lengths.tolist() == [0, 1, 2, 0]
        assert torch.equal(padded[2], torch.from_numpy(expected("boxes", 2)))
        assert (padded[1, 1:] == -1).all() and (padded[0] == -1).all()
        same = collate([ds[0], ds[3]])[2]  # both (0, 4): still a list, not a stacked tensor
        assert isinstance(same, list) and [tuple(b.shape) for b in same] == [(0, 4), (0, 4)]
        padded, lengths = FieldCollate(pad=True)([ds[0], ds[3]])[2]
        assert padded.shape == (2, 0, 4) and lengths.tolist() == [0, 0]
    finally:
        ds.close()
    raw = open_dataset(rich["lmdb"], fields=("image", "caption"), decode=False)
    try:
        images, _ = collate([raw[i] for i in range(3)])
        assert [images.get(k) for k in range(3)] == stored_images(rich["lmdb"])[:3]  # a ByteBatch
    finally:
        raw.close()


def test_collate_of_dict_samples():
    batch = [{"caption": "a", "n": 1, "x": np.ones(3, np.float32)}, {"caption": "b", "n": 2, "x": np.zeros(3, np.float32)}]
    out = collate_fields(batch)
    assert out["caption"] == ["a", "b"] and out["n"].tolist() == [1, 2] and out["x"].shape == (2, 3)


# ------------------------------------------------------------------------------------ loader: shuffle, resume
@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_loader_over_captions_resumes_exactly_with_two_workers(captions, fmt):
    def loader():
        ds = open_dataset(captions[fmt], fields=("caption", "image"), decode=False, return_index=True)
        return make_loader(ds, batch_size=2, num_workers=2, seed=5, persistent_workers=False)

    ref = loader()
    epoch = [b[2].tolist() for b in ref]
    first = loader()
    got = []
    for b in first:
        assert b[0] == [expected("caption", i) for i in b[2].tolist()]
        got.append(b[2].tolist())
        if len(got) == 2:
            break
    state = first.state_dict()
    del first
    again = loader()
    again.load_state_dict(state)
    rest = [b[2].tolist() for b in again]
    assert got + rest == epoch
    flat = [i for b in got + rest for i in b]
    assert sorted(flat) == list(range(N)), "each sample once"


@pytest.mark.parametrize("fmt", FORMATS)
def test_simulated_ddp_ranks_split_a_caption_dataset(captions, fmt, monkeypatch):
    """Two ranks (readers.contract.env.worker_env_hook, as tests/test_resume_loader.py simulates them) read
    disjoint halves that together hold every sample, padded to the same length."""
    import readers.contract.env
    from readers.contract.env import WorkerEnv

    seen = []
    for rank in range(2):
        monkeypatch.setattr(readers.contract.env, "worker_env_hook", lambda rank=rank: WorkerEnv(rank, 2, 0, 1))
        ds = open_dataset(captions[fmt], fields=("caption",), return_index=True)
        loader = make_loader(ds, batch_size=2, num_workers=0, seed=3)
        got = [(c, i) for caps, idx in loader for c, i in zip(caps, idx.tolist())]
        assert all(c == expected("caption", i) for c, i in got)
        seen.append([i for _, i in got])
        del loader
        ds.close()
    assert len(seen[0]) == len(seen[1]) == -(-N // 2)  # padded: ceil(N / 2) each
    assert set(seen[0]) | set(seen[1]) == set(range(N))
    assert len(set(seen[0]) & set(seen[1])) <= 1  # at most the one padding repeat


# ------------------------------------------------------------------------------------ the official webdataset reader
def test_official_webdataset_reader_decodes_our_members(rich):
    wds = pytest.importorskip("webdataset", reason="the webdataset package is not installed")
    index = spec.read_index(rich["wds"])
    urls = [str(rich["wds"] / s["name"]) for s in index.meta["shards"]]
    with warnings.catch_warnings():  # webdataset 1.0.2 leaves its shard files to the GC (test_fields.py)
        warnings.simplefilter("ignore", ResourceWarning)
        got = {int(s["__key__"]): s for s in wds.WebDataset(urls, shardshuffle=False).decode()}
        gc.collect()
    assert sorted(got) == list(range(N))
    stored = stored_images(rich["wds"])
    for i, s in got.items():
        assert s["jpg" if "jpg" in s else "png"] == stored[i]
        assert s["cls"] == int(index.labels[i])
        assert s["caption.txt"] == expected("caption", i)
        assert_value("boxes", s["boxes.npy"], expected("boxes", i))
        assert_value("tags", s["tags.npy"], expected("tags", i))
        assert s["score.json"] == expected("score", i) and s["image_id.cls"] == 10**12 + i
        assert s["meta.json"] == (b"null" if i == 3 else expected("meta", i))  # webdataset's null quirk
        assert s["mask.png"] == _mask_png(i)


# ------------------------------------------------------------------------------------ docs/fields.md recipes
DOC = Path(__file__).resolve().parent.parent / "docs" / "fields.md"
CAPTIONS = ["a dog on a beach", "two cats asleep", "a red car", "a bowl of soup", "snow on a roof",
            "a city at night", "an old bridge"]
RECIPES = {  # heading -> (format, fields added)
    "Image-caption pairs, CLIP-style": ("wds", {"caption": ("text", lambda i: CAPTIONS[i])}),
    "COCO detection: variable-length boxes": ("lmdb", None),  # a COCO instances json (pack_coco)
    "Multi-label tags": ("hdf5", {"tags": ("uint8[6]", lambda i: [(i >> k) & 1 for k in range(6)])}),
}


def recipe_blocks(heading: str) -> tuple[str, str]:
    """The python block and the output block under the docs/fields.md heading ``### heading``."""
    text = DOC.read_text(encoding="utf-8").split(f"\n### {heading}\n", 1)[1].split("\n## ", 1)[0].split("\n### ")[0]
    code = text.split("```python\n", 1)[1].split("```\n", 1)[0]
    output = text.split("Output:\n\n```text\n", 1)[1].split("```\n", 1)[0]
    return code, output


@pytest.mark.slow  # runs each recipe in a fresh interpreter, as a user would
@pytest.mark.parametrize("heading", RECIPES)
def test_recipes_run_as_shown(source, tmp_path, heading):
    import subprocess
    import sys

    fmt, columns = RECIPES[heading]
    if columns is None:
        root = pack_coco(source[0], tmp_path / "ds", fmt,
                         lambda i: [([2.0 * k, 1.0, 10.5, 8.0], [1, 3][k]) for k in range(i % 3)])
    else:
        root = pack_fields(*source, tmp_path / "ds", fmt, columns, keep_label=False)
    code, shown = recipe_blocks(heading)
    script = tmp_path / "recipe.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == shown, f"docs/fields.md '{heading}' shows other output; it prints:\n{run.stdout}"


# ------------------------------------------------------------------------------------ damaged field data
def test_damaged_field_data_is_one_line_naming_file_sample_and_field(rich, tmp_path):
    root = Path(shutil.copytree(rich["mmap"], tmp_path / "mmap"))
    offsets = np.load(root / "field-caption.offsets.npy")
    offsets[-1] += 1000  # the last caption runs past the end of field-caption.bin
    np.save(root / "field-caption.offsets.npy", offsets)
    ds = open_dataset(root, fields=("caption",))
    try:
        with pytest.raises(DatasetFormatError) as info:
            ds[0]
        msg = str(info.value)
        assert "\n" not in msg and "field-caption.offsets.npy" in msg and f"sample {N - 1}" in msg
    finally:
        ds.close()
    root = Path(shutil.copytree(rich["mmap"], tmp_path / "mmap2"))
    np.save(root / "field-tags.npy", np.zeros((N, 4), np.int32))  # the schema says int32[5]
    ds = open_dataset(root, fields=("tags",))
    try:
        with pytest.raises(DatasetFormatError, match=r"field-tags.npy: field 'tags' array holds <i4 \(7, 4\); "
                                                     r"the schema says int32\[5\]"):
            ds[0]
    finally:
        ds.close()
    root = Path(shutil.copytree(rich["mmap"], tmp_path / "mmap3"))
    (root / "field-meta.bin").write_bytes(b"{" * len((root / "field-meta.bin").read_bytes()))
    ds = open_dataset(root, fields=("meta",))
    try:
        with pytest.raises(DatasetFormatError, match=r"field-meta.* sample 1 field 'meta': |sample 1 field 'meta'"):
            ds[1]
    finally:
        ds.close()


def test_a_wds_sample_without_the_fields_member_names_it(rich, tmp_path):
    root = Path(shutil.copytree(rich["wds"], tmp_path / "wds"))
    ds = open_dataset(root, fields=("caption",), shuffle=False)
    try:
        ds.schema = Schema.of({"image": "image", "label": "int32", "caption": "text", "other": "text"})
        ds.__dict__.pop("_suffixes", None)
        ds._select(("other",))
        with pytest.raises(DatasetFormatError, match=r"-000000.tar: sample 0 has no member for field 'other'"):
            next(iter(ds))
    finally:
        ds.close()
