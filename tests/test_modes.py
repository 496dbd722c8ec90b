"""make_loader's worker modes: the kind ``workers="auto"`` picks, whole batches through worker
processes' shared-memory slots, and the center crop of stored pixels as one batch read."""

from __future__ import annotations

import gc
import logging
import os

import numpy as np
import pytest
import torch

from readers import make_loader, open_dataset
from readers.loader import shmring
from readers.formats.batch import GatheredItems
from readers.decode.compose import Compose
from readers.loader.dataloader import PackedLoader, ThreadLoader, choose_workers, collate
from readers.loader.shmring import ByteBatch
from readers.decode.transforms import ResizeCenterCrop, imagenet_eval_transform, imagenet_train_transform

STORED = 24  # mmap-fixed's stored size


@pytest.fixture(scope="module")
def packed(tmp_path_factory, packed_generated, generated):
    """Every format, plus mmap packed at a fixed size (whole-batch reads need one)."""
    from packer import PackOptions, pack

    out = tmp_path_factory.mktemp("modes") / "mmap-fixed"
    pack(generated, out, PackOptions(format="mmap", resize=STORED, workers=1))
    return {**packed_generated, "mmap-fixed": out}


def user_transform(image):
    """A transform of the caller's own (Python code per sample)."""
    return image


# --------------------------------------------------------------------------- what "auto" picks

THREADS = [
    ("lmdb", {"decode": False}, {}),
    ("wds", {"decode": False}, {}),
    ("mmap-fixed", {}, {}),
    ("mmap-fixed", {"transform": ResizeCenterCrop(STORED, 16)}, {}),  # a crop of stored pixels: whole batches
    ("wds", {}, {}),  # the reader's own decode
    ("wds", {"transform": imagenet_eval_transform(16, 20)}, {}),
    ("lmdb", {"decode": False, "transform": user_transform}, {}),  # decode=False: no transform runs
]
PROCESSES = [
    ("hdf5", {}, {}, "map-style reader decoding each sample"),  # the reader's own decode
    ("lmdb", {"transform": Compose([imagenet_train_transform(16, seed=0)])}, {}, "map-style reader decoding"),
    ("mmap-fixed", {"transform": imagenet_train_transform(16, seed=0)}, {}, "map-style reader decoding"),
    ("lmdb", {"transform": user_transform}, {}, "Python transform of your own (function)"),
    ("lmdb", {"transform": Compose([imagenet_eval_transform(16, 20), user_transform])}, {}, "Compose"),
    ("wds", {"image": "pil"}, {}, "image='pil'"),
    ("lmdb", {"decode": False}, {"collate_fn": collate}, "collate_fn of your own (collate)"),
    ("mmap-fixed", {"transform": imagenet_train_transform(16, seed=0)}, {"num_workers": 0}, "num_workers=0"),
    ("wds", {}, {"num_workers": 0}, "num_workers=0"),  # decoding: the DataLoader, as before
    ("lmdb", {"decode": False}, {"worker_init_fn": print}, "worker_init_fn of your own"),
]


@pytest.mark.parametrize("fmt,opts,kw", THREADS)
def test_auto_picks_threads_where_the_readers_own_work_releases_the_gil(packed, fmt, opts, kw, caplog):
    ds = open_dataset(packed[fmt], **opts)
    with caplog.at_level(logging.INFO, logger="readers.loader.dataloader"):
        loader = make_loader(ds, batch_size=4, num_workers=2, **kw)
    assert type(loader) is ThreadLoader
    lines = [r.getMessage() for r in caplog.records if r.name == "readers.loader.dataloader"]
    assert len(lines) == 1 and "2 worker threads" in lines[0] and "releases the GIL" in lines[0], lines
    ds.close()


@pytest.mark.parametrize("fmt,opts,kw,why", PROCESSES)
def test_auto_picks_processes_for_python_code_of_the_callers_own(packed, fmt, opts, kw, why, caplog):
    ds = open_dataset(packed[fmt], **opts)
    kw = {"num_workers": 2, **kw}
    with caplog.at_level(logging.INFO, logger="readers.loader.dataloader"):
        loader = make_loader(ds, batch_size=4, **kw)
    assert type(loader) is PackedLoader
    lines = [r.getMessage() for r in caplog.records if r.name == "readers.loader.dataloader"]
    assert len(lines) == 1 and "processes" in lines[0] and why in lines[0], lines
    ds.close()


@pytest.mark.parametrize("fmt,opts", [("wds", {"decode": False}), ("lmdb", {"decode": False}),
                                      ("hdf5", {"decode": False}), ("mmap-fixed", {})])
def test_no_workers_reads_whole_batches_in_the_calling_thread(packed, fmt, opts, caplog, monkeypatch):
    """With num_workers=0, "auto" takes the ThreadLoader where it reads whole batches (no threads: the
    calling thread does the work), and it delivers what the DataLoader in that thread delivers: the same
    batches in the same order, and the same batches after a mid-epoch resume."""
    import threading

    ds = open_dataset(packed[fmt], return_index=True, **opts)
    with caplog.at_level(logging.INFO, logger="readers.loader.dataloader"):
        auto = make_loader(ds, batch_size=4, num_workers=0, seed=3)
    assert type(auto) is ThreadLoader
    lines = [r.getMessage() for r in caplog.records if r.name == "readers.loader.dataloader"]
    assert len(lines) == 1 and "0 worker threads" in lines[0] and "whole batches" in lines[0], lines
    plain = make_loader(ds, batch_size=4, num_workers=0, seed=3, workers="processes")
    assert type(plain) is PackedLoader

    def epoch(loader):
        out = []
        for images, labels, index in loader:
            data = images.data if isinstance(images, ByteBatch) else images
            out.append((index.tolist(), labels.tolist(), bytes(data.contiguous().numpy())))
        return out

    before = threading.active_count()
    got, want = epoch(auto), epoch(plain)
    assert threading.active_count() == before  # nothing ran outside the calling thread
    assert got == want and len(got) == len(auto)
    assert sorted(i for index, _, _ in got for i in index) == list(range(len(ds)))
    for kind in ({}, {"workers": "processes"}):  # stop after 2 batches, resume in a fresh loader of the same kind
        loader = make_loader(ds, batch_size=4, num_workers=0, seed=3, **kind)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        del it
        fresh = make_loader(ds, batch_size=4, num_workers=0, seed=3, **kind)
        fresh.load_state_dict(state)
        assert epoch(fresh) == want[2:]
    ds.close()


def test_auto_looks_into_mixtures_and_subsets(packed):
    from readers import mix, subset

    own = open_dataset(packed["lmdb"], decode=False)
    theirs = open_dataset(packed["hdf5"], decode=False, transform=user_transform)
    decoded = open_dataset(packed["hdf5"], transform=user_transform)
    assert choose_workers(subset(own, indices=np.arange(5)), num_workers=2)[0] == "threads"
    assert choose_workers(subset(decoded, indices=np.arange(5)), num_workers=2)[0] == "processes"
    assert choose_workers(mix([(own, 1.0), (theirs, 1.0)]), num_workers=2)[0] == "threads"
    assert choose_workers(torch.utils.data.TensorDataset(torch.zeros(3)), num_workers=2) == \
        ("processes", "a dataset of your own (TensorDataset)")
    for ds in (own, theirs, decoded):
        ds.close()


def test_workers_overrides_auto(packed):
    ds = open_dataset(packed["lmdb"], transform=user_transform)
    assert type(make_loader(ds, batch_size=4, num_workers=2, workers="threads")) is ThreadLoader
    own = open_dataset(packed["lmdb"], decode=False)
    assert type(make_loader(own, batch_size=4, num_workers=2, workers="processes")) is PackedLoader
    with pytest.raises(ValueError, match="'auto', 'threads', 'processes'"):
        make_loader(own, workers="fibers")
    ds.close()
    own.close()


# --------------------------------------------------------------------------- batches through slots

def _worker_segments() -> set[str]:
    return {n for n in shmring.ATTACHED if shmring.pid_of(n) != os.getpid()}


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("fmt,decode", [("mmap-fixed", True), ("mmap-fixed", False), ("lmdb", False),
                                        ("hdf5", False), ("wds", False)])
def test_whole_batches_cross_from_worker_processes_in_slots(packed, fmt, decode):
    """A whole-batch read is written into a worker's slot and handed out as a view of it: the
    main process maps the workers' segments, and every batch equals the main process's own read."""
    shmring.release_dead()
    ds = open_dataset(packed[fmt], decode=decode, return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=2, workers="processes", persistent_workers=False)
    seen, attached = [], set()
    for epoch in range(2):
        for images, labels, index in loader:  # each batch dropped as the next comes: slots reused
            ref = ds.gathered(index.tolist()) if fmt == "wds" else None  # wds: its whole-batch read (shardbatch)
            ref_images, ref_labels, _ = ref.gather() if ref is not None else ds.get_batch(index.tolist())
            if isinstance(images, ByteBatch):
                assert torch.equal(images.data, ref_images.data) and torch.equal(images.offsets, ref_images.offsets)
            else:
                assert torch.equal(images, ref_images)
            assert torch.equal(labels, ref_labels)
            seen += index.tolist()
            attached |= _worker_segments()
        del images, labels, index
    assert sorted(seen) == sorted(list(range(len(ds))) * 2)
    # persistent_workers=False: two new workers each epoch, each with its own segment
    assert len({shmring.pid_of(n) for n in attached}) == 4, f"batches did not come through the workers' slots: {attached}"
    del loader
    gc.collect()
    ds.close()


@pytest.mark.slow  # DataLoader worker processes
def test_a_caller_keeping_every_batch_still_gets_every_batch_right(packed):
    """Kept batches keep their slots; the workers then send the next ones the ordinary way."""
    ds = open_dataset(packed["mmap-fixed"], return_index=True)
    loader = make_loader(ds, batch_size=2, num_workers=2, workers="processes", persistent_workers=False,
                         shuffle=False)
    kept = list(loader)
    assert len(kept) > 2 * (loader.prefetch_factor + 3)  # more than the slots of both workers
    for images, _labels, index in kept:
        assert torch.equal(images, ds.get_batch(index.tolist())[0])
    del kept, loader
    gc.collect()
    ds.close()


# --------------------------------------------------------------------------- crops of stored pixels

@pytest.mark.parametrize("backend", ["torch", "pillow"])
def test_center_crop_of_stored_pixels_is_one_batch_read(packed, backend, monkeypatch):
    ds = open_dataset(packed["mmap-fixed"], transform=ResizeCenterCrop(STORED, 16, backend=backend),
                      return_index=True)
    indices = [5, 0, 3, 3, -1]
    expected = collate([ds[i] for i in indices])  # one transform call per sample
    assert ds.batchable()
    assert isinstance(ds.__getitems__(indices), GatheredItems)

    def per_sample(self, image):
        raise AssertionError("the transform ran per sample")

    monkeypatch.setattr(ResizeCenterCrop, "__call__", per_sample)
    images, labels, index = ds.get_batch(indices)
    assert images.shape == (5, 3, 16, 16) and torch.equal(images, expected[0])
    assert torch.equal(labels, expected[1]) and torch.equal(index, expected[2])
    loader = make_loader(ds, batch_size=4, num_workers=2, shuffle=False)  # threads: whole batches
    assert torch.equal(torch.cat([b[0] for b in loader]), ds.get_batch(list(range(len(ds))))[0])
    ds.close()


@pytest.mark.parametrize("transform", [ResizeCenterCrop(STORED + 8, 16), imagenet_train_transform(16, seed=0),
                                       user_transform], ids=["resizes", "train", "user"])
def test_transforms_that_resample_stay_per_sample(packed, transform):
    ds = open_dataset(packed["mmap-fixed"], transform=transform)
    assert not ds.batchable() and ds.get_batch([0, 1]) is None
    assert isinstance(ds.__getitems__([0, 1]), list)
    ds.close()


def to_float(image):
    """A user's transform making float images (what ToTensor gives)."""
    return image.to(torch.float32).div(255)


@pytest.mark.slow  # DataLoader worker processes
def test_decoded_images_of_a_users_transform_are_stacked_into_slots(packed):
    shmring.release_dead()
    ds = open_dataset(packed["mmap-fixed"], transform=to_float, return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=2, persistent_workers=False)
    assert type(loader) is PackedLoader  # a transform of the caller's own: processes
    seen, attached = [], set()
    for images, labels, index in loader:
        expected = collate([ds[i] for i in index.tolist()])
        assert images.dtype == torch.float32 and torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
        seen += index.tolist()
        attached |= _worker_segments()
    del images, labels, index
    assert sorted(seen) == list(range(len(ds)))
    assert len({shmring.pid_of(n) for n in attached}) == 2, attached
    del loader
    gc.collect()
    ds.close()


@pytest.mark.slow  # a subprocess with worker pools
def test_bench_modes_quick(tmp_path):
    """benchmarks/bench_modes.py --quick runs end to end (a smoke test; the figures are not checked)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_modes.py"
    out = tmp_path / "modes.json"
    r = subprocess.run([sys.executable, "-W", "error", str(script), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rows = {line.split()[0] for line in r.stdout.splitlines()[2:] if line and not line.startswith(("raw224 /", "pil /"))}
    assert rows == {"bytes/wds", "bytes/lmdb", "bytes/hdf5", "raw/mmap", "raw224/mmap", "pil/wds", "naive"}
    results = json.loads(out.read_text())["results"]
    assert len(results) == 6 * 3 + 1 and all(v > 0 for v in results.values())
    assert [p.name for p in tmp_path.iterdir()] == ["modes.json"]


@pytest.mark.skipif(torch.accelerator.is_available(), reason="pins for real where an accelerator is there")
@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_pin_memory_without_an_accelerator_warns_and_loads(packed, kind):
    """As a DataLoader's iterator does: a warning, no pinning, every batch (the threads used to fail)."""
    ds = open_dataset(packed["mmap-fixed"], return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=0 if kind == "processes" else 2, workers=kind,
                         pin_memory=True)
    with pytest.warns(UserWarning, match="no accelerator is found"):
        seen = [i for _, _, index in loader for i in index.tolist()]
    assert sorted(seen) == list(range(len(ds)))
    ds.close()
