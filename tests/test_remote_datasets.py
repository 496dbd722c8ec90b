"""Reading packed datasets from S3 (SeaweedFS) and HTTP (nginx): round trips and faults, real servers only.

Round trips: every format, packed straight to S3 with ``pack(..., "s3://...")``
and copied under nginx, read with 0 and 2 loader workers, streamed (no
cache) and through a node cache: every sample's bytes and label equal the
local pack's, each sample once per epoch (wds: in the same order as locally).

Faults: the store killed mid-epoch and restarted (the epoch completes,
every sample once), left down (a clear error within the retry budget), a
shard object replaced by a damaged copy (the error names shard and sample),
two processes sharing one cache folder (each shard downloaded once, no torn
file), a cache limit smaller than the dataset (stays under it, completes).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from packer import PackOptions, RemoteOptions, pack
from readers import make_loader, open_dataset
from readers.contract import spec
from readers.formats import wds_io
from readers.remote import RemoteIntegrityError, RemoteUnavailableError, RetryPolicy, open_store
from readers.remote.cache import NodeCache
from readers.contract.spec import FORMATS

pytest_plugins = ["servers"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _opts(fmt: str, **kw) -> PackOptions:
    return PackOptions(format=fmt, workers=1, **({"shard_count": 5} if fmt == "wds" else {}), **kw)


@pytest.fixture(scope="module")
def s3_packs(s3_server, generated, tmp_path_factory) -> dict[str, str]:
    """format -> URL of the generated folder packed straight to S3 (the same options as packed_generated)."""
    s3_server.start()
    base = s3_server.url(f"rt-{uuid.uuid4().hex[:8]}")
    stage = tmp_path_factory.mktemp("stage")
    for fmt in FORMATS:
        pack(generated, f"{base}/{fmt}", _opts(fmt),
             remote=RemoteOptions(storage_options=s3_server.storage_options(), stage_dir=stage / fmt))
    return {fmt: f"{base}/{fmt}" for fmt in FORMATS}


@pytest.fixture(scope="module")
def http_packs(http_server, packed_generated) -> dict[str, str]:
    """format -> URL of the local pack copied under nginx."""
    name = f"rt-{uuid.uuid4().hex[:8]}"
    for fmt in FORMATS:
        shutil.copytree(packed_generated[fmt], http_server.root / name / fmt)
    return {fmt: f"{http_server.url}/{name}/{fmt}" for fmt in FORMATS}


@pytest.fixture
def remote(request, s3_server, http_server):
    """``remote(backend, fmt) -> (url, storage_options)`` with the server up."""
    def get(backend: str, fmt: str):
        if backend == "s3":
            s3_server.start()
            return request.getfixturevalue("s3_packs")[fmt], s3_server.storage_options()
        http_server.start()
        return request.getfixturevalue("http_packs")[fmt], None

    return get


def _epoch(ds, workers: int, seed: int = 3):
    """(indices, labels, bytes) of one epoch through make_loader, decode=False."""
    seen, labels, data = [], [], []
    for batch, lab, idx in make_loader(ds, batch_size=4, num_workers=workers, seed=seed, persistent_workers=False):
        for k, i in enumerate(idx.tolist()):
            seen.append(i)
            labels.append(int(lab[k]))
            data.append(batch.get(k))
    return seen, labels, data


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("cache", [False, True], ids=["nocache", "cache"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", ["s3", "http"])
def test_round_trip(remote, packed_generated, stored_bytes, tmp_path, backend, fmt, cache, workers):
    url, options = remote(backend, fmt)
    local_root = packed_generated[fmt]
    local = open_dataset(local_root, decode=False, return_index=True)
    cache_dir = tmp_path / "cache" if cache else None
    ds = open_dataset(url, storage_options=options, decode=False, return_index=True, cache_dir=cache_dir)
    assert ds.index.store is not None and ds.root == url.rstrip("/")
    seen, labels, data = _epoch(ds, workers)
    n = local.index.num_samples
    assert sorted(seen) == list(range(n)), "each sample once per epoch"
    for i, label, blob in zip(seen, labels, data):
        assert blob == stored_bytes(local_root, i), f"{backend} {fmt} sample {i}"
        assert label == int(local.labels[i])
    if fmt == "wds":  # streaming shuffles after reading: the order is the local one
        assert seen == _epoch(local, workers)[0]
    if cache:
        cached = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file() and "objects" in p.parts]
        assert not [c for c in cached if c.endswith((".partial", ".parts"))], cached
        assert set(cached) >= set(ds.meta["files"]), "the data files landed in the cache"
    else:
        assert not (tmp_path / "cache").exists()
    ds.close()
    local.close()


@pytest.mark.parametrize("cache", [False, True], ids=["nocache", "cache"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", ["s3", "http"])
def test_thread_loader_round_trip(remote, packed_generated, stored_bytes, tmp_path, backend, fmt, cache):
    """make_loader(workers="threads") over a remote dataset: the per-sample (ranged, streamed) or
    cached paths in two threads of this process, every sample once with its stored bytes."""
    url, options = remote(backend, fmt)
    cache_dir = tmp_path / "cache" if cache else None
    ds = open_dataset(url, storage_options=options, decode=False, return_index=True, cache_dir=cache_dir)
    seen = [(i, batch.get(k)) for batch, _, idx in make_loader(ds, batch_size=4, num_workers=2, workers="threads",
                                                              seed=3) for k, i in enumerate(idx.tolist())]
    assert sorted(i for i, _ in seen) == list(range(ds.index.num_samples)), "each sample once"
    assert all(blob == stored_bytes(packed_generated[fmt], i) for i, blob in seen), f"{backend} {fmt}"
    ds.close()


def test_pack_to_s3_writes_the_local_pack_object_for_object(s3_server, s3_packs, packed_generated):
    s3_server.start()
    for fmt in FORMATS:
        store = open_store(s3_packs[fmt], s3_server.storage_options())
        local = Path(packed_generated[fmt])
        names = sorted(p.name for p in local.iterdir() if p.name != "lock.mdb")
        assert store.list() == names, fmt
        for name in names:
            assert store.read(name) == (local / name).read_bytes(), f"{fmt}/{name}"


def test_index_records_each_data_files_crc32(packed_generated):
    for fmt in FORMATS:
        meta = spec.read_index(packed_generated[fmt]).meta
        crcs = meta[spec.FILES_CRC_KEY]
        assert set(crcs) == set(meta["files"]), fmt
        for name, crc in crcs.items():
            assert crc == spec.file_checksum(Path(packed_generated[fmt]) / name), f"{fmt}/{name}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_old_index_without_file_crcs_reads_remotely(http_server, packed_generated, stored_bytes, tmp_path, fmt):
    http_server.start()
    name = f"old-{uuid.uuid4().hex[:8]}"
    root = shutil.copytree(packed_generated[fmt], http_server.root / name)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    del meta[spec.FILES_CRC_KEY]
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))
    ds = open_dataset(f"{http_server.url}/{name}", decode=False, return_index=True, cache_dir=tmp_path / "c")
    seen, _, data = _epoch(ds, 0)
    assert sorted(seen) == list(range(ds.index.num_samples))
    assert all(d == stored_bytes(packed_generated[fmt], i) for i, d in zip(seen, data))
    ds.close()


def test_credentials_and_endpoint_from_aws_environment(s3_server, s3_packs, monkeypatch):
    s3_server.start()
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    ds = open_dataset(s3_packs["wds"], decode=False)  # no storage_options at all
    assert len(list(ds)) == ds.index.num_samples
    ds.close()


def test_open_errors_name_the_url(s3_server, s3_prefix, http_prefix):
    so = s3_server.storage_options()
    with pytest.raises(FileNotFoundError, match=f"{s3_prefix}/index.json: no such dataset"):
        open_dataset(s3_prefix, storage_options=so)
    store = open_store(s3_prefix, so)
    store.put_bytes("train-000000.tar", b"x" * 10)  # an upload that never finished
    with pytest.raises(spec.IncompleteDatasetError, match="never finished.*--resume"):
        open_dataset(s3_prefix, storage_options=so)
    with pytest.raises(ValueError, match="open_dataset"):
        spec.read_index(s3_prefix)


# --------------------------------------------------------------------------- the I/O seam, on a local store
def _local_store_ds(root, **kw):
    from readers.formats.wds import ShardDataset
    from readers.remote import LocalStore

    return ShardDataset(spec.read_index(LocalStore(root)), decode=False, **kw)


def test_streamed_shards_any_order_few_requests(packed_generated, stored_bytes):
    """Sequential, interleaved (several shards at once) and wrapped orders: right bytes, coalesced requests."""
    ds = _local_store_ds(packed_generated["wds"])
    n, shards = ds.index.num_samples, ds.index.arrays["shards"]
    interleaved = [i for group in zip(*(ds.samples_of_shard(k) for k in range(3))) for i in group]
    for order in (list(range(n)), interleaved, list(range(n - 3, n)) + list(range(5))):
        io = wds_io.StreamedShards(ds)
        before = ds.remote.store.stats.reads
        got = list(io.samples(order))
        assert [i for i, _ in got] == order
        assert all(d == stored_bytes(packed_generated["wds"], i) for i, d in got)
        runs = len({(int(shards[i])) for i in order})
        assert ds.remote.store.stats.reads - before <= runs + 1, "one request per shard run, not per sample"


def test_streamed_shards_plan_bounds_requests(packed_generated):
    ds = _local_store_ds(packed_generated["wds"])
    io = wds_io.StreamedShards(ds, chunk_size=1)  # every sample its own request
    req_of_pos, req_shard, start, end = io.plan(np.arange(ds.index.num_samples))
    assert len(req_shard) == ds.index.num_samples and list(req_of_pos) == sorted(req_of_pos)
    assert (end > start).all()


def test_streamed_sample_crc_is_checked(packed_generated, tmp_path):
    root = shutil.copytree(packed_generated["wds"], tmp_path / "wds")
    ds0 = open_dataset(root)
    i = ds0.samples_of_shard(2)[1]
    shard = root / ds0.shard_names[2]
    raw = bytearray(shard.read_bytes())
    raw[int(ds0.index.arrays["offsets"][i]) + 10] ^= 0xFF  # same size, one byte of sample i changed
    shard.write_bytes(bytes(raw))
    ds = _local_store_ds(root, shuffle=False)
    with pytest.raises(RemoteIntegrityError, match=rf"{ds0.shard_names[2]} sample {i} .*checksum mismatch"):
        list(ds)


# --------------------------------------------------------------------------- faults
@pytest.fixture(scope="module")
def s3_bigger(s3_server, tmp_path_factory) -> dict[str, str]:
    """A 60-image folder packed to S3 as wds (12 shards of 5) and mmap, for the fault tests."""
    from conftest import make_image_folder

    s3_server.start()
    src = make_image_folder(tmp_path_factory.mktemp("big") / "train", classes=4, per_class=15, seed=4)
    base = s3_server.url(f"big-{uuid.uuid4().hex[:8]}")
    stage = tmp_path_factory.mktemp("stage-big")
    for fmt in ("wds", "mmap"):
        pack(src, f"{base}/{fmt}", _opts(fmt),
             remote=RemoteOptions(storage_options=s3_server.storage_options(), stage_dir=stage / fmt))
    return {"wds": f"{base}/wds", "mmap": f"{base}/mmap"}


#: A shuffle buffer larger than a worker's share would read the whole epoch before the first batch.
_SMALL_BUFFER = {"wds": {"buffer_size": 2}, "mmap": {}}


def _kill_after_first_batch(server, restart_after_s: float | None):
    """Iterate hook: kill the server once (recording when), restart it ``restart_after_s`` later in a
    thread (None: leave it down)."""
    state: dict = {"thread": None, "killed_at": None}

    def hook() -> None:
        if state["killed_at"] is not None:
            return
        server.kill()
        state["killed_at"] = time.monotonic()
        if restart_after_s is not None:
            def back() -> None:
                time.sleep(restart_after_s)
                server.start()

            state["thread"] = threading.Thread(target=back)
            state["thread"].start()

    return hook, state


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wds-stream", "wds-cache", "mmap-ranged"])
def test_store_killed_and_restarted_mid_epoch(s3_server, s3_bigger, tmp_path, mode):
    fmt = mode.split("-")[0]
    s3_server.start()
    ds = open_dataset(s3_bigger[fmt], storage_options=s3_server.storage_options(), decode=False,
                      return_index=True, cache_dir=tmp_path / "c" if mode.endswith("cache") else None,
                      **_SMALL_BUFFER[fmt])
    hook, state = _kill_after_first_batch(s3_server, restart_after_s=2.0)
    seen = []
    try:
        for _, _, idx in make_loader(ds, batch_size=2, num_workers=2, seed=1, persistent_workers=False):
            seen += idx.tolist()
            hook()
        waited = time.monotonic() - state["killed_at"]
    finally:
        if state["thread"]:
            state["thread"].join()
        s3_server.start()
    assert sorted(seen) == list(range(ds.index.num_samples))
    assert waited > 2.0, "the epoch did not need the server after the kill: the test proved nothing"
    ds.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_store_stays_down_clear_error_within_budget(s3_server, s3_bigger, workers):
    s3_server.start()
    budget = RetryPolicy(tries=4, budget_s=3.0, base_delay_s=0.2, connect_timeout_s=2, read_timeout_s=5)
    ds = open_dataset(s3_bigger["wds"], storage_options=s3_server.storage_options(), decode=False,
                      return_index=True, retry=budget, **_SMALL_BUFFER["wds"])
    hook, state = _kill_after_first_batch(s3_server, restart_after_s=None)
    # A plain DataLoader (no shared-memory batches): only the error path is under test here.
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers)
    try:
        with pytest.raises(RemoteUnavailableError) as err:
            for _ in loader:
                hook()
        elapsed = time.monotonic() - state["killed_at"]
    finally:
        s3_server.start()
    text = str(err.value)
    del err, loader  # the traceback holds the loader's iterator (pipes, worker handles)
    assert elapsed < budget.budget_s + budget.read_timeout_s + 10, f"took {elapsed:.1f}s"
    assert s3_bigger["wds"] in text and "failed after" in text and "retry budget" in text
    ds.close()


@pytest.mark.slow
@pytest.mark.parametrize("cache", [False, True], ids=["stream", "cache"])
def test_damaged_shard_object_names_shard_and_sample(s3_server, s3_prefix, generated, tmp_path, cache):
    so = s3_server.storage_options()
    pack(generated, s3_prefix, _opts("wds"), remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "stage"))
    store = open_store(s3_prefix, so)
    ds0 = open_dataset(s3_prefix, storage_options=so, decode=False)
    k = 2
    i = ds0.samples_of_shard(k)[1]
    raw = bytearray(store.read(ds0.shard_names[k]))
    raw[int(ds0.index.arrays["offsets"][i]) + 7] ^= 0x5A  # same size, one byte of sample i
    store.put_bytes(ds0.shard_names[k], bytes(raw))
    ds = open_dataset(s3_prefix, storage_options=so, decode=False, shuffle=False,
                      cache_dir=tmp_path / "c" if cache else None)
    with pytest.raises(RemoteIntegrityError) as err:
        list(ds)
    assert f"{s3_prefix}/{ds0.shard_names[k]} sample {i}" in str(err.value)
    assert "checksum mismatch" in str(err.value)
    if cache:  # nothing damaged was kept in the cache
        assert not [p for p in (tmp_path / "c").rglob(ds0.shard_names[k]) if p.is_file()]


_SHARE_SCRIPT = """
import json, sys, zlib
from readers import open_dataset, make_loader
ds = open_dataset(sys.argv[1], decode=False, return_index=True, cache_dir=sys.argv[2])
crcs = ds.index.arrays["checksums"]
seen = []
for batch, labels, idx in make_loader(ds, batch_size=3, num_workers=2, seed=int(sys.argv[3])):
    for k, i in enumerate(idx.tolist()):
        assert zlib.crc32(batch.get(k)) == int(crcs[i]), i
        seen.append(i)
print(json.dumps(sorted(seen)))
"""


@pytest.mark.slow
def test_two_processes_share_one_cache(http_server, packed_generated, tmp_path):
    """Two loaders (2 workers each) in separate processes, one cache folder: each shard fetched once."""
    http_server.start()
    name = f"share-{uuid.uuid4().hex[:8]}"
    root = shutil.copytree(packed_generated["wds"], http_server.root / name)
    url = f"{http_server.slow_url}/{name}"  # 512 KB/s per request: the two processes overlap
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", _SHARE_SCRIPT, url, str(cache), str(seed)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:  # on a timeout: stop them, close their pipes
            if p.poll() is None:
                p.kill()
                p.communicate()
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.splitlines()[-1]) == list(range(meta["num_samples"]))
    for shard in meta["shards"]:
        hits = [r for r in http_server.requests() if r.method == "GET" and r.path == f"/slow/{name}/{shard['name']}"]
        assert sum(r.bytes_sent for r in hits) == shard["bytes"], f"{shard['name']} downloaded more than once"
    files = [p for p in cache.rglob("*") if p.is_file() and "objects" in p.parts]
    want = sorted(s["name"] for s in meta["shards"])
    # each shard, and beside it the record of what it holds (what makes a stale copy detectable)
    assert sorted(p.name for p in files) == sorted(want + [n + ".ident" for n in want]), "no partial or extra file"
    for p in files:
        if p.name.endswith(".ident"):
            assert json.loads(p.read_text())["size"] == (root / p.name[:-len(".ident")]).stat().st_size
            continue
        assert p.read_bytes() == (root / p.name).read_bytes(), f"{p.name} torn or damaged"


@pytest.mark.slow
def test_cache_limit_smaller_than_the_dataset(s3_server, s3_bigger, tmp_path, caplog):
    s3_server.start()
    meta = open_dataset(s3_bigger["wds"], storage_options=s3_server.storage_options()).meta
    total = sum(s["bytes"] for s in meta["shards"])
    # Pinned at once: the shards read together and spanned by the shuffle buffer (2 here) + 2 fetched ahead.
    limit = 4 * max(s["bytes"] for s in meta["shards"])
    assert limit < total / 2
    ds = open_dataset(s3_bigger["wds"], storage_options=s3_server.storage_options(), decode=False,
                      return_index=True, cache_dir=tmp_path / "c", cache_limit=limit, buffer_size=2,
                      open_shards=1)
    usage = NodeCache(tmp_path / "c")
    peak, seen = 0, []
    for _, _, i in ds:
        seen.append(i)
        peak = max(peak, usage.usage())
    assert sorted(seen) == list(range(meta["num_samples"]))
    assert 0 < peak <= limit, f"cache peaked at {peak} bytes, limit {limit}"
    assert usage.usage() <= limit
    assert "over its limit" not in caplog.text
    ds.close()
