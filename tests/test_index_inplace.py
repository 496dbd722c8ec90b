"""``pack-dataset index`` (issue 35 items 1-2): img2dataset-style shards (image + ``.txt`` + ``.json``),
written with ``tarfile`` and with webdataset's ``ShardWriter``, indexed where they are -- a read-only
local folder, the S3, GCS and Azure emulators -- and read back through ``open_dataset(IDX)``:
every sample once with its fields byte-exact, a shuffle that differs per epoch, exact mid-epoch
resume with 2 worker processes on 2 ranks, the same samples as ``pack-dataset shards/ -f wds``;
``verify`` names a flipped byte's sample; a replaced shard is one line; no byte of a shard is written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import readers.contract.env
from packer import PackOptions, pack
from packer.cli import main
from packer.tools.index import JOURNAL, index_shards
from readers import make_loader, mix, open_dataset, subset
from readers.contract import spec
from readers.contract.env import WorkerEnv
from reliability_helpers import env, wait_for

pytest_plugins = ["servers"]
SHARDS, PER = 4, 7  # 28 samples in 4 shards


def _jpeg(n: int) -> bytes:
    rng = np.random.default_rng(n)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (12 + n % 5, 10 + n % 3, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _sample(n: int) -> dict[str, bytes]:
    """img2dataset's members: the image, its caption, its metadata."""
    key = f"{n:09d}"
    return {"__key__": key, "jpg": _jpeg(n), "txt": f"a caption for {key} ünïcode".encode(),
            "json": json.dumps({"key": key, "width": 10 + n % 3, "status": "success"}).encode()}


def _write_tarfile(folder: Path) -> None:
    folder.mkdir(parents=True)
    for s in range(SHARDS):
        with tarfile.open(folder / f"{s:05d}.tar", "w") as tar:
            for n in range(s * PER, (s + 1) * PER):
                sample = _sample(n)
                for ext in ("jpg", "txt", "json"):
                    info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    info.size = len(sample[ext])
                    tar.addfile(info, io.BytesIO(sample[ext]))


def _write_shardwriter(folder: Path) -> None:
    import webdataset as wds

    folder.mkdir(parents=True)
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=PER, verbose=0) as sink:
        for n in range(SHARDS * PER):
            sink.write(_sample(n))


def _fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir())}


WRITERS = {"tarfile": _write_tarfile, "shardwriter": _write_shardwriter}


@pytest.fixture(scope="module", params=list(WRITERS))
def indexed(request, tmp_path_factory):
    """(read-only shard folder, its index, fingerprint of the shards before indexing)."""
    root = tmp_path_factory.mktemp(f"inplace-{request.param}")
    shards = root / "shards"
    WRITERS[request.param](shards)
    for p in shards.iterdir():
        p.chmod(0o444)
    shards.chmod(0o555)
    before = _fingerprint(shards)
    summary = index_shards([str(shards)], root / "idx", workers=2)
    assert summary == {"samples": SHARDS * PER, "shards": SHARDS, "rejected": 0, "ignored": 0,
                       "bytes": sum(p.stat().st_size for p in shards.iterdir())}
    yield shards, root / "idx", before
    assert _fingerprint(shards) == before, "a shard was written"


def _expected(n: int) -> dict[str, bytes]:
    s = _sample(n)
    return {"image": s["jpg"], "txt": s["txt"], "json": s["json"]}


def _by_key(ds) -> dict[str, dict[str, bytes]]:
    """Every sample of ``ds`` by its key, with each field's stored bytes (``field_blob``: byte-exact)."""
    out = {}
    for i, name in enumerate(ds.index.names()):
        key = name.rsplit("/", 1)[1].split(".")[0]
        assert key not in out
        out[key] = {f.name: bytes(ds.field_blob(i, f)) for f in ds.schema}
    return out


def _values(ds) -> dict[str, dict]:
    """Every sample of ``ds`` by its key, as a reader gives it (a wds pack stores JSON re-serialised)."""
    return {name.rsplit("/", 1)[1].split(".")[0]: dict(ds.get(i) if hasattr(ds, "get") else ds[i])
            for i, name in enumerate(ds.index.names())}


def test_every_sample_once_fields_byte_exact(indexed):
    shards, idx, _ = indexed
    ds = open_dataset(idx, decode=False, return_index=True, shuffle=False)
    assert set(ds.schema.names) == {"image", "txt", "json"} and len(ds) == SHARDS * PER  # ShardWriter sorts
    seen = Counter()
    names = list(ds.index.names())
    for item in ds:
        i = item["__index__"]
        seen[i] += 1
        n = int(names[i].rsplit("/", 1)[1].split(".")[0])
        want = _expected(n)
        assert item["image"] == want["image"]
        assert item["txt"] == want["txt"].decode() and item["txt"].encode() == want["txt"]
        assert item["json"] == json.loads(want["json"])
    assert seen == Counter(range(SHARDS * PER))
    assert _by_key(ds) == {f"{n:09d}": _expected(n) for n in range(SHARDS * PER)}


def test_shuffled_order_differs_per_epoch_mixtures_and_subsets(indexed):
    _, idx, _ = indexed
    ds = open_dataset(idx, decode=False, return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=0, seed=3)
    epochs = [[i for b in loader for i in b["__index__"].tolist()] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(SHARDS * PER))
    assert epochs[0] != epochs[1] and epochs[0] != sorted(epochs[0])
    part = subset(ds, indices=range(0, SHARDS * PER, 2))
    assert len(part) == SHARDS * PER // 2
    both = mix([(part, 1.0), (open_dataset(idx, decode=False, return_index=True), 1.0)], samples_per_epoch=10,
               seed=1)
    assert sum(len(b["txt"]) for b in make_loader(both, batch_size=5, num_workers=0)) == 10


def _hook(rank, world):
    def env():
        from torch.utils.data import get_worker_info

        info, thread = get_worker_info(), readers.contract.env.thread_worker()
        if info is not None:
            return WorkerEnv(rank, world, info.id, info.num_workers)
        return WorkerEnv(rank, world, *((thread.worker_id, thread.num_workers) if thread else (0, 1)))
    return env


def _ranks(idx, monkeypatch, state=None, k=None):
    out, states = [], []
    for r in range(2):
        monkeypatch.setattr(readers.contract.env, "worker_env_hook", _hook(r, 2))
        loader = make_loader(open_dataset(idx, decode=False, return_index=True), batch_size=3, num_workers=2,
                             seed=5, workers="processes")
        if state is not None:
            loader.load_state_dict(state)
        batches = []
        for b in loader:
            batches.append(b["__index__"].tolist())
            if k is not None and len(batches) == k:
                break
        out.append(batches)
        states.append(loader.state_dict())
        del loader
    monkeypatch.undo()
    return out, states


@pytest.mark.slow  # worker processes / a pack and a convert / an emulator
def test_resume_mid_epoch_two_workers_two_ranks(indexed, monkeypatch):
    _, idx, _ = indexed
    full, _ = _ranks(idx, monkeypatch)
    assert Counter(i for r in full for b in r for i in b) == Counter(range(SHARDS * PER)), "DDP split: each once"
    part, states = _ranks(idx, monkeypatch, k=2)
    assert states[0] == states[1]
    rest, _ = _ranks(idx, monkeypatch, state=states[0])
    for r in range(2):
        assert part[r] + rest[r] == full[r], f"rank {r}: the resumed epoch is not the rest of the uninterrupted one"


@pytest.mark.slow  # worker processes / a pack and a convert / an emulator
def test_same_samples_as_a_wds_pack_and_convert(indexed, tmp_path, cli):
    shards, idx, _ = indexed
    pack(shards, tmp_path / "pack", PackOptions(format="wds", workers=1))
    packed, inplace = open_dataset(tmp_path / "pack", decode=False), open_dataset(idx, decode=False)
    assert packed.schema == inplace.schema
    assert _values(inplace) == _values(packed) and len(_values(packed)) == SHARDS * PER
    done = cli("convert", str(idx), "-f", "lmdb", "-o", str(tmp_path / "lmdb"), "-q")
    assert done.returncode == 0, done.stderr
    assert _values(open_dataset(tmp_path / "lmdb", decode=False)) == _values(packed)


@pytest.fixture
def cli(capsys):
    """``pack-dataset ARGS`` through its entry point, in this process: (exit code, stdout, stderr)."""
    def run(*args: str) -> SimpleNamespace:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run


def test_verify_names_the_sample_of_a_flipped_byte(tmp_path, cli):
    shards = tmp_path / "shards"
    _write_tarfile(shards)
    done = cli("index", str(shards), "-o", str(tmp_path / "idx"), "-q")
    assert done.returncode == 0, done.stderr
    assert cli("verify", str(tmp_path / "idx"), "-q").returncode == 0
    target = shards / "00001.tar"
    data = bytearray(target.read_bytes())
    pos = data.index(b"a caption for 000000009")  # sample 9 (the third of shard 1) is index 9
    data[pos + 3] ^= 0x01
    st = target.stat()
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: same size, same mtime
    done = cli("verify", str(tmp_path / "idx"), "-q")
    assert done.returncode == 1
    damaged = [line for line in done.stdout.splitlines() if line.startswith("DAMAGED")]
    assert f"DAMAGED {target} sample 9 field 'txt': checksum mismatch: the member changed since it was indexed" \
        in damaged, done.stdout
    assert f"DAMAGED {target}: shard checksum differs from the index" in damaged


def test_a_replaced_or_missing_shard_is_one_line(tmp_path, cli):
    shards = tmp_path / "shards"
    _write_tarfile(shards)
    index_shards([str(shards)], tmp_path / "idx")
    ds = open_dataset(tmp_path / "idx", decode=False, shuffle=False)
    (shards / "00002.tar").write_bytes((shards / "00001.tar").read_bytes())  # same size, another content
    with pytest.raises(spec.DatasetFormatError, match=r"00002\.tar: shard changed since it was indexed"):
        list(ds)
    (shards / "00002.tar").unlink()
    with pytest.raises(spec.DatasetFormatError, match=r"00002\.tar: shard is missing \(moved or deleted\)"):
        list(open_dataset(tmp_path / "idx", decode=False))
    done = cli("verify", str(tmp_path / "idx"), "-q")
    assert done.returncode == 1 and "00002.tar: shard is missing" in done.stdout and "Traceback" not in done.stderr


def test_patterns_lists_rejects_resume_and_refusals(tmp_path, cli):
    shards = tmp_path / "shards"
    _write_tarfile(shards)
    with tarfile.open(shards / "00004.tar", "w") as tar:  # a missing member, a bad json, a duplicate key
        for name, data in [("a.jpg", _jpeg(1)), ("a.txt", b"x"), ("b.jpg", _jpeg(2)), ("b.json", b"{}"),
                           ("c.jpg", _jpeg(3)), ("c.txt", b"y"), ("c.json", b"{nope"),
                           ("d.jpg", _jpeg(4)), ("d.txt", b"z"), ("d.json", b"{}"),
                           ("a.jpg", _jpeg(1)), ("a.txt", b"x"), ("a.json", b"{}")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (shards / "list.txt").write_text("# the shards\n00000.tar\n\n00004.tar\n")
    done = cli("index", str(shards / "list.txt"), "-o", str(tmp_path / "a"), "-q")
    assert done.returncode == 3, done.stderr
    rejects = [json.loads(line) for line in (tmp_path / "a" / spec.REJECTS_NAME).read_text().splitlines()]
    assert [r["path"] for r in rejects] == ["00004.tar/a", "00004.tar/b", "00004.tar/c", "00004.tar/a"]
    assert "no member b.txt (field 'txt')" in rejects[1]["reason"] and "not a json member" in rejects[2]["reason"]
    assert "duplicate key" in rejects[3]["reason"]
    assert len(open_dataset(tmp_path / "a")) == PER + 1
    # a brace pattern and a glob name the same shards as the folder
    braced = index_shards([str(shards / "{00000..00003}.tar")], tmp_path / "b")
    assert braced == index_shards([str(shards / "0000[0-3].tar")], tmp_path / "c")
    # an interrupted index (a shard that is no tar) continues with --resume
    (shards / "00004.tar").write_bytes(b"not a tar" * 100)
    done = cli("index", str(shards / "{00000..00004}.tar"), "-o", str(tmp_path / "d"), "-q", "-w", "1")
    assert done.returncode == 2 and "00004.tar: not a readable tar file" in done.stderr
    journal = (tmp_path / "d" / JOURNAL).read_text().splitlines()  # the shards, then one line per shard scanned
    assert [json.loads(line)["k"] for line in journal[1:]] == [0, 1, 2, 3]
    again = cli("index", str(shards / "{00000..00004}.tar"), "-o", str(tmp_path / "d"), "-q")
    assert again.returncode == 2 and "--resume continues it" in again.stderr
    shutil.copy(shards / "00003.tar", shards / "00004.tar")
    torn = "\n".join(journal[:-1] + [journal[-1][:40]])  # a crash cut the last line: shard 3 is scanned again
    (tmp_path / "d" / JOURNAL).write_text(torn)
    done = cli("index", str(shards / "{00000..00004}.tar"), "-o", str(tmp_path / "d"), "-q", "--resume")
    assert done.returncode == 3 and "28 samples in 5 shards" in done.stdout and "7 rejected" in done.stdout  # 4 = 3
    # a journal an older version left (a list per sample, not the scan's columns): those shards are scanned again
    old = journal[:2] + [json.dumps({"k": 1, "scan": {"name": "00001.tar", "samples": [["x", [], None]]}})]
    (tmp_path / "d" / JOURNAL).write_text("\n".join(old) + "\n")
    shutil.rmtree(tmp_path / "d2", ignore_errors=True)
    shutil.copytree(tmp_path / "d", tmp_path / "d2")
    (tmp_path / "d2" / spec.INDEX_NAME).unlink()
    done = cli("index", str(shards / "{00000..00004}.tar"), "-o", str(tmp_path / "d2"), "-q", "--resume")
    assert done.returncode == 3 and "28 samples in 5 shards" in done.stdout, done.stdout + done.stderr
    # compressed shards: one line
    with tarfile.open(tmp_path / "gz.tar.gz", "w:gz") as tar:
        tar.add(shards / "00000.tar", "x.jpg")
    done = cli("index", str(tmp_path / "gz.tar.gz"), "-o", str(tmp_path / "e"), "-q")
    assert done.returncode == 2 and "convert them to plain .tar first" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_key_an_earlier_shard_has_is_a_reject(tmp_path):
    shards = tmp_path / "shards"
    _write_tarfile(shards)
    shutil.copy(shards / "00001.tar", shards / "00004.tar")  # every key of shard 1, again in shard 4
    assert index_shards([str(shards)], tmp_path / "idx")["rejected"] == PER
    rejects = [json.loads(line) for line in (tmp_path / "idx" / spec.REJECTS_NAME).read_text().splitlines()]
    assert [r["path"] for r in rejects] == [f"00004.tar/{n:09d}" for n in range(PER, 2 * PER)]
    assert all("also in shard 00001.tar (duplicate key)" in r["reason"] for r in rejects)
    ds = open_dataset(tmp_path / "idx", decode=False)
    assert len(ds) == SHARDS * PER and not any(n.startswith("00004.tar/") for n in ds.index.names())
    ds.close()


# pack-dataset ARGS whose scans stop after the second shard until the process is signalled
_HELD = """
import sys, time
import packer.tools.index as ix
scan, seen = ix.scan_line, [0]
def held(job):
    seen[0] += 1
    while seen[0] > 2:
        time.sleep(0.05)
    return scan(job)
ix.scan_line = held
from packer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # a CLI process, a real SIGTERM
def test_sigterm_keeps_the_journal_and_resume_finishes(tmp_path, cli):
    shards, out = tmp_path / "shards", tmp_path / "idx"
    _write_tarfile(shards)
    proc = subprocess.Popen([sys.executable, "-c", _HELD, "index", str(shards), "-o", str(out), "-q", "-w", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    journal = out / JOURNAL
    wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) == 3, what="two shards journalled")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "stopped by SIGTERM" in err and "--resume" in err and "Traceback" not in err
    assert not (out / spec.INDEX_NAME).exists() and journal.exists()
    done = cli("index", str(shards), "-o", str(out), "-q", "--resume")
    assert done.returncode == 0 and f"{SHARDS * PER} samples in {SHARDS} shards" in done.stdout, done.stderr
    assert not journal.exists()
    assert _by_key(open_dataset(out, decode=False)) == {f"{n:09d}": _expected(n) for n in range(SHARDS * PER)}


@pytest.fixture(params=["s3", "gs", "az"])
def store_server(request):
    server = request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param])
    server.start()
    return server


@pytest.mark.slow  # worker processes / a pack and a convert / an emulator
def test_shards_in_a_bucket(store_server, tmp_path, cli, monkeypatch):
    """Shards in a bucket, indexed through the CLI (the store's usual environment), read streamed and
    through the node cache: the same samples as the same shards indexed locally."""
    from readers.remote import open_store

    local = tmp_path / "shards"
    _write_shardwriter(local)
    url = store_server.url(f"t-{uuid.uuid4().hex[:10]}")
    store = open_store(url, store_server.storage_options())
    for p in sorted(local.iterdir()):
        store.put(p.name, p)
    before = {n: store.stat(n).identity() for n in store.list()}
    for k, v in store_server.env().items():
        monkeypatch.setenv(k, v)
    done = cli("index", url, "-o", str(tmp_path / "idx"), "-q")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "idx" / spec.INDEX_NAME).read_text())[spec.INPLACE_KEY]["base"] == url
    index_shards([str(local)], tmp_path / "local")
    want = _by_key(open_dataset(tmp_path / "local", decode=False))
    so = store_server.storage_options()
    assert _by_key(open_dataset(tmp_path / "idx", decode=False, storage_options=so)) == want
    cached = open_dataset(tmp_path / "idx", decode=False, storage_options=so, cache_dir=tmp_path / "cache",
                          return_index=True)
    assert sorted(x["__index__"] for x in cached) == list(range(SHARDS * PER))
    assert any((tmp_path / "cache").rglob("*")), "the node cache holds the shards"
    done = cli("verify", str(tmp_path / "idx"), "-q")
    assert done.returncode == 0 and f"{SHARDS * PER} samples checked, OK" in done.stdout, done.stdout + done.stderr
    beside = open_store(url + "-index", so)  # the index uploaded to the bucket too: read and verified from there
    try:
        for p in sorted((tmp_path / "idx").iterdir()):
            beside.put(p.name, p)
    finally:
        beside.close()
    assert _by_key(open_dataset(url + "-index", decode=False, storage_options=so)) == want
    done = subprocess.run([sys.executable, "-m", "packer.cli", "verify", url + "-index", "-q"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **store_server.env()})
    assert done.returncode == 0 and f"{SHARDS * PER} samples checked, OK" in done.stdout, done.stdout + done.stderr
    cached.close()
    try:
        store.put("shard-000001.tar", local / "shard-000002.tar")  # replaced: same size, another ETag
        replaced = open_dataset(tmp_path / "idx", decode=False, storage_options=so)
        with pytest.raises(spec.DatasetFormatError, match="shard-000001.tar: shard changed since it was indexed"):
            list(replaced)
        replaced.close()
        assert {n: store.stat(n).identity() for n in store.list() if n != "shard-000001.tar"} == \
            {n: v for n, v in before.items() if n != "shard-000001.tar"}, "an object was written"
    finally:
        store.close()


@pytest.mark.slow  # starts a one-machine Ray
def test_ray_engine_writes_the_same_index(tmp_path):
    shards = tmp_path / "shards"
    _write_tarfile(shards)
    index_shards([str(shards)], tmp_path / "local")
    done = subprocess.run([sys.executable, "-m", "packer.cli", "index", str(shards), "-o", str(tmp_path / "ray"),
                           "--engine", "ray", "-w", "2", "-q"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name in ("offsets.npy", "sizes.npy", "checksums.npy", "shards.npy", "names.jsonl", *spec.MEMBER_ARRAYS):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    local, ray = (json.loads((tmp_path / d / spec.INDEX_NAME).read_text()) for d in ("local", "ray"))
    assert {k: v for k, v in ray.items() if k != "split"} == {k: v for k, v in local.items() if k != "split"}
