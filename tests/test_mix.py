"""Weighted mixtures (``readers.mix``) and ``samples_per_epoch``: proportions, each source's
samples without repeats within an epoch, exact mid-epoch resume (0 and 2 workers, 2 simulated DDP
ranks), the rule for a resume with changed weights, ``source_counts`` and exact ``len(loader)``."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from readers import make_loader, mix, open_dataset
from readers.order.epoch import epoch_draw, shares

pytest_plugins = ["servers"]  # http_server (nginx), for the remote source

WORKERS = [(0, "processes"), pytest.param(2, "processes", marks=pytest.mark.slow), (2, "threads")]
WIDS = ["0", "2p", "2t"]


def _mixture(packed, weights=(0.75, 0.25), samples=32, **kw):
    a = open_dataset(packed["lmdb"], decode=False, return_index=True)
    b = open_dataset(packed["wds"], decode=False, return_index=True)
    return mix([(a, weights[0]), (b, weights[1])], samples_per_epoch=samples, return_source=True, **kw)


def _loader(packed, workers=0, kind="processes", batch=3, **kw):
    mix_kw = {k: kw.pop(k) for k in ("weights", "samples", "seed", "replacement") if k in kw}
    return make_loader(_mixture(packed, **mix_kw), batch_size=batch, num_workers=workers, workers=kind,
                       persistent_workers=False, multiprocessing_context="fork" if workers and kind == "processes"
                       else None, **kw)


def _pairs(batches) -> list[tuple[int, int]]:
    """(source, sample index) of every sample of the batches, in order."""
    return [(int(s), int(i)) for b in batches for s, i in zip(b[-1].tolist(), b[-2].tolist())]


def _epoch(loader) -> list:
    return [b for b in loader]


def test_shares_split_exactly():
    assert shares([0.75, 0.25], 32).tolist() == [24, 8]
    assert shares([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert shares([0.7, 0.3], 1).tolist() == [1, 0]
    with pytest.raises(ValueError, match="weights"):
        shares([0, 0], 5)


def test_proportions_within_binomial_noise_and_no_repeats(packed_generated):
    n = open_dataset(packed_generated["lmdb"]).index.num_samples  # 28 per source
    loader = _loader(packed_generated, batch=4, samples=48, weights=(0.75, 0.25))  # 36 from a (> 28), 12 from b
    per_epoch = []
    for _ in range(3):
        pairs = _pairs(_epoch(loader))
        assert len(pairs) == 48
        per_epoch.append(pairs)
        counts = Counter(s for s, _ in pairs)
        assert counts == {0: 36, 1: 12}  # the shares of every epoch, exactly
        b = [i for s, i in pairs if s == 1]
        assert len(set(b)) == len(b), "source b repeated a sample within an epoch"
        a = [i for s, i in pairs if s == 0]
        assert sorted(Counter(a).values()) == [1] * 20 + [2] * 8  # a's share exceeds it: its next pass
        assert len(set(a[:n])) == n  # the whole of a first
    # interleaving: in every window of 16 samples, source a's count is within 4 sigma of 0.75 x 16
    sigma = math.sqrt(16 * 0.75 * 0.25)
    stream = [s for pairs in per_epoch for s, _ in pairs]
    for start in range(0, len(stream) - 16 + 1, 4):
        k = stream[start:start + 16].count(0)
        assert abs(k - 12) <= 4 * sigma, (start, k)
    assert per_epoch[0] != per_epoch[1], "every epoch the same order"
    # without replacement the streams continue: source b's samples of epochs 0 and 1 (24 <= 28) are distinct
    b01 = [i for p in per_epoch[:2] for s, i in p if s == 1]
    assert len(set(b01)) == 24
    del loader


def test_proportions_over_many_epochs_with_replacement():
    """With replacement each source is sampled uniformly: counts per sample within 4 sigma."""
    epochs = [epoch_draw([50, 10], [300, 100], 5, e, replacement=True) for e in range(20)]
    assert all((which == 1).sum() == 100 for which, _ in epochs)
    draws = np.concatenate([sample[which == 1] for which, sample in epochs])
    counts = np.bincount(draws, minlength=10)
    expected, sigma = 2000 / 10, math.sqrt(2000 * 0.1 * 0.9)
    assert np.all(np.abs(counts - expected) <= 4 * sigma), counts
    again = epoch_draw([50, 10], [300, 100], 5, 3, replacement=True)
    assert np.array_equal(again[1], epoch_draw([50, 10], [300, 100], 5, 3, replacement=True)[1])


def test_deterministic_for_a_seed(packed_generated):
    one, two = _loader(packed_generated, seed=4), _loader(packed_generated, seed=4)
    three = _loader(packed_generated, seed=5)
    first = _pairs(_epoch(one))
    assert first == _pairs(_epoch(two))
    assert first != _pairs(_epoch(three))
    del one, two, three


@pytest.mark.parametrize("world", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("workers,kind", WORKERS, ids=WIDS)
def test_resume_mid_epoch_is_exact(packed_generated, monkeypatch, workers, kind, world):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    whole_epoch = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        ref = _loader(packed_generated, workers, kind, samples=34)
        _epoch(ref)
        epoch1 = _pairs(_epoch(ref))
        del ref
        for k in (1, 3):
            first = _loader(packed_generated, workers, kind, samples=34)
            _epoch(first)
            got = []
            for b in first:
                got.append(b)
                if len(got) == k:
                    break
            state = first.state_dict()
            counts = first.source_counts()
            assert counts == [sum(1 for s, _ in _pairs(got) if s == j) for j in (0, 1)]
            del first
            again = _loader(packed_generated, workers, kind, samples=34)
            again.load_state_dict(state)
            rest = _epoch(again)
            assert _pairs(got) + _pairs(rest) == epoch1, f"rank {rank} k={k}: not the rest of the epoch"
            assert again.source_counts() == [sum(1 for s, _ in epoch1 if s == j) for j in (0, 1)]
            del again
        whole_epoch += epoch1
    counts = Counter(s for s, _ in whole_epoch)
    assert sum(counts.values()) == 34 + (34 % world)  # every rank the same share (DistributedSampler pads)
    assert abs(counts[0] - 25) <= world and abs(counts[1] - 9) <= world


def test_changed_weights_refuse_to_resume(packed_generated):
    first = _loader(packed_generated)
    next(iter(first))
    state = first.state_dict()
    other = _loader(packed_generated, weights=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"weights or sources or samples_per_epoch changed") as info:
        other.load_state_dict(state)
    assert "\n" not in str(info.value)
    other.set_epoch(state["epoch"] + 1)  # what the message says to do instead
    assert len(_epoch(other)) == len(other)
    same = _loader(packed_generated)
    same.load_state_dict(state)  # unchanged weights: accepted
    del first, other, same


@pytest.mark.parametrize("drop_last", [False, True], ids=["keep_last", "drop_last"])
@pytest.mark.parametrize("world", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("workers,kind", WORKERS, ids=WIDS)
def test_len_is_the_batches_yielded(packed_generated, monkeypatch, workers, kind, world, drop_last):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        for samples in (7, 33, 61):
            loader = _loader(packed_generated, workers, kind, batch=4, samples=samples, drop_last=drop_last)
            assert len(_epoch(loader)) == len(loader), (rank, samples)
            del loader


def test_samples_per_epoch_single_dataset(packed_generated):
    """Shorter epochs continue one endless shuffled stream; longer ones go on with the next pass."""
    n = 28
    for fmt in ("lmdb", "wds"):
        ds = open_dataset(packed_generated[fmt], decode=False, return_index=True)
        short = make_loader(ds, batch_size=4, num_workers=0, samples_per_epoch=10)
        epochs = [[i for b in short for i in b[2].tolist()] for _ in range(3)]
        assert [len(e) for e in epochs] == [10, 10, 10] and len(short) == 3
        assert len(set(epochs[0] + epochs[1])) == 20, fmt  # epochs 0 and 1 continue one pass: no repeat
        assert len(set(epochs[2])) == 10 and epochs[2] != epochs[0]  # 8 left in it: the next pass
        long = make_loader(ds, batch_size=8, num_workers=0, samples_per_epoch=70)
        got = [i for b in long for i in b[2].tolist()]
        assert len(got) == 70 and len(long) == 9
        assert sorted(Counter(got).values()) == [2] * 14 + [3] * 14  # 2.5 passes
        assert len(set(got[:n])) == n and len(set(got[n:2 * n])) == n
        rep = make_loader(ds, batch_size=8, num_workers=0, samples_per_epoch=70, replacement=True)
        drawn = [i for b in rep for i in b[2].tolist()]
        assert len(drawn) == 70 and set(drawn) <= set(range(n)) and len(set(drawn)) < n  # repeats, as drawn
        assert drawn == [i for b in make_loader(ds, batch_size=8, num_workers=0, samples_per_epoch=70,
                                                 replacement=True) for i in b[2].tolist()]
        changed = make_loader(ds, batch_size=4, num_workers=0, samples_per_epoch=12)
        with pytest.raises(ValueError, match="samples_per_epoch changed"):
            changed.load_state_dict(short.state_dict())
        del short, long, rep, changed


def test_bad_arguments(packed_generated):
    ds = open_dataset(packed_generated["lmdb"], decode=False)
    with pytest.raises(ValueError, match="pairs"):
        mix([ds])
    with pytest.raises(ValueError, match="replacement=True needs samples_per_epoch"):
        make_loader(ds, num_workers=0, replacement=True)
    with pytest.raises(ValueError, match="its own samples_per_epoch"):
        make_loader(mix([(ds, 1.0)]), num_workers=0, samples_per_epoch=3)
    with pytest.raises(ValueError, match="source 1 has decode=True but source 0 has decode=False"):
        mix([(ds, 1.0), (open_dataset(packed_generated["wds"]), 1.0)])
    with pytest.raises(ValueError, match="samples_per_epoch must be >= 1"):
        make_loader(ds, num_workers=0, samples_per_epoch=0)


def test_resume_with_other_batch_size_or_workers_delivers_the_rest_once(packed_generated):
    ref = _loader(packed_generated, samples=34)
    whole = Counter(_pairs(_epoch(ref)))
    del ref
    first = _loader(packed_generated, samples=34)
    got = []
    for b in first:
        got.append(b)
        if len(got) == 2:
            break
    state = first.state_dict()
    del first
    for workers, kind, batch in ((0, "processes", 4), (2, "threads", 5)):
        other = _loader(packed_generated, workers, kind, batch=batch, samples=34)
        other.load_state_dict(state)
        rest = _epoch(other)
        assert Counter(_pairs(got) + _pairs(rest)) == whole, (workers, batch)
        del other


@pytest.mark.slow  # starts nginx
def test_a_remote_wds_source_mixes_with_a_local_one(http_server, packed_generated, stored_bytes):
    import shutil
    import uuid

    http_server.start()
    name = f"mix-{uuid.uuid4().hex[:8]}"
    shutil.copytree(packed_generated["wds"], http_server.root / name / "wds")
    remote = open_dataset(f"{http_server.url}/{name}/wds", decode=False, return_index=True)
    local = open_dataset(packed_generated["lmdb"], decode=False, return_index=True)
    both = mix([(local, 0.75), (remote, 0.25)], samples_per_epoch=32, return_source=True, seed=1)
    loader = make_loader(both, batch_size=4, num_workers=0)
    batches = list(loader)
    pairs = _pairs(batches)
    assert Counter(s for s, _ in pairs) == {0: 24, 1: 8} and len(batches) == len(loader)
    remote_samples = [i for s, i in pairs if s == 1]
    assert len(set(remote_samples)) == 8
    for b in batches:
        for k, (s, i) in enumerate(zip(b[3].tolist(), b[2].tolist())):
            root = packed_generated["wds" if s == 1 else "lmdb"]
            assert b[0].get(k) == stored_bytes(root, i), (s, i)
    first = make_loader(both, batch_size=4, num_workers=0)
    list(first)
    got = [next(iter(first))]
    state = first.state_dict()
    epoch1 = _pairs(got)  # the first batch of epoch 1, then a resume from there
    again = make_loader(both, batch_size=4, num_workers=0)
    again.load_state_dict(state)
    ref = make_loader(both, batch_size=4, num_workers=0)
    list(ref)
    assert epoch1 + _pairs(list(again)) == _pairs(list(ref))
    del loader, first, again, ref, both, remote, local
