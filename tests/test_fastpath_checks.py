"""The fast paths answer damaged and crafted datasets as the per-sample path does.

Whole-batch reads (``get_batch`` through ``__getitems__``, ``readers.formats.shardbatch``
for shards) and the thread loader open the same files through the same
checks (``readers.contract.checks``, ``spec.open_regular``): a FIFO or a link leaving
the folder is refused, a truncated file is named, an undecodable sample is
named with its file and number. Every case is read three ways -- sample by
sample, by a 0-worker loader (whole batches in this process) and by two
loader threads -- and must end the same way.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from readers import make_loader, open_dataset
from readers.formats import shardbatch
from readers.contract import spec
from readers.contract.spec import DatasetFormatError
from reliability_helpers import copy, meta, resave_array

WAYS = ["samples", "batches", "threads"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory, packed_generated, generated):
    """Every format; mmap packed at a fixed size (what its whole-batch gather needs)."""
    from packer import PackOptions, pack

    out = tmp_path_factory.mktemp("fast") / "mmap"
    pack(generated, out, PackOptions(format="mmap", resize=24, workers=1))
    return {**packed_generated, "mmap": out}


@pytest.fixture
def ds_copy(packs, tmp_path):
    return lambda fmt: copy(packs[fmt], tmp_path / fmt)


def fast_path(ds) -> bool:
    """Whether loaders read ``ds`` in whole batches (decode=False: every format here)."""
    return shardbatch.supported(ds) if ds.format == "wds" else ds.batchable()


def read(root, way: str, decode: bool = False) -> dict:
    """Read every sample of ``root`` one ``way``: {"ok": n} or {"error": message}."""
    try:
        ds = open_dataset(root, decode=decode)
        try:
            if way == "samples":
                n = sum(1 for _ in ds) if ds.format == "wds" else sum(1 for i in range(len(ds)) if ds[i])
            else:
                workers, kind = (0, "processes") if way == "batches" else (2, "threads")
                loader = make_loader(ds, batch_size=4, num_workers=workers, workers=kind, shuffle=False)
                n = sum(len(batch[1]) for batch in loader)
        finally:
            ds.close()
        return {"ok": n}
    except DatasetFormatError as exc:
        return {"error": str(exc)}


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_the_ways_below_take_the_fast_paths(packs, fmt):
    ds = open_dataset(packs[fmt], decode=False)
    assert fast_path(ds)
    ds.close()
    n = spec.read_index(packs[fmt]).num_samples
    assert [read(packs[fmt], way) for way in WAYS] == [{"ok": n}] * 3


def data_name(root, fmt: str, k: int = 0) -> str:
    return meta(root)["shards"][k]["name"] if fmt == "wds" else spec.DATA_FILE[fmt]


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_fifo_in_place_of_the_data_file(ds_copy, fmt):
    root = ds_copy(fmt)
    name = data_name(root, fmt)
    (root / name).unlink()
    os.mkfifo(root / name)
    for way in WAYS:  # open_regular never blocks on a FIFO: these would hang otherwise
        got = read(root, way)
        assert "FIFO" in got.get("error", "") and name in got["error"], (way, got)


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_data_file_leaving_the_folder(ds_copy, tmp_path, fmt):
    root = ds_copy(fmt)
    name = data_name(root, fmt)
    moved = tmp_path / "elsewhere"
    (root / name).rename(moved)
    (root / name).symlink_to(moved)  # the same bytes, outside the dataset folder
    for way in WAYS:
        got = read(root, way)
        assert "leads outside the dataset folder" in got.get("error", ""), (way, got)


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_truncated_data_file_is_named(ds_copy, fmt):
    root = ds_copy(fmt)
    path = root / data_name(root, fmt, k=-1)
    os.truncate(path, path.stat().st_size * 2 // 3)
    for way in WAYS:
        got = read(root, way)
        assert str(path) in got.get("error", "") and ("truncated" in got["error"] or "ends early" in got["error"]), (
            way, got)


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5"])
def test_an_undecodable_sample_is_named_with_its_file(ds_copy, fmt):
    root = ds_copy(fmt)
    ds = open_dataset(root, decode=False)
    stored = ds.read(5)
    ds.close()
    path = root / data_name(root, fmt, k=ds.shard_of(5) if fmt == "wds" else 0)
    blob = bytearray(path.read_bytes())
    at = blob.find(stored)
    blob[at:at + len(stored)] = bytes(len(stored))
    path.write_bytes(bytes(blob))
    for way in WAYS:
        got = read(root, way, decode=True)
        assert f"{path} sample 5:" in got.get("error", ""), (way, got)


def test_a_damaged_tar_header_in_a_whole_batch_names_shard_and_byte(ds_copy):
    root = ds_copy("wds")
    ds = open_dataset(root, decode=False)
    i = int(ds.samples_of_shard(1)[2])
    offset = int(ds.index.arrays["offsets"][i]) - spec.TAR_BLOCK
    ds.close()
    path = root / data_name(root, "wds", 1)
    blob = bytearray(path.read_bytes())
    blob[offset + 3] ^= 0x5A  # inside the member name: the header checksum no longer holds either
    path.write_bytes(bytes(blob))
    for way in WAYS:
        got = read(root, way)
        assert f"{path} at byte {offset}: tar header is not sample {i}" in got.get("error", ""), (way, got)


def test_mmap_fixed_shape_the_samples_do_not_have_is_read_sample_by_sample(packs, tmp_path):
    """A crafted index whose fixed_shape disagrees with heights/widths: the whole-batch gather
    declines (it would hand out fixed_shape-sized rows), each sample is read as its index says."""
    root = copy(packs["mmap"], tmp_path / "mmap")
    ds = open_dataset(root, decode=False)
    shape = ds.fixed_shape
    assert shape and ds.batchable()
    ds.close()
    heights = np.load(root / spec.array_file("heights"))
    heights[3] -= 1  # sample 3 claims one row fewer: still inside the file, so the index checks accept it
    resave_array(root, "heights", heights)
    ds = open_dataset(root, decode=False, return_index=True)
    assert not ds.batchable() and ds.get_batch([0, 1, 2, 3]) is None
    seen = {}
    for images, _, idx in make_loader(ds, batch_size=4, num_workers=2, workers="threads", shuffle=False):
        seen.update({int(i): images.get(k) for k, i in enumerate(idx.tolist())})
    assert len(seen[3]) == (shape[0] - 1) * shape[1] * 3
    assert all(seen[i] == ds[i][0] for i in range(len(ds)))
    ds.close()


def test_remote_datasets_take_the_per_sample_path(packed_generated):
    """No whole-batch path for a dataset read by range requests (each sample has its CRC checked)."""
    from readers.formats.wds import ShardDataset
    from readers.formats.registry import open_dataset as open_any
    from readers.remote import LocalStore

    wds = ShardDataset(spec.read_index(LocalStore(packed_generated["wds"])), decode=False)
    assert wds.remote is not None and not shardbatch.supported(wds)
    for fmt in ("hdf5", "mmap"):
        ds = open_any(spec.read_index(LocalStore(packed_generated[fmt])), decode=False)
        assert ds.ranged and not ds.batchable() and ds.get_batch([0, 1]) is None, fmt
        ds.close()
    wds.close()
