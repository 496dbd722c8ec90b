"""The packer's listing of the source costs a few bytes a file (issue 22 item 3): ``packer.sources.source``
keeps compact columns, no Python object per file; its fingerprints are the list-based ones."""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import tracemalloc
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import packer.sources.columns as columns
import packer.sources.source as source_module
from conftest import make_image_folder
from packer import WRITERS, PackOptions
from packer.api import plan
from packer.journal import RECORD_BATCH, Journal, SideFiles
from packer.pipeline import pack_split
from packer.sources.columns import IntColumn, StringColumn
from packer.sources.source import Source, scan
from readers.contract import spec

PER_CLASS = 500  # files per class folder: the same in every tree, so per-folder costs cancel out


def sparse_tree(root: Path, files: int) -> Path:
    """``files`` ImageNet-named files of 3,000-ish bytes, sparse (no data written: the scan reads none)."""
    for c in range(files // PER_CLASS):
        d = root / f"n{c:08d}"
        d.mkdir(parents=True)
        for i in range(PER_CLASS):
            fd = os.open(d / f"n{c:08d}_{i + 10_000}.JPEG", os.O_WRONLY | os.O_CREAT, 0o644)
            os.ftruncate(fd, 3_000 + i)  # sizes past the small ints Python caches
            os.close(fd)
    return root


def scan_memory(root: Path) -> tuple[int, int, Source]:
    """(bytes the scan's result keeps, the scan's peak, the result), as tracemalloc counts them."""
    tracemalloc.start()
    try:
        source = scan(root)
        kept, peak = tracemalloc.get_traced_memory()
        return kept, peak, source
    finally:
        tracemalloc.stop()


def test_a_scanned_file_costs_a_few_bytes(tmp_path):
    """Kept memory grows by what the columns need: the name's UTF-8 bytes (here 30), an offset, a size
    and a modification time (8 each) and a 2-byte label, about 60 bytes; the released packer kept a
    str, two ints and three list slots per file, 144 bytes here (190-380 B/file at 1.28M, issue 22).
    The scan's peak (columns being built, one folder's listing) grows no faster."""
    small, large = 1_000, 4_000
    kept_small, peak_small, _ = scan_memory(sparse_tree(tmp_path / "a", small))
    kept_large, peak_large, s2 = scan_memory(sparse_tree(tmp_path / "b", large))
    assert len(s2.paths) == large and s2.sizes[1] == 3_001
    per_file, peak_per_file = ((x - y) / (large - small) for x, y in ((kept_large, kept_small),
                                                                       (peak_large, peak_small)))
    name = len(s2.paths[-1])
    assert per_file < name + 40, f"{per_file:.0f} bytes kept per file (names of {name} bytes)"
    assert peak_per_file < name + 60, f"the scan's peak grows {peak_per_file:.0f} bytes per file"


def _reference_fingerprint(paths, sizes, labels) -> str:
    """The fingerprint as the released packer computed it (a loop over Python lists)."""
    h = hashlib.sha256()
    for p, s, label in zip(paths, sizes, labels):
        h.update(f"{label}\0{p}\0{s}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def test_fingerprints_are_the_list_based_ones(tmp_path):
    """Hashed a chunk at a time from the columns, the fingerprint and every prefix fingerprint are the
    bytes the list-based loop hashed: a --resume of a pack started by the released packer resumes."""
    root = sparse_tree(tmp_path / "src", 1_500)
    (root / "n00000001" / "caf\udce9.JPEG".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
     ).write_bytes(b"x" * 7)  # a name that is not UTF-8
    src = scan(root)
    paths, sizes, labels = list(src.paths), list(src.sizes), list(src.labels)
    assert any("\udce9" in p for p in paths)
    assert src.fingerprint() == _reference_fingerprint(paths, sizes, labels)
    times = np.asarray(src.mtimes, dtype="<i8")
    for n in (0, 1, 777, 1_000, len(paths)):
        want = _reference_fingerprint(paths[:n], sizes[:n], labels[:n])
        want += "/" + hashlib.sha256(times[:n].tobytes()).hexdigest()
        assert src.prefix_fingerprint(n) == want
    shuffled = src.ordered("shuffled", seed=3)
    perm = shuffled.origin
    assert shuffled.fingerprint() == src.fingerprint()  # the scanned order's
    spaths = [paths[i] for i in perm]
    assert list(shuffled.paths) == spaths and list(shuffled.labels) == [labels[i] for i in perm]
    n = 1_234
    want = _reference_fingerprint(spaths[:n], [sizes[i] for i in perm[:n]], [labels[i] for i in perm[:n]])
    assert shuffled.prefix_fingerprint(n).split("/")[0] == want
    # small lists (an importer's, a test's) get the same fingerprint
    listed = Source(root, src.classes, paths, labels, sizes)
    assert isinstance(listed.paths, StringColumn) and listed.fingerprint() == src.fingerprint()


def test_columns_read_like_lists():
    names = ["a/x.jpg", "b/caf\udce9.png", "", "c/" + "é" * 40 + ".jpg"]
    col = StringColumn.of(names)
    assert col == names and list(col) == names and len(col) == 4 and col[-1] == names[-1]
    assert col[1:3] == names[1:3] and col[::2] == names[::2] and col[3:1] == []
    assert col.take([3, 0]) == [names[3], names[0]] and col.take([3, 0])[1:] == [names[0]]
    assert pickle.loads(pickle.dumps(col[1:3])) == names[1:3]
    assert pickle.loads(pickle.dumps(col.take([2, 1]))) == [names[2], names[1]]
    with pytest.raises(IndexError):
        col[4]
    ints = IntColumn(np.array([5, 3_000_000_000, 7]))
    assert ints == [5, 3_000_000_000, 7] and ints[1] == 3_000_000_000 and type(ints[1]) is int
    assert ints[1:] == [3_000_000_000, 7] and ints.sum() == 3_000_000_012 and ints.take([2, 0]) == [7, 5]


def _count_listings(monkeypatch) -> Counter:
    """Counts every folder listing (os.scandir, os.listdir: os.walk, glob and Path.iterdir use them)."""
    calls: Counter = Counter()
    real_scandir, real_listdir = os.scandir, os.listdir

    def scandir(path="."):
        calls[os.path.realpath(path)] += 1
        return real_scandir(path)

    def listdir(path="."):
        calls[os.path.realpath(path)] += 1
        return real_listdir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    return calls


@pytest.mark.parametrize("layout", ["folder", "splits"])
def test_plan_lists_each_folder_once(tmp_path, monkeypatch, layout):
    """Recognizing the source (tar shards? a Hugging Face dataset? splits?) and scanning it list every
    folder once (the released packer listed the root 7 times and the first class folder 3 times)."""
    src = tmp_path / "src"
    if layout == "folder":
        sparse_tree(src, 1_000)
    else:
        sparse_tree(src / "train", 1_000)
        sparse_tree(src / "val", 500)
    calls = _count_listings(monkeypatch)
    jobs = plan(src, tmp_path / "out", PackOptions(format="lmdb"))
    monkeypatch.undo()
    folders = {os.path.realpath(d) for d, _, _ in os.walk(src)}
    listed_in_src = {k: v for k, v in calls.items() if k in folders}
    assert set(listed_in_src) == folders and set(listed_in_src.values()) == {1}, listed_in_src
    assert sum(len(source.paths) for _, source, _ in jobs) == (1_000 if layout == "folder" else 1_500)


def test_prefix_fingerprints_start_from_the_fingerprints_marks(tmp_path, monkeypatch):
    """With the fingerprint's saved states every 16 entries, a prefix fingerprint anywhere, in any
    order of asking, is still the list-based hash, and costs only the entries past the mark before it."""
    monkeypatch.setattr(source_module, "_MARK_EVERY", 16)
    src = scan(sparse_tree(tmp_path / "src", 1_000))
    paths, sizes, labels = list(src.paths), list(src.sizes), list(src.labels)
    hashed = _count_hashed(monkeypatch)
    src.fingerprint()
    assert sum(hashed) == len(paths)
    for n in (999, 1_000, 17, 16, 15, 0, 500, 640):
        hashed.clear()
        assert src.prefix_fingerprint(n).split("/")[0] == _reference_fingerprint(paths[:n], sizes[:n], labels[:n])
        assert sum(hashed) < 16


def _count_hashed(monkeypatch) -> list[int]:
    """Entries hashed by each call of Source._entries (the one place entries are hashed)."""
    counts: list[int] = []
    real = Source._entries

    def entries(self, a, b):
        counts.append(max(0, min(b, len(self.paths)) - a))
        return real(self, a, b)

    monkeypatch.setattr(Source, "_entries", entries)
    return counts


def test_resume_does_not_hash_the_packed_part_again(tmp_path, monkeypatch):
    """--resume of a pack in scanned order: the fingerprint hashes the list once; the check of the part
    already packed starts from the fingerprint's mark before it (it hashed those entries already) and
    the checkpoints after it go on from there: N + (N - done) + 16 entries, not 2N."""
    monkeypatch.setattr(source_module, "_MARK_EVERY", 16)
    root = make_image_folder(tmp_path / "src", classes=3, per_class=30, size=(24, 20), png_every=0)
    options = PackOptions(format="lmdb", checkpoint_bytes=20_000)
    checkpoints = []

    def stop_after_second(journal):
        checkpoints.append(journal.next_source)
        if len(checkpoints) == 2:
            raise KeyboardInterrupt  # the pack is interrupted after a durable checkpoint

    with pytest.raises(KeyboardInterrupt):
        pack_split(scan(root), tmp_path / "out", "train", options, WRITERS["lmdb"], 1,
                   after_checkpoint=stop_after_second)
    done = checkpoints[-1]
    source = scan(root)  # what --resume scans
    n = len(source.paths)
    assert 16 < done < n - 16
    hashed = _count_hashed(monkeypatch)
    result = pack_split(source, tmp_path / "out", "train", replace(options, resume=True), WRITERS["lmdb"], 1)
    assert result.resumed_from == done and result.images == n
    assert sum(hashed) <= n + (n - done) + 16, hashed


def test_large_columns_live_in_a_mapped_file(tmp_path, monkeypatch):
    """Past SPILL_BYTES a column moves to an unlinked temporary file, mapped read-only: the scan keeps
    (almost) nothing in private memory, reads the same, hashes the same and leaves no file behind."""
    root = sparse_tree(tmp_path / "src", 4_000)
    in_memory = scan(root)
    monkeypatch.setattr(columns, "SPILL_BYTES", 4_096)
    kept, _peak, mapped = scan_memory(root)
    assert kept / len(mapped.paths) < 4, f"{kept / len(mapped.paths):.1f} bytes kept per file"
    mapped_files = [line for line in Path("/proc/self/maps").read_text().splitlines()
                    if tempfile.gettempdir() in line and line.endswith("(deleted)")]
    assert len(mapped_files) >= 3  # names, offsets, sizes, times (...): file-backed, unlinked
    assert mapped.paths == in_memory.paths and mapped.sizes == in_memory.sizes
    assert mapped.labels == in_memory.labels and mapped.mtimes == in_memory.mtimes
    assert mapped.fingerprint() == in_memory.fingerprint()
    assert mapped.prefix_fingerprint(3_333) == in_memory.prefix_fingerprint(3_333)
    a, b = mapped.ordered("shuffled", 5), in_memory.ordered("shuffled", 5)
    assert a.paths == b.paths and a.sizes == b.sizes and a.prefix_fingerprint(777) == b.prefix_fingerprint(777)
    del mapped, a  # the police fixture checks that the mappings' descriptors go with them


def test_records_wait_in_memory_a_batch_at_a_time(tmp_path):
    """Between checkpoints (256 MB of tiny images: ~200k samples) the per-sample records go to
    records.bin a batch at a time, not into a list of Python tuples (~150 bytes a sample)."""
    journal = Journal({"format": "lmdb", "split": "t", "options": {}, "fingerprint": ""})
    files = SideFiles(tmp_path, journal)
    try:
        n = 20_000
        record = lambda i: tuple(i + k * 1_000_003 for k in range(len(spec.RECORD_DTYPE.names)))  # noqa: E731
        tracemalloc.start()
        try:
            for i in range(n):
                files.add_sample(record(i), f"c/{i}.jpg")
            kept = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert kept < 2 * RECORD_BATCH * spec.RECORD_DTYPE.itemsize, f"{kept / n:.0f} bytes a sample kept"
        files.sync(journal)
    finally:
        files.close()
    recs = SideFiles.read_records(tmp_path)
    assert len(recs) == n and tuple(recs[12_345].tolist()) == record(12_345)
    assert journal.records_len == n * spec.RECORD_DTYPE.itemsize
    del recs
