"""The prepare stage: read, validate and normalize each source file, in worker processes
(``packer.prepare.pool``; with one worker, in a thread of the writer's process).

:func:`prepare` turns a source (from a position on) into an iterator of
:class:`Outcome`, one per source file **in source order**, whatever the
number of workers; the write stage (``packer.pipeline``) consumes it. Any
other engine (a Ray cluster, say) can stand in for this module by yielding
the same outcomes in the same order: the output does not depend on who
prepared the samples.
"""

from __future__ import annotations

import errno
import os
import stat
from functools import partial
from pathlib import Path
from typing import Callable, Generator, Iterator, NamedTuple, Sequence

import numpy as np

from packer.errors import PackError
from packer.prepare.images import ImageOptions, Prepared, RejectedImage, check_file_size, prepare_image
from packer.prepare.pool import ordered_map
from packer.prepare.readahead import read_ahead
from packer.sources.source import Source
from readers.contract import spec

__all__ = ["Outcome", "PrepareStage", "prepare", "outcome_of", "outcome_bytes", "read_source"]


class Outcome(NamedTuple):
    """What the prepare stage made of one source file."""

    prepared: Prepared | None  # what to store; None when the file was rejected or unreadable
    crc: int = 0  # CRC-32 of what is stored (encoded bytes, or pixels in pixels mode)
    problem: str = ""  # why it was rejected (one line), or the read error naming the file
    unreadable: bool = False  # True: ``problem`` is a read error, which stops the pack (resumable)
    #: the encoded blobs of the source schema's extra fields (``Schema.extra_fields``, in order); None: none
    fields: tuple[bytes, ...] | None = None


#: (source, first source position, image options, worker count) -> outcomes from that position on
PrepareStage = Callable[[Source, int, ImageOptions, int], Iterator[Outcome]]

def read_source(path: Path, opts: ImageOptions | None = None) -> bytes:
    """The bytes of a source image; it must be a regular file (a FIFO would block, a device never end).
    Raises OSError naming ``path``; with ``opts``, RejectedImage for a file too large to read
    (``packer.prepare.images.check_file_size``: a sparse 4 GB .jpg is not read into memory)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO must not block open
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (it was one when the source was scanned)", str(path))
        if opts is not None:
            check_file_size(st.st_size, opts)
        # One plain read of the size fstat gives, plus one byte (no file object: ~15 us less per image).
        # Any other length means the file grew, shrank or the read was short: read on to EOF.
        # O_NONBLOCK does nothing to a regular file's reads.
        parts = [os.read(fd, st.st_size + 1)]
        if len(parts[0]) != st.st_size:
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
        return b"".join(parts)  # a single bytes object comes back as it is, not copied
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    finally:
        os.close(fd)


def _prepare_one(root: Path, opts: ImageOptions, send_originals: bool, rel: str) -> Outcome:
    """Runs in a pool worker (or in a thread of the main process when there is one worker).

    In a pool (``send_originals=False``), an image stored unchanged comes back without its
    bytes (``data=None``): the main process re-reads the file from the page cache, which
    costs far less than pickling ~100 KB through a pipe.
    """
    try:
        data = read_source(root / rel, opts)
    except RejectedImage as exc:
        return Outcome(None, problem=str(exc))
    except OSError as exc:
        return Outcome(None, problem=f"{root / rel}: read error: {exc.strerror or exc}", unreadable=True)
    outcome = outcome_of(data, opts)
    prep = outcome.prepared
    if prep is not None and prep.pixels is None and not prep.changed and not send_originals:
        prep.data = None  # type: ignore[assignment]
    return outcome


def outcome_of(data: bytes, opts: ImageOptions) -> Outcome:
    """Validate and normalize one image's bytes: its outcome (the stored data or pixels and their
    CRC-32, or why it was rejected). Every prepare stage (local pool, imports, Ray tasks) uses it."""
    try:
        prep = prepare_image(data, opts)
    except RejectedImage as exc:
        return Outcome(None, problem=str(exc) or type(exc).__name__)
    if prep.pixels is not None:
        prep.pixels = np.ascontiguousarray(prep.pixels, dtype=np.uint8)
        return Outcome(prep, spec.checksum(prep.pixels))
    prep.crc = spec.checksum(prep.data)
    return Outcome(prep, prep.crc)


def outcome_bytes(outcome: Outcome) -> int:
    """The bytes an outcome holds in memory (a pool's windows weigh results with it; an unchanged
    image a worker sent back without its bytes holds none)."""
    prep = outcome.prepared
    return 0 if prep is None or (prep.pixels is None and prep.data is None) else prep.nbytes


def prepared_outcomes(root: Path, paths: Sequence[str], opts: ImageOptions,
                      workers: int) -> Generator[Outcome, None, None]:
    if workers <= 1:
        # One thread prepares while this one writes: the writer's commits, writes and fsyncs release
        # the GIL, and the source is read in those gaps (wds without validation, 5,000 JPEGs, warm:
        # 14-15k -> 19k images/s).
        yield from read_ahead(map(partial(_prepare_one, root, opts, True), paths), outcome_bytes,
                              name="pack-prepare")
        return
    yield from ordered_map(partial(_prepare_one, root, opts, False), paths, workers,
                           result_weight=outcome_bytes, describe=lambda n: str(root / paths[n]))


def _reread(path: Path, size: int, crc: int) -> bytes:
    """The original bytes of an image a worker checked and left unchanged: the very bytes it checked
    (same CRC-32), or PackError as for a file that changed while it was packed."""
    try:
        data = read_source(path)
    except OSError as exc:
        raise PackError(f"{path}: read error: {exc.strerror or exc}; fix it and re-run with --resume") from None
    if len(data) != size or spec.checksum(data) != crc:
        change = f"{size} -> {len(data)} bytes" if len(data) != size else "same size, other bytes"
        raise PackError(f"{path} changed while it was being packed ({change}); "
                        "re-run with --resume once the source is stable")
    return data


def prepare(source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
    """Outcomes for ``source.paths[start:]``, in order, every prepared sample with its data.

    Closing the iterator early stops the worker pool at once.
    """
    if not opts.validate and opts.max_side is None and not opts.want_pixels:
        # Nothing to decode: each image costs a header read, less than shipping its
        # result between processes (measured: 1 process 0.36-0.44x raw copy speed,
        # a 2-worker pool 0.29-0.35x). The writer's process does it all, in two threads.
        workers = 1
    outcomes = prepared_outcomes(source.root, source.paths[start:], opts, workers)
    try:
        for pos, outcome in enumerate(outcomes, start=start):
            if outcome.prepared is not None and outcome.prepared.data is None:
                outcome.prepared.data = _reread(source.root / source.paths[pos], source.sizes[pos], outcome.crc)
            yield outcome
    finally:
        outcomes.close()
