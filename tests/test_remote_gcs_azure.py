"""``gs://`` and ``az://`` / ``abfs://`` (issue 35 item 3) against real emulators started by the tests:
fake-gcs-server for Google Cloud Storage, Azurite for Azure Blob Storage (tests/servers.py).

What ``s3://`` promises, checked here for both: the store's primitives (whole and ranged reads with their
byte caps, stat with a store identity, listing, atomic upload, delete, one-line not-found errors); a pack
straight to the bucket through the CLI, ``verify`` (which finds a flipped byte) and ``info``; every format
read back sample-for-sample equal to the local pack, with and without the node cache; manifests whose
images are such URLs; no credentials is one line saying where it looked; a read during an outage is
retried within the budget and then is one line; a store that stops answering (the S3 server too) is a deadline,
not a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
import warnings

import pytest

from dataset_bench.servers import close_client
from packer import PackOptions, pack
from packer.cli import main as pack_dataset
from packer.options import RemoteOptions
from readers import make_loader, open_dataset
from readers.contract.spec import FORMATS
from readers.remote import RemoteAuthError, RetryPolicy, open_store
from readers.remote.errors import ObjectNotFoundError, RemoteError, RemoteTooLargeError

pytest_plugins = ["servers"]


@pytest.fixture(params=["gs", "az"])
def emulator(request):
    """The GCS or the Azure emulator, up when the test starts."""
    server = request.getfixturevalue("gcs_server" if request.param == "gs" else "azure_server")
    server.start()  # a previous test may have killed it
    return server


def _prefix(server) -> str:
    return server.url(f"t-{uuid.uuid4().hex[:10]}")


def _cli(*args, env) -> subprocess.CompletedProcess:
    """``pack-dataset ARGS`` in a fresh process whose environment is ``env`` and nothing else."""
    return subprocess.run([sys.executable, "-m", "packer.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*ARGS, env=ENV)``: ``pack-dataset ARGS`` through the CLI's entry point in this process, with the
    variables of ``ENV`` (the emulator's) set for the call only: the exit code and output, as a finished
    process holds them. The stores read the environment when they open (readers.remote.config), as they do
    in a fresh process; none of these tests is about the process, and a fresh Python costs an import of torch.
    Python's default filters, as in that process: aiohttp's ResourceWarning about a large upload body given as
    bytes (the uploads of the packer's data files) is ignored there, and is no error here."""
    def run(*args, env: dict[str, str]) -> subprocess.CompletedProcess:
        capsys.readouterr()
        with monkeypatch.context() as m, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Sending a large body directly with raw bytes", ResourceWarning)
            for name, value in env.items():
                if os.environ.get(name) != value:
                    m.setenv(name, value)
            code = pack_dataset([str(a) for a in args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["pack-dataset", *map(str, args)], code, out.out, out.err)

    return run


def test_store_primitives(emulator):
    url = _prefix(emulator)
    store = open_store(url, emulator.storage_options())
    try:
        assert not store.read_only and url.split("://")[0] in store.identity
        store.put_bytes("index.json", b'{"a": 1}')
        store.put_bytes("sub/x.bin", bytes(range(256)) * 4)
        assert store.read("index.json") == b'{"a": 1}'
        assert store.read_range("sub/x.bin", 250, 10) == bytes(range(250, 256)) + bytes(range(4))
        info = store.stat("sub/x.bin")
        assert info.size == 1024 and (info.etag or info.mtime)
        assert sorted(store.list("")) == ["index.json", "sub/x.bin"]
        with pytest.raises(ObjectNotFoundError, match=rf"^{url}/missing.json: no such object"):
            store.read("missing.json")
        with pytest.raises(RemoteTooLargeError, match="declares 1024 bytes, more than the 100 bytes"):
            store.read("sub/x.bin", max_bytes=100)
        before = store.stat("index.json")
        store.put_bytes("index.json", b'{"a": 2}')  # a rewrite is a new store identity
        assert store.stat("index.json").identity() != before.identity()
        store.delete("sub/x.bin")
        assert not store.exists("sub/x.bin")
    finally:
        store.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_verify_info_and_read_back(emulator, generated, packed_generated, stored_bytes, tmp_path, fmt, cli):
    """The CLI packs straight into the bucket (credentials from the emulator's environment variable); verify
    and info read it there; every sample reads back with the local pack's stored bytes and label, through
    the node cache and without it."""
    url = f"{_prefix(emulator)}/{fmt}"
    extra = ["--shard-count", "5"] if fmt == "wds" else []
    done = cli(str(generated), "-f", fmt, "-o", url, "--workers", "1", "-q", *extra, env=emulator.env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"-> {url}")
    checked = cli("verify", url, "-q", env=emulator.env())
    assert checked.returncode == 0 and "checked, OK" in checked.stdout, checked.stderr
    info = cli("info", url, env=emulator.env())
    assert info.returncode == 0 and "state        complete" in info.stdout, info.stderr
    local_root = packed_generated[fmt]
    local = open_dataset(local_root, decode=False, return_index=True)
    for cache_dir in (None, tmp_path / "cache"):
        ds = open_dataset(url, storage_options=emulator.storage_options(), decode=False, return_index=True,
                          cache_dir=cache_dir)
        try:
            seen = {}
            for batch, labels, idx in make_loader(ds, batch_size=4, num_workers=0, seed=1):
                for k, i in enumerate(idx.tolist()):
                    seen[i] = (batch.get(k), int(labels[k]))
            assert sorted(seen) == list(range(local.index.num_samples))
            for i, (blob, label) in seen.items():
                assert blob == stored_bytes(local_root, i), f"{fmt} sample {i}"
                assert label == int(local.labels[i])
        finally:
            ds.close()
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*")), "the data files landed in the cache"
    local.close()


def test_verify_finds_a_flipped_byte(emulator, generated, cli):
    url = f"{_prefix(emulator)}/wds"
    pack(generated, url, PackOptions(format="wds", workers=1, shard_count=2),
         remote=RemoteOptions(storage_options=emulator.storage_options()))
    fs = emulator.client()
    try:
        shard = next(p for p in fs.find(url.split("://", 1)[1]) if p.endswith(".tar"))
        data = bytearray(fs.cat_file(shard))
        data[2000] ^= 0xFF  # inside the first member's bytes (after its 512-byte header)
        fs.pipe_file(shard, bytes(data))
    finally:
        close_client(fs)
    done = cli("verify", url, "-q", env=emulator.env())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DAMAGED" in done.stdout and "Traceback" not in done.stderr


def test_a_manifest_of_bucket_image_urls_packs(emulator, real_images, tmp_path, cli):
    """A CSV whose image column holds gs:// / az:// URLs: each image is read from the bucket."""
    base = _prefix(emulator)
    fs = emulator.client()
    images = sorted(p for p in real_images.rglob("*.jpg"))[:4]
    rows = ["image,caption"]
    try:
        for k, path in enumerate(images):
            fs.pipe_file(f"{base.split('://', 1)[1]}/img/{k}.jpg", path.read_bytes())
            rows.append(f"{base}/img/{k}.jpg,photo {k}")
    finally:
        close_client(fs)
    (tmp_path / "rows.csv").write_text("\n".join(rows) + "\n")
    done = cli(str(tmp_path / "rows.csv"), "-f", "lmdb", "-o", str(tmp_path / "out"), "-q", env=emulator.env())
    assert done.returncode == 0, done.stderr
    ds = open_dataset(tmp_path / "out", decode=False, fields=("image", "caption"))
    try:
        assert [ds[k][0] for k in range(len(images))] == [p.read_bytes() for p in images]
        assert [ds[k][1] for k in range(len(images))] == [f"photo {k}" for k in range(len(images))]
    finally:
        ds.close()


def test_no_credentials_is_one_line_saying_where_it_looked(tmp_path):
    env_gs = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GCE_METADATA_HOST": "127.0.0.1:9",
              "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True"}
    done = _cli("info", "gs://some-bucket/data", env=env_gs)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "no credentials found" in line and "GOOGLE_APPLICATION_CREDENTIALS" in line, line
    with pytest.raises(RemoteAuthError, match=r"^az://c/x: az:// needs a storage account: set AZURE_STORAGE_ACCOUNT_NAME"):
        import os

        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AZURE_STORAGE")}
        try:
            open_store("az://c/x")
        finally:
            os.environ.update(saved)


def test_an_outage_is_retried_then_one_line(emulator):
    """The emulator killed: a read is retried for the policy's budget, then one RemoteError naming the object;
    back up, the same store reads again."""
    url = _prefix(emulator)
    store = open_store(url, emulator.storage_options(), RetryPolicy(budget_s=1.0, connect_timeout_s=1.0,
                                                                     read_timeout_s=2.0))
    try:
        store.put_bytes("a.bin", b"abc")
        emulator.kill()
        with pytest.raises(RemoteError, match=rf"^{url}/a.bin: "):
            store.read("a.bin")
        emulator.start()  # a restart after SIGKILL keeps no objects (fake-gcs-server holds them in memory,
        store.put_bytes("a.bin", b"xyz")  # Azurite saves its metadata now and then)
        assert store.read("a.bin") == b"xyz"
    finally:
        store.close()


@pytest.fixture(params=["s3", "gs", "az"])
def any_store(request):
    """(the S3, GCS or Azure server, a fresh URL prefix on it), the server up when the test starts."""
    server = request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param])
    server.start()
    return server, (_prefix(server) if request.param != "s3" else server.url(f"t-{uuid.uuid4().hex[:10]}"))


@pytest.mark.slow  # the deadline itself, a few seconds per store
def test_a_store_that_stops_answering_is_a_deadline_not_a_hang(any_store):
    """The server frozen with a real SIGSTOP (its port still accepts connections, nothing answers): a read
    ends within the policy's deadline as one RemoteError naming the object; thawed, the store reads again."""
    server, url = any_store
    policy = RetryPolicy(budget_s=1.0, connect_timeout_s=1.0, read_timeout_s=2.0)
    store = open_store(url, server.storage_options(), policy)
    group = os.getpgid(server.pid)
    try:
        store.put_bytes("a.bin", b"abc")
        os.killpg(group, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match=rf"^{url}/a.bin: ") as caught:
            store.read("a.bin")
        elapsed = time.monotonic() - t0
        assert "\n" not in str(caught.value)
        assert elapsed < policy.deadline_s + 15, f"a frozen store took {elapsed:.1f}s to give up"  # not a hang
    finally:
        os.killpg(group, signal.SIGCONT)
    try:
        assert store.read("a.bin") == b"abc"
    finally:
        store.close()
