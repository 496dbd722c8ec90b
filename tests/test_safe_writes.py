"""The one atomic write (``readers.contract.safeio.atomic_write``) and the one first-line cut (``one_line``).

Every writer of a whole file goes through ``atomic_write``: index arrays, ``index.json``, field
columns, the remote store's local files, the node cache's records, the check record. These tests
hold what all of them rely on: the old file or the new one, never a torn one, and no temp file
left behind by a failure, with the permissions a plain ``open`` would give.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from readers.contract import spec
from readers.contract.messages import one_line
from readers.contract.safeio import atomic_write


def test_atomic_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write("new")
        assert path.read_text() == "old"  # nothing is visible before the block ends
        assert f.name == str(tmp_path / "a.json.tmp")
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.parametrize("unique", [False, True])
def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, unique):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path, unique=unique) as f:
            f.write(b"half")
            raise KeyboardInterrupt  # Ctrl-C in the middle of a write
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_atomic_write_creates_with_the_umask_or_the_mode_asked(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "shared.npy") as f:
            f.write(b"x")
        with atomic_write(tmp_path / "private.json", unique=True, perm=0o600) as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared.npy").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


def test_a_killed_writer_leaves_the_previous_index_array(tmp_path):
    """SIGKILL in the middle of ``spec.save_array``: the array on disk is the previous one, whole."""
    spec.save_array(tmp_path, "labels", np.arange(10))
    code = ("import os, signal, numpy as np, sys\n"
            "from readers.contract import safeio\n"
            "with safeio.atomic_write(sys.argv[1]) as f:\n"
            "    f.write(b'torn' * 1000); f.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    target = tmp_path / spec.array_file("labels")
    done = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True)
    assert done.returncode == -9
    assert np.array_equal(np.load(target), np.arange(10))


@pytest.mark.parametrize("message, expected", [
    ("", "ValueError"),
    ("\n\n", "ValueError"),
    ("first\nsecond", "first"),
    ("\n  the real line  \nTraceback ...", "the real line"),
])
def test_one_line_first_is_safe_on_empty_and_blank_messages(message, expected):
    assert one_line(ValueError(message), first=True) == expected


def test_one_line_without_first_joins_the_lines():
    assert one_line(ValueError("a\nb")) == "a b"
    assert one_line(OSError("x\ny"), kind=True, first=True) == "OSError: x"


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 3 * 4096 + 7])
def test_a_mapped_file_checksum_is_the_read_one(tmp_path, monkeypatch, size):
    """``file_checksum(mapped=True)`` (a writer's own finished files) gives the CRC-32 of the bytes, as the
    block-by-block read does; ``block=4096`` makes every file from one block up take the mapped path."""
    import mmap
    import types
    import zlib

    from readers.contract import safeio

    maps = []
    counting = types.SimpleNamespace(PROT_READ=mmap.PROT_READ, mmap=lambda *a, **k: maps.append(a) or mmap.mmap(*a, **k))
    monkeypatch.setattr(safeio, "mmap", counting)
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    want = zlib.crc32(data)
    assert spec.file_checksum(path, 4096, mapped=True) == want
    assert len(maps) == (size >= 4096)  # a file smaller than one block is read, not mapped
    assert spec.file_checksum(path, 4096) == want
    assert spec.file_checksum(path) == want
