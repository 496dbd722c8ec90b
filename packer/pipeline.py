"""The packing pipeline: one split, any format.

Source files are prepared (read, validated, normalized) in ``workers``
processes, in source order, and appended by one format writer in this
process, so the output does not depend on the worker count.

Crash safety. While packing, the output folder holds ``pack-state.json``
(the journal) and no ``index.json``, so no reader takes it for a dataset.
At every checkpoint the writer makes its data durable first; then the
per-sample records, names and rejects files are fsynced; then the journal
is replaced atomically. ``--resume`` truncates everything back to the
journal and carries on from there. The index is written last.
"""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from packer.images import ImageOptions, Prepared, RejectedImage, prepare_image
from packer.options import PackOptions
from packer.source import Source
from readers import spec

__all__ = ["PackError", "OutputError", "OutputExistsError", "SplitResult", "pack_split", "prepare_output", "RECORD_DTYPE"]

log = logging.getLogger(__name__)

#: One fixed-width record per written sample, appended to ``records.bin``
#: during packing and turned into the index arrays at the end.
RECORD_DTYPE = np.dtype(
    [("labels", "<i4"), ("checksums", "<u4"), ("sizes", "<i8"), ("offsets", "<i8"),
     ("shards", "<i4"), ("heights", "<i4"), ("widths", "<i4")]
)
RECORDS_NAME = "records.bin"
REJECTS_NAME = "rejects.jsonl"
VERSION = "0.1.0"

Progress = Callable[[int, int], None]  # (images done incl. rejects, source bytes done)


class PackError(RuntimeError):
    """Packing failed part-way; the message names the cause and what to do."""


class OutputError(PackError):
    """The output path cannot be used (a usage error: nothing was written)."""


class OutputExistsError(OutputError):
    """The output exists and neither overwrite nor resume was asked for."""


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


# ---------------------------------------------------------------- workers
_WORKER_OPTS: ImageOptions | None = None
_WORKER_ROOT: Path | None = None
_WORKER_SEND_ORIGINALS = True


def _init_worker(root: Path, opts: ImageOptions, send_originals: bool = True) -> None:
    global _WORKER_OPTS, _WORKER_ROOT, _WORKER_SEND_ORIGINALS
    _WORKER_ROOT, _WORKER_OPTS, _WORKER_SEND_ORIGINALS = root, opts, send_originals
    if not send_originals:  # a pool worker: Ctrl-C is the main process's to handle
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare_one(rel: str) -> tuple[str, Any, int]:
    """Runs in a worker: ('ok', Prepared, crc) | ('reject', reason, 0) | ('ioerror', msg, 0).

    In a pool, an image stored unchanged comes back without its bytes
    (``data=None``): the writer re-reads the file from the page cache, which
    costs far less than pickling ~100 KB through a pipe.
    """
    assert _WORKER_ROOT is not None and _WORKER_OPTS is not None
    try:
        with open(_WORKER_ROOT / rel, "rb") as f:
            data = f.read()
    except OSError as exc:
        return "ioerror", f"{_WORKER_ROOT / rel}: read error: {exc.strerror or exc}", 0
    try:
        prep = prepare_image(data, _WORKER_OPTS)
    except RejectedImage as exc:
        return "reject", str(exc) or type(exc).__name__, 0
    if prep.pixels is not None:
        prep.pixels = np.ascontiguousarray(prep.pixels, dtype=np.uint8)
        return "ok", prep, spec.checksum(prep.pixels)
    crc = spec.checksum(prep.data)
    if not prep.changed and not _WORKER_SEND_ORIGINALS:
        prep.data = None  # type: ignore[assignment]
    return "ok", prep, crc


def _prepared(root: Path, paths: list[str], opts: ImageOptions, workers: int) -> Iterator[tuple[str, Any, int]]:
    if workers <= 1:
        _init_worker(root, opts)
        yield from map(_prepare_one, paths)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(root, opts, False)) as pool:
        yield from pool.imap(_prepare_one, paths, chunksize=16)


def _reread(path: Path, size: int) -> bytes:
    """The original bytes of an image a worker checked and left unchanged."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != size:
        raise PackError(f"{path} changed while it was being packed ({size} -> {len(data)} bytes); "
                        "re-run with --resume once the source is stable")
    return data


# ---------------------------------------------------------------- output folder
def _is_dataset(path: Path) -> bool:
    """A folder written by pack-dataset: a parseable index or journal of ours."""
    for name in (spec.INDEX_NAME, spec.STATE_NAME):
        try:
            meta = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("format") in spec.FORMATS and (
                "spec_version" in meta or "fingerprint" in meta):
            return True
    return False


def _looks_like_ours(path: Path) -> bool:
    """``path`` holds only what pack-dataset wrote: one dataset, or split datasets."""
    if _is_dataset(path):
        return True
    subdirs = [p for p in path.iterdir()]
    return bool(subdirs) and all(p.is_dir() and _is_dataset(p) for p in subdirs)


def prepare_output(out: Path, options: PackOptions) -> None:
    """Check (before anything is written) that ``out`` may be written; clear it on overwrite."""
    if not out.exists():
        if not out.parent.exists():
            raise OutputError(f"{out.parent}: the output's parent folder does not exist")
        return
    if not out.is_dir():
        raise OutputError(f"{out} exists and is a file; choose another output path")
    if not any(out.iterdir()):
        return
    if options.resume:
        return
    if not options.overwrite:
        raise OutputExistsError(
            f"{out} already exists; pass --overwrite to replace it or --resume to finish an interrupted pack"
        )
    if not _looks_like_ours(out):
        raise OutputExistsError(
            f"{out} is not empty and holds no dataset written by pack-dataset; refusing to delete it "
            "with --overwrite (choose an empty or new output folder)"
        )
    shutil.rmtree(out)


# ---------------------------------------------------------------- journal
def _file_len(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _truncate(path: Path, length: int) -> None:
    with open(path, "ab") as f:
        f.truncate(length)


def _fsync_file(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())


def _read_journal(out: Path, source: Source, options: PackOptions) -> dict[str, Any] | None:
    path = out / spec.STATE_NAME
    if not path.exists():
        if any(out.iterdir()):
            raise PackError(f"{out}: nothing to resume (no {spec.STATE_NAME} journal); use --overwrite")
        return None
    state = json.loads(path.read_text(encoding="utf-8"))
    if state["options"] != json.loads(json.dumps(options.recorded())):
        raise PackError(
            f"{out}: the interrupted pack used other options ({state['options']}); "
            "resume with the same options, or start again with --overwrite"
        )
    if state["fingerprint"] != source.fingerprint():
        raise PackError(f"{out}: the source folder changed since the interrupted pack; start again with --overwrite")
    return state


# ---------------------------------------------------------------- the pipeline
def pack_split(
    source: Source,
    out: Path,
    split: str,
    options: PackOptions,
    writer_cls: type,
    workers: int,
    progress: Progress | None = None,
) -> SplitResult:
    """Pack one split of ``source`` into the dataset folder ``out``."""
    t0 = time.perf_counter()
    if (out / spec.INDEX_NAME).exists() and options.resume:
        meta = spec.read_index(out).meta
        for leftover in (RECORDS_NAME, spec.STATE_NAME):  # interrupted right after the commit
            (out / leftover).unlink(missing_ok=True)
        log.info("%s is already complete; nothing to resume", out)
        return _result(split, out, meta, time.perf_counter() - t0, 0)
    out.mkdir(parents=True, exist_ok=True)
    state = _read_journal(out, source, options) if options.resume else None
    done = state["done"] if state else 0
    next_source = state["next_source"] if state else 0
    bytes_in = state["bytes_in"] if state else 0
    changed = state["changed"] if state else 0
    encodings: dict[str, int] = dict(state["encodings"]) if state else {}
    rejected = state["rejected"] if state else 0

    records_path, names_path, rejects_path = out / RECORDS_NAME, out / spec.NAMES_FILE, out / REJECTS_NAME
    for path, key in ((records_path, "records_len"), (names_path, "names_len"), (rejects_path, "rejects_len")):
        _truncate(path, state[key] if state else 0)

    writer = writer_cls(out, split, options, source.total_bytes)
    writer.open(done, state["writer"] if state else None)
    image_opts = ImageOptions(
        validate=options.validate, max_side=options.max_side, quality=options.quality,
        resize=options.resize, want_pixels=writer.pixels, max_pixels=options.max_pixels,
    )
    records = open(records_path, "ab")
    names = open(names_path, "ab")
    rejects = open(rejects_path, "ab")
    pending: list[tuple] = []

    def checkpoint(next_pos: int) -> None:
        writer_state = writer.checkpoint()
        if pending:
            records.write(np.array(pending, dtype=RECORD_DTYPE).tobytes())
            pending.clear()
        for f in (records, names, rejects):
            _fsync_file(f)
        spec.write_json_atomic(out / spec.STATE_NAME, {
            "format": options.format, "split": split, "options": options.recorded(),
            "fingerprint": source.fingerprint(), "done": done, "next_source": next_pos,
            "bytes_in": bytes_in, "changed": changed, "rejected": rejected, "encodings": encodings,
            "records_len": records.tell(), "names_len": names.tell(), "rejects_len": rejects.tell(),
            "writer": writer_state,
        })

    if state is None:
        checkpoint(0)  # the journal exists from the first moment: the folder reads as unfinished
    results = None
    try:
        if not options.validate and options.max_side is None and not writer.pixels:
            # Nothing to decode: each image costs a header read, less than shipping its
            # result between processes (measured: 1 process 0.36-0.44x raw copy speed,
            # a 2-worker pool 0.29-0.35x). The writer's process does it all.
            workers = 1
        results = _prepared(source.root, source.paths[next_source:], image_opts, workers)
        for pos, (status, value, crc) in enumerate(results, start=next_source):
            rel, label = source.paths[pos], source.labels[pos]
            bytes_in += source.sizes[pos]
            if status == "ioerror":
                raise PackError(f"{value}; fix it and re-run with --resume")
            if status == "reject":
                rejected += 1
                rejects.write((json.dumps({"path": rel, "reason": value}) + "\n").encode())
                if options.strict:
                    raise PackError(f"rejected {source.root / rel}: {value} (--strict stops at the first reject)")
            else:
                prep: Prepared = value
                if prep.data is None:
                    prep.data = _reread(source.root / rel, source.sizes[pos])
                fields = writer.write(done, prep, label)
                size = prep.pixels.nbytes if prep.pixels is not None else len(prep.data)
                pending.append((label, crc, size, fields.get("offsets", 0), fields.get("shards", 0),
                                prep.height, prep.width))
                names.write((json.dumps(rel) + "\n").encode())  # ASCII escapes: any file name round-trips
                changed += bool(prep.changed) and not writer.pixels
                encodings[prep.ext] = encodings.get(prep.ext, 0) + 1
                done += 1
                if writer.ready():
                    checkpoint(pos + 1)
            if progress is not None:
                progress(1, source.sizes[pos])
        if done == 0:
            raise PackError(f"{source.root}: every image was rejected; see {rejects_path}")
        writer.seal()
        checkpoint(len(source.paths))
        records.close(), names.close(), rejects.close()
        meta = _finish(out, split, source, options, writer, done, rejected, changed, encodings, bytes_in)
    except OSError as exc:
        writer.abort()
        if exc.errno == errno.ENOSPC:
            raise PackError(f"disk full while writing {out}; free space and re-run with --resume") from exc
        raise PackError(f"I/O error while packing into {out}: {exc}; re-run with --resume") from exc
    except BaseException:
        writer.abort()
        raise
    finally:
        if results is not None:
            results.close()  # stops the worker pool at once on errors
        for f in (records, names, rejects):
            if not f.closed:
                f.close()
    return _result(split, out, meta, time.perf_counter() - t0, next_source)


def _finish(out: Path, split: str, source: Source, options: PackOptions, writer: Any, done: int,
            rejected: int, changed: int, encodings: dict[str, int], bytes_in: int) -> dict[str, Any]:
    recs = np.fromfile(out / RECORDS_NAME, dtype=RECORD_DTYPE)
    if len(recs) != done:
        raise PackError(f"{out}: internal error, {len(recs)} records for {done} samples")
    arrays = {name: recs[name] for name in spec.REQUIRED_ARRAYS[options.format]}
    meta: dict[str, Any] = {
        "format": options.format,
        "split": split,
        "num_samples": done,
        "classes": source.classes,
        "class_counts": np.bincount(recs["labels"], minlength=len(source.classes)).tolist(),
        "storage": {
            "kind": "pixels" if writer.pixels else "encoded",
            "encodings": dict(sorted(encodings.items())),
            "pixel_layout": "HWC uint8 RGB" if writer.pixels else None,
        },
        "options": options.recorded(),
        "source": {
            "root": str(source.root.resolve()),
            "images_found": len(source.paths),
            "rejected": rejected,
            "ignored_files": len(source.ignored),
            "skipped_symlinks": len(source.skipped_links),
            "fingerprint": source.fingerprint(),
        },
        "stats": {"bytes_in": bytes_in, "bytes_out": int(recs["sizes"].sum()), "reencoded": changed},
        "created_by": f"dataset-packer {VERSION}",
    }
    meta.update(writer.close(meta, arrays))
    spec.write_index(out, meta, arrays)
    (out / RECORDS_NAME).unlink()
    (out / spec.STATE_NAME).unlink()
    if rejected == 0:
        (out / REJECTS_NAME).unlink(missing_ok=True)
    spec.fsync_dir(out)
    return meta


def _result(split: str, out: Path, meta: dict[str, Any], seconds: float, resumed_from: int) -> SplitResult:
    src = meta["source"]
    rejects = out / REJECTS_NAME
    return SplitResult(
        split=split, out=out, images=meta["num_samples"], classes=len(meta["classes"]),
        rejected=src["rejected"], changed=meta["stats"]["reencoded"], ignored=src["ignored_files"],
        skipped_links=src["skipped_symlinks"], bytes_in=meta["stats"]["bytes_in"],
        bytes_out=sum(meta.get("files", {}).values()) or meta["stats"]["bytes_out"], seconds=seconds,
        resumed_from=resumed_from, rejects_file=rejects if rejects.exists() else None, meta=meta,
    )
