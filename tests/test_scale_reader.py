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
