"""The once-per-machine record of index checks (readers/contract/checkcache.py): a second open of an
unchanged local dataset skips the O(N) checksum and value checks; any change to a file is
checked in full again; no usable cache folder, or the switch off, means full checks always."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.tools.verify import verify
from readers.contract import checkcache
from readers.contract import checks
from readers.contract import safeio
from readers.contract import spec
from readers.formats.registry import open_dataset

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


# ------------------------------------------------- issue 33 items 9, 10: mapped edits, the record's own files
#: A relabelling script as users write one, in a process of its own: it maps labels.npy writable
#: (np.load(mmap_mode="r+")), writes a label (the first write fault of that page: ctime changes),
#: says "ready", waits for a line on stdin, then writes ``label`` at ``position`` (a page already
#: dirty: no fault, no stat change) and flushes.
RELABEL = """
import sys, numpy as np
path, first, position, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
labels = np.load(path, mmap_mode="r+")
labels[first] = labels[first]  # no flush: a flush would write the page back and make the next write fault
print("ready", flush=True)
sys.stdin.readline()
labels[position] = label
labels.flush()
"""


def relabel_while_recorded(labels_path: Path, first: int, position: int, label: int, opener) -> None:
    """Run RELABEL on ``labels_path``; call ``opener()`` (the opens that write and use the record)
    while it holds its mapping, after its first write and before its second."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", RELABEL, str(labels_path), str(first), str(position), str(label)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        opener()
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.timeout(120)
def test_a_label_written_through_a_mapping_held_across_the_record_is_refused(packed_generated, tmp_path, counters):
    """Issue 33 item 9: the record of passed checks was written while a relabelling process held
    labels.npy mapped writable; its later write (99, outside the classes) changed no stat field, so the
    record still matched and the label was served unchecked. The sampled pages' CRC (here: all of
    the file's one page) no longer matches: full checks, and the edit is refused."""
    crcs, _values = counters
    root = copy_of(packed_generated, "mmap", tmp_path)
    labels = root / spec.array_file("labels")

    def opens():
        open_dataset(root, decode=False)
        seen = len(crcs)
        open_dataset(root, decode=False)
        assert len(crcs) == seen  # the record holds while the mapping is unchanged

    relabel_while_recorded(labels, 0, 3, 99, opens)
    assert int(np.load(labels)[3]) == 99
    with pytest.raises(spec.DatasetFormatError, match="labels.npy: (checksum differs|sample 3: label 99 is outside)"):
        open_dataset(root, decode=False)


def _many_labels(packed_generated, tmp_path: Path, n: int = 100_000) -> Path:
    """An lmdb dataset (index-only: its data file is the packed one) of ``n`` samples: labels.npy
    spans more pages than :data:`checkcache.SAMPLED_PAGES`."""
    root = copy_of(packed_generated, "lmdb", tmp_path)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    labels = (np.arange(n) % len(meta["classes"])).astype(np.int32)
    meta.update(num_samples=n, class_counts=np.bincount(labels).tolist())
    meta.pop(spec.ARRAYS_KEY, None)
    spec.write_index(root, meta, {"labels": labels, "checksums": np.zeros(n, np.uint32),
                                  "sizes": np.ones(n, np.int64)})
    return root


def _unsampled_label(labels_path: Path, n: int) -> int:
    """A sample whose label lies on a page the record's CRC does not sample."""
    size = labels_path.stat().st_size
    header, pages = size - 4 * n, -(-size // 4096)
    sampled = {round(i * (pages - 1) / (checkcache.SAMPLED_PAGES - 1)) for i in range(checkcache.SAMPLED_PAGES)}
    page = next(p for p in range(pages // 2, pages) if p not in sampled)
    return (page * 4096 - header) // 4 + 10


def _relabel_on_an_unsampled_page(packed_generated, tmp_path, new_label, opens_before=1):
    """A 100,000-sample dataset whose label on a page the record's CRC does not sample is rewritten
    (``new_label(classes, old)``) through a mapping held while ``opens_before`` opens write the record.
    Returns the dataset, the position, the new label and whether the labels file's stat key came through
    unchanged."""
    n = 100_000
    root = _many_labels(packed_generated, tmp_path, n)
    labels = root / spec.array_file("labels")
    position = _unsampled_label(labels, n)
    before = {}

    def opens():
        for _ in range(opens_before):
            open_dataset(root, decode=False)
        before["key"] = checkcache.stat_key(labels)

    new = new_label(len(spec.read_meta(root)["classes"]), int(np.load(labels)[position]))
    relabel_while_recorded(labels, position - 1, position, new, opens)
    return root, position, new, checkcache.stat_key(labels) == before["key"]


@pytest.mark.timeout(120)
def test_a_label_outside_the_classes_on_an_unsampled_page_is_refused_whatever_is_recorded(
        packed_generated, tmp_path, counters):
    """Issue 33 item 9, the page no CRC samples: the stat and the sampled pages still match the
    record, so the CRC-32 and most value checks are skipped, but the labels are range-checked on
    every open: label 99 is refused, naming the file and the sample."""
    crcs, _values = counters
    root, position, _, unchanged = _relabel_on_an_unsampled_page(packed_generated, tmp_path,
                                                                 lambda _classes, _old: 99, opens_before=2)
    if unchanged:  # the case of the issue (unless the kernel wrote the page back)
        seen = len(crcs)
        with pytest.raises(spec.DatasetFormatError, match=f"labels.npy: sample {position}: label 99 is outside the"):
            open_dataset(root, decode=False)
        assert len(crcs) == seen  # the record held: refused by the labels' range check alone
    else:
        with pytest.raises(spec.DatasetFormatError, match="labels.npy"):
            open_dataset(root, decode=False)


@pytest.mark.timeout(120)
def test_the_limit_an_in_range_label_on_an_unsampled_page_is_found_by_verify(packed_generated, tmp_path):
    """What the record does not cover (docs/guarantees.md): a label changed to another class, on a
    page the CRC does not sample, through a mapping held while the record was written, opens
    unchecked (the record still matches); verify, which ignores the record, finds it."""
    root, position, new, unchanged = _relabel_on_an_unsampled_page(
        packed_generated, tmp_path, lambda classes, old: (old + 1) % classes)
    if unchanged:
        assert int(open_dataset(root, decode=False).index.arrays["labels"][position]) == new
    with pytest.raises(spec.DatasetFormatError, match="labels.npy: checksum differs"):
        verify(root)


def test_a_fifo_in_place_of_a_record_never_blocks(packed_generated, tmp_path, cache_dir, counters):
    """Issue 33 item 10: a FIFO where a record file goes made open_dataset wait forever for a writer."""
    crcs, values = counters
    root = copy_of(packed_generated, "hdf5", tmp_path)
    open_dataset(root, decode=False)
    records = list((cache_dir / "checked").iterdir())
    assert len(records) == 2
    for rec in records:
        rec.unlink()
        os.mkfifo(rec)
    run_in_thread_with_timeout(lambda: open_dataset(root, decode=False), 30)
    assert len(values) == 2  # no record read: checked in full (and the FIFOs replaced by records)
    assert all(r.is_file() for r in records)
    open_dataset(root, decode=False)
    assert len(values) == 2


def run_in_thread_with_timeout(func, seconds: float) -> None:
    """``func()`` in a daemon thread; fails (instead of hanging the run) when it has not returned in ``seconds``."""
    import threading
    out: list = []
    worker = threading.Thread(target=lambda: out.append(func()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():  # unblock it: a writer on each FIFO ends the blocked open()
        for fifo in Path(os.environ[checkcache.ENV_DIR], "checked").iterdir():
            if fifo.is_fifo():
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail(f"blocked for more than {seconds} s")
    assert out


def test_a_link_in_place_of_a_record_is_not_followed(packed_generated, tmp_path, cache_dir, counters):
    """A record that is a symlink (to a copy of the real record) is not a record: full checks."""
    _crcs, values = counters
    root = copy_of(packed_generated, "wds", tmp_path)
    open_dataset(root, decode=False)
    for rec in (cache_dir / "checked").iterdir():
        target = tmp_path / ("copy-" + rec.name)
        shutil.copy(rec, target)
        rec.unlink()
        rec.symlink_to(target)
    open_dataset(root, decode=False)
    assert len(values) == 2


def test_a_record_folder_other_users_can_write_is_not_used(packed_generated, tmp_path, cache_dir, counters, caplog):
    """A record folder anyone can write (chmod 0o777) could hold forged records: it is not used,
    every open checks in full, and one warning per process names the folder."""
    import logging
    _crcs, values = counters
    root = copy_of(packed_generated, "lmdb", tmp_path)
    open_dataset(root, decode=False)
    (cache_dir / "checked").chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="readers.contract.checkcache"):
        open_dataset(root, decode=False)
        open_dataset(root, decode=False)
    assert len(values) == 3
    warned = [r.getMessage() for r in caplog.records if r.name == "readers.contract.checkcache"]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"{cache_dir / 'checked'}: is writable by other users (mode 777), so the record "
                                "of passed index checks is not used (every open checks in full)")
    (cache_dir / "checked").chmod(0o700)
    open_dataset(root, decode=False)
    assert len(values) == 3  # its own folder again: the record holds
