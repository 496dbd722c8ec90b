"""The Ray engine's parts that need no cluster: chunking, detached bytes, shard layout, options, imports.

The engine on a real cluster is tested in test_ray_engine.py (slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_image_folder
from packer import PackOptions
from packer.engines import tasks
from packer.engines.io import LocalFiles, LocalOutput
from packer.engines.ray_wds import DeferredBytes, RayWdsWriter
from packer.formats.wds import WdsWriter
from packer.prepare.images import ImageOptions, Prepared
from packer.output import SHARD_LOG_NAME
from readers.contract import spec

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- chunks
@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=60), images=st.integers(1, 9), max_bytes=st.integers(1, 120),
       start_frac=st.floats(0, 1))
def test_chunks_cover_the_list_in_order_and_do_not_depend_on_where_a_resume_starts(sizes, images, max_bytes,
                                                                                    start_frac):
    whole = tasks.plan_chunks(sizes, 0, images, max_bytes)
    assert [a for a, _ in whole] == [0, *(b for _, b in whole[:-1])][:len(whole)]  # contiguous, in order
    assert (whole[-1][1] if whole else 0) == len(sizes)
    for a, b in whole:
        assert 0 < b - a <= images
        assert sum(sizes[a:b - 1]) < max_bytes  # only the last file may take it past the cap
    start = int(start_frac * len(sizes))
    resumed = tasks.plan_chunks(sizes, start, images, max_bytes)
    assert resumed == [(max(a, start), b) for a, b in whole if b > start]  # the same cut, clipped


# ---------------------------------------------------------------- prepare with detached bytes
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, list[str]]:
    root = make_image_folder(tmp_path_factory.mktemp("parts") / "train", classes=2, per_class=6, png_every=3)
    (root / "class_01" / "img_002.JPEG").write_bytes(b"\xff\xd8\xff junk")
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("img_*"))
    return root, rels


@pytest.mark.parametrize("opts", [ImageOptions(), ImageOptions(max_side=20)])
def test_detached_bytes_are_the_stored_bytes(folder, opts):
    root, rels = folder
    files = LocalFiles(root)
    whole = tasks.prepare_files(files, rels, opts, detach=False)
    split = tasks.prepare_files(files, rels, opts, detach=True)
    assert whole.nbytes == split.nbytes > 0
    assert any(o.prepared is None for o in whole.outcomes)  # the junk file is rejected...
    for a, b, (start, size) in zip(whole.outcomes, split.outcomes, split.spans, strict=True):
        assert (a.crc, a.problem, a.unreadable) == (b.crc, b.problem, b.unreadable)
        if a.prepared is None:
            assert b.prepared is None and size == 0
            continue
        assert b.prepared.data == b"" and (b.prepared.ext, b.prepared.changed) == (a.prepared.ext, a.prepared.changed)
        assert split.payload[start:start + size].tobytes() == a.prepared.data


def test_unreadable_file_names_it(folder, tmp_path):
    root, rels = folder
    outcome = tasks.prepare_file(LocalFiles(root), "class_00/missing.JPEG", ImageOptions())
    assert outcome.unreadable and outcome.prepared is None
    assert outcome.problem.startswith(f"{root / 'class_00/missing.JPEG'}: read error: ")


# ---------------------------------------------------------------- wds layout
class InProcess:
    """Runs the Ray wds writer's tasks right here, in order (what Ray runs elsewhere)."""

    def __init__(self, payloads: dict[str, np.ndarray]) -> None:
        self.payloads = payloads

    def write_shard(self, output, name, parts, refs):
        return tasks.write_tar(output, name, parts, [self.payloads[r] for r in refs])

    def shard_written(self, task):
        return task

    def file_crcs(self, output, names):
        return [tasks.file_crc(output, n) for n in names]

    def cancel(self, refs):
        pass


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 1500), min_size=1, max_size=30), chunk=st.integers(1, 7),
       shard_size=st.integers(600, 9000), shard_count=st.one_of(st.none(), st.integers(1, 6)),
       labels=st.lists(st.integers(0, 1000), min_size=30, max_size=30))
def test_ray_wds_layout_is_the_local_writers(tmp_path_factory, sizes, chunk, shard_size, shard_count, labels):
    """Shards laid out from sizes alone and written by tasks == WdsWriter's shards, byte for byte."""
    rng = np.random.default_rng(len(sizes))
    blobs = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in sizes]
    payloads, deferred = {}, []
    for c in range(0, len(blobs), chunk):  # one payload per chunk of samples, as prepare tasks make them
        ref, pos = f"chunk{c}", 0
        payloads[ref] = np.frombuffer(b"".join(blobs[c:c + chunk]), dtype=np.uint8)
        for blob in blobs[c:c + chunk]:
            deferred.append(DeferredBytes(len(blob), ref, pos))
            pos += len(blob)
    opts = PackOptions(format="wds", shard_size=shard_size, shard_count=shard_count, checkpoint_bytes=1)
    local_root, ray_root = (tmp_path_factory.mktemp(n) for n in ("local", "ray"))
    local = WdsWriter(local_root, "s", opts, 0)
    remote = RayWdsWriter(ray_root, "s", opts, 0, session=InProcess(payloads))
    locations = {}
    for writer, datas in ((local, blobs), (remote, deferred)):
        writer.open(0, None)
        locations[writer] = []
        for i, data in enumerate(datas):
            prep = Prepared(data=data, ext="jpg", height=1, width=1, changed=False)
            locations[writer].append(writer.append(i, prep, labels[i]))
            if writer.at_checkpoint_boundary():
                writer.checkpoint()
        writer.end_samples()
        writer.checkpoint()
    assert locations[local] == locations[remote]  # offsets and shard numbers
    assert local.finalize({}, {}) == remote.finalize({}, {})  # shard records: names, counts, bytes, CRCs
    files = sorted(p.name for p in local_root.iterdir())
    assert sorted(p.name for p in ray_root.iterdir()) == files  # shards, wids index and both writers' shard logs
    for name in files:
        assert (ray_root / name).read_bytes() == (local_root / name).read_bytes()


def _checkpoint_sizes(root: Path, shards: int) -> list[int]:
    """The journal bytes of each checkpoint of a Ray wds pack of ``shards`` one-sample shards."""
    root.mkdir()
    payload = np.frombuffer(b"x" * 100, dtype=np.uint8)
    writer = RayWdsWriter(root, "s", PackOptions(format="wds", shard_count=1, checkpoint_bytes=1), 0,
                          session=InProcess({"p": payload}))
    writer.open(shards, None)
    sizes = []
    for i in range(shards):
        writer.append(i, Prepared(data=DeferredBytes(100, "p", 0), ext="jpg", height=1, width=1, changed=False), 0)
        if writer.at_checkpoint_boundary():
            sizes.append(len(json.dumps(writer.checkpoint())))
    assert len(writer.finalize({}, {})["shards"]) == shards
    return sizes


def test_a_ray_wds_checkpoint_writes_as_many_journal_bytes_at_40_shards_as_at_10(tmp_path):
    """The Ray writer journals the shard log's length, as WdsWriter does, not the list of every shard
    (~110 bytes more at each shard closed: quadratic over a pack)."""
    sizes = {n: _checkpoint_sizes(tmp_path / str(n), n) for n in (10, 40)}
    assert len(sizes[10]) == 10 and len(sizes[40]) == 40  # a checkpoint at every closed shard
    assert max(sizes[40]) - max(sizes[10]) < 8, (max(sizes[10]), max(sizes[40]))
    assert sum(sizes[40]) < 4.5 * sum(sizes[10]), (sum(sizes[10]), sum(sizes[40]))
    log = (tmp_path / "40" / SHARD_LOG_NAME).read_text().splitlines()
    assert [json.loads(line)["name"] for line in log] == [spec.shard_name("s", k) for k in range(40)]


def test_a_ray_wds_pack_resumes_from_its_shard_log(tmp_path):
    """Resume reads the shards back from the log the checkpoint vouches for; a record after it is dropped."""
    payloads = {"p": np.frombuffer(b"x" * 100, dtype=np.uint8)}
    opts = PackOptions(format="wds", shard_count=1, checkpoint_bytes=1)
    writer = RayWdsWriter(tmp_path, "s", opts, 0, session=InProcess(payloads))
    writer.open(3, None)
    for i in range(3):
        writer.append(i, Prepared(data=DeferredBytes(100, "p", 0), ext="jpg", height=1, width=1, changed=False), 0)
        if i == 1:
            state = writer.checkpoint()
    writer.checkpoint()  # the third shard: in the log, not vouched for by ``state``
    writer.abort()
    assert state == {"shards_closed": 2, "log_bytes": len(b"".join(
        (tmp_path / SHARD_LOG_NAME).read_bytes().splitlines(keepends=True)[:2]))}
    resumed = RayWdsWriter(tmp_path, "s", opts, 0, session=InProcess(payloads))
    resumed.open(3, state)
    assert [s["name"] for s in resumed.shards] == ["s-000000.tar", "s-000001.tar"]
    assert not (tmp_path / "s-000002.tar").exists()  # written after the checkpoint: rewritten
    resumed.abort()


def test_resume_rejects_a_damaged_shard(tmp_path):
    """A shard listed in the journal is checked (size and CRC) before the resumed pack trusts it."""
    from packer import PackError

    output = LocalOutput(tmp_path)
    payload = np.frombuffer(b"x" * 100, dtype=np.uint8)
    record = tasks.write_tar(output, "s-000000.tar", [tasks.ShardPart(0, 0, 100, 0, "jpg", 3)], [payload])
    (tmp_path / "s-000001.tar.abc.tmp").write_bytes(b"left by a killed task")
    session = InProcess({})
    writer = RayWdsWriter(tmp_path, "s", PackOptions(format="wds"), 0, session=session)
    writer.open(1, {"shards": [record]})  # intact: kept; the stray temp file is removed
    writer.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s-000000.tar", SHARD_LOG_NAME]
    with open(tmp_path / "s-000000.tar", "r+b") as f:
        f.seek(600)
        f.write(b"y")
    damaged = RayWdsWriter(tmp_path, "s", PackOptions(format="wds"), 0, session=session)
    with pytest.raises(PackError, match=r"s-000000\.tar, written before the interruption, no longer matches"):
        damaged.open(1, {"shards_closed": 1, "log_bytes": (tmp_path / SHARD_LOG_NAME).stat().st_size})
    damaged.abort()  # as the pipeline does after a failed open: the log is closed


# ---------------------------------------------------------------- options and imports
def test_engine_options():
    assert PackOptions().engine == "local"
    with pytest.raises(ValueError, match="unknown engine"):
        PackOptions(engine="spark")
    with pytest.raises(ValueError, match="ray engine only"):
        PackOptions(ray_address="auto")
    with pytest.raises(ValueError, match="ray_chunk"):
        PackOptions(engine="ray", ray_chunk=0)
    # where the work runs never changes the output: not recorded in the index, not compared on resume
    assert PackOptions(engine="ray", ray_address="auto", ray_chunk=5).recorded() == PackOptions().recorded()


def test_overwrite_clears_temp_files_of_killed_shard_tasks(tmp_path):
    """A driver killed while shard tasks ran leaves <shard>.<hex>.tmp files: --overwrite knows them as ours."""
    from packer import pack
    from packer.output import prepare_output

    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=3)
    out = tmp_path / "out"
    pack(src, out, PackOptions(format="wds", workers=1, shard_count=2))
    leftover = LocalOutput(out).temp_path("train-000007.tar")
    leftover.write_bytes(b"part of a shard")
    prepare_output(out, PackOptions(format="wds", overwrite=True))
    assert list(out.iterdir()) == []
    (out / "train-000001.tar.notours").write_bytes(b"x")  # a name the Ray engine never writes
    (out / spec.INDEX_NAME).write_text("{}")
    with pytest.raises(ValueError, match="train-000001.tar.notours, which pack-dataset did not write"):
        prepare_output(out, PackOptions(format="wds", overwrite=True))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.slow
def test_the_local_engine_never_imports_ray(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=2, per_class=3)
    out = _run(f"import sys\nfrom packer import pack, PackOptions\nimport packer.cli, packer.engines\n"
               f"pack({str(src)!r}, {str(tmp_path / 'out')!r}, PackOptions(format='wds', workers=2))\n"
               f"print('ray' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_without_ray_installed_the_ray_engine_is_a_usage_error(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=2, per_class=3)
    out = _run(f"import sys\nsys.modules['ray'] = None  # as if not installed\nfrom packer.cli import main\n"
               f"sys.exit(main([{str(src)!r}, '-f', 'wds', '-o', {str(tmp_path / 'out')!r}, '--engine', 'ray']))")
    assert out.returncode == 2
    assert out.stderr.strip() == ("pack-dataset: error: --engine ray needs Ray: "
                                  "pip install 'dataset-packer[ray]'")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_ray_quick(tmp_path):
    """benchmarks/bench_ray.py --quick runs end to end (a smoke test; the figures are not checked)."""
    pytest.importorskip("ray")
    out = tmp_path / "ray.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_ray.py"), "--quick", "--json", str(out),
                        "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Ray engine 1 -> 2 CPUs:" in r.stdout and "empty task round trip" in r.stdout
    import json

    data = json.loads(out.read_text())
    assert set(data["summary"]["ratios"]) == {"ray_vs_local_2cpu", "ray_vs_local_1cpu", "ray_1_to_2", "local_1_to_2"}
    assert all(v > 0 for v in data["summary"]["ratios"].values())
    assert [p.name for p in tmp_path.iterdir()] == ["ray.json"]  # the temp source and outputs are removed


@pytest.mark.slow
def test_an_unreachable_cluster_is_a_quick_usage_error(tmp_path):
    """Nothing listens at the address: exit 2 at once, one line, nothing written (ray.init alone would
    retry for many minutes)."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed
    src = make_image_folder(tmp_path / "src", classes=2, per_class=3)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "packer.cli", str(src), "-f", "wds", "-o", str(tmp_path / "out"),
                        "--engine", "ray", "--ray-address", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and time.monotonic() - t0 < 60
    assert r.stderr.strip().startswith(f"pack-dataset: error: cannot reach the Ray cluster at 127.0.0.1:{port} (")
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
