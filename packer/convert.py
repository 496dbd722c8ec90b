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
"""

from __future__ import annotations

import hashlib
import io
import logging
import mmap
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from packer.errors import OutputError, PackError, SourceError
from packer.images import ImageOptions, Prepared, RejectedImage, prepare_image
from packer.importers.stage import ordered_outcomes
from packer.readahead import read_ahead
from packer.options import PackOptions, cli_fields
from packer.output import OutputLock, prepare_output
from packer.pipeline import Progress, SplitResult, pack_split
from packer.source import Source
from packer.workers import Outcome
from readers import spec

__all__ = ["convert", "dataset_source", "conversion_options"]

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
    """A :class:`Source` whose samples are the packed dataset's, in its order."""
    meta, arrays = index.meta, index.arrays
    h = hashlib.sha256(meta["format"].encode())
    for name in ("labels", "sizes", "checksums"):
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    details = {"dataset_format": meta["format"], "num_samples": index.num_samples,
               "original_source": meta.get("source", {}), "original_stats": meta.get("stats", {})}
    return Source(root=index.root, classes=index.classes, paths=list(index.names()),
                  labels=arrays["labels"].tolist(), sizes=arrays["sizes"].tolist(),
                  kind="dataset", details=details, _fingerprint=h.hexdigest(),
                  order=meta.get("order") or {"kind": "source"})  # the samples keep the dataset's order


# ---------------------------------------------------------------------------- reading the source
def _stored(index: spec.Index, start: int) -> Iterator[tuple[int, Any]]:
    """(sample, stored bytes or pixel array) for every sample from ``start`` on, in order."""
    if index.format == "wds":
        yield from _stored_wds(index, start)
        return
    from readers.registry import open_dataset  # torch: imported only when converting

    ds = open_dataset(index, decode=False)
    n = index.num_samples
    try:
        for a in range(start, n, _BATCH):
            yield from zip(range(a, min(a + _BATCH, n)), ds.read_many(list(range(a, min(a + _BATCH, n)))))
    finally:
        ds.close()


def _stored_wds(index: spec.Index, start: int) -> Iterator[tuple[int, bytes]]:
    """wds: each shard mapped once and read front to back (the layout of ``readers.spec``: the sample's
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


def _prepare_stage(index: spec.Index) -> Callable[..., Iterator[Outcome]]:
    """A prepare stage (``packer.workers.PrepareStage``) that reads the packed dataset ``index``."""

    def stage(source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        opts = replace(opts, validate=False, max_side=None, max_pixels=1 << 62)
        samples = _checked(index, start)
        pixels_in = index.meta["storage"]["kind"] == "pixels"
        if not opts.want_pixels and not pixels_in:  # a copy: no worker would have anything to do
            for _i, data, crc in read_ahead(samples, lambda item: len(item[1]), name="convert-read-ahead"):
                yield Outcome(Prepared(data, _ext(data), 0, 0, False), crc)
            return
        items = ((data, crc) for _i, data, crc in samples)
        yield from ordered_outcomes(items, _job, opts, workers,
                                    inline=lambda item: _kept(*item) if _passes_through(item[0], opts) else None)

    return stage


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
        raise SourceError(f"{src}: this pack never finished; finish it with --resume before converting it")
    raise SourceError(f"{src}: not a packed dataset (no {spec.INDEX_NAME}); "
                      "to pack an image folder use 'pack-dataset pack'")


def _read(root: Path) -> spec.Index:
    from readers.resolve import resolve_index

    try:
        return resolve_index(root)
    except (spec.DatasetFormatError, OSError) as exc:
        raise SourceError(str(exc)) from None


def convert(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions, *,
            progress: Callable[[str, Source], Progress | None] | None = None) -> list[SplitResult]:
    """Convert the packed dataset ``src`` (or each split in it) into ``options.format`` at ``out``."""
    from packer.api import WRITERS
    from readers.env import available_cpus

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
            results.append(pack_split(source, dest, split, opts, WRITERS[opts.format], workers, callback,
                                      prepare=_prepare_stage(index)))
    return results
