"""``pack-dataset convert IN -f FORMAT -o OUT``: a packed dataset into another format.

The source is a packed dataset (read through ``readers``), not an image
folder, so nothing is validated again; instead every sample's stored bytes
are checked against the CRC-32 in the source index as they are copied, and
a mismatch stops the conversion (exit 1) naming the sample. The write stage
is packing's (:func:`packer.pipeline.pack_split` with a substitute prepare
stage), so a conversion is deterministic, resumable with ``--resume``,
journaled, and commits ``index.json`` last, exactly like a pack.

What a sample becomes:

* encoded (wds, lmdb, hdf5) -> encoded: the stored bytes, unchanged, in this
  process (no decoding: a copy with a checksum);
* encoded -> mmap: decoded to RGB pixels (``--resize``: shorter side to N,
  center crop), in worker processes;
* mmap -> encoded: the pixels as a lossless PNG, in worker processes;
* mmap -> mmap: the pixels (resized if ``--resize`` asks for another size).

Sample order, labels, class names and ``names.jsonl`` are the source's.
``names.jsonl`` is streamed, never held (a list of 1.28M names took 658 MB):
checked line by line before anything is written (a line that is not a JSON
string, or a line count that is not the sample count, is one
:class:`~packer.errors.SourceError` naming ``names.jsonl:LINE``), then read
again as the samples are written. Labels and sizes are read from the index
arrays as they are needed, not copied into lists.
"""

from __future__ import annotations

import hashlib
import io
import logging
import mmap
import os
from collections.abc import Generator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, overload

import numpy as np

from packer.sources.columns import IntColumn
from packer.errors import OutputError, PackError, SourceError
from packer.prepare.images import ImageOptions, Prepared, RejectedImage, prepare_image
from packer.prepare.stage import ordered_outcomes
from packer.prepare.readahead import read_ahead
from packer.options import PackOptions, cli_fields
from packer.output import OutputLock, prepare_output
from packer.pipeline import PackProgress, SplitResult, pack_split
from packer.sources.source import Source
from packer.prepare.workers import Outcome
from readers.contract import spec
from readers.contract.fields import Schema
from readers.contract.locks import lock_holder

__all__ = ["convert", "dataset_source", "close_source", "conversion_options"]

log = logging.getLogger(__name__)

_BATCH = 64  # samples read per call (one LMDB transaction)
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def conversion_options(source_options: dict[str, Any], given: PackOptions) -> PackOptions:
    """The options of the converted dataset: what ``convert`` takes from ``given`` (format, shards,
    resize, checkpoints, workers, overwrite/resume), the image options the source was packed with."""
    own = {f.name for f, _ in cli_fields("convert")}
    kept = {k: v for k, v in source_options.items()
            if k not in own and k in PackOptions.__dataclass_fields__}
    return replace(given, **kept)


def dataset_source(index: spec.Index) -> Source:
    """A :class:`Source` whose samples are the packed dataset's, in its order.

    Its ``paths`` are a :class:`_Names` (read from ``names.jsonl`` on demand), its labels and sizes
    views of the index arrays: memory independent of the sample count. ``names.jsonl`` is checked
    first, in one streaming pass. Close it with :func:`close_source`.
    """
    meta, arrays = index.meta, index.arrays
    h = hashlib.sha256(meta["format"].encode())
    for name in ("labels", "sizes", "checksums"):
        h.update(np.ascontiguousarray(index.labels if name == "labels" else arrays[name]).data)  # the buffer
    details = {"dataset_format": meta["format"], "num_samples": index.num_samples,
               "original_source": meta.get("source", {}), "original_stats": meta.get("stats", {})}
    for _ in _read_names(index):  # every line a JSON string, one per sample: refused before any output
        pass
    schema = Schema.from_index(meta, str(index.location))
    return Source(root=Path(index.root), classes=index.classes, paths=_Names(index),  # a local folder
                  labels=IntColumn(index.labels), sizes=IntColumn(arrays["sizes"]),
                  kind="dataset", details=details, _fingerprint=h.hexdigest(),
                  order=meta.get("order") or {"kind": "source"},  # the samples keep the dataset's order
                  schema=None if schema.is_default else schema)


def close_source(source: Source) -> None:
    """Close the ``names.jsonl`` readers a :func:`dataset_source` opened (idempotent)."""
    if isinstance(source.paths, _Names):
        source.paths.close()


def _read_names(index: spec.Index) -> Generator[str, None, None]:
    """Each sample's name from ``names.jsonl``, in order: SourceError (one line, ``file:line``) for a
    line that is not a JSON string and for a line count that is not the index's sample count
    (checked by ``spec.Index.names``)."""
    lines = index.names()
    try:
        while True:
            try:
                name = next(lines)
            except StopIteration:
                return
            except spec.DatasetFormatError as exc:
                raise SourceError(str(exc)) from None
            yield name
    finally:
        lines.close()  # closes names.jsonl now, not when the generator is collected


@dataclass
class _Reader:
    """A forward-only reader of ``names.jsonl``: the position of its next name, and the last name read."""

    lines: Generator[str, None, None]
    next: int = 0
    last: str | None = None


class _Names(Sequence[str]):
    """``names.jsonl`` as a read-only sequence, read as it is asked for: memory independent of N.

    The write stage asks for ``names[pos]`` in increasing ``pos`` (twice for the same one) and
    the journal for growing slices ``names[a:b]`` (each a view of names ``a`` to ``b``, read as it
    is iterated); each kind has its own forward-only reader, shared by the slices, restarted from
    the top only when asked to go back. Iterating the whole sequence reads with a reader of its own.
    """

    def __init__(self, index: spec.Index, start: int = 0, stop: int | None = None,
                 readers: dict[str, _Reader] | None = None) -> None:
        self._index, self._start = index, start
        self._stop = index.num_samples if stop is None else stop
        self._whole = readers is None  # not a slice
        self._readers: dict[str, _Reader] = {} if readers is None else readers  # kind -> its reader

    def __len__(self) -> int:
        return self._stop - self._start

    def _at(self, kind: str, pos: int) -> str:
        """Name number ``pos`` of the file, read by the reader of ``kind``."""
        reader = self._readers.get(kind)
        if reader is None or reader.next > pos + (reader.last is not None):
            if reader is not None:
                reader.lines.close()
            reader = self._readers[kind] = _Reader(_read_names(self._index))
        if reader.next == pos + 1 and reader.last is not None:
            return reader.last
        while True:  # reader.next <= pos here
            name = reader.last = next(reader.lines)
            reader.next += 1
            if reader.next > pos:
                return name

    @overload
    def __getitem__(self, key: int) -> str: ...

    @overload
    def __getitem__(self, key: slice) -> _Names: ...

    def __getitem__(self, key: int | slice) -> str | _Names:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError("names.jsonl is read in order: no slice step")
            return _Names(self._index, self._start + start, self._start + max(start, stop), self._readers)
        pos = key + len(self) if key < 0 else key
        if not 0 <= pos < len(self):
            raise IndexError(key)
        return self._at("item", self._start + pos)

    def __iter__(self) -> Iterator[str]:
        if self._whole:
            return _read_names(self._index)
        return (self._at("slice", pos) for pos in range(self._start, self._stop))

    def close(self) -> None:
        for reader in self._readers.values():
            reader.lines.close()
        self._readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _readers={})  # open readers stay in this process


# ---------------------------------------------------------------------------- reading the source
def _stored(index: spec.Index, start: int) -> Iterator[tuple[int, Any]]:
    """(sample, stored bytes or pixel array) for every sample from ``start`` on, in order."""
    if index.format == "wds":
        yield from _stored_wds(index, start)
        return
    from readers.formats.registry import open_dataset  # torch: imported only when converting

    ds = open_dataset(index, decode=False)
    n = index.num_samples
    try:
        for a in range(start, n, _BATCH):
            yield from zip(range(a, min(a + _BATCH, n)), ds.read_many(list(range(a, min(a + _BATCH, n)))))
    finally:
        ds.close()


def _stored_wds(index: spec.Index, start: int) -> Iterator[tuple[int, bytes]]:
    """wds: each shard mapped once and read front to back (the layout of ``readers.contract.spec``: the sample's
    bytes at ``offsets[i]``, its tar header just before them, named after its key)."""
    offsets, sizes, shard_of = (index.arrays[k] for k in ("offsets", "sizes", "shards"))
    shards = index.meta["shards"]
    i, n = start, index.num_samples
    while i < n:
        k = int(shard_of[i])
        path = index.root / shards[k]["name"]
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mm.madvise(mmap.MADV_SEQUENTIAL)
            stop = int(shards[k]["first"]) + int(shards[k]["samples"])
            for i in range(i, stop):
                off, size = int(offsets[i]), int(sizes[i])
                key = spec.wds_key(i).encode() + b"."
                if off + size > len(mm) or mm[off - spec.TAR_BLOCK:off - spec.TAR_BLOCK + len(key)] != key:
                    raise PackError(f"{path} at byte {off - spec.TAR_BLOCK}: not the tar header of sample {i}; "
                                    f"the shard is damaged or does not match its index (pack-dataset verify "
                                    f"{index.root})")
                yield i, mm[off:off + size]
        i = stop


def _checked(index: spec.Index, start: int) -> Iterator[tuple[int, Any, int]]:
    """(sample, stored data, CRC-32) from ``start`` on; a CRC that differs from the index stops the work."""
    checksums = index.arrays["checksums"]
    for i, data in _stored(index, start):
        buf = np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data
        crc = spec.checksum(buf)
        if crc != int(checksums[i]):
            raise PackError(f"{index.root} sample {i}: checksum mismatch, the stored bytes changed since "
                            f"packing; run 'pack-dataset verify {index.root}' to list the damage")
        yield i, data, crc


# ---------------------------------------------------------------------------- turning samples into Prepared
def _ext(data: bytes) -> str:
    return "png" if data[:8] == _PNG_SIGNATURE else "jpg"


def _to_pixels(data: bytes, opts: ImageOptions) -> Outcome:
    """Worker: encoded bytes (or an uncompressed PPM of pixels) -> pixels, resized as ``opts`` asks."""
    try:
        prep = prepare_image(data, opts)
    except RejectedImage as exc:  # the source is checksummed: this is a decoder disagreement
        return Outcome(None, problem=f"cannot decode the stored image ({exc})", unreadable=True)
    prep.pixels = np.ascontiguousarray(prep.pixels, dtype=np.uint8)
    return Outcome(prep, spec.checksum(prep.pixels))


def _to_png(pixels: np.ndarray, _opts: ImageOptions) -> Outcome:
    """Worker: stored pixels -> a lossless PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    data = buf.getvalue()
    prep = Prepared(data, "png", pixels.shape[0], pixels.shape[1], True, note="pixels->png", source_format="RGB")
    return Outcome(prep, spec.checksum(data))


def _ppm(pixels: np.ndarray) -> bytes:
    """Pixels as an uncompressed PPM, so that resizing them goes through ``prepare_image``'s one geometry."""
    h, w, _ = pixels.shape
    return b"P6\n%d %d\n255\n" % (w, h) + np.ascontiguousarray(pixels).tobytes()


def _job(item: tuple[Any, int], opts: ImageOptions) -> Outcome:
    """Worker: one (stored sample, crc) -> what the target stores."""
    data = item[0]
    if isinstance(data, np.ndarray):
        return _to_pixels(_ppm(data), opts) if opts.want_pixels else _to_png(data, opts)
    return _to_pixels(data, opts)


def _passes_through(data: Any, opts: ImageOptions) -> bool:
    """True when the stored sample is what the target stores (mmap -> mmap at the same size)."""
    return (opts.want_pixels and isinstance(data, np.ndarray)
            and (opts.resize is None or data.shape[:2] == (opts.resize, opts.resize)))


def _kept(data: np.ndarray, crc: int) -> Outcome:
    h, w = data.shape[:2]
    return Outcome(Prepared(b"", "rgb", h, w, False, pixels=np.ascontiguousarray(data)), crc)


def prepare_stage(index: spec.Index) -> Callable[..., Iterator[Outcome]]:
    """A prepare stage (``packer.prepare.workers.PrepareStage``) that reads the packed dataset ``index``."""

    def stage(source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        outcomes = images(source, start, opts, workers)
        if source.schema is None or not source.schema.extra_fields:
            yield from outcomes
            return
        yield from _with_fields(index, start, outcomes)

    def images(source: Source, start: int, opts: ImageOptions, workers: int) -> Generator[Outcome, None, None]:
        opts = replace(opts, validate=False, max_side=None, max_pixels=1 << 62)
        samples = _checked(index, start)
        pixels_in = index.meta["storage"]["kind"] == "pixels"
        if not opts.want_pixels and not pixels_in:  # a copy: no worker would have anything to do
            for _i, data, crc in read_ahead(samples, lambda item: len(item[1]), name="convert-read-ahead"):
                yield Outcome(Prepared(data, _ext(data), 0, 0, False), crc)
            return
        items = ((data, crc) for _i, data, crc in samples)
        yield from ordered_outcomes(items, _job, opts, workers,
                                    inline=lambda item: _kept(*item) if _passes_through(item[0], opts) else None,
                                    describe=lambda n: f"sample {start + n} of {index.location}")

    return stage


def _with_fields(index: spec.Index, start: int, outcomes: Generator[Outcome, None, None]) -> Iterator[Outcome]:
    """The outcomes with each sample's extra field blobs, read as the readers read them
    (``packer.tools.verify_fields.StoredFields``) and each checked against ``field_checksums.npy``: a
    field that does not read, or a mismatch, stops the work, as for the images."""
    from packer.tools.verify_fields import StoredFields, load_field_checksums
    from readers.contract.messages import one_line

    hint = f"run 'pack-dataset verify {index.root}' to list the damage"
    stored = StoredFields(index)
    try:
        try:
            crcs = load_field_checksums(index.root, index.num_samples, len(stored.fields))
        except spec.DatasetFormatError as exc:
            raise PackError(f"{exc}; {hint}") from None
        for i, outcome in enumerate(outcomes, start=start):
            blobs = stored.blobs(i)
            for j, (f, blob) in enumerate(zip(stored.fields, blobs)):
                if isinstance(blob, Exception):
                    raise PackError(f"{stored.where(f, i)} sample {i} field {f.name!r}: cannot be read "
                                    f"({one_line(blob, first=True)}); {hint}")
                if spec.checksum(blob) != int(crcs[i, j]):
                    raise PackError(f"{stored.where(f, i)} sample {i} field {f.name!r}: checksum mismatch, the "
                                    f"stored field changed since packing; {hint}")
            yield outcome._replace(fields=blobs)
    finally:
        outcomes.close()
        stored.close()


# ---------------------------------------------------------------------------- the command
def _roots(src: Path) -> list[Path]:
    if not src.exists():
        raise SourceError(f"{src}: no such dataset folder")
    if (src / spec.INDEX_NAME).is_file():
        return [src]
    splits = spec.find_splits(src)
    if splits:
        return [src / s for s in splits]
    if (src / spec.STATE_NAME).exists():
        holder = lock_holder(src)
        if holder is not None:
            raise SourceError(f"{src} is being packed by pid {holder} right now; convert it once that pack ends")
        raise SourceError(f"{src}: this pack never finished; finish it with --resume before converting it")
    raise SourceError(f"{src}: not a packed dataset (no {spec.INDEX_NAME}); "
                      "to pack an image folder use 'pack-dataset pack'")


def _read(root: Path) -> spec.Index:
    from readers.formats.resolve import resolve_index

    try:
        return resolve_index(root)
    except (spec.DatasetFormatError, OSError) as exc:
        raise SourceError(str(exc)) from None


def convert(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions, *,
            progress: Callable[[str, Source], PackProgress | None] | None = None) -> list[SplitResult]:
    """Convert the packed dataset ``src`` (or each split in it) into ``options.format`` at ``out``."""
    from packer.api import WRITERS
    from readers.contract.env import available_cpus

    src, out = Path(src), Path(out)
    roots = _roots(src)
    indexes = [_read(r) for r in roots]
    if out.resolve() == src.resolve() or src.resolve().is_relative_to(out.resolve()) or any(
            out.resolve().is_relative_to(r.resolve()) for r in roots):
        raise OutputError(f"{out} overlaps the source dataset {src}; choose another output folder")
    jobs = []
    for root, index in zip(roots, indexes):
        opts = conversion_options(index.meta.get("options", {}), options)
        if index.meta["storage"]["kind"] == "pixels" and opts.format == "mmap" and opts.resize is None:
            opts = replace(opts, resize=index.meta.get("options", {}).get("resize"))
        dest = out if root == src else out / root.name
        jobs.append((index.meta.get("split") or root.name, dataset_source(index), dest, opts, index))
    workers = options.workers or available_cpus()
    results = []
    with OutputLock() as lock:  # one writer per output folder, as for pack (packer.output)
        prepare_output(out, options, [dest for _, _, dest, _, _ in jobs], lock)
        for split, source, dest, opts, index in jobs:
            callback = progress(split, source) if progress else None
            log.info("converting %s (%s, %d samples) -> %s (%s)", index.root, index.format,
                     index.num_samples, dest, opts.format)
            try:
                results.append(pack_split(source, dest, split, opts, WRITERS[opts.format], workers, callback,
                                          prepare=prepare_stage(index)))
            finally:
                close_source(source)
    return results
