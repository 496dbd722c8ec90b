"""``pack-dataset convert`` from and to object storage (issue 35: convert on s3://, gs:// and az://), against
the real servers the tests start (SeaweedFS, fake-gcs-server, Azurite: tests/servers.py).

For each store: a dataset packed into the bucket is converted into another format in the bucket (the CLI with
the store's usual environment, and the Python API) and into a local folder; ``verify`` says OK on the result
and every sample's stored bytes and label equal the source's (an mmap target stores pixels: compared with the
source image decoded). A convert into the bucket killed with a real SIGKILL part-way and run again with
``--resume`` leaves the same objects as an uninterrupted one.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from packer import PackOptions, RemoteOptions, pack
from packer.errors import OutputError
from packer.tools.convert import convert
from packer.tools.verify import verify
from readers import make_loader, open_dataset
from readers.contract import spec
from readers.remote import open_store
from reliability_helpers import cli_here

pytest_plugins = ["servers"]
# gcsfs hands aiohttp a data file (a few MB) as one bytes body and aiohttp advises a stream: a hint, not a leak
# (the CLI never shows it); with filterwarnings=error it would fail the in-process packs to gs:// here
pytestmark = pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(params=["s3", "gs", "az"])
def server(request):
    """The S3, GCS or Azure server, up when the test starts."""
    srv = request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param])
    srv.start()  # a previous test may have stopped it
    return srv


def _env(server) -> dict[str, str]:
    return {**os.environ, **server.env(), "AWS_EC2_METADATA_DISABLED": "true"}


def _cli(args: list[str], server) -> subprocess.CompletedProcess:
    """``pack-dataset ARGS`` in a child process, with the store's usual environment (the subject of a test)."""
    return subprocess.run([sys.executable, "-m", "packer.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env=_env(server), timeout=300)


def _here(args: list[str], server) -> subprocess.CompletedProcess:
    """``pack-dataset ARGS`` in this process, with the same environment (the checks around the subject)."""
    return cli_here(*args, env=_env(server))


def _source(server, generated, fmt: str) -> str:
    """``generated`` packed into a fresh prefix of the bucket as ``fmt``; its URL."""
    url = server.url(f"src-{uuid.uuid4().hex[:10]}")
    pack(generated, url, PackOptions(format=fmt, workers=1, **({"shard_count": 5} if fmt == "wds" else {})),
         remote=RemoteOptions(storage_options=server.storage_options()))
    return url


def _samples(where, storage_options) -> tuple[list, list[int]]:
    """Every sample's stored data (bytes, or pixels for mmap) and label, in order."""
    ds = open_dataset(where, storage_options=storage_options, decode=False, return_index=True)
    try:
        seen = {}
        for batch, labels, idx in make_loader(ds, batch_size=8, num_workers=0, seed=1):
            for k, i in enumerate(idx.tolist()):
                seen[i] = (batch[k] if isinstance(batch, torch.Tensor) else batch.get(k), int(labels[k]))
        assert sorted(seen) == list(range(len(seen)))
        return [seen[i][0] for i in range(len(seen))], [seen[i][1] for i in range(len(seen))]
    finally:
        ds.close()


def _pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def _same_samples(src: str, out, storage_options, target_fmt: str) -> None:
    want, want_labels = _samples(src, storage_options)
    got, got_labels = _samples(out, storage_options if isinstance(out, str) else None)
    assert got_labels == want_labels
    assert len(got) == len(want) == 28
    for i, (a, b) in enumerate(zip(got, want)):
        if target_fmt == "mmap":  # pixels (undecoded: the raw HWC uint8 bytes): the source image decoded
            raw = a.numpy().tobytes() if isinstance(a, torch.Tensor) else bytes(a)
            assert raw == _pixels(bytes(b)).tobytes(), f"sample {i}"
        else:
            assert bytes(a) == bytes(b), f"sample {i}"


@pytest.mark.parametrize("src_fmt,dst_fmt", [("wds", "lmdb"), ("hdf5", "wds")])
def test_cli_converts_a_bucket_dataset_into_the_bucket(server, generated, tmp_path, src_fmt, dst_fmt):
    """The CLI with the store's usual environment (no options): bucket -> bucket, index.json last, the
    staging folder gone; verify OK; every sample's stored bytes and label are the source's."""
    src = _source(server, generated, src_fmt)
    out = server.url(f"out-{uuid.uuid4().hex[:10]}")
    stage = tmp_path / "stage"
    extra = ["--shard-count", "4"] if dst_fmt == "wds" else []
    done = _cli(["convert", src, "-f", dst_fmt, "-o", out, "-w", "1", "-q", "--stage-dir", str(stage), *extra], server)
    assert done.returncode == 0, done.stderr
    assert f"-> {out}" in done.stdout
    assert not stage.exists(), "the staging folder goes once the upload is complete"
    checked = _here(["verify", out, "-q"], server)
    assert checked.returncode == 0 and f"{out}: 28 samples checked, OK" in checked.stdout, checked.stdout + checked.stderr
    info = json.loads(_here(["info", out, "--json"], server).stdout)
    assert (info["state"], info["format"], info["samples"]) == ("complete", dst_fmt, 28)
    _same_samples(src, out, server.storage_options(), dst_fmt)


@pytest.mark.parametrize("src_fmt,dst_fmt,to_bucket", [("lmdb", "hdf5", False), ("wds", "mmap", True)])
def test_api_converts_a_bucket_dataset(server, generated, tmp_path, src_fmt, dst_fmt, to_bucket):
    """``convert()`` with ``RemoteOptions``: bucket -> local folder, and encoded -> mmap (pixels) in the bucket."""
    so = server.storage_options()
    src = _source(server, generated, src_fmt)
    out = server.url(f"out-{uuid.uuid4().hex[:10]}") if to_bucket else tmp_path / "out"
    remote = RemoteOptions(storage_options=so, stage_dir=tmp_path / "stage") if to_bucket \
        else RemoteOptions(storage_options=so)
    [result] = convert(src, out, PackOptions(format=dst_fmt, workers=1), remote=remote)
    assert str(result.out) == str(out)
    if to_bucket:  # verify of the bucket through the CLI (in this process: the CLI subprocess is test_cli_...)
        checked = _here(["verify", str(out), "-q"], server)
        assert checked.returncode == 0 and "28 samples checked, OK" in checked.stdout, checked.stdout + checked.stderr
    else:
        assert verify(out).ok
    _same_samples(src, out, so, dst_fmt)


def test_split_datasets_and_bad_locations(server, generated, tmp_path):
    """A prefix of split datasets converts split by split; a prefix with no dataset, an output inside the
    source, and the CLI without -o are one line each, nothing written."""
    so = server.storage_options()
    base = server.url(f"splits-{uuid.uuid4().hex[:10]}")
    for split in ("train", "val"):
        pack(generated, f"{base}/{split}", PackOptions(format="lmdb", workers=1), remote=RemoteOptions(storage_options=so))
    results = convert(base, tmp_path / "out", PackOptions(format="wds", workers=1, shard_count=10),
                      remote=RemoteOptions(storage_options=so))
    assert sorted(Path(r.out).name for r in results) == ["train", "val"]
    for split in ("train", "val"):
        assert verify(tmp_path / "out" / split).ok
    from packer.errors import SourceError

    with pytest.raises(SourceError, match=r"not a packed dataset"):
        convert(server.url(f"nothing-{uuid.uuid4().hex[:6]}"), tmp_path / "x", PackOptions(format="wds"),
                remote=RemoteOptions(storage_options=so))
    with pytest.raises(OutputError, match="overlaps the source dataset"):
        convert(base, f"{base}/train/inner", PackOptions(format="wds"), remote=RemoteOptions(storage_options=so))
    done = _cli(["convert", f"{base}/train", "-f", "hdf5"], server)
    assert done.returncode == 2 and "needs -o" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


_KILLED_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from packer import PackOptions, RemoteOptions
    from packer.tools.convert import convert

    src, out, stage = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    seen = [0]

    def progress(split, source):
        def tick(images, nbytes):
            seen[0] += images
            if seen[0] >= 60:  # half-way: wait until two shards are recorded as uploaded, then die
                uploads = stage / "uploads.jsonl"
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and (not uploads.exists()
                                                      or uploads.read_text().count('"crc32"') < 2):
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGKILL)
        return tick

    convert(src, out, PackOptions(format="wds", workers=1, shard_count=8, checkpoint_bytes=128 * 1024),
            remote=RemoteOptions(stage_dir=stage), progress=progress)
""")


def test_a_convert_killed_part_way_resumes_to_the_same_objects(server, tmp_path):
    """A convert into the bucket killed with a real SIGKILL after some shards were uploaded, re-run with
    --resume through the CLI: the same objects as an uninterrupted convert, index.json only at the end."""
    from conftest import make_image_folder

    so = server.storage_options()
    images = make_image_folder(tmp_path / "img" / "train", classes=3, per_class=40, size=(64, 48), seed=5)
    src = server.url(f"ksrc-{uuid.uuid4().hex[:10]}")
    pack(images, src, PackOptions(format="lmdb", workers=1), remote=RemoteOptions(storage_options=so))
    run = uuid.uuid4().hex[:8]
    killed, clean = server.url(f"kill-{run}"), server.url(f"clean-{run}")
    shape = ["-f", "wds", "-w", "1", "-q", "--shard-count", "8", "--checkpoint-bytes", "128k"]
    res = _here(["convert", src, "-o", clean, *shape, "--stage-dir", str(tmp_path / "clean")], server)
    assert res.returncode == 0, res.stderr
    stage = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", _KILLED_CHILD, src, killed, str(stage)], cwd=REPO,
                          env=_env(server), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    store = open_store(killed, so)
    try:
        names = store.list()
        assert len([n for n in names if n.endswith(".tar")]) >= 2 and spec.INDEX_NAME not in names
        info = _here(["info", killed], server)  # no index.json: never opens as complete
        assert info.returncode == 2 and "no index.json" in info.stderr, info.stdout + info.stderr
        res = _cli(["convert", src, "-o", killed, *shape, "--stage-dir", str(stage), "--resume"], server)
        assert res.returncode == 0, res.stderr
        assert "resumed after" in res.stdout
        theirs_store = open_store(clean, so)
        try:
            ours = {n: store.read(n) for n in store.list()}
            theirs = {n: theirs_store.read(n) for n in theirs_store.list()}
        finally:
            theirs_store.close()
    finally:
        store.close()
    assert sorted(ours) == sorted(theirs)
    assert [n for n in ours if ours[n] != theirs[n]] == []
    assert not stage.exists()
    checked = _here(["verify", killed, "-q"], server)
    assert checked.returncode == 0 and "checked, OK" in checked.stdout, checked.stdout + checked.stderr
