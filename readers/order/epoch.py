"""The sample order of an epoch, computed from the index alone (no I/O).

Everything that decides which sample a rank / loader worker delivers, and
when, lives here as pure functions of small integers and index arrays, so
that the same code drives the readers, mid-epoch resume (which skips what was
delivered without reading it) and the shuffle-quality simulation
(``readers.order.quality``).

Map-style readers (lmdb, hdf5, mmap): one permutation of all N samples per
``(seed, epoch)``, cut into ranks like ``DistributedSampler`` (rank r takes
positions r, r+R, r+2R, ... of the padded permutation). See :func:`rank_indices`.
The permutation is a keyed bijection (:func:`shuffle_at`) evaluated at the
rank's positions only: an epoch start or an exact resume costs O(N / R) time
and memory per rank, never an N-sized array (100M samples, 8 ranks: 12.5M
values, not a permutation of 100M in every rank).

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

import heapq
import math
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from readers.contract.env import WorkerEnv

__all__ = ["ShardLayout", "ShardSettings", "shard_stream", "interleave", "buffer_shuffle",
           "worker_order", "round_robin", "batch_counts", "consumed_batches", "permutation", "rank_indices",
           "worker_lengths", "shards_delivered", "resume_order", "is_exact", "settings_of", "shares",
           "source_stream", "epoch_draw", "shuffle_at", "ab_domain", "rank_positions", "rank_order", "MAP_ORDER", "MAP_ORDERS"]


# --------------------------------------------------------------------------- map-style


#: How a map-style epoch is shuffled, as a resume point records it (``map_order``): ``"feistel-ab"``
#: (:func:`shuffle_at`, evaluated for any positions without the others, on a domain that fits n);
#: ``"feistel"``: the release before, the same kind of network on ``2^b`` values (a point saved
#: by it resumes in its own order); ``"rng"``: numpy's ``default_rng([seed, epoch]).permutation(n)``
#: of all n samples, what releases before ``map_order`` existed shuffled with (a resume point
#: without the key is one of those).
MAP_ORDERS = ("feistel-ab", "feistel", "rng")
MAP_ORDER = "feistel-ab"
_ROUNDS = 8  # Feistel rounds, even (fewer left pairs of nearby positions correlated at 1,000 samples)
_SMALL = 1 << 16  # below this many samples the whole permutation is numpy's (cheap, and exact for tiny n)
_BLOCK = 1 << 16  # positions per vectorized step (temporaries of 512 KB: they stay in cache)
_MUL = np.uint64(0x9E3779B97F4A7C15)  # odd; the high bits of x * _MUL mix every bit of x
_32 = np.uint64(32)


def _round_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([int(seed), int(epoch), 0xFE15]).integers(0, 2**63, _ROUNDS, dtype=np.uint64)


def _feistel(x: np.ndarray, bits: int, keys: np.ndarray) -> np.ndarray:
    """One pass of the keyed Feistel network over ``bits``-bit values (a bijection of them): the
    ``"feistel"`` order, kept so that a resume point saved with it resumes in it.

    ``x`` is cut into a high part of ``bits - bits // 2`` bits and a low part of ``bits // 2``;
    each round maps ``(L, R)`` to ``(R, L xor F(R))``, the new right part as wide as the old left
    one (an unbalanced network when ``bits`` is odd); ``F(R)`` is the top bits of
    ``(R xor key) x _MUL`` (multiply-shift hashing)."""
    wl, wr = bits - bits // 2, bits // 2
    left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
    for k in keys:
        z = right ^ k
        z *= _MUL
        z >>= np.uint64(64 - wl)
        z ^= left
        left, right, wl, wr = right, z, wr, wl
    return (left << np.uint64(wr)) | right


def ab_domain(n: int) -> tuple[int, int]:
    """``(a, b)`` with ``a = ceil(sqrt(n))``, ``b = ceil(n / a)``: ``n <= a * b < n + a``, so
    a bijection of ``[0, a * b)`` restricted to ``[0, n)`` re-encrypts fewer than one value in
    ``sqrt(n)`` (one in 256 at 65,536 samples, one in 10,000 at 100M)."""
    a = math.isqrt(n - 1) + 1
    return a, -(-n // a)


def _feistel_ab(x: np.ndarray, a: int, b: int, keys: np.ndarray) -> np.ndarray:
    """One pass of a keyed Feistel network on ``[0, a * b)`` (a bijection of it; ``a, b < 2^32``).

    ``x = L * b + R`` with ``L < a``, ``R < b``; each round maps ``(L, R)`` to
    ``(R, (L + F(R)) mod m)``, ``m`` the range of ``L``, so the two parts swap ranges every round and
    an even number of rounds ends on ``(a, b)`` again. ``F(R)`` is the top 32 bits of
    ``(R xor key) x _MUL`` scaled into ``[0, m)`` by a multiply-shift (no division); the sum is
    reduced by ``min(s, s - m)`` (unsigned: ``s - m`` wraps past ``s`` when ``s < m``)."""
    left, right = np.divmod(x, np.uint64(b))
    ml, mr = np.uint64(a), np.uint64(b)
    z, t = np.empty_like(left), np.empty_like(left)  # every step in place: no temporaries per round
    for k in keys:
        np.bitwise_xor(right, k, out=z)
        z *= _MUL
        z >>= _32
        z *= ml
        z >>= _32
        z += left
        np.subtract(z, ml, out=t)
        np.minimum(z, t, out=z)
        left, right, z, ml, mr = right, z, left, mr, ml
    left *= np.uint64(b)
    left += right
    return left


def shuffle_at(positions: np.ndarray, n: int, seed: int, epoch: int, kind: str = MAP_ORDER) -> np.ndarray:
    """``perm[positions]`` of the epoch's permutation of ``n`` samples, computed for these positions
    alone: O(len(positions)) time and memory, never the other ``n`` entries.

    The permutation is a keyed Feistel network (keys drawn from ``(seed, epoch)``) on the
    ``a x b`` values of :func:`ab_domain` (``kind="feistel-ab"``) or, for a resume point saved by
    the release before (``"feistel"``), on the ``2^b`` values of ``b = bits(n - 1)`` bits
    (``2^b < 2n``); either is restricted to ``[0, n)`` by cycle walking (a value at or past ``n``
    is encrypted again until it lands inside: a bijection of ``[0, n)``). On ``a x b`` fewer than
    one value in ``sqrt(n)`` walks, so the cost per position does not depend on where n falls
    (on ``2^b`` it varied 2x: up to 2 passes expected). Below ``_SMALL`` samples it is numpy's
    permutation of all of them (cheap there; a Feistel network on a few bits is a poor shuffle).
    Its shuffle quality is numpy's permutation's (``readers.order.quality``, ``benchmarks/bench_shuffle.py``).
    """
    if kind not in ("feistel-ab", "feistel"):
        raise ValueError(f"unknown keyed map-style order {kind!r} (known: feistel-ab, feistel)")
    positions = np.asarray(positions, dtype=np.int64)
    if n <= 1 or len(positions) == 0:
        return positions.copy()
    if n < _SMALL:
        return np.random.default_rng([int(seed), int(epoch), 0xFE15]).permutation(n)[positions]
    keys = _round_keys(seed, epoch)
    if kind == "feistel":
        bits = (n - 1).bit_length()

        def encrypt(v: np.ndarray) -> np.ndarray:
            return _feistel(v, bits, keys)
    else:
        a, b = ab_domain(n)

        def encrypt(v: np.ndarray) -> np.ndarray:
            return _feistel_ab(v, a, b, keys)
    out = np.empty(len(positions), dtype=np.int64)
    limit = np.uint64(n)
    for lo in range(0, len(positions), _BLOCK):
        y = encrypt(positions[lo:lo + _BLOCK].astype(np.uint64))
        outside = np.flatnonzero(y >= limit)
        while len(outside):
            y[outside] = encrypt(y[outside])
            outside = outside[y[outside] >= limit]
        out[lo:lo + _BLOCK] = y.astype(np.int64)
    return out


def permutation(n: int, seed: int, epoch: int, shuffle: bool = True, kind: str = MAP_ORDER) -> np.ndarray:
    """The epoch's order of all ``n`` samples (``arange(n)`` without shuffling); ``kind`` one of
    :data:`MAP_ORDERS` (``"rng"`` for a resume point saved by a release before ``map_order``)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    if kind == "rng":
        return np.random.default_rng([int(seed), int(epoch)]).permutation(n)
    if kind not in MAP_ORDERS:
        raise ValueError(f"unknown map-style order {kind!r} (known: {', '.join(MAP_ORDERS)})")
    return shuffle_at(np.arange(n, dtype=np.int64), n, seed, epoch, kind)


def rank_positions(n: int, world: int, rank: int, drop_last: bool = False, start: int = 0,
                   stop: int | None = None) -> np.ndarray:
    """Positions of the epoch's list that rank ``rank`` of ``world`` takes, its ``start``-th to
    ``stop``-th (default: to its end): ``rank, rank + world, ...`` of the list cut (``drop_last``)
    or padded to a multiple of ``world``, padding repeating the list's start (``DistributedSampler``'s
    split); a position at or past ``n`` is given as the one it repeats."""
    size = n - n % world if drop_last else (n + -n % world if n else 0)
    end = size if stop is None else min(size, rank + stop * world)
    pos = np.arange(rank + start * world, end, world, dtype=np.int64)
    if n and len(pos) and pos[-1] >= n:
        pos[pos >= n] = (pos[pos >= n] - n) % n
    return pos


def rank_order(n: int, seed: int, epoch: int, shuffle: bool, world: int, rank: int, drop_last: bool = False,
               start: int = 0) -> np.ndarray:
    """:func:`rank_indices` without a resume, from the rank's ``start``-th sample on, computed for
    that share alone (O(n / world), positions made a block at a time): what an epoch start and an
    exact resume cost."""
    size = n - n % world if drop_last else (n + -n % world if n else 0)
    count = max(0, len(range(rank + start * world, size, world)))
    out = np.empty(count, dtype=np.int64)
    for lo in range(0, count, _BLOCK):
        pos = rank_positions(n, world, rank, drop_last, start + lo, start + lo + _BLOCK)
        out[lo:lo + len(pos)] = shuffle_at(pos, n, seed, epoch) if shuffle else pos
    return out


def _split_ranks(order: np.ndarray, pad_from: np.ndarray, world: int, rank: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s share of ``order``: positions rank, rank+world, ... after padding or cutting
    ``order`` to a multiple of ``world`` (padding repeats ``pad_from``'s first samples, as
    ``DistributedSampler`` repeats the permutation's start)."""
    if drop_last:
        order = order[:len(order) - len(order) % world]
    else:
        missing = -len(order) % world
        if missing and len(pad_from):
            reps = math.ceil(missing / len(pad_from))
            order = np.concatenate([order, np.tile(pad_from, reps)[:missing]])
    return order[rank::world]


def rank_indices(n: int, seed: int, epoch: int, shuffle: bool, world: int, rank: int, drop_last: bool = False,
                 consumed: np.ndarray | None = None, perm: np.ndarray | None = None) -> np.ndarray:
    """The sample indices rank ``rank`` of ``world`` reads this epoch, in order.

    ``consumed``: a boolean mask of samples already delivered this epoch (a
    resume); they are left out and the rest is split over the ranks. When the
    consumed samples are the first ``G`` of this same permutation and ``G`` is a
    multiple of ``world`` (a resume with the same settings), the result equals
    the uninterrupted rank's list from position ``G / world`` on. ``perm``: the epoch's
    permutation, when the caller has computed it already.
    """
    if consumed is None and perm is None:
        return rank_order(n, seed, epoch, shuffle, world, rank, drop_last)
    if perm is None:
        perm = permutation(n, seed, epoch, shuffle)
    rest = perm if consumed is None else perm[~consumed[perm]]
    return _split_ranks(rest, perm, world, rank, drop_last)


# --------------------------------------------------------------------------- epochs of a set length, mixtures


def shares(weights: Sequence[float], total: int) -> np.ndarray:
    """Split ``total`` samples in proportion to ``weights`` (largest remainder: each share is
    ``floor`` or ``ceil`` of ``total x w / sum(w)``, ties to the earlier source)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {list(weights)}")
    exact = total * w / w.sum()
    out = np.floor(exact).astype(np.int64)
    rest = int(total - out.sum())
    if rest:
        out[np.argsort(-(exact - out), kind="stable")[:rest]] += 1
    return out


def source_stream(n: int, seed: int, source: int, start: int, count: int, shuffle: bool = True) -> np.ndarray:
    """Positions ``[start, start + count)`` of source ``source``'s endless stream of its ``n``
    samples: pass after pass, each pass a new permutation (``(seed, source, pass)``), so no sample
    repeats within ``n`` consecutive positions of one pass. Builds only the passes it touches."""
    if count <= 0 or n <= 0:
        return np.zeros(0, dtype=np.int64)
    first, last = start // n, (start + count - 1) // n
    parts = [np.arange(n, dtype=np.int64) if not shuffle
             else np.random.default_rng([int(seed), int(source), int(p), 0x57AE]).permutation(n)
             for p in range(first, last + 1)]
    run = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return run[start - first * n:start - first * n + count]


def _stream_start(n: int, count: int, epoch: int) -> int:
    """Where epoch ``epoch`` starts in a source's stream when it takes ``count`` of its ``n``
    samples per epoch: epochs never straddle two passes (so no sample repeats within an epoch
    while ``count <= n``). ``count <= n``: ``k = n // count`` epochs share a pass, in disjoint
    stretches (the pass's last ``n - k x count`` samples are skipped: each pass is a new
    permutation, so a different few each time); ``count > n``: each epoch starts a new pass
    and takes ``ceil(count / n)`` of them."""
    if count <= n:
        k = n // count
        return (epoch // k) * n + (epoch % k) * count
    return epoch * math.ceil(count / n) * n


def epoch_draw(sizes: Sequence[int], counts: Sequence[int], seed: int, epoch: int, shuffle: bool = True,
               replacement: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """An epoch of ``sum(counts)`` samples, ``counts[j]`` from source ``j`` of ``sizes[j]`` samples.

    Returns ``(source, sample)``: per position of the epoch, the source and the sample index in
    that source. Without replacement, source ``j`` gives ``c_j`` consecutive positions of its
    :func:`source_stream`, from where the previous epoch stopped in the same pass when the
    rest of the pass holds ``c_j`` (else from the next pass: :func:`_stream_start`): within an
    epoch a source repeats a sample only when its share exceeds it (then its next pass, a new
    shuffle), and over the epochs its samples come equally often.
    With replacement: ``c_j`` draws, uniform over the source, seeded by ``(seed, source, epoch)``.
    The sources are interleaved by a random permutation of the epoch's positions seeded by
    ``(seed, epoch)`` (``shuffle=False``: evenly, by ``(t + 1/2) / c_j``), so every share of the
    epoch holds about ``c_j / sum(c)`` of source ``j``. O(epoch length), whatever the epoch number.
    """
    counts_arr = np.asarray(counts, dtype=np.int64)
    total = int(counts_arr.sum())
    which = np.repeat(np.arange(len(counts_arr), dtype=np.int64), counts_arr)
    if shuffle:
        which = which[np.random.default_rng([int(seed), int(epoch), 0x3170]).permutation(total)]
    elif len(counts_arr) > 1:
        ranks = np.concatenate([(np.arange(c) + 0.5) / c for c in counts_arr if c])
        which = which[np.argsort(ranks, kind="stable")]
    sample = np.empty(total, dtype=np.int64)
    for j, (n, c) in enumerate(zip(sizes, counts_arr.tolist())):
        if not c:
            continue
        if replacement:
            part = np.random.default_rng([int(seed), j, int(epoch), 0x4E91]).integers(int(n), size=c)
        else:
            part = source_stream(int(n), seed, j, _stream_start(int(n), c, int(epoch)), c, shuffle)
        sample[which == j] = part
    return which, sample


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
    n = len(samples)
    if n == 0 or open_shards <= 1:
        return samples
    cuts = np.flatnonzero(np.diff(shards)) + 1
    if len(cuts) == 0:
        return samples
    bounds = np.concatenate([[0], cuts, [n]]).tolist()
    runs = list(zip(bounds[:-1], bounds[1:]))
    picks = rng.random(n)
    out = np.empty(n, dtype=np.int64)
    pos = [r[0] for r in runs[:open_shards]]  # per open place: next position in samples, and its end
    end = [r[1] for r in runs[:open_shards]]
    pending, t = len(pos), 0
    while pos:  # one phase per number of open runs
        m = len(pos)
        place = (picks[t:] * m).astype(np.int64)
        steps = [t + np.flatnonzero(place == k) for k in range(m)]  # the steps each place takes, in order
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
    n = len(samples)
    if n <= 1:
        return samples
    size = min(buffer_size, n)
    steps = n - size
    picks = rng.integers(size, size=steps) if steps else np.zeros(0, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    buf = np.array(samples[:size], dtype=np.int64)  # buf[p]: what place p holds now
    narrow = size <= 1 << 16
    for lo in range(0, steps, _SHUFFLE_CHUNK):
        hi = min(steps, lo + _SHUFFLE_CHUNK)
        chunk = picks[lo:hi]
        incoming = samples[size + lo:size + hi]
        by_place = np.argsort(chunk.astype(np.uint16) if narrow else chunk, kind="stable")  # by place, in time order
        place = chunk[by_place]
        first = np.ones(hi - lo, dtype=bool)  # the chunk's first step at its place: it emits what the buffer holds
        first[1:] = place[1:] != place[:-1]
        emitted = np.empty(hi - lo, dtype=np.int64)
        emitted[first] = buf[place[first]]
        later = np.flatnonzero(~first)  # a later step emits what the step before it at its place brought
        emitted[later] = incoming[by_place[later - 1]]
        out[lo + by_place] = emitted
        last = np.ones(hi - lo, dtype=bool)  # each place keeps what its last step in the chunk brought
        last[:-1] = first[1:]
        buf[place[last]] = incoming[by_place[last]]
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
    samples = interleave(samples, layout.shard_of[samples], settings.open_shards, rng)
    return buffer_shuffle(samples, settings.buffer_size, rng)


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
