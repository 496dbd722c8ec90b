"""Subsets without re-packing (``readers.subset``: class names, index arrays, a seeded fraction)
for every format: exactly the chosen samples, once per epoch, composing with shuffle, DDP ranks,
loader workers, exact mid-epoch resume, ``samples_per_epoch`` and mixtures; ``len(loader)`` exact."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from readers import Subset, make_loader, mix, open_dataset, subset
from readers.contract.spec import FORMATS

WORKERS = [(0, "processes"), pytest.param(2, "processes", marks=pytest.mark.slow), (2, "threads")]
WIDS = ["0", "2p", "2t"]


def _open(packed, fmt):
    return open_dataset(packed[fmt], decode=False, return_index=True)


def _loader(ds, workers=0, kind="processes", batch=3, **kw):
    return make_loader(ds, batch_size=batch, num_workers=workers, workers=kind, persistent_workers=False,
                       multiprocessing_context="fork" if workers and kind == "processes" else None, **kw)


def _epoch(loader) -> list[list[int]]:
    return [b[2].tolist() for b in loader]


def _flat(batches) -> list[int]:
    return [i for b in batches for i in b]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_classes_indices_fraction_give_exactly_what_they_say(packed_generated, fmt):
    ds = _open(packed_generated, fmt)
    labels = np.asarray(ds.labels)
    names = ds.classes
    by_class = subset(ds, classes=[names[1], 3])  # a name and a label number
    want = set(np.flatnonzero(np.isin(labels, [1, 3])).tolist())
    loader = _loader(by_class)
    epochs = [_epoch(loader) for _ in range(2)]
    assert [sorted(_flat(e)) for e in epochs] == [sorted(want)] * 2  # each chosen sample once, no other
    assert epochs[0] != epochs[1] and len(epochs[0]) == len(loader)  # shuffled per epoch; len exact
    picked = np.array([25, 2, 7, 7, 11])
    by_index = subset(ds, indices=picked)
    assert sorted(_flat(_epoch(_loader(by_index)))) == [2, 7, 11, 25]
    frac = subset(ds, fraction=0.25, seed=3)
    got = sorted(_flat(_epoch(_loader(frac))))
    assert len(got) == 7 and len(set(got)) == 7  # round(0.25 x 28)
    assert got == sorted(_flat(_epoch(_loader(subset(ds, fraction=0.25, seed=3)))))  # seeded
    assert got != sorted(_flat(_epoch(_loader(subset(ds, fraction=0.25, seed=4)))))
    nested = subset(by_class, fraction=0.5, seed=1)  # a subset of a subset: among its samples
    inner = _flat(_epoch(_loader(nested)))
    assert len(inner) == 7 and set(inner) <= want
    # cheap at scale: one int64 array, no per-sample objects
    arr = by_class.kept if fmt == "wds" else by_class.indices
    assert isinstance(arr, np.ndarray) and arr.dtype == np.int64
    assert isinstance(by_class, type(ds) if fmt == "wds" else Subset)
    del loader, ds, by_class, by_index, frac, nested


@pytest.mark.parametrize("world", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("workers,kind", WORKERS, ids=WIDS)
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_ranks_workers_len_and_exact_resume(packed_generated, monkeypatch, fmt, workers, kind, world):
    """Every rank the same number of batches, the ranks together the whole subset, len exact,
    and a resume mid-epoch continues batch for batch."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    ds = _open(packed_generated, fmt)
    sub = subset(ds, classes=[0, 2, 3])  # 21 samples: 2 ranks x 2 workers split unevenly
    chosen = sorted(_flat(_epoch(_loader(sub)))) if world == 1 else None
    seen, per_rank = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        ref = _loader(sub, workers, kind, seed=2)
        _epoch(ref)
        epoch1 = _epoch(ref)
        assert len(epoch1) == len(ref)
        per_rank.append(len(epoch1))
        seen += _flat(epoch1)
        del ref
        for k in (1, len(epoch1) - 1):
            first = _loader(sub, workers, kind, seed=2)
            _epoch(first)
            got = []
            for b in first:
                got.append(b[2].tolist())
                if len(got) == k:
                    break
            state = first.state_dict()
            del first
            again = _loader(sub, workers, kind, seed=2)
            again.load_state_dict(state)
            assert got + _epoch(again) == epoch1, f"rank {rank} k={k}"
            del again
    labels = np.asarray(ds.labels)
    want = set(np.flatnonzero(np.isin(labels, [0, 2, 3])).tolist())
    assert set(seen) == want and len(seen) - len(want) < world  # padding: at most world-1 repeats
    if chosen is not None:
        assert chosen == sorted(want)
    assert len(set(per_rank)) == 1  # every rank the same number of batches (DDP would hang otherwise)
    del ds, sub


@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_subset_composes_with_samples_per_epoch_and_mixtures(packed_generated, fmt):
    ds = _open(packed_generated, fmt)
    sub = subset(ds, indices=np.arange(0, 28, 2))  # 14 samples
    short = _loader(sub, samples_per_epoch=5, batch=2)
    epochs = [_flat(_epoch(short)) for _ in range(2)]
    assert [len(e) for e in epochs] == [5, 5] and len(short) == 3
    assert len(set(epochs[0] + epochs[1])) == 10 and set(epochs[0] + epochs[1]) <= set(range(0, 28, 2))
    other = subset(_open(packed_generated, "lmdb"), classes=[1])
    both = _loader(mix([(sub, 0.5), (other, 0.5)], samples_per_epoch=14, return_source=True), batch=4)
    batches = list(both)
    pairs = [(s, i) for b in batches for s, i in zip(b[3].tolist(), b[2].tolist())]
    assert Counter(s for s, _ in pairs) == {0: 7, 1: 7} and len(batches) == len(both)
    assert {i for s, i in pairs if s == 0} <= set(range(0, 28, 2))
    lab = np.asarray(other.labels)
    assert set(lab.tolist()) == {1}  # labels as stored
    assert len({i for s, i in pairs if s == 1}) == 7
    del short, both, ds, sub, other


def test_a_resume_with_another_subset_is_refused(packed_generated):
    ds = _open(packed_generated, "wds")
    first = _loader(subset(ds, classes=[0]))
    next(iter(first))
    state = first.state_dict()
    other = _loader(subset(ds, classes=[0, 1]))
    with pytest.raises(ValueError, match="num_samples 7.*has 14"):
        other.load_state_dict(state)
    del first, other, ds


def test_bad_subsets_say_what_is_wrong(packed_generated):
    ds = _open(packed_generated, "lmdb")
    with pytest.raises(ValueError, match="no class 'nope'"):
        subset(ds, classes=["nope"])
    with pytest.raises(ValueError, match="index 28 out of range for 28 samples"):
        subset(ds, indices=[0, 28])
    with pytest.raises(ValueError, match="fraction must be in"):
        subset(ds, fraction=0)
    with pytest.raises(ValueError, match="indices must be integers"):
        subset(ds, indices=[0.5])
    with pytest.raises(ValueError, match="classes or indices, not both"):
        subset(ds, classes=[0], indices=[1])
    with pytest.raises(ValueError, match="take subsets of the sources"):
        subset(mix([(ds, 1.0)]), fraction=0.5)
    del ds


def test_wds_subset_reads_each_shard_front_to_back(packed_generated):
    """The shard-based order runs on the kept samples: a worker's samples of one shard come in
    their order in the shard, and only kept ones."""
    from readers.contract.env import WorkerEnv

    ds = _open(packed_generated, "wds")
    sub = subset(ds, indices=np.arange(1, 28, 3)).with_order(seed=1)
    sub.open_shards = 1  # one shard at a time, then the buffer: no buffer, to see the read order
    sub.buffer_size = 1
    seen = []
    for w in range(2):
        order = sub.sample_order(WorkerEnv(0, 1, w, 2))
        seen += order.tolist()
        shards = np.asarray([ds.shard_of(i) for i in order])
        for s in set(shards.tolist()):
            mine = order[shards == s]
            assert np.all(np.diff(mine) > 0), f"shard {s} not read front to back: {mine}"
    assert sorted(seen) == list(range(1, 28, 3))
    del ds, sub
