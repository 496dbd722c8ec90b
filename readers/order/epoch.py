"""The sample order of an epoch, computed from the index alone (no I/O).

Everything that decides which sample a rank / loader worker delivers, and
when, lives here as pure functions of small integers and index arrays, so
that the same code drives the readers, mid-epoch resume (which skips what was
delivered without reading it) and the shuffle-quality simulation
(``readers.order.quality``).

Map-style readers (lmdb, hdf5, mmap) and mixtures: one keyed permutation of all N samples per
``(seed, epoch)``, cut into ranks like ``DistributedSampler``, in :mod:`readers.order.mapstyle`;
epochs of a set length and mixtures' draws in :mod:`readers.order.draw`. Both are re-exported
here (``from readers.order.epoch import rank_indices, epoch_draw``), so this module names the
whole order; this module itself holds the shard-based one.

``ShardDataset`` (wds), for rank r of R and loader worker w of W:

1. the shard order is shuffled with ``(seed, epoch)`` and the shards laid end
   to end: one stream of all N samples (:func:`shard_stream`);
2. the stream is cut into R equal contiguous slices (padded by wrapping
   around, or cut, as ``pad`` says) and each rank's slice into W contiguous
   slices (:func:`worker_order`): a worker reads a few whole shards;
3. the worker reads ``open_shards`` of its shard runs at once, taking each
   next sample from a randomly chosen open run (:func:`interleave`), so each
   shard is still read front to back;
4. then shuffles through a bounded buffer of ``buffer_size`` samples
   (:func:`buffer_shuffle`); steps 3 and 4 draw from one generator seeded with
   ``(seed, epoch, rank, worker)``.

Each worker builds only its own share: the shard order (O(shards)) locates
its slice of the stream and only the shards in it are expanded; steps 3 and 4
are vectorized with numpy (the same output as the step-by-step definitions in
their docstrings, pinned by ``tests/test_order_scale.py``). Memory and time
per worker: O(N / (R x W)) plus a shard.

A DataLoader with W workers delivers their batches round-robin (worker 0's
first batch, worker 1's first, ..., skipping workers that ran out):
:func:`round_robin` and :func:`consumed_batches` model that, which is what
makes an exact mid-epoch resume of an iterable dataset possible.
"""

from __future__ import annotations

import copy
import heapq
import math
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from readers.contract.env import WorkerEnv
from readers.order.draw import epoch_draw, shares, source_stream
from readers.order.mapstyle import (MAP_ORDER, MAP_ORDERS, ab_domain, permutation, rank_indices, rank_order,
                                    rank_positions, shuffle_at)

__all__ = ["ShardLayout", "ShardSettings", "shard_order", "shard_stream", "interleave", "buffer_shuffle",
           "worker_order", "round_robin", "batch_counts", "consumed_batches", "worker_lengths", "shards_delivered",
           "resume_order", "is_exact", "settings_of", "as_ints", "INT_BLOCK",
           # re-exported: the map-style order (readers.order.mapstyle) and epochs of a set length (readers.order.draw)
           "permutation", "rank_indices", "shuffle_at", "ab_domain", "rank_positions", "rank_order", "MAP_ORDER",
           "MAP_ORDERS", "shares", "source_stream", "epoch_draw"]


# --------------------------------------------------------------------------- shards


@dataclass(frozen=True)
class ShardLayout:
    """Where samples lie: samples per shard, first sample of each shard, shard of each sample."""

    sizes: np.ndarray
    first: np.ndarray
    shard_of: np.ndarray

    @classmethod
    def from_sizes(cls, sizes: Sequence[int]) -> ShardLayout:
        """Shards holding consecutive samples (how ``pack-dataset`` writes them)."""
        sizes_arr = np.asarray(sizes, dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(sizes_arr)[:-1]]).astype(np.int64)
        return cls(sizes_arr, first, np.repeat(np.arange(len(sizes_arr), dtype=np.int32), sizes_arr))

    @property
    def num_samples(self) -> int:
        return int(self.sizes.sum())


@dataclass(frozen=True)
class ShardSettings:
    """How ``ShardDataset`` orders an epoch (see the module docstring)."""

    seed: int = 0
    shuffle: bool = True
    buffer_size: int = 1000
    open_shards: int = 4
    pad: bool = True

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {self.buffer_size}")
        if self.open_shards < 1:
            raise ValueError(f"open_shards must be >= 1, got {self.open_shards}")

    def as_dict(self) -> dict:
        return {k: int(v) if not isinstance(v, bool) else v for k, v in asdict(self).items()}


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's shard order, the same on every rank and worker."""
    if not shuffle:
        return np.arange(num_shards)
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(num_shards)


def _worker_range(n: int, env: WorkerEnv, pad: bool) -> tuple[int, int]:
    per_rank = math.ceil(n / env.world_size) if pad else n // env.world_size
    base, extra = divmod(per_rank, env.num_workers)
    start = env.rank * per_rank + env.worker_id * base + min(env.worker_id, extra)
    return start, start + base + (1 if env.worker_id < extra else 0)


def shard_stream(layout: ShardLayout, order: np.ndarray) -> np.ndarray:
    """All sample indices, shard after shard in ``order`` (each shard front to back)."""
    sizes = layout.sizes[order]
    if not len(sizes) or not sizes.sum():
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(layout.first[order] - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    return starts + np.arange(int(sizes.sum()), dtype=np.int64)


def _stream_positions(layout: ShardLayout, order: np.ndarray, start: int, stop: int,
                      remaining: np.ndarray | None = None, consumed: np.ndarray | None = None) -> np.ndarray:
    """``shard_stream(layout, order)[np.arange(start, stop) % n]``, built for those positions only:
    only the shards they fall in are expanded (O(stop - start + a shard), not O(N)).

    ``consumed``: a mask of samples taken out of the stream; ``remaining``: samples each shard keeps."""
    sizes = (layout.sizes if remaining is None else remaining)[order]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    n = int(bounds[-1])
    parts, pos = [], start
    while pos < stop and n:
        a = pos % n
        b = min(n, a + stop - pos)
        k0 = int(np.searchsorted(bounds, a, side="right")) - 1
        k1 = int(np.searchsorted(bounds, b, side="left"))
        run = shard_stream(layout, order[k0:k1])
        if consumed is not None:
            run = run[~consumed[run]]
        parts.append(run[a - int(bounds[k0]):b - int(bounds[k0])])
        pos += b - a
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _consumed_per_shard(layout: ShardLayout, consumed: np.ndarray) -> np.ndarray:
    """How many samples of each shard ``consumed`` (a mask over all samples) marks."""
    out = np.zeros(len(layout.sizes), dtype=np.int64)
    full = np.flatnonzero(layout.sizes > 0)
    firsts = layout.first[full]
    if len(full) and firsts[0] == 0 and np.array_equal(firsts[1:], np.cumsum(layout.sizes[full])[:-1]):
        # shards hold consecutive samples (as the packer writes them): sums per segment, no N-sized temporary
        out[full] = np.add.reduceat(consumed.view(np.uint8), firsts, dtype=np.int64)
    else:
        np.add.at(out, layout.shard_of[np.flatnonzero(consumed)], 1)
    return out


def interleave(samples: np.ndarray, shards: np.ndarray, open_shards: int, rng: np.random.Generator) -> np.ndarray:
    """Read ``open_shards`` runs at once: each next sample comes from a random open run.

    A run is a maximal stretch of ``samples`` from one shard; runs keep their
    internal order (sequential reads), and a finished run is replaced by the
    next one in ``samples``. Step ``t`` takes from open run ``int(u_t * open)``
    (``u_t`` the generator's ``t``-th uniform, ``open`` the runs open then; a
    finished run with none left to replace it closes and the later ones move
    down one place).

    Vectorized: while the number of open runs stays ``m``, the place each step
    takes from is known up front, so each run's steps are found with numpy and
    only the events (a run finishing: one per run) are visited in Python.
    """
    if len(samples) == 0 or open_shards <= 1:
        return samples
    return _interleave_runs(samples, np.flatnonzero(np.diff(shards)) + 1, open_shards, rng)


_CHUNK = 1 << 16  # elements of a share's temporaries made at a time (their peak stays a chunk, not a share)


def _chunk(n: int, most: int = _CHUNK) -> int:
    """Elements worked at a time on a share of ``n``: at most ``most``, and an eighth of the share when
    that is less (at least 1,024), so that the temporaries stay a small part of the share at every size."""
    return max(1024, min(most, n >> 3))


def _run_cuts(shard_of: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(np.diff(shard_of[samples])) + 1`` (where a run of one shard ends), a chunk at a
    time: no share-sized array of shard numbers."""
    parts, step = [np.zeros(0, dtype=np.int64)], _chunk(len(samples))
    for lo in range(0, len(samples) - 1, step):
        shards = shard_of[samples[lo:lo + step + 1]]
        parts.append(np.flatnonzero(shards[1:] != shards[:-1]) + (lo + 1))
    return np.concatenate(parts)


def _places(rng: np.random.Generator, n: int, t: int, m: int) -> np.ndarray:
    """``(picks[t:] * m).astype(np.int64)`` for ``picks = rng.random(n)`` drawn by ``rng`` from where it
    is now, the same values in one byte each (m <= 255), a chunk at a time: neither the ``n`` picks nor
    a float temporary of them is kept. ``rng`` ends as ``rng.random(n)`` leaves it (a generator gives the
    same doubles drawn in chunks as in one call); the ``t`` picks before are drawn and dropped."""
    step = _chunk(n)
    for lo in range(0, t, step):
        rng.random(min(step, t - lo))
    place = np.empty(n - t, dtype=np.uint8 if m <= 255 else np.int64)
    for lo in range(0, n - t, step):
        place[lo:lo + step] = rng.random(min(step, n - t - lo)) * m  # truncated toward zero, as astype does
    return place


def _interleave_runs(samples: np.ndarray, cuts: np.ndarray, open_shards: int, rng: np.random.Generator) -> np.ndarray:
    """:func:`interleave` given where its runs start (``cuts``, after the first); the arrays it keeps per
    sample are the output, a byte per step and a 4-byte step index. The picks (``rng.random(n)``) are
    drawn again from a copy of the generator for each phase after the first (phases: at most
    ``open_shards``), instead of keeping 8 bytes per sample."""
    n = len(samples)
    if len(cuts) == 0:
        return samples
    bounds = np.concatenate([[0], cuts, [n]]).tolist()
    runs = list(zip(bounds[:-1], bounds[1:]))
    start = copy.deepcopy(rng)  # as it is before the picks: draws them again for the later phases
    out = np.empty(n, dtype=np.int64)
    pos = [r[0] for r in runs[:open_shards]]  # per open place: next position in samples, and its end
    end = [r[1] for r in runs[:open_shards]]
    pending, t = len(pos), 0
    step_type = np.int32 if n < 1 << 31 else np.int64
    while pos:  # one phase per number of open runs
        m = len(pos)
        place = _places(rng if t == 0 else copy.deepcopy(start), n, t, m)  # rng: drawn past the n picks
        steps = []  # the steps each place takes, in order
        for k in range(m):
            taken = np.flatnonzero(place == k)
            taken += t
            steps.append(taken.astype(step_type))
            del taken
        del place
        used = [0] * m
        events: list[tuple[int, int]] = []

        def push(k: int) -> None:
            last = used[k] + end[k] - pos[k] - 1
            if last < len(steps[k]):
                heapq.heappush(events, (int(steps[k][last]), k))

        for k in range(m):
            push(k)
        while True:
            e, k = heapq.heappop(events)  # place k's run takes its last sample at step e
            need = end[k] - pos[k]
            out[steps[k][used[k]:used[k] + need]] = samples[pos[k]:end[k]]
            used[k] += need
            if pending < len(runs):
                pos[k], end[k] = runs[pending]
                pending += 1
                push(k)
                continue
            for j in range(m):  # no run to replace it: the others took their steps before e
                if j != k:
                    took = int(np.searchsorted(steps[j], e)) - used[j]
                    out[steps[j][used[j]:used[j] + took]] = samples[pos[j]:pos[j] + took]
                    pos[j] += took
            del pos[k], end[k]
            t = e + 1
            break
    return out


INT_BLOCK = 1 << 16  # indices turned into Python ints at a time by as_ints


def as_ints(indices: np.ndarray) -> Iterator[int]:
    """The values of ``indices`` as Python ints, :data:`INT_BLOCK` at a time: iterating an epoch's
    order without its whole ``tolist()`` (36 B per sample: 56 MB per worker at 100M samples)."""
    for lo in range(0, len(indices), INT_BLOCK):
        yield from indices[lo:lo + INT_BLOCK].tolist()


_SHUFFLE_CHUNK = 1 << 15  # steps of buffer_shuffle worked at a time: their arrays stay in the CPU's cache


def buffer_shuffle(samples: np.ndarray, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """Shuffle through a buffer of ``buffer_size``: once it is full, each incoming sample
    replaces a random one, which is emitted; the rest is emitted shuffled at the end.

    Vectorized: step ``t`` emits what the buffer place it picks last received (the sample of
    the previous step that picked that place, or what the place held before). The steps are
    worked in chunks of :data:`_SHUFFLE_CHUNK`, the buffer's contents carried from one chunk to
    the next: every gather and scatter stays within a chunk (or the buffer), so the cost per
    sample does not grow with the share once it outgrows the cache. Within a chunk the steps are
    grouped by place with a stable sort of 16-bit keys, which numpy does in one radix pass."""
    if len(samples) <= 1:
        return samples
    return _buffer_shuffle(samples, buffer_size, rng, np.empty(len(samples), dtype=np.int64))


def _buffer_shuffle(samples: np.ndarray, buffer_size: int, rng: np.random.Generator, out: np.ndarray) -> np.ndarray:
    """:func:`buffer_shuffle` into ``out``, which may be ``samples`` itself (an array the caller owns): a
    chunk reads all its incoming samples (``size`` places ahead) before it writes its steps. The picks
    are drawn a chunk at a time (a generator gives the same values, and ends in the same state, as in
    one draw); chunks are at most :data:`_SHUFFLE_CHUNK` steps and an eighth of the share."""
    n = len(samples)
    size = min(buffer_size, n)
    steps = n - size
    buf = np.array(samples[:size], dtype=np.int64)  # buf[p]: what place p holds now
    narrow = size <= 1 << 16
    every = _chunk(steps, _SHUFFLE_CHUNK)
    for lo in range(0, steps, every):
        hi = min(steps, lo + every)
        chunk = rng.integers(size, size=hi - lo)
        incoming = samples[size + lo:size + hi]  # a view, all read before out[lo:hi] is written
        by_place = np.argsort(chunk.astype(np.uint16) if narrow else chunk, kind="stable")  # by place, in time order
        place = chunk[by_place]
        first = np.ones(hi - lo, dtype=bool)  # the chunk's first step at its place: it emits what the buffer holds
        first[1:] = place[1:] != place[:-1]
        emitted = np.empty(hi - lo, dtype=np.int64)
        emitted[first] = buf[place[first]]
        later = np.flatnonzero(~first)  # a later step emits what the step before it at its place brought
        emitted[later] = incoming[by_place[later - 1]]
        last = np.ones(hi - lo, dtype=bool)  # each place keeps what its last step in the chunk brought
        last[:-1] = first[1:]
        buf[place[last]] = incoming[by_place[last]]
        out[lo + by_place] = emitted
    rng.shuffle(buf)
    out[steps:] = buf
    return out


def worker_order(layout: ShardLayout, settings: ShardSettings, epoch: int, env: WorkerEnv,
                 consumed: np.ndarray | None = None) -> np.ndarray:
    """Sample indices worker ``env`` delivers this epoch, in order (steps 1-4 of the module doc).

    ``consumed``: a mask of samples already delivered this epoch (a resume with
    other settings): they are removed from the stream before it is split.

    Only this worker's part of the stream is built (the shard order and per-shard counts are
    O(shards)): memory and time O(N / (ranks x workers)) plus a shard, the whole epoch never.
    """
    remaining = None if consumed is None else layout.sizes - _consumed_per_shard(layout, consumed)
    return _worker_order(layout, settings, epoch, env, consumed, remaining)


def _worker_order(layout: ShardLayout, settings: ShardSettings, epoch: int, env: WorkerEnv,
                  consumed: np.ndarray | None, remaining: np.ndarray | None) -> np.ndarray:
    order = shard_order(len(layout.sizes), settings.seed, epoch, settings.shuffle)
    n = int((layout.sizes if remaining is None else remaining).sum())
    start, stop = _worker_range(n, env, settings.pad)
    if n == 0 or stop <= start:
        return np.zeros(0, dtype=np.int64)
    return _shuffle_share(layout, settings, epoch, env, _stream_positions(layout, order, start, stop, remaining,
                                                                          consumed))


def _shuffle_share(layout: ShardLayout, settings: ShardSettings, epoch: int, env: WorkerEnv,
                   samples: np.ndarray) -> np.ndarray:
    """Steps 3 and 4 of the module doc on worker ``env``'s slice of the stream."""
    if not settings.shuffle or not len(samples):
        return samples
    rng = np.random.default_rng([settings.seed, epoch, env.rank, env.worker_id])
    # interleave and buffer_shuffle as their definitions say, with a smaller peak: the runs found without a
    # share of shard numbers, and the buffer shuffle done in place on the interleaved array (this one's own)
    mixed = samples if settings.open_shards <= 1 else _interleave_runs(
        samples, _run_cuts(layout.shard_of, samples), settings.open_shards, rng)
    if len(mixed) <= 1:
        return mixed
    return _buffer_shuffle(mixed, settings.buffer_size, rng, mixed if mixed is not samples else np.empty_like(mixed))


# --------------------------------------------------------------------------- loader workers


def batch_counts(lengths: Iterable[int], batch_size: int, drop_last: bool) -> list[int]:
    """Batches each loader worker makes of its ``lengths`` samples."""
    return [n // batch_size if drop_last else -(-n // batch_size) for n in lengths]


def round_robin(per_worker: Sequence[Sequence]) -> list:
    """The order a DataLoader delivers its workers' batches: round-robin, skipping finished ones."""
    out, depth = [], max((len(b) for b in per_worker), default=0)
    for k in range(depth):
        out += [b[k] for b in per_worker if k < len(b)]
    return out


def consumed_batches(counts: Sequence[int], delivered: int) -> tuple[list[int], int]:
    """After ``delivered`` batches of a round-robin over workers with ``counts`` batches each:
    batches taken from each worker, and the worker whose batch comes next."""
    if delivered > sum(counts):
        raise ValueError(f"{delivered} batches delivered, but the epoch has only {sum(counts)}")
    taken, nxt = [0] * len(counts), 0
    while delivered:
        if taken[nxt] < counts[nxt]:
            taken[nxt] += 1
            delivered -= 1
        nxt = (nxt + 1) % len(counts)
    return taken, nxt


def worker_lengths(n: int, world: int, workers: int, pad: bool) -> list[int]:
    """Samples each worker of a rank gets from an epoch of ``n`` (the same on every rank)."""
    return [b - a for a, b in (_worker_range(n, WorkerEnv(0, world, w, workers), pad) for w in range(workers))]


def settings_of(point: dict) -> ShardSettings:
    """The order settings a resume point records."""
    return ShardSettings(point["seed"], bool(point["shuffle"]), point["buffer_size"], point["open_shards"],
                         bool(point["pad"]))


def shards_delivered(layout: ShardLayout, epoch: int, point: dict) -> np.ndarray:
    """Mask of the samples a ShardDataset loader had delivered this epoch at ``point`` (all ranks,
    every worker): each worker's first ``taken x batch_size`` samples, where ``taken`` follows from
    the round-robin over workers. ``point["after"]``: an earlier point this run had resumed from."""
    prior = shards_delivered(layout, epoch, point["after"]) if point.get("after") else None
    settings, world, workers = settings_of(point), point["world_size"], point["num_workers"]
    n = layout.num_samples - (0 if prior is None else int(prior.sum()))
    counts = batch_counts(worker_lengths(n, world, workers, settings.pad), point["batch_size"],
                          bool(point["drop_last"]))
    taken, _ = consumed_batches(counts, point["delivered"])
    mask = np.zeros(layout.num_samples, dtype=bool) if prior is None else prior.copy()
    remaining = None if prior is None else layout.sizes - _consumed_per_shard(layout, prior)
    for rank in range(world):
        for w in range(workers):
            if taken[w]:
                order = _worker_order(layout, settings, epoch, WorkerEnv(rank, world, w, workers), prior, remaining)
                mask[order[:taken[w] * point["batch_size"]]] = True
    return mask


def is_exact(point: dict, env: WorkerEnv, settings: ShardSettings) -> bool:
    """True when resuming at ``point`` under ``env``/``settings`` can continue the uninterrupted order."""
    return (not point.get("after") and point["world_size"] == env.world_size
            and point["num_workers"] == env.num_workers and settings_of(point) == settings)


class _Remainder:
    """The stream of an epoch interrupted at ``point`` (one resume, same shard order) minus what
    was delivered, for one new worker's share, without a mask over all samples.

    Old worker ``g`` (rank-major) read stream positions ``[a_g, b_g)`` (past the end they wrap
    to the start: ``pad``) and delivered the first ``d_g`` samples of its order, all from those
    positions. So the delivered count per old range is known by arithmetic, except where the
    wrapped tail meets the start (a few ranges, built exactly); a new worker's share then lies
    in a few old ranges, and only those old workers' orders are built.
    """

    def __init__(self, layout: ShardLayout, epoch: int, point: dict) -> None:
        self.layout, self.epoch, self.old = layout, epoch, settings_of(point)
        n, world, workers, bs = layout.num_samples, point["world_size"], point["num_workers"], point["batch_size"]
        counts = batch_counts(worker_lengths(n, world, workers, self.old.pad), bs, bool(point["drop_last"]))
        taken, _ = consumed_batches(counts, point["delivered"])
        self.envs = [WorkerEnv(r, world, w, workers) for r in range(world) for w in range(workers)]
        ranges = np.array([_worker_range(n, e, self.old.pad) for e in self.envs], dtype=np.int64).reshape(-1, 2)
        self.took = np.minimum([taken[e.worker_id] * bs for e in self.envs], ranges[:, 1] - ranges[:, 0])
        self.order = shard_order(len(layout.sizes), self.old.seed, epoch, self.old.shuffle)
        self.n = n
        self._delivered: dict[int, np.ndarray] = {}
        head = max(0, int(ranges[:, 1].max(initial=0)) - n)  # positions [0, head) were read twice
        self.wrapping = [g for g in range(len(self.envs)) if ranges[g, 1] > n and self.took[g]]
        # segments of stream positions: each old range's part before the end, then what no one read
        lo, hi = np.minimum(ranges[:, 0], n), np.minimum(ranges[:, 1], n)
        self.lo, self.hi = np.append(lo, hi.max(initial=0)), np.append(hi, n)
        self.irregular = set(self.wrapping) | {g for g in range(len(self.envs)) if lo[g] < head}
        gone = np.append(self.took, 0)
        for g in self.irregular:  # a range wholly past the end read only repeats: nothing of its own is gone
            part = _stream_positions(layout, self.order, int(self.lo[g]), int(self.hi[g])) \
                if self.hi[g] > self.lo[g] else np.zeros(0, np.int64)
            gone[g] = int(np.isin(part, self._consumers(g)).sum())
        self.kept = (self.hi - self.lo) - gone  # samples left per segment
        self.kept_before = np.concatenate([[0], np.cumsum(self.kept)])

    def _of(self, g: int) -> np.ndarray:
        if g not in self._delivered:
            order = _worker_order(self.layout, self.old, self.epoch, self.envs[g], None, None)
            self._delivered[g] = order[:int(self.took[g])]
        return self._delivered[g]

    def _consumers(self, g: int) -> np.ndarray:
        """Samples that may have been delivered from segment ``g``: its worker's, and the wrapping ones'."""
        groups = {g} | (set(self.wrapping) if g in self.irregular else set())
        return np.concatenate([self._of(k) for k in sorted(groups) if k < len(self.envs)] + [np.zeros(0, np.int64)])

    def _kept(self, start: int, stop: int) -> np.ndarray:
        """Positions [start, stop) of the remaining stream (0 <= start < stop <= its length)."""
        k0 = int(np.searchsorted(self.kept_before, start, side="right")) - 1
        k1 = int(np.searchsorted(self.kept_before, stop, side="left"))
        parts = []
        for g in range(k0, k1):
            if self.kept[g] == 0:
                continue
            part = _stream_positions(self.layout, self.order, int(self.lo[g]), int(self.hi[g]))
            if self.kept[g] < len(part):
                part = part[~np.isin(part, self._consumers(g))]
            parts.append(part)
        run = np.concatenate(parts)
        return run[start - int(self.kept_before[k0]):stop - int(self.kept_before[k0])]

    def worker_order(self, settings: ShardSettings, env: WorkerEnv) -> np.ndarray:
        n = int(self.kept_before[-1])
        start, stop = _worker_range(n, env, settings.pad)
        if n == 0 or stop <= start:
            return np.zeros(0, dtype=np.int64)
        parts, pos = [], start
        while pos < stop:  # past the end of the remaining stream: wrap to its start
            a = pos % n
            b = min(n, a + stop - pos)
            parts.append(self._kept(a, b))
            pos += b - a
        return _shuffle_share(self.layout, settings, self.epoch, env, np.concatenate(parts))


def resume_order(layout: ShardLayout, settings: ShardSettings, epoch: int, env: WorkerEnv, point: dict) -> np.ndarray:
    """What worker ``env`` delivers for the rest of an epoch interrupted at ``point``.

    Exact resume (same ranks, workers and order settings; the loader also checks
    batch size and ``drop_last``, and sets ``point["exact"]``): the DataLoader
    hands out batches round-robin starting at its worker 0, while the interrupted
    run would continue with logical worker ``nxt``; so physical worker p plays
    logical worker ``(p + nxt) % W`` and skips the batches that one already
    delivered. The rest of the epoch is then batch for batch the uninterrupted
    order. Otherwise the delivered samples are removed and the remainder is split
    with the current settings: each sample once (plus padding).
    """
    if not (point.get("exact") and is_exact(point, env, settings)):
        if point.get("after") or (point["seed"], bool(point["shuffle"])) != (settings.seed, settings.shuffle):
            return worker_order(layout, settings, epoch, env, consumed=shards_delivered(layout, epoch, point))
        return _Remainder(layout, epoch, point).worker_order(settings, env)
    workers, bs = env.num_workers, point["batch_size"]
    counts = batch_counts(worker_lengths(layout.num_samples, env.world_size, workers, settings.pad), bs,
                          bool(point["drop_last"]))
    taken, nxt = consumed_batches(counts, point["delivered"])
    logical = (env.worker_id + nxt) % workers
    order = worker_order(layout, settings, epoch, WorkerEnv(env.rank, env.world_size, logical, workers))
    return order[taken[logical] * bs:]
