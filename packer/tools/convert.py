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

The source side takes a *sequence* of packed datasets, chained in the order given
(:func:`dataset_source`, :func:`prepare_stage`): one for ``convert``, several for
``packer.tools.merge``, which joins datasets of one format and schema through the same
stage. Their classes are the first dataset's, then each new name of the next ones; the
labels of a later dataset are remapped to those (the stored bytes are never touched).
"""

from __future__ import annotations

import hashlib
import io
import logging
import mmap
import os
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, overload

import numpy as np

from packer.sources.columns import IntColumn, spilled
from packer.errors import PackError, SourceError
from packer.prepare.images import ImageOptions, Prepared, RejectedImage, prepare_image
from packer.prepare.stage import ordered_outcomes
from packer.prepare.readahead import read_ahead
from packer.options import PackOptions, RemoteOptions, cli_fields
from packer.output import OutputLock, prepare_output
from packer.pipeline import PackProgress, SplitResult, pack_split
from packer.remote_output import StagedOutput
from packer.sources.source import Source, URLRoot
from packer.tools.convert_sources import check_no_overlap, dataset_roots, locations, read_dataset
from packer.prepare.workers import Outcome
from readers.contract import spec
from readers.contract.fields import Schema

__all__ = ["convert", "dataset_source", "close_source", "conversion_options", "prepare_stage", "merged_classes",
           "dataset_roots", "read_dataset", "check_no_overlap", "pack_jobs", "Job"]

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


def _chain(indexes: spec.Index | Sequence[spec.Index]) -> tuple[spec.Index, ...]:
    """One index or a sequence of them, as a non-empty tuple."""
    chain = (indexes,) if isinstance(indexes, spec.Index) else tuple(indexes)
    if not chain:
        raise ValueError("no dataset given")
    return chain


def merged_classes(indexes: Sequence[spec.Index]) -> tuple[list[str], list[np.ndarray | None]]:
    """The classes of the chained datasets: the first one's, then each name that a later one adds, at the
    end; and per dataset the table that maps its labels to those (None: its labels stay as they are)."""
    classes = list(indexes[0].classes)
    position = {name: k for k, name in enumerate(classes)}
    tables: list[np.ndarray | None] = [None]
    for index in indexes[1:]:
        own = index.classes
        for name in own:
            if name not in position:
                position[name] = len(classes)
                classes.append(name)
        table = np.array([position[name] for name in own], dtype=np.int64)
        tables.append(None if np.array_equal(table, np.arange(len(own))) else table)
    return classes, tables


def _labels(index: spec.Index, table: np.ndarray | None) -> np.ndarray:
    """The dataset's labels in the chain's classes (its index was range-checked: each label names a class)."""
    return index.labels if table is None else table[index.labels].astype(spec.ARRAY_DTYPES["labels"])


def _joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The arrays end to end (one array: itself, a view); past ``SPILL_BYTES`` in a mapped temporary file."""
    if len(parts) == 1:
        return parts[0]
    return spilled(np.concatenate([np.asarray(a, dtype=dtype) for a in parts]))


def dataset_source(indexes: spec.Index | Sequence[spec.Index], kind: str = "dataset") -> Source:
    """A :class:`Source` whose samples are the packed datasets', chained in the order given.

    Its ``paths`` are a :class:`_Names` (read from each ``names.jsonl`` on demand), its labels and sizes
    views of the index arrays for one dataset (for several: the arrays end to end, labels remapped to the
    :func:`merged_classes`, spilled to a mapped file when large). Each ``names.jsonl`` is checked first, in
    one streaming pass. ``kind`` is the source record's kind (``"dataset"``: a conversion). Close it with
    :func:`close_source`.
    """
    chain = _chain(indexes)
    first = chain[0]
    meta = first.meta
    classes, tables = merged_classes(chain)
    h = hashlib.sha256(meta["format"].encode())
    for index in chain:
        for name in ("labels", "sizes", "checksums"):
            h.update(np.ascontiguousarray(index.labels if name == "labels" else index.arrays[name]).data)
    if len(chain) > 1:  # the class names decide the remapped labels
        h.update("\0".join(classes).encode("utf-8", "surrogateescape"))
    for _ in _read_names(chain):  # every line a JSON string, one per sample: refused before any output
        pass
    schema = Schema.from_index(meta, str(first.location))
    num_samples = sum(index.num_samples for index in chain)
    if len(chain) == 1:
        details = {"dataset_format": meta["format"], "num_samples": num_samples,
                   "original_source": meta.get("source", {}), "original_stats": meta.get("stats", {})}
        order = meta.get("order") or {"kind": "source"}  # the samples keep the dataset's order
    else:
        details = {"dataset_format": meta["format"], "num_samples": num_samples, "datasets": [
            {"root": str(Path(index.root).resolve()), "num_samples": index.num_samples,
             "original_source": index.meta.get("source", {}), "original_stats": index.meta.get("stats", {})}
            for index in chain]}
        orders = [index.meta.get("order") or {"kind": "source"} for index in chain]
        order = orders[0] if all(o == {"kind": "source"} for o in orders) else {"kind": "chained", "orders": orders}
    labels = _joined([_labels(index, table) for index, table in zip(chain, tables)], spec.ARRAY_DTYPES["labels"])
    sizes = _joined([index.arrays["sizes"] for index in chain], np.int64)
    root: Any = Path(first.root) if first.store is None else URLRoot(first.location)  # joins like a Path
    return Source(root=root, classes=classes, paths=_Names(chain),  # a local folder, or a URL
                  labels=IntColumn(labels), sizes=IntColumn(sizes),
                  kind=kind, details=details, _fingerprint=h.hexdigest(), order=order,
                  schema=None if schema.is_default else schema)


def close_source(source: Source) -> None:
    """Close the ``names.jsonl`` readers a :func:`dataset_source` opened (idempotent)."""
    if isinstance(source.paths, _Names):
        source.paths.close()


def _read_names(indexes: Sequence[spec.Index]) -> Generator[str, None, None]:
    """Each sample's name from each ``names.jsonl`` in turn, in order: SourceError (one line, ``file:line``)
    for a line that is not a JSON string and for a line count that is not the index's sample count
    (checked by ``spec.Index.names``)."""
    for index in indexes:
        lines = index.names()
        try:
            while True:
                try:
                    name = next(lines)
                except StopIteration:
                    break
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
    """The ``names.jsonl`` of the chained datasets as one read-only sequence, read as it is asked for:
    memory independent of N.

    The write stage asks for ``names[pos]`` in increasing ``pos`` (twice for the same one) and
    the journal for growing slices ``names[a:b]`` (each a view of names ``a`` to ``b``, read as it
    is iterated); each kind has its own forward-only reader, shared by the slices, restarted from
    the top only when asked to go back. Iterating the whole sequence reads with a reader of its own.
    """

    def __init__(self, indexes: tuple[spec.Index, ...], start: int = 0, stop: int | None = None,
                 readers: dict[str, _Reader] | None = None) -> None:
        self._indexes, self._start = indexes, start
        self._stop = sum(index.num_samples for index in indexes) if stop is None else stop
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
            reader = self._readers[kind] = _Reader(_read_names(self._indexes))
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
            return _Names(self._indexes, self._start + start, self._start + max(start, stop), self._readers)
        pos = key + len(self) if key < 0 else key
        if not 0 <= pos < len(self):
            raise IndexError(key)
        return self._at("item", self._start + pos)

    def __iter__(self) -> Iterator[str]:
        if self._whole:
            return _read_names(self._indexes)
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
    if index.format == "wds" and not spec.is_inplace(index.meta) and index.store is None:
        yield from _stored_wds(index, start)  # our own local shards (in place or remote: the reader finds them)
        return
    from readers.formats.registry import open_dataset  # torch: imported only when converting

    ds = open_dataset(_reader_index(index), decode=False)
    n = index.num_samples
    try:
        if index.format == "wds":  # shards in place or in a store: read front to back (streamed), a few at once
            from readers.formats.wds_io import shard_io

            pairs = shard_io(ds).samples(range(start, n))
            try:
                yield from pairs
            finally:
                pairs.close()
            return
        for a in range(start, n, _BATCH):
            yield from zip(range(a, min(a + _BATCH, n)), ds.read_many(list(range(a, min(a + _BATCH, n)))))
    finally:
        ds.close()


def _reader_index(index: spec.Index) -> spec.Index:
    """``index`` for a reader of its own: a remote dataset's reader closes its store when it is closed, so it
    gets a store of its own (the index's stays open: ``names.jsonl`` and the next dataset's reader use it)."""
    if index.store is None:
        return index
    from readers.remote import open_store

    store = index.store
    return replace(index, store=open_store(store.url, store.storage_options, store.retry))


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


def _spans(indexes: Sequence[spec.Index], start: int) -> Iterator[tuple[spec.Index, int, int]]:
    """(index, its first sample to read, chain position of its sample 0) for each of the chained
    datasets that holds samples from chain position ``start`` on."""
    base = 0
    for index in indexes:
        n = index.num_samples
        if start < base + n:
            yield index, max(start - base, 0), base
        base += n


def _locate(indexes: Sequence[spec.Index], pos: int) -> tuple[spec.Index, int]:
    """The dataset holding chain position ``pos``, and the sample number in it."""
    for index, local, _base in _spans(indexes, pos):
        return index, local
    raise IndexError(pos)


def _checked(indexes: Sequence[spec.Index], start: int) -> Iterator[tuple[int, Any, int]]:
    """(chain position, stored data, CRC-32) from ``start`` on; a CRC that differs from its index stops the
    work, naming the dataset and its sample."""
    for index, local, base in _spans(indexes, start):
        checksums = index.arrays["checksums"]
        for i, data in _stored(index, local):
            buf = np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data
            crc = spec.checksum(buf)
            if crc != int(checksums[i]):
                raise PackError(f"{index.root} sample {i}: checksum mismatch, the stored bytes changed since "
                                f"packing; run 'pack-dataset verify {index.root}' to list the damage")
            yield base + i, data, crc


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


def prepare_stage(indexes: spec.Index | Sequence[spec.Index]) -> Callable[..., Iterator[Outcome]]:
    """A prepare stage (``packer.prepare.workers.PrepareStage``) that reads the packed datasets ``indexes``
    (one, or several of one format and schema), chained in the order given."""
    chain = _chain(indexes)

    def stage(source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        outcomes = images(source, start, opts, workers)
        if source.schema is None or not source.schema.extra_fields:
            yield from outcomes
            return
        yield from _with_fields(chain, start, outcomes)

    def images(source: Source, start: int, opts: ImageOptions, workers: int) -> Generator[Outcome, None, None]:
        opts = replace(opts, validate=False, max_side=None, max_pixels=1 << 62)
        samples = _checked(chain, start)
        pixels_in = chain[0].meta["storage"]["kind"] == "pixels"
        if not opts.want_pixels and not pixels_in:  # a copy: no worker would have anything to do
            for _i, data, crc in read_ahead(samples, lambda item: len(item[1]), name="convert-read-ahead"):
                yield Outcome(Prepared(data, _ext(data), 0, 0, False), crc)
            return
        items = ((data, crc) for _i, data, crc in samples)

        def describe(n: int) -> str:
            index, i = _locate(chain, start + n)
            return f"sample {i} of {index.location}"

        yield from ordered_outcomes(items, _job, opts, workers,
                                    inline=lambda item: _kept(*item) if _passes_through(item[0], opts) else None,
                                    describe=describe)

    return stage


def _with_fields(indexes: Sequence[spec.Index], start: int,
                 outcomes: Generator[Outcome, None, None]) -> Iterator[Outcome]:
    """The outcomes with each sample's extra field blobs, read as the readers read them
    (``packer.tools.verify_fields.StoredFields``) and each checked against its dataset's
    ``field_checksums.npy``: a field that does not read, or a mismatch, stops the work, as for the images."""
    from packer.tools.verify_fields import StoredFields, load_field_checksums
    from readers.contract.messages import one_line

    try:
        for index, local, _base in _spans(indexes, start):
            hint = f"run 'pack-dataset verify {index.root}' to list the damage"
            stored = StoredFields(_reader_index(index))
            try:
                try:
                    crcs = _field_checksums(index, len(stored.fields), load_field_checksums)
                except (spec.DatasetFormatError, OSError) as exc:
                    raise PackError(f"{exc}; {hint}") from None
                for i, outcome in zip(range(local, index.num_samples), outcomes):  # range first: no sample lost
                    blobs = stored.blobs(i)
                    for j, (f, blob) in enumerate(zip(stored.fields, blobs)):
                        if isinstance(blob, Exception):
                            raise PackError(f"{stored.where(f, i)} sample {i} field {f.name!r}: cannot be read "
                                            f"({one_line(blob, first=True)}); {hint}")
                        if spec.checksum(blob) != int(crcs[i, j]):
                            raise PackError(f"{stored.where(f, i)} sample {i} field {f.name!r}: checksum mismatch, "
                                            f"the stored field changed since packing; {hint}")
                    yield outcome._replace(fields=blobs)
            finally:
                stored.close()
    finally:
        outcomes.close()


def _field_checksums(index: spec.Index, width: int, load_local: Callable[..., np.ndarray]) -> np.ndarray:
    """``field_checksums.npy`` of the dataset: ``load_local`` for a local folder; for a dataset in a store,
    the object read (capped at the size it can have) and its dtype and shape checked the same way."""
    if index.store is None:
        return load_local(index.root, index.num_samples, width)
    from packer.formats.fieldstore import FIELD_CHECKSUMS

    where = index.store.url_of(FIELD_CHECKSUMS)
    raw = index.store.read(FIELD_CHECKSUMS, max_bytes=4096 + 4 * index.num_samples * width)
    try:
        crcs = np.load(io.BytesIO(raw), allow_pickle=False)
    except ValueError as exc:
        raise spec.DatasetFormatError(f"{where}: cannot be read ({exc})") from None
    if crcs.dtype != np.dtype("<u4") or crcs.shape != (index.num_samples, width):
        raise spec.DatasetFormatError(f"{where}: holds {crcs.dtype.str} {crcs.shape}, expected <u4 "
                                      f"({index.num_samples}, {width})")
    return crcs


# ---------------------------------------------------------------------------- the command
@dataclass
class Job:
    """One split to write: its name, the chained datasets it reads, where it goes, with which options."""

    split: str
    indexes: tuple[spec.Index, ...]
    dest: Path
    options: PackOptions
    kind: str = "dataset"  # the source record's kind (:func:`dataset_source`)
    details: dict[str, Any] = field(default_factory=dict)  # more for the source record (JSON-able)


def _engine(job: Job, workers: int) -> Callable[..., SplitResult]:
    """The job's split packer (``packer.engines.SplitPacker``): packing's write stage fed by
    :func:`prepare_stage`, with the hook a staged output uploads closed shards from."""

    def pack_one(source: Source, dest: Path, split: str, writer_cls: type, progress: PackProgress | None, *,
                 output: Any = None, after_checkpoint: Callable[..., None] | None = None) -> SplitResult:
        return pack_split(source, dest, split, job.options, writer_cls, workers, progress,
                          prepare=prepare_stage(job.indexes), after_checkpoint=after_checkpoint)

    return pack_one


def pack_jobs(target: Any, options: PackOptions, jobs: Sequence[Job], verb: str,
              progress: Callable[[str, Source], PackProgress | None] | None = None) -> list[SplitResult]:
    """Write each job's split through packing's write stage (:func:`packer.pipeline.pack_split`) with
    :func:`prepare_stage` as its prepare stage into ``target`` (a ``packer.api.PackOutput``: a local
    folder, or an object-store prefix staged locally and uploaded, ``packer.remote_output``), under one
    lock of its folder (``packer.output``), in the order ``packer.api.pack`` follows: ``convert``'s and
    ``merge``'s work. Each source is built (its names checked) before the output is touched; ``target``
    is closed at the end, whatever happens."""
    from packer.api import WRITERS
    from readers.contract.env import available_cpus

    sources: list[Source] = []
    try:
        for job in jobs:
            sources.append(dataset_source(job.indexes, job.kind))
            sources[-1].details.update(job.details)
        workers = options.workers or available_cpus()
        results = []
        with OutputLock() as lock:  # one writer per output folder, as for pack (packer.output)
            target.check(lock)
            prepare_output(target.folder, options, [job.dest for job in jobs], lock, role=target.role)
            target.ready()
            for job, source in zip(jobs, sources):
                callback = progress(job.split, source) if progress else None
                log.info("%s %s (%s, %d samples) -> %s (%s)", verb, ", ".join(str(i.location) for i in job.indexes),
                         job.indexes[0].format, len(source.paths), job.dest, job.options.format)
                results.append(target.pack_split(_engine(job, workers), source, job.dest, job.split,
                                                 WRITERS[job.options.format], callback))
        return results
    finally:
        for source in sources:
            close_source(source)
        target.close()


def convert(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions, *,
            progress: Callable[[str, Source], PackProgress | None] | None = None,
            remote: RemoteOptions | None = None) -> list[SplitResult]:
    """Convert the packed dataset ``src`` (or each split in it) into ``options.format`` at ``out``.

    Either may be on object storage: ``src`` an ``s3://``, ``gs://``, ``az://`` or ``https://`` URL (read
    through ``readers.remote``), ``out`` an ``s3://``, ``gs://`` or ``az://`` prefix, written exactly as
    ``packer.api.pack`` writes one (``packer.remote_output.StagedOutput``: staged locally, uploaded,
    ``index.json`` last, ``--resume`` continues an interrupted upload). ``remote`` says how the stores
    are reached (``storage_options``, ``retry``; ``stage_dir``, ``upload_progress`` for a remote ``out``).
    """
    src, out = locations(src, out)
    remote = remote or RemoteOptions()
    unused = remote.unused(remote_source=isinstance(src, str), remote_output=isinstance(out, str))
    if unused:
        raise TypeError(f"RemoteOptions {', '.join(unused)}: only for an object-store source or output; "
                        f"{src} and {out} are local")
    roots = dataset_roots(src, remote=remote)
    indexes: list[spec.Index] = []
    try:
        for r in roots:
            indexes.append(read_dataset(r, remote))
        check_no_overlap(out, src, roots)
        return _convert(src, out, options, roots, indexes, remote, progress)
    finally:
        for index in indexes:
            if index.store is not None:
                index.store.close()  # its connections now, not whenever the garbage collector runs


def _convert(src: Path | str, out: Path | str, options: PackOptions, roots: list[Path], indexes: list[spec.Index],
             remote: RemoteOptions, progress: Callable[[str, Source], PackProgress | None] | None
             ) -> list[SplitResult]:
    from packer.api import FolderOutput

    target = StagedOutput(out, options, remote) if isinstance(out, str) else FolderOutput(out)
    jobs = []
    for root, index in zip(roots, indexes):
        opts = conversion_options(index.meta.get("options", {}), options)
        if index.meta["storage"]["kind"] == "pixels" and opts.format == "mmap" and opts.resize is None:
            opts = replace(opts, resize=index.meta.get("options", {}).get("resize"))
        dest = target.folder if len(roots) == 1 and str(root).rstrip("/") == str(src).rstrip("/") \
            else target.folder / root.name
        jobs.append(Job(index.meta.get("split") or root.name, (index,), dest, opts))
    return pack_jobs(target, options, jobs, "converting", progress)
