"""``pack-dataset ... -o s3://...`` against a real SeaweedFS: uploads, index last, resume after SIGKILL, verify.

The CLI runs as a real subprocess with the standard AWS environment
variables (no storage_options), as a user would run it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from packer import PackOptions, RemoteOptions, pack
from packer.errors import OutputError, OutputExistsError
from packer.tools.verify import verify
from readers import open_dataset
from readers.contract import spec
from readers.remote import open_store
from reliability_helpers import wait_for

pytest_plugins = ["servers"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _cli(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=kw.pop("timeout", 300), **kw)


def _objects(store) -> dict[str, bytes]:
    return {name: store.read(name) for name in store.list()}


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """120 photos-sized JPEGs in 4 classes: packing takes long enough to be killed part-way."""
    from conftest import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("src") / "train", classes=4, per_class=30, size=(320, 240),
                             seed=9)


def test_cli_pack_verify_read_over_s3_with_aws_environment(s3_server, s3_prefix, generated, tmp_path):
    env = s3_server.env()
    res = _cli([str(generated), "-f", "wds", "-o", s3_prefix, "--shard-count", "5", "-w", "1", "-q",
                "--stage-dir", str(tmp_path / "stage")], env)
    assert res.returncode == 0, res.stderr
    assert f"-> {s3_prefix}" in res.stdout
    assert not (tmp_path / "stage").exists(), "the staging folder goes once the upload is complete"
    res = _cli(["verify", s3_prefix, "-q"], env)
    assert res.returncode == 0, res.stderr
    assert f"{s3_prefix}: 28 samples checked, OK" in res.stdout
    res = _cli(["info", s3_prefix, "--json"], env)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert (d["path"], d["state"], d["format"], d["samples"], d["shards"]) == (s3_prefix, "complete", "wds", 28, 6)  # 5 samples per shard
    local = _cli(["info", str(generated), "--json"], env)  # a folder of images is not a dataset
    assert local.returncode == 2
    assert d["bytes_on_disk"] > sum(p.stat().st_size for p in generated.rglob("*.jpg"))
    res = _cli(["info", s3_prefix + "-missing"], env)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "not a packed dataset" in res.stderr and "Traceback" not in res.stderr


def test_existing_prefix_needs_overwrite_and_only_ours_is_deleted(s3_server, s3_prefix, generated, tmp_path):
    so = s3_server.storage_options()
    opts = PackOptions(format="mmap", workers=1)
    pack(generated, s3_prefix, opts, remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "s1"))
    with pytest.raises(OutputExistsError, match="already holds .* objects; pass --overwrite"):
        pack(generated, s3_prefix, opts, remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "s2"))
    pack(generated, s3_prefix, PackOptions(format="mmap", workers=1, overwrite=True),
         remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "s3"))
    store = open_store(s3_prefix, so)
    store.put_bytes("notes.txt", b"someone else's")
    with pytest.raises(OutputExistsError, match="does not write.*notes.txt"):
        pack(generated, s3_prefix, PackOptions(format="mmap", workers=1, overwrite=True),
             remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "s4"))
    assert store.exists("notes.txt") and store.exists(spec.INDEX_NAME)


def test_http_output_is_refused(http_prefix, generated, tmp_path):
    _, url = http_prefix
    with pytest.raises(OutputError, match="read-only"):
        pack(generated, url, PackOptions(format="wds", workers=1), remote=RemoteOptions(stage_dir=tmp_path / "stage"))


def test_cli_output_errors_are_one_line(s3_server, generated, tmp_path):
    bad = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong"}
    res = _cli([str(generated), "-f", "wds", "-o", s3_server.url(f"x-{uuid.uuid4().hex[:6]}"), "-q",
                "--stage-dir", str(tmp_path / "st")], bad)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "access denied" in lines[0] and "Traceback" not in res.stderr


def test_verify_names_a_damaged_sample_and_a_missing_shard(s3_server, s3_prefix, generated, tmp_path):
    so = s3_server.storage_options()
    pack(generated, s3_prefix, PackOptions(format="wds", workers=1, shard_count=5),
         remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "stage"))
    store = open_store(s3_prefix, so)
    ds = open_dataset(s3_prefix, storage_options=so)
    i = ds.samples_of_shard(1)[2]
    raw = bytearray(store.read(ds.shard_names[1]))
    raw[int(ds.index.arrays["offsets"][i]) + 3] ^= 1
    store.put_bytes(ds.shard_names[1], bytes(raw))
    store.delete(ds.shard_names[4])
    report = verify(s3_prefix, storage_options=so)
    where = {p.where: p.what for p in report.problems}
    assert where[f"{s3_prefix}/{ds.shard_names[1]} sample {i}"].startswith("checksum mismatch")
    assert where[f"{s3_prefix}/{ds.shard_names[1]}"] == "shard checksum differs from the index"
    assert where[f"{s3_prefix}/{ds.shard_names[4]}"] == "shard object is missing"
    assert len(report.problems) == 3


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "mmap"])
def test_verify_single_file_formats_over_http(http_server, packed_generated, tmp_path, fmt):
    import shutil

    http_server.start()
    name = f"v-{uuid.uuid4().hex[:8]}"
    root = shutil.copytree(packed_generated[fmt], http_server.root / name)
    url = f"{http_server.url}/{name}"
    assert verify(url).ok
    data = root / spec.DATA_FILE[fmt]
    raw = bytearray(data.read_bytes())
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    sizes = open_dataset(root).index.arrays["sizes"]
    if fmt == "lmdb":  # find sample 3's bytes in the file
        from reference import stored_samples

        at = bytes(raw).index(stored_samples(root)[3]) + 5
    else:
        offsets = open_dataset(root).index.arrays["offsets"]
        at = int(offsets[3]) + (spec.MMAP_HEADER_BYTES if fmt == "mmap" else 0) + int(sizes[3]) // 2
        if fmt == "hdf5":
            table = __import__("numpy").load(root / spec.HDF5_CHUNK_TABLE)
            pos = int(offsets[3]) + int(sizes[3]) // 2
            at = int(table[pos // meta["storage"]["chunk_bytes"]]) + pos % meta["storage"]["chunk_bytes"]
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))
    report = verify(url)
    where = {p.where: p.what for p in report.problems}
    assert where[f"{url}/{spec.DATA_FILE[fmt]}"] == "file checksum differs from the index"
    assert where[f"{url}/{spec.DATA_FILE[fmt]} sample 3"].startswith("checksum mismatch"), where


# --------------------------------------------------------------------------- kill -9 and --resume


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_pack_killed_and_resumed_gives_the_same_objects(s3_server, big_source, tmp_path, fmt):
    """A pack to S3 killed with SIGKILL part-way and re-run with --resume = an uninterrupted pack."""
    s3_server.start()
    env = s3_server.env()
    run = uuid.uuid4().hex[:8]
    killed, clean = s3_server.url(f"kill-{run}"), s3_server.url(f"clean-{run}")
    shape = ["-f", fmt, "-w", "1", "-q", "--checkpoint-bytes", "256k"] + (["--shard-count", "4"] if fmt == "wds" else [])
    res = _cli([str(big_source), "-o", clean, *shape, "--stage-dir", str(tmp_path / "clean")], env)
    assert res.returncode == 0, res.stderr
    stage = tmp_path / "killed"
    store = open_store(killed, s3_server.storage_options())
    proc = subprocess.Popen([sys.executable, "-m", "packer.cli", str(big_source), "-o", killed, *shape,
                             "--stage-dir", str(stage)], cwd=REPO, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if fmt == "wds":  # some shards are in the store already
            wait_for(lambda: len([n for n in store.list() if n.endswith(".tar")]) >= 3, 120, "3 uploaded shards")
        else:  # a few checkpoints are durable in the staging folder
            state = stage / spec.STATE_NAME
            wait_for(lambda: state.exists() and json.loads(state.read_text())["done"] >= 20, 120, "checkpoints")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the pack finished before it could be killed"
    assert not store.exists(spec.INDEX_NAME)
    # wds: shards but no index.json ("never finished"); mmap uploads after packing: nothing there yet.
    with pytest.raises(spec.IncompleteDatasetError if fmt == "wds" else FileNotFoundError):
        open_dataset(killed, storage_options=s3_server.storage_options())
    res = _cli([str(big_source), "-o", killed, *shape, "--stage-dir", str(stage), "--resume"], env)
    assert res.returncode == 0, res.stderr
    assert "resumed after" in res.stdout
    ours, theirs = _objects(store), _objects(open_store(clean, s3_server.storage_options()))
    assert sorted(ours) == sorted(theirs)
    assert [n for n in ours if ours[n] != theirs[n]] == []
    assert not stage.exists()
    assert verify(killed, storage_options=s3_server.storage_options()).ok


@pytest.mark.slow
def test_network_failure_during_upload_then_resume(s3_server, generated, tmp_path):
    """The store dies while shards are uploaded: a one-line PackError (resumable); --resume finishes it."""
    from packer.errors import PackError
    from readers.remote import RetryPolicy

    s3_server.start()
    so, run = s3_server.storage_options(), uuid.uuid4().hex[:8]
    url, clean = s3_server.url(f"net-{run}"), s3_server.url(f"netclean-{run}")
    opts = PackOptions(format="wds", workers=1, shard_count=3)
    pack(generated, clean, opts, remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "clean"))
    sent = {"n": 0}

    def kill_on_third_upload(split):
        def update(nbytes: int) -> None:
            sent["n"] += 1
            if sent["n"] == 3:
                s3_server.kill()

        return update

    quick = RetryPolicy(tries=3, budget_s=2.0, base_delay_s=0.2, connect_timeout_s=1, read_timeout_s=5)
    try:
        with pytest.raises(PackError, match=r"re-run with --resume") as err:
            pack(generated, url, opts, remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "st", retry=quick,
                                                            upload_progress=kill_on_third_upload))
        assert "\n" not in str(err.value)
    finally:
        s3_server.start()
    store = open_store(url, so)
    assert not store.exists(spec.INDEX_NAME)
    pack(generated, url, PackOptions(format="wds", workers=1, shard_count=3, resume=True),
         remote=RemoteOptions(storage_options=so, stage_dir=tmp_path / "st"))
    ours, theirs = _objects(store), _objects(open_store(clean, so))
    assert sorted(ours) == sorted(theirs) and all(ours[n] == theirs[n] for n in ours)
