"""``pack()``: the Python API that the ``pack-dataset`` command is a thin layer over.

One orchestration for every output and engine (:func:`pack`): the engine
connects, the output lock is taken, the source is scanned and the output
checked, locked and (``--overwrite``) cleared by :func:`plan`, then each split
is packed by the engine and its result built by ``packer.pipeline``. The
output is a local folder (:class:`FolderOutput`) or an ``s3://`` prefix staged
in a local folder (``packer.remote_output.StagedOutput``); both answer the
same four calls.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Callable, Protocol

from packer import appending
from packer.engines import SplitPacker, open_engine
from packer.errors import OutputError, SourceError, UsageError
from packer.formats.base import FormatWriter
from packer.formats.hdf5 import HDF5Writer
from packer.formats.lmdb import LmdbWriter
from packer.formats.mmap import MemmapWriter
from packer.formats.wds import WdsWriter
from packer.importers import scan_import
from packer.options import PackOptions, RemoteOptions
from packer.output import OutputLock, prepare_output
from packer.pipeline import PackProgress, SplitResult
from packer.remote_output import StagedOutput
from packer.importers.rowsource import scan_rows
from packer.sources.source import Source, URLRoot, find_split_dirs, listings, scan, scan_listing
from readers.contract import spec
from readers.contract.location import UnsupportedLocationError, parse_location

__all__ = ["pack", "WRITERS", "plan", "PackOutput", "FolderOutput"]

log = logging.getLogger(__name__)

#: format name (as stored in index.json) -> writer class
WRITERS: dict[str, type[FormatWriter]] = {w.format: w for w in (WdsWriter, LmdbWriter, HDF5Writer, MemmapWriter)}


def _location(where: str | os.PathLike, error: type[UsageError]) -> Path | str:
    """``src`` or ``out`` as the CLI reads it (readers.contract.location): a local folder (``file:///abs`` too) as a
    Path, an ``s3://`` / ``http(s)://`` URL as a str; another scheme (``gs://``) is ``error`` (a UsageError)."""
    try:
        return parse_location(where)
    except UnsupportedLocationError as exc:
        raise error(str(exc)) from None


def _append_options(out: Path | str, options: PackOptions) -> PackOptions:
    """``options.append``: the options the engine packs with (each split resumes the journal
    :func:`_append_split` seeds); a plain pack when ``out`` holds no dataset yet."""
    if isinstance(out, str):
        raise UsageError(f"{out}: --append writes into a local dataset folder; appending to one on object "
                         "storage is not supported yet (append locally, then upload the folder)")
    if options.engine != "local" or options.overwrite:
        raise UsageError("--append adds to the dataset with the local engine: not with "
                         f"{'--overwrite' if options.overwrite else '--engine ray'}")
    if not (out / spec.INDEX_NAME).exists() and not spec.find_splits(out) and not (out / spec.STATE_NAME).exists():
        return dataclasses.replace(options, append=False)  # nothing to append to: the first generation
    return dataclasses.replace(options, resume=True)


def _append_split(dest: Path, split: str, source: Source, asked: PackOptions) -> str:
    """Ready ``dest`` (a finished dataset, or an interrupted append into it) for ``source``'s samples:
    its classes take the dataset's numbers; returns the dataset's split name (its shards')."""
    if appending.resumable(dest, asked):
        index = spec.read_index(dest)
    else:
        if not (dest / spec.INDEX_NAME).exists():
            raise UsageError(f"{dest}: no dataset to append split {split!r} to; pack it first, without --append")
        index = appending.base_index(dest, asked)
    split = str(index.meta.get("split") or split)
    if source.schema is not None:  # a manifest's fields (an image folder's are image + label)
        appending.check_schema(dest, index, source.schema)
    appending.remap_source(dest, index, source)
    if appending.interrupted(dest) is None:
        appending.start(dest, split, source, dataclasses.replace(asked, resume=False), index)
    return split


def _split_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", path.resolve().name).strip("_")
    return name or "data"


def plan(src: str | os.PathLike[str], out: str | os.PathLike[str], options: PackOptions, *,
         lock: OutputLock | None = None, remote: RemoteOptions | None = None,
         role: str = "") -> list[tuple[str, Source, Path]]:
    """Scan the source and decide (split name, source, output folder) for each split.

    Raises SourceError / OutputError (both UsageError) before anything is written.
    With ``lock``, the output folders stay locked by it (``pack`` holds it for the
    whole run); without, they are locked only while the output is checked.
    ``role`` says what ``out`` is in messages (a staging folder). ``src`` and ``out`` are read as the
    CLI reads them: ``file:///abs/path`` is the local folder ``/abs/path``, ``gs://`` is refused.
    An ``s3://`` source is listed with ``remote``'s ``storage_options`` and ``retry``.
    """
    src, out = _location(src, SourceError), _location(out, OutputError)
    if isinstance(out, str):
        raise OutputError(f"{out}: plan() writes a local folder; pack() stages and uploads an s3:// output")
    if isinstance(src, str):
        jobs = [_remote_source(src, out, remote or RemoteOptions())]
        prepare_output(out, options, [out], lock, split_hint=jobs[0][0], role=role)
        return [(name, source.ordered(options.order_kind(), options.shuffle_seed), dest) for name, source, dest in jobs]
    if not src.exists():
        raise SourceError(f"{src}: no such folder")
    with listings():  # each folder listed once: recognizing the source, its splits, the scan
        jobs = _local_jobs(src, out, options)
    if out.resolve().is_relative_to(src.resolve()):
        raise OutputError(f"{out} lies inside the source folder {src}; choose an output outside it")
    if src.resolve().is_relative_to(out.resolve()):
        raise OutputError(f"the source {src} lies inside the output folder {out}; choose another output")
    single = jobs[0][0] if len(jobs) == 1 and jobs[0][2] == out else None
    prepare_output(out, options, [dest for _, _, dest in jobs], lock, split_hint=single, role=role)
    # (options.append: resume=True here, so the dataset in out is kept, not refused nor cleared)
    return [(name, source.ordered(options.order_kind(), options.shuffle_seed), dest) for name, source, dest in jobs]


def _local_jobs(src: Path, out: Path, options: PackOptions) -> list[tuple[str, Source, Path]]:
    """(split name, source, output folder) of each split of the local source ``src``."""
    # a manifest or COCO json (typed fields), WebDataset shards or a Hugging Face dataset (None: an image folder)
    imported = scan_rows(src, options) or scan_import(src)
    if imported is not None:
        return [(split, source, out if len(imported) == 1 else out / split) for split, source in imported]
    if not src.is_dir():
        raise SourceError(f"{src}: not a folder (expected an ImageFolder tree root/<class>/<image>)")
    splits = find_split_dirs(src, options.splits)
    if not splits:
        return [(_split_name(src), scan(src, follow_symlinks=options.follow_symlinks), out)]
    names = [_split_name(d) for d in splits]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise SourceError(f"{src}: split folders {', '.join(d.name for d in splits if _split_name(d) in clash)} "
                          f"would all be written to {out / clash[0]}; rename them")
    return [(_split_name(d), scan(d, follow_symlinks=options.follow_symlinks), out / _split_name(d)) for d in splits]


def _remote_source(url: str, out: Path, remote: RemoteOptions) -> tuple[str, Source, Path]:
    """An ImageFolder under an ``s3://`` prefix: one listing; tasks read each object through the store."""
    from packer.engines.io import StoreFiles, list_objects
    from readers.remote import open_store

    try:
        store = open_store(url, remote.storage_options, remote.retry)
        if getattr(store, "read_only", False):
            raise SourceError(f"{url}: an http(s):// location cannot be listed; sources on object storage "
                              "are read from s3://, gs:// or az:// prefixes")
        objects = list_objects(store)
    except OSError as exc:  # unreachable store, refused credentials, no such bucket
        raise SourceError(f"{url}: cannot list the source ({exc})") from None
    if not objects:
        raise SourceError(f"{url}: no such prefix (no objects under it)")
    source = scan_listing(URLRoot(store.url), objects)
    source.files = StoreFiles(store)
    return _split_name(Path(store.url)), source, out


class PackOutput(Protocol):
    """Where :func:`pack` writes: the local folder ``plan`` checks and locks, and four steps around it."""

    folder: Path  # the local folder the splits are packed into (the output, or a staging folder)
    role: str  # what ``folder`` is, for messages ("" for the output itself)

    def check(self, lock: OutputLock) -> None:
        """Before ``plan``: read-only checks beyond the local folder's (nothing written)."""

    def ready(self) -> None:
        """After ``plan`` locked (and on overwrite cleared) the folder."""

    def pack_split(self, engine: SplitPacker, source: Source, dest: Path, split: str,
                   writer_cls: type[FormatWriter], progress: PackProgress | None) -> SplitResult:
        """Pack one split into ``dest`` with ``engine``."""

    def close(self) -> None:
        """Once the lock is released, whether the pack succeeded or not."""


class FolderOutput:
    """A local output folder: ``plan`` does all there is to check; the engine writes the splits."""

    role = ""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def check(self, lock: OutputLock) -> None:
        pass

    def ready(self) -> None:
        pass

    def pack_split(self, engine: SplitPacker, source: Source, dest: Path, split: str,
                   writer_cls: type[FormatWriter], progress: PackProgress | None) -> SplitResult:
        return engine(source, dest, split, writer_cls, progress)

    def close(self) -> None:
        pass


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PackOptions | None = None,
    *,
    progress: Callable[[str, Source], PackProgress | None] | None = None,
    remote: RemoteOptions | None = None,
) -> list[SplitResult]:
    """Pack the dataset ``src`` into ``out`` (one dataset folder per split) and return each split's result.

    ``src`` is what ``pack-dataset SRC`` takes, recognized by its files:

    * an image folder ``root/<class>/<image>`` (split folders ``train/``, ``val/``, ... give one
      dataset each: ``options.splits``); the labels are the class folders;
    * a manifest ``rows.csv`` / ``rows.jsonl`` / ``rows.parquet``: one row per sample, an image
      column (``options.image_column``) and typed fields (captions, boxes, tags, scores, ...:
      inferred, or stated with ``options.fields``; see ``docs/fields.md``);
    * COCO ``instances_*.json`` (its images in ``options.images``): boxes, category ids, areas,
      iscrowd and segmentation per image;
    * a folder of WebDataset ``.tar`` shards written by other tools, or a Hugging Face ``datasets``
      dataset (a ``save_to_disk`` folder or ``.parquet`` files): their images, labels and fields.

    Every image is validated (and re-encoded where ``options`` ask) the same way whatever the source.
    ``src`` may also be an ``s3://bucket/prefix`` holding an image folder (``<class>/<image>`` objects):
    it is listed once and each image read through the store (``remote.storage_options``, ``remote.retry``).

    ``progress(split, source)`` may return a callback ``(images, bytes)`` that
    is called as work completes; the CLI uses it for its progress bar.

    ``out`` may be an ``s3://bucket/prefix`` URL: the pack is staged locally
    and uploaded as it goes, ``index.json`` last (``packer.remote_output``). The
    staging folder is locked, checked and cleared as a local output is.

    ``remote`` (:class:`packer.RemoteOptions`) says how object storage is reached:
    ``storage_options`` and ``retry`` for an ``s3://`` source or output, ``stage_dir`` and
    ``upload_progress(split) -> callback(bytes)`` for an ``s3://`` output only; a field set
    where it cannot apply (a local output and source) is a one-line TypeError naming it::

        pack("data/train", "s3://bucket/train-wds", PackOptions(format="wds"),
             remote=RemoteOptions(storage_options={"endpoint_url": "http://127.0.0.1:8333"},
                                  stage_dir="/nvme/stage"))

    ``src`` and ``out`` are read as the CLI reads them (:func:`readers.contract.location.parse_location`):
    ``file:///abs/path`` is the local folder ``/abs/path``; another scheme (``gs://``) is a
    SourceError / OutputError naming it and the schemes served.
    """
    options, remote = options or PackOptions(), remote or RemoteOptions()
    src, out = _location(src, SourceError), _location(out, OutputError)
    unused = remote.unused(remote_source=isinstance(src, str), remote_output=isinstance(out, str))
    if unused:  # a local output (and source): one line naming what cannot apply
        where = "output" if set(unused) <= {"stage_dir", "upload_progress"} else "output or source"
        raise TypeError(f"RemoteOptions {', '.join(unused)}: only for an s3:// {where}; {out} is a local folder")
    asked = options  # append: the caller's resume decides whether an interrupted append continues
    if options.append:
        options = _append_options(out, options)
    target: PackOutput = StagedOutput(out, options, remote) if isinstance(out, str) else FolderOutput(out)
    # The engine connects first (a cluster that cannot be reached changes nothing); then the output
    # folders are locked for the whole run, whichever engine writes them.
    try:
        with open_engine(options) as pack_split, OutputLock() as lock:
            target.check(lock)
            jobs = plan(src, target.folder, options, lock=lock, remote=remote, role=target.role)
            target.ready()
            results = []
            for split, source, dest in jobs:
                if options.append:  # the journal seeded from the dataset in dest (packer.appending)
                    split = _append_split(dest, split, source, asked)
                callback = progress(split, source) if progress else None
                log.info("packing %s: %d images in %d classes -> %s", split, len(source.paths), len(source.classes),
                         dest)
                result = target.pack_split(pack_split, source, dest, split, WRITERS[options.format], callback)
                result.note = _layout_note(jobs, split, target.folder)
                if options.append:  # what this run added, and as which generation
                    gens = result.meta.get("generations") or [{}]
                    added = f"+{gens[-1].get('added', 0)} as generation {result.meta.get('generation', 0)}"
                    result.note = f"{result.note}; {added}" if result.note else added
                results.append(result)
    finally:
        target.close()  # the lock is released: what is left to tidy (a staging folder emptied by the upload)
    return results


def _layout_note(jobs: list[tuple[str, Source, Path]], split: str, out: Path) -> str:
    """What the summary says about the layout chosen: which splits, or that nested folders are not."""
    if any(dest != out for _, _, dest in jobs):
        return f"split {split} of {', '.join(s for s, _, _ in jobs)}"
    if jobs[0][1].kind == "folder" and any(p.count("/") > 1 for p in jobs[0][1].paths):
        return "one dataset: sub-folders inside class folders are part of their class (--splits to choose splits)"
    return ""
