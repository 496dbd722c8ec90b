"""The Ray engine with object storage: a real one-node Ray cluster and a real SeaweedFS (no mocks).

* ``-o s3://...``: wds shard tasks upload their own shards; lmdb is written by
  the driver and uploaded as ``--engine local`` does. The objects equal the
  local engine's local pack file for file, and a driver killed with SIGKILL
  then ``--resume``d gives the objects of an uninterrupted run.
* ``s3://`` sources: an ImageFolder under a prefix packs to the dataset the
  same folder packs to locally; an object that cannot be read is named by URL.

Drivers run as subprocesses (``pack-dataset``, or a script calling ``pack``),
as in tests/test_ray_engine.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from conftest import make_image_folder
from readers import open_dataset
from readers.contract import spec
from readers.remote import open_store

pytest.importorskip("ray")
from raycluster import RayCluster  # noqa: E402

pytest_plugins = ["servers"]
pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "packer.cli"]
BAD = "class_01/img_002.JPEG"  # a corrupt JPEG: rejected, as locally
SHAPE = {
    "wds": ["-f", "wds", "--shard-count", "6", "--checkpoint-bytes", "1"],
    "lmdb": ["-f", "lmdb", "--checkpoint-bytes", "60k"],
}


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def cluster():
    c = RayCluster().start(cpus=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = make_image_folder(tmp_path_factory.mktemp("rs3-src") / "train", classes=3, per_class=16, size=(160, 120))
    (root / BAD).write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    (root / "class_02" / "notes.txt").write_text("not an image")  # ignored, as locally
    return root


@pytest.fixture(scope="module")
def local(src, tmp_path_factory) -> dict[str, Path]:
    """format -> the local engine's local pack."""
    root = tmp_path_factory.mktemp("rs3-local")
    for fmt, args in SHAPE.items():
        done = subprocess.run([*CLI, str(src), "-o", str(root / fmt), "-q", "-w", "1", *args], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 3, done.stderr  # one reject
    return {fmt: root / fmt for fmt in SHAPE}


def _env(cluster: RayCluster, s3_server) -> dict[str, str]:
    return {**cluster.env, **s3_server.env(), "AWS_EC2_METADATA_DISABLED": "true"}


def _ray(cluster: RayCluster) -> list[str]:
    return ["--engine", "ray", "--ray-address", cluster.address, "--ray-chunk", "5"]


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file() and p.name != "lock.mdb"}


def _objects(url: str, s3_server) -> dict[str, bytes]:
    store = open_store(url, s3_server.storage_options())
    return {name: store.read(name) for name in store.list()}


# ---------------------------------------------------------------- output on S3
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_ray_pack_to_s3_equals_the_local_pack(src, local, cluster, s3_server, s3_prefix, tmp_path, fmt):
    stage = tmp_path / "stage"
    done = subprocess.run([*CLI, str(src), "-o", s3_prefix, "-q", *SHAPE[fmt], *_ray(cluster), "--stage-dir",
                           str(stage)], env=_env(cluster, s3_server), capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert f"-> {s3_prefix} " in done.stdout and done.stdout.rstrip().endswith("[ray: 1 node, 2 CPUs]")
    assert _objects(s3_prefix, s3_server) == _files(local[fmt])  # shards / data.mdb, arrays, names, rejects
    assert not stage.exists()
    ds = open_dataset(s3_prefix, storage_options=s3_server.storage_options())
    assert len(ds) == 47


def test_existing_prefix_rules_as_for_the_local_engine(src, cluster, s3_server, s3_prefix, tmp_path):
    """Exit 2 without --overwrite / --resume; --overwrite refuses a prefix holding foreign objects (one line)."""
    env = _env(cluster, s3_server)

    def run(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, str(src), "-o", s3_prefix, "-q", *SHAPE["wds"], *_ray(cluster), "--stage-dir",
                               str(tmp_path / "stage"), *more], env=env, capture_output=True, text=True, timeout=300)

    assert run().returncode == 3
    exists = run()
    assert exists.returncode == 2 and "pass --overwrite" in exists.stderr, exists.stderr
    open_store(s3_prefix, s3_server.storage_options()).put_bytes("notes.txt", b"mine")
    refused = run("--overwrite")
    assert refused.returncode == 2 and "notes.txt" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def _wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_driver_sigkill_then_resume_gives_the_same_objects(cluster, s3_server, tmp_path_factory, tmp_path):
    """kill -9 the driver once shard tasks uploaded some shards; --resume = an uninterrupted run."""
    s3_server.start()
    src = make_image_folder(tmp_path_factory.mktemp("rs3-big") / "train", classes=4, per_class=60,
                            size=(200, 160), png_every=0)
    env = _env(cluster, s3_server)
    run = uuid.uuid4().hex[:8]
    killed, clean = s3_server.url(f"kill-{run}"), s3_server.url(f"clean-{run}")
    shape = ["-q", "-f", "wds", "--shard-count", "12", "--checkpoint-bytes", "1", *_ray(cluster)]
    res = subprocess.run([*CLI, str(src), "-o", clean, *shape, "--stage-dir", str(tmp_path / "clean")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    stage = tmp_path / "killed"
    cmd = [*CLI, str(src), "-o", killed, *shape, "--stage-dir", str(stage)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uploads = stage / "uploads.jsonl"  # one line per recorded upload

    def some_uploaded() -> bool:
        try:
            return uploads.read_text().count('"size"') >= 4
        except OSError:
            return False

    try:
        assert _wait_for(some_uploaded, 120), "no shard upload was recorded"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the pack finished before it could be killed"
    store = open_store(killed, s3_server.storage_options())
    assert not store.exists(spec.INDEX_NAME)
    res = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resumed after" in res.stdout
    assert _objects(killed, s3_server) == _objects(clean, s3_server)
    assert not stage.exists()


# ---------------------------------------------------------------- source on S3
@pytest.fixture(scope="module")
def s3_src(src, s3_server) -> str:
    """The same ImageFolder as ``src``, uploaded under an s3:// prefix."""
    url = s3_server.url(f"src-{uuid.uuid4().hex[:8]}/train")
    store = open_store(url, s3_server.storage_options())
    for path in sorted(src.rglob("*")):
        if path.is_file():
            store.put(path.relative_to(src).as_posix(), path)
    return url


def _same_dataset(out: Path, reference: Path, src_url: str, layout_free: tuple[str, ...] = ()) -> None:
    """Every file equal; index.json too, but for the source's root (its URL). ``layout_free``: files
    compared by the samples they hold (LMDB's page layout depends on its write history)."""
    ours, theirs = _files(out), _files(reference)
    assert {k for k in ours} == {k for k in theirs}
    skip = (spec.INDEX_NAME, *layout_free)
    assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in theirs.items() if k not in skip}
    a, b = (json.loads(d[spec.INDEX_NAME]) for d in (ours, theirs))
    assert a["source"].pop("root") == src_url
    b["source"].pop("root")
    for name in layout_free:
        a[spec.FILES_CRC_KEY].pop(name), b[spec.FILES_CRC_KEY].pop(name)
    assert a == b
    da, db = open_dataset(out, decode=False), open_dataset(reference, decode=False)
    try:
        assert [bytes(da.read(i)) for i in range(len(da))] == [bytes(db.read(i)) for i in range(len(db))]
    finally:
        da.close()
        db.close()


def test_s3_source_packs_to_the_same_dataset_with_ray(s3_src, local, cluster, s3_server, tmp_path):
    out = tmp_path / "wds"
    done = subprocess.run([*CLI, s3_src, "-o", str(out), "-q", *SHAPE["wds"], *_ray(cluster)],
                          env=_env(cluster, s3_server), capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # the corrupt JPEG is rejected, as locally
    _same_dataset(out, local["wds"], s3_src)


def test_s3_source_with_the_local_engine(s3_src, local, s3_server, tmp_path):
    out = tmp_path / "lmdb"
    done = subprocess.run([*CLI, s3_src, "-o", str(out), "-q", "-w", "2", *SHAPE["lmdb"]],
                          env={**os.environ, **s3_server.env()}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert "47 samples" in done.stdout and "1 rejected" in done.stdout
    _same_dataset(out, local["lmdb"], s3_src, layout_free=("data.mdb",))


MISSING = """
    import sys
    from packer import PackError, PackOptions, RemoteOptions, pack
    from readers.remote import open_store
    src, out, address, victim, endpoint = sys.argv[1:]
    so = {"endpoint_url": endpoint}

    def progress(split, source):
        open_store(src, so).delete(victim)  # after the listing, before any task reads it
        return None

    try:
        pack(src, out, PackOptions(format="wds", engine="ray", ray_address=address, ray_chunk=5),
             progress=progress, remote=RemoteOptions(storage_options=so))
    except PackError as exc:
        print(exc)
"""


def test_missing_source_object_is_named_by_its_url(src, cluster, s3_server, tmp_path):
    url = s3_server.url(f"miss-{uuid.uuid4().hex[:8]}/train")
    store = open_store(url, s3_server.storage_options())
    for path in sorted((src / "class_00").iterdir()):
        store.put(f"class_00/{path.name}", path)
    victim = "class_00/img_005.JPEG"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(MISSING), url, str(tmp_path / "out"),
                           cluster.address, victim, s3_server.endpoint_url], env=_env(cluster, s3_server),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.strip().splitlines()
    assert line.startswith(f"{url}/{victim}: read error: ") and "re-run with --resume" in line, line
