"""Importing data in the forms users already have: WebDataset shards written by webdataset's own
ShardWriter, and Hugging Face ``datasets`` image datasets (save_to_disk and Parquet), from the
bundled real photos. Each import must give what packing the same images as a folder gives:
the same validation, stored bytes, labels, rejects and summary."""

from __future__ import annotations

import errno
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REAL_IMAGES
from packer import PackError, PackOptions, pack
from readers.contract import spec

CLI = [sys.executable, "-m", "packer.cli"]


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=300)


def photos() -> list[tuple[Path, str]]:
    """(file, class) of every bundled photo, in ImageFolder order."""
    files = sorted(p for p in REAL_IMAGES.glob("*/*") if p.suffix in (".jpg", ".png"))
    return [(p, p.parent.name) for p in files]


CLASSES = sorted({c for _, c in photos()})


def stored(root: Path) -> list[bytes]:
    from readers import open_dataset

    ds = open_dataset(root, decode=False)
    try:
        return [bytes(ds.read(i)) for i in range(ds.index.num_samples)]
    finally:
        ds.close()


@pytest.fixture(scope="module")
def folder_pack(tmp_path_factory) -> Path:
    """The reference: the bundled photos packed as a folder (same order as the imports below)."""
    out = tmp_path_factory.mktemp("ref") / "lmdb"
    pack(REAL_IMAGES, out, PackOptions(format="lmdb", workers=2))
    return out


def assert_same_as_folder(out: Path, folder_pack: Path) -> None:
    a, b = spec.read_index(out), spec.read_index(folder_pack)
    assert a.num_samples == b.num_samples and a.labels.tolist() == b.labels.tolist()
    assert a.arrays["checksums"].tolist() == b.arrays["checksums"].tolist()
    assert stored(out) == stored(folder_pack)
    assert a.meta["stats"]["reencoded"] == b.meta["stats"]["reencoded"]


# ---------------------------------------------------------------------------- WebDataset shards
def write_shards(folder: Path, items, maxcount: int = 8, label: str = "cls") -> Path:
    """Shards written by webdataset's ShardWriter: key.<ext> + key.cls (or key.json)."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "shard-%04d.tar"), maxcount=maxcount, verbose=0) as sink:
        for i, (data, ext, cls) in enumerate(items):
            sample = {"__key__": f"sample{i:05d}", ext: data}
            if label == "cls" and cls is not None:
                sample["cls"] = CLASSES.index(cls)
            elif label == "json" and cls is not None:
                sample["json"] = {"label": cls, "note": "written by another tool"}
            sink.write(sample)
    return folder


def photo_items():
    return [(p.read_bytes(), p.suffix[1:], c) for p, c in photos()]


@pytest.mark.slow  # subprocess
def test_webdataset_shards_pack_like_the_folder(tmp_path, folder_pack):
    shards = write_shards(tmp_path / "shards", photo_items())
    assert len(list(shards.glob("*.tar"))) == 4
    out = tmp_path / "out"
    r = run(shards, "-f", "lmdb", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("shards: 31 samples, 6 classes") and "2 re-encoded" in r.stdout
    assert_same_as_folder(out, folder_pack)
    index = spec.read_index(out)
    assert index.classes == [str(i) for i in range(len(CLASSES))]  # integer labels: names are the indexes
    assert next(index.names()) == "shard-0000.tar/sample00000.jpg"
    assert index.meta["source"]["kind"] == "wds"


def test_json_labels_with_class_names(tmp_path, folder_pack):
    shards = write_shards(tmp_path / "shards", photo_items(), label="json")
    out = tmp_path / "out"
    pack(shards, out, PackOptions(format="lmdb", workers=1))
    assert spec.read_index(out).classes == CLASSES  # names sorted, like class folders
    assert_same_as_folder(out, folder_pack)


def test_other_image_formats_in_shards_are_normalized(tmp_path):
    with Image.open(REAL_IMAGES / "animals" / "chelsea.png") as im:
        buf = io.BytesIO()
        im.save(buf, "WEBP", lossless=True)
        expected = np.asarray(im.convert("RGB"))
    shards = write_shards(tmp_path / "shards", [(buf.getvalue(), "webp", "animals")])
    out = tmp_path / "out"
    [res] = pack(shards, out, PackOptions(format="wds", workers=1))
    assert res.changed == 1
    [data] = stored(out)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), expected)


@pytest.mark.slow  # subprocess
def test_bad_images_unlabelled_and_imageless_samples(tmp_path):
    good = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    items = [(good, "jpg", "people"), (good[: len(good) // 2], "jpg", "people"), (good, "jpg", None),
             (b"not an image", "png", "animals")]
    shards = write_shards(tmp_path / "shards", items)
    import webdataset as wds

    with wds.TarWriter(str(shards / "zz-extra.tar")) as sink:  # a sample with a label and no image
        sink.write({"__key__": "caption-only", "cls": 1, "txt": "a caption"})
    out = tmp_path / "out"
    r = run(shards, "-f", "hdf5", "-o", out, "-q")
    assert r.returncode == 3, r.stderr
    assert ": 1 sample," in r.stdout and "2 rejected" in r.stdout and "2 non-image files ignored" in r.stdout
    rejects = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert [x["path"] for x in rejects] == ["shard-0000.tar/sample00001.jpg", "shard-0000.tar/sample00003.png"]
    assert rejects[0]["reason"].startswith("truncated JPEG") and rejects[1]["reason"].startswith("not an image")


def test_shard_splits(tmp_path):
    items = photo_items()
    write_shards(tmp_path / "src" / "train", items[:20])
    write_shards(tmp_path / "src" / "val", items[20:])
    out = tmp_path / "out"
    results = pack(tmp_path / "src", out, PackOptions(format="wds", workers=1))
    assert [(r.split, r.images) for r in results] == [("train", 20), ("val", 11)]
    assert spec.read_index(out / "val").num_samples == 11


@pytest.mark.parametrize("content, message", [
    (b"this is not a tar file at all" * 40, "not a readable tar file"),
], ids=["garbage"])
@pytest.mark.slow  # subprocess
def test_unreadable_shards_are_usage_errors(tmp_path, content, message):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a.tar").write_bytes(content)
    r = run(tmp_path / "shards", "-f", "wds", "-o", tmp_path / "out")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # subprocess
def test_mixed_label_kinds_are_refused(tmp_path):
    good = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    shards = write_shards(tmp_path / "a", [(good, "jpg", "people")], label="json")
    write_shards(tmp_path / "b", [(good, "jpg", "people")], label="cls")
    shutil.copy(tmp_path / "b" / "shard-0000.tar", shards / "shard-0001.tar")
    r = run(shards, "-f", "wds", "-o", tmp_path / "out")
    assert r.returncode == 2 and "mix class indexes and class names" in r.stderr


@pytest.mark.slow  # subprocess
def test_interrupted_import_resumes_to_the_same_output(tmp_path):
    from packer.api import WRITERS, plan
    from packer.pipeline import pack_split

    shards = write_shards(tmp_path / "shards", photo_items())
    opts = PackOptions(format="wds", workers=2, shard_count=5)
    ref = tmp_path / "ref"
    pack(shards, ref, opts)
    out = tmp_path / "out"
    [(split, source, dest)] = plan(shards, out, opts)

    def failing(src, start, image_opts, workers):
        # closes the real stage (and its fork pool) itself: the pipeline only closes this wrapper,
        # and a pool left to the garbage collector may be terminated from another thread and hang
        inner = source.prepare(src, start, image_opts, workers)
        try:
            for k, outcome in enumerate(inner):
                if k == 17:
                    raise OSError(errno.EIO, "simulated")
                yield outcome
        finally:
            inner.close()

    with pytest.raises(PackError):
        pack_split(source, dest, split, opts, WRITERS["wds"], 2, prepare=failing)
    info = json.loads(run("info", out, "--json").stdout)
    assert info["state"] == "incomplete" and str(shards.resolve()) in info["resume"]
    r = run(*info["resume"].split()[1:], "-q")
    assert r.returncode == 0, r.stderr
    for name in [p.name for p in ref.iterdir() if p.name != spec.INDEX_NAME]:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name


@pytest.mark.slow  # subprocess
def test_a_folder_pack_imports_no_heavy_package():
    code = ("import sys, packer.api, packer.cli; "
            "heavy = [m for m in ('datasets', 'pyarrow', 'torch') if m in sys.modules]; print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


# ---------------------------------------------------------------------------- Hugging Face datasets
def hf_dataset(rows=None):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face 'datasets' package is not installed "
                                   "(pip install 'dataset-packer[hf]'; CI installs it through the test extra)")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                                  "caption": datasets.Value("string")})
    rows = rows if rows is not None else [(p.read_bytes(), p.name, CLASSES.index(c)) for p, c in photos()]
    data = {"image": [{"bytes": b, "path": name} for b, name, _ in rows], "label": [lab for _, _, lab in rows],
            "caption": ["x"] * len(rows)}
    return datasets, datasets.Dataset.from_dict(data, features=features)


@pytest.fixture
def quiet_datasets(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face 'datasets' package is not installed")
    datasets.disable_progress_bars()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return datasets


@pytest.mark.slow  # subprocess
def test_hf_save_to_disk_packs_like_the_folder(tmp_path, folder_pack, quiet_datasets):
    _, ds = hf_dataset()
    ds.save_to_disk(str(tmp_path / "hf"))
    out = tmp_path / "out"
    r = run(tmp_path / "hf", "-f", "lmdb", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hf: 31 samples, 6 classes")
    assert_same_as_folder(out, folder_pack)
    index = spec.read_index(out)
    assert index.classes == CLASSES and index.meta["source"]["kind"] == "hf"
    assert next(index.names()) == "0:african_elephants.jpg"


def test_hf_dataset_dict_gives_splits(tmp_path, quiet_datasets):
    datasets, ds = hf_dataset()
    datasets.DatasetDict({"train": ds.select(range(20)), "validation": ds.select(range(20, 31))}).save_to_disk(
        str(tmp_path / "hf"))
    results = pack(tmp_path / "hf", tmp_path / "out", PackOptions(format="hdf5", workers=1))
    assert [(r.split, r.images) for r in results] == [("train", 20), ("validation", 11)]


def test_hf_parquet_packs_like_the_folder(tmp_path, folder_pack, quiet_datasets):
    _, ds = hf_dataset()
    ds.to_parquet(str(tmp_path / "photos.parquet"), batch_size=7)  # several row groups
    out = tmp_path / "out"
    pack(tmp_path / "photos.parquet", out, PackOptions(format="lmdb", workers=2))
    assert_same_as_folder(out, folder_pack)


def test_hf_hub_parquet_layout_gives_splits(tmp_path, quiet_datasets):
    _, ds = hf_dataset()
    (tmp_path / "repo" / "data").mkdir(parents=True)
    ds.select(range(25)).to_parquet(str(tmp_path / "repo" / "data" / "train-00000-of-00001.parquet"))
    ds.select(range(25, 31)).to_parquet(str(tmp_path / "repo" / "data" / "test-00000-of-00001.parquet"))
    results = pack(tmp_path / "repo", tmp_path / "out", PackOptions(format="wds", workers=1))
    assert sorted((r.split, r.images) for r in results) == [("test", 6), ("train", 25)]


@pytest.mark.slow  # subprocess
def test_hf_rejects_and_unlabelled_rows(tmp_path, quiet_datasets):
    good = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    rows = [(good, "a.jpg", 3), (good[:5000], "cut.jpg", 3), (good, "unlabelled.jpg", -1), (b"junk", "b.png", 0)]
    _, ds = hf_dataset(rows)
    ds.save_to_disk(str(tmp_path / "hf"))
    out = tmp_path / "out"
    r = run(tmp_path / "hf", "-f", "wds", "-o", out, "-q", "--order", "source")
    assert r.returncode == 3, r.stderr
    assert ": 1 sample," in r.stdout and "2 rejected" in r.stdout and "1 non-image files ignored" in r.stdout
    rejects = [json.loads(line)["path"] for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert rejects == ["1:cut.jpg", "3:b.png"]


@pytest.mark.slow  # subprocess
def test_hf_without_an_image_is_refused(tmp_path, quiet_datasets):
    # without a ClassLabel a dataset is imported with typed fields (tests/test_fields_pack.py);
    # without an Image it is refused
    datasets = quiet_datasets
    ds = datasets.Dataset.from_dict({"picture": [b"x"], "label": [0]},
                                    features=datasets.Features({"picture": datasets.Value("binary"),
                                                                "label": datasets.Value("int64")}))
    ds.save_to_disk(str(tmp_path / "hf"))
    r = run(tmp_path / "hf", "-f", "wds", "-o", tmp_path / "out")
    assert r.returncode == 2 and "needs an Image column" in r.stderr and "Traceback" not in r.stderr


def test_shuffled_imports_read_in_the_written_order(tmp_path, quiet_datasets):
    """--order shuffled (wds's default) permutes the samples; each stored image is still its own."""
    _, ds = hf_dataset()
    ds.to_parquet(str(tmp_path / "photos.parquet"), batch_size=7)  # several row groups, read out of order
    ds.save_to_disk(str(tmp_path / "hf"))
    shards = write_shards(tmp_path / "shards", photo_items())
    expected = {p.name: p.read_bytes() for p, _ in photos()}
    for src in (tmp_path / "photos.parquet", tmp_path / "hf", shards):
        out = tmp_path / f"out-{src.name}"
        pack(src, out, PackOptions(format="wds", workers=2, order="shuffled", shuffle_seed=3))
        index = spec.read_index(out)
        assert index.meta["order"] == {"kind": "shuffled", "seed": 3}
        names = list(index.names())
        assert names != sorted(names, key=lambda n: int(n.split(":")[0]) if ":" in n else n)
        for name, data, label in zip(names, stored(out), index.labels.tolist()):
            original = Path(name).name if ":" not in name else name.split(":", 1)[1]
            if src == shards:  # shard-0000.tar/sample00007.jpg: the 8th photo
                p, cls = photos()[int(Path(name).stem.replace("sample", ""))]
                original, want_label = p.name, CLASSES.index(cls)
            else:
                want_label = CLASSES.index(next(c for p, c in photos() if p.name == original))
            assert label == want_label
            if original.endswith(".jpg"):
                assert data == expected[original], (src.name, name)


# ---------------------------------------------------------------------------- importer bombs (issue 23 item 11)
def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("label, message", [
    (("cls", b"500000000"), r"shard-0.tar:s1 label: class index 500,000,000 is too large: at most 1,000,000 classes"),
    (("json", b'{"label": 500000000}'), r"shard-0.tar:s1 label: class index 500,000,000 is too large"),
    (("json", b"[" * 200_000 + b"]" * 200_000), r"shard-0.tar:s1.json: not a label \(JSON nested too deeply"),
], ids=["cls-500M", "json-500M", "json-200k-deep"])
def test_label_bombs_stop_the_scan_with_one_line(tmp_path, label, message):
    """A class index of 500M built 500M class names (MemoryError); a label nested 200,000 deep raised
    RecursionError. Each is one SourceError naming the shard and sample, before anything is built."""
    from packer.errors import SourceError
    from packer.importers.wds import scan_wds

    good = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    ext, text = label
    shard = _tar(tmp_path / "shards" / "shard-0.tar", [
        ("s0.jpg", good), (f"s0.{ext}", b"3" if ext == "cls" else b'{"label": 3}'),
        ("s1.jpg", good), (f"s1.{ext}", text)])
    with pytest.raises(SourceError, match=message) as exc:
        scan_wds(shard.parent)
    assert str(shard) in str(exc.value) and "\n" not in str(exc.value)


def test_class_index_limit_grows_with_the_samples(tmp_path):
    """More classes than a million are taken when there are as many labelled samples."""
    from packer.importers import wds as W

    good = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    shard = _tar(tmp_path / "shards" / "shard-0.tar", [("s0.jpg", good), ("s0.cls", b"0"),
                                                       ("s1.jpg", good), ("s1.cls", b"2")])
    try:
        W.MIN_CLASS_LIMIT = 2
        with pytest.raises(W.SourceError, match="class index 2 is too large: at most 2 classes"):
            W.scan_wds(shard.parent)
        W.MIN_CLASS_LIMIT = 3
        assert W.scan_wds(shard.parent).classes == ["0", "1", "2"]
    finally:
        W.MIN_CLASS_LIMIT = 1_000_000


@pytest.mark.slow  # subprocess
def test_label_bomb_is_a_usage_error_without_traceback(tmp_path):
    good = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    _tar(tmp_path / "shards" / "shard-0.tar", [("s0.jpg", good), ("s0.cls", b"500000000")])
    r = run(tmp_path / "shards", "-f", "wds", "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "class index 500,000,000 is too large" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("forge, message", [
    ("label", r"row 2: label 500,000,000 is not one of the 6 classes of column 'label'"),
    ("metadata", r"cannot read this Hugging Face dataset \(RecursionError"),
], ids=["label-500M", "metadata-200k-deep"])
def test_hf_forged_parquet_is_one_line(tmp_path, quiet_datasets, forge, message):
    """A label past the ClassLabel's names (the index would name classes that do not exist), and
    Hugging Face metadata nested 200,000 deep (RecursionError): one SourceError each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.errors import SourceError
    from packer.importers.hf import scan_hf

    _, ds = hf_dataset()
    ds.select(range(4)).to_parquet(str(tmp_path / "ok.parquet"))
    table = pq.read_table(tmp_path / "ok.parquet")
    if forge == "label":
        labels = table.column("label").to_pylist()
        labels[2] = 500_000_000
        table = table.set_column(table.schema.get_field_index("label"), "label",
                                 pa.array(labels, type=table.schema.field("label").type))
    else:
        table = table.replace_schema_metadata({b"huggingface": b"[" * 200_000 + b"]" * 200_000})
    pq.write_table(table, tmp_path / "forged.parquet")
    with pytest.raises(SourceError, match=message) as exc:
        scan_hf(tmp_path / "forged.parquet")
    assert "\n" not in str(exc.value)
