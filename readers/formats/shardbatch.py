"""Whole batches of stored bytes from WebDataset shards (``decode=False``), for the thread loader.

``ShardDataset`` yields one sample at a time: a ``pread`` of header and
data, a Python check of the 512-byte tar header, a slice copy, then
``collate`` copies every sample once more into the batch. Here a batch of
the same samples, in the same order, is read with one copy per
sample -- copied out of a read-only mapping of its shard (page cache: a
memcpy, where ``pread`` costs about twice that), its header into a row of a
``(B, 512)`` array, its data straight into the batch buffer -- and the
headers are checked together with numpy, once per sample and mapping
(:class:`ShardMaps`; later epochs copy the data only):
the member name is the sample's key, the size field matches the index, the
header checksum holds. A header in any other (valid) spelling is checked
one by one, exactly as ``ShardDataset.read_from`` checks it; a damaged one
raises the same ``DatasetFormatError`` naming the shard and byte offset.
Shards are opened as per-sample reads open them (``ShardDataset.open_shard``:
regular files inside the dataset folder, never blocking) before they are
mapped; a remote dataset (streamed or cached) is read sample by sample.

Two loaders use it for a local ``ShardDataset`` with ``decode=False``:
``readers.loader.threads.ThreadLoader`` reads each thread's part with
:func:`iter_batches`; ``make_loader``'s worker processes and its 0-worker
loader iterate the reader's own copy (``ShardDataset.with_batch_reads``),
which yields each sample unread (``readers.formats.batch.Pending``: one small
object, no I/O), and their collate reads the batch of them at once
(:class:`ShardItems`, :func:`read_batch`) into the batch's buffer (a
worker's shared-memory slot). Everything else iterates samples.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, NamedTuple

import numpy as np

from readers.contract import spec
from readers.formats.batch import Allocator, GatheredItems, byte_offsets, copy_runs, finish_batch, new_byte_batch
from readers.formats import wds_io

__all__ = ["supported", "iter_batches", "read_batch", "ShardMaps", "ShardItems"]

BLOCK = spec.TAR_BLOCK  # 512-byte tar header in front of each sample
_POW10 = 10 ** np.arange(9, -1, -1, dtype=np.int64)  # the ten digits of a key
_POW8_11 = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_POW8_6 = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def supported(dataset: Any) -> bool:
    """True for a ShardDataset this module reads: local shards, ``decode=False``, image + label items
    (not ``fields=``: those samples are read member by member, see docs/fields.md)."""
    return (getattr(dataset, "format", "") == "wds" and not dataset.decode and getattr(dataset, "fields", None) is None
            and getattr(dataset, "shard_remote", None) is None and hasattr(dataset, "sample_order"))


def canonical_ok(headers: np.ndarray, idx: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per row: the header is this writer's exact spelling of sample ``idx``'s member of ``sizes`` bytes."""
    digits = (idx[:, None] // _POW10) % 10 + 48
    name_ok = np.all(headers[:, :10] == digits, axis=1) & (headers[:, 10] == 46)  # "<key>."
    size_digits = headers[:, 124:135].astype(np.int64) - 48
    size_ok = np.all((size_digits >= 0) & (size_digits <= 7), axis=1) & (headers[:, 135] == 0)
    size_ok &= (size_digits @ _POW8_11) == sizes
    chk_digits = headers[:, 148:154].astype(np.int64) - 48
    chk_ok = np.all((chk_digits >= 0) & (chk_digits <= 7), axis=1) & (headers[:, 154] == 0) & (headers[:, 155] == 32)
    total = headers.sum(axis=1, dtype=np.int64) - headers[:, 148:156].sum(axis=1, dtype=np.int64) + 256
    chk_ok &= (chk_digits @ _POW8_6) == total
    return name_ok & size_ok & chk_ok


def _check_one(ds: Any, header: np.ndarray, data: np.ndarray, i: int, shard: int, offset: int) -> None:
    """The per-sample check of ``ShardDataset.read_from`` for one header the fast check did not take
    (the same function, so the same DatasetFormatError naming the shard and byte)."""
    where = lambda: f"{ds.shard_location(shard)} at byte {offset - BLOCK}"  # noqa: E731
    wds_io.check_sample(header.tobytes() + data.tobytes(), i, len(data), where, getattr(ds, "inplace", None) is None)


MAX_MAPPED = 64  # shards kept mapped per caller (each mapping holds a descriptor)


class ShardMaps:
    """Read-only mappings of one dataset's shards, kept by a caller from epoch to epoch (at most
    :data:`MAX_MAPPED`, least recently used dropped first), and which samples' tar headers have
    been checked in them.

    A header is checked the first time its sample is read through a mapping, not on every
    epoch: the mapping holds the shard's inode, a shard is written once and never changed in
    place (a re-pack writes new files and renames them over), so bytes checked once in a
    mapping stay checked while it lives. The record of checked samples lives and goes with the
    mapping (one flag per sample of the shard: memory bounded by the mappings kept, not by the
    dataset's size), so when a shard's mapping is dropped its samples are checked again on their
    next read.
    """

    def __init__(self) -> None:
        self._maps: dict[int, Mapped] = {}
        self._owner: Any = None

    def bind(self, ds: Any) -> None:
        """Serve ``ds`` (the mappings and checks of another dataset's index are dropped)."""
        if self._owner is not ds.sample_offsets:  # with_order copies share the index arrays
            self._maps.clear()
            self._owner = ds.sample_offsets

    def get(self, ds: Any, shard: int) -> "Mapped":
        """The mapping of ``shard`` (opened now if needed) and its record of checked headers."""
        m = self._maps.pop(shard, None)
        if m is not None:
            self._maps[shard] = m  # most recently used last
            return m
        if len(self._maps) >= MAX_MAPPED:
            del self._maps[next(iter(self._maps))]  # its record goes with it
        fd = ds.open_shard(shard)  # a regular file inside the dataset folder, as for per-sample reads
        try:
            data = spec.map_file(fd)
        finally:
            os.close(fd)
        samples = ds.samples_of_shard(shard)
        m = self._maps[shard] = Mapped(data, samples.start, np.zeros(len(samples), dtype=bool))
        return m


class Mapped(NamedTuple):
    """One shard's mapping (uint8), the index of its first sample, and per sample of the shard
    (in shard order) whether its tar header was checked in this mapping."""

    data: np.ndarray
    first: int
    checked: np.ndarray


def read_batch(ds: Any, maps: ShardMaps, idx: np.ndarray, alloc: Allocator | None = None) -> tuple:
    """The collated batch of samples ``idx`` (indices of ``ds``'s index, any order) read through
    ``maps`` (into ``alloc``'s memory when given): ``(ByteBatch, labels[, indices])``.

    Index lookups, bounds and header checks are numpy over the batch; per sample there is one
    run of a mapping, and one ``copy_runs`` copies them all into the batch's buffer."""
    maps.bind(ds)
    idx = np.asarray(idx, dtype=np.int64)
    sizes = ds.sample_sizes[idx].astype(np.int64)
    offsets = byte_offsets(sizes)
    batch, data = new_byte_batch(offsets, alloc)
    shards = ds.sample_shards[idx].astype(np.int64)
    starts = ds.sample_offsets[idx].astype(np.int64)
    used = list(dict.fromkeys(shards.tolist()))  # the batch's shards, in order of first use
    mapped = [maps.get(ds, s) for s in used]  # held here even if a later one drops it from maps
    if len(used) == 1:
        which = np.zeros(len(idx), dtype=np.int64)
    else:
        keys = np.asarray(used, dtype=np.int64)
        by_key = np.argsort(keys)
        which = by_key[np.searchsorted(keys, shards, sorter=by_key)]  # per sample: its entry of ``mapped``
    lengths = np.array([len(m.data) for m in mapped], dtype=np.int64)[which]
    bad = (starts < BLOCK) | (starts + sizes > lengths)
    if bad.any():
        k = int(np.argmax(bad))
        raise spec.DatasetFormatError(
            f"{ds.shard_location(int(shards[k]))} at byte {int(starts[k]) - BLOCK}: shard ends early "
            f"(sample {int(idx[k])}): truncated or damaged")
    copy_runs(data, [m.data for m in mapped], which, starts, sizes)
    for w, m in enumerate(mapped):  # the headers this mapping has not checked yet, together
        rows = np.flatnonzero(which == w) if len(mapped) > 1 else np.arange(len(idx))
        rows = rows[~m.checked[idx[rows] - m.first]]
        if len(rows):
            headers = m.data[(starts[rows] - BLOCK)[:, None] + np.arange(BLOCK)]
            ok = canonical_ok(headers, idx[rows], sizes[rows])
            for j in np.flatnonzero(~ok):
                k = int(rows[j])
                _check_one(ds, headers[j], data[offsets[k]:offsets[k + 1]], int(idx[k]), int(shards[k]),
                           int(starts[k]))
            m.checked[idx[rows] - m.first] = True
    return finish_batch(ds, batch, idx)


def iter_batches(ds: Any, batch_size: int, drop_last: bool = False,
                 maps: ShardMaps | None = None) -> Iterator[tuple]:
    """This worker's (thread's) samples of the epoch, in ``ShardDataset``'s order, as collated batches.

    ``maps`` (:class:`ShardMaps`: read-only mappings, page cache rather than private memory,
    and the headers checked in them) is kept by the caller from epoch to epoch, so pages
    mapped once are not faulted in again and headers are not checked again.
    """
    maps = ShardMaps() if maps is None else maps
    order = np.asarray(ds.sample_order(), dtype=np.int64)  # this worker's epoch (and resume point), no I/O
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        yield read_batch(ds, maps, order[start:start + batch_size])


class ShardItems(GatheredItems):
    """A batch of a ``ShardDataset``'s samples (indices of its index), read whole on first use through
    the reader's own mappings (``ShardDataset.batch_maps``): what the loader's collate receives when
    the reader yields :class:`readers.formats.batch.Pending` samples (``ShardDataset.with_batch_reads``)."""

    def __init__(self, dataset: Any, indices: Any) -> None:
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)  # from the reader's own order: in range
        self._batch: tuple | None = None

    def _read(self, alloc: Allocator | None) -> tuple | None:
        return read_batch(self.dataset, self.dataset.batch_maps(), self.indices, alloc)
