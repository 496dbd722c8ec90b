"""What an engine's tasks compute, as plain functions (no Ray here: testable in one process).

* :func:`plan_chunks` cuts the source list into contiguous chunks. The cut
  depends on the file sizes and the options only, never on the cluster.
* :func:`prepare_files` is the prepare stage for one chunk: the same
  per-image work and the same :class:`~packer.prepare.workers.Outcome` as the local
  process pool. With ``detach`` the stored bytes come back separately, in one
  buffer, so that they can stay on the node that made them (wds).
* :func:`write_tar` writes one WebDataset shard from such buffers, byte for
  byte as :class:`~packer.formats.wds.WdsWriter` would (same layout function).
* :func:`file_crc` reads a finished file back for resume's check.
* :func:`prepare_in_pool` is the local engine's prepare stage for a source
  read through ``Source.files`` (an ``s3://`` folder): chunks of
  :func:`prepare_files` in a local process pool.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from packer.engines.io import LocalFiles, LocalOutput
from packer.formats.wds import END_OF_ARCHIVE, sample_tar
from packer.prepare.images import ImageOptions, RejectedImage, check_file_size
from packer.prepare.pool import ordered_map
from packer.prepare.workers import Outcome, outcome_bytes, outcome_of
from readers.contract import spec

__all__ = ["prepare_in_pool", "plan_chunks", "prepare_file", "prepare_files", "PreparedChunk", "ShardPart", "write_tar", "file_crc"]


def plan_chunks(sizes: Sequence[int], start: int, images: int, max_bytes: int) -> list[tuple[int, int]]:
    """Contiguous ``[a, b)`` ranges of source positions covering ``start`` to the end.

    Chunks are laid from position 0 -- each ends after ``images`` files or once
    it holds ``max_bytes`` of source, whichever comes first (a single larger
    file is a chunk of its own) -- and the first one is clipped at ``start``, so
    a resumed pack cuts the rest of the list exactly as the first run did.
    """
    chunks: list[tuple[int, int]] = []
    a, nbytes = 0, 0
    for pos, size in enumerate(sizes):
        nbytes += size
        if pos + 1 - a >= images or nbytes >= max_bytes:
            chunks.append((a, pos + 1))
            a, nbytes = pos + 1, 0
    if a < len(sizes):
        chunks.append((a, len(sizes)))
    return [(max(a, start), b) for a, b in chunks if b > start]


def prepare_file(files: LocalFiles, rel: str, opts: ImageOptions, size: int | None = None) -> Outcome:
    """Read, validate and normalize one source file, as a local pool worker does. ``size``: its size as
    the scan found it (an object store's listing): over the byte budget, it is rejected unread."""
    try:
        if size is not None:
            check_file_size(size, opts)
        data = files.read(rel)
    except RejectedImage as exc:
        return Outcome(None, problem=str(exc))
    except OSError as exc:
        return Outcome(None, problem=f"{files.where(rel)}: read error: {exc.strerror or exc}", unreadable=True)
    return outcome_of(data, opts)


class PreparedChunk(NamedTuple):
    """A chunk's outcomes, in order, and (``detach``) where each sample's bytes sit in ``payload``."""

    outcomes: list[Outcome]
    spans: list[tuple[int, int]]  # (start, length) in payload per outcome; (0, 0) when not detached
    payload: np.ndarray | None  # uint8: the detached stored bytes back to back
    nbytes: int  # bytes stored (encoded bytes or pixels) by this chunk


def prepare_files(files: LocalFiles, rels: Sequence[str], opts: ImageOptions, *, detach: bool,
                  sizes: Sequence[int] | None = None) -> PreparedChunk:
    """The outcomes of ``rels`` in order (``sizes``: theirs, as scanned; see :func:`prepare_file`).
    ``detach``: each stored byte string moves into ``payload`` and its outcome keeps ``data=b""``
    (pixels are never detached)."""
    known = sizes if sizes is not None else [None] * len(rels)
    outcomes = [prepare_file(files, rel, opts, size) for rel, size in zip(rels, known, strict=True)]
    stored = [o.prepared for o in outcomes if o.prepared is not None]
    nbytes = sum(p.nbytes for p in stored)
    if not detach:
        return PreparedChunk(outcomes, [], None, nbytes)
    spans, pieces, pos = [], [], 0
    for o in outcomes:
        if o.prepared is None or o.prepared.pixels is not None:
            spans.append((0, 0))
            continue
        data, o.prepared.data = o.prepared.data, b""
        spans.append((pos, len(data)))
        pieces.append(data)
        pos += len(data)
    payload = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return PreparedChunk(outcomes, spans, payload, nbytes)


class ShardPart(NamedTuple):
    """One sample of a shard to write: its bytes are ``payloads[payload][start:start + size]``."""

    payload: int
    start: int
    size: int
    sample_no: int
    ext: str
    label: int


def write_tar(output: LocalOutput, name: str, parts: Sequence[ShardPart],
              payloads: Sequence[np.ndarray]) -> dict[str, Any]:
    """Write shard ``name`` (temp file, fsync, ``output.put``); return its index record.

    Idempotent: the same parts give the same bytes, and the file appears whole
    or not at all, so a retried or repeated task is harmless.
    """
    tmp = output.temp_path(name)
    crc = pos = 0
    try:
        with open(tmp, "wb", buffering=1 << 20) as f:
            for part in parts:
                data = payloads[part.payload][part.start:part.start + part.size].data  # uint8: its memoryview
                before, after = sample_tar(part.sample_no, part.ext, part.size, part.label)
                for piece in (before, data, after):
                    f.write(piece)
                    crc = spec.checksum(piece, crc)
                    pos += len(piece)
            f.write(END_OF_ARCHIVE)
            crc = spec.checksum(END_OF_ARCHIVE, crc)
            pos += len(END_OF_ARCHIVE)
            f.flush()
            os.fsync(f.fileno())
        output.put(tmp, name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"name": name, "samples": len(parts), "bytes": pos, "crc32": crc, "first": parts[0].sample_no}


def file_crc(output: LocalOutput, name: str) -> tuple[int, int] | None:
    """(CRC-32, size) of finished file ``name``; None when it is missing."""
    crc = size = 0
    try:
        with output.open_read(name) as f:
            while chunk := f.read(8 << 20):
                crc = spec.checksum(chunk, crc)
                size += len(chunk)
    except FileNotFoundError:
        return None
    return crc, size


def prepare_in_pool(files: Any, source: Any, start: int, opts: ImageOptions, workers: int,
                    chunk: int = 16) -> Iterator[Outcome]:
    """Outcomes of ``source.paths[start:]`` in order, read through ``files`` by ``workers`` processes
    (``packer.prepare.pool``; stores rebuild their client after the fork). An object whose listed size
    (``source.sizes``) is over the byte budget is rejected without a GET.

    Closing the iterator early stops the pool at once.
    """
    rels = source.paths[start:]
    sizes = source.sizes[start:]
    yield from ordered_map(lambda n: prepare_file(files, rels[n], opts, sizes[n]), range(len(rels)), workers,
                           chunk=chunk, result_weight=outcome_bytes, describe=lambda n: files.where(rels[n]))
