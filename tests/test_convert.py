"""``pack-dataset convert``: any packed format into any other, through packing's write stage.

Samples are compared with the bytes read straight from the data files (conftest's
``stored_bytes``, which never goes through ``readers``), and pixels with Pillow's decode.
"""

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

from conftest import make_image_folder
from packer import PackError, PackOptions, pack
from packer.tools.convert import convert
from readers.contract import spec

CLI = [sys.executable, "-m", "packer.cli"]


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=300)


def files_of(root: Path, skip=("index.json",)) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file() and p.name not in skip}


def opts(fmt: str, **kw) -> PackOptions:
    return PackOptions(format=fmt, workers=kw.pop("workers", 1), **kw)


@pytest.fixture(scope="module")
def real_wds(tmp_path_factory, real_images) -> Path:
    out = tmp_path_factory.mktemp("conv") / "wds"
    pack(real_images, out, opts("wds", shard_count=7, workers=2))
    return out


def test_round_trip_wds_lmdb_hdf5_wds(real_wds, tmp_path, stored_bytes):
    lmdb_, hdf5_, back = tmp_path / "lmdb", tmp_path / "hdf5", tmp_path / "wds"
    convert(real_wds, lmdb_, opts("lmdb"))
    convert(lmdb_, hdf5_, opts("hdf5"))
    convert(hdf5_, back, opts("wds", shard_count=7))
    original = spec.read_index(real_wds)
    n = original.num_samples
    for root in (lmdb_, hdf5_, back):
        index = spec.read_index(root)
        assert index.num_samples == n and index.classes == original.classes
        assert index.labels.tolist() == original.labels.tolist()
        assert index.arrays["checksums"].tolist() == original.arrays["checksums"].tolist()
        assert list(index.names()) == list(original.names())
        for i in range(n):
            assert stored_bytes(root, i) == stored_bytes(real_wds, i), (root.name, i)
    # same shard options: the shards and every index array come out byte for byte the same
    assert files_of(back) == files_of(real_wds)


def test_convert_to_mmap_equals_packing_to_mmap(real_images, real_wds, tmp_path):
    direct, converted = tmp_path / "direct", tmp_path / "converted"
    pack(real_images, direct, opts("mmap", resize=48, order="shuffled"))  # the wds source's order
    convert(real_wds, converted, opts("mmap", resize=48, workers=2))
    assert json.loads((converted / "index.json").read_text())["order"] == {"kind": "shuffled", "seed": 0}
    a, b = files_of(direct), files_of(converted)
    assert a["images.npy"] == b["images.npy"] and a["labels.npy"] == b["labels.npy"]
    assert a["checksums.npy"] == b["checksums.npy"]


def test_from_mmap_pixels_as_lossless_png(real_wds, tmp_path):
    mm, back, mm2 = tmp_path / "mmap", tmp_path / "wds", tmp_path / "mmap2"
    convert(real_wds, mm, opts("mmap", resize=40))
    convert(mm, back, opts("wds"))
    px = np.load(mm / "images.npy")
    meta = json.loads((back / "index.json").read_text())
    assert meta["storage"]["encodings"] == {"png": len(px)} and meta["stats"]["reencoded"] == len(px)
    from readers import open_dataset

    ds = open_dataset(back, decode=False, shuffle=False)
    decoded = [np.asarray(Image.open(io.BytesIO(ds.read(i)))) for i in range(len(px))]
    ds.close()
    assert all(np.array_equal(d, p) for d, p in zip(decoded, px))
    # and back into mmap: the same pixels (PNG is lossless), the same fixed shape
    convert(back, mm2, opts("mmap", resize=40))
    assert np.array_equal(np.load(mm2 / "images.npy"), px)


def test_mmap_to_mmap_keeps_or_resizes(real_wds, tmp_path):
    mm = tmp_path / "mm"
    convert(real_wds, mm, opts("mmap", resize=40))
    same = tmp_path / "same"
    convert(mm, same, opts("mmap"))  # no --resize: the source's size, pixels copied
    assert files_of(same) == files_of(mm)
    small = tmp_path / "small"
    convert(mm, small, opts("mmap", resize=20))
    assert np.load(small / "images.npy").shape == (spec.read_index(mm).num_samples, 20, 20, 3)


def test_workers_do_not_change_the_output(real_wds, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    convert(real_wds, one, opts("mmap", resize=32, workers=1))
    convert(real_wds, two, opts("mmap", resize=32, workers=2))
    assert files_of(one) == files_of(two)


@pytest.mark.slow  # subprocess
def test_a_damaged_sample_stops_the_conversion_naming_it(real_wds, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(real_wds, src)
    index = spec.read_index(src)
    victim = 9
    shard = src / index.meta["shards"][int(index.arrays["shards"][victim])]["name"]
    blob = bytearray(shard.read_bytes())
    blob[int(index.arrays["offsets"][victim]) + 100] ^= 0xFF
    shard.write_bytes(bytes(blob))
    r = run("convert", src, "-f", "lmdb", "-o", tmp_path / "out", "-q")
    assert r.returncode == 1, r.stderr
    assert f"sample {victim}: checksum mismatch" in r.stderr and "pack-dataset verify" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / spec.INDEX_NAME).exists()


@pytest.mark.slow  # subprocess
@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_interrupted_conversion_resumes_to_the_same_output(real_wds, tmp_path, monkeypatch, fmt):
    import packer.tools.convert as conv

    reference = tmp_path / "reference"
    convert(real_wds, reference, opts(fmt, shard_count=3, checkpoint_bytes=1))
    real_stage = conv.prepare_stage

    def failing_stage(index):
        stage = real_stage(index)

        def run_stage(source, start, image_opts, workers):
            for k, outcome in enumerate(stage(source, start, image_opts, workers)):
                if k == 13:
                    raise OSError(errno.EIO, "simulated")
                yield outcome

        return run_stage

    out = tmp_path / "out"
    monkeypatch.setattr(conv, "prepare_stage", failing_stage)
    with pytest.raises(PackError):
        convert(real_wds, out, opts(fmt, shard_count=3, checkpoint_bytes=1))
    monkeypatch.undo()
    assert not (out / spec.INDEX_NAME).exists() and (out / spec.STATE_NAME).exists()
    info = json.loads(run("info", out, "--json").stdout)
    assert info["state"] == "incomplete" and info["resume"].startswith("pack-dataset convert ")
    r = run(*info["resume"].split()[1:], "-q")  # the paths hold no spaces here
    assert r.returncode == 0, r.stderr
    a, b = files_of(reference), files_of(out)
    if fmt == "hdf5":  # container bytes may differ after a resume (README): compare content
        a.pop("data.h5"), b.pop("data.h5")
        assert [bytes(x) for x in _samples(reference)] == [bytes(x) for x in _samples(out)]
    assert a == b


def _samples(root: Path) -> list:
    from readers import open_dataset

    ds = open_dataset(root, decode=False)
    try:
        return [ds.read(i) for i in range(len(ds))]
    finally:
        ds.close()


@pytest.mark.slow  # subprocess
def test_splits_are_converted_split_by_split(tmp_path):
    make_image_folder(tmp_path / "src" / "train", classes=2, per_class=3)
    make_image_folder(tmp_path / "src" / "val", classes=2, per_class=2)
    pack(tmp_path / "src", tmp_path / "packed", opts("wds"))
    r = run("convert", tmp_path / "packed", "-f", "hdf5", "-o", tmp_path / "h5", "-q")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    for split, n in (("train", 6), ("val", 4)):
        assert spec.read_index(tmp_path / "h5" / split).num_samples == n


@pytest.mark.slow  # subprocess
def test_usage_errors(real_wds, tmp_path):
    make_image_folder(tmp_path / "folder", classes=2, per_class=1)
    cases = [
        (["convert", tmp_path / "folder", "-f", "lmdb", "-o", tmp_path / "o1"], "not a packed dataset"),
        (["convert", tmp_path / "nope", "-f", "lmdb", "-o", tmp_path / "o2"], "no such dataset folder"),
        (["convert", real_wds, "-f", "lmdb", "-o", real_wds / "inside"], "overlaps the source"),
        (["convert", real_wds, "-f", "wds", "-o", tmp_path / "o3", "--resize", "9"], "resize applies"),
        (["convert", real_wds, "-f", "lmdb", "-o", tmp_path / "o4", "--max-side", "9"], "unrecognized"),
    ]
    for args, message in cases:
        r = run(*args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
    assert not any((tmp_path / f"o{k}").exists() for k in range(1, 5))


@pytest.mark.slow  # subprocess
def test_an_unfinished_pack_is_not_converted(real_wds, tmp_path):
    src = tmp_path / "unfinished"
    shutil.copytree(real_wds, src)
    (src / spec.INDEX_NAME).rename(src / spec.STATE_NAME)
    r = run("convert", src, "-f", "lmdb", "-o", tmp_path / "o")
    assert r.returncode == 2 and "--resume" in r.stderr


@pytest.mark.slow  # subprocess
def test_info_names_what_a_dataset_was_converted_from(real_wds, tmp_path):
    h5 = tmp_path / "h5"
    convert(real_wds, h5, opts("hdf5"))
    d = json.loads(run("info", h5, "--json").stdout)
    assert d["converted_from"] == [{"format": "wds", "path": str(real_wds.resolve())}]
    assert d["source"]["kind"] == "folder" and d["source"]["images_found"] == 31
    assert d["reencoded"] == json.loads((real_wds / "index.json").read_text())["stats"]["reencoded"]


# ------------------------------------------------------------- names.jsonl (issue 22 item 9, issue 23 item 11)
def _index_only(root: Path, n: int) -> spec.Index:
    """An index of ``n`` samples with a real names.jsonl and no data files (what convert's source scan reads)."""
    root.mkdir(parents=True)
    with open(root / spec.NAMES_FILE, "w") as f:
        for i in range(n):
            f.write(json.dumps(f"class_{i % 1000:04d}/n{i:08d}_{i * 7 % 100003}.JPEG") + "\n")
    arrays = {"labels": np.arange(n, dtype=np.int32) % 1000, "sizes": np.full(n, 110_000 + 3, np.int64),
              "checksums": np.arange(n, dtype=np.uint32)}
    return spec.Index(root, {"format": "lmdb", "num_samples": n, "classes": [str(c) for c in range(1000)]}, arrays)


def _source_peak(index: spec.Index) -> int:
    """tracemalloc peak of building convert's source and walking it as the write stage does
    (each name twice, label and size, a journal checkpoint every 1,000 samples)."""
    import tracemalloc

    from packer.tools.convert import close_source, dataset_source

    tracemalloc.start()
    try:
        source = dataset_source(index)
        seen = 0
        for pos in range(len(source.paths)):
            assert source.paths[pos] == source.paths[pos]
            seen += source.labels[pos] + source.sizes[pos] * 0
            if pos % 1000 == 999:
                source.prefix_fingerprint(pos + 1)
        source.prefix_fingerprint(len(source.paths))
        assert source.total_bytes == index.num_samples * 110_003
        close_source(source)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_convert_source_memory_does_not_grow_with_the_names(tmp_path):
    """convert held every name in a list (658 MB at 1.28M samples); now names.jsonl is streamed and
    labels and sizes stay in their arrays: the peak at 40,000 samples is the peak at 4,000."""
    small = _source_peak(_index_only(tmp_path / "small", 4_000))
    big = _source_peak(_index_only(tmp_path / "big", 40_000))
    assert big < 1.5 * small + 64 * 1024, (small, big)  # a list of names: ~10x


def test_convert_names_are_read_in_order_and_match(tmp_path):
    from packer.tools.convert import close_source, dataset_source

    index = _index_only(tmp_path / "ds", 2_500)
    source = dataset_source(index)
    try:
        names = list(index.names())
        assert list(source.paths) == names and len(source.paths) == 2_500
        assert [source.paths[i] for i in (0, 1, 1, 7, 2_499, 3, -1)] == [names[i] for i in (0, 1, 1, 7, 2_499, 3, -1)]
        assert list(source.paths[10:20]) == names[10:20] and list(source.paths[5:8]) == names[5:8]
        assert source.labels[1_001] == 1 and list(source.labels)[:3] == [0, 1, 2]
    finally:
        close_source(source)


@pytest.mark.parametrize("line, message", [
    ("not json at all", r"names.jsonl:3: not a JSON string \(Expecting value"),
    ("[" * 200_000, r"names.jsonl:3: not a JSON string"),
    ("17", r"names.jsonl:3: not a JSON string \(a JSON int\)"),
    (None, r"names.jsonl: 4 lines for the 5 samples of the index"),
], ids=["garbage", "deep", "int", "short"])
def test_a_bad_names_line_is_one_line_naming_file_and_line(real_wds, tmp_path, line, message):
    """A non-JSON line in names.jsonl gave a raw JSONDecodeError traceback; now nothing is written."""
    from packer.errors import SourceError

    src = tmp_path / "src"
    index = _index_only(src, 5)
    lines = (src / spec.NAMES_FILE).read_text().splitlines()
    if line is None:
        del lines[2]
    else:
        lines[2] = line
    (src / spec.NAMES_FILE).write_text("\n".join(lines) + "\n")
    from packer.tools.convert import dataset_source

    with pytest.raises(SourceError, match=message) as exc:
        dataset_source(index)
    assert str(src / spec.NAMES_FILE) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow  # subprocess
def test_a_bad_names_line_stops_convert_without_traceback(real_wds, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(real_wds, src)
    lines = (src / spec.NAMES_FILE).read_text().splitlines()
    lines[4] = "{broken"
    (src / spec.NAMES_FILE).write_text("\n".join(lines) + "\n")
    r = run("convert", src, "-f", "lmdb", "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and f"{src / spec.NAMES_FILE}:5: not a JSON string" in r.stderr
    assert not (tmp_path / "out").exists()
