"""Epoch accounting: ``len(loader)`` equals the batches an epoch yields (every format, worker
count and kind, rank count, ``drop_last``), and a ``ShardDataset`` in a plain ``DataLoader``
starts a new epoch at each pass (as a map-style ``RandomSampler`` reshuffles) until ``set_epoch``
chooses one."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from readers import make_loader
from readers.contract import spec
from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS

#: (num_workers, workers kind): no worker, one, two processes, two threads
WORKERS = [(0, "processes"), (1, "processes"), (2, "processes"), (2, "threads")]


def _batches(loader) -> tuple[int, list[int]]:
    count, seen = 0, []
    for batch in loader:
        count += 1
        seen += batch[-1].tolist()
    return count, seen


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("drop_last", [False, True], ids=["keep_last", "drop_last"])
@pytest.mark.parametrize("world", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("workers,kind", WORKERS, ids=[f"{w}{k[0]}" for w, k in WORKERS])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_len_is_the_batches_an_epoch_yields(packed_generated, monkeypatch, fmt, workers, kind, world, drop_last):
    root = packed_generated[fmt]
    n = spec.read_index(root).num_samples  # 28: with 2 workers and 2 ranks no split is a multiple of 3
    monkeypatch.setenv("WORLD_SIZE", str(world))
    total = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))  # read when iterated, in the workers too (forked)
        ds = open_dataset(root, decode=False, return_index=True)
        loader = make_loader(ds, batch_size=3, num_workers=workers, workers=kind, drop_last=drop_last,
                             persistent_workers=False, multiprocessing_context="fork" if workers else None)
        promised = len(loader)
        count, seen = _batches(loader)
        assert count == promised, f"rank {rank}: len(loader) is {promised}, the epoch yielded {count} batches"
        total += seen
        del loader
    if not drop_last:
        assert set(total) == set(range(n))


def _plain_passes(ds, passes: int, **kw) -> list[list[int]]:
    loader = DataLoader(ds, batch_size=4, **kw)
    out = [_batches(loader)[1] for _ in range(passes)]
    del loader
    return out


def test_shard_dataset_in_a_plain_dataloader_reshuffles_each_pass(packed_generated):
    ds = open_dataset(packed_generated["wds"], decode=False, return_index=True, seed=2)
    n = ds.index.num_samples
    first, second, third = _plain_passes(ds, 3)
    assert sorted(first) == sorted(second) == sorted(third) == list(range(n))
    assert len({tuple(first), tuple(second), tuple(third)}) == 3, "a new pass repeated an earlier epoch's order"
    assert [first, second] == [ds.sample_order(epoch=0).tolist(), ds.sample_order(epoch=1).tolist()]
    ds.set_epoch(0)  # chooses the epoch again: the passes repeat from there
    assert _plain_passes(ds, 2) == [first, second]
    ds.set_epoch(5)
    assert _plain_passes(ds, 1)[0] == ds.sample_order(epoch=5).tolist()


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh_workers", "persistent_workers"])
def test_shard_dataset_passes_advance_in_worker_processes(packed_generated, persistent):
    ds = open_dataset(packed_generated["wds"], decode=False, return_index=True, seed=2)
    zero = _plain_passes(ds, 1)[0]
    ds.set_epoch(0)
    passes = _plain_passes(ds, 2, num_workers=2, persistent_workers=persistent, multiprocessing_context="fork")
    assert sorted(passes[0]) == sorted(passes[1]) and passes[0] != passes[1], "the second pass repeated the first"
    assert sorted(passes[0]) == sorted(zero)
    ds.set_epoch(0)
    assert _plain_passes(ds, 2, num_workers=2, persistent_workers=persistent,
                         multiprocessing_context="fork") == passes, "set_epoch(0) did not replay the passes"


def test_make_loader_epochs_are_unchanged_by_passes(packed_generated):
    """The loader sets the epoch before every pass: its epochs are its own, whatever the dataset counted."""
    ds = open_dataset(packed_generated["wds"], decode=False, return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=0, seed=3)
    e0, e1 = _batches(loader)[1], _batches(loader)[1]
    loader.set_epoch(1)
    assert _batches(loader)[1] == e1 and e0 != e1
    loader.set_epoch(0)
    assert _batches(loader)[1] == e0
