"""The packing pipeline: one split, any format.

Two stages. The prepare stage (``packer.prepare.workers``, or any stand-in with
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

Every moment is recoverable: the journal is written before any data file
exists (a folder killed before that holds nothing of ours but a stale lock
file, which every command accepts), and a pack killed after ``index.json``
but before its clean-up is finished by ``--resume``. A failure (full disk,
I/O error, unreadable or changed source file) closes everything without a
second error and names the command that continues. A pack whose every image
was rejected leaves only ``rejects.jsonl``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import operator
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from packer.appending import finish_meta, merge_field_stats, refuse_plain_resume
from packer.errors import OutputExistsError, PackError
from packer.formats.base import FormatWriter, merged
from packer.formats.fieldstore import is_field_file
from packer.journal import Journal, SideFiles, option_differences
from packer.options import PackOptions
from packer.output import known_names
from packer.sources.source import Source
from packer.prepare.workers import Outcome, PrepareStage
from packer.prepare.workers import prepare as prepare_locally
from readers.contract import spec
from readers.contract.fields import Schema
from readers.contract.locks import LOCK_NAME

__all__ = ["SplitResult", "pack_split", "PackProgress", "VERSION"]

log = logging.getLogger(__name__)

VERSION = "0.1.0"

PackProgress = Callable[[int, int], None]  # (images done incl. rejects, source bytes done)


def _count(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 sample``, ``2 samples`` (``nouns``: an irregular plural)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


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
    repaired: int = 0
    repairs_file: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict, repr=False)
    already_complete: bool = False  # --resume found the pack finished: nothing was packed now
    note: str = ""  # about the layout chosen (which split of which), said in the summary

    def counts(self) -> str:
        """What was packed: ``31 samples, 6 classes``; the classes only where there are classes (a caption
        manifest or COCO pack has none: ``4 samples``)."""
        text = _count(self.images, "sample")
        return text + (f", {_count(self.classes, 'class', 'classes')}" if self.classes else "")

    def summary(self) -> str:
        rate = (self.images - self.resumed_from) / self.seconds if self.seconds else 0.0
        if self.already_complete:
            text = f"{self.split}: already complete, nothing to resume: {self.counts()}, {self.rejected} rejected"
            return text + (f" ({self.note})" if self.note else "") + f" -> {self.out}"
        text = (
            f"{self.split}: {self.counts()}, "
            f"{self.bytes_in / 1e6:.1f} MB in -> {self.bytes_out / 1e6:.1f} MB out, "
            f"{self.seconds:.1f} s ({rate:.0f} img/s), "
            f"{self.rejected} rejected, {self.changed} re-encoded, {self.ignored} non-image files ignored"
        )
        if self.repaired:
            text += f", {self.repaired} repaired (listed in {self.repairs_file})"
        if self.skipped_links:
            text += f", {self.skipped_links} symlinks outside the source skipped"
        if self.resumed_from:
            text += f", resumed after {self.resumed_from} samples"
        if self.note:
            text += f" ({self.note})"
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
    progress: PackProgress | None = None,
    *,
    prepare: PrepareStage = prepare_locally,
    after_checkpoint: Callable[[Journal], None] | None = None,
) -> SplitResult:
    """Pack one split of ``source`` into the dataset folder ``out``.

    ``prepare`` is the prepare stage (default: a local process pool of
    ``workers``); it must yield one outcome per source file, in source order.
    ``after_checkpoint(journal)`` runs after each checkpoint is durable (the
    remote output uploads the shards it lists as closed).
    """
    t0 = time.perf_counter()
    if os.path.lexists(out / spec.INDEX_NAME) and options.resume and not options.append:
        refuse_plain_resume(out)  # an interrupted append is finished by an append, not by this
        return _already_complete(source, out, split, options, time.perf_counter() - t0)
    out.mkdir(parents=True, exist_ok=True)
    identity = Journal.identity_of(split, source, options)
    resumed = Journal.load(out, identity, source) if options.resume else None
    if resumed is None and options.append:  # packer.appending.start seeds it: never a fresh pack over a dataset
        raise PackError(f"{out}: internal error, an append without its journal")
    journal = resumed or Journal(identity)
    resumed_from = journal.next_source
    writer, stage, outcomes = None, None, None
    try:
        if resumed is None:  # before any data file: from now on the folder reads as an unfinished pack
            journal.save(out)
        writer = writer_cls(out, split, options, source.total_bytes, schema=source.schema)
        writer.open(journal.done, journal.writer)
        stage = _WriteStage(source, out, options, writer, journal, progress, after_checkpoint)
        outcomes = prepare(source, resumed_from, options.image_options(want_pixels=writer.pixels), workers)
        meta = stage.run(outcomes)
    except BaseException as exc:
        _abandon(writer, stage)
        if isinstance(exc, OSError):
            raise _io_error(exc, out) from exc
        raise
    finally:
        if outcomes is not None and hasattr(outcomes, "close"):
            outcomes.close()  # a generator: stops the worker pool at once on errors
    return _result(split, out, meta, time.perf_counter() - t0, resumed_from)


def _abandon(writer: FormatWriter | None, stage: _WriteStage | None) -> None:
    """Release everything after an error without raising a second one (a full disk fails every
    flush again); the journal keeps the output resumable."""
    if writer is not None:
        try:
            writer.abort()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            log.debug("writer.abort() failed after an error", exc_info=True)
    if stage is not None:
        stage.files.abandon()


def _disk_full(exc: OSError, out: Path) -> bool:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:  # libraries that lose errno (h5py, numpy's short writes): judge by the space left
        st = os.statvfs(out)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def _io_error(exc: OSError, out: Path) -> PackError:
    if _disk_full(exc, out):
        return PackError(f"disk full while writing {out}; free space and re-run with --resume")
    where = f"{exc.filename}: " if exc.filename else ""
    return PackError(f"I/O error while packing into {out}: {where}{exc.strerror or exc}; re-run with --resume")


def _already_complete(source: Source, out: Path, split: str, options: PackOptions, seconds: float) -> SplitResult:
    """``--resume`` on a finished pack: the same pack, only its clean-up may be missing."""
    meta = spec.read_index(out).meta
    src: dict[str, Any] = meta["source"] if isinstance(meta.get("source"), dict) else {}
    diff = ""
    if meta.get("format") != options.format:
        diff = f"format {meta.get('format')} then, {options.format} now"
    elif meta.get("options") != json.loads(json.dumps(options.recorded())):
        diff = option_differences(meta.get("options") or {}, json.loads(json.dumps(options.recorded())))
    elif src.get("fingerprint") != source.fingerprint():
        diff = f"the source {src.get('root')} then, {source.root} now (or the files in it changed)"
    if diff:
        raise OutputExistsError(f"{out} holds a finished pack made with other settings ({diff}); nothing to "
                                "resume: pass --overwrite to replace it, or choose another output")
    Journal.discard(out)  # interrupted right after the commit
    stats: dict[str, Any] = meta["stats"] if isinstance(meta.get("stats"), dict) else {}
    _cleanup(out, src.get("rejected", 0), stats.get("repaired", 0))
    log.info("%s is already complete; nothing to resume", out)
    return dataclasses.replace(_result(split, out, meta, seconds, 0), already_complete=True)


def _cleanup(out: Path, rejected: int, repaired: int) -> None:
    """After the commit: no empty rejects or repairs file, and the folder's entries durable."""
    for count, name in ((rejected, spec.REJECTS_NAME), (repaired, spec.REPAIRS_NAME)):
        if not count:
            (out / name).unlink(missing_ok=True)
    spec.fsync_dir(out)


class _WriteStage:
    """Consumes prepared outcomes in source order: appends, rejects, checkpoints, finishes."""

    def __init__(self, source: Source, out: Path, options: PackOptions, writer: FormatWriter,
                 journal: Journal, progress: PackProgress | None,
                 after_checkpoint: Callable[[Journal], None] | None = None) -> None:
        self.source, self.out, self.options = source, out, options
        self.writer, self.journal, self.progress = writer, journal, progress
        self.after_checkpoint = after_checkpoint
        self.files = SideFiles(out, journal)
        # A sample's index record, in spec.ARRAY_DTYPES' order, picked from (label, CRC, height, width,
        # size, the writer's locations..., 0): the 0 stands for an array this format does not keep.
        known = ("labels", "checksums", "heights", "widths", "sizes", *writer.location_fields)
        self._record = operator.itemgetter(*(known.index(name) if name in known else len(known)
                                             for name in spec.ARRAY_DTYPES))
        self._locations = len(writer.location_fields)

    def run(self, outcomes: Iterator[Outcome]) -> dict[str, Any]:
        """Write every outcome, then the index; returns the index metadata."""
        for pos, outcome in enumerate(outcomes, start=self.journal.next_source):
            self._take(pos, outcome)
        if self.journal.done == 0:
            self._nothing_packed()
        self.writer.end_samples()
        self.checkpoint(len(self.source.paths))
        self.files.close()
        return self._finish()

    def checkpoint(self, next_source: int) -> None:
        """Writer data durable, then the side files, then the journal (atomically)."""
        self.journal.writer = self.writer.checkpoint()
        self.journal.next_source = next_source
        self.journal.source_prefix = self.source.prefix_fingerprint(next_source)
        self.files.sync(self.journal)
        self.journal.save(self.out)
        if self.after_checkpoint is not None:
            self.after_checkpoint(self.journal)

    def _take(self, pos: int, outcome: Outcome) -> None:
        rel, size = self.source.paths[pos], self.source.sizes[pos]
        self.journal.bytes_in += size
        if outcome.unreadable:
            if self.source.order.get("kind", "source") == "source":  # the files packed so far stay valid
                raise PackError(f"{outcome.problem}; re-run with --resume (after restoring it, or without it)")
            raise PackError(f"{outcome.problem}; restore it and re-run with --resume, or start again with "
                            "--overwrite (a shuffled order changes when a file is missing)")
        if outcome.prepared is None:
            self.journal.rejected += 1
            self.files.add_reject(rel, outcome.problem)
            if self.options.strict:
                raise PackError(f"rejected {self.source.root / rel}: {outcome.problem} "
                                "(--strict stops at the first reject)")
        else:
            self._store(pos, rel, outcome)
        if self.progress is not None:
            self.progress(1, size)

    def _store(self, pos: int, rel: str, outcome: Outcome) -> None:
        prep, label, journal = outcome.prepared, self.source.labels[pos], self.journal
        assert prep is not None
        if outcome.fields is None:
            locations = self.writer.append(journal.done, prep, label)
        else:
            locations = self.writer.append(journal.done, prep, label, outcome.fields)
        if len(locations) != self._locations:
            raise PackError(f"internal error: {type(self.writer).__name__} gave {len(locations)} locations for "
                            f"{self._locations} location fields")
        record = self._record((label, outcome.crc, prep.height, prep.width, prep.nbytes, *locations, 0))
        self.files.add_sample(record, rel)
        if prep.repair:
            journal.repaired += 1
            self.files.add_repair(rel, journal.done, prep.repair)
        journal.changed += bool(prep.changed) and not prep.repair and not self.writer.pixels
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
        if self.options.append:  # the next generation of the dataset (its arrays under new names)
            meta = finish_meta(self.out, meta)
        meta = merged(meta, self.writer.finalize(meta, arrays))
        if self.writer.field_store is not None:  # bytes (and rows or values) per extra field, for info
            meta["field_stats"] = self.writer.field_store.stats
            if self.options.append:
                meta = merge_field_stats(self.out, meta)
        meta[spec.FILES_CRC_KEY] = file_crcs(self.out, meta)
        spec.write_index(self.out, meta, arrays)
        Journal.discard(self.out)
        _cleanup(self.out, self.journal.rejected, self.journal.repaired)
        return meta

    def _nothing_packed(self) -> None:
        """Every image was rejected: leave only the rejects list (no folder that asks to be resumed)."""
        self.files.sync(self.journal)
        self.writer.abort()
        self.files.close()
        keep, known = {spec.REJECTS_NAME, LOCK_NAME}, known_names()
        shard = f"{self.journal.identity['split']}-"
        with os.scandir(self.out) as it:
            entries = list(it)
        for entry in entries:
            if entry.name not in keep and (entry.name in known or is_field_file(entry.name)
                                           or entry.name.startswith(shard)
                                           and entry.name.endswith((".tar", ".tar.tmp"))):
                os.unlink(entry.path)
        spec.fsync_dir(self.out)
        raise PackError(f"every image of {self.source.file or self.source.root} was rejected "
                        f"({self.journal.rejected}, listed in {self.out / spec.REJECTS_NAME}); nothing was packed "
                        "(the same command again replaces that list)")

    def _meta(self, recs: np.ndarray) -> dict[str, Any]:
        source, journal, pixels = self.source, self.journal, self.writer.pixels
        schema = source.schema if source.schema is not None else Schema.default(source.classes)
        label = schema.labels_field
        if label is not None and label.classes != dict(enumerate(source.classes)):  # index.json's classes name it
            schema = Schema(tuple(dataclasses.replace(f, classes=dict(enumerate(source.classes))) if f is label else f
                                  for f in schema.fields))
        counts = {} if schema.labels_field is None else {  # a schema without a label: labels.npy holds zeros
            "class_counts": np.bincount(recs["labels"], minlength=len(source.classes)).tolist()}
        meta = {
            **counts,
            "format": self.options.format,
            "fields": schema.to_json()["fields"],
            "split": journal.identity["split"],
            "num_samples": journal.done,
            "classes": source.classes,
            "storage": {
                "kind": "pixels" if pixels else "encoded",
                "encodings": dict(sorted(journal.encodings.items())),
                "pixel_layout": "HWC uint8 RGB" if pixels else None,
            },
            "options": self.options.recorded(),
            "order": source.order,
            "source": {
                **source.describe(),
                "images_found": len(source.paths),
                "rejected": journal.rejected,
                "ignored_files": len(source.ignored),
                "skipped_symlinks": len(source.skipped_links),
                "fingerprint": source.fingerprint(),
            },
            "stats": {"bytes_in": journal.bytes_in, "bytes_out": int(recs["sizes"].sum()),
                      "reencoded": journal.changed, "repaired": journal.repaired},
            "created_by": f"dataset-packer {VERSION}",
        }
        meta["spec_version"] = spec.spec_version_for(meta)  # 1 for image + label, 2 for any other schema
        return meta


def file_crcs(out: Path, meta: dict[str, Any]) -> dict[str, int]:
    """CRC-32 of each data file in ``meta["files"]`` (so downloads can be verified): wds shards'
    from the writer, which computed them while writing; other files read once, mapped (the pack's
    own files, under its lock)."""
    known = {s["name"]: int(s["crc32"]) for s in meta.get("shards", [])}
    return {name: known[name] if name in known else spec.file_checksum(out / name, mapped=True)
            for name in meta.get("files", {})}


def _result(split: str, out: Path, meta: dict[str, Any], seconds: float, resumed_from: int) -> SplitResult:
    src = meta["source"]
    rejects, repairs = out / spec.REJECTS_NAME, out / spec.REPAIRS_NAME
    return SplitResult(
        split=split, out=out, images=meta["num_samples"], classes=len(meta["classes"]),
        rejected=src["rejected"], changed=meta["stats"]["reencoded"], ignored=src["ignored_files"],
        skipped_links=src["skipped_symlinks"], bytes_in=meta["stats"]["bytes_in"],
        bytes_out=sum(meta.get("files", {}).values()) or meta["stats"]["bytes_out"], seconds=seconds,
        resumed_from=resumed_from, rejects_file=rejects if rejects.exists() else None,
        repaired=meta["stats"].get("repaired", 0), repairs_file=repairs if repairs.exists() else None, meta=meta,
    )
