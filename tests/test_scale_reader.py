"""Reader-side costs that must not grow with N (issue 22): ``info`` reads index.json only; the
map-style epoch order is computed for one rank's share without a permutation of all N samples."""

from __future__ import annotations

import shutil

import pytest

from packer.tools import info
from readers.contract import spec


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_info_reads_no_index_array(packed_generated, tmp_path, fmt):
    """info describes a dataset from index.json alone: with every index array gone it still
    prints the counts (it used to map and checksum every array: 2.8 GB at 100M samples)."""
    folder = tmp_path / fmt
    shutil.copytree(packed_generated[fmt], folder)
    for name in spec.REQUIRED_ARRAYS[fmt]:
        (folder / spec.array_file(name)).unlink()
    with pytest.raises(spec.DatasetFormatError):
        spec.read_index(folder)  # a reader still refuses it
    d = info.describe(folder)
    assert d["state"] == "complete" and d["samples"] == spec.read_meta(folder)["num_samples"] == 28
    assert sum(c["samples"] for c in d["classes"]) == 28


def test_open_checks_hold_a_slice_not_a_copy_of_the_labels(packed_generated, tmp_path):
    """check_index (run at every open) counts the labels per class a slice at a time: a bincount of
    all labels made an int64 copy of them (800 MB at 100M samples)."""
    import json
    import tracemalloc

    import numpy as np

    from readers.contract.checks import check_index

    n, folder = 2_000_000, tmp_path / "lmdb"
    shutil.copytree(packed_generated["lmdb"], folder)
    meta = json.loads((folder / spec.INDEX_NAME).read_text())
    labels = (np.arange(n) % len(meta["classes"])).astype(np.int32)
    meta.update(num_samples=n, class_counts=np.bincount(labels).tolist())
    spec.write_index(folder, meta, {"labels": labels, "checksums": np.zeros(n, np.uint32),
                                    "sizes": np.ones(n, np.int64)})
    index = spec.read_index(folder)
    tracemalloc.start()
    try:
        check_index(index)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * n, f"check_index held {peak} B for {n} labels"


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_crc_on_threads_is_the_one_pass_value(threads):
    """mapped_checksum cuts a large mapping into one part per thread and joins the parts' CRCs
    (crc32_combine): the value is zlib's for any length, on or off a chunk boundary."""
    import zlib

    import numpy as np

    from readers.contract import safeio

    rng = np.random.default_rng(threads)
    for size in (0, 1, 4095, 8 * 4096, 8 * 4096 + 1, 23 * 4096 + 7):
        data = rng.bytes(size)
        assert safeio.mapped_checksum(data, chunk=4096, threads=threads) == zlib.crc32(data), size


@pytest.fixture
def many_slices(monkeypatch):
    """check_index in slices of 4 samples, on ``threads`` threads: several runs of slices per thread."""
    from readers.contract import checks

    monkeypatch.setattr(checks, "_SLICE", 4)
    return lambda threads: monkeypatch.setattr(checks, "check_threads", lambda: threads)


@pytest.mark.parametrize("threads", [1, 3])
def test_open_checks_name_the_first_bad_slice_on_any_thread_count(packed_generated, tmp_path, many_slices,
                                                                   threads):
    """The value checks run in one pass over slices shared out among threads; what they report does
    not depend on the thread count: the first slice holding a bad sample, the first rule failing
    there (labels before sizes), its first bad sample."""
    import numpy as np

    from readers.contract.checks import check_index

    many_slices(threads)
    folder = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], folder)
    index = spec.read_index(folder)
    arrays = dict(index.arrays)
    assert index.num_samples >= 24
    labels, sizes = np.array(arrays["labels"]), np.array(arrays["sizes"])
    labels[21], sizes[9], sizes[10] = 99, -1, -2  # sizes in slice 2, a label in slice 5
    check_index(index)  # the copy passes
    bad = spec.Index(root=folder, meta=index.meta, arrays=dict(arrays, labels=labels, sizes=sizes))
    with pytest.raises(spec.DatasetFormatError, match=r"sizes\.npy: sample 9: size -1 is negative"):
        check_index(bad)
    sizes[9] = sizes[10] = 1
    with pytest.raises(spec.DatasetFormatError, match=r"labels\.npy: sample 21: label 99 is outside"):
        check_index(bad)
    labels[21] = (int(arrays["labels"][21]) + 1) % len(index.meta["classes"])  # in range, another class
    with pytest.raises(spec.DatasetFormatError, match=r"labels\.npy: holds \d+ samples of class \d+, index\.json "
                                                      r"counts \d+: the labels were changed"):
        check_index(bad)


def test_an_order_is_turned_into_python_ints_a_block_at_a_time():
    """as_ints yields an epoch order's values without its whole tolist() (36 B per sample: 56 MB per wds
    worker at 100M samples), the same values across block boundaries."""
    import tracemalloc

    import numpy as np

    from readers.order.epoch import INT_BLOCK, as_ints

    n = 3 * INT_BLOCK + 5
    values = list(as_ints(np.arange(n)[::-1]))
    assert values == list(range(n - 1, -1, -1)) and all(type(v) is int for v in values[:3])
    big = np.arange(10_000_000)
    tracemalloc.start()
    try:
        it = as_ints(big)
        assert next(it) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * INT_BLOCK, f"{peak} B held to yield one value of {len(big):,}"


def test_a_wds_epoch_read_in_small_blocks_is_the_same_epoch(packed_generated, monkeypatch):
    """The wds worker reads its order through as_ints: with blocks of 3 samples the epoch holds the same
    items in the same order, the fields path too."""
    import readers.order.epoch
    from readers import open_dataset

    def epoch(**kwargs):
        ds = open_dataset(packed_generated["wds"], decode=False, **kwargs)
        try:
            return [(bytes(x[0]), int(x[1])) if isinstance(x, tuple) else repr(x) for x in ds]
        finally:
            ds.close()

    whole, with_fields = epoch(), epoch(fields=["image", "label"])
    monkeypatch.setattr(readers.order.epoch, "INT_BLOCK", 3)
    assert epoch() == whole and len(whole) == 28
    assert epoch(fields=["image", "label"]) == with_fields


def test_a_wds_workers_private_memory_after_its_order_is_the_order():
    """After a worker's epoch order, the heap's freed temporaries go back to the kernel (release_freed_memory):
    what the order added to the process's private memory is about the order itself. Without it glibc kept
    3-4x the order (42 MB for a 12 MB order of one worker of 8 x 8 at 100M samples). A fresh process, so the
    heap is its own."""
    import json
    import subprocess
    import sys

    code = """
import json, numpy as np
from readers.contract.env import WorkerEnv, release_freed_memory
from readers.order.epoch import ShardLayout, ShardSettings, worker_order

def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("RssAnon"))

layout = ShardLayout.from_sizes([10_000] * 10_000)  # 100M samples in 10,000 shards
base = anon()
order = worker_order(layout, ShardSettings(), 1, WorkerEnv(0, 8, 0, 8))
kept = anon() - base
trimmed = release_freed_memory()
print(json.dumps({"kept": kept, "after": anon() - base, "order": order.nbytes, "trimmed": trimmed}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    if not got["trimmed"]:
        pytest.skip("no malloc_trim here (not glibc)")
    assert got["order"] == 1_562_500 * 8
    assert got["after"] <= 1.5 * got["order"] + (4 << 20), got


def test_a_wds_worker_releases_the_orders_temporaries_each_epoch(packed_generated, monkeypatch):
    """ShardDataset hands the freed temporaries back after each order it computes: sample_order, and the
    later passes of an epoch that __iter__ computes itself."""
    import readers.formats.wds as wds
    from readers import open_dataset

    calls = []
    monkeypatch.setattr(wds, "release_freed_memory", lambda: calls.append(1) or True)
    ds = open_dataset(packed_generated["wds"], decode=False)
    try:
        ds.sample_order()
        assert len(calls) == 1
        assert len(list(ds)) == 28 and len(calls) == 2  # the epoch's first pass: through sample_order
        assert len(list(ds)) == 28 and len(calls) == 3  # a second pass over the same epoch
    finally:
        ds.close()
