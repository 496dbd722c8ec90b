"""HDF5 reader's direct pread path (chunk table) equals what h5py reads."""

from __future__ import annotations

import h5py
import numpy as np

from readers import open_dataset


def test_chunk_table_reads_equal_h5py(packed_real):
    root = packed_real["hdf5"]
    ds = open_dataset(root, decode=False)
    assert ds._chunks is not None, "the packer wrote no chunk table"
    offsets = np.load(root / "offsets.npy")
    sizes = np.load(root / "sizes.npy")
    straddling = 0
    with h5py.File(root / "data.h5", "r") as f:
        images = f["images"]
        for i in range(len(ds)):
            start, size = int(offsets[i]), int(sizes[i])
            straddling += start // ds._chunk_bytes != (start + size - 1) // ds._chunk_bytes
            assert ds.read(i) == images[start:start + size].tobytes(), f"sample {i}"
    assert straddling > 0  # the multi-chunk path was exercised
    ds.close()


def test_without_chunk_table_h5py_is_used(packed_real, tmp_path):
    import json
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(packed_real["hdf5"], root)
    meta = json.loads((root / "index.json").read_text())
    meta["storage"]["chunk_table"] = None
    (root / "index.json").write_text(json.dumps(meta))
    plain, direct = open_dataset(root, decode=False), open_dataset(packed_real["hdf5"], decode=False)
    assert plain._chunks is None
    assert all(plain.read(i) == direct.read(i) for i in range(len(plain)))
    plain.close(), direct.close()
