"""pack-dataset verify: a flipped byte inside any format's data is found and named."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from readers import spec

CLI = [sys.executable, "-m", "packer.cli", "verify"]

pytestmark = pytest.mark.slow  # every test runs the CLI in a subprocess


def _data_position(root, fmt: str, i: int) -> tuple[str, int]:
    """(file, byte position) of the middle of sample i's stored bytes."""
    sizes = np.load(root / "sizes.npy")
    if fmt == "wds":
        shard = int(np.load(root / "shards.npy")[i])
        name = spec.read_index(root).meta["shards"][shard]["name"]
        return name, int(np.load(root / "offsets.npy")[i]) + int(sizes[i]) // 2
    if fmt == "mmap":
        start = spec.read_index(root).meta["storage"]["data_offset"] + int(np.load(root / "offsets.npy")[i])
        return "images.npy", start + int(sizes[i]) // 2
    # lmdb / hdf5: find the sample's bytes inside the container file
    from readers import open_dataset

    ds = open_dataset(root, decode=False)
    stored = ds.read(i)
    ds.close()
    name = "data.mdb" if fmt == "lmdb" else "data.h5"
    blob = (root / name).read_bytes()
    at = blob.find(stored)
    assert at >= 0 and blob.find(stored, at + 1) < 0
    return name, at + len(stored) // 2


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_verify_names_the_damaged_sample(packed_generated, tmp_path, fmt):
    root = tmp_path / fmt
    shutil.copytree(packed_generated[fmt], root)
    ok = subprocess.run([*CLI, str(root), "-q"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK" in ok.stdout

    victim = 5
    name, pos = _data_position(root, fmt, victim)
    with open(root / name, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x40]))
    bad = subprocess.run([*CLI, str(root), "-q"], capture_output=True, text=True)
    assert bad.returncode == 1
    damaged = [line for line in bad.stdout.splitlines() if line.startswith("DAMAGED")]
    assert any(f"sample {victim}:" in line for line in damaged), bad.stdout
    assert not any(f"sample {other}:" in line for line in damaged for other in (4, 6)), bad.stdout


def test_verify_reports_a_missing_shard(packed_generated, tmp_path):
    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    shard = spec.read_index(root).meta["shards"][1]["name"]
    (root / shard).unlink()
    bad = subprocess.run([*CLI, str(root), "-q"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"{shard}: shard file is missing" in bad.stdout


def test_verify_refuses_a_half_written_pack(tmp_path):
    (tmp_path / spec.STATE_NAME).write_text("{}")
    bad = subprocess.run([*CLI, str(tmp_path), "-q"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "--resume" in bad.stderr
