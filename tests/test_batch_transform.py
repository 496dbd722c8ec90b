"""``make_loader(..., batch_transform=f)``: ``f`` on each collated batch's images, where the batch is made
(worker processes, fork and spawn; loader threads; the main process with 0 workers), equal to ``f``
applied to the batch made without it, labels untouched, and a one-line refusal of what is not a batch."""

from __future__ import annotations

import gc

import pytest
import torch

from readers import make_loader, open_dataset
from readers.decode.transforms import ResizeCenterCrop
from readers.loader.collation import BatchTransform
from readers.loader.dataloader import ThreadLoader
from readers.loader.shmring import ByteBatch

STORED = 24


@pytest.fixture(scope="module")
def packed(tmp_path_factory, generated):
    from packer import PackOptions, pack

    root = tmp_path_factory.mktemp("batch-transform")
    pack(generated, root / "mmap", PackOptions(format="mmap", resize=STORED, workers=1))
    pack(generated, root / "lmdb", PackOptions(format="lmdb", workers=1))
    return root


def center_crop(images: torch.Tensor) -> torch.Tensor:
    """A user's center crop of a uint8 batch [B, C, H, W] to 16x16 (a view: no copy)."""
    h, w = images.shape[-2:]
    top, left = (h - 16) // 2, (w - 16) // 2
    return images[..., top:top + 16, left:left + 16]


def flip_normalise(images: torch.Tensor) -> torch.Tensor:
    """A user's horizontal flip and normalisation to float32 (a new tensor)."""
    return images.flip(-1).float().div_(255.0).sub_(0.5)


class Scale:
    """A picklable transform object with state (spawn workers get a copy)."""

    def __init__(self, by: int) -> None:
        self.by = by

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(torch.int32) * self.by


def not_a_batch(images: torch.Tensor) -> float:
    return float(images.float().mean())


def wrong_length(images: torch.Tensor) -> torch.Tensor:
    return images[:1]


def sizes(data: ByteBatch) -> torch.Tensor:
    """A batch_transform on decode=False bytes: each sample's size."""
    return torch.tensor([len(data.get(k)) for k in range(len(data))])


def batches(ds, **kw):
    loader = make_loader(ds, batch_size=8, shuffle=False, persistent_workers=False, **kw)
    return list(loader), loader


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert a.dtype == b.dtype and torch.equal(a, b), (a.shape, b.shape)


MODES = [
    pytest.param({"num_workers": 0}, id="0-workers"),  # auto: the ThreadLoader in the calling thread (whole batches)
    pytest.param({"num_workers": 0, "workers": "processes"}, id="0-workers-dataloader"),
    pytest.param({"num_workers": 2, "workers": "processes"}, id="2-processes-fork"),
    pytest.param({"num_workers": 2, "workers": "processes", "multiprocessing_context": "spawn"}, id="2-processes-spawn"),
    pytest.param({"num_workers": 2, "workers": "threads"}, id="2-threads"),
]


@pytest.mark.parametrize("kw", MODES)
@pytest.mark.parametrize("fn", [center_crop, flip_normalise, Scale(3)], ids=["crop-view", "flip-float", "object"])
def test_batch_transform_equals_f_on_the_batch_made_without_it(packed, kw, fn):
    ds = open_dataset(packed / "mmap", return_index=True)
    plain, _ = batches(ds, **kw)
    got, loader = batches(ds, batch_transform=fn, **kw)
    assert isinstance(loader, ThreadLoader) == (kw.get("workers", "threads") == "threads")
    assert len(got) == 4  # 28 samples, batches of 8
    same(got, [(fn(images), labels, index) for images, labels, index in plain])
    assert all(torch.equal(g[1], p[1]) and torch.equal(g[2], p[2]) for g, p in zip(got, plain))  # labels untouched
    assert plain[0][0].shape[1:] == (3, STORED, STORED)  # the batch f saw: the stored pixels
    ds.close()


@pytest.mark.parametrize("kw", [MODES[0], MODES[1], MODES[2], MODES[4]])
def test_batch_transform_composes_with_the_fused_center_crop(packed, kw, monkeypatch):
    """ResizeCenterCrop at the stored size is one whole-batch read; batch_transform runs on its result."""
    ds = open_dataset(packed / "mmap", transform=ResizeCenterCrop(STORED, 20))
    assert ds.batchable()
    plain, _ = batches(ds, **kw)
    got, _ = batches(ds, batch_transform=flip_normalise, **kw)
    assert plain[0][0].shape[1:] == (3, 20, 20)
    same(got, [(flip_normalise(images), labels) for images, labels in plain])
    ds.close()


def test_batch_transform_under_auto_keeps_threads_and_sees_bytes_batches(packed):
    ds = open_dataset(packed / "lmdb", decode=False)
    plain, _ = batches(ds, num_workers=2)
    got, loader = batches(ds, num_workers=2, batch_transform=sizes)
    assert isinstance(loader, ThreadLoader)  # one op per batch: no reason for processes
    assert isinstance(plain[0][0], ByteBatch)
    same(got, [(sizes(data), labels) for data, labels in plain])
    got, _ = batches(ds, num_workers=2, workers="processes", batch_transform=sizes)
    same(got, [(sizes(data), labels) for data, labels in plain])
    ds.close()


@pytest.mark.parametrize("kw", [MODES[0], MODES[1], MODES[2], MODES[4]])
@pytest.mark.parametrize("fn,says", [(not_a_batch, "returned a float, not a batch"),
                                     (wrong_length, "returned a Tensor of shape (1, 3, 24, 24), not a batch")])
def test_a_result_that_is_not_a_batch_is_refused_in_one_line(packed, kw, fn, says):
    ds = open_dataset(packed / "mmap")
    with pytest.raises(TypeError) as err:
        batches(ds, batch_transform=fn, **kw)
    # the line itself (a worker process's error arrives as DataLoader's "Caught TypeError in ..." + traceback)
    in_process = kw.get("workers") == "processes" and kw["num_workers"] > 0
    text = str(err.value).splitlines()[-1 if in_process else 0]
    assert text.startswith(f"TypeError: batch_transform {fn.__name__} {says}" if in_process
                           else f"batch_transform {fn.__name__} {says}"), text
    assert text.endswith("it must return a tensor whose first dimension is the batch's 8 images"), text
    del err
    gc.collect()  # the failed loader's workers and pipes
    ds.close()


def test_what_cannot_reach_spawn_workers_is_refused_before_they_start(packed):
    ds = open_dataset(packed / "mmap")
    with pytest.raises(ValueError, match=r"batch_transform .*lambda.* cannot be sent to spawn worker processes"):
        make_loader(ds, num_workers=2, workers="processes", multiprocessing_context="spawn",
                    batch_transform=lambda images: images)
    loader = make_loader(ds, num_workers=2, workers="processes", batch_size=8, persistent_workers=False,
                         multiprocessing_context="fork", batch_transform=lambda images: images[:, :1])
    assert next(iter(loader))[0].shape == (8, 1, STORED, STORED)  # fork: no pickling, a lambda is fine
    with pytest.raises(ValueError, match="with a collate_fn of your own"):
        make_loader(ds, collate_fn=list, batch_transform=center_crop)
    with pytest.raises(TypeError, match="batch_transform must be callable, got a int"):
        BatchTransform(3)  # type: ignore[arg-type]
    ds.close()


def test_a_crop_view_travels_in_the_workers_slot(packed):
    """A view of the slot (the crop) is sent as a reference to the worker's shared-memory slot."""
    ds = open_dataset(packed / "mmap")
    got, _ = batches(ds, num_workers=1, workers="processes", batch_transform=center_crop)
    images = got[0][0]
    assert images.shape == (8, 3, 16, 16) and not images.is_contiguous()  # a strided view, not a copy
    assert images.untyped_storage().nbytes() >= 8 << 20  # the storage is the worker's slot (8 MB at least)
    ds.close()
