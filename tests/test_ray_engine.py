"""The Ray engine on a real Ray cluster: two nodes (two raylets) on this machine.

Every test compares against the local engine: the Ray engine must write the
same dataset (byte for byte, except LMDB's lock file) whatever the cluster
size, through worker and driver crashes. Drivers run in their own process
(``pack-dataset``, or a script calling ``pack``), as users run them: a Ray
driver keeps sockets and a log file open after ``ray.shutdown()``, which
this test process would report as leaked.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import make_image_folder
from readers import open_dataset
from readers.contract import spec
from reliability_helpers import verify_here

pytest.importorskip("ray")
from raycluster import RayCluster  # noqa: E402

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "packer.cli"]
BAD = "class_02/img_003.JPEG"  # a corrupt JPEG, in a middle chunk (12 chunks at --ray-chunk 7)

# format and options: wds with small shards (several per chunk and some across chunks) and with
# every image re-encoded smaller (the layout then follows the stored sizes, not the source's)
CASES = {
    "wds": ["-f", "wds", "--shard-count", "5"],
    "wds-resized": ["-f", "wds", "--shard-size", "20k", "--max-side", "40"],
    "lmdb": ["-f", "lmdb", "--checkpoint-bytes", "60k"],
    "hdf5": ["-f", "hdf5", "--checkpoint-bytes", "60k"],
    "mmap": ["-f", "mmap", "--resize", "24", "--checkpoint-bytes", "60k"],
}


@pytest.fixture(scope="module")
def cluster():
    c = RayCluster().start(cpus=1)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = make_image_folder(tmp_path_factory.mktemp("ray-src") / "train", classes=4, per_class=20, png_every=3)
    (root / BAD).write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    rgba = np.random.default_rng(1).integers(0, 256, size=(50, 70, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(root / "class_01" / "img_100.png")  # stored re-encoded (alpha)
    return root


def _files(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.name != "lock.mdb"}


def _pack(src: Path, out: Path, *args: str, cluster: RayCluster | None = None) -> subprocess.CompletedProcess:
    """``pack-dataset`` with the local engine, or the Ray engine on ``cluster``; exit 3: rejects."""
    ray = ["--engine", "ray", "--ray-address", cluster.address] if cluster else []
    done = subprocess.run([*CLI, str(src), "-o", str(out), "--quiet", "--workers", "2", *args, *ray],
                          env=cluster.env if cluster else None, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stderr
    return done


@pytest.fixture(scope="module")
def local(src, tmp_path_factory):
    """case -> the local engine's output for that case."""
    root = tmp_path_factory.mktemp("ray-local")
    for case, args in CASES.items():
        _pack(src, root / case, *args)
    return {case: root / case for case in CASES}


# ---------------------------------------------------------------- same output as the local engine
def test_one_node_then_two_nodes_byte_identical(src, local, cluster, tmp_path):
    """The output depends on the source and options only: 1 node, 2 nodes, local engine: same bytes."""
    for nodes in (1, 2):
        cluster.scale(nodes)
        for case in ("wds", "lmdb"):
            out = tmp_path / f"{case}-{nodes}"
            summary = _pack(src, out, *CASES[case], "--ray-chunk", "7", cluster=cluster).stdout
            expect = "[ray: 1 node, 1 CPUs]" if nodes == 1 else "[ray: 2 nodes, 2 CPUs]"
            assert expect in summary, f"tasks did not run in {nodes} raylet(s): {summary}"
            assert _files(out) == _files(local[case])


@pytest.mark.parametrize("case", list(CASES))
def test_each_format_equals_the_local_engine(src, local, cluster, tmp_path, case):
    cluster.scale(2)
    out = tmp_path / case
    done = _pack(src, out, *CASES[case], "--ray-chunk", "7", cluster=cluster)
    assert done.returncode == 3  # images were rejected, as locally
    assert "80 samples" in done.stdout and "1 rejected" in done.stdout
    assert _files(out) == _files(local[case])  # data, index arrays, index.json, names, rejects
    rejects = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert [r["path"] for r in rejects] == [BAD]  # the bad image of a middle chunk, as locally
    assert len(open_dataset(out)) == 80


UNREADABLE = """
    import os, sys
    from packer import PackError, PackOptions, pack
    src, out, address, victim = sys.argv[1:]
    saved = open(victim, "rb").read()

    def progress(split, source):
        os.unlink(victim)  # after the scan, before any task reads it
        return None

    opts = dict(format="wds", engine="ray", ray_address=address, ray_chunk=4, shard_count=6, checkpoint_bytes=1)
    try:
        pack(src, out, PackOptions(**opts), progress=progress)
    except PackError as exc:
        print(exc)
    open(victim, "wb").write(saved)
    [done] = pack(src, out, PackOptions(**opts, resume=True))
    print(done.images, done.resumed_from)
"""


def test_unreadable_source_file_is_named_and_resumable(tmp_path, cluster):
    """A file that cannot be read fails its chunk for good: one line naming it, then --resume."""
    cluster.scale(2)
    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=20, png_every=0)
    victim = src / "class_01" / "img_005.JPEG"
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(UNREADABLE), str(src), str(out), cluster.address,
                           str(victim)], env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    error, counts = done.stdout.strip().splitlines()
    assert error == (f"{victim}: read error: No such file or directory; restore it and re-run with --resume, or "
                     "start again with --overwrite (a shuffled order changes when a file is missing)")
    images, resumed_from = map(int, counts.split())
    assert images == 40 and resumed_from > 0
    _pack(src, tmp_path / "ref", "-f", "wds", "--shard-count", "6", "--checkpoint-bytes", "1")
    assert _files(out) == _files(tmp_path / "ref")


# ---------------------------------------------------------------- the output folder's rules
def test_same_lock_and_existing_output_rules_as_the_local_engine(src, cluster, tmp_path):
    """The Ray driver holds the output lock for its run and keeps the local engine's resume and
    overwrite rules (one line, exit 2, nothing deleted)."""
    from packer.output import OutputLock

    out = tmp_path / "out"
    args = CASES["wds"]

    def run(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run(_cli(src, out, cluster, *args, *more), env=cluster.env, capture_output=True,
                              text=True, timeout=300)

    with OutputLock() as lock:  # another pack holds the folder
        lock.acquire(out)
        busy = run()
    assert busy.returncode == 2, busy.stderr
    assert busy.stderr.strip() == (f"pack-dataset: error: {out}: another pack-dataset (pid {os.getpid()}) is "
                                   "writing this folder; wait for it to end (or stop it), then run again")
    assert list(out.iterdir()) == []
    assert run().returncode == 3  # packed (one reject)
    packed = _files(out)
    finished = run("--resume")
    assert finished.returncode == 3 and "already complete, nothing to resume" in finished.stdout
    assert run().returncode == 2  # exists: neither --resume nor --overwrite
    (out / "notes.txt").write_text("mine")
    refused = run("--overwrite")
    assert refused.returncode == 2 and f"{out / 'notes.txt'}, which pack-dataset did not write" in refused.stderr
    assert _files(out) == {**packed, "notes.txt": _files(out)["notes.txt"]}  # nothing was deleted


# ---------------------------------------------------------------- crashes
def _cli(src: Path, out: Path, cluster: RayCluster, *more: str) -> list[str]:
    return [*CLI, str(src), "-o", str(out), "--quiet", "--engine", "ray", "--ray-address", cluster.address, *more]


@pytest.fixture(scope="module")
def big_src(tmp_path_factory) -> Path:
    """Enough work that a pack takes a few seconds on 2 CPUs."""
    return make_image_folder(tmp_path_factory.mktemp("ray-big") / "train", classes=4, per_class=150,
                             size=(200, 160), png_every=0)


CRASH_ARGS = {
    "wds": ["--format", "wds", "--shard-count", "40", "--checkpoint-bytes", "1"],
    "lmdb": ["--format", "lmdb", "--checkpoint-bytes", "300k"],
}


def _reference(src: Path, out: Path, fmt: str) -> Path:
    if not out.exists():
        assert subprocess.run([*CLI, str(src), "-o", str(out), "--quiet", *CRASH_ARGS[fmt]]).returncode == 0
    return out


def _task_workers(cluster: RayCluster, task: str) -> list:
    found = []
    for p in cluster.processes():
        try:
            if p.cmdline()[:1] == [f"ray::{task}"]:
                found.append(p)
        except Exception:  # noqa: BLE001 -- exited meanwhile
            pass
    return found


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_worker_killed_mid_task_is_retried_and_output_unchanged(big_src, cluster, tmp_path_factory, tmp_path, fmt):
    cluster.scale(2)
    reference = _reference(big_src, tmp_path_factory.getbasetemp() / f"ray-ref-{fmt}", fmt)
    out = tmp_path / "out"
    proc = subprocess.Popen(_cli(big_src, out, cluster, *CRASH_ARGS[fmt], "--ray-chunk", "60"), env=cluster.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and not killed and time.monotonic() < deadline:
        for p in _task_workers(cluster, "prepare_chunk")[:1]:
            p.kill()  # SIGKILL a worker process while it runs a task
            killed.append(p.pid)
        time.sleep(0.005)
    stdout, stderr = proc.communicate(timeout=180)
    assert killed, "no worker was caught running a task"
    assert proc.returncode == 0, stderr
    assert _files(out) == _files(reference) if fmt == "wds" else _same_content(out, reference)


def _same_content(a: Path, b: Path) -> bool:
    """LMDB's page layout depends on its transaction history (see test_resume): data.mdb's bytes, and so
    its size and CRC in index.json, may differ; everything else is equal."""
    fa, fb = _files(a), _files(b)
    other = ("data.mdb", spec.INDEX_NAME)
    assert {k: v for k, v in fa.items() if k not in other} == {k: v for k, v in fb.items() if k not in other}
    ia, ib = (json.loads((root / spec.INDEX_NAME).read_text()) for root in (a, b))
    for index in (ia, ib):
        for key in ("files", spec.FILES_CRC_KEY):
            index.get(key, {}).pop("data.mdb", None)
    assert ia == ib
    da, db = open_dataset(a, decode=False), open_dataset(b, decode=False)
    try:
        assert all(bytes(da.read(i)) == bytes(db.read(i)) for i in range(len(da)))
    finally:
        da.close()
        db.close()
    return True


def _kill_driver_when(proc: subprocess.Popen, journal: Path, done_at_least: int) -> bool:
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if json.loads(journal.read_text())["done"] >= done_at_least:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.005)
    if proc.poll() is not None:
        proc.communicate()
        return False
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return True


@pytest.mark.parametrize("fmt, resume_with", [("wds", "ray"), ("lmdb", "ray"), ("wds", "local")])
def test_driver_sigkill_then_resume_finishes_identical(big_src, cluster, tmp_path_factory, tmp_path, fmt,
                                                       resume_with):
    """kill -9 the driver mid-pack; the same command with --resume (either engine) finishes it."""
    cluster.scale(2)
    reference = _reference(big_src, tmp_path_factory.getbasetemp() / f"ray-ref-{fmt}", fmt)
    out = tmp_path / "out"
    cmd = _cli(big_src, out, cluster, *CRASH_ARGS[fmt], "--ray-chunk", "30")
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert _kill_driver_when(proc, out / spec.STATE_NAME, 150), "the pack finished before it could be killed"
    with pytest.raises(spec.IncompleteDatasetError):
        open_dataset(out)
    if resume_with == "local":  # the journal is the local engine's: it can take over
        cmd = [arg for arg in cmd if arg not in ("--engine", "ray", "--ray-address", cluster.address)]
    done = subprocess.run([*cmd, "--resume"], env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    resumed = int(done.stdout.split("resumed after ")[1].split()[0])
    assert resumed >= 150  # the chunks written before the kill were skipped
    assert _files(out) == _files(reference) if fmt == "wds" else _same_content(out, reference)
    checked = verify_here(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr


JOURNAL_BYTES = """
    import json, sys
    from pathlib import Path
    from packer import PackOptions, pack
    from readers.contract import spec
    address, *pairs = sys.argv[1:]
    write, sizes = spec.write_json_atomic, []

    def counted(path, obj):  # the size of pack-state.json after each time the pack writes it
        write(path, obj)
        if Path(path).name == spec.STATE_NAME:
            sizes.append(Path(path).stat().st_size)

    spec.write_json_atomic = counted
    found = {}
    for src, out in zip(pairs[::2], pairs[1::2]):
        sizes.clear()
        [done] = pack(src, out, PackOptions(format="wds", engine="ray", ray_address=address, shard_count=1,
                                            checkpoint_bytes=1))
        found[len(json.loads((Path(out) / spec.INDEX_NAME).read_text())["shards"])] = list(sizes)
    print(json.dumps(found))
"""


def test_a_ray_wds_checkpoint_writes_as_many_journal_bytes_at_40_shards_as_at_10(cluster, tmp_path):
    """The journal records the shard log's length, as the local engine's does, not every shard so far."""
    cluster.scale(1)
    args = []
    for shards in (10, 40):
        src = make_image_folder(tmp_path / f"src{shards}" / "train", classes=2, per_class=shards // 2,
                                size=(24, 24), png_every=0)
        args += [str(src), str(tmp_path / f"out{shards}")]
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(JOURNAL_BYTES), cluster.address, *args],
                          env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    written = {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    assert len(written[10]) >= 10 and len(written[40]) >= 40  # a checkpoint at every closed shard
    assert max(written[40]) - max(written[10]) < 64, (max(written[10]), max(written[40]))
    assert sum(written[40]) < 4.5 * sum(written[10]), (sum(written[10]), sum(written[40]))


# ---------------------------------------------------------------- pack_map(engine="ray")
PACK_MAP = """
    import io, json, os, sys
    import numpy as np
    from PIL import Image
    from packer import PackOptions, pack_map

    def render(i):  # defined in __main__: Ray pickles it by value
        if engine == "ray":  # which node ran it
            import ray
            open(os.path.join(nodes, ray.get_runtime_context().get_node_id()), "w").close()
        if i == 13:
            raise ValueError("corrupt record")
        if i % 10 == 7:
            return None
        rng = np.random.default_rng(i)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (20 + i % 5, 24, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        return [{"image": buf.getvalue(), "label": i % 3, "caption": f"record {i}", "score": i / 7}] * (1 + i % 2)

    address, root, engine = sys.argv[1:]
    nodes = root + "-nodes"
    os.makedirs(nodes)
    found = {}
    for fmt in ("wds", "hdf5"):
        opts = PackOptions(shard_count=9, checkpoint_bytes=4096, ray_chunk=7,
                           **({"engine": "ray", "ray_address": address} if engine == "ray" else {}))
        r = pack_map(render, range(60), f"{root}/{fmt}", format=fmt, workers=0 if engine == "ray" else 2,
                     engine=engine, options=opts)
        found[fmt] = [r.inputs, r.samples, list(r.rejects)]
    print(json.dumps(found))
"""


def test_pack_map_on_ray_equals_the_local_engine(cluster, tmp_path):
    """``pack_map(engine="ray")``: fn runs as Ray tasks on both nodes; what the one Writer writes is the
    local engine's (2 forked workers), byte for byte, inputs in order, rejects and skips included."""
    cluster.scale(2)
    got = {}
    for engine in ("ray", "local"):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(PACK_MAP), cluster.address,
                               str(tmp_path / engine), engine], env=cluster.env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        got[engine] = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ray"] == got["local"]
    # 6 (odd) inputs give None, input 13 fails; 30 even inputs give one sample, the 23 other odd ones two
    assert got["ray"]["wds"][:2] == [60, 76]
    assert got["ray"]["wds"][2] == ["input 13 (13): ValueError: corrupt record"]
    for fmt in ("wds", "hdf5"):
        assert _files(tmp_path / "ray" / fmt) == _files(tmp_path / "local" / fmt), fmt
    assert len(os.listdir(tmp_path / "ray-nodes")) == 2  # fn ran on both nodes of the cluster
    ds = open_dataset(tmp_path / "ray" / "hdf5", fields=("caption",))
    assert [ds[i][0] for i in range(4)] == ["record 0", "record 1", "record 1", "record 2"]
