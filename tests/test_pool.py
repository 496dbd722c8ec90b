"""packer.prepare.pool: the one process pool of every prepare stage (issue 21 item 2, issue 22 item 3, issue 23 item 2).

In-process: results in order, the window's count and byte bounds (counted, not timed), errors at their
turn, a SIGKILLed worker named, workers reaped however the consumer stops. Then the real ``pack-dataset``
of each stage (folder pack, convert, a WebDataset-shard import, an ``s3://`` source on the real
SeaweedFS) gets a real SIGINT or SIGTERM to its process group, or a real SIGKILL to one worker: it ends
within seconds with one line, no traceback, no worker left, and ``--resume`` finishes the pack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from conftest import make_image_folder
from packer import PackOptions, pack
from packer.prepare.images import ImageOptions
from packer.prepare.stage import ordered_outcomes
from packer.prepare.pool import CHUNK, WorkerDied, WorkerPool, ordered_map
from packer.sources.source import scan
from packer.prepare.workers import Outcome, prepare
from readers.contract import spec
from reliability_helpers import AS_TYPED, content, digest, env, error_lines, wait_for

pytestmark = pytest.mark.slow  # every test here starts worker processes

pytest_plugins = ["servers"]


_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before():
    """The processes this one had before the test (servers that other tests' session fixtures started):
    ``_children`` sees only what the test itself left."""
    _BEFORE.clear()
    _BEFORE.update(p.pid for p in psutil.Process().children(recursive=True))
    yield


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid not in _BEFORE and p.status() != psutil.STATUS_ZOMBIE]


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


class Counter:
    """How many times workers started an item: one byte appended per start (O_APPEND writes are atomic)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"")

    def tick(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)

    @property
    def value(self) -> int:
        return self.path.stat().st_size


# ---------------------------------------------------------------- in process
def _square(n: int) -> int:
    return n * n


def test_results_come_in_item_order_for_any_worker_count():
    items = list(range(300))
    expected = [n * n for n in items]
    for workers in (1, 2, 3):
        for chunk in (1, 7, CHUNK):
            assert list(ordered_map(_square, items, workers, chunk=chunk)) == expected, (workers, chunk)
    inline = list(ordered_map(_square, items, 2, inline=lambda n: -n if n % 5 == 0 else None))
    assert inline == [-n if n % 5 == 0 else n * n for n in items]
    assert not _children()


def test_the_window_bounds_the_items_taken_ahead_of_the_consumer():
    taken = 0

    def source() -> Iterator[int]:
        nonlocal taken
        for n in range(500):
            taken += 1
            yield n

    with WorkerPool(_square, 2, chunk=4, max_items=24) as pool:
        for consumed, value in enumerate(pool.map(source()), start=1):
            assert value == (consumed - 1) ** 2
            assert taken - consumed <= 24 - 1, (taken, consumed)  # taken, not yet consumed (this one is)
            assert pool.in_flight <= 24
        assert consumed == 500 and pool.peak_in_flight == 24
    assert not _children()


def test_the_window_bounds_bytes_whatever_the_count(tmp_path):
    """1 MB results, an 8 MB window: the workers stay about 8 results ahead of a consumer that is slow."""
    started = Counter(tmp_path / "started")

    def megabyte(n: int) -> bytes:
        started.tick()
        return bytes(1 << 20)

    with WorkerPool(megabyte, 2, chunk=1, max_items=1000, max_bytes=8 << 20, result_weight=len) as pool:
        for consumed, data in enumerate(pool.map(range(60)), start=1):
            assert len(data) == 1 << 20
            if consumed % 10 == 1:
                time.sleep(0.3)  # a slow consumer: unbounded, the workers would run through all 60 meanwhile
            # 8 in the window + one item over its bound + those the 2 workers hold (2 each)
            assert started.value - consumed <= 8 + 1 + 4, (started.value, consumed)
        assert pool.peak_in_flight_bytes <= (8 + 1) << 20 and pool.peak_in_flight <= 9 + 4
    assert not _children()


def _fails_at_7(n: int) -> int:
    if n == 7:
        raise ValueError("seven")
    return n


def test_an_error_in_a_worker_is_raised_at_its_turn():
    got = []
    with pytest.raises(ValueError, match="seven"):
        for value in ordered_map(_fails_at_7, range(100), 2, chunk=3):
            got.append(value)
    assert got == list(range(7))
    assert not _children()


def _killed_at_37(n: int) -> int:
    if n == 37:
        os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
    return n


@pytest.mark.parametrize("stage", ["map", "bytes stage"])
def test_a_sigkilled_worker_ends_the_map_naming_its_item(stage):
    """The detection is the pool's, so every stage built on it has it (the bytes stage of imports and convert
    here; the folder and s3:// stages below, through the real command)."""
    got: list[Any] = []
    with pytest.raises(WorkerDied) as info:
        if stage == "map":
            for value in ordered_map(_killed_at_37, range(200), 2, chunk=4, describe=lambda n: f"file-{n}.jpg"):
                got.append(value)
        else:
            def job(item: int, opts: ImageOptions) -> Outcome:
                return Outcome(None, problem=str(_killed_at_37(item)))

            for outcome in ordered_outcomes(iter(range(200)), job, ImageOptions(), 2,
                                            describe=lambda n: f"file-{n}.jpg"):
                got.append(int(outcome.problem))
    message = str(info.value)
    assert "file-37.jpg" in message and "SIGKILL" in message and "--resume" in message, message
    assert "\n" not in message
    assert got == list(range(len(got))) and len(got) <= 37
    assert not _children()


def test_closing_early_stops_the_workers_at_once():
    it = ordered_map(_square, range(10_000), 2)
    assert [next(it) for _ in range(3)] == [0, 1, 4]
    pids = [p.pid for p in _children()]
    assert len(pids) == 2
    it.close()
    assert not _alive(pids)


def test_the_folder_stage_waits_for_its_consumer(tmp_path, monkeypatch):
    """The folder pool (``Pool.imap`` before) prepared the whole source ahead of a writer that waits."""
    import packer.prepare.workers as workers

    src = make_image_folder(tmp_path / "src", classes=2, per_class=200, size=(16, 16), png_every=0)
    started = Counter(tmp_path / "started")
    real = workers.outcome_of

    def counted(data: bytes, opts: ImageOptions) -> Outcome:
        started.tick()
        return real(data, opts)

    monkeypatch.setattr(workers, "outcome_of", counted)  # the forked workers inherit it
    source = scan(src)
    outcomes = prepare(source, 0, ImageOptions(), 2)
    try:
        assert next(outcomes).prepared is not None
        time.sleep(1.5)  # a writer busy with a commit: unbounded, the workers run through the 400 files
        window = 4 * CHUNK * 2  # the default window for 2 workers: 4 chunks of 16 per worker
        assert 1 <= started.value <= window + 1, started.value
    finally:
        outcomes.close()
    assert not _children()


# ---------------------------------------------------------------- the real command, each stage
# A pack-dataset run whose workers take ``delay`` s per item (``module:function`` is slowed in the parent
# and inherited by the forked workers): slow enough to signal while items are out at the workers.
_SLOW_WORKERS = AS_TYPED + textwrap.dedent('''
    import functools, importlib, sys, time
    delay, target = float(sys.argv[1]), sys.argv[2]
    module, name = target.split(":")
    owner = importlib.import_module(module)
    real = getattr(owner, name)
    @functools.wraps(real)
    def slow(*args, **kwargs):
        time.sleep(delay)
        return real(*args, **kwargs)
    setattr(owner, name, slow)
    from packer.cli import main
    sys.exit(main(sys.argv[3:]))
''')


def _start(target: str, args: list[Any], extra_env: dict[str, str] | None = None,
           delay: float = 0.25) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _SLOW_WORKERS, str(delay), target, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env(), **(extra_env or {})}, start_new_session=True)


def _reap(proc: subprocess.Popen) -> None:
    """A test that failed part-way leaves no process and no pipe behind."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.stdout is not None and not proc.stdout.closed:
        proc.communicate()


def _workers_of(proc: subprocess.Popen, count: int = 2) -> list[int]:
    """The pids of ``proc``'s worker processes, once ``count`` of them are running and the pack is writing."""
    parent = psutil.Process(proc.pid)

    def ready() -> bool:
        assert proc.poll() is None, proc.communicate()
        return len(parent.children()) >= count

    wait_for(ready, timeout=60, what="the pack's worker processes")
    return [p.pid for p in parent.children()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("pool") / "train", classes=3, per_class=10, png_every=0)


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory) -> Path:
    """``folder`` packed as WebDataset shards: the convert stage's source, and the import stage's."""
    out = tmp_path_factory.mktemp("packed") / "wds"
    pack(folder, out, PackOptions(format="wds", workers=1, shard_count=8))
    return out


@pytest.fixture(scope="module")
def s3_folder(folder, s3_server) -> str:
    from readers.remote import open_store

    s3_server.start()
    url = s3_server.url(f"src-{uuid.uuid4().hex[:8]}/train")
    store = open_store(url, s3_server.storage_options())
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            store.put(path.relative_to(folder).as_posix(), path)
    return url


STAGES = ["folder", "convert", "wds-import", "s3-source"]


@pytest.fixture
def stage(request, tmp_path) -> dict[str, Any]:
    """How to run one stage with a pool of 2 workers: the command, the function its workers run, what
    the dead-worker message names, and the environment."""
    name, out = request.param, tmp_path / "out"
    if name == "folder":
        src = request.getfixturevalue("folder")
        return {"args": [src, "-f", "wds", "-o", out, "--shard-count", "4"], "slow": "packer.prepare.workers:_prepare_one",
                "names": str(src), "out": out}
    if name == "convert":
        src = request.getfixturevalue("packed")
        return {"args": ["convert", src, "-f", "mmap", "--resize", "24", "-o", out], "slow": "packer.tools.convert:_job",
                "names": str(src), "out": out}
    if name == "wds-import":
        src = request.getfixturevalue("packed")
        return {"args": [src, "-f", "lmdb", "-o", out], "slow": "packer.prepare.stage:prepare_bytes",
                "names": str(src), "out": out}
    server = request.getfixturevalue("s3_server")
    url = request.getfixturevalue("s3_folder")
    server.start()
    return {"args": [url, "-f", "wds", "-o", out, "--shard-count", "4"], "slow": "packer.engines.tasks:prepare_file",
            "names": url, "out": out, "env": {**server.env(), "AWS_EC2_METADATA_DISABLED": "true"}}


def _run(stage: dict[str, Any], *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer.cli", *map(str, stage["args"]), "-q", "--workers", "2",
                           *more], capture_output=True, text=True, timeout=300, env={**env(), **stage.get("env", {})})


@pytest.mark.parametrize("stage", STAGES, indirect=True)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_stops_every_stage_alike(stage, sig):
    proc = _start(stage["slow"], [*stage["args"], "-q", "--workers", "2"], stage.get("env"))
    try:
        pids = _workers_of(proc)
        wait_for(lambda: (stage["out"] / spec.STATE_NAME).exists(), what="the journal")
        os.killpg(proc.pid, sig)  # Ctrl-C in a terminal, or `kill -TERM -PGID`
        _, err = proc.communicate(timeout=10)  # within seconds (convert and imports waited 60 s)
    finally:
        _reap(proc)
    assert "Traceback" not in err, err  # the s3:// pool's workers printed two
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    lines = error_lines(err)
    word = "interrupted" if sig == signal.SIGINT else "stopped by SIGTERM"
    assert len(lines) == 1 and word in lines[0] and "--resume" in lines[0], err
    wait_for(lambda: not _alive(pids), timeout=5, what="the workers to be gone")
    done = _run(stage, "--resume")
    assert done.returncode == 0, done.stderr
    assert spec.read_index(stage["out"]).num_samples == 30


@pytest.mark.parametrize("stage", STAGES, indirect=True)
def test_a_sigkilled_worker_stops_the_pack_naming_the_file_and_resume_finishes_it(stage, tmp_path):
    reference = _run({**stage, "args": [str(a).replace(str(stage["out"]), str(tmp_path / "ref"))
                                        for a in stage["args"]]})
    assert reference.returncode == 0, reference.stderr
    proc = _start(stage["slow"], [*stage["args"], "-q", "--workers", "2"], stage.get("env"))
    try:
        victim = _workers_of(proc)[0]
        wait_for(lambda: (stage["out"] / spec.STATE_NAME).exists(), what="the journal")
        os.kill(victim, signal.SIGKILL)  # one worker, as the out-of-memory killer does
        _, err = proc.communicate(timeout=30)
    finally:
        _reap(proc)
    assert "Traceback" not in err, err
    assert proc.returncode == 1, (proc.returncode, err)
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert f"worker process {victim}" in lines[0] and "SIGKILL" in lines[0] and "--resume" in lines[0], lines[0]
    assert stage["names"] in lines[0], lines[0]  # the file (or sample) it was preparing
    done = _run(stage, "--resume")
    assert done.returncode == 0, done.stderr
    if "mmap" in stage["args"] or "wds" in stage["args"]:
        assert digest(stage["out"]).keys() == digest(tmp_path / "ref").keys()
    assert content(stage["out"]) == content(tmp_path / "ref")
