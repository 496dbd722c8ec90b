"""make_loader / PackedLoader: exactly-once epochs, reproducible order, set_epoch, start methods,
worker count from the CPU quota, /dev/shm check, ByteBatch, and ShardDataset's rank x worker split."""

from __future__ import annotations

import math
import shutil
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

import readers.contract.env
import readers.loader.shmspace
from conftest import make_image_folder
from packer import PackOptions, pack
from readers.contract import spec
from readers.contract.env import WorkerEnv, available_cpus, cgroup_cpu_limit
from readers.formats.wds import ShardDataset
from readers.loader.dataloader import ByteBatch, collate, make_loader, shm_check, use_file_system_sharing
from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS

MAP_FORMATS = [f for f in FORMATS if f != "wds"]
BATCH = 4


def epoch(loader) -> tuple[list[int], int]:
    """Sample indices of one pass over ``loader`` (items carry their index) and the batch count."""
    seen, batches = [], 0
    for batch in loader:
        seen += batch[-1].tolist()
        batches += 1
    return seen, batches


def indices(loader, n: int) -> list[list[int]]:
    return [epoch(loader)[0] for _ in range(n)]


def loader_for(root, workers: int, seed: int = 7, **kw):
    ds = open_dataset(root, return_index=True, decode=kw.pop("decode", True))
    return make_loader(ds, batch_size=kw.pop("batch_size", BATCH), num_workers=workers, seed=seed,
                       workers=kw.pop("kind", "auto"), **kw)


# --------------------------------------------------------------------------- epochs and order


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_exactly_once_new_order_each_epoch_same_for_same_seed(packed_generated, fmt):
    root = packed_generated[fmt]
    n = spec.read_index(root).num_samples
    runs = {}
    for workers in (0, 2):
        loader = loader_for(root, workers)
        runs[workers] = indices(loader, 2)
        for e in runs[workers]:
            assert sorted(e) == list(range(n)), f"{fmt} workers={workers}: not every sample exactly once"
        assert runs[workers][0] != runs[workers][1], "epoch 1 repeats epoch 0's order"
        again = loader_for(root, workers)
        assert indices(again, 2) == runs[workers], "same seed, different order"
        del loader, again
    if fmt != "wds":  # the sampler runs in the main process: workers do not change the order
        assert runs[2] == runs[0]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_loader_seed_changes_the_order(packed_generated, fmt):
    root = packed_generated[fmt]
    assert indices(loader_for(root, 0, seed=8), 1) != indices(loader_for(root, 0, seed=7), 1)


def _worker_batches(root, workers: int, ep: int, seed: int, monkeypatch) -> list[list[list[int]]]:
    """Each worker's batches as ShardDataset yields them for worker w of ``workers``."""
    out = []
    for w in range(workers):
        ds = ShardDataset(root, seed=seed, decode=False, return_index=True)
        ds.set_epoch(ep)
        monkeypatch.setattr(readers.contract.env, "worker_env_hook", lambda w=w: WorkerEnv(0, 1, w, workers))
        ids = [t[2] for t in ds]
        out.append([ids[k:k + BATCH] for k in range(0, len(ids), BATCH)])
    monkeypatch.undo()
    return out


def _round_robin(per_worker: list[list[list[int]]]) -> list[int]:
    """torch's in-order multi-worker iterable loading: batch k from worker k % W, skipping finished ones."""
    order, pos = [], [0] * len(per_worker)
    while any(p < len(b) for p, b in zip(pos, per_worker)):
        for w, b in enumerate(per_worker):
            if pos[w] < len(b):
                order += b[pos[w]]
                pos[w] += 1
    return order


@pytest.mark.slow  # DataLoader worker processes
def test_shard_dataset_worker_interleaving_is_deterministic(packed_generated, monkeypatch):
    root = packed_generated["wds"]
    loader = loader_for(root, 2)
    got = indices(loader, 2)
    seed = loader.dataset.seed  # what drives ShardDataset's shuffle (make_loader sets it)
    del loader
    for ep in (0, 1):
        expected = _round_robin(_worker_batches(root, 2, ep, seed, monkeypatch))
        assert got[ep] == expected, f"epoch {ep}: interleaving of workers differs from round-robin"


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_set_epoch_reaches_persistent_workers(packed_generated, fmt):
    root = packed_generated[fmt]
    loader = loader_for(root, 2, persistent_workers=True, kind="processes")
    e0 = epoch(loader)[0]
    workers = [w.pid for w in loader._iterator._workers]
    e1 = epoch(loader)[0]  # the next iter() is epoch 1
    assert [w.pid for w in loader._iterator._workers] == workers, "workers were not persistent"
    assert loader.epoch == 1 and e1 != e0
    fresh = loader_for(root, 2, persistent_workers=True, kind="processes")
    fresh.set_epoch(1)
    assert epoch(fresh)[0] == e1, "epoch 1 in persistent workers != a fresh loader's epoch 1"
    loader.set_epoch(0)
    assert epoch(loader)[0] == e0, "set_epoch(0) on persistent workers did not replay epoch 0"
    assert loader.epoch == 0
    del loader, fresh


@pytest.mark.slow  # DataLoader worker processes, spawn
@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")  # torch's hint before it re-raises
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_start_methods(packed_generated, fmt, context):
    root = packed_generated[fmt]
    n = spec.read_index(root).num_samples
    # spawn: one worker (each spawned worker re-imports torch: seconds) -- then even ShardDataset's
    # order equals the in-process order, and epoch 1 checks the epoch reaches a spawned persistent worker.
    workers = 2 if context == "fork" else 1
    loader = loader_for(root, workers, multiprocessing_context=context, persistent_workers=True)
    got = indices(loader, 2)
    assert all(sorted(e) == list(range(n)) for e in got)
    if fmt != "wds" or workers == 1:
        assert got == indices(loader_for(root, 0), 2)
    del loader


@pytest.mark.slow  # DataLoader worker processes, spawn
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_shard_dataset_rank_reaches_workers_without_env_vars(packed_generated, monkeypatch, context):
    """A process group initialised with explicit rank/world (no RANK/WORLD_SIZE in the environment):
    simulated as rank 1 of 2 in this process; workers must read rank 1's half, however they start."""
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    ds = ShardDataset(packed_generated["wds"], return_index=True, decode=False)
    assert len(ds) == 14  # 28 samples / 2 ranks
    loader = make_loader(ds, batch_size=BATCH, num_workers=1, multiprocessing_context=context,
                         persistent_workers=False)
    seen, _ = epoch(loader)
    assert len(seen) == len(ds), f"rank 1 of 2 yielded {len(seen)} samples, expected {len(ds)}"


# --------------------------------------------------------------------------- settings


def test_pin_memory_only_with_cuda(packed_generated):
    loader = loader_for(packed_generated["mmap"], 0)
    assert loader.pin_memory is torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert loader.pin_memory is False
    assert loader_for(packed_generated["mmap"], 0, pin_memory=True).pin_memory is True  # overridable


def test_default_num_workers_is_available_cpus(packed_generated, monkeypatch):
    ds = open_dataset(packed_generated["lmdb"])
    assert make_loader(ds, batch_size=2).num_workers == available_cpus()
    monkeypatch.setattr(readers.contract.env, "available_cpus", lambda: 1)  # (more than the host has would warn)
    loader = make_loader(ds, batch_size=2, workers="processes")
    assert loader.num_workers == 1 and loader.persistent_workers and loader.prefetch_factor == 2


@pytest.mark.parametrize("affinity,limit,expected", [
    (8, None, 8), (8, 1.5, 2), (8, 0.2, 1), (2, 16.0, 2), (8, 4.0, 4),
])
def test_available_cpus_honours_affinity_and_quota(monkeypatch, affinity, limit, expected):
    monkeypatch.setattr(readers.contract.env.os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(readers.contract.env, "cgroup_cpu_limit", lambda: limit)
    assert available_cpus() == expected


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("files,expected", [
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "200000 100000\n"}, 2.0),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "garbage"}, None),
    ({}, None),
], ids=["v2-1.5", "v2-2", "v2-max", "v1-0.5", "v1-3", "v1-unlimited", "v2-garbage", "none"])
def test_cgroup_cpu_limit(tmp_path, files, expected):
    assert cgroup_cpu_limit(_write(tmp_path, files)) == expected


def test_cgroup_cpu_limit_of_this_machine_is_sane():
    limit = cgroup_cpu_limit()
    assert limit is None or limit > 0
    assert 1 <= available_cpus() <= len(__import__("os").sched_getaffinity(0))


@pytest.fixture
def restore_sharing_strategy():
    saved = torch.multiprocessing.get_sharing_strategy()
    yield
    torch.multiprocessing.set_sharing_strategy(saved)


def test_shm_check_only_measures(restore_sharing_strategy):
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a check never warns
        roomy, short = shm_check(1), shm_check(1 << 62)
    assert roomy and roomy.enough and roomy.needed == 1 and roomy.free >= 1
    assert not short and not short.enough and short.needed == 1 << 62 and short.free == roomy.free
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor", "a check changed the strategy"
    unknown = shm_check(1 << 62, path="/no/such/folder")
    assert unknown and unknown.free is None  # cannot tell: assume there is room, as before


def test_use_file_system_sharing_switches_and_says_how_to_fix(restore_sharing_strategy):
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    short = shm_check(1 << 62)
    with pytest.warns(RuntimeWarning, match="--shm-size") as record:
        use_file_system_sharing(short)
    message = str(record[0].message)
    assert "file_system" in message and "/dev/shm" in message and f"{short.needed / 2**20:.0f} MB" in message
    assert record[0].filename == __file__  # names the caller's line
    assert torch.multiprocessing.get_sharing_strategy() == "file_system"


def test_make_loader_checks_shm(packed_generated, monkeypatch, restore_sharing_strategy):
    real = shutil.disk_usage

    def small_shm(path):
        return real(path)._replace(free=1 << 20) if str(path) == "/dev/shm" else real(path)

    monkeypatch.setattr(readers.loader.shmspace.shutil, "disk_usage", small_shm)
    ds = open_dataset(packed_generated["lmdb"])
    with pytest.warns(RuntimeWarning, match="--shm-size") as record:
        make_loader(ds, batch_size=64, num_workers=2, workers="processes")  # threads need no shared memory
    assert record[0].filename == __file__  # the warning points at the make_loader call
    assert torch.multiprocessing.get_sharing_strategy() == "file_system"


def test_make_loader_leaves_the_callers_dataset_alone(packed_generated):
    ds = ShardDataset(packed_generated["wds"], shuffle=True, seed=3, return_index=True)
    ds.set_epoch(5)
    before = {k: v for k, v in vars(ds).items() if isinstance(v, (bool, int, float, str))}
    loaders = {seed: make_loader(ds, batch_size=BATCH, num_workers=0, seed=seed) for seed in (7, 8)}
    unshuffled = make_loader(ds, batch_size=BATCH, num_workers=0, shuffle=False)
    orders = {seed: epoch(loader)[0] for seed, loader in loaders.items()}
    epoch(loaders[7])
    after = {k: v for k, v in vars(ds).items() if isinstance(v, (bool, int, float, str))}
    assert after == before and ds.seed == 3 and ds.shuffle is True, "make_loader changed the caller's dataset"
    assert ds.epoch == 5, "the loader's epochs reached the caller's dataset"
    assert all(loader.dataset is not ds and loader.dataset.index is ds.index for loader in loaders.values())
    assert orders[7] != orders[8], "the loader's seed does not decide the order"
    assert orders[7] == epoch(make_loader(ds, batch_size=BATCH, num_workers=0, seed=7))[0]
    assert epoch(unshuffled)[0] == list(range(len(ds.labels)))
    reference = ShardDataset(packed_generated["wds"], shuffle=True, seed=7, return_index=True)
    assert orders[7] == [t[2] for t in reference], "the loader's copy does not shuffle as ShardDataset(seed=7)"


@pytest.mark.parametrize("fmt", MAP_FORMATS)
def test_make_loader_takes_the_callers_sampler_or_batch_sampler(packed_generated, fmt):
    from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

    ds = open_dataset(packed_generated[fmt], decode=False, return_index=True)
    n = len(ds)
    loader = make_loader(ds, batch_size=3, num_workers=0, sampler=DistributedSampler(ds, 2, 1, shuffle=False))
    assert epoch(loader)[0] == list(range(1, n, 2)), "the caller's sampler was not the one used"
    assert len(loader) == math.ceil(n / 2 / 3)
    batches = BatchSampler(SequentialSampler(ds), 5, drop_last=True)
    loader = make_loader(ds, num_workers=0, batch_sampler=batches)
    assert [b[-1].tolist() for b in loader] == [list(range(k, k + 5)) for k in range(0, n - n % 5, 5)]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_make_loader_opens_a_path(packed_generated, fmt):
    root = packed_generated[fmt]
    for where in (root, str(root)):
        loader = make_loader(where, batch_size=BATCH, num_workers=0, seed=7)
        labels = sum((b[1].tolist() for b in loader), [])
        assert sorted(labels) == sorted(open_dataset(root).labels.tolist())
        assert len(loader) == math.ceil(len(labels) / BATCH)


# --------------------------------------------------------------------------- batches


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # 2: worker processes
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_undecoded_batches_are_byte_batches_of_the_stored_bytes(packed_generated, fmt, workers, stored_bytes):
    root = packed_generated[fmt]
    loader = loader_for(root, workers, decode=False, batch_size=5)
    seen = []
    for data, labels, idx in loader:
        assert isinstance(data, ByteBatch) and len(data) == len(idx) == len(labels)
        assert data.data.dtype == torch.uint8 and data.offsets.dtype == torch.int64
        assert int(data.offsets[-1]) == data.data.numel()
        for k, i in enumerate(idx.tolist()):
            assert data.get(k) == stored_bytes(root, i), f"{fmt} sample {i}"
        seen += idx.tolist()
    assert sorted(seen) == list(range(spec.read_index(root).num_samples))
    del loader


def test_collate_stacks_equal_shapes_and_lists_others():
    same = [(torch.full((3, 4, 5), k, dtype=torch.uint8), k, 10 + k) for k in range(3)]
    images, labels, idx = collate(same)
    assert images.shape == (3, 3, 4, 5) and labels.tolist() == [0, 1, 2] and idx.tolist() == [10, 11, 12]
    assert labels.dtype == torch.int64
    mixed = [(torch.zeros(3, 4, 5, dtype=torch.uint8), 0), (torch.zeros(3, 6, 5, dtype=torch.uint8), 1)]
    images, labels = collate(mixed)
    assert isinstance(images, list) and [t.shape[1] for t in images] == [4, 6]


# --------------------------------------------------------------------------- ShardDataset: ranks x workers


@pytest.fixture(scope="module")
def packed_33(tmp_path_factory) -> Path:
    """33 samples in 9 shards of 4, 4, ..., 4, 1: odd N, shard count no R x W divides evenly."""
    root = tmp_path_factory.mktemp("packed33")
    src = make_image_folder(root / "src", classes=3, per_class=11, size=(24, 20), seed=3)
    pack(src, root / "wds", PackOptions(format="wds", workers=1, shard_count=4))
    return root / "wds"


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "nopad"])
@pytest.mark.parametrize("dataset", ["gen28", "gen33"])
def test_shard_split_over_simulated_ranks_and_workers(request, packed_33, monkeypatch, dataset, pad):
    root = packed_33 if dataset == "gen33" else request.getfixturevalue("packed_generated")["wds"]
    sizes = [s["samples"] for s in spec.read_index(root).meta["shards"]]
    n = sum(sizes)
    assert len(set(sizes)) > 1, "want uneven shards"
    ds = ShardDataset(root, decode=False, return_index=True, seed=5, pad=pad, buffer_size=3)
    for R in (1, 2, 3):
        for W in (1, 2, 3):
            for ep in (0, 1):
                ds.set_epoch(ep)
                per_rank = []
                for r in range(R):
                    got = []
                    for w in range(W):
                        monkeypatch.setattr(readers.contract.env, "worker_env_hook", lambda r=r, w=w: WorkerEnv(r, R, w, W))
                        got += [t[2] for t in ds]
                    monkeypatch.setattr(readers.contract.env, "worker_env_hook", lambda r=r: WorkerEnv(r, R, 0, 1))
                    assert len(ds) == len(got)
                    per_rank.append(got)
                counts = Counter(i for got in per_rank for i in got)
                what = f"R={R} W={W} epoch={ep} pad={pad}"
                if pad:
                    assert all(len(g) == math.ceil(n / R) for g in per_rank), what
                    assert set(counts) == set(range(n)), what
                    assert sum(counts.values()) - n == R * math.ceil(n / R) - n <= R - 1, what
                else:
                    assert all(len(g) == n // R for g in per_rank), what
                    assert max(counts.values()) == 1 and len(counts) == R * (n // R), what
                    assert n - len(counts) <= R - 1


@pytest.mark.slow  # DataLoader worker processes
def test_shard_split_through_real_loaders(packed_33, monkeypatch):
    """3 simulated ranks, each a real DataLoader with 2 forked workers: same batch count, union = all."""
    from torch.utils.data import get_worker_info

    root = packed_33
    R, n = 3, spec.read_index(root).num_samples
    seen, batches = [], []
    for r in range(R):
        def hook(r=r):
            info = get_worker_info()
            return WorkerEnv(r, R, *((info.id, info.num_workers) if info else (0, 1)))

        monkeypatch.setattr(readers.contract.env, "worker_env_hook", hook)
        loader = loader_for(root, 2, decode=False, persistent_workers=False, kind="processes")
        got, b = epoch(loader)
        seen.append(got)
        batches.append(b)
        del loader
    assert len(set(batches)) == 1, f"ranks ran different batch counts: {batches}"
    assert all(len(g) == n // R for g in seen) and sorted(sum(seen, [])) == list(range(n))


