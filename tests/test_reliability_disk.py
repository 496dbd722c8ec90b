"""A real full disk (issue 10, item 3): packs into a 20 MB tmpfs, then ``--resume`` after freeing space.

Mounting needs root: run as another user, these tests skip with the reason.
Before: every format printed a Python traceback, HDF5 died with SIGSEGV
(exit 139), LMDB said ``mdb_txn_commit: Input/output error``, and a full
disk while writing the final index arrays said "3000 requested and 2544
written". Now each says "disk full while writing OUT; free space and re-run
with --resume" on one line (exit 1), and the resumed pack is the same
dataset as one packed on a roomy disk.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from readers import open_dataset
from readers.contract import spec
from reliability_helpers import assert_one_line, cli, content, digest, env, verify_here

pytestmark = pytest.mark.slow

OPTS = ["-q", "--workers", "2", "--checkpoint-bytes", "2MB", "--shard-count", "40"]


@pytest.fixture(scope="module")
def noise(tmp_path_factory) -> Path:
    """~21 MB of incompressible JPEGs (270 x 256x256 noise): more than the 20 MB disk holds."""
    root = tmp_path_factory.mktemp("noise") / "noise"
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(90):
            pixels = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i:03d}.jpg", quality=95)
    return root


@pytest.fixture(scope="module")
def roomy(noise, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("roomy")
    out = {}
    for fmt in spec.FORMATS:
        r = cli(noise, "-f", fmt, "-o", root / fmt, *OPTS)
        assert r.returncode == 0, r.stderr
        out[fmt] = root / fmt
    return out


def _mount(mnt: Path, size: str, *more: str) -> None:
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *more]), "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB tmpfs; ``small_disk.grow()`` remounts it at 200 MB (what "free space" does)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the full-disk tests run where CI runs as root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    _mount(mnt, "20m")

    class Disk:
        path = mnt

        @staticmethod
        def grow() -> None:
            subprocess.run(["mount", "-o", "remount,size=200m", str(mnt)], check=True)

    yield Disk
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _same(out: Path, ref: Path, fmt: str) -> None:
    if fmt in ("wds", "mmap"):
        assert digest(out) == digest(ref)
    else:
        a, b = digest(out), digest(ref)
        assert {k: v for k, v in a.items() if k.endswith(".npy")} == {k: v for k, v in b.items() if k.endswith(".npy")}
        assert content(out) == content(ref)
    r = verify_here(out)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_real_full_disk_then_resume(noise, roomy, small_disk, fmt):
    out = small_disk.path / "out"
    r = cli(noise, "-f", fmt, "-o", out, *OPTS, timeout=300)
    assert r.returncode != 139  # hdf5 segfaulted
    assert_one_line(r, 1, f"disk full while writing {out}; free space and re-run with --resume")
    with pytest.raises(spec.IncompleteDatasetError):
        open_dataset(out)
    small_disk.grow()
    r = cli(noise, "-f", fmt, "-o", out, *OPTS, "--resume", timeout=300)
    assert r.returncode == 0, r.stderr
    _same(out, roomy[fmt], fmt)


# The disk fills up exactly when the index arrays are written (the last step before index.json).
_FULL_AT_INDEX = textwrap.dedent('''
    import os, sys
    from readers.contract import spec
    real = spec.write_index
    def fill_then_write(root, meta, arrays):
        with open(os.path.join(sys.argv[1], "filler"), "wb", buffering=0) as f:
            for block in (1 << 20, 4096, 1):
                try:
                    while True:
                        f.write(b"x" * block)
                except OSError:
                    pass
        return real(root, meta, arrays)
    spec.write_index = fill_then_write
    from packer.cli import main
    sys.exit(main(sys.argv[2:]))
''')


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_disk_that_fills_while_the_index_arrays_are_written(noise, roomy, small_disk, fmt):
    small_disk.grow()  # the data fits; the disk fills just before the index arrays
    out = small_disk.path / "out"
    r = subprocess.run([sys.executable, "-c", _FULL_AT_INDEX, str(small_disk.path), str(noise), "-f", fmt,
                        "-o", str(out), *OPTS], capture_output=True, text=True, timeout=300, env=env())
    assert_one_line(r, 1, f"disk full while writing {out}; free space and re-run with --resume")
    assert "requested and" not in r.stderr  # numpy's "3000 requested and 2544 written"
    (small_disk.path / "filler").unlink()
    r = cli(noise, "-f", fmt, "-o", out, *OPTS, "--resume", timeout=300)
    assert r.returncode == 0, r.stderr
    _same(out, roomy[fmt], fmt)
