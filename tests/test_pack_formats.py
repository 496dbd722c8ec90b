"""Every format, on the bundled real photos and the generated folder, read back with
INDEPENDENT readers -- the official ``webdataset`` library and ``tarfile`` for wds, the
``lmdb`` binding (and ``mdb_stat``) for lmdb, ``h5py`` (and ``h5dump``) for hdf5, plain
numpy for mmap -- never with this project's ``readers`` package. Index files are read with
``json``/``numpy`` directly too.

Byte-stability (``workers=1`` vs ``workers=2``, see ``test_workers_do_not_change_the_output``):

* every file (wds shards, data.mdb, data.h5, images.npy, every ``*.npy``, ``names.jsonl``,
  ``index.json``) is byte-identical. ``lock.mdb`` is LMDB's runtime lock table, not data.
  ``data.mdb`` is byte-stable because the writer opens it with ``meminit=True`` (unused page
  tails zeroed instead of holding stale heap memory); its content is compared too.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from conftest import make_image_folder
from packer import PackOptions, pack
from packer.formats.wds import WdsWriter, tar_header
from packer.prepare.images import Prepared
from packer.output import SHARD_LOG_NAME
from readers.contract import spec
from readers.decode.geometry import resize_center_crop
from reference import expected_rgb, imagefolder_reference, lmdb_items, needs_change

FORMATS = spec.FORMATS
IMAGE_FORMATS = {"jpg": "JPEG", "png": "PNG"}


# ---------------------------------------------------------------- independent readers
def load_index(ds: Path) -> tuple[dict, dict[str, np.ndarray], list[str]]:
    """index.json, every <name>.npy beside it, names.jsonl -- with json and numpy only."""
    meta = json.loads((ds / "index.json").read_text(encoding="utf-8"))
    arrays = {p.stem: np.load(p, allow_pickle=False) for p in ds.glob("*.npy") if p.name != "images.npy"}
    names = [json.loads(line) for line in (ds / "names.jsonl").read_text(encoding="utf-8").splitlines()]
    return meta, arrays, names


def written_order(meta: dict, reference: list) -> list:
    """``reference`` (ImageFolder order) in the order index.json says the pack wrote it."""
    order = meta["order"]
    assert order["kind"] == spec.DEFAULT_ORDER[meta["format"]] == meta["options"]["order"]
    if order["kind"] == "source":
        return reference
    return [reference[k] for k in np.random.default_rng([order["seed"], 0x5EED_0D4E]).permutation(len(reference))]


def sniff(data: bytes) -> str:
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    raise AssertionError(f"stored bytes are neither JPEG nor PNG: {data[:16]!r}")


def read_with_webdataset(shards: list[Path]) -> list[dict]:
    """``wds.WebDataset(urls, shardshuffle=False)``, no decoding (raw bytes), fully consumed.

    webdataset 1.0.2 never closes the shard files it opens (tar_file_expander leaves them
    to the garbage collector), which pytest's filterwarnings=error turns into a failure;
    the ResourceWarning is silenced here, and only here, and the files are collected at once.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        samples = list(wds.WebDataset([str(p) for p in shards], shardshuffle=False))
        gc.collect()
    return samples


def read_wds(ds: Path, meta: dict, arrays: dict) -> list[tuple[bytes, str, int]]:
    """(image bytes, ext, label) per sample, via webdataset AND tarfile AND raw offsets; all must agree."""
    split, n = meta["split"], meta["num_samples"]
    shards = sorted(ds.glob("*.tar"))
    assert [p.name for p in shards] == [f"{split}-{k:06d}.tar" for k in range(len(shards))]
    assert [s["name"] for s in meta["shards"]] == [p.name for p in shards]
    assert not list(ds.glob("*.tmp")), "a temporary shard was left behind"
    for s, p in zip(meta["shards"], shards):
        blob = p.read_bytes()
        assert s["bytes"] == len(blob) == meta["files"][p.name]
        assert s["crc32"] == zlib.crc32(blob) & 0xFFFFFFFF
        assert len(blob) % 512 == 0 and blob[-1024:] == bytes(1024), "missing end-of-archive marker"
    assert sum(s["samples"] for s in meta["shards"]) == n
    assert [s["first"] for s in meta["shards"]] == list(np.cumsum([0] + [s["samples"] for s in meta["shards"]])[:-1])

    # 1. the official webdataset library, no decoding: raw bytes
    by_wds = read_with_webdataset(shards)
    assert len(by_wds) == n
    from_wds = []
    for i, sample in enumerate(by_wds):
        fields = {k for k in sample if not k.startswith("__")}
        assert "cls" in fields and len(fields) == 2, f"sample {i} has fields {fields}"
        (ext,) = fields - {"cls"}
        assert ext in IMAGE_FORMATS
        assert sample["__key__"] == f"{i:010d}"
        assert Path(sample["__url__"]).name == shards[int(arrays["shards"][i])].name
        from_wds.append((sample[ext], ext, int(sample["cls"].decode("ascii"))))

    # 2. Python's tarfile: strict POSIX members, in order, reproducible headers
    from_tar = []
    for k, p in enumerate(shards):
        with tarfile.open(p, mode="r:") as tf:
            members = tf.getmembers()
            assert len(members) == 2 * meta["shards"][k]["samples"]
            for img, cls in zip(members[::2], members[1::2]):
                key, ext = img.name.split(".")
                assert cls.name == f"{key}.cls"
                i = int(key)
                for m in (img, cls):
                    assert m.isreg() and m.mode == 0o444 and m.mtime == 0
                    assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "")
                assert int(arrays["shards"][i]) == k and img.offset_data == int(arrays["offsets"][i])
                data = tf.extractfile(img).read()
                label = tf.extractfile(cls).read()
                assert label == str(int(arrays["labels"][i])).encode()
                from_tar.append((data, ext, int(label)))
    assert from_tar == from_wds

    # 3. raw slicing with the index's offsets (what the project's own reader does)
    blobs = [p.read_bytes() for p in shards]
    for i, (data, _ext, _label) in enumerate(from_tar):
        off, size = int(arrays["offsets"][i]), int(arrays["sizes"][i])
        assert blobs[int(arrays["shards"][i])][off:off + size] == data
    return from_tar


def read_lmdb(ds: Path, meta: dict, arrays: dict) -> list[tuple[bytes, str, int]]:
    items = lmdb_items(ds)
    n = meta["num_samples"]
    assert [k for k, _ in items] == [b"%010d" % i for i in range(n)] + [b"__meta__"]
    stored_meta = json.loads(items[-1][1].decode("utf-8"))
    # __meta__ is the index as it stood before the arrays were written: the same values for
    # every key it has ("files", "spec_version" and "checksum" are added to index.json after).
    assert {k: meta[k] for k in stored_meta} == stored_meta
    assert stored_meta["classes"] == meta["classes"] and stored_meta["num_samples"] == n
    return [(v, sniff(v), int(arrays["labels"][i])) for i, (_k, v) in enumerate(items[:-1])]


def read_hdf5(ds: Path, meta: dict, arrays: dict) -> list[tuple[bytes, str, int]]:
    n = meta["num_samples"]
    with h5py.File(ds / "data.h5", "r") as f:
        assert set(f.keys()) == {"images", "offsets", "labels"}
        images, offsets, labels = f["images"], f["offsets"][:], f["labels"][:]
        assert images.dtype == np.uint8 and images.ndim == 1
        assert offsets.dtype == np.dtype("<i8") and offsets.shape == (n + 1,)
        assert labels.dtype == np.dtype("<i4") and labels.shape == (n,)
        assert offsets[0] == 0 and offsets[-1] == images.shape[0] and np.all(np.diff(offsets) >= 0)
        np.testing.assert_array_equal(offsets[:-1], arrays["offsets"])
        np.testing.assert_array_equal(np.diff(offsets), arrays["sizes"])
        np.testing.assert_array_equal(labels, arrays["labels"])
        stored_meta = json.loads(f.attrs["dataset-packer"])
        assert {k: meta[k] for k in stored_meta} == stored_meta
        flat = images[:].tobytes()
    return [(flat[offsets[i]:offsets[i + 1]], sniff(flat[offsets[i]:offsets[i + 1]]), int(labels[i]))
            for i in range(n)]


def read_mmap(ds: Path, meta: dict, arrays: dict) -> list[tuple[np.ndarray, str, int]]:
    n = meta["num_samples"]
    images = np.load(ds / "images.npy", mmap_mode="r")
    heights, widths, offsets, sizes = (arrays[k] for k in ("heights", "widths", "offsets", "sizes"))
    assert images.dtype == np.uint8
    np.testing.assert_array_equal(sizes, heights.astype(np.int64) * widths * 3)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    total = int(sizes.sum())
    assert (ds / "images.npy").stat().st_size == meta["storage"]["data_offset"] + total
    if meta["options"]["resize"]:
        size = meta["options"]["resize"]
        assert images.shape == (n, size, size, 3)
        out = [images[i] for i in range(n)]
    else:
        assert images.shape == (total,)
        out = [images[offsets[i]:offsets[i] + sizes[i]].reshape(heights[i], widths[i], 3) for i in range(n)]
    return [(np.asarray(px), "rgb", int(arrays["labels"][i])) for i, px in enumerate(out)]


READERS = {"wds": read_wds, "lmdb": read_lmdb, "hdf5": read_hdf5, "mmap": read_mmap}


def decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def source_files(src: Path) -> tuple[int, int]:
    """(image files, non-image files) as the ImageFolder rules count them (loose root files included)."""
    images = other = 0
    for dirpath, dirs, files in os.walk(src):
        top = Path(dirpath) == src
        if top:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if f.startswith("."):
                other += not top
            elif top or not f.lower().endswith((".jpg", ".jpeg", ".png")):
                other += 1
            else:
                images += 1
    return images, other


# ---------------------------------------------------------------- fixtures
@pytest.fixture(params=["real", "generated"])
def case(request) -> tuple[Path, dict[str, Path]]:
    """(source folder, format -> packed dataset folder)."""
    if request.param == "real":
        return request.getfixturevalue("real_images"), request.getfixturevalue("packed_real")
    return request.getfixturevalue("generated"), request.getfixturevalue("packed_generated")


# ---------------------------------------------------------------- every sample, exactly
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_every_sample_comes_back_exactly(fmt, case):
    src, packed = case
    ds = packed[fmt]
    meta, arrays, names = load_index(ds)
    classes, reference = imagefolder_reference(src)
    n = len(reference)
    reference = written_order(meta, reference)

    # ImageFolder rules: sorted class folders, samples by class then file name, non-images counted
    assert meta["format"] == fmt and meta["num_samples"] == n
    assert meta["classes"] == classes
    assert names == [rel for rel, _ in reference]
    np.testing.assert_array_equal(arrays["labels"], [label for _, label in reference])
    assert meta["class_counts"] == np.bincount(arrays["labels"], minlength=len(classes)).tolist()
    images_found, non_images = source_files(src)
    assert meta["source"]["images_found"] == images_found == n
    assert meta["source"]["ignored_files"] == non_images > 0
    for name in spec.REQUIRED_ARRAYS[fmt]:
        assert arrays[name].dtype == spec.ARRAY_DTYPES[name] and arrays[name].shape == (n,)

    samples = READERS[fmt](ds, meta, arrays)
    assert len(samples) == n
    reencoded = 0
    for i, ((payload, ext, label), rel) in enumerate(zip(samples, names)):
        path = src / rel
        assert label == arrays["labels"][i]
        if fmt == "mmap":
            np.testing.assert_array_equal(payload, expected_rgb(path), err_msg=rel)
            stored = payload.tobytes()
        else:
            stored = payload
            with Image.open(path) as im:
                assert IMAGE_FORMATS[ext] == im.format, f"{rel}: stored as .{ext}"
            assert ext == sniff(stored)
            if needs_change(path):
                reencoded += 1
                assert stored != path.read_bytes()
                diff = np.abs(decode(stored).astype(int) - expected_rgb(path))
                if ext == "png":  # lossless: the documented RGB exactly (+-1 for alpha rounding)
                    assert diff.max() <= 1, rel
                else:  # a JPEG re-encoded at high quality: the same picture
                    assert diff.mean() <= 3, rel
            else:
                assert stored == path.read_bytes(), f"{rel}: needed no change but was not stored byte for byte"
        assert arrays["checksums"][i] == zlib.crc32(stored) & 0xFFFFFFFF
        assert arrays["sizes"][i] == len(stored)
    if fmt != "mmap":
        assert meta["stats"]["reencoded"] == reencoded
    if src.name == "real-images":
        assert reencoded == (0 if fmt == "mmap" else 2)  # graphics/horse.png, graphics/logo.png (RGBA)


@pytest.mark.slow  # subprocess
def test_lmdb_readable_by_mdb_stat(packed_real):
    tool = shutil.which("mdb_stat")
    if tool is None:
        pytest.skip("mdb_stat not installed (Debian package lmdb-utils; .ci/run installs it)")
    n = json.loads((packed_real["lmdb"] / "index.json").read_text())["num_samples"]
    out = subprocess.run([tool, "-e", str(packed_real["lmdb"])], capture_output=True, text=True, check=True).stdout
    assert f"Entries: {n + 1}" in out, out  # the samples plus __meta__
    assert "Page size:" in out


def test_lmdb_map_grows_and_transactions_commit_on_their_own(tmp_path, monkeypatch):
    """An LMDB map estimated far too small grows before it runs out (no MDB_MAP_FULL, nothing
    replayed), transactions commit every ``txn_bytes`` between checkpoints, and the stored samples are
    those of a pack with the default map."""
    from packer.formats import lmdb as lmdb_writer
    from readers import open_dataset

    src = make_image_folder(tmp_path / "src", classes=2, per_class=20, size=(160, 120))
    pack(src, tmp_path / "ref", PackOptions(format="lmdb", workers=1))
    grows, commits = [], []
    real_grow, real_commit = lmdb_writer.LmdbWriter._grow, lmdb_writer.LmdbWriter._commit
    monkeypatch.setattr(lmdb_writer.LmdbWriter, "initial_map_size", lambda self: 64 << 10)  # 16 pages
    monkeypatch.setattr(lmdb_writer, "_SPARE_PAGES", 4)
    monkeypatch.setattr(lmdb_writer.LmdbWriter, "txn_bytes", 40 << 10)
    monkeypatch.setattr(lmdb_writer.LmdbWriter, "_grow", lambda self, pages: (grows.append(self._map_pages),
                                                                              real_grow(self, pages))[1])
    monkeypatch.setattr(lmdb_writer.LmdbWriter, "_commit", lambda self, *a: (commits.append(self._txn_bytes),
                                                                             real_commit(self, *a))[1])
    pack(src, tmp_path / "out", PackOptions(format="lmdb", workers=1))
    assert len(grows) >= 2, grows  # 16 pages, then at least twice doubled
    assert grows == sorted(grows)
    assert any(n >= 40 << 10 for n in commits)  # commits between checkpoints
    ref, out = open_dataset(tmp_path / "ref", decode=False), open_dataset(tmp_path / "out", decode=False)
    try:
        assert len(out) == len(ref) > 30
        assert all(out.read(i) == ref.read(i) for i in range(len(ref)))
    finally:
        ref.close()
        out.close()


@pytest.mark.slow  # subprocess
def test_hdf5_readable_by_h5dump(packed_real):
    tool = shutil.which("h5dump")
    if tool is None:
        pytest.skip("h5dump not installed (Debian package hdf5-tools; .ci/run installs it)")
    ds = packed_real["hdf5"]
    meta = json.loads((ds / "index.json").read_text())
    out = subprocess.run([tool, "-H", str(ds / "data.h5")], capture_output=True, text=True, check=True).stdout
    total = int(np.load(ds / "sizes.npy").sum())
    n = meta["num_samples"]
    for name, dtype, length in (("images", "H5T_STD_U8LE", total), ("offsets", "H5T_STD_I64LE", n + 1),
                                ("labels", "H5T_STD_I32LE", n)):
        section = out.split(f'DATASET "{name}"', 1)[1].split("}", 1)[0] + "}"
        assert dtype in section and f"( {length} )" in section, (name, section)
    assert 'ATTRIBUTE "dataset-packer"' in out


# ---------------------------------------------------------------- determinism
# lmdb: runs mdb_dump in a subprocess where it is installed; mmap: over 2 s
@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.slow) if f in ("lmdb", "mmap") else f
                                 for f in FORMATS], ids=FORMATS)
def test_workers_do_not_change_the_output(fmt, real_images, tmp_path):
    kw = {"wds": {"shard_count": 7}, "mmap": {}}.get(fmt, {"checkpoint_bytes": 2 << 20})  # several txns/flushes
    for w in (1, 2):
        pack(real_images, tmp_path / f"w{w}", PackOptions(format=fmt, workers=w, **kw))
    one, two = tmp_path / "w1", tmp_path / "w2"
    files = sorted(p.name for p in one.iterdir())
    assert files == sorted(p.name for p in two.iterdir())
    for name in files:
        if name == "lock.mdb":
            continue  # LMDB's reader-lock table: runtime state, not data
        if name == "data.mdb":
            assert lmdb_items(one) == lmdb_items(two)
            dump = shutil.which("mdb_dump")
            if dump:
                dumps = [subprocess.run([dump, "-a", str(d)], capture_output=True, check=True).stdout
                         for d in (one, two)]
                assert dumps[0] == dumps[1]
        # wds shards, data.mdb, data.h5, images.npy, every .npy, names.jsonl, index.json: byte-identical
        assert (one / name).read_bytes() == (two / name).read_bytes(), f"{fmt}: {name} differs"


# ---------------------------------------------------------------- split folders
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_split_folders_give_one_dataset_each(fmt, tmp_path):
    src = tmp_path / "src"
    make_image_folder(src / "train", classes=3, per_class=4, seed=1)
    make_image_folder(src / "val", classes=2, per_class=3, seed=2)
    results = pack(src, tmp_path / "out", PackOptions(format=fmt, workers=1))
    out = tmp_path / "out"
    assert [r.split for r in results] == ["train", "val"]
    assert [r.out for r in results] == [out / "train", out / "val"]
    assert not (out / "index.json").exists()
    assert spec.find_splits(out) == ["train", "val"]
    with pytest.raises(spec.DatasetFormatError, match="several splits"):
        spec.read_index(out)
    for split in ("train", "val"):
        meta, arrays, names = load_index(out / split)
        classes, reference = imagefolder_reference(src / split)
        reference = written_order(meta, reference)
        assert meta["split"] == split and meta["classes"] == classes
        assert names == [rel for rel, _ in reference]
        np.testing.assert_array_equal(arrays["labels"], [label for _, label in reference])
        samples = READERS[fmt](out / split, meta, arrays)
        assert len(samples) == len(reference)
        if fmt == "wds":
            assert sorted(p.name for p in (out / split).glob("*.tar")) == [f"{split}-000000.tar"]


# ---------------------------------------------------------------- options
@functools.lru_cache(maxsize=64)
def _downscaled_reference(path: Path, w: int, h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(expected_rgb(path)).resize((w, h), Image.BICUBIC)).astype(int)


@pytest.mark.slow  # over 2 s: the first item computes the shared reference downscales
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_max_side(fmt, real_images, tmp_path):
    side = 256
    ds = tmp_path / fmt
    pack(real_images, ds, PackOptions(format=fmt, workers=2, max_side=side))
    meta, arrays, names = load_index(ds)
    samples = READERS[fmt](ds, meta, arrays)
    downscaled = 0
    for (payload, ext, _label), rel in zip(samples, names):
        path = real_images / rel
        with Image.open(path) as im:
            w, h, fmt_in = im.width, im.height, im.format
        px = payload if fmt == "mmap" else decode(payload)
        h2, w2 = px.shape[:2]
        assert max(w2, h2) <= side, rel
        if max(w, h) <= side:
            assert (w2, h2) == (w, h)
            if fmt != "mmap" and not needs_change(path):
                assert payload == path.read_bytes(), f"{rel} is small enough and needed no change"
            continue
        downscaled += 1
        scale = side / max(w, h)
        assert max(w2, h2) == side and abs(w2 - w * scale) <= 1 and abs(h2 - h * scale) <= 1, (rel, w2, h2)
        if fmt != "mmap":
            assert IMAGE_FORMATS[ext] == fmt_in, f"{rel}: {fmt_in} stored as {ext}"
        reference = _downscaled_reference(path, w2, h2)
        err = np.abs(px.astype(int) - reference).mean()
        # PNG: lossless, the same bicubic; JPEG: re-encoded at quality 90 (and maybe DCT-reduced decode)
        assert err <= (1.0 if fmt_in == "PNG" else 6.0), (rel, err)
    assert downscaled == 30  # all but science/microaneurysms.png (102x102)
    if fmt != "mmap":
        assert meta["stats"]["reencoded"] == downscaled


@pytest.mark.parametrize("shard_count, expected", [(5, [5, 5, 5, 5, 5, 3]), (7, [7, 7, 7, 7]), (1, [1] * 28),
                                                   (100, [28])])
def test_shard_count(generated, tmp_path, shard_count, expected):
    ds = tmp_path / "wds"
    pack(generated, ds, PackOptions(format="wds", workers=1, shard_count=shard_count))
    meta, arrays, _names = load_index(ds)
    assert [s["samples"] for s in meta["shards"]] == expected  # no empty trailing shard
    assert sorted(p.name for p in ds.glob("*.tar")) == [f"train-{k:06d}.tar" for k in range(len(expected))]
    np.testing.assert_array_equal(arrays["shards"], np.repeat(np.arange(len(expected)), expected))
    assert len(read_wds(ds, meta, arrays)) == 28


@pytest.mark.parametrize("shard_size", [1 << 20, 3 << 20, 1], ids=["1MiB", "3MiB", "1B"])
def test_shard_size_rollover(real_images, tmp_path, shard_size):
    ds = tmp_path / "wds"
    pack(real_images, ds, PackOptions(format="wds", workers=2, shard_size=shard_size))
    meta, arrays, _names = load_index(ds)
    shards = meta["shards"]
    assert len(shards) > 1
    offsets, sizes, which = arrays["offsets"], arrays["sizes"], arrays["shards"]
    for k, s in enumerate(shards):
        members = np.nonzero(which == k)[0]
        last = members[-1]
        # every sample starts below the limit: a shard goes past it by at most one sample
        assert offsets[last] - 512 < shard_size
        data_end = s["bytes"] - 1024  # before the end-of-archive marker
        assert data_end == offsets[last] + sizes[last] + (-sizes[last] % 512) + 1024  # + .cls member
        if k < len(shards) - 1:
            assert data_end >= shard_size, f"shard {k} closed before reaching the limit"
    if shard_size == 1:
        assert [s["samples"] for s in shards] == [1] * 31
    assert len(read_wds(ds, meta, arrays)) == 31


def _reference_resize(rgb: np.ndarray, size: int) -> np.ndarray:
    """Shorter side to ``size`` (bicubic), then the center size x size, in the shared geometry (readers.decode.geometry)."""
    g = resize_center_crop(rgb.shape[0], rgb.shape[1], size, size)
    return np.asarray(Image.fromarray(rgb).resize((g.width, g.height), Image.BICUBIC).crop(g.box))


def test_mmap_resize_generated_exact(generated, tmp_path):
    size = 64  # all sources are 96..120 x 80..104: no reduced-scale decode, no pre-reduction
    ds = tmp_path / "mmap"
    pack(generated, ds, PackOptions(format="mmap", workers=2, resize=size))
    meta, arrays, names = load_index(ds)
    images = np.load(ds / "images.npy", mmap_mode="r")
    assert images.shape == (28, size, size, 3) and images.dtype == np.uint8
    assert meta["storage"]["fixed_shape"] == [size, size, 3]
    assert set(arrays["heights"]) == set(arrays["widths"]) == {size}
    for i, rel in enumerate(names):
        np.testing.assert_array_equal(images[i], _reference_resize(expected_rgb(generated / rel), size), err_msg=rel)
        assert arrays["checksums"][i] == zlib.crc32(images[i].tobytes()) & 0xFFFFFFFF
    read_mmap(ds, meta, arrays)


def test_mmap_resize_real_photos(real_images, tmp_path):
    size = 128
    ds = tmp_path / "mmap"
    pack(real_images, ds, PackOptions(format="mmap", workers=2, resize=size))
    meta, arrays, names = load_index(ds)
    images = np.load(ds / "images.npy", mmap_mode="r")
    assert images.shape == (31, size, size, 3)
    for i, rel in enumerate(names):
        expected = _reference_resize(expected_rgb(real_images / rel), size)
        if rel.endswith(".png"):
            # PNGs are decoded at full size and downscaled < 6x: plain bicubic, exactly
            np.testing.assert_array_equal(images[i], expected, err_msg=rel)
        else:
            # large JPEGs may be decoded at a reduced DCT scale first (see packer/prepare/images.py):
            # the same picture, not the same bits
            err = np.abs(images[i].astype(int) - expected).mean()
            assert err < 6.0, (rel, err)


# ---------------------------------------------------------------- property-based
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=100)


@settings(max_examples=60, deadline=None)
@given(name=_names, size=st.integers(0, 8**11 - 1))
def test_tar_header_parses_back(name, size):
    block = tar_header(name, size)
    assert len(block) == 512
    info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")  # checks the header checksum
    assert (info.name, info.size, info.mode, info.mtime, info.uid, info.gid) == (name, size, 0o444, 0, 0, 0)
    assert info.type == tarfile.REGTYPE and info.uname == info.gname == ""


_samples = st.lists(
    st.tuples(st.binary(max_size=2000), st.sampled_from(["jpg", "png"]), st.integers(0, 2**31 - 1)),
    min_size=1, max_size=12,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=_samples, shard_count=st.none() | st.integers(1, 5), shard_size=st.integers(1, 6000))
def test_wds_writer_round_trips_through_tarfile(samples, shard_count, shard_size):
    opts = PackOptions(format="wds", shard_count=shard_count, shard_size=shard_size)
    # durability is not what this test is about: skip the fsyncs (they dominate its run time)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(os, "fsync"), \
            mock.patch.object(spec, "fsync_dir"):
        root = Path(tmp)
        writer = WdsWriter(root, "prop", opts, 0)
        writer.open(0, None)
        fields = []
        for i, (data, ext, label) in enumerate(samples):
            fields.append(writer.append(i, Prepared(data, ext, 1, 1, False), label))
            if writer.at_checkpoint_boundary():
                writer.checkpoint()
        shards = writer.finalize({}, {})["shards"]
        assert [s["name"] for s in shards] == [f"prop-{k:06d}.tar" for k in range(len(shards))]
        # (the shard log stays until the journal's clean-up, after the index is committed)
        assert sorted(p.name for p in root.iterdir() if p.name != SHARD_LOG_NAME) == sorted(
            [s["name"] for s in shards] + [spec.WIDS_INDEX_NAME])
        got = []
        for k, s in enumerate(shards):
            blob = (root / s["name"]).read_bytes()
            assert len(blob) == s["bytes"] and zlib.crc32(blob) & 0xFFFFFFFF == s["crc32"]
            with tarfile.open(root / s["name"], mode="r:") as tf:
                members = tf.getmembers()
                assert len(members) == 2 * s["samples"]
                assert s["first"] == len(got)
                for img, cls in zip(members[::2], members[1::2]):
                    i = len(got)
                    assert img.name == f"{i:010d}.{samples[i][1]}" and cls.name == f"{i:010d}.cls"
                    assert dict(zip(WdsWriter.location_fields, fields[i], strict=True)) == {
                        "offsets": img.offset_data, "shards": k}
                    got.append((tf.extractfile(img).read(), samples[i][1], int(tf.extractfile(cls).read())))
        assert got == samples
        for s in shards:  # a shard closes as soon as it reaches either limit, never later
            full_by_count = shard_count is not None and s["samples"] == shard_count
            full_by_size = s["bytes"] - 1024 >= shard_size
            assert shard_count is None or s["samples"] <= shard_count
            if s is not shards[-1]:
                assert full_by_count or full_by_size


_meta_extra = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda k: k not in ("format", "num_samples")),
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=12),
    max_size=4,
)


@st.composite
def _index(draw):
    fmt = draw(st.sampled_from(FORMATS))
    n = draw(st.integers(0, 40))
    arrays = {name: draw(hnp.arrays(spec.ARRAY_DTYPES[name], n)) for name in spec.REQUIRED_ARRAYS[fmt]}
    return fmt, n, arrays, draw(_meta_extra)


@settings(max_examples=40, deadline=None)
@given(case=_index(), as_lists=st.booleans())
def test_index_round_trip(case, as_lists):
    fmt, n, arrays, extra = case
    meta = dict(extra, format=fmt, num_samples=n)
    with tempfile.TemporaryDirectory() as tmp:
        spec.write_index(tmp, meta, {k: v.tolist() if as_lists else v for k, v in arrays.items()})
        index = spec.read_index(tmp)
        recorded = index.meta.pop(spec.ARRAYS_KEY)
        assert index.meta == dict(meta, spec_version=spec.SPEC_VERSION, checksum="crc32")
        assert set(recorded) == set(spec.REQUIRED_ARRAYS[fmt])
        assert index.format == fmt and index.num_samples == n
        assert set(index.arrays) == set(spec.REQUIRED_ARRAYS[fmt])
        for name, values in arrays.items():
            assert index.arrays[name].dtype == spec.ARRAY_DTYPES[name]
            np.testing.assert_array_equal(index.arrays[name], values)
            # plain numpy reads the same file
            np.testing.assert_array_equal(np.load(Path(tmp) / f"{name}.npy"), values)
        assert not list(Path(tmp).glob("*.tmp"))


def test_index_refuses_missing_or_short_arrays(tmp_path):
    arrays = {name: np.zeros(3, spec.ARRAY_DTYPES[name]) for name in spec.REQUIRED_ARRAYS["wds"]}
    with pytest.raises(ValueError, match="needs index arrays"):
        spec.write_index(tmp_path, {"format": "wds", "num_samples": 3}, {"labels": arrays["labels"]})
    spec.write_index(tmp_path, {"format": "wds", "num_samples": 4}, arrays)
    with pytest.raises(spec.DatasetFormatError, match="holds 3 entries"):
        spec.read_index(tmp_path)
