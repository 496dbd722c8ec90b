"""The map-style readers' epoch order (lmdb, hdf5, mmap, mixtures): a keyed permutation split over ranks.

One permutation of all N samples per ``(seed, epoch)``, cut into ranks like ``DistributedSampler``
(rank r takes positions r, r+R, r+2R, ... of the padded permutation). See :func:`rank_indices`.
The permutation is a keyed bijection (:func:`shuffle_at`) evaluated at the rank's positions only:
an epoch start or an exact resume costs O(N / R) time and memory per rank, never an N-sized array
(100M samples, 8 ranks: 12.5M values, not a permutation of 100M in every rank).

Pure functions of small integers, like the rest of :mod:`readers.order.epoch` (which re-exports
them); :class:`readers.order.sampler.EpochSampler` runs them.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MAP_ORDER", "MAP_ORDERS", "shuffle_at", "ab_domain", "permutation", "rank_positions", "rank_order",
           "rank_indices"]


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
