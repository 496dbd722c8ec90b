"""WebDataset shard reader. Counterpart: ``packer/formats/wds.py`` (layout there).

``ShardDataset`` is an ``IterableDataset`` that reads shards sequentially,
using the index's per-sample offsets instead of parsing the tar stream.

How an epoch is ordered (shard order per epoch, ranks and workers take
contiguous slices, each worker reads a few shards at once and shuffles through
a bounded buffer) is computed from the index alone by ``readers.order.epoch``: see
there. ``sample_order()`` returns a worker's order without reading anything,
which is what mid-epoch resume (``resume_point``) and the shuffle-quality
simulation (``readers.order.quality``) use. With ``pad=True`` (default) every rank
yields ``ceil(N / R)`` samples (at most R-1 repeats); ``pad=False`` cuts to
``floor(N / R)``: uneven shards can never leave one rank short and hang DDP.

Every sample read checks the tar header in front of it, so a damaged shard
raises an error that names the shard and the byte offset.

``make_loader`` reads stored bytes (``decode=False``) in whole batches: in
threads through :func:`readers.formats.shardbatch.iter_batches`, in worker
processes and with no workers through the copy of :meth:`ShardDataset.with_batch_reads`,
whose samples its collate reads a batch at a time (same order, same bytes).

The bytes come from :mod:`readers.formats.wds_io` (local files; for a
remote dataset, streamed with large range requests, or through the node
cache when ``cache_dir`` is given); this module only decides the order, and
the order is the same wherever the bytes come from.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import json
import math
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from readers.contract import spec
from readers.formats.base import PackedDataset
from readers.contract.env import WorkerEnv, current_worker_env, release_freed_memory
from readers.contract.fields import Field
from readers.contract.perprocess import PerProcess
from readers.formats import shardbatch, wds_io
from readers.formats.batch import Pending
from readers.order.epoch import ShardLayout, ShardSettings, as_ints, resume_order, worker_order

__all__ = ["ShardDataset"]

#: Bytes of shared memory that carry a resume point (JSON) to the loader's workers, persistent ones too.
RESUME_BYTES = 8192
#: Passes counted per loader worker since ``set_epoch`` (worker ``rank x workers + id``, modulo this).
PASS_SLOTS = 1024


class ShardDataset(PackedDataset, torch.utils.data.IterableDataset):
    """Iterates a WebDataset-format dataset written by ``pack-dataset --format wds``."""

    format = "wds"

    def __init__(self, source: str | os.PathLike | spec.Index, *, shuffle: bool = True, seed: int = 0,
                 buffer_size: int = 1000, pad: bool = True, open_shards: int = 4, **kw: Any) -> None:
        super().__init__(source, **kw)
        #: Shards indexed in place (``pack-dataset index``; readers.formats.inplace), else None.
        self.inplace: Any = None
        if spec.is_inplace(self.meta):
            from readers.formats.inplace import InPlace

            self.inplace = InPlace(self, *(kw.get(k) for k in ("storage_options", "retry", "cache_dir", "cache_limit")))
        self.settings = ShardSettings(seed, shuffle, buffer_size, open_shards, pad)  # checks the values
        self._shard_of = self.index.arrays["shards"]
        self._offsets = self.index.arrays["offsets"]
        self._sizes = self.index.arrays["sizes"]
        shards = self.meta["shards"]
        self.shard_names = [s["name"] for s in shards]
        self.shard_sizes = np.array([s["samples"] for s in shards], dtype=np.int64)
        self._shard_first = np.array([s["first"] for s in shards], dtype=np.int64)
        self.layout = ShardLayout(self.shard_sizes, self._shard_first, self._shard_of)
        self._world: tuple[int, int] | None = None  # (rank, world) forced by with_order(distributed=False)
        #: A subset (``with_samples``): the sample indices it keeps, by shard, else None (all samples).
        self.kept: np.ndarray | None = None
        # Shared with loader workers (inherited at start), so set_epoch and a
        # resume point reach persistent workers too.
        self._epoch = multiprocessing.get_context().RawValue("q", 0)
        self._resume = multiprocessing.get_context().RawArray("c", RESUME_BYTES)
        self._passes = multiprocessing.get_context().RawArray("q", PASS_SLOTS)
        #: Iteration yields readers.formats.batch.Pending samples, read whole batches at a time by the
        #: loader's collate (with_batch_reads: make_loader's own copy).
        self.batch_reads = False
        # Per process and thread: the shard mappings whole-batch reads go through (shardbatch.ShardMaps).
        self._maps: PerProcess[threading.local] = PerProcess(threading.local)

    # The order settings, readable and settable one by one (with_order copies before changing them).
    seed = property(lambda self: self.settings.seed, lambda self, v: self._set(seed=int(v)))
    shuffle = property(lambda self: self.settings.shuffle, lambda self, v: self._set(shuffle=bool(v)))
    buffer_size = property(lambda self: self.settings.buffer_size, lambda self, v: self._set(buffer_size=int(v)))
    open_shards = property(lambda self: self.settings.open_shards, lambda self, v: self._set(open_shards=int(v)))
    pad = property(lambda self: self.settings.pad, lambda self, v: self._set(pad=bool(v)))

    def _set(self, **changes: Any) -> None:
        self.settings = dataclasses.replace(self.settings, **changes)

    def with_order(self, *, shuffle: bool | None = None, seed: int | None = None,
                   distributed: bool | None = None) -> "ShardDataset":
        """A copy that shuffles as asked (``None``: as this one does), sharing the index.

        The copy has its own epoch counter (starting at this one's epoch) and
        resume record, so changing them leaves this dataset alone; ``make_loader``
        uses this to apply its ``seed``/``shuffle`` without touching the caller's
        dataset. ``distributed=False``: the copy reads the whole dataset on every
        rank (for a framework that shards the loader itself).
        """
        other = copy.copy(self)  # through __getstate__/__setstate__: fresh shared values
        if shuffle is not None:
            other.shuffle = shuffle
        if seed is not None:
            other.seed = seed
        if distributed is False:
            other._world = (0, 1)
        elif distributed is True:
            other._world = None
        return other

    def with_samples(self, kept: np.ndarray) -> "ShardDataset":
        """A copy that reads only the samples ``kept`` (indices of this dataset's index; see
        ``readers.subset``), in the same shard-based order: the order of ``readers.order.epoch`` runs on
        the kept samples (position ``j`` of a shard's kept samples is the ``j``-th kept one in it),
        so shuffle, ranks, workers, resume and ``len`` count only them."""
        kept = np.unique(np.asarray(kept, dtype=np.int64))
        kept = kept[np.argsort(self._shard_of[kept], kind="stable")]  # by shard, front to back within one
        other = copy.copy(self)
        other.kept = kept
        other.layout = self._kept_layout(kept)
        return other

    def with_batch_reads(self) -> "ShardDataset":
        """A copy whose iteration yields each sample unread (a :class:`readers.formats.batch.Pending`),
        in the same order, when :func:`readers.formats.shardbatch.supported` takes this reader (local
        shards, ``decode=False``, image + label items); the loader's collate reads a batch of them
        at once (:meth:`gathered`): one copy per sample out of a read-only mapping of its shard,
        the tar headers checked together. ``make_loader`` uses it for its own copy with its own
        collate in worker processes and with ``num_workers=0``. Anything else that iterates the
        copy gets each sample's item on first use of the ``Pending``."""
        other = copy.copy(self)
        other.batch_reads = True
        return other

    def gathered(self, indices: Sequence[int]) -> shardbatch.ShardItems:
        """The batch of samples ``indices`` (of the index) as one whole-batch read, done when gathered."""
        return shardbatch.ShardItems(self, indices)

    def batch_maps(self) -> shardbatch.ShardMaps:
        """This process's and thread's shard mappings for whole-batch reads (kept from batch to batch)."""
        local = self._maps.get()
        maps = getattr(local, "maps", None)
        if maps is None:
            maps = local.maps = shardbatch.ShardMaps()
        return maps

    def pending_item(self, i: int) -> tuple:
        """The item of sample ``i`` (of the index), read now: what a :class:`Pending` stands for."""
        return self._make(i)

    def _kept_layout(self, kept: np.ndarray) -> ShardLayout:
        """The shard layout of the samples ``kept`` (sorted by shard), as ``readers.order.epoch`` sees them."""
        shard_of = self._shard_of[kept].astype(np.int32)
        sizes = np.bincount(shard_of, minlength=len(self.shard_sizes)).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return ShardLayout(sizes, first, shard_of)

    def _real(self, order: np.ndarray) -> np.ndarray:
        """Sample indices of the index from positions in the order's space (a subset's kept list)."""
        return order if self.kept is None else self.kept[order]

    def get(self, i: int) -> tuple:
        """The item of sample ``i`` (of a subset: its ``i``-th kept sample), read by random access
        (as ``readers.mix`` reads a wds source)."""
        real = int(self._real(np.asarray([i]))[0])
        return self._make(real)

    # ------------------------------------------------------------ shards
    @property
    def sample_shards(self) -> np.ndarray:
        """Per sample: which shard (position in ``shard_names``) holds it (the ``shards`` index array)."""
        return self._shard_of

    @property
    def sample_offsets(self) -> np.ndarray:
        """Per sample: the byte position of its data in its shard (the ``offsets`` index array)."""
        return self._offsets

    @property
    def sample_sizes(self) -> np.ndarray:
        """Per sample: its stored size in bytes (the ``sizes`` index array)."""
        return self._sizes

    def shard_of(self, i: int) -> int:
        """Which shard (position in ``shard_names``) holds sample ``i``."""
        return int(self._shard_of[i])

    def samples_of_shard(self, shard: int) -> range:
        """Indices of the samples shard ``shard`` holds, in their order in the shard."""
        first = int(self._shard_first[shard])
        return range(first, first + int(self.shard_sizes[shard]))

    @property
    def shard_remote(self) -> Any:
        """Where remote shards are read (``readers.remote.files.RemoteFiles``), None for local shards."""
        return self.remote if self.inplace is None else self.inplace.remote

    def shard_path(self, shard: int) -> Path:
        """Path of shard ``shard`` (a local dataset; remote ones: :meth:`shard_location`)."""
        if self.inplace is not None:
            return self.inplace.path(shard)
        if self.remote is not None:
            raise ValueError(f"{self.root} is remote: its shards have URLs (shard_location), not paths")
        return Path(self.root) / self.shard_names[shard]

    def shard_location(self, shard: int) -> str:
        """Path or URL of shard ``shard``, as shown in messages."""
        if self.inplace is not None:
            return self.inplace.location(shard)
        return self.location_of(self.shard_names[shard])

    def open_shard(self, shard: int) -> int:
        """A descriptor of shard ``shard``: a regular file inside the dataset folder
        (DatasetFormatError naming it otherwise; never blocks). Its size is not
        required to match: reads are ``pread``s, and a short one names the sample and byte.
        Shards in place: the file indexed (size and mtime), or one line naming it."""
        if self.inplace is not None:
            return self.inplace.open(shard)
        return spec.open_member(self.root, self.shard_names[shard], "shard file")

    def where(self, i: int) -> str:
        return self.shard_location(self.shard_of(i))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # the index's arrays by name (mapped again on arrival)
        state.pop("layout", None)  # holds the shards array: rebuilt from it in __setstate__
        state.pop("_maps", None)  # each copy maps the shards it reads itself (freed with it)
        from multiprocessing import context

        if context.get_spawning_popen() is None:
            # Plain pickling (not a worker start): shared memory cannot travel; keep the values.
            state["_epoch"] = int(self._epoch.value)
            state["_resume"] = bytes(self._resume.value)
            state["_passes"] = None  # a copy counts its own passes
        else:
            # A spawned worker has no process group and maybe no RANK/WORLD_SIZE
            # (mp.spawn, explicit init_process_group): carry the parent's rank.
            parent = current_worker_env()
            state["_parent_rank"] = (parent.rank, parent.world_size)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_epoch"], int):
            state["_epoch"] = multiprocessing.get_context().RawValue("q", state["_epoch"])
        if isinstance(state.get("_resume", b""), bytes):
            shared = multiprocessing.get_context().RawArray("c", RESUME_BYTES)
            shared.value = state.get("_resume", b"")
            state["_resume"] = shared
        if state.get("_passes") is None:
            state["_passes"] = multiprocessing.get_context().RawArray("q", PASS_SLOTS)
        state.setdefault("_world", None)
        state.setdefault("kept", None)
        state.setdefault("inplace", None)
        state.setdefault("batch_reads", False)
        state["_maps"] = PerProcess(threading.local)
        super().__setstate__(state)
        self.layout = (ShardLayout(self.shard_sizes, self._shard_first, self._shard_of) if self.kept is None
                       else self._kept_layout(self.kept))
        if self.inplace is not None:  # the image member's arrays: the index's, not a pickled copy
            self.inplace.image = (self._offsets, self._sizes)

    def close(self) -> None:
        inplace = getattr(self, "inplace", None)
        if inplace is not None:
            inplace.close()  # its mapped member arrays, its shards' store
        maps = getattr(self, "_maps", None)
        if maps is not None:
            maps.close()  # forgets this process's shard mappings (unmapped once no batch refers to them)
        super().close()

    # ------------------------------------------------------------ epochs
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: same seed and epoch give the same order.

        Without it (a plain ``DataLoader``), each new pass of a worker over the dataset
        starts the next epoch, as a map-style ``RandomSampler`` reshuffles each epoch:
        pass ``k`` since the last ``set_epoch(e)`` (or since opening: ``e = 0``) reads
        epoch ``e + k``. ``make_loader``'s loader calls this before every epoch."""
        self._epoch.value = int(epoch)
        ctypes.memset(self._passes, 0, ctypes.sizeof(self._passes))

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def samples_per_rank(self, world_size: int = 1) -> int:
        n = self.layout.num_samples
        return math.ceil(n / world_size) if self.pad else n // world_size

    def resume_at(self, point: dict[str, Any] | None) -> None:
        """Make the next epoch start part-way (``None``: from the start). Set by the loader
        (``PackedLoader.load_state_dict``); it reaches persistent workers through shared memory.

        ``point``: batches ``delivered`` so far by a loader with ``batch_size``/
        ``drop_last``, over ``world_size`` ranks of ``num_workers`` workers each,
        with the order settings it ran with (``seed``, ``shuffle``, ``buffer_size``,
        ``open_shards``, ``pad``); ``exact``: the loader's batching is unchanged;
        ``after``: an earlier point of this epoch that run had resumed from. See
        :func:`readers.order.epoch.resume_order`.
        """
        text = b"" if point is None else json.dumps(point, sort_keys=True).encode()
        if len(text) >= RESUME_BYTES:
            raise ValueError(f"resume point too large ({len(text)} bytes): too many resumes with changed "
                             "settings within one epoch")
        self._resume.value = text

    def resume_point(self) -> dict[str, Any] | None:
        """The resume point the next iteration applies, or None."""
        text = self._resume.value
        return json.loads(text) if text else None

    def sample_order(self, env: WorkerEnv | None = None, epoch: int | None = None) -> np.ndarray:
        """Sample indices this worker (``env``: default, where this runs) delivers in ``epoch``,
        in order, including a pending resume point; computed from the index, reading nothing."""
        env = self._env() if env is None else env
        epoch = self.epoch if epoch is None else epoch
        point = self.resume_point()
        if point is None:
            order = self._real(worker_order(self.layout, self.settings, epoch, env))
        else:
            order = self._real(resume_order(self.layout, self.settings, epoch, env, point))
        release_freed_memory()  # the order's temporaries, not kept in the worker's private memory all epoch
        return order

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all workers together)."""
        return self.samples_per_rank(self._env().world_size)

    # ------------------------------------------------------------ reading
    def read_from(self, fd: int, shard: int, i: int) -> bytes:
        """Stored bytes of sample ``i`` from the open shard ``fd``, checking its tar header."""
        return wds_io.LocalShards(self).pread(fd, shard, i)

    def read(self, i: int) -> bytes:
        """Stored bytes of sample ``i`` (random access; opens and closes its shard, or one range request)."""
        shard = self.shard_of(i)
        if self.shard_remote is not None:
            [(_, data)] = wds_io.StreamedShards(self).samples([i])  # runs to the end: its threads stop
            return data
        fd = self.open_shard(shard)
        try:
            return self.read_from(fd, shard, i)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ fields (docs/fields.md)
    def _member_fields(self) -> dict[str, Any]:
        """Member suffix (lower case) -> field, for every member a sample of this schema can hold."""
        table = self.__dict__.get("_suffixes")
        if table is None:
            table = self.__dict__["_suffixes"] = {s.lower(): f for f in self.schema for s in f.suffixes()}
        return table

    def _members(self, pread: Callable[[int, int], bytes], shard: int, i: int, names: set[str]) -> dict[str, bytes]:
        """The members of sample ``i`` holding the fields ``names``, walking its tar headers from
        its first member (at ``offsets[i]``; the writer puts the ``image`` first) to the first
        header of another key. Unwanted members are skipped, never read; each header's checksum
        is checked. ``pread(pos, n)`` reads the shard. Shards in place: from the member arrays."""
        if self.inplace is not None:
            return self.inplace.members_of(pread, shard, i, names)
        key = (spec.wds_key(i) + ".").encode()
        table = self._member_fields()
        out: dict[str, bytes] = {}
        pos = int(self._offsets[i]) - wds_io.BLOCK
        end = int(self.meta["shards"][shard]["bytes"])
        where = lambda: f"{self.shard_location(shard)} sample {i} at byte {pos}"  # noqa: E731
        while len(out) < len(names):
            header = pread(pos, wds_io.BLOCK)
            if len(header) < wds_io.BLOCK or not header.startswith(key):
                break
            parsed = wds_io.parse_header(header)
            if parsed is None:
                raise spec.DatasetFormatError(f"{where()}: damaged tar header")
            member, size = parsed
            suffix = member[len(key):].decode("utf-8", "replace")
            f = table.get(suffix.lower())
            if f is not None and f.name in names:
                if pos + wds_io.BLOCK + size > end:  # checked before the read allocates what the header says
                    raise spec.DatasetFormatError(f"{where()}: field {f.name!r} member {suffix} of {size} bytes runs past the end "
                                                  f"of the shard ({end} bytes): truncated or damaged")
                data = pread(pos + wds_io.BLOCK, size)
                if len(data) != size:
                    raise spec.DatasetFormatError(f"{where()}: shard ends early (field {f.name!r} member {suffix}): "
                                                  "truncated")
                out[f.name] = data
            pos += wds_io.BLOCK + -(-size // wds_io.BLOCK) * wds_io.BLOCK
        missing = sorted(names - out.keys())
        if missing:
            raise spec.DatasetFormatError(f"{self.shard_location(shard)}: sample {i} has no member for field "
                                          f"{missing[0]!r} (looked for key {key.decode()}"
                                          f"{{{','.join(self.schema[missing[0]].suffixes())}}})")
        return out

    def _decode_blob(self, field: Any, data: Any) -> Any:
        return field.type.from_member(data, field.name)  # .npy, decimal .cls, JSON numbers (docs/fields.md)

    def _stored_blob(self, field: Any, data: Any, value: Any) -> bytes:
        return field.type.member_blob(data, value)

    def _pread_of(self, shard: int, fd: int | None) -> Callable[[int, int], bytes]:
        """``pread(pos, n)`` of shard ``shard``: through ``fd``, its open file (local), else by range
        requests (remote: ``fd`` is None)."""
        if fd is not None:
            return lambda pos, n: os.pread(fd, n, pos)
        remote, name = self.shard_remote, self.shard_names[shard]
        if remote is None:
            raise ValueError(f"{self.shard_location(shard)}: a local shard is read through its open file")
        return lambda pos, n: remote.read_range(name, pos, n)  # remote: one range request each

    def _stored_fields(self) -> set[str]:
        """The selected fields read from the shard's members (the others are index-array columns)."""
        return {n for n in self.fields or () if not self.schema[n].type.fixed}

    def _read_blobs(self, i: int, fields: Sequence[Field]) -> dict[str, bytes]:
        shard = self.shard_of(i)
        fd = self.open_shard(shard) if self.shard_remote is None else None
        try:
            return self._members(self._pread_of(shard, fd), shard, i, {f.name for f in fields})
        finally:
            if fd is not None:
                os.close(fd)

    def _field_items(self, order: np.ndarray) -> Iterator[Any]:
        """The items of ``order`` with the selected fields: per sample, a walk over its members
        (local shards: ``pread``, a few kept open; remote: range requests, slow -- see docs/fields.md)."""
        names = self._stored_fields()
        fds: dict[int, int] = {}
        try:
            for i in as_ints(order):
                shard = int(self._shard_of[i])
                fd = None
                if self.shard_remote is None:
                    fd = fds.pop(shard, None)
                    if fd is None:
                        if len(fds) >= 2 * self.open_shards + 2:  # as __iter__'s shard_io keeps them
                            os.close(fds.pop(next(iter(fds))))
                        fd = self.open_shard(shard)
                    fds[shard] = fd
                blobs = self._members(self._pread_of(shard, fd), shard, i, names) if names else {}
                yield self._field_item(i, blobs.get("image"), blobs)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _env(self) -> WorkerEnv:
        env = current_worker_env()
        if self._world is not None:
            return WorkerEnv(*self._world, env.worker_id, env.num_workers)
        parent = getattr(self, "_parent_rank", None)
        if parent is not None and env.world_size == 1 and parent[1] > 1:
            env = WorkerEnv(parent[0], parent[1], env.worker_id, env.num_workers)
        return env

    def __iter__(self) -> Iterator[Any]:
        env = self._env()
        slot = env.global_worker % PASS_SLOTS
        passes, self._passes[slot] = self._passes[slot], self._passes[slot] + 1  # see set_epoch
        if passes == 0:
            order = self.sample_order(env)
        else:
            order = self._real(worker_order(self.layout, self.settings, self.epoch + passes, env))
            release_freed_memory()
        if self.fields is not None:
            yield from self._field_items(order)
            return
        if self.batch_reads and shardbatch.supported(self):  # read whole batches when collated
            for i in as_ints(order):
                yield Pending(self, i)
            return
        # The open runs plus the shards still in the buffer: local files kept open at once.
        pairs = wds_io.shard_io(self, keep=2 * self.open_shards + 2).samples(order)
        try:
            for i, data in pairs:
                yield self._item(i, data)
        finally:
            pairs.close()  # stops background requests and closes files now, not at garbage collection
