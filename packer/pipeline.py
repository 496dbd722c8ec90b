"""The packing pipeline: one split, any format.

Two stages. The prepare stage (``packer.workers``, or any stand-in with
the same signature) reads, validates and normalizes the source files in
worker processes and yields their outcomes in source order. The write
stage, here, appends each sample through one format writer
(``packer.formats``) in this process and keeps the journal
(``packer.journal``), so the output does not depend on the worker count.

Crash safety. While packing, the output folder holds ``pack-state.json``
(the journal) and no ``index.json``, so no reader takes it for a dataset.
At every checkpoint the writer makes its data durable first; then the
per-sample records, names and rejects files are fsynced; then the journal
is replaced atomically. ``--resume`` truncates everything back to the
journal and carries on from there. The index is written last.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from packer.errors import PackError
from packer.formats.base import FormatWriter, merged
from packer.journal import Journal, SideFiles
from packer.options import PackOptions
from packer.source import Source
from packer.workers import Outcome, PrepareStage
from packer.workers import prepare as prepare_locally
from readers import spec

__all__ = ["SplitResult", "pack_split", "Progress", "VERSION"]

log = logging.getLogger(__name__)

VERSION = "0.1.0"

Progress = Callable[[int, int], None]  # (images done incl. rejects, source bytes done)


@dataclass
class SplitResult:
    split: str
    out: Path
    images: int
    classes: int
    rejected: int
    changed: int
    ignored: int
    skipped_links: int
    bytes_in: int
    bytes_out: int
    seconds: float
    resumed_from: int = 0
    rejects_file: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict, repr=False)

    def summary(self) -> str:
        rate = (self.images - self.resumed_from) / self.seconds if self.seconds else 0.0
        text = (
            f"{self.split}: {self.images} images, {self.classes} classes, "
            f"{self.bytes_in / 1e6:.1f} MB in -> {self.bytes_out / 1e6:.1f} MB out, "
            f"{self.seconds:.1f} s ({rate:.0f} img/s), "
            f"{self.rejected} rejected, {self.changed} re-encoded, {self.ignored} non-image files ignored"
        )
        if self.skipped_links:
            text += f", {self.skipped_links} symlinks outside the source skipped"
        if self.resumed_from:
            text += f", resumed after {self.resumed_from} samples"
        text += f" -> {self.out}"
        if self.rejects_file:
            text += f" (rejects listed in {self.rejects_file})"
        return text


def pack_split(
    source: Source,
    out: Path,
    split: str,
    options: PackOptions,
    writer_cls: type[FormatWriter],
    workers: int,
    progress: Progress | None = None,
    *,
    prepare: PrepareStage = prepare_locally,
) -> SplitResult:
    """Pack one split of ``source`` into the dataset folder ``out``.

    ``prepare`` is the prepare stage (default: a local process pool of
    ``workers``); it must yield one outcome per source file, in source order.
    """
    t0 = time.perf_counter()
    if (out / spec.INDEX_NAME).exists() and options.resume:
        meta = spec.read_index(out).meta
        Journal.discard(out)  # interrupted right after the commit
        log.info("%s is already complete; nothing to resume", out)
        return _result(split, out, meta, time.perf_counter() - t0, 0)
    out.mkdir(parents=True, exist_ok=True)
    identity = Journal.identity_of(split, source, options)
    resumed = Journal.load(out, identity) if options.resume else None
    journal = resumed or Journal(identity)
    resumed_from = journal.next_source
    writer = writer_cls(out, split, options, source.total_bytes)
    writer.open(journal.done, journal.writer)
    stage = _WriteStage(source, out, options, writer, journal, progress)
    if resumed is None:
        stage.checkpoint(0)  # the journal exists from the first moment: the folder reads as unfinished
    outcomes = None
    try:
        outcomes = prepare(source, resumed_from, options.image_options(want_pixels=writer.pixels), workers)
        meta = stage.run(outcomes)
    except OSError as exc:
        writer.abort()
        if exc.errno == errno.ENOSPC:
            raise PackError(f"disk full while writing {out}; free space and re-run with --resume") from exc
        raise PackError(f"I/O error while packing into {out}: {exc}; re-run with --resume") from exc
    except BaseException:
        writer.abort()
        raise
    finally:
        if outcomes is not None:
            outcomes.close()  # stops the worker pool at once on errors
        stage.files.close()
    return _result(split, out, meta, time.perf_counter() - t0, resumed_from)


class _WriteStage:
    """Consumes prepared outcomes in source order: appends, rejects, checkpoints, finishes."""

    def __init__(self, source: Source, out: Path, options: PackOptions, writer: FormatWriter,
                 journal: Journal, progress: Progress | None) -> None:
        self.source, self.out, self.options = source, out, options
        self.writer, self.journal, self.progress = writer, journal, progress
        self.files = SideFiles(out, journal)

    def run(self, outcomes: Iterator[Outcome]) -> dict[str, Any]:
        """Write every outcome, then the index; returns the index metadata."""
        for pos, outcome in enumerate(outcomes, start=self.journal.next_source):
            self._take(pos, outcome)
        if self.journal.done == 0:
            raise PackError(f"{self.source.root}: every image was rejected; see {self.out / spec.REJECTS_NAME}")
        self.writer.end_samples()
        self.checkpoint(len(self.source.paths))
        self.files.close()
        return self._finish()

    def checkpoint(self, next_source: int) -> None:
        """Writer data durable, then the side files, then the journal (atomically)."""
        self.journal.writer = self.writer.checkpoint()
        self.journal.next_source = next_source
        self.files.sync(self.journal)
        self.journal.save(self.out)

    def _take(self, pos: int, outcome: Outcome) -> None:
        rel, size = self.source.paths[pos], self.source.sizes[pos]
        self.journal.bytes_in += size
        if outcome.unreadable:
            raise PackError(f"{outcome.problem}; fix it and re-run with --resume")
        if outcome.prepared is None:
            self.journal.rejected += 1
            self.files.add_reject(rel, outcome.problem)
            if self.options.strict:
                raise PackError(f"rejected {self.source.root / rel}: {outcome.problem} "
                                "(--strict stops at the first reject)")
        else:
            self._store(pos, outcome)
        if self.progress is not None:
            self.progress(1, size)

    def _store(self, pos: int, outcome: Outcome) -> None:
        prep, label, journal = outcome.prepared, self.source.labels[pos], self.journal
        assert prep is not None
        locations = self.writer.append(journal.done, prep, label)
        record = {
            "labels": label, "checksums": outcome.crc, "heights": prep.height, "widths": prep.width,
            "sizes": prep.pixels.nbytes if prep.pixels is not None else len(prep.data),
        }
        record.update(zip(self.writer.location_fields, locations, strict=True))
        self.files.add_sample(tuple(record.get(name, 0) for name in spec.RECORD_DTYPE.names), self.source.paths[pos])
        journal.changed += bool(prep.changed) and not self.writer.pixels
        journal.encodings[prep.ext] = journal.encodings.get(prep.ext, 0) + 1
        journal.done += 1
        if self.writer.at_checkpoint_boundary():
            self.checkpoint(pos + 1)

    def _finish(self) -> dict[str, Any]:
        """The index arrays and metadata from the records; the writer finishes; the index commits."""
        recs = SideFiles.read_records(self.out)
        if len(recs) != self.journal.done:
            raise PackError(f"{self.out}: internal error, {len(recs)} records for {self.journal.done} samples")
        arrays = {name: recs[name] for name in spec.REQUIRED_ARRAYS[self.options.format]}
        meta = self._meta(recs)
        meta = merged(meta, self.writer.finalize(meta, arrays))
        spec.write_index(self.out, meta, arrays)
        Journal.discard(self.out)
        if self.journal.rejected == 0:
            (self.out / spec.REJECTS_NAME).unlink(missing_ok=True)
        spec.fsync_dir(self.out)
        return meta

    def _meta(self, recs: np.ndarray) -> dict[str, Any]:
        source, journal, pixels = self.source, self.journal, self.writer.pixels
        return {
            "format": self.options.format,
            "split": journal.identity["split"],
            "num_samples": journal.done,
            "classes": source.classes,
            "class_counts": np.bincount(recs["labels"], minlength=len(source.classes)).tolist(),
            "storage": {
                "kind": "pixels" if pixels else "encoded",
                "encodings": dict(sorted(journal.encodings.items())),
                "pixel_layout": "HWC uint8 RGB" if pixels else None,
            },
            "options": self.options.recorded(),
            "order": source.order,
            "source": {
                "root": str(source.root.resolve()),
                "images_found": len(source.paths),
                "rejected": journal.rejected,
                "ignored_files": len(source.ignored),
                "skipped_symlinks": len(source.skipped_links),
                "fingerprint": source.fingerprint(),
            },
            "stats": {"bytes_in": journal.bytes_in, "bytes_out": int(recs["sizes"].sum()),
                      "reencoded": journal.changed},
            "created_by": f"dataset-packer {VERSION}",
        }


def _result(split: str, out: Path, meta: dict[str, Any], seconds: float, resumed_from: int) -> SplitResult:
    src = meta["source"]
    rejects = out / spec.REJECTS_NAME
    return SplitResult(
        split=split, out=out, images=meta["num_samples"], classes=len(meta["classes"]),
        rejected=src["rejected"], changed=meta["stats"]["reencoded"], ignored=src["ignored_files"],
        skipped_links=src["skipped_symlinks"], bytes_in=meta["stats"]["bytes_in"],
        bytes_out=sum(meta.get("files", {}).values()) or meta["stats"]["bytes_out"], seconds=seconds,
        resumed_from=resumed_from, rejects_file=rejects if rejects.exists() else None, meta=meta,
    )
