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
