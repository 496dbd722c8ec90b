"""Whole-batch reads (readers.formats.batch): the same batches as per-sample reads, buffers reused only when free."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from readers.formats.base import to_chw
from readers.formats.batch import BufferPool, GatheredItems, index_array
from readers.loader.dataloader import collate, make_loader
from readers.loader.prefetch import DevicePrefetcher
from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS

MAP_FORMATS = [f for f in FORMATS if f != "wds"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory, packed_generated, generated):
    """Every map format, plus mmap packed at a fixed size (the whole-batch gather needs one)."""
    from packer import PackOptions, pack

    out = tmp_path_factory.mktemp("batch") / "mmap-fixed"
    pack(generated, out, PackOptions(format="mmap", resize=24, workers=1))
    return {**packed_generated, "mmap-fixed": out}


def per_sample(ds, indices):
    """The per-sample path: one read per index, collated."""
    return collate([ds._item(i, ds.read(i)) for i in indices])


@pytest.mark.parametrize("fmt", MAP_FORMATS + ["mmap-fixed"])
@pytest.mark.parametrize("decode", [True, False])
def test_get_batch_equals_the_per_sample_batch(packed, fmt, decode):
    ds = open_dataset(packed[fmt], decode=decode, return_index=True)
    indices = [5, 0, 3, 3, -1]
    batch = ds.get_batch(indices)
    if not ds.batchable():
        assert batch is None
        return
    expected = per_sample(ds, index_array(indices, len(ds)).tolist())
    assert [type(x) for x in batch] == [type(x) for x in expected]
    images, ref = batch[0], expected[0]
    if decode:
        assert images.shape == ref.shape and images.dtype == torch.uint8
        assert torch.equal(images, ref)
    else:
        assert [images.get(k) for k in range(len(indices))] == [ref.get(k) for k in range(len(indices))]
    for got, want in zip(batch[1:], expected[1:]):
        assert torch.equal(got, want)


def test_mmap_batches_are_channels_last_views_of_the_stored_rows(packed):
    assert not open_dataset(packed["mmap"]).batchable()  # samples of different shapes: per sample
    ds = open_dataset(packed["mmap-fixed"])
    assert ds.batchable()
    images, labels = ds.get_batch([2, 1])
    assert images.shape[1] == 3 and images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images[0], to_chw(ds.read(2)))
    assert labels.tolist() == [int(ds.labels[2]), int(ds.labels[1])]


def test_getitems_is_a_sequence_of_the_same_items(packed):
    for fmt in MAP_FORMATS:
        ds = open_dataset(packed[fmt], decode=False)
        items = ds.__getitems__([1, 4])
        plain = [ds[1], ds[4]]
        assert len(items) == 2 and list(items) == plain
    ds = open_dataset(packed["mmap-fixed"])
    items = ds.__getitems__([1, 4])
    assert isinstance(items, GatheredItems)
    stacked = default_collate(list(items))  # a collate that knows nothing of GatheredItems
    assert torch.equal(stacked[0], torch.stack([ds[1][0], ds[4][0]]))
    with pytest.raises(IndexError):
        ds.__getitems__([0, len(ds)])


@pytest.mark.slow
def test_loader_batches_of_mmap_go_through_the_gather(packed):
    ds = open_dataset(packed["mmap-fixed"], return_index=True)
    for workers in (0, 2):
        for images, labels, idx in make_loader(ds, batch_size=4, num_workers=workers):
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(images[0], to_chw(ds.read(int(idx[0]))))


def test_device_prefetcher_takes_channels_last_batches(packed):
    ds = open_dataset(packed["mmap-fixed"])
    images, labels = ds.get_batch([0, 1, 2])
    contiguous = images.contiguous()
    (x,) = [b[0] for b in DevicePrefetcher([(images, labels)], "cpu")]
    (y,) = [b[0] for b in DevicePrefetcher([(contiguous, labels)], "cpu")]
    assert torch.equal(x, y) and x.is_contiguous()
    (z,) = [b[0] for b in DevicePrefetcher([(images, labels)], "cpu", channels_last=True)]
    assert torch.equal(z, y) and z.is_contiguous(memory_format=torch.channels_last)


def test_buffer_pool_reuses_only_free_buffers():
    pool = BufferPool(max_buffers=3)
    a = pool(1000)
    a[:] = 1
    b = pool(1000)
    assert not np.shares_memory(a, b)  # a is still held
    address = a.__array_interface__["data"][0]
    del a
    c = pool(900)
    assert c.__array_interface__["data"][0] == address  # a's buffer came back
    held = [pool(1000) for _ in range(5)]  # past max_buffers: fresh arrays, never a held one
    for i, x in enumerate(held + [b, c]):
        for y in (held + [b, c])[i + 1:]:
            assert not np.shares_memory(x, y)
    t = torch.from_numpy(pool(500))  # a tensor made from a view keeps the buffer
    del held, b, c
    d = [pool(500) for _ in range(3)]
    assert not any(np.shares_memory(t.numpy(), x) for x in d)


def test_index_array_wraps_negatives_and_refuses_out_of_range():
    assert index_array([0, -1, 2], 5).tolist() == [0, 4, 2]
    with pytest.raises(IndexError, match="out of range"):
        index_array([5], 5)
    with pytest.raises(IndexError):
        index_array([-6], 5)


@pytest.mark.slow
def test_byte_batches_of_every_map_format_cross_processes(packed):
    for fmt in MAP_FORMATS + ["mmap-fixed"]:
        ds = open_dataset(packed[fmt], decode=False, return_index=True)
        for data, _labels, idx in make_loader(ds, batch_size=3, num_workers=2):
            want = ds.read(int(idx[-1]))
            want = want.tobytes() if isinstance(want, np.ndarray) else want
            assert data.get(len(idx) - 1) == want


def test_copy_runs_native_and_numpy_give_the_same_bytes(monkeypatch):
    """The native gather (streamed stores from 4 KB on, memcpy below, any alignment of source and
    destination) and the numpy fallback copy the same runs; a run outside its source, or runs that
    do not fill the batch, are refused before anything is copied."""
    from readers.formats import batch as b

    if b.gather_library() is None:
        pytest.skip("the native batch gather was not built here")
    rng = np.random.default_rng(0)
    sources = [rng.integers(0, 256, n, dtype=np.uint8) for n in (300_001, 70_000, 17)]
    which = rng.integers(0, 2, 200)
    sizes = np.where(rng.random(200) < 0.5, rng.integers(0, 4_096, 200), rng.integers(4_096, 60_000, 200))
    sizes[:3] = (0, 1, 4_095)
    starts = np.array([rng.integers(0, len(sources[w]) - s + 1) for w, s in zip(which, sizes)])
    which[-1], starts[-1], sizes[-1] = 2, 3, 14  # the last run from the 17-byte source
    want = np.concatenate([sources[w][a:a + n] for w, a, n in zip(which, starts, sizes)])
    for offset in (0, 1, 7):  # the batch buffer at an unaligned address, as a slice of a pool buffer
        data = np.full(len(want) + offset, 9, dtype=np.uint8)[offset:]
        b.copy_runs(data, sources, which, starts, sizes)
        assert np.array_equal(data, want)
    monkeypatch.setenv("DATASET_PACKER_GATHER", "off")
    assert b.gather_library() is None
    data = np.zeros(len(want), dtype=np.uint8)
    b.copy_runs(data, sources, which, starts, sizes)
    assert np.array_equal(data, want)
    monkeypatch.delenv("DATASET_PACKER_GATHER")
    data = np.zeros(len(want), dtype=np.uint8)
    past_end, before_start = starts.copy(), starts.copy()
    past_end[-1] = 4  # 4 + 14 bytes of the 17-byte source
    before_start[5] = -1
    for bad in ((past_end, sizes), (before_start, sizes), (starts, sizes + 1)):  # the last: one byte too many
        with pytest.raises(ValueError, match="copy_runs"):
            b.copy_runs(data, sources, which, *bad)
    assert not data.any()  # nothing copied


def test_a_native_helper_of_another_interface_is_not_used(caplog, monkeypatch):
    """readers.contract.env.native_library: a helper whose version is not the code's is refused with one
    warning saying what the package does instead; ``off`` in its variable turns it off; a function it
    lacks is refused the same way."""
    import logging

    from readers.contract.env import native_library
    from readers.formats.batch import GATHER, gather_library

    if gather_library() is None:
        pytest.skip("the native batch gather was not built here")
    with caplog.at_level(logging.WARNING, logger="readers.contract.env"):
        assert native_library(GATHER, version_symbol="gt_version", version=99, off_env="DP_TEST_OFF",
                              without="numpy copies", functions=()) is None
        assert native_library(GATHER, version_symbol="gt_version", version=1, off_env="DP_TEST_OFF",
                              without="numpy copies", functions=(("no_such_function", None, ()),)) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "another interface" in lines[0] and lines[0].endswith("numpy copies"), lines
    assert "no_such_function" in lines[1] and lines[1].endswith("numpy copies"), lines
    assert native_library(GATHER, version_symbol="gt_version", version=1, off_env="DP_TEST_OFF",
                          without="numpy copies", functions=()) is not None
    monkeypatch.setenv("DP_TEST_OFF", "off")
    assert native_library(GATHER, version_symbol="gt_version", version=1, off_env="DP_TEST_OFF",
                          without="numpy copies", functions=()) is None
