"""make_loader(..., workers="threads"): same batches as worker processes, epochs, seeding, errors, stopping."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch

from readers.contract import spec
from readers.contract.env import ThreadWorker, as_thread_worker, current_worker_env, thread_worker, worker_seed
from readers.loader.dataloader import make_loader
from readers.contract.perprocess import PerProcess
from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS
from readers.loader.dataloader import PackedLoader, ThreadLoader
from readers.decode.transforms import imagenet_train_transform

MAP_FORMATS = [f for f in FORMATS if f != "wds"]


def order(loader) -> list[list[int]]:
    return [batch[-1].tolist() for batch in loader]


def loader_for(root, workers, kind, seed=3, **kw):
    ds = open_dataset(root, return_index=True, decode=kw.pop("decode", True), transform=kw.pop("transform", None))
    return make_loader(ds, batch_size=kw.pop("batch_size", 4), num_workers=workers, seed=seed, workers=kind, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", MAP_FORMATS)
def test_threads_give_the_batches_processes_give(packed_generated, fmt):
    for decode in (True, False):
        threads = loader_for(packed_generated[fmt], 2, "threads", decode=decode)
        procs = loader_for(packed_generated[fmt], 2, "processes", decode=decode)
        assert [order(threads) for _ in range(2)] == [order(procs) for _ in range(2)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_sample_once_per_epoch_new_order_each_epoch(packed_generated, fmt):
    n = spec.read_index(packed_generated[fmt]).num_samples
    loader = loader_for(packed_generated[fmt], 2, "threads", decode=False)
    epochs = [sum(order(loader), []) for _ in range(3)]
    for seen in epochs:
        assert sorted(seen) == list(range(n))
    assert epochs[0] != epochs[1]
    again = loader_for(packed_generated[fmt], 2, "threads", decode=False)
    assert [sum(order(again), []) for _ in range(3)] == epochs  # same seed, same orders
    assert len(loader) == len(loader_for(packed_generated[fmt], 2, "processes", decode=False))  # as DataLoader says
    if fmt != "wds":  # (an IterableDataset's len is the DataLoader's estimate, in both modes)
        assert len(loader) == sum(1 for _ in loader)


def test_set_epoch_chooses_the_order(packed_generated):
    a = loader_for(packed_generated["lmdb"], 2, "threads")
    b = loader_for(packed_generated["lmdb"], 2, "threads")
    first = [order(a) for _ in range(3)]
    b.set_epoch(2)
    assert order(b) == first[2]
    assert b.epoch == 2


def test_shard_threads_read_the_worker_slices(packed_generated):
    """Thread w reads the stream slice worker process w would: the same samples per position."""
    root = packed_generated["wds"]
    threads = sum(order(loader_for(root, 2, "threads")), [])
    procs = sum(order(loader_for(root, 2, "processes")), [])
    assert Counter(threads) == Counter(procs)
    assert threads[:4] == procs[:4]  # batch 0 comes from worker / thread 0 either way


def test_seeded_transforms_repeat_and_differ_per_thread(packed_generated):
    root = packed_generated["lmdb"]

    def images(seed):
        loader = loader_for(root, 2, "threads", seed=seed, transform=imagenet_train_transform(size=16))
        return [b[0] for b in loader]

    first, again, other = images(1), images(1), images(2)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not all(torch.equal(x, y) for x, y in zip(first, other))


def test_thread_context_reaches_worker_env_and_seed():
    assert thread_worker() is None and worker_seed() is None
    seen = {}

    def run():
        with as_thread_worker(ThreadWorker(1, 3, 1234)):
            seen["env"], seen["seed"] = current_worker_env(), worker_seed()
        seen["after"] = thread_worker()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert (seen["env"].worker_id, seen["env"].num_workers, seen["seed"]) == (1, 3, 1234)
    assert seen["after"] is None and thread_worker() is None


class _Boom(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 17:
            raise spec.DatasetFormatError(f"sample {i} is damaged")
        return torch.zeros(2), i


def test_an_error_in_a_thread_reaches_the_caller_as_itself():
    loader = make_loader(_Boom(), batch_size=4, num_workers=2, workers="threads", shuffle=False)
    with pytest.raises(spec.DatasetFormatError, match="sample 17 is damaged") as info:
        list(loader)
    assert any("loader thread" in note for note in getattr(info.value, "__notes__", []))


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loader-thread-") and t.is_alive()]


def test_stopping_early_stops_the_threads(packed_generated):
    loader = loader_for(packed_generated["mmap"], 2, "threads", batch_size=2)
    it = iter(loader)
    next(it)
    assert _loader_threads()
    it.close()
    assert not _loader_threads()


def test_zero_workers_run_in_the_calling_thread(packed_generated):
    loader = loader_for(packed_generated["hdf5"], 0, "threads")
    before = threading.active_count()
    batches = order(loader)
    assert threading.active_count() == before
    assert sorted(sum(batches, [])) == list(range(spec.read_index(packed_generated["hdf5"]).num_samples))


def test_bad_worker_kind_is_refused(packed_generated):
    with pytest.raises(ValueError, match="threads"):
        make_loader(open_dataset(packed_generated["lmdb"]), workers="fibers")
    loader = make_loader(open_dataset(packed_generated["lmdb"]), num_workers=1, workers="threads")
    assert isinstance(loader, ThreadLoader) and isinstance(loader, PackedLoader)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_worker_init_fn_runs_in_each_loader_thread(packed_generated, fmt):
    calls = []

    def init(worker_id):
        calls.append((worker_id, thread_worker().worker_id, threading.current_thread().name))

    loader = loader_for(packed_generated[fmt], 2, "threads", worker_init_fn=init)
    assert sorted(sum(order(loader), [])) == list(range(spec.read_index(packed_generated[fmt]).num_samples))
    assert sorted(calls) == [(0, 0, "loader-thread-0"), (1, 1, "loader-thread-1")]
    order(loader)
    assert len(calls) == 4, "worker_init_fn runs once per thread per epoch, as per worker process"


def test_a_failing_worker_init_fn_reaches_the_caller(packed_generated):
    def init(worker_id):
        raise KeyError(f"no config for worker {worker_id}")

    with pytest.raises(KeyError, match="no config for worker") as info:
        order(loader_for(packed_generated["mmap"], 2, "threads", worker_init_fn=init))
    assert any("worker_init_fn" in note for note in info.value.__notes__)
    assert not _loader_threads()


def test_perprocess_creates_one_value_for_racing_threads():
    made = []
    barrier = threading.Barrier(8)

    def factory():
        made.append(object())
        return made[-1]

    holder = PerProcess(factory)
    got = []

    def use():
        barrier.wait()
        got.append(holder.get())

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)


def test_threads_feed_byte_batches_of_the_stored_bytes(packed_generated):
    for fmt in FORMATS:
        ds = open_dataset(packed_generated[fmt], decode=False, return_index=True)
        for data, _labels, idx in make_loader(ds, batch_size=5, num_workers=2, workers="threads"):
            for k, i in enumerate(idx.tolist()):
                expected = ds.read(i)
                expected = expected.tobytes() if isinstance(expected, np.ndarray) else expected
                assert data.get(k) == expected


def _copy_dataset(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_whole_batch_shard_reads_check_every_header(packed_generated, tmp_path):
    """A damaged tar header fails the batch with the shard and byte named; a header spelled
    differently but valid (what other tar writers write) is accepted."""
    from readers.formats.shardbatch import iter_batches, supported

    root = _copy_dataset(packed_generated["wds"], tmp_path / "wds")
    ds = open_dataset(root, decode=False, return_index=True)
    assert supported(ds) and not supported(open_dataset(root))
    index = spec.read_index(root)
    shard, offset = int(index.arrays["shards"][3]), int(index.arrays["offsets"][3])
    path = root / index.meta["shards"][shard]["name"]
    raw = bytearray(path.read_bytes())
    header = raw[offset - 512:offset]
    size = int(header[124:135], 8)
    # another valid spelling of the same size field (space-terminated), checksum recomputed
    header[124:136] = b"%011o " % size
    header[148:156] = b"        "
    header[148:156] = b"%06o\0 " % sum(header)
    raw[offset - 512:offset] = header
    path.write_bytes(bytes(raw))
    seen = sum((b[-1].tolist() for b in iter_batches(ds.with_order(shuffle=False), 4)), [])
    assert sorted(seen) == list(range(len(index.labels)))
    raw[offset - 512 + 3] ^= 0x01  # the key no longer names sample 3
    path.write_bytes(bytes(raw))
    with pytest.raises(spec.DatasetFormatError, match=rf"{path.name} at byte {offset - 512}: tar header is not sample 3"):
        list(iter_batches(ds.with_order(shuffle=False), 4))


def test_whole_batch_headers_are_checked_once_per_mapping(packed_generated, tmp_path, monkeypatch):
    """Epoch 1 checks every header; later epochs through the same mappings copy data only. A shard
    whose mapping was dropped is checked again: damage written since then is found."""
    from readers.formats import shardbatch

    root = _copy_dataset(packed_generated["wds"], tmp_path / "wds")
    ds = open_dataset(root, decode=False, return_index=True).with_order(shuffle=False)
    index = spec.read_index(root)
    n = index.num_samples
    checked = []
    real = shardbatch.canonical_ok
    monkeypatch.setattr(shardbatch, "canonical_ok", lambda h, i, z: (checked.extend(i.tolist()), real(h, i, z))[1])
    maps = shardbatch.ShardMaps()
    for _ in range(2):
        seen = sum((b[-1].tolist() for b in shardbatch.iter_batches(ds, 4, maps=maps)), [])
        assert seen == list(range(n))
    assert sorted(checked) == list(range(n))  # every header once, none in epoch 2
    assert len(index.meta["shards"]) >= 2
    # one mapping at a time: each new shard drops the last, so every epoch checks every header again
    monkeypatch.setattr(shardbatch, "MAX_MAPPED", 1)
    shard, offset = int(index.arrays["shards"][0]), int(index.arrays["offsets"][0])
    path = root / index.meta["shards"][shard]["name"]
    fresh = shardbatch.ShardMaps()
    list(shardbatch.iter_batches(ds, 4, maps=fresh))
    with open(path, "r+b") as f:  # damage sample 0's key in place (as the kept mapping would see it)
        f.seek(offset - 512)
        f.write(b"9")
    with pytest.raises(spec.DatasetFormatError, match=rf"{path.name} at byte {offset - 512}: tar header is not sample 0"):
        list(shardbatch.iter_batches(ds, 4, maps=fresh))


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_ranks_split_the_epoch_in_threads_as_in_processes(packed_generated, monkeypatch, fmt):
    """Under DDP (WORLD_SIZE=2) each rank's thread loader reads its own half; together, every sample."""
    n = spec.read_index(packed_generated[fmt]).num_samples
    seen = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        seen[rank] = sum(order(loader_for(packed_generated[fmt], 2, "threads", distributed=True)), [])
    assert set(seen[0]) | set(seen[1]) == set(range(n))
    assert abs(len(seen[0]) - len(seen[1])) == 0 and len(set(seen[0]) & set(seen[1])) <= 1  # padded to equal


@pytest.mark.parametrize("fmt", ["lmdb", "wds", "mmap"])
def test_thread_loaders_resume_mid_epoch_exactly(packed_generated, fmt):
    """PackedLoader's state protocol holds with threads: save after k batches, a new loader
    delivers exactly the rest of the epoch, in the uninterrupted order."""
    full = loader_for(packed_generated[fmt], 2, "threads")
    whole = order(full)
    first = loader_for(packed_generated[fmt], 2, "threads")
    it = iter(first)
    head = [next(it)[-1].tolist() for _ in range(3)]
    state = first.state_dict()
    del it
    assert state["delivered"] == 3 and head == whole[:3]
    resumed = loader_for(packed_generated[fmt], 2, "threads")
    resumed.load_state_dict(state)
    assert order(resumed) == whole[3:]
