"""The packing core's seams: the writer contract against the spec, the journal, and a
substitute prepare stage (what a distributed engine would plug in) giving the same bytes."""

from __future__ import annotations

import copy
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import make_image_folder
from packer import WRITERS, PackError, PackOptions
from packer.prepare.images import ImageOptions
from packer.journal import RECORDS_NAME, Journal, SideFiles
from packer.pipeline import pack_split
from packer.sources.source import Source, scan
from packer.prepare.workers import Outcome, prepare
from readers.contract import spec

# What the pipeline itself puts in every sample's record; the rest comes from the writer.
PIPELINE_FIELDS = {"labels", "checksums", "sizes", "heights", "widths"}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("pipeline") / "train", classes=3, per_class=6)


def _digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.name != "lock.mdb"}


# ---------------------------------------------------------------- writer contract
def test_one_writer_per_format():
    assert sorted(WRITERS) == sorted(spec.FORMATS)
    assert all(w.format == name for name, w in WRITERS.items())


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_location_fields_are_what_the_spec_keeps(fmt):
    """A writer fills exactly the index arrays the spec requires beyond the pipeline's own."""
    writer = WRITERS[fmt]
    assert set(writer.location_fields) <= set(spec.RECORD_DTYPE.names)
    assert len(set(writer.location_fields)) == len(writer.location_fields)
    assert set(spec.REQUIRED_ARRAYS[fmt]) - PIPELINE_FIELDS == set(writer.location_fields)


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_writer_round_trip_leaves_meta_alone(fmt, src, tmp_path):
    """append returns one value per location field; finalize returns additions, never edits ``meta``."""
    options = PackOptions(format=fmt, resize=24 if fmt == "mmap" else None)
    source = scan(src)
    writer = WRITERS[fmt](tmp_path, "t", options, source.total_bytes)
    writer.open(0, None)
    outcomes = list(prepare(source, 0, options.image_options(want_pixels=writer.pixels), 1))
    locations = [writer.append(i, o.prepared, 0) for i, o in enumerate(outcomes)]
    writer.end_samples()
    writer.checkpoint()
    assert all(len(loc) == len(writer.location_fields) for loc in locations)
    arrays = {name: np.array([loc[k] for loc in locations])
              for k, name in enumerate(writer.location_fields)}
    arrays["labels"] = np.zeros(len(outcomes), dtype="<i4")
    meta = {"format": fmt, "num_samples": len(outcomes), "storage": {"kind": "x"}}
    before = copy.deepcopy(meta)
    extra = writer.finalize(meta, arrays)
    assert meta == before
    assert set(extra["files"]) <= {p.name for p in tmp_path.iterdir()}
    assert all(size == (tmp_path / name).stat().st_size for name, size in extra["files"].items())


# ---------------------------------------------------------------- journal
def _identity(src: Path, **opts) -> dict:
    return Journal.identity_of("train", scan(src), PackOptions(format="wds", **opts))


def test_journal_round_trip(src, tmp_path):
    journal = Journal(_identity(src), done=5, next_source=7, bytes_in=1234, changed=1, rejected=2,
                      encodings={"jpg": 4, "png": 1}, records_len=10, names_len=20, rejects_len=30,
                      writer={"shards": [{"name": "a"}]})
    journal.save(tmp_path)
    on_disk = json.loads((tmp_path / spec.STATE_NAME).read_text())
    assert on_disk["done"] == 5 and on_disk["format"] == "wds" and on_disk["fingerprint"]
    assert Journal.load(tmp_path, _identity(src)) == journal


def test_journal_refuses_other_options_and_changed_sources(src, tmp_path):
    Journal(_identity(src)).save(tmp_path)
    with pytest.raises(PackError, match="other options"):
        Journal.load(tmp_path, _identity(src, shard_count=3))
    changed = copy.deepcopy(_identity(src))
    changed["fingerprint"] = "0" * 64
    with pytest.raises(PackError, match="source folder changed"):
        Journal.load(tmp_path, changed)


def test_nothing_to_resume(src, tmp_path):
    assert Journal.load(tmp_path, _identity(src)) is None  # empty folder: start afresh
    (tmp_path / "stray.txt").write_text("x")
    with pytest.raises(PackError, match="nothing to resume"):
        Journal.load(tmp_path, _identity(src))


def test_side_files_are_cut_back_to_the_journal(tmp_path):
    journal = Journal({"format": "wds", "split": "t", "options": {}, "fingerprint": ""})
    files = SideFiles(tmp_path, journal)
    record = tuple(range(len(spec.RECORD_DTYPE.names)))
    files.add_sample(record, "a/1.jpg")
    files.sync(journal)
    durable = (journal.records_len, journal.names_len, journal.rejects_len)
    files.add_sample(record, "a/2.jpg")  # never synced: lost in a crash
    files.add_reject("a/3.jpg", "truncated")
    files.sync(copy.deepcopy(journal))  # on disk, but the journal does not vouch for it
    files.close()
    SideFiles(tmp_path, journal).close()
    assert (journal.records_len, journal.names_len, journal.rejects_len) == durable
    assert [tuple(r) for r in SideFiles.read_records(tmp_path)] == [record]
    assert (tmp_path / spec.NAMES_FILE).read_text() == '"a/1.jpg"\n'
    assert (tmp_path / spec.REJECTS_NAME).read_bytes() == b""
    assert RECORDS_NAME == "records.bin"


# ---------------------------------------------------------------- the prepare stage is a seam
def _threaded_stage(calls: list[int], stop_after: int | None = None):
    """A stand-in prepare stage: threads, finishing in any order, yielding in source order."""

    def stage(source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        calls.append(start)

        def one(pos: int) -> Outcome:
            outcomes = prepare(source, pos, opts, 1)  # from ``pos`` on, in this thread; keep the first
            try:
                return next(outcomes)
            finally:
                outcomes.close()

        with ThreadPoolExecutor(3) as pool:
            for k, outcome in enumerate(pool.map(one, range(start, len(source.paths)))):
                if stop_after is not None and k == stop_after:
                    raise KeyboardInterrupt  # the user gives up part-way
                yield outcome

    return stage


@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_another_prepare_stage_gives_the_same_bytes(fmt, src, tmp_path):
    extra = {"resize": 24} if fmt == "mmap" else {"shard_count": 4}
    options = PackOptions(format=fmt, checkpoint_bytes=4000, **extra)
    source = scan(src)
    pack_split(source, tmp_path / "ref", "train", options, WRITERS[fmt], 1)

    calls: list[int] = []
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack_split(source, out, "train", options, WRITERS[fmt], 1, prepare=_threaded_stage(calls, stop_after=11))
    journal = json.loads((out / spec.STATE_NAME).read_text())
    assert 0 < journal["next_source"] <= 11
    resumed = PackOptions(format=fmt, checkpoint_bytes=4000, resume=True, **extra)
    result = pack_split(source, out, "train", resumed, WRITERS[fmt], 1, prepare=_threaded_stage(calls))
    assert calls == [0, journal["next_source"]]  # the stage is asked to continue where the journal stops
    assert result.resumed_from == journal["next_source"] and result.images == len(source.paths)
    assert _digest(out) == _digest(tmp_path / "ref")


# ---------------------------------------------------------------- the scan: one listing
def test_recognizing_an_image_folder_lists_one_class_folder_not_all(tmp_path, monkeypatch):
    """``scan_import`` rules out WebDataset split folders before the folder scan; it listed every class
    folder to do so (a second full listing of the source: 20-25% of the scan at 1.28M images)."""
    import os

    from packer.importers import scan_import

    src = make_image_folder(tmp_path / "train", classes=12, per_class=2, size=(8, 8), png_every=0)
    listed: list[Path] = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path="."):
        listed.append(Path(path))
        return real_listdir(path)

    def scandir(path="."):
        listed.append(Path(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    assert scan_import(src) is None  # an image folder: the folder scan's to judge
    class_folders = [p for p in listed if p.parent == src]
    assert len(class_folders) <= 1, class_folders
