"""Interrupted packs: kill -9 a real pack-dataset process, resume, get the same dataset."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import make_image_folder
from packer import PackOptions, pack
from readers import open_dataset
from readers.contract import spec
from reliability_helpers import checkpointed, verify_here

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "packer.cli"]
EXTRA = {
    "wds": ["--shard-count", "9"],
    "lmdb": ["--checkpoint-bytes", "40k"],
    "hdf5": ["--checkpoint-bytes", "40k"],
    "mmap": ["--checkpoint-bytes", "40k", "--resize", "32"],
}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    # Large enough that a pack takes a second or two on 2 cores.
    return make_image_folder(tmp_path_factory.mktemp("resume") / "train", classes=5, per_class=120,
                             size=(160, 120), png_every=0)


def _kill_when(proc: subprocess.Popen, journal: Path, done_at_least: int, extra_delay: float) -> bool:
    """SIGKILL ``proc`` once its journal says ``done_at_least`` samples are durable (plus a delay)."""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if journal.exists() and checkpointed(journal) >= done_at_least:
            time.sleep(extra_delay)
            break
        time.sleep(0.002)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        return True
    proc.communicate()
    return False


def _cmd(src: Path, out: Path, fmt: str, *more: str) -> list[str]:
    return [*CLI, str(src), "--format", fmt, "-o", str(out), "--workers", "2", "--quiet", *EXTRA[fmt], *more]


def _digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.name != "lock.mdb"}


def _content(root: Path) -> list[tuple[int, bytes]]:
    ds = open_dataset(root, decode=False)
    try:
        return [(int(ds.labels[i]), bytes(ds.read(i) if ds.format != "mmap" else np.asarray(ds.read(i)).tobytes()))
                for i in range(len(ds.labels))]
    finally:
        ds.close()


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_kill9_then_resume_gives_identical_output(src, tmp_path, fmt):
    reference = tmp_path / "reference"
    assert subprocess.run(_cmd(src, reference, fmt), capture_output=True).returncode == 0

    out = tmp_path / "killed"
    kills = 0
    # Kill at several different moments; each time, resume (which may itself be killed).
    # Kill at several points: before any checkpoint, between checkpoints, late.
    for done_at_least, delay in ((0, 0.0), (60, 0.013), (250, 0.031), (480, 0.0)):
        more = ["--resume"] if out.exists() else []
        proc = subprocess.Popen(_cmd(src, out, fmt, *more), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        kills += _kill_when(proc, out / spec.STATE_NAME, done_at_least, delay)
        if (out / spec.INDEX_NAME).exists():
            break
        # An interrupted pack never reads as a dataset.
        with pytest.raises(spec.IncompleteDatasetError, match="--resume"):
            open_dataset(out)
    print(f"{fmt}: {kills} kills")
    assert kills >= 1, "the pack finished before it could be killed: make the source bigger"
    done = subprocess.run(_cmd(src, out, fmt, "--resume"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (out / spec.STATE_NAME).exists()

    if fmt in ("wds", "mmap"):
        assert _digest(out) == _digest(reference)  # byte-identical files
    else:
        # LMDB page layout and HDF5 allocation depend on transaction/flush history:
        # the content is identical, the container bytes need not be.
        ref_files, out_files = _digest(reference), _digest(out)
        for name in ref_files:
            if name.endswith(".npy") or name == spec.NAMES_FILE:
                assert out_files[name] == ref_files[name], name
        assert _content(out) == _content(reference)
    checked = verify_here(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_resume_refuses_other_options(src, tmp_path):
    out = tmp_path / "o"
    proc = subprocess.Popen(_cmd(src, out, "wds"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert _kill_when(proc, out / spec.STATE_NAME, 50, 0.0)
    changed = subprocess.run([*CLI, str(src), "--format", "wds", "-o", str(out), "--resume", "--quiet",
                              "--shard-count", "10"], capture_output=True, text=True)
    assert changed.returncode == 1
    assert "other options" in changed.stderr


def test_disk_full_is_clear_and_resumable(src, tmp_path, monkeypatch):
    """ENOSPC mid-pack: a clear error naming the cause, and the output resumes to completion."""
    import errno

    import packer.formats.mmap as mmap_mod

    out = tmp_path / "full"
    calls = {"n": 0}
    real_append = mmap_mod.MemmapWriter.append

    def failing_append(self, sample_no, prepared, label):
        calls["n"] += 1
        if calls["n"] == 120:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(self, sample_no, prepared, label)

    monkeypatch.setattr(mmap_mod.MemmapWriter, "append", failing_append)
    opts = PackOptions(format="mmap", resize=32, workers=1, checkpoint_bytes=40_000)
    from packer import PackError

    with pytest.raises(PackError, match="disk full.*--resume"):
        pack(src, out, opts)
    with pytest.raises(spec.IncompleteDatasetError):
        open_dataset(out)
    monkeypatch.setattr(mmap_mod.MemmapWriter, "append", real_append)
    pack(src, out, PackOptions(format="mmap", resize=32, workers=1, checkpoint_bytes=40_000, resume=True))
    ref = tmp_path / "ref"
    pack(src, ref, PackOptions(format="mmap", resize=32, workers=1, checkpoint_bytes=40_000))
    assert _digest(out) == _digest(ref)


def test_read_error_names_the_file_and_resumes(tmp_path):
    """A source file that cannot be read mid-pack: error names it, exit path is --resume."""
    src = make_image_folder(tmp_path / "src", classes=2, per_class=10, png_every=0)
    victim = src / "class_01" / "img_005.JPEG"
    saved = victim.read_bytes()

    def progress(split, source):
        victim.unlink()  # vanishes after the scan, before it is read (the source is read ahead)
        return None

    out = tmp_path / "out"
    from packer import PackError

    with pytest.raises(PackError, match="img_005.JPEG: read error.*--resume"):
        pack(src, out, PackOptions(format="wds", workers=1), progress=progress)
    victim.write_bytes(saved)
    os.utime(victim)
    results = pack(src, out, PackOptions(format="wds", workers=1, resume=True))
    assert results[0].images == 20
