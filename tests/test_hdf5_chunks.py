"""HDF5 reader's direct pread path (chunk table) equals what h5py reads."""

from __future__ import annotations

import h5py
import pytest

from readers import open_dataset
from readers.contract import spec


def test_chunk_table_reads_equal_h5py(packed_real):
    root = packed_real["hdf5"]
    ds = open_dataset(root, decode=False)
    assert ds.chunk_table is not None, "the packer wrote no chunk table"
    assert ds.chunk_bytes == spec.HDF5_CHUNK_BYTES
    assert ds.meta["storage"]["chunk_table"] == spec.HDF5_CHUNK_TABLE and (root / spec.HDF5_CHUNK_TABLE).is_file()
    offsets, sizes = ds.index.arrays["offsets"], ds.index.arrays["sizes"]
    straddling = 0
    with h5py.File(ds.data_file, "r") as f:
        images = f["images"]
        for i in range(len(ds)):
            start, size = int(offsets[i]), int(sizes[i])
            straddling += start // ds.chunk_bytes != (start + size - 1) // ds.chunk_bytes
            assert ds.read(i) == images[start:start + size].tobytes(), f"sample {i}"
    assert straddling > 0  # the multi-chunk path was exercised
    ds.close()


def test_without_chunk_table_h5py_is_used(packed_real, tmp_path):
    import json
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(packed_real["hdf5"], root)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    meta["storage"]["chunk_table"] = None
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))
    plain, direct = open_dataset(root, decode=False), open_dataset(packed_real["hdf5"], decode=False)
    assert plain.chunk_table is None and direct.chunk_table is not None
    assert all(plain.read(i) == direct.read(i) for i in range(len(plain)))
    plain.close(), direct.close()


def test_whole_batches_read_chunks_laid_out_in_any_order(packed_real, tmp_path):
    """get_batch copies a sample from one address when its chunks are adjacent in the file, and run
    by run when they are not; the same file cut short is refused, naming a sample."""
    import numpy as np

    from readers.contract.perprocess import PerProcess

    ds = open_dataset(packed_real["hdf5"], decode=False)
    want = [ds.read(i) for i in range(len(ds))]
    cb, chunks = ds.chunk_bytes, ds.chunk_table
    assert len(chunks) >= 2
    # the same chunks, in reverse order in the file: no two logical neighbours are adjacent any more
    raw = np.fromfile(ds.data_file, dtype=np.uint8)
    moved = np.concatenate([raw[c:c + cb] for c in chunks[::-1]])
    ds._chunks = np.arange(len(chunks) - 1, -1, -1, dtype=np.int64) * cb
    ds._mapped = PerProcess(lambda: moved)
    starts, sizes = ds.index.arrays["offsets"], ds.index.arrays["sizes"]
    assert (ds._addresses(starts, sizes) < 0).sum() > 0  # the run-by-run path is taken
    images, _labels = ds.get_batch(list(range(len(ds)))[::-1])
    assert [images.get(k) for k in range(len(ds))] == want[::-1]

    ds._mapped = PerProcess(lambda: moved[:len(moved) // 2])
    with pytest.raises(spec.DatasetFormatError, match="sample .* cut short: the file is truncated"):
        ds.get_batch(list(range(len(ds))))
    ds.close()


def test_writer_samples_across_and_over_the_block_read_back(tmp_path, monkeypatch):
    """HDF5Writer copies a sample into its block in one slice where it fits and piece by piece where
    it fills the block, over more than one block when it is larger: with a block of 2 chunks, small
    samples, samples that end past a block's end and one larger than the block read back exactly,
    verify, and give the same data.h5 as the default block."""
    import io

    import numpy as np
    from PIL import Image

    from packer import PackOptions, Writer
    from packer.formats import hdf5
    from packer.tools.verify import verify

    rng = np.random.default_rng(5)

    def jpeg(side: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        return buf.getvalue()

    images = [jpeg(side) for side in [64] * 5 + [700] * 6 + [1500] + [96] * 4 + [900] * 3]
    block = 2 * spec.HDF5_CHUNK_BYTES
    assert max(map(len, images)) > block and sum(map(len, images)) > 3 * block

    def write(out):
        with Writer(out, format="hdf5", options=PackOptions(validate=False)) as w:
            for i, data in enumerate(images):
                w.write({"image": data, "label": i % 3})

    write(tmp_path / "default")
    monkeypatch.setattr(hdf5, "_BLOCK_BYTES", block)
    write(tmp_path / "small")
    ds = open_dataset(tmp_path / "small", decode=False)
    assert [ds.read(i) for i in range(len(ds))] == images
    ds.close()
    assert verify(tmp_path / "small").ok
    assert (tmp_path / "small" / "data.h5").read_bytes() == (tmp_path / "default" / "data.h5").read_bytes()
