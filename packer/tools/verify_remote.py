"""``pack-dataset verify s3://...`` / ``https://...``: the same checks as locally, on the uploaded objects.

* wds: each shard object is streamed once (16 MB range requests): its size
  and whole-object CRC-32 are compared with the index, and every sample is
  cut out of the stream on the way, its tar header and CRC-32 checked.
* lmdb, hdf5, mmap: the data file is downloaded once into a temporary folder
  (parallel ranged GETs, with a progress callback), its size and CRC-32
  compared with the index (``files_crc32``; older indexes have sizes only),
  then every sample is read from the copy and its CRC-32 checked. The copy
  is removed at the end.

Nothing here trusts a cached copy: verify reads what the store holds now.
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable

from packer.tools.verify_report import VerifyReport, check_sample
from readers.contract import spec
from readers.formats import wds_io
from readers.formats.registry import READERS

__all__ = ["verify_remote", "remote_roots"]

Tick = Callable[[int], None]


def remote_roots(url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """``[url]`` for a dataset, or the URL of each split dataset under ``url``."""
    from readers.remote import open_store

    store = open_store(url, storage_options)
    try:  # closed here: verify runs in-process too (a library call, a test), where its connection would stay open
        if store.exists(spec.INDEX_NAME):
            return [url]
        try:
            names = store.list()
        except OSError:
            return [url]
        splits = spec.listed_splits(names)
        return [store.url_of(s) for s in splits] or [url]
    finally:
        store.close()


def verify_remote(index: spec.Index, report: VerifyReport, tick: Tick,
                  download_progress: Callable[[int, int], None] | None) -> None:
    """Fill ``report`` for the remote dataset of ``index``."""
    if index.format == "wds":
        ds = READERS["wds"](index, decode=False)
        try:
            for k in range(len(ds.shard_names)):
                _verify_shard(ds, k, report, tick)
        finally:
            ds.close()
        return
    with tempfile.TemporaryDirectory(prefix="dataset-packer-verify-") as tmp:
        if _fetch_data_file(index, tmp, report, download_progress):
            _verify_samples(index, tmp, report, tick)
        else:
            tick(index.num_samples)


def _fetch_data_file(index: spec.Index, tmp: str, report: VerifyReport, download_progress: Any) -> bool:
    """Download the data file into ``tmp``'s cache, unverified; record size/CRC problems. False: cannot read it."""
    from readers.remote.cache import NodeCache

    store, name = index.store, spec.DATA_FILE[index.format]
    want_size, want_crc = spec.recorded_files(index.meta).get(name, (None, None))
    where = store.url_of(name)
    try:
        size = store.size(name)
    except FileNotFoundError:
        report.problem(where, "data file is missing")
        return False
    if want_size is not None and size != want_size:
        report.problem(where, f"file is {size} bytes, index says {want_size}")
        return False
    path = NodeCache(tmp).fetch(store, name, size=size, progress=download_progress)
    if want_crc is not None and spec.file_checksum(path) != want_crc:
        report.problem(where, "file checksum differs from the index")
    return True


def _verify_samples(index: spec.Index, tmp: str, report: VerifyReport, tick: Tick) -> None:
    ds = READERS[index.format](index, decode=False, cache_dir=tmp)  # finds the copy just downloaded
    try:
        checksums = index.arrays["checksums"]
        for i in range(len(ds)):
            check_sample(report, f"{ds.data_location} sample {i}", lambda: ds.read(i), checksums[i])
            tick(1)
    finally:
        ds.close()


def _verify_shard(ds: Any, k: int, report: VerifyReport, tick: Tick) -> None:
    """Stream shard ``k`` once: whole-object size and CRC, and each sample's header and CRC on the way."""
    from readers.remote.errors import RemoteIntegrityError

    shard, store = ds.meta["shards"][k], ds.remote.store
    name, where = ds.shard_names[k], ds.shard_location(k)
    samples = ds.samples_of_shard(k)
    try:
        size = store.size(name)
    except FileNotFoundError:
        report.problem(where, "shard object is missing")
        tick(len(samples))
        return
    if size != shard["bytes"]:
        report.problem(where, f"shard is {size} bytes, index says {shard['bytes']}")
    arrays = wds_io.LocalShards(ds)  # only for its arrays and messages
    crc, window, window_start = 0, bytearray(), 0  # window holds object bytes [window_start, ...)
    todo = iter(samples)
    i = next(todo, None)
    for chunk in store.stream(name):
        crc = spec.checksum(chunk, crc)
        window += chunk
        while i is not None and int(arrays.offsets[i] + arrays.sizes[i]) <= window_start + len(window):
            rel = int(arrays.offsets[i]) - spec.TAR_BLOCK - window_start
            _check_cut(report, arrays, k, i, bytes(window[rel:rel + spec.TAR_BLOCK + int(arrays.sizes[i])]),
                       RemoteIntegrityError)
            tick(1)
            i = next(todo, None)
            if i is not None:  # drop what lies before the next sample
                cut = min(max(0, int(arrays.offsets[i]) - spec.TAR_BLOCK - window_start), len(window))
                del window[:cut]
                window_start += cut
        if i is None:
            window_start += len(window)  # the rest (end-of-archive blocks) only feeds the CRC
            window.clear()
    while i is not None:  # past the end of a short object
        report.samples += 1
        report.problem(f"{where} sample {i}", "unreadable: the shard object ends before it")
        tick(1)
        i = next(todo, None)
    if size == shard["bytes"] and crc != shard["crc32"]:
        report.problem(where, "shard checksum differs from the index")


def _check_cut(report: VerifyReport, arrays: Any, k: int, i: int, blob: bytes, integrity: type[BaseException]) -> None:
    report.samples += 1
    size = int(arrays.sizes[i])
    where = f"{arrays.ds.shard_location(k)} sample {i}"
    try:
        data = wds_io.check_sample(blob, i, size, arrays.where(k, int(arrays.offsets[i])))
    except (spec.DatasetFormatError, integrity) as exc:
        report.problem(where, f"unreadable: {exc}")
        return
    if spec.checksum(data) != int(arrays.checksums[i]):
        report.problem(where, "checksum mismatch: stored bytes changed since packing")
