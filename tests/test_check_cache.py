"""The once-per-machine record of index checks (readers/checkcache.py): a second open of an
unchanged local dataset skips the O(N) checksum and value checks; any change to a file is
checked in full again; no usable cache folder, or the switch off, means full checks always."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.verify import verify
from readers import checkcache, checks, safeio, spec
from readers.registry import open_dataset

FORMATS = ("wds", "lmdb", "hdf5", "mmap")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(checkcache.ENV_DIR, str(folder))
    monkeypatch.delenv(checkcache.ENV_SWITCH, raising=False)
    return folder


def counting(monkeypatch, module, name: str) -> list:
    """Count the calls of ``module.name`` (still calling it)."""
    calls, orig = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return orig(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.fixture
def counters(monkeypatch):
    """(CRC-32 passes over mapped index arrays, value checks of index arrays)."""
    return counting(monkeypatch, safeio, "mapped_checksum"), counting(monkeypatch, checks, "_check_arrays")


def copy_of(packed_generated, fmt: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed_generated[fmt], tmp_path / fmt))


def edit_keeping_mtime(path: Path, edit) -> None:
    """Rewrite ``path`` in place with ``edit(bytes) -> bytes``, then put its mtime back (ctime changes)."""
    st = os.stat(path)
    data = edit(path.read_bytes())
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == st.st_size


@pytest.mark.parametrize("fmt", FORMATS)
def test_second_open_of_an_unchanged_dataset_skips_the_checks(fmt, packed_generated, tmp_path, counters):
    crcs, values = counters
    root = copy_of(packed_generated, fmt, tmp_path)
    first = open_dataset(root, decode=False)
    arrays = len(first.index.arrays)
    assert (len(crcs), len(values)) == (arrays, 1)
    second = open_dataset(root, decode=False)
    assert (len(crcs), len(values)) == (arrays, 1)  # nothing computed again
    assert len(second) == len(first)
    assert all(np.array_equal(second.index.arrays[k], a) for k, a in first.index.arrays.items())


def test_an_array_edited_in_place_with_its_mtime_restored_is_caught(packed_generated, tmp_path, counters):
    crcs, _values = counters
    root = copy_of(packed_generated, "mmap", tmp_path)
    open_dataset(root, decode=False)
    open_dataset(root, decode=False)
    seen = len(crcs)
    edit_keeping_mtime(root / spec.array_file("sizes"), lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]))
    with pytest.raises(spec.DatasetFormatError, match="sizes.npy: checksum differs"):
        open_dataset(root, decode=False)
    assert len(crcs) > seen


def test_values_edited_in_a_pack_without_array_checksums_are_caught(packed_generated, tmp_path, counters):
    """An older pack records no array checksums: the value checks alone guard it, also when cached."""
    _crcs, values = counters
    root = copy_of(packed_generated, "lmdb", tmp_path)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    del meta[spec.ARRAYS_KEY]
    spec.write_json_atomic(root / spec.INDEX_NAME, meta)
    open_dataset(root, decode=False)
    open_dataset(root, decode=False)
    assert len(values) == 1
    labels = root / spec.array_file("labels")
    header = labels.stat().st_size - meta["num_samples"] * spec.ARRAY_DTYPES["labels"].itemsize  # the first label

    def bad_label(b: bytes) -> bytes:
        out = bytearray(b)
        out[header:header + spec.ARRAY_DTYPES["labels"].itemsize] = np.array(
            [99], dtype=spec.ARRAY_DTYPES["labels"]).tobytes()
        return bytes(out)

    edit_keeping_mtime(labels, bad_label)
    with pytest.raises(spec.DatasetFormatError, match="labels.npy: sample 0: label 99 is outside"):
        open_dataset(root, decode=False)


def test_an_unusable_cache_folder_means_full_checks(packed_generated, tmp_path, monkeypatch, counters):
    crcs, values = counters
    root = copy_of(packed_generated, "hdf5", tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    monkeypatch.setenv(checkcache.ENV_DIR, str(blocker / "cache"))  # under a file: cannot be made
    arrays = [len(open_dataset(root, decode=False).index.arrays) for _ in range(2)]
    assert len(values) == 2 and len(crcs) == sum(arrays)


def test_switch_off_means_full_checks_and_no_record(packed_generated, tmp_path, monkeypatch, counters, cache_dir):
    crcs, values = counters
    root = copy_of(packed_generated, "wds", tmp_path)
    monkeypatch.setenv(checkcache.ENV_SWITCH, "off")
    open_dataset(root, decode=False)
    open_dataset(root, decode=False)
    assert len(values) == 2
    assert not cache_dir.exists()


def test_verify_checks_in_full_whatever_is_recorded(packed_generated, tmp_path, counters):
    crcs, values = counters
    root = copy_of(packed_generated, "mmap", tmp_path)
    open_dataset(root, decode=False)
    before = (len(crcs), len(values))
    assert verify(root).ok
    assert len(crcs) >= 2 * before[0] and len(values) == 2 * before[1]


def test_a_rewritten_array_replaces_the_record_and_is_checked_again(packed_generated, tmp_path, counters,
                                                                     cache_dir):
    """One record per dataset and check: rewriting a file (same bytes: only its ctime changes) means
    full checks once more, and the folder still holds one record per check, not one per version."""
    crcs, values = counters
    root = copy_of(packed_generated, "lmdb", tmp_path)
    open_dataset(root, decode=False)
    assert len(list((cache_dir / "checked").iterdir())) == 2  # the checksums, the values
    edit_keeping_mtime(root / spec.array_file("sizes"), lambda b: b)
    open_dataset(root, decode=False)
    open_dataset(root, decode=False)
    assert len(values) == 2
    assert len(list((cache_dir / "checked").iterdir())) == 2


@pytest.mark.parametrize("edit", ["shard", "file"])
def test_a_byte_count_past_int64_is_a_format_error(edit, packed_generated, tmp_path):
    """Found by test_fuzz once cached opens let it run more cases: 2**63 in a shard's ``bytes`` (or
    in ``files``) was an OverflowError from numpy, not a DatasetFormatError naming index.json."""
    root = copy_of(packed_generated, "wds" if edit == "shard" else "mmap", tmp_path)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    if edit == "shard":
        meta["shards"][0]["bytes"] = 2 ** 63
    else:
        meta["files"]["images.npy"] = 2 ** 63
    spec.write_json_atomic(root / spec.INDEX_NAME, meta)
    with pytest.raises(spec.DatasetFormatError, match="index.json: .*2\\*\\*63|index.json: .*9223372036854775808"):
        open_dataset(root, decode=False)
