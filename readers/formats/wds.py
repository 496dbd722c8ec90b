"""WebDataset shard reader. Counterpart: ``packer/formats/wds.py`` (layout there).

``ShardDataset`` is an ``IterableDataset`` that reads shards sequentially,
using the index's per-sample offsets instead of parsing the tar stream.

How an epoch is split (rank r of R DDP ranks, worker w of W loader workers):

1. The shard order is shuffled with ``(seed, epoch)`` -- the same on every
   rank -- giving one stream of all N samples, shard after shard.
2. With ``pad=True`` (default) the stream is extended by wrapping around to
   ``R * ceil(N / R)`` samples (as ``DistributedSampler`` does): every rank
   gets the same count, each sample is seen once, plus at most R-1 repeats.
   With ``pad=False`` it is cut to ``R * floor(N / R)`` (at most R-1 dropped).
3. Rank r takes the r-th contiguous slice; worker w the w-th contiguous
   slice of that. Each worker therefore reads a few whole shards
   sequentially, and uneven shards can never leave one rank short, so a DDP
   job cannot hang waiting for a rank that ran dry.
4. Each worker shuffles its samples through a bounded buffer
   (``buffer_size`` samples), seeded by ``(seed, epoch, rank, worker)``.

Every sample read checks the tar header in front of it, so a damaged shard
raises an error that names the shard and the byte offset.

The bytes come from :mod:`readers.formats.wds_io` (local files; for a
remote dataset, streamed with large range requests, or through the node
cache when ``cache_dir`` is given); this module only decides the order.
A streamed dataset is read in stream order and shuffled after reading (the
buffer then holds ``(index, bytes)``); the order of samples is the same
either way.
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from readers import spec
from readers.base import PackedDataset
from readers.env import WorkerEnv, current_worker_env
from readers.formats import wds_io

__all__ = ["ShardDataset", "epoch_plan"]

BLOCK = spec.TAR_BLOCK


def epoch_plan(shard_sizes: np.ndarray, seed: int, epoch: int, shuffle: bool, env: WorkerEnv,
               pad: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Shard order for the epoch and this worker's [start, stop) range over the stream.

    Returns ``(order, (start, stop))`` where positions index the stream of
    samples laid out shard by shard in ``order``; positions >= N wrap around.
    """
    order = np.arange(len(shard_sizes))
    if shuffle:
        order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(len(shard_sizes))
    n = int(shard_sizes.sum())
    per_rank = math.ceil(n / env.world_size) if pad else n // env.world_size
    rank_start = env.rank * per_rank
    base, extra = divmod(per_rank, env.num_workers)
    start = rank_start + env.worker_id * base + min(env.worker_id, extra)
    stop = start + base + (1 if env.worker_id < extra else 0)
    return order, np.array([start, stop])


class ShardDataset(PackedDataset, torch.utils.data.IterableDataset):
    """Iterates a WebDataset-format dataset written by ``pack-dataset --format wds``."""

    format = "wds"

    def __init__(self, source: str | os.PathLike | spec.Index, *, shuffle: bool = True, seed: int = 0,
                 buffer_size: int = 1000, pad: bool = True, **kw: Any) -> None:
        super().__init__(source, **kw)
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        self.shuffle, self.seed, self.buffer_size, self.pad = shuffle, seed, buffer_size, pad
        self._shard_of = self.index.arrays["shards"]
        self._offsets = self.index.arrays["offsets"]
        self._sizes = self.index.arrays["sizes"]
        shards = self.meta["shards"]
        self.shard_names = [s["name"] for s in shards]
        self.shard_sizes = np.array([s["samples"] for s in shards], dtype=np.int64)
        self._shard_first = np.array([s["first"] for s in shards], dtype=np.int64)
        # Shared with loader workers (inherited at start), so set_epoch reaches
        # persistent workers too.
        self._epoch = multiprocessing.get_context().RawValue("q", 0)

    def with_order(self, *, shuffle: bool | None = None, seed: int | None = None) -> "ShardDataset":
        """A copy that shuffles as asked (``None``: as this one does), sharing the index.

        The copy has its own epoch counter (starting at this one's epoch), so
        setting its epoch leaves this dataset alone; ``make_loader`` uses this
        to apply its ``seed``/``shuffle`` without touching the caller's dataset.
        """
        other = copy.copy(self)  # through __getstate__/__setstate__: a fresh epoch counter
        if shuffle is not None:
            other.shuffle = shuffle
        if seed is not None:
            other.seed = seed
        return other

    # ------------------------------------------------------------ shards
    def shard_of(self, i: int) -> int:
        """Which shard (position in ``shard_names``) holds sample ``i``."""
        return int(self._shard_of[i])

    def samples_of_shard(self, shard: int) -> range:
        """Indices of the samples shard ``shard`` holds, in their order in the shard."""
        first = int(self._shard_first[shard])
        return range(first, first + int(self.shard_sizes[shard]))

    def shard_path(self, shard: int) -> Path:
        """Path of shard ``shard`` (a local dataset; remote ones: :meth:`shard_location`)."""
        if self.remote is not None:
            raise ValueError(f"{self.root} is remote: its shards have URLs (shard_location), not paths")
        return Path(self.root) / self.shard_names[shard]

    def shard_location(self, shard: int) -> str:
        """Path or URL of shard ``shard``, as shown in messages."""
        return self.location_of(self.shard_names[shard])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        from multiprocessing import context

        if context.get_spawning_popen() is None:
            # Plain pickling (not a worker start): shared memory cannot travel; keep the value.
            state["_epoch"] = int(self._epoch.value)
        else:
            # A spawned worker has no process group and maybe no RANK/WORLD_SIZE
            # (mp.spawn, explicit init_process_group): carry the parent's rank.
            parent = current_worker_env()
            state["_parent_rank"] = (parent.rank, parent.world_size)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_epoch"], int):
            state["_epoch"] = multiprocessing.get_context().RawValue("q", state["_epoch"])
        self.__dict__.update(state)

    # ------------------------------------------------------------ epochs
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: same seed and epoch give the same order."""
        self._epoch.value = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def samples_per_rank(self, world_size: int = 1) -> int:
        n = int(self.shard_sizes.sum())
        return math.ceil(n / world_size) if self.pad else n // world_size

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all workers together)."""
        return self.samples_per_rank(self._env().world_size)

    # ------------------------------------------------------------ reading
    def _stream(self, order: np.ndarray, start: int, stop: int) -> Iterator[int]:
        """Sample indices at stream positions [start, stop), wrapping past the end."""
        n = int(self.shard_sizes.sum())
        if n == 0:
            return
        bounds = np.concatenate([[0], np.cumsum(self.shard_sizes[order])])
        pos = start
        while pos < stop:
            p = pos % n
            k = int(np.searchsorted(bounds, p, side="right") - 1)
            shard = int(order[k])
            within_start = p - int(bounds[k])
            take = min(int(self.shard_sizes[shard]) - within_start, stop - pos)
            first = int(self._shard_first[shard]) + within_start
            yield from range(first, first + take)
            pos += take

    def read_from(self, fd: int, shard: int, i: int) -> bytes:
        """Stored bytes of sample ``i`` from the open shard ``fd``, checking its tar header."""
        return wds_io.LocalShards(self).pread(fd, shard, i)

    def read(self, i: int) -> bytes:
        """Stored bytes of sample ``i`` (random access; opens and closes its shard, or one range request)."""
        shard = self.shard_of(i)
        if self.remote is not None:
            [(_, data)] = wds_io.StreamedShards(self).samples([i])  # runs to the end: its threads stop
            return data
        fd = os.open(self.shard_path(shard), os.O_RDONLY)
        try:
            return self.read_from(fd, shard, i)
        finally:
            os.close(fd)

    def _samples(self, env: WorkerEnv) -> Iterator[int]:
        """This worker's sample indices for the epoch, in the order they are yielded."""
        return self._shuffled(self._ordered(env), env)

    def _ordered(self, env: WorkerEnv) -> Iterator[int]:
        """This worker's sample indices for the epoch in stream order (before the shuffle buffer)."""
        order, (start, stop) = epoch_plan(self.shard_sizes, self.seed, self.epoch, self.shuffle, env, self.pad)
        return self._stream(order, int(start), int(stop))

    def _shuffled(self, items: Iterator[Any], env: WorkerEnv) -> Iterator[Any]:
        """``items`` through the bounded shuffle buffer (indices, or ``(index, bytes)`` pairs: same order)."""
        try:
            if not self.shuffle:
                yield from items
                return
            rng = np.random.default_rng([self.seed, self.epoch, env.rank, env.worker_id])
            buf: list[Any] = []
            for item in items:
                if len(buf) < self.buffer_size:
                    buf.append(item)
                    continue
                j = int(rng.integers(len(buf)))
                buf[j], item = item, buf[j]
                yield item
            rng.shuffle(buf)
            yield from buf
        finally:
            if hasattr(items, "close"):
                items.close()  # a reader's generator: stop its requests, close its files

    def _env(self) -> WorkerEnv:
        env = current_worker_env()
        parent = getattr(self, "_parent_rank", None)
        if parent is not None and env.world_size == 1 and parent[1] > 1:
            env = WorkerEnv(parent[0], parent[1], env.worker_id, env.num_workers)
        return env

    def __iter__(self) -> Iterator[tuple]:
        env = self._env()
        io = wds_io.shard_io(self)
        if io.sequential:  # streamed: read in stream order, shuffle what arrived
            pairs = self._shuffled(io.samples(self._ordered(env)), env)
        else:
            pairs = io.samples(self._samples(env))
        try:
            for i, data in pairs:
                yield self._item(i, data)
        finally:
            pairs.close()  # stops background requests and closes files now, not at garbage collection
