#!/usr/bin/env python
"""Time the HDF5 chunk table (``readers.formats.h5layout.chunk_table``) at growing chunk counts.

For each size, builds a ``data.h5`` whose ``/images`` is laid out as the
packer writes it (1-D uint8, 1 MiB chunks, no filter) with every chunk
allocated but never written (a sparse file: seconds, a few MB of disk for
100k chunks = 105 GB of /images), then times the one-pass chunk table the
writer and ``verify`` build, and prints each time with its ratio to the
previous size. ``--old-max N`` also times the per-chunk ``get_chunk_info``
loop the table used to be built with (each call walks the chunk index:
chunks² in all), up to N chunks. ImageNet at ~140 GB is ~133k chunks.

Usage::

    python benchmarks/bench_hdf5_chunks.py [--sizes 2500 5000 10000 100000] [--old-max 5000] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import h5py
import numpy as np

from readers.formats.h5layout import chunk_table
from readers.contract.spec import HDF5_CHUNK_BYTES


def make(path: str, chunks: int) -> None:
    """``/images`` of ``chunks`` 1 MiB chunks, all allocated at creation, none written (sparse)."""
    with h5py.File(path, "w") as f:
        space = h5py.h5s.create_simple((chunks * HDF5_CHUNK_BYTES,), (h5py.h5s.UNLIMITED,))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((HDF5_CHUNK_BYTES,))
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        h5py.h5d.create(f.id, b"images", h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl)


def per_chunk_loop(images: h5py.Dataset) -> np.ndarray:
    """The table as it used to be built: ``get_chunk_info(k)`` for every k."""
    dsid = images.id
    n = dsid.get_num_chunks()
    table = np.zeros(n, dtype="<i8")
    for k in range(n):
        info = dsid.get_chunk_info(k)
        table[info.chunk_offset[0] // HDF5_CHUNK_BYTES] = info.byte_offset
    return table


def _timed(call, *args):
    t0 = time.perf_counter()
    out = call(*args)
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2_500, 5_000, 10_000, 100_000], help="chunk counts to time")
    p.add_argument("--old-max", type=int, default=5_000,
                   help="also time the old per-chunk get_chunk_info loop up to this many chunks (0: never)")
    p.add_argument("--quick", action="store_true", help="small sizes (1,000, 2,000 and 20,000 chunks; old loop to 2,000)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    sizes, old_max = (([1_000, 2_000, 20_000], 2_000) if args.quick else (args.sizes, args.old_max))
    rows: list[dict] = []
    print("| chunks | /images | chunk_table (one pass) | ratio | get_chunk_info loop | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-h5chunks-") as tmp:
        for n in sizes:
            path = os.path.join(tmp, f"{n}.h5")
            make(path, n)
            with h5py.File(path, "r") as f:
                images = f["images"]
                fast, table = _timed(chunk_table, images, HDF5_CHUNK_BYTES)
                if table is None or len(table) != n:
                    raise SystemExit(f"{path}: the chunk table has {None if table is None else len(table)} "
                                     f"entries, expected {n}")
                old = None
                if n <= old_max:
                    old, old_table = _timed(per_chunk_loop, images)
                    if not np.array_equal(old_table, table):
                        raise SystemExit(f"{path}: the two chunk tables differ")
            os.unlink(path)
            prev = rows[-1] if rows else None
            ratio = f"{fast / prev['chunk_table_s']:.1f}x" if prev else "-"
            old_ratio = f"{old / prev['loop_s']:.1f}x" if prev and old is not None and prev["loop_s"] else "-"
            print(f"| {n:,} | {n * HDF5_CHUNK_BYTES / 1e9:.1f} GB | {fast:.3f} s | {ratio} | "
                  f"{'-' if old is None else f'{old:.2f} s'} | {old_ratio} |")
            rows.append({"chunks": n, "chunk_table_s": fast, "loop_s": old})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
