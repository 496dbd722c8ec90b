"""Epochs of a set length and mixtures' epochs: how many samples each source gives, and which.

``make_loader(samples_per_epoch=)`` and ``readers.mix`` (:mod:`readers.order.mixture`) describe an
epoch as counts per source (:func:`shares` of the weights); :func:`epoch_draw` turns the counts
into the epoch's list of ``(source, sample)``, each source reading its own endless shuffled stream
(:func:`source_stream`). Pure functions of small integers, like the rest of
:mod:`readers.order.epoch` (which re-exports them); :class:`readers.order.sampler.EpochSampler`
runs them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["shares", "source_stream", "epoch_draw"]


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
