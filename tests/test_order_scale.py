"""The epoch order at scale: each loader worker builds only its own share (memory O(N / workers),
vectorized), identical to the step-by-step definition; a map-style rank computes only its share of
the epoch's permutation (an epoch start and an exact resume: O(N / ranks)), and a resume at another
world size one permutation, not one per rank.

The reference functions below are the step-by-step definitions the readers used before they were
vectorized (one Python step per sample over the whole epoch's stream): the order must stay what it
was, so runs resume the same way across versions.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import readers.contract.env
import readers.order.epoch
import readers.order.mapstyle
import readers.order.sampler
from readers.contract.env import WorkerEnv
from readers.order.epoch import (ShardLayout, ShardSettings, batch_counts, buffer_shuffle, interleave, resume_order,
                           shard_order, shard_stream, worker_lengths, worker_order)
from readers.order.sampler import EpochSampler


def ref_interleave(samples, shards, open_shards, rng):
    n = len(samples)
    if n == 0 or open_shards <= 1:
        return samples
    cuts = np.flatnonzero(np.diff(shards)) + 1
    if len(cuts) == 0:
        return samples
    bounds = np.concatenate([[0], cuts, [n]]).tolist()
    runs = list(zip(bounds[:-1], bounds[1:]))
    pending, active = iter(runs[open_shards:]), [list(r) for r in runs[:open_shards]]
    picks, out = rng.random(n), np.empty(n, dtype=np.int64)
    for t in range(n):
        k = int(picks[t] * len(active))
        run = active[k]
        out[t] = samples[run[0]]
        run[0] += 1
        if run[0] == run[1]:
            nxt = next(pending, None)
            if nxt is None:
                active.pop(k)
            else:
                active[k] = list(nxt)
    return out


def ref_buffer_shuffle(samples, buffer_size, rng):
    n = len(samples)
    if n <= 1:
        return samples
    size = min(buffer_size, n)
    buf = samples[:size].tolist()
    picks = rng.integers(size, size=n - size).tolist() if n > size else []
    out = np.empty(n, dtype=np.int64)
    for t, (i, j) in enumerate(zip(samples[size:].tolist(), picks)):
        out[t] = buf[j]
        buf[j] = i
    rng.shuffle(buf)
    out[n - size:] = buf
    return out


def ref_worker_order(layout, s, epoch, env, consumed=None):
    stream = shard_stream(layout, shard_order(len(layout.sizes), s.seed, epoch, s.shuffle))
    if consumed is not None:
        stream = stream[~consumed[stream]]
    n = len(stream)
    per_rank = -(-n // env.world_size) if s.pad else n // env.world_size
    base, extra = divmod(per_rank, env.num_workers)
    start = env.rank * per_rank + env.worker_id * base + min(env.worker_id, extra)
    stop = start + base + (1 if env.worker_id < extra else 0)
    if n == 0 or stop <= start:
        return np.zeros(0, dtype=np.int64)
    samples = stream[np.arange(start, stop) % n]
    if not s.shuffle:
        return samples
    rng = np.random.default_rng([s.seed, epoch, env.rank, env.worker_id])
    samples = ref_interleave(samples, layout.shard_of[samples], s.open_shards, rng)
    return ref_buffer_shuffle(samples, s.buffer_size, rng)


def _layout(sizes, stored_shuffled: bool) -> ShardLayout:
    """Shards of ``sizes``; ``stored_shuffled``: their samples not stored in shard order."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if not stored_shuffled:
        return ShardLayout.from_sizes(sizes)
    place = np.random.default_rng(len(sizes)).permutation(len(sizes))  # shard place[k] stored k-th
    first = np.zeros(len(sizes), dtype=np.int64)
    first[place] = np.concatenate([[0], np.cumsum(sizes[place])[:-1]])
    shard_of = np.empty(int(sizes.sum()), dtype=np.int32)
    for s in range(len(sizes)):
        shard_of[first[s]:first[s] + sizes[s]] = s
    return ShardLayout(sizes, first, shard_of)


@settings(max_examples=400, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=12), cut=st.floats(0, 1),
       open_shards=st.integers(0, 6), buffer_size=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       shuffled_samples=st.booleans())
def test_vectorized_interleave_and_buffer_equal_the_step_by_step_ones(sizes, cut, open_shards, buffer_size, seed,
                                                                       shuffled_samples):
    layout = ShardLayout.from_sizes(sizes)
    samples = np.random.default_rng(seed).permutation(layout.num_samples) if shuffled_samples \
        else np.arange(layout.num_samples)
    samples = samples[:int(cut * len(samples))]
    shards = layout.shard_of[samples]
    assert np.array_equal(interleave(samples, shards, open_shards, np.random.default_rng(seed)),
                          ref_interleave(samples, shards, open_shards, np.random.default_rng(seed)))
    assert np.array_equal(buffer_shuffle(samples, buffer_size, np.random.default_rng(seed)),
                          ref_buffer_shuffle(samples, buffer_size, np.random.default_rng(seed)))


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_buffer_shuffle_in_chunks_equals_the_step_by_step_one(monkeypatch, chunk):
    """The steps are worked in chunks, the buffer carried between them: any chunk size gives the step-by-step
    order, for buffers that fit 16-bit sort keys and for one that does not."""
    import readers.order.epoch as order

    monkeypatch.setattr(order, "_SHUFFLE_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    wide = (1 << 16) + 3
    cases = [(b, n) for b in (1, 2, 5, 100, wide) for n in (0, 1, 2, 9, 300, 2000)] + [(wide, wide + 40)]
    for buffer_size, n in cases:
        samples = rng.permutation(3 * n)[:n]
        seed = int(rng.integers(2**32))
        assert np.array_equal(buffer_shuffle(samples, buffer_size, np.random.default_rng(seed)),
                              ref_buffer_shuffle(samples, buffer_size, np.random.default_rng(seed))), (buffer_size, n)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 25), min_size=1, max_size=15), world=st.integers(1, 4),
       workers=st.integers(1, 4), seed=st.integers(0, 1000), epoch=st.integers(0, 50), shuffle=st.booleans(),
       pad=st.booleans(), open_shards=st.integers(1, 5), buffer_size=st.integers(1, 20),
       consumed_share=st.sampled_from([None, 0.0, 0.3, 0.9, 1.0]), stored_shuffled=st.booleans())
def test_worker_share_equals_the_share_of_the_whole_epoch(sizes, world, workers, seed, epoch, shuffle, pad,
                                                           open_shards, buffer_size, consumed_share, stored_shuffled):
    layout = _layout(sizes, stored_shuffled)
    s = ShardSettings(seed, shuffle, buffer_size, open_shards, pad)
    consumed = None
    if consumed_share is not None:
        consumed = np.random.default_rng(seed).random(layout.num_samples) < consumed_share
    for rank in range(world):
        for w in range(workers):
            env = WorkerEnv(rank, world, w, workers)
            assert np.array_equal(worker_order(layout, s, epoch, env, consumed),
                                  ref_worker_order(layout, s, epoch, env, consumed)), (rank, w)


def _peak_bytes(fn, *args) -> int:
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_workers_order_costs_memory_in_its_share_not_the_epoch():
    settings_ = ShardSettings(seed=1)
    peaks = {}
    for n in (200_000, 800_000):
        layout = ShardLayout.from_sizes([1000] * (n // 1000))
        for world, workers in ((1, 1), (2, 8)):
            env = WorkerEnv(world - 1, world, workers - 1, workers)
            peaks[n, world * workers] = _peak_bytes(worker_order, layout, settings_, 3, env)
    for n in (200_000, 800_000):
        share = n // 16
        assert peaks[n, 16] < 200 * share, f"{peaks[n, 16]} B for a share of {share} samples"
        assert peaks[n, 16] < peaks[n, 1] / 8, "16 workers' shares do not cost 1/16 of the epoch each"
    assert 2.5 < peaks[800_000, 16] / peaks[200_000, 16] < 6, "memory does not grow with the share"


def test_a_resume_at_another_world_size_costs_memory_in_the_shares():
    """Changed ranks: a new worker rebuilds only the few old workers' orders its share lies in;
    nothing the size of the epoch (not even a mask of 1 byte per sample) is built."""
    settings_ = ShardSettings(seed=1)
    peaks = {}
    for n in (256_000, 1_024_000):
        layout = ShardLayout.from_sizes([1000] * (n // 1000))
        for old_ranks in (2, 32):  # 8 workers each: 16 or 256 old shares, half as many new ones
            point = dict(settings_.as_dict(), batch_size=16, drop_last=False, world_size=old_ranks, num_workers=8,
                         delivered=n // (old_ranks * 8 * 16) * 8 // 2, exact=False)
            env = WorkerEnv(old_ranks // 2 - 1, old_ranks // 2, 5, 8)
            peaks[n, old_ranks] = _peak_bytes(resume_order, layout, settings_, 3, env, point)
        assert peaks[n, 2] / peaks[n, 32] > 10, f"16x smaller shares, only {peaks[n, 2] / peaks[n, 32]:.1f}x less memory"
    assert 2.5 < peaks[1_024_000, 32] / peaks[256_000, 32] < 6
    assert peaks[1_024_000, 32] < 0.6 * 1_024_000, "as much as a mask of one byte per sample"


def test_an_exact_resume_builds_one_worker_share():
    settings_ = ShardSettings(seed=1)
    n = 400_000
    layout = ShardLayout.from_sizes([1000] * (n // 1000))
    env = WorkerEnv(1, 2, 3, 8)
    counts = batch_counts(worker_lengths(n, 2, 8, True), 64, False)
    point = dict(settings_.as_dict(), batch_size=64, drop_last=False, world_size=2, num_workers=8,
                 delivered=sum(counts) // 2, exact=True)
    assert _peak_bytes(resume_order, layout, settings_, 3, env, point) < 200 * n // 16


# --------------------------------------------------------------------------- map-style resume


@pytest.fixture
def permutations(monkeypatch):
    """Counts the permutations of all n samples computed (readers.order.mapstyle.permutation, wherever it is
    called from): a rank's share is computed by shuffle_at without one."""
    calls = []
    real = readers.order.mapstyle.permutation

    def counting(n, seed, epoch, shuffle=True, kind=readers.order.mapstyle.MAP_ORDER):
        calls.append(n)
        return real(n, seed, epoch, shuffle, kind)

    for module in (readers.order.mapstyle, readers.order.epoch, readers.order.sampler):  # defined, re-exported, used
        monkeypatch.setattr(module, "permutation", counting)
    return calls


def _rank_list(n, world, rank, point=None):
    hook = readers.contract.env.worker_env_hook
    readers.contract.env.worker_env_hook = lambda: WorkerEnv(rank, world, 0, 1)  # a rank of a job, without a process group
    try:
        sampler = EpochSampler(n, seed=0, distributed=True)
        sampler.set_epoch(2)
        sampler.resume = point
        return sampler.indices()
    finally:
        readers.contract.env.worker_env_hook = hook


def _point(world, bs, delivered, **kw):
    return dict(seed=0, shuffle=True, drop_last=False, sampler_drop_last=False, world_size=world, batch_size=bs,
                delivered=delivered, map_order=readers.order.epoch.MAP_ORDER, **kw)


@pytest.mark.parametrize("n", [1, 2, 5, 16, 17, 1000, 65_535, 65_536, 65_537, 300_001])
def test_shuffle_at_is_a_permutation_and_the_ranks_split_it_as_distributed_sampler(n):
    """shuffle_at is a bijection of range(n) for every n, and each rank's share (computed alone)
    is positions rank, rank+R, ... of it, padded or cut as DistributedSampler pads or cuts."""
    perm = readers.order.epoch.permutation(n, 3, 1)
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert not np.array_equal(perm, readers.order.epoch.permutation(n, 3, 2)) or n < 3, "the epoch does not reshuffle"
    for world in (1, 3, 8):
        for drop_last in (False, True):
            padded = np.concatenate([perm, np.resize(perm, -n % world)]) if not drop_last else perm[:n - n % world]
            for rank in range(world):
                got = readers.order.epoch.rank_order(n, 3, 1, True, world, rank, drop_last)
                assert got.tolist() == padded[rank::world].tolist()


@pytest.mark.parametrize("n", [10_000, 100_000])
def test_map_resume_computes_no_permutation_of_all_samples(permutations, n):
    world, bs = 8, 32
    whole = [_rank_list(n, world, r) for r in range(world)]
    assert permutations == [], "an epoch start computed a permutation of all n samples in a rank"
    point = _point(world, bs, 10)
    exact = _rank_list(n, world, 5, point)
    assert permutations == [], "an exact resume computed a permutation of all n samples"
    assert exact.tolist() == whole[5][10 * bs:].tolist()
    rest = [_rank_list(n, 3, r, point) for r in range(3)]
    assert permutations == [n] * 3, "a resume at another world size computed a permutation per old rank"
    delivered = np.concatenate([w[:10 * bs] for w in whole])
    seen = np.concatenate([delivered] + rest)
    assert set(seen.tolist()) == set(range(n)) and len(seen) - n < 3


def test_map_epoch_start_and_exact_resume_memory_is_the_ranks_share():
    """An 8-rank epoch start or exact resume holds O(n / 8) (it held a permutation of all n: 8n bytes)."""
    n, world = 4_000_000, 8
    start = _peak_bytes(_rank_list, n, world, 5)
    resume = _peak_bytes(_rank_list, n, world, 5, _point(world, 64, 100))
    share = 8 * n // world  # the rank's list, int64
    for what, peak in (("epoch start", start), ("exact resume", resume)):
        assert peak < 2 * share + (6 << 20), f"{what}: {peak} B for a share of {share} B"
        assert peak < 8 * n / 2, f"{what}: {peak} B, as much as a permutation of all samples"


def test_a_state_saved_with_numpys_shuffle_resumes_each_remaining_sample_once():
    """A resume point from a release before map_order (numpy's permutation of all n): its delivered
    samples are those of numpy's order; the rest comes once, in this release's order."""
    n, world, bs, delivered = 5_000, 4, 16, 20
    old = np.random.default_rng([0, 2]).permutation(n)  # what that release's ranks split in epoch 2
    taken = np.concatenate([old[r::world][:delivered * bs] for r in range(world)])
    point = {k: v for k, v in _point(world, bs, delivered).items() if k != "map_order"}
    rest = [_rank_list(n, world, r, point) for r in range(world)]
    seen = np.concatenate([taken] + rest)
    assert sorted(seen.tolist()) == list(range(n))


def test_a_state_saved_with_the_power_of_two_feistel_order_resumes_each_remaining_sample_once():
    """A resume point saved by the release whose map-style order was the Feistel network on 2^b
    values (``map_order="feistel"``): its delivered samples are that order's; the rest come once."""
    n, world, bs, delivered = 70_000, 4, 64, 30
    old = readers.order.epoch.shuffle_at(np.arange(n), n, 0, 2, kind="feistel")
    assert not np.array_equal(old, readers.order.epoch.permutation(n, 0, 2)), "the two orders should differ"
    taken = np.concatenate([old[r::world][:delivered * bs] for r in range(world)])
    point = dict(_point(world, bs, delivered), map_order="feistel")
    rest = [_rank_list(n, world, r, point) for r in range(world)]
    assert sorted(np.concatenate([taken] + rest).tolist()) == list(range(n))


@pytest.mark.parametrize("n", [65_537, (1 << 20) + 1, 3_000_000, (1 << 22) - 1])
def test_map_order_encrypts_each_position_about_once_wherever_n_falls(monkeypatch, n):
    """The map-style order's cost per position is flat in n: on the ``a x b`` domain of
    ``ab_domain`` fewer than one value in sqrt(n) is re-encrypted (cycle walking). On ``2^b``
    values (the previous order) n just above a power of two re-encrypted about as many values
    as there are positions; this counts the values each network encrypted."""
    counted = {"feistel-ab": 0, "feistel": 0}
    for name, kind in (("_feistel_ab", "feistel-ab"), ("_feistel", "feistel")):
        real = getattr(readers.order.mapstyle, name)

        def counting(x, *args, _real=real, _kind=kind):
            counted[_kind] += len(x)
            return _real(x, *args)

        monkeypatch.setattr(readers.order.mapstyle, name, counting)
    positions = np.arange(0, n, 7)
    for kind in counted:
        readers.order.epoch.shuffle_at(positions, n, 1, 0, kind=kind)
    a, b = readers.order.epoch.ab_domain(n)
    assert n <= a * b < n + a
    assert counted["feistel-ab"] <= len(positions) * (1 + 3 / math.sqrt(n)) + 8
    if (n - 1) & (n - 2) == 0:  # one above a power of two: the old domain is ~2n
        assert counted["feistel"] > 1.5 * len(positions)


def test_epoch_sampler_iterates_without_a_python_int_per_sample():
    """Iterating the sampler turns its indices into Python ints a block at a time (a list of the
    whole share was 36 bytes a sample: 450 MB per rank at 100M samples and 8 ranks)."""
    n = 1_000_000
    sampler = EpochSampler(n, seed=0, distributed=False)
    tracemalloc.start()
    try:
        it = iter(sampler)
        first = [next(it) for _ in range(100_000)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert first == sampler.indices()[:100_000].tolist()
    assert peak < 16 << 20, f"{peak} B while iterating {n} indices"


def test_a_workers_order_peaks_under_30_bytes_per_sample_of_its_share():
    """Issue 37 item 5: the order's temporaries at their peak (the picks a chunk at a time, a byte per
    step, 4-byte step indices, the buffer shuffle in place): about 23 B per sample of the share, where
    keeping every pick and step as 8-byte arrays took 46 (64 workers at 100M: 35 MB against 69)."""
    layout = ShardLayout.from_sizes([10_000] * 160)
    env = WorkerEnv(0, 2, 0, 8)
    share = len(worker_order(layout, ShardSettings(), 1, env))
    assert share == 100_000
    assert _peak_bytes(worker_order, layout, ShardSettings(), 1, env) < 30 * share
