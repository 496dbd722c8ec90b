"""The scale benchmark's datasets (``benchmarks/bench_scale.py``, issue 22): built here, measured there.

* **packs** of tiny images: :func:`make_images` writes N JPEGs of 32 x 32 pixels (~1.1 KB each) in
  1,000 class folders, :data:`UNIQUE` distinct ones generated in parallel and hard-linked under new
  names beyond that; ``bench_scale.py`` packs them with the real packer (:func:`pack_options`).
* **index-only** datasets (:func:`index_only`): what a reader opens, without the pixels. The index
  arrays are real, at N, written by :func:`readers.contract.spec.write_index`; the data files are
  sparse or tiny (wds: sparse shards the offsets point into; lmdb: a 64-image data.mdb, whose open
  check reads O(1) pages; hdf5: a sparse chunked ``/images`` of N samples and its chunk table; mmap:
  a sparse ``images.npy`` of N 32 x 32 images), each started from a 64-image pack (:func:`template`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("wds", "lmdb", "hdf5", "mmap")
CLASSES = 1000
IMAGE_BYTES = 700  # index-only: stored bytes of each sample (a 32 x 32 JPEG is 0.7-1.2 KB)
SHARD_SAMPLES = 10_000  # index-only wds: samples per shard
UNIQUE = 10_000  # distinct JPEGs generated; larger sets hard-link them under new names (same class)


def make_images(root: Path, n: int, procs: int, base: Path | None = None) -> float:
    """``n`` 32 x 32 JPEGs in 1,000 class folders (kept between runs); seconds spent.

    At most :data:`UNIQUE` are generated (in ``base``); image ``i`` of a larger set is a hard link
    to distinct image ``i % UNIQUE``, which has the same class: the packer still lists, reads and
    writes ``n`` files (1.28M in a minute instead of an hour of JPEG encoding)."""
    from dataset_bench.synth import SynthOptions, make_imagenet_like

    t0 = time.perf_counter()
    done = root / ".complete"
    if done.exists():
        return time.perf_counter() - t0
    if n <= UNIQUE or base is None:
        make_imagenet_like(root, n, classes=min(CLASSES, n), options=SynthOptions(size=(32, 32), jitter=0, noise=4.0),
                           threads=procs)
    else:
        make_images(base, UNIQUE, procs)
        for c in range(CLASSES):
            (root / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = f"n{i % CLASSES:08d}/img_{i:07d}.JPEG"
            if not os.path.exists(root / name):
                os.link(base / f"n{i % CLASSES:08d}/img_{i % UNIQUE:07d}.JPEG", root / name)
    done.write_text(str(n))
    return time.perf_counter() - t0


def pack_options(fmt: str, workers: int) -> dict[str, Any]:
    return {"format": fmt, "workers": workers, "overwrite": True, **({"resize": 32} if fmt == "mmap" else {})}


def template(work: Path, fmt: str) -> Path:
    """A 64-image pack of ``fmt``: the metadata (and for lmdb the data file) an index-only dataset starts from."""
    out = work / "template" / fmt
    if not (out / "index.json").exists():
        from packer.api import pack
        from packer.options import PackOptions

        src = work / "template-images"
        make_images(src, 64, 1)
        pack(src, out, PackOptions(**pack_options(fmt, 1)))
    return out


def index_only(work: Path, fmt: str, n: int) -> Path:
    """An index-only dataset of ``fmt`` with ``n`` samples (see the module doc); kept between runs."""
    from readers.contract import spec

    out = work / "index" / f"{fmt}-{n}"
    if (out / spec.INDEX_NAME).exists():
        return out
    tpl = template(work, fmt)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    meta = json.loads((tpl / spec.INDEX_NAME).read_text())
    for key in ("index_arrays", "files_crc32", "spec_version", "checksum"):
        meta.pop(key, None)
    i = np.arange(n, dtype=np.int64)
    labels = (i % CLASSES).astype(np.int32)
    arrays: dict[str, np.ndarray] = {"labels": labels, "checksums": np.zeros(n, np.uint32),
                                     "sizes": np.full(n, IMAGE_BYTES, np.int64)}
    meta.update(num_samples=n, class_counts=np.bincount(labels, minlength=CLASSES).tolist(),
                classes=[f"n{c:08d}" for c in range(CLASSES)])
    if fmt == "wds":
        stride = spec.TAR_BLOCK + -(-IMAGE_BYTES // spec.TAR_BLOCK) * spec.TAR_BLOCK + 2 * spec.TAR_BLOCK
        arrays["shards"] = (i // SHARD_SAMPLES).astype(np.int32)
        arrays["offsets"] = (i % SHARD_SAMPLES) * stride + spec.TAR_BLOCK
        shards, files = [], {}
        for k, first in enumerate(range(0, n, SHARD_SAMPLES)):
            count = min(SHARD_SAMPLES, n - first)
            name = spec.shard_name("index", k)
            size = count * stride + 2 * spec.TAR_BLOCK
            _sparse(out / name, size)
            shards.append({"name": name, "samples": count, "first": first, "bytes": size, "crc32": 0})
            files[name] = size
        meta.update(shards=shards, files=files)
        meta["storage"].pop("wids_index", None)
    elif fmt == "lmdb":
        shutil.copy(tpl / "data.mdb", out / "data.mdb")
    elif fmt == "hdf5":
        arrays["offsets"] = i * IMAGE_BYTES
        _sparse_h5(out, n * IMAGE_BYTES)
        meta["files"] = {"data.h5": (out / "data.h5").stat().st_size,
                         spec.HDF5_CHUNK_TABLE: (out / spec.HDF5_CHUNK_TABLE).stat().st_size}
    else:
        from packer.formats.mmap import npy_header

        side = 32 * 32 * 3
        arrays.update(offsets=i * side, sizes=np.full(n, side, np.int64), heights=np.full(n, 32, np.int32),
                      widths=np.full(n, 32, np.int32))
        with open(out / "images.npy", "wb") as f:
            f.write(npy_header((n, 32, 32, 3)))
        os.truncate(out / "images.npy", spec.MMAP_HEADER_BYTES + n * side)
        meta["files"] = {"images.npy": spec.MMAP_HEADER_BYTES + n * side}
    del i
    spec.write_index(out, meta, arrays)
    return out


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def _sparse_h5(out: Path, nbytes: int) -> None:
    """data.h5 with a 1-D uint8 ``/images`` of ``nbytes`` in the packer's chunks, all allocated, none written."""
    import h5py

    from bench_hdf5_chunks import make  # the one sparse /images builder (this folder is on sys.path)
    from readers.contract import spec
    from readers.formats.h5layout import chunk_table

    chunk = spec.HDF5_CHUNK_BYTES
    make(str(out / "data.h5"), -(-nbytes // chunk))
    with h5py.File(out / "data.h5", "r") as f:
        table = chunk_table(f["images"], chunk)
    np.save(out / spec.HDF5_CHUNK_TABLE, np.asarray(table, dtype="<i8"))
