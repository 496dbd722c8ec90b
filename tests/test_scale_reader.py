"""Reader-side costs that must not grow with N (issue 22): ``info`` reads index.json only; the
map-style epoch order is computed for one rank's share without a permutation of all N samples."""

from __future__ import annotations

import shutil

import pytest

from packer import info
from readers import spec


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

    from readers.checks import check_index

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

    from readers import safeio

    rng = np.random.default_rng(threads)
    for size in (0, 1, 4095, 8 * 4096, 8 * 4096 + 1, 23 * 4096 + 7):
        data = rng.bytes(size)
        assert safeio.mapped_checksum(data, chunk=4096, threads=threads) == zlib.crc32(data), size


@pytest.fixture
def many_slices(monkeypatch):
    """check_index in slices of 4 samples, on ``threads`` threads: several runs of slices per thread."""
    from readers import checks

    monkeypatch.setattr(checks, "_SLICE", 4)
    return lambda threads: monkeypatch.setattr(checks, "check_threads", lambda: threads)


@pytest.mark.parametrize("threads", [1, 3])
def test_open_checks_name_the_first_bad_slice_on_any_thread_count(packed_generated, tmp_path, many_slices,
                                                                   threads):
    """The value checks run in one pass over slices shared out among threads; what they report does
    not depend on the thread count: the first slice holding a bad sample, the first rule failing
    there (labels before sizes), its first bad sample."""
    import numpy as np

    from readers.checks import check_index

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
