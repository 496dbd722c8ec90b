"""make_loader reads ShardDataset bytes in whole batches with worker processes and with no workers (the
DataLoader's own, ``workers="processes"``; ``auto`` with no workers takes the ThreadLoader, see test_modes).

The loader's own copy yields each sample unread (``readers.formats.batch.Pending``) and its
collate reads the batch at once from the shard mappings (``readers.formats.shardbatch.read_batch``):
the same batches, byte for byte and in the same order, as the per-sample path, which it never calls.
"""

from __future__ import annotations

import gc

import pytest
import torch

from readers import make_loader, open_dataset
from readers.contract import spec
from readers.formats import shardbatch
from readers.formats.batch import Pending
from readers.formats.wds import ShardDataset
from readers.loader import shmring
from readers.loader.collation import collate
from readers.loader.dataloader import ByteBatch


def batches(loader) -> list[tuple[list[bytes], list[int], list[int]]]:
    """Each batch as (sample bytes, labels, indices)."""
    out = []
    for images, labels, index in loader:
        out.append(([images.get(k) for k in range(len(images))], labels.tolist(), index.tolist()))
    return out


def per_sample(root, **kw):
    """The same loader over the per-sample path (a collate_fn of the caller's own keeps it)."""
    ds = open_dataset(root, decode=False, return_index=True)
    return make_loader(ds, collate_fn=collate, **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_processes_and_no_workers_read_whole_batches(packed_generated, monkeypatch, workers):
    root = packed_generated["wds"]
    kw = dict(batch_size=5, num_workers=workers, workers="processes", seed=7, pin_memory=False,
              persistent_workers=False)
    plain = per_sample(root, **kw)
    want = batches(plain) + batches(plain)  # two epochs: the maps and checks kept from epoch to epoch
    ds = open_dataset(root, decode=False, return_index=True)
    loader = make_loader(ds, **kw)
    assert loader.dataset.batch_reads and not ds.batch_reads  # the caller's dataset is left alone
    monkeypatch.setattr(ShardDataset, "read_from", lambda *a: pytest.fail("per-sample read"))
    got = batches(loader)
    got += batches(loader)
    assert [b[2] for b in got[:len(got) // 2]] != [b[2] for b in got[len(got) // 2:]]  # reshuffled per epoch
    assert got == want
    n = spec.read_index(root).num_samples
    assert sorted(sum((b[2] for b in got[:len(got) // 2]), [])) == list(range(n))


def test_the_loader_copy_yields_items_to_anyone_else(packed_generated):
    """Iterating the loader's copy directly (not through its collate) gives each sample's item."""
    root = packed_generated["wds"]
    ds = open_dataset(root, decode=False, return_index=True)
    copy = make_loader(ds, batch_size=4, num_workers=0, shuffle=False, workers="processes").dataset
    items = list(copy)
    assert all(isinstance(p, Pending) for p in items)
    plain = list(ds.with_order(shuffle=False))
    assert [tuple(p) for p in items] == plain
    image, label, index = items[3]
    assert (image, label, index) == plain[3] and items[3][0] == plain[3][0] and len(items[3]) == 3


def test_whole_batches_fall_back_where_the_reader_has_none(packed_generated):
    """decode=True, fields= and a caller's collate_fn: items as before (nothing Pending)."""
    root = packed_generated["wds"]
    for ds, extra in ((open_dataset(root), {}), (open_dataset(root, decode=False, fields=("image", "label")), {}),
                      (open_dataset(root, decode=False), {"collate_fn": list})):
        loader = make_loader(ds, batch_size=4, num_workers=0, **extra)
        first = next(iter(loader))
        assert not any(isinstance(x, Pending) for x in (first if isinstance(first, list) else [first]))
        assert not shardbatch.supported(loader.dataset) or "collate_fn" in extra


def test_a_damaged_header_names_the_shard_in_a_worker_process(packed_generated, tmp_path):
    import shutil

    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    index = spec.read_index(root)
    shard, offset = int(index.arrays["shards"][6]), int(index.arrays["offsets"][6])
    path = root / index.meta["shards"][shard]["name"]
    with open(path, "r+b") as f:  # the key no longer names sample 6
        f.seek(offset - 512)
        f.write(b"9")
    loader = make_loader(open_dataset(root, decode=False), batch_size=4, num_workers=1, workers="processes",
                         persistent_workers=False)
    with pytest.raises(spec.DatasetFormatError, match=rf"{path.name} at byte {offset - 512}: tar header is not sample 6"):
        for _ in loader:
            pass
    del loader
    gc.collect()
    shmring.release_dead()  # the slots the main process mapped from the worker, which has exited


def test_batch_transform_runs_on_the_whole_batch_in_the_worker(packed_generated):
    ds = open_dataset(packed_generated["wds"], decode=False, return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=2, workers="processes", batch_transform=_first_two,
                         persistent_workers=False)
    got = list(loader)
    assert sorted(sum((index.tolist() for _, _, index in got), [])) == list(range(len(ds.labels)))
    for images, labels, index in got:
        assert images.tolist() == [list(ds.read(i)[:2]) for i in index.tolist()]


def _first_two(images):
    """Each sample's first two bytes (the JPEG marker), as a [B, 2] tensor: made from the ByteBatch."""
    assert isinstance(images, ByteBatch)
    return torch.stack([images.data[images.offsets[k]:images.offsets[k] + 2] for k in range(len(images))])


def test_checks_are_kept_with_their_mapping_when_a_batch_spans_more_shards_than_are_kept(
        packed_generated, tmp_path, monkeypatch):
    """One mapping kept, a batch over every shard: only the last shard's checks outlive the batch,
    so damage written afterwards into any other shard is found on the next read."""
    import shutil

    import numpy as np

    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    ds = open_dataset(root, decode=False, return_index=True)
    index = spec.read_index(root)
    assert len(index.meta["shards"]) >= 3
    monkeypatch.setattr(shardbatch, "MAX_MAPPED", 1)
    everything = np.arange(index.num_samples)[::-1].copy()  # last shard first: shard 0 is mapped last
    maps = shardbatch.ShardMaps()
    images, labels, got = shardbatch.read_batch(ds, maps, everything)
    assert got.tolist() == everything.tolist() and [images.get(k) for k in range(3)] == [ds.read(i) for i in everything[:3]]
    victim = int(everything[0])  # in the last shard, whose mapping was dropped during the batch
    shard, offset = int(index.arrays["shards"][victim]), int(index.arrays["offsets"][victim])
    path = root / index.meta["shards"][shard]["name"]
    with open(path, "r+b") as f:
        f.seek(offset - 512)
        f.write(b"9")
    with pytest.raises(spec.DatasetFormatError, match=rf"{path.name} at byte {offset - 512}: tar header is not sample"):
        shardbatch.read_batch(ds, maps, everything)
    ds.close()
