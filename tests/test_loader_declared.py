"""What the loader relies on is declared, not probed (issue 32 items 1, 3, 4): the batch and item reads a
dataset offers (``readers.formats.base.ReadsBatches`` / ``ReadsItems``), the loader's seed and
``distributed`` as constructor arguments, and the modules split out of ``readers.order.epoch`` and
``readers.loader.dataloader`` still reachable from there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import SequentialSampler

import readers.loader.collation
import readers.loader.dataloader
import readers.loader.shmspace
import readers.loader.threads
import readers.order.draw
import readers.order.epoch
import readers.order.mapstyle
from readers import mix, open_dataset, subset
from readers.formats.base import MapReader, ReadsBatches, ReadsItems
from readers.loader.collation import collate
from readers.loader.dataloader import PackedLoader, ThreadLoader, make_loader
from readers.loader.threads import fetch_batch

ROOT = Path(__file__).resolve().parents[1]
MAP_FORMATS = ["lmdb", "hdf5", "mmap"]


class Plain(torch.utils.data.Dataset):
    """A dataset of the caller's own: ``__getitem__`` and ``__len__`` only."""

    def __init__(self, n: int = 6) -> None:
        self.n, self.got = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple:
        self.got.append(i)
        return torch.full((2,), float(i)), i


class WithItems(Plain):
    """One of the caller's own that fetches a batch's items in one call."""

    def __init__(self, n: int = 6) -> None:
        super().__init__(n)
        self.calls: list[list[int]] = []

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        self.calls.append(list(indices))
        return [(torch.full((2,), float(i)), i) for i in indices]


class WithBatches(WithItems):
    """One of the caller's own with a whole-batch read."""

    def get_batch(self, indices: list[int], alloc=None) -> tuple:
        return torch.tensor(indices), torch.tensor(indices)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "data") and hasattr(a, "offsets"):  # a ByteBatch
        return torch.equal(a.data, b.data) and torch.equal(a.offsets, b.offsets)
    return a == b


@pytest.mark.parametrize("fmt", MAP_FORMATS)
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_the_readers_offer_both_reads_and_a_thread_batch_is_what_it_was(packed_generated, fmt, decode):
    """A map-style reader offers both declared reads; the loader thread's batch is its whole-batch read when it
    has one, else its items collated, exactly as reading item by item and collating gives."""
    ds = open_dataset(packed_generated[fmt], decode=decode)
    try:
        assert isinstance(ds, MapReader) and isinstance(ds, ReadsBatches) and isinstance(ds, ReadsItems)
        indices = [3, 0, 7, 1]
        got = fetch_batch(ds, indices, collate)
        whole = ds.get_batch(indices)
        expected = whole if whole is not None else collate([ds[i] for i in indices])
        assert _same(got, expected)
        assert _same(fetch_batch(ds, indices, collate, whole_batches=False), collate([ds[i] for i in indices]))
    finally:
        ds.close()


def test_subsets_and_mixtures_declare_what_they_read(packed_generated):
    ds = open_dataset(packed_generated["mmap"], decode=False)
    try:
        part = subset(ds, indices=np.arange(5))
        mixture = mix([(ds, 1.0), (part, 1.0)])
        assert isinstance(part, ReadsBatches) and isinstance(part, ReadsItems)
        assert isinstance(mixture, ReadsItems) and not isinstance(mixture, ReadsBatches)
        assert _same(fetch_batch(part, [4, 0], collate), collate([ds[4], ds[0]]))
        assert _same(fetch_batch(mixture, [0, len(ds) + 1], collate), collate([ds[0], ds[1]]))
    finally:
        ds.close()


def test_a_plain_dataset_is_read_item_by_item():
    ds = Plain()
    assert not isinstance(ds, ReadsBatches) and not isinstance(ds, ReadsItems)
    images, labels = fetch_batch(ds, [4, 1, 2], collate)
    assert ds.got == [4, 1, 2] and labels.tolist() == [4, 1, 2] and images[:, 0].tolist() == [4.0, 1.0, 2.0]


def test_a_users_batch_reads_are_used_as_declared():
    items = WithItems()
    assert isinstance(items, ReadsItems) and not isinstance(items, ReadsBatches)
    _, labels = fetch_batch(items, [5, 3], collate)
    assert items.calls == [[5, 3]] and items.got == [] and labels.tolist() == [5, 3]
    batches = WithBatches()
    assert isinstance(batches, ReadsBatches)
    assert fetch_batch(batches, [2, 0], collate)[0].tolist() == [2, 0] and batches.calls == []
    fetch_batch(batches, [2, 0], collate, whole_batches=False)  # a collate_fn of the caller's own: items
    assert batches.calls == [[2, 0]]


def test_a_user_dataset_through_thread_workers_gives_its_items_in_order():
    ds = WithItems(10)
    loader = make_loader(ds, batch_size=4, shuffle=False, num_workers=2, workers="threads")
    assert [b[1].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert sorted(map(tuple, ds.calls)) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]


@pytest.mark.parametrize("cls", [PackedLoader, ThreadLoader])
def test_the_loaders_seed_and_distributed_are_constructor_arguments(cls):
    """A sampler without a seed of its own: the loader's seed is the order's, in its state, and decides the
    workers' per-epoch base seed; ``distributed=False`` tells accelerate the loader is not split by rank."""
    ds = Plain(8)
    extra = {"num_workers": 0} if cls is ThreadLoader else {}
    default = cls(ds, batch_size=2, sampler=SequentialSampler(ds), **extra)
    assert default.state_dict()["seed"] == 0 and default._is_accelerate_prepared
    loader = cls(ds, batch_size=2, sampler=SequentialSampler(ds), seed=7, distributed=False,
                 generator=torch.Generator(), **extra)
    assert loader.state_dict()["seed"] == 7 and not loader._is_accelerate_prepared
    other = cls(ds, batch_size=2, sampler=SequentialSampler(ds), seed=8, generator=torch.Generator(), **extra)
    list(loader), list(other)
    assert loader.generator.initial_seed() != other.generator.initial_seed()  # each seeded from its own seed


def test_make_loader_hands_its_seed_and_distributed_to_the_loader():
    ds = Plain(8)
    for workers in ("threads", "processes"):
        loader = make_loader(ds, batch_size=2, seed=5, distributed=False, sampler=SequentialSampler(ds),
                             num_workers=0, workers=workers)
        assert loader.state_dict()["seed"] == 5 and not loader._is_accelerate_prepared


def test_the_split_modules_are_reachable_from_where_they_were():
    """``readers.order.epoch`` names the whole order and ``readers.loader.dataloader`` the loader's pieces:
    the same objects as where they live now."""
    for module in (readers.order.mapstyle, readers.order.draw):
        for name in module.__all__:
            assert getattr(readers.order.epoch, name) is getattr(module, name), name
            assert name in readers.order.epoch.__all__
    for module, names in ((readers.loader.collation, ["collate", "Collate"]),
                          (readers.loader.shmspace, ["shm_check", "ShmSpace", "use_file_system_sharing"]),
                          (readers.loader.threads, ["choose_workers"])):
        for name in names:
            assert getattr(readers.loader.dataloader, name) is getattr(module, name), name
            assert name in readers.loader.dataloader.__all__


@pytest.mark.parametrize("package", ["readers/order", "readers/loader"])
def test_no_module_of_the_order_or_the_loader_is_over_600_lines(package):
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / package).glob("*.py"))}
    assert max(sizes.values()) < 600, sizes
    doc = (ROOT / package / "__init__.py").read_text()
    for name in sizes:
        if name != "__init__.py":
            assert f"{package.replace('/', '.')}.{name[:-3]}`" in doc, f"{package}/__init__.py lists {name}"
