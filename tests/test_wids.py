"""wds output opens with the real ``wids`` library (indexed WebDataset reader) through the shard
index written beside the shards: same samples, bytes and labels as the packer stored."""

from __future__ import annotations

import json

import pytest

from packer import PackOptions, pack
from packer.tools.convert import convert
from readers.contract import spec

wids = pytest.importorskip("wids", reason="the 'wids' package is not installed (CI installs it: test extra)")


def test_wids_reads_every_sample(real_images, tmp_path, stored_bytes):
    out = tmp_path / "wds"
    pack(real_images, out, PackOptions(format="wds", shard_count=7, workers=2))
    index = json.loads((out / spec.WIDS_INDEX_NAME).read_text())
    assert index["wids_version"] == 1 and index["__kind__"] == "wids-shard-index-v1"
    meta = spec.read_index(out).meta
    assert meta["storage"]["wids_index"] == spec.WIDS_INDEX_NAME
    assert [s["nsamples"] for s in index["shardlist"]] == [s["samples"] for s in meta["shards"]]
    ds = wids.ShardListDataset(str(out / spec.WIDS_INDEX_NAME), cache_dir=str(tmp_path / "cache"),
                               transformations=[])
    labels = spec.read_index(out).labels
    assert len(ds) == meta["num_samples"] == 31
    for i in range(len(ds)):
        sample = ds[i]
        image = sample.get(".jpg", sample.get(".png"))
        assert image.read() == stored_bytes(out, i), i
        assert int(sample[".cls"].read()) == labels[i]
        assert sample["__key__"] == spec.wds_key(i)
    ds.close()


def test_the_folder_can_move(real_images, tmp_path):
    """Shard URLs are relative to the index file."""
    out = tmp_path / "a" / "wds"
    pack(real_images, out, PackOptions(format="wds", shard_count=10, workers=1))
    moved = tmp_path / "b"
    out.rename(moved)
    ds = wids.ShardListDataset(str(moved / spec.WIDS_INDEX_NAME), cache_dir=str(tmp_path / "cache"),
                               transformations=[])
    assert ds[30]["__key__"] == spec.wds_key(30)
    ds.close()


def test_converted_shards_have_the_index_too(real_images, tmp_path):
    src = tmp_path / "lmdb"
    pack(real_images, src, PackOptions(format="lmdb", workers=1))
    out = tmp_path / "wds"
    convert(src, out, PackOptions(format="wds", shard_count=9, workers=1))
    shards = json.loads((out / spec.WIDS_INDEX_NAME).read_text())["shardlist"]
    assert [s["nsamples"] for s in shards] == [9, 9, 9, 4]
    assert all((out / s["url"]).stat().st_size == s["filesize"] for s in shards)
