"""HDF5 at ImageNet size: the chunk table in one pass, and ``verify`` of a data.h5 over 12 GB.

A data.h5 of that size is built in seconds without writing 12 GB: the
packer's own writer finishes it (offsets, labels, chunk table, attributes),
but its ``/images`` is created with every 1 MiB chunk allocated up front and
never filled (HDF5 only extends the file, which stays sparse); the real
samples of a small pack are written into it far apart, one across the
4 GiB boundary and the last at the very end.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from packer.formats.base import merged
from packer.formats.hdf5 import HDF5Writer
from packer.options import PackOptions
from readers import open_dataset
from readers.contract import spec
from readers.formats.h5layout import check_chunks
from reliability_helpers import CLI, env


def _allocated_images(h5: h5py.File, nbytes: int, chunk_bytes: int = spec.HDF5_CHUNK_BYTES) -> h5py.Dataset:
    """``/images`` as the writer makes it (1-D uint8, unlimited, chunked, no filter), but with every
    chunk allocated at creation and never filled: the file grows, sparse, without any write."""
    space = h5py.h5s.create_simple((nbytes,), (h5py.h5s.UNLIMITED,))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((chunk_bytes,))
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    h5py.h5d.create(h5.id, b"images", h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl)
    return h5["images"]


class _CountingID:
    """A real h5py DatasetID that counts the calls made on it (h5py's are C methods: no profiler sees them)."""

    def __init__(self, dsid) -> None:
        self._dsid, self.calls = dsid, collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self._dsid, name)
        if not callable(attr):
            return attr

        def counted(*args, **kw):
            self.calls[name] += 1
            return attr(*args, **kw)

        return counted


class _CountingDataset:
    def __init__(self, images: h5py.Dataset) -> None:
        self._images, self.id = images, _CountingID(images.id)

    def __getattr__(self, name):
        return getattr(self._images, name)


def _spread(sizes: np.ndarray, total: int) -> np.ndarray:
    """Start of each sample in /images of ``total`` bytes: far apart, sample 1 across 4 GiB (when
    ``total`` allows), the last ending at ``total``."""
    n = len(sizes)
    starts = (np.arange(n, dtype=np.int64) * (total // n)) // 4096 * 4096
    if total > 1 << 33:
        starts[1] = (1 << 32) - int(sizes[1]) // 2
    starts[-1] = total - int(sizes[-1])
    order = np.argsort(starts)
    assert np.all(starts[order][1:] >= starts[order][:-1] + sizes[order][:-1]), "samples overlap"
    return starts


def sparse_pack(src: Path, dst: Path, total: int, images_hook=None) -> np.ndarray:
    """A copy of the hdf5 pack ``src`` whose /images is ``total`` bytes (mostly unwritten): the same
    samples, spread out, finished by the packer's writer and index writer. Returns the offsets."""
    index = spec.read_index(src)
    ds = open_dataset(src, decode=False)
    samples = [ds.read(i) for i in range(len(ds))]
    ds.close()
    dst.mkdir()
    shutil.copy(src / "names.jsonl", dst / "names.jsonl")
    arrays = {name: np.array(values) for name, values in index.arrays.items()}
    arrays["offsets"] = _spread(arrays["sizes"], total)
    writer = HDF5Writer(dst, index.meta["split"], PackOptions(format="hdf5"), total)
    writer.open(0, None)
    try:
        del writer.h5["images"]
        writer.images = _allocated_images(writer.h5, total)
        for start, data in zip(arrays["offsets"].tolist(), samples):
            writer.images[start:start + len(data)] = np.frombuffer(data, dtype=np.uint8)
        writer.pos = total
        if images_hook is not None:
            writer.images = images_hook(writer.images)
        extra = writer.finalize(index.meta, arrays)
    except BaseException:
        writer.abort()
        raise
    meta = merged(index.meta, extra)
    meta["files"] = {**index.meta["files"], **extra["files"]}
    meta.pop(spec.FILES_CRC_KEY, None)  # optional; a whole-file CRC of 13 GB is not what is tested here
    spec.write_index(dst, meta, arrays)
    return arrays["offsets"]


@pytest.mark.parametrize("chunks", [64, 640], ids=["64-chunks", "640-chunks"])
def test_the_chunk_table_is_one_pass_over_the_chunk_index(packed_real, tmp_path, chunks):
    """The writer's table and verify's check call HDF5 the same few times at any size: never
    get_chunk_info per chunk (each call walks the whole chunk index: chunks² in all)."""
    seen = {}
    root = tmp_path / "ds"
    sparse_pack(packed_real["hdf5"], root, chunks * spec.HDF5_CHUNK_BYTES - 12345,
                images_hook=lambda images: seen.setdefault("writer", _CountingDataset(images)))
    table = np.load(root / spec.HDF5_CHUNK_TABLE)
    assert len(table) == chunks and spec.read_index(root).meta["storage"]["chunk_table"] == spec.HDF5_CHUNK_TABLE
    with h5py.File(root / spec.DATA_FILE["hdf5"], "r") as f:
        images = _CountingDataset(f["images"])
        check_chunks(images, "data.h5", table, spec.HDF5_CHUNK_BYTES)
        with pytest.raises(spec.DatasetFormatError, match="chunk table does not match"):
            check_chunks(f["images"], "data.h5", table[::-1], spec.HDF5_CHUNK_BYTES)
    for calls in (seen["writer"].id.calls, images.id.calls):
        assert calls["get_chunk_info"] == 0, calls
        assert sum(calls.values()) <= 2, calls  # chunk_iter once (get_num_chunks at most once)


@pytest.mark.slow
def test_verify_of_a_13_gb_hdf5_pack_finds_the_damaged_sample(packed_real, tmp_path):
    """Issue 22: verify stopped with "Argument list too long" (exit 1, nothing checked) on any data.h5
    over ~10 GB: its 12k-entry chunk table went to a child process as one argument."""
    root = tmp_path / "big"
    total = 13_000_000_000
    try:
        offsets = sparse_pack(packed_real["hdf5"], root, total)
        data = root / spec.DATA_FILE["hdf5"]
        assert data.stat().st_size > 12_900_000_000 and data.stat().st_blocks * 512 < 1 << 30  # sparse
        table = np.load(root / spec.HDF5_CHUNK_TABLE)
        assert len(table) == -(-total // spec.HDF5_CHUNK_BYTES)
        verify = [*CLI, "verify", str(root), "-q"]
        r = subprocess.run(verify, capture_output=True, text=True, timeout=300, env=env())
        n = len(offsets)
        assert (r.returncode, r.stdout.splitlines()[-1:]) == (0, [f"{root}: {n} samples checked, OK"]), \
            r.stdout + r.stderr
        last = n - 1  # the sample ending at byte 13e9 of /images
        pos = int(offsets[last]) + 100
        addr = int(table[pos // spec.HDF5_CHUNK_BYTES]) + pos % spec.HDF5_CHUNK_BYTES
        fd = os.open(data, os.O_RDWR)
        try:
            os.pwrite(fd, bytes([os.pread(fd, 1, addr)[0] ^ 0xFF]), addr)
        finally:
            os.close(fd)
        r = subprocess.run(verify, capture_output=True, text=True, timeout=300, env=env())
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        assert r.stdout.splitlines() == [
            f"DAMAGED {data} sample {last}: checksum mismatch: stored bytes changed since packing",
            f"{root}: {n} samples checked, 1 problem(s)"], r.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_bench_hdf5_chunks_quick_runs(tmp_path):
    """benchmarks/bench_hdf5_chunks.py --quick (two sizes and the old per-chunk loop) runs and
    agrees with the old table; it prints each time with its ratio to the previous size."""
    out = tmp_path / "out.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_hdf5_chunks.py"
    r = subprocess.run([sys.executable, "-W", "error", str(script), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    assert [row["chunks"] for row in rows] == [1_000, 2_000, 20_000]
    assert rows[0]["loop_s"] is not None and rows[-1]["loop_s"] is None
    assert r.stdout.count("\n| ") == 3 and "x |" in r.stdout, r.stdout
