"""pack-dataset verify: a flipped byte inside any format's data is found and named."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from packer.cli import main as pack_dataset
from readers.contract import spec


@pytest.fixture
def verify_cli(capsys):
    """``verify_cli(ROOT)``: ``pack-dataset verify ROOT -q`` through the CLI's entry point in this process (what
    ``python -m packer.cli`` runs; none of these tests is about the process itself, and a fresh Python costs
    an import of torch): the exit code and output, as a finished process holds them."""
    def run(root) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = pack_dataset(["verify", str(root), "-q"])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["pack-dataset", "verify", str(root), "-q"], code, out.out, out.err)

    return run


def _data_position(root, fmt: str, i: int) -> tuple[str, int]:
    """(file, byte position) of the middle of sample i's stored bytes."""
    index = spec.read_index(root)
    size = int(index.arrays["sizes"][i])
    if fmt == "wds":
        shard = int(index.arrays["shards"][i])
        return index.meta["shards"][shard]["name"], int(index.arrays["offsets"][i]) + size // 2
    name = spec.DATA_FILE[fmt]
    if fmt == "mmap":
        start = index.meta["storage"]["data_offset"] + int(index.arrays["offsets"][i])
        assert index.meta["storage"]["data_offset"] == spec.MMAP_HEADER_BYTES
        return name, start + size // 2
    # lmdb / hdf5: find the sample's bytes inside the container file
    from readers import open_dataset

    ds = open_dataset(root, decode=False)
    stored = ds.read(i)
    ds.close()
    blob = (root / name).read_bytes()
    at = blob.find(stored)
    assert at >= 0 and blob.find(stored, at + 1) < 0
    return name, at + len(stored) // 2


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_verify_names_the_damaged_sample(packed_generated, tmp_path, fmt, verify_cli):
    root = tmp_path / fmt
    shutil.copytree(packed_generated[fmt], root)
    ok = verify_cli(root)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK" in ok.stdout

    victim = 5
    name, pos = _data_position(root, fmt, victim)
    with open(root / name, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x40]))
    bad = verify_cli(root)
    assert bad.returncode == 1
    damaged = [line for line in bad.stdout.splitlines() if line.startswith("DAMAGED")]
    assert any(f"sample {victim}:" in line for line in damaged), bad.stdout
    assert not any(f"sample {other}:" in line for line in damaged for other in (4, 6)), bad.stdout


def test_verify_reports_a_missing_shard(packed_generated, tmp_path, verify_cli):
    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    shard = spec.read_index(root).meta["shards"][1]["name"]
    (root / shard).unlink()
    bad = verify_cli(root)
    assert bad.returncode == 1
    assert f"{shard}: shard file is missing" in bad.stdout


def test_verify_refuses_a_half_written_pack(tmp_path, verify_cli):
    (tmp_path / spec.STATE_NAME).write_text("{}")
    bad = verify_cli(tmp_path)
    assert bad.returncode == 1
    assert "--resume" in bad.stderr


def _count_index_reads(monkeypatch) -> list:
    calls = []
    real = spec.read_index

    def counting(root):
        calls.append(root)
        return real(root)

    monkeypatch.setattr(spec, "read_index", counting)
    return calls


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_verify_reads_the_index_once(packed_generated, monkeypatch, capsys, fmt):
    from packer.tools.verify import main, verify

    calls = _count_index_reads(monkeypatch)
    report = verify(packed_generated[fmt])
    assert report.ok and report.samples > 0
    assert len(calls) == 1, f"verify read the index {len(calls)} times"
    calls.clear()
    assert main([str(packed_generated[fmt]), "-q"]) == 0
    assert len(calls) == 1, f"pack-dataset verify read the index {len(calls)} times"
    assert "OK" in capsys.readouterr().out


def test_verify_refuses_a_shards_array_that_disagrees_with_the_shard_list(packed_generated, tmp_path, capsys):
    """The open checks refuse it (the readers would read the sample from the wrong shard): verify says so
    in one line naming shards.npy, the sample and both shards, and exits 1."""
    from packer.tools.verify import main, verify

    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    index = spec.read_index(root)
    shards = index.arrays["shards"].copy()
    first = index.meta["shards"][1]["first"]
    shards[first] = 0  # sample `first` claims to live in shard 0
    spec.save_array(root, "shards", shards)
    # crafted, not damaged: index.json's checksum of shards.npy is made to match
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    meta[spec.ARRAYS_KEY]["shards"]["crc32"] = spec.checksum((root / "shards.npy").read_bytes())
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))
    expected = (f"{root / spec.array_file('shards')}: sample {first}: shard 0, "
                f"but the shard list in {spec.INDEX_NAME} puts it in shard 1")
    with pytest.raises(spec.DatasetFormatError) as caught:
        verify(root)
    assert str(caught.value) == expected
    assert main([str(root), "-q"]) == 1
    err = capsys.readouterr().err
    assert err == f"pack-dataset verify: error: {expected}\n"
