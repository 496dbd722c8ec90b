"""An interrupted ``s3://`` pack re-run with the same staging folder, on a real SeaweedFS: with neither
flag (refused in one line, nothing deleted), with ``--overwrite`` (a fresh pack), with ``--resume``
(finished), and a second pack into a staging folder in use (refused, naming the running pack's pid)."""

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
from packer.errors import OutputExistsError
from readers.contract.locks import LOCK_NAME
from readers.contract import spec
from readers.remote import open_store
from reliability_helpers import wait_for

pytest_plugins = ["servers"]
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "packer.cli"]


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    from conftest import make_image_folder

    # packing takes long enough (~10 s on 2 busy cores) to start a second pack and kill the first part-way
    return make_image_folder(tmp_path_factory.mktemp("src") / "train", classes=4, per_class=50, size=(320, 240),
                             seed=9)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, env={**os.environ, **env},
                          timeout=300)


def _objects(store) -> dict[str, bytes]:
    return {name: store.read(name) for name in store.list()}


def _holder_pid(stage: Path) -> int | None:
    try:
        text = (stage / LOCK_NAME).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _one_line_error(res: subprocess.CompletedProcess, code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


#: Run as ``python -c KILL_AFTER_FIRST_UPLOAD SRC URL STAGE GO``: the CLI's wds pack of the test below
#: (4 shards of 50, a checkpoint at every shard), which waits at its first image until the file GO
#: exists, and at image 100 (shards 0 and 1 written, 2 and 3 not) waits for the first uploaded shard in
#: ``uploads.jsonl`` and sends itself SIGKILL: killed mid-pack however fast the machine.
KILL_AFTER_FIRST_UPLOAD = """
import os, signal, sys, time
from pathlib import Path
from packer import PackOptions, RemoteOptions, pack
src, url, stage, go = sys.argv[1:5]
uploads = Path(stage) / "uploads.jsonl"
def progress(split, source):
    seen = {"n": 0}
    def update(done, nbytes):
        while not os.path.exists(go):
            time.sleep(0.01)
        seen["n"] += done
        if seen["n"] >= 100:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (uploads.exists() and uploads.read_bytes().strip()):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
    return update
pack(src, url, PackOptions(format="wds", workers=1, shard_count=4, checkpoint_bytes=256 * 1024),
     remote=RemoteOptions(stage_dir=Path(stage)), progress=progress)
"""


def test_interrupted_wds_pack_rerun_with_neither_flag_then_overwrite(s3_server, big_source, tmp_path):
    """kill -9 once a shard is uploaded; meanwhile a second pack into the same staging folder is
    refused (the lock). The same command again: refused in one line, nothing deleted; with
    --overwrite: the same objects as an uninterrupted pack."""
    s3_server.start()
    env, run = s3_server.env(), uuid.uuid4().hex[:8]
    killed, clean = s3_server.url(f"pk-{run}"), s3_server.url(f"pc-{run}")
    shape = ["-f", "wds", "-w", "1", "-q", "--shard-count", "4", "--checkpoint-bytes", "256k"]
    res = _cli([str(big_source), "-o", clean, *shape, "--stage-dir", str(tmp_path / "clean")], env)
    assert res.returncode == 0, res.stderr
    stage = tmp_path / "stage"
    cmd = [str(big_source), "-o", killed, *shape, "--stage-dir", str(stage)]
    store = open_store(killed, s3_server.storage_options())
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", KILL_AFTER_FIRST_UPLOAD, str(big_source), killed, str(stage),
                             str(go)], cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _holder_pid(stage) == proc.pid, 120, "the pack to lock its staging folder")
        second = _cli([*cmd, "--resume"], env)  # while the first one runs
        line = _one_line_error(second, 2)
        assert f"pid {proc.pid}" in line and str(stage) in line, line
        go.touch()  # the pack goes on, and kills itself once a shard is uploaded
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, "the pack finished before it could be killed"
    assert (stage / spec.STATE_NAME).exists(), "the pack had written every shard before it was killed"
    before = _objects(store)
    assert before and spec.INDEX_NAME not in before

    line = _one_line_error(_cli(cmd, env), 2)  # neither --resume nor --overwrite
    assert killed in line and "--overwrite" in line and "--resume" in line, line
    assert _objects(store) == before and (stage / spec.STATE_NAME).exists(), "a refused run changes nothing"

    res = _cli([*cmd, "--overwrite"], env)
    assert res.returncode == 0, res.stderr
    assert "resumed after" not in res.stdout
    ours, theirs = _objects(store), _objects(open_store(clean, s3_server.storage_options()))
    assert sorted(ours) == sorted(theirs) and [n for n in ours if ours[n] != theirs[n]] == []
    assert not stage.exists()


def test_interrupted_mmap_pack_rerun_with_neither_flag_then_resume(s3_server, big_source, tmp_path):
    """mmap uploads once packed: the prefix is still empty, the staging folder holds the journal. The
    Python API with the same ``stage_dir``: refused without a flag (naming the staging folder), finished
    with ``resume``, then ``resume`` on the finished pack compares its settings."""
    s3_server.start()
    so, env, run = s3_server.storage_options(), s3_server.env(), uuid.uuid4().hex[:8]
    killed, clean = s3_server.url(f"mk-{run}"), s3_server.url(f"mc-{run}")
    shape = ["-f", "mmap", "-w", "1", "-q", "--checkpoint-bytes", "256k"]
    res = _cli([str(big_source), "-o", clean, *shape, "--stage-dir", str(tmp_path / "clean")], env)
    assert res.returncode == 0, res.stderr
    stage = tmp_path / "stage"
    proc = subprocess.Popen([*CLI, str(big_source), "-o", killed, *shape, "--stage-dir", str(stage)], cwd=REPO,
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = stage / spec.STATE_NAME
    try:
        wait_for(lambda: state.exists() and json.loads(state.read_text())["done"] >= 20, 120, "checkpoints")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the pack finished before it could be killed"
    store = open_store(killed, so)
    assert store.list() == []
    journal = state.read_bytes()

    opts, remote = dict(format="mmap", workers=1, checkpoint_bytes=256 * 1024), RemoteOptions(storage_options=so,
                                                                                               stage_dir=stage)
    with pytest.raises(OutputExistsError) as err:
        pack(big_source, killed, PackOptions(**opts), remote=remote)
    msg = str(err.value)
    assert "\n" not in msg and str(stage) in msg and killed in msg and "--resume" in msg, msg
    assert state.read_bytes() == journal, "a refused run changes nothing"

    [res] = pack(big_source, killed, PackOptions(**opts, resume=True), remote=remote)
    assert res.resumed_from >= 20 and res.out == killed
    ours, theirs = _objects(store), _objects(open_store(clean, so))
    assert sorted(ours) == sorted(theirs) and [n for n in ours if ours[n] != theirs[n]] == []
    assert not stage.exists()

    [again] = pack(big_source, killed, PackOptions(**opts, resume=True), remote=remote)
    assert again.already_complete and again.images == res.images and again.out == killed
    with pytest.raises(OutputExistsError, match="--checkpoint-bytes"):
        pack(big_source, killed, PackOptions(**{**opts, "checkpoint_bytes": 512 * 1024}, resume=True), remote=remote)
    assert _objects(store) == ours and not stage.exists()
