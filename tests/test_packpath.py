"""The pack path's journal and resume: a wds checkpoint's cost does not grow with the shards before it,
``--resume`` refuses a packed file rewritten with the same size, and a folder that another process is
packing is named as such (with that process's pid), not as an interrupted pack to resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_image_folder
from packer import PackOptions, pack
from packer.errors import PackError
from packer.tools.info import describe, render
from packer.output import SHARD_LOG_NAME, UPLOADS_NAME, OutputBusyError
from readers.contract import spec
from reliability_helpers import HOLD_LOCK, interrupt_after

REPO = Path(__file__).resolve().parent.parent


def _journal_sizes(monkeypatch) -> dict[Path, list[int]]:
    """Per folder, the size of its ``pack-state.json`` after each time it is written (the real writes)."""
    sizes: dict[Path, list[int]] = {}
    write = spec.write_json_atomic

    def counted(path, obj) -> None:
        write(path, obj)
        if Path(path).name == spec.STATE_NAME:
            sizes.setdefault(Path(path).parent, []).append(Path(path).stat().st_size)

    monkeypatch.setattr(spec, "write_json_atomic", counted)
    return sizes


def test_a_wds_checkpoint_writes_as_many_journal_bytes_at_40_shards_as_at_10(tmp_path, monkeypatch):
    sizes = _journal_sizes(monkeypatch)
    written = {}
    for shards in (10, 40):
        src = make_image_folder(tmp_path / f"src{shards:03d}" / "train", classes=2, per_class=shards // 2,
                                size=(24, 24), png_every=0)
        pack(src, tmp_path / f"out{shards:03d}", PackOptions(format="wds", workers=1, shard_count=1))
        written[shards] = sizes[tmp_path / f"out{shards:03d}"]
        meta = json.loads((tmp_path / f"out{shards:03d}" / spec.INDEX_NAME).read_text())
        assert len(meta["shards"]) == shards
        assert not (tmp_path / f"out{shards:03d}" / SHARD_LOG_NAME).exists(), "the log goes with the journal"
    assert len(written[10]) > 10 and len(written[40]) > 40  # a checkpoint at every closed shard
    # The journal no longer lists the shards: its size does not grow with them (it did by ~110 bytes
    # a shard, 4.4 kB at 40), and the bytes of all checkpoints grow linearly, not quadratically.
    assert max(written[40]) - max(written[10]) < 64, (max(written[10]), max(written[40]))
    assert sum(written[40]) < 4.5 * sum(written[10]), (sum(written[10]), sum(written[40]))


def test_a_wds_pack_resumes_from_a_journal_listing_its_shards(tmp_path):
    """Journals written before the shard log (writer state ``{"shards": [...]}``) still resume."""
    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=12, size=(32, 32), png_every=0)
    opts = dict(format="wds", workers=1, shard_count=3)
    pack(src, tmp_path / "ref", PackOptions(**opts))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, PackOptions(**opts), progress=interrupt_after(14))
    state = json.loads((out / spec.STATE_NAME).read_text())
    shards = [json.loads(line) for line in (out / SHARD_LOG_NAME).read_text().splitlines()]
    assert state["writer"] == {"shards_closed": len(shards), "log_bytes": (out / SHARD_LOG_NAME).stat().st_size}
    assert len(shards) == 4
    state["writer"] = {"shards": shards}  # as an earlier version wrote it
    spec.write_json_atomic(out / spec.STATE_NAME, state)
    (out / SHARD_LOG_NAME).unlink()
    [res] = pack(src, out, PackOptions(**opts, resume=True))
    assert res.resumed_from == state["next_source"]
    for p in sorted((tmp_path / "ref").iterdir()):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name


def _rewrite_same_size(path: Path) -> None:
    """Other bytes, the same size, another modification time (as an editor or a re-export would)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    before = os.stat(path)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 3_000_000_000))


def test_resume_refuses_a_packed_file_rewritten_with_the_same_size(tmp_path):
    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=15, size=(40, 32), png_every=0)
    out = tmp_path / "out"
    opts = dict(format="wds", workers=1, shard_count=4)
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, PackOptions(**opts), progress=interrupt_after(18))
    packed = json.loads((out / spec.NAMES_FILE).read_text().splitlines()[0])  # sample 0: durable
    assert json.loads((out / spec.STATE_NAME).read_text())["done"] >= 4
    _rewrite_same_size(src / packed)
    with pytest.raises(PackError) as err:
        pack(src, out, PackOptions(**opts, resume=True))
    msg = str(err.value)
    assert "\n" not in msg and str(src / packed) in msg and "--overwrite" in msg, msg
    assert "same name and size" in msg
    assert not (out / spec.INDEX_NAME).exists(), "nothing was packed on top of the changed source"


def test_resume_takes_a_file_rewritten_after_the_packed_part(tmp_path):
    """A file not packed yet may change: the resumed dataset is a fresh pack of the source as it is now."""
    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=15, size=(40, 32), png_every=0)
    opts = dict(format="wds", workers=1, shard_count=4, order="source")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, PackOptions(**opts), progress=interrupt_after(10))
    last = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.JPEG"))[-1]  # source order: packed last
    _rewrite_same_size(src / last)
    [res] = pack(src, out, PackOptions(**opts, resume=True))
    assert res.resumed_from > 0
    pack(src, tmp_path / "fresh", PackOptions(**opts))
    for p in sorted((tmp_path / "fresh").iterdir()):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.slow
def test_a_folder_being_packed_is_named_with_the_packing_pid(tmp_path):
    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=8, size=(32, 32), png_every=0)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, PackOptions(format="wds", workers=1, shard_count=3), progress=interrupt_after(7))
    assert describe(out)["state"] == "incomplete" and "resume with" in render(describe(out))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        d = describe(out)
        assert (d["state"], d["packing_pid"]) == ("packing", holder.pid)
        text = render(d)
        assert f"being packed by pid {holder.pid}" in text and "resume with" not in text, text
        res = subprocess.run([sys.executable, "-m", "packer.cli", "info", str(out)], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0 and f"being packed by pid {holder.pid}" in res.stdout, res.stdout + res.stderr
        with pytest.raises(OutputBusyError, match=f"pid {holder.pid}"):
            pack(src, out, PackOptions(format="wds", workers=1, shard_count=3, resume=True))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    assert describe(out)["state"] == "incomplete", "a killed holder's lock is free: the pack is resumable"


def _bytes_written() -> int:
    """Bytes this process has passed to write(2) so far (``wchar`` of /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def test_the_upload_journal_writes_the_same_bytes_per_upload_at_any_count(tmp_path):
    from packer.remote_output import Uploads

    written = {}
    for count in (10, 40):
        stage = tmp_path / f"stage{count}"
        stage.mkdir()
        uploads = Uploads(stage)
        before = _bytes_written()
        for i in range(count):
            uploads.record(f"train-{i:06d}.tar", 1_000_000 + i, 2**31 + i)
        written[count] = _bytes_written() - before
        uploads.close()
    # one line appended per upload (the whole list rewritten each time: 16x for 4x the uploads)
    assert written[40] < 4.5 * written[10], written

    stage = tmp_path / "stage40"
    with open(stage / UPLOADS_NAME, "ab") as f:
        f.write(b'{"crc32": 7, "name": "train-000099.tar", "si')  # killed while appending
    uploads = Uploads(stage)
    assert len(uploads.done) == 40 and uploads.done["train-000005.tar"] == {"size": 1_000_005, "crc32": 2**31 + 5}
    uploads.forget("train-000003.tar")
    uploads.record("train-000040.tar", 12, 34)
    uploads.close()
    again = Uploads(stage)
    assert "train-000003.tar" not in again.done and again.done["train-000040.tar"] == {"size": 12, "crc32": 34}
    assert len(again.done) == 40
    again.close()


def test_the_upload_journal_of_an_earlier_version_is_read(tmp_path):
    from packer.remote_output import Uploads

    spec.write_json_atomic(tmp_path / "uploads.json", {"train-000000.tar": {"size": 5, "crc32": 6}})
    uploads = Uploads(tmp_path)
    assert uploads.done == {"train-000000.tar": {"size": 5, "crc32": 6}}
    uploads.close()
