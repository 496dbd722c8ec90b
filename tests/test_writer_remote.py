"""``Writer`` and ``pack_map`` into object storage (issue 34 item 1, "``s3://`` outputs too"), against the
real SeaweedFS S3 server and the fake-gcs-server emulator of tests/servers.py: the write is a pack's to
such an output (``packer.remote_output``: staged, uploaded, ``index.json`` last), so the objects are the
files of the same write into a local folder, they read back field-exact and verify; a Writer killed
with SIGKILL and resumed gives the objects of an uninterrupted write."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from packer import PackOptions, RemoteOptions, UsageError, Writer, pack_map
from packer.tools.verify import verify
from readers import open_dataset
from readers.contract import spec
from readers.remote import open_store
from test_writer import FIELDS, ROOT, opts, read_back, sample, samples

pytest_plugins = ["servers"]

CLASSES = ["a", "b", "c", "d"]
LOCAL_ONLY = {spec.STATE_NAME, "pack-records.npy", "uploads.jsonl", "shard-log.jsonl", "lock.mdb"}


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def objects(url: str, storage_options: dict) -> dict[str, bytes]:
    store = open_store(url, storage_options)
    try:
        return {name: store.read(name) for name in sorted(store.list())}
    finally:
        store.close()


def local_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name not in LOCAL_ONLY}


def read_remote(url: str, storage_options: dict, fmt: str, cache_dir: Path | None = None) -> list[tuple]:
    """(a remote hdf5's typed fields are read from its cached copy: ``cache_dir``)"""
    ds = open_dataset(url, storage_options=storage_options, fields=FIELDS, decode=False, cache_dir=cache_dir,
                      **({"shuffle": False, "pad": False} if fmt == "wds" else {}))
    try:
        return list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    finally:
        ds.close()


def same_rows(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        bytes(x[0]) == bytes(y[0]) and x[1:3] == y[1:3] and np.array_equal(x[3], y[3]) and x[4] == y[4]
        for x, y in zip(a, b))


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_a_writer_into_s3_is_the_local_write_uploaded(s3_server, s3_prefix, tmp_path, fmt):
    remote = RemoteOptions(storage_options=s3_server.storage_options(), stage_dir=str(tmp_path / "stage"))
    local = tmp_path / "local"
    for out, extra in ((local, {}), (s3_prefix, {"remote": remote})):
        with Writer(out, format=fmt, options=opts(fmt), classes=CLASSES, **extra) as w:
            for s in samples(60):
                w.write(s)
    assert w.result is not None and w.result.out == s3_prefix and w.result.images == 60
    assert objects(s3_prefix, s3_server.storage_options()) == local_files(local)  # every object, byte for byte
    rows = read_remote(s3_prefix, s3_server.storage_options(), fmt, tmp_path / "cache")
    assert same_rows(rows, read_back(local)) and len(rows) == 60
    assert [(r[1], r[2], r[4]) for r in rows] == [(sample(i)["label"], sample(i)["caption"], sample(i)["score"])
                                                  for i in range(60)]
    assert verify(s3_prefix, storage_options=s3_server.storage_options()).ok
    assert not (tmp_path / "stage").exists()  # emptied by the upload, removed with the lock
    with pytest.raises(Exception, match="already holds"):  # a second write needs overwrite= or resume=
        Writer(s3_prefix, format=fmt, remote=remote)
    with Writer(s3_prefix, format=fmt, options=opts(fmt), resume=True, remote=remote) as again:
        assert again.count == 60  # complete: nothing to write


CHILD = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
from reliability_helpers import kill_once_checkpointed
from test_writer import opts, samples
from packer import RemoteOptions, Writer
remote = RemoteOptions(storage_options={so!r}, stage_dir={stage!r})
w = Writer({out!r}, format={fmt!r}, options=opts({fmt!r}), classes=["a", "b", "c", "d"], remote=remote)
for i, s in enumerate(samples({n})):
    if i == {kill}:
        kill_once_checkpointed({state!r}, upload={fmt!r} == 'wds')
    w.write(s)
"""


@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_a_writer_into_s3_killed_and_resumed_gives_the_same_objects(s3_server, tmp_path, fmt):
    s3_server.start()
    so, run = s3_server.storage_options(), uuid.uuid4().hex[:8]
    whole, cut = s3_server.url(f"whole-{run}"), s3_server.url(f"cut-{run}")
    n, kill = 150, 130  # killed after sample 130 was given, once a checkpoint is durable
    with Writer(whole, format=fmt, options=opts(fmt), classes=CLASSES,
                remote=RemoteOptions(storage_options=so, stage_dir=str(tmp_path / "whole"))) as w:
        for s in samples(n):
            w.write(s)
    stage = tmp_path / "cut"
    child = CHILD.format(tests=str(ROOT / "tests"), root=str(ROOT), so=so, stage=str(stage), out=cut, fmt=fmt, n=n,
                         kill=kill, state=str(stage / spec.STATE_NAME))
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    state = json.loads((stage / spec.STATE_NAME).read_text())
    assert state["done"] > 0
    store = open_store(cut, so)
    try:
        assert not store.exists(spec.INDEX_NAME)  # nothing opens as complete
        if fmt == "wds":  # shards closed by a checkpoint went up while the write ran (the child waited for one)
            assert any(name.endswith(".tar") for name in store.list())
    finally:
        store.close()
    with Writer(cut, format=fmt, options=opts(fmt), classes=CLASSES, resume=True,
                remote=RemoteOptions(storage_options=so, stage_dir=str(stage))) as w:
        assert 0 < w.count <= kill
        resumed_at = w.count
        for s in list(samples(n))[w.count:]:
            w.write(s)
    assert w.result is not None and w.result.resumed_from == resumed_at
    ours, theirs = objects(cut, so), objects(whole, so)
    assert sorted(ours) == sorted(theirs) and [k for k in ours if ours[k] != theirs[k]] == []
    assert not stage.exists()
    assert verify(cut, storage_options=so).ok


def test_pack_map_with_two_workers_into_gcs(gcs_server, tmp_path):
    gcs_server.start()
    url = gcs_server.url(f"t-{uuid.uuid4().hex[:10]}")
    so = gcs_server.storage_options()
    local = tmp_path / "local"

    def make(i):
        return None if i == 5 else sample(i)

    for out, extra in ((local, {}), (url, {"remote": RemoteOptions(storage_options=so,
                                                                  stage_dir=str(tmp_path / "stage"))})):
        result = pack_map(make, range(40), out, format="wds", workers=2, classes=CLASSES,
                          options=PackOptions(shard_count=8), **extra)
        assert (result.inputs, result.samples) == (40, 39)
    assert objects(url, so) == local_files(local)
    assert same_rows(read_remote(url, so, "wds"), read_back(local))
    # pack-dataset verify in a process of its own (verify() here leaves a gcsfs socket open: left alone)
    done = subprocess.run([sys.executable, "-m", "packer.cli", "verify", url, "-q"], capture_output=True, text=True,
                          env=gcs_server.env(), timeout=120)
    assert done.returncode == 0 and "checked, OK" in done.stdout, done.stdout + done.stderr


def test_append_into_an_object_store_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^s3://b/x: Writer\(append=True\) appends to a local dataset folder") as err:
        Writer("s3://b/x", format="wds", append=True)
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match=r"^RemoteOptions stage_dir: only for an s3://, gs:// or az:// output"):
        Writer(tmp_path / "local", format="wds", remote=RemoteOptions(stage_dir=str(tmp_path / "s")))
    assert list(tmp_path.iterdir()) == []  # not ./s3:/b/x, nothing locked or staged
