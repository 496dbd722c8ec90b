"""Import WebDataset tar shards written by other tools (webdataset's ``ShardWriter``, ``tar``, ...).

A shard is a tar file; its members are grouped into samples by key as
webdataset groups them (``base_plus_ext``: the key is the member name up to
the first dot of its last path component, the rest is the extension,
compared in lower case; consecutive members with the same key form one
sample). A sample is taken when it has an image (``jpg``, ``jpeg``, ``png``,
``webp``, ... any extension the folder scan takes) and a label:

* ``cls``: the class index as text (``ShardWriter`` writes ints so);
* or ``json``: an object with ``label`` (or ``cls``, ``class``, ``target``):
  an int (class index) or a string (class name).

Class names: with string labels, the sorted set of names (labels are their
positions, like ImageFolder's sorted class folders); with integer labels,
``"0"``, ``"1"``, ... up to the largest. That largest index must stay below
``max(1,000,000, number of labelled samples)`` (:data:`MIN_CLASS_LIMIT`): more
classes than samples means empty classes, and past a million of them a label
like ``500000000`` is broken or hostile (it would build 500M class names); the
import stops with one line naming the shard and member. A ``.json`` label that
is not JSON, or nests too deeply for the parser, stops it the same way. Samples keep the shards' order
(shards sorted by file name). Samples without an image or a label are
counted as ignored, like non-image files in a folder. Every image then goes
through the same validation as a folder's files.
"""

from __future__ import annotations

import array
import json
import logging
import os
import re
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from packer.errors import SourceError
from packer.images import ImageOptions, RejectedImage, check_file_size
from packer.importers.stage import Unreadable, bytes_stage
from packer.columns import IntBuilder, IntColumn, StringBuilder, spilled
from packer.source import IMAGE_EXTENSIONS, Source, list_folder

__all__ = ["is_wds_source", "scan_wds", "shard_files", "MIN_CLASS_LIMIT"]

log = logging.getLogger(__name__)

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
_IMAGE_EXTS = tuple(e.lstrip(".") for e in IMAGE_EXTENSIONS)
_JSON_LABEL_KEYS = ("label", "cls", "class", "target")
#: Integer labels may name up to max(this, number of labelled samples) classes (see the module docstring).
MIN_CLASS_LIMIT = 1_000_000


def shard_files(folder: Path) -> list[Path]:
    """The ``.tar`` files directly in ``folder``, sorted by name."""
    # The name first: an image folder's thousands of files need no stat to be ruled out.
    return [Path(e.path) for e in list_folder(folder) if e.name.lower().endswith(".tar")
            and not e.name.startswith(".") and e.is_file()]


def is_wds_source(src: Path) -> bool:
    """``src`` is a .tar file or a folder holding .tar shards."""
    if src.is_file():
        return src.name.lower().endswith(".tar")
    return src.is_dir() and bool(shard_files(src))


def _label_of(members: dict[str, bytes], where: str) -> int | str | None:
    if "cls" in members:
        text = members["cls"].decode("utf-8", "replace").strip()
        try:
            return int(text)
        except ValueError:
            raise SourceError(f"{where}.cls: not a class index ({text[:40]!r})") from None
    if "json" in members:
        try:
            obj = json.loads(members["json"])
        except ValueError as exc:
            raise SourceError(f"{where}.json: not JSON ({exc})") from None
        except RecursionError:
            raise SourceError(f"{where}.json: not a label (JSON nested too deeply to parse)") from None
        if isinstance(obj, dict):
            for key in _JSON_LABEL_KEYS:
                value = obj.get(key)
                if isinstance(value, (int, str)) and not isinstance(value, bool):
                    return value
    return None


def _samples(shard: Path) -> Iterator[tuple[str, str, int, int, dict[str, bytes]]]:
    """(key, image extension, data offset, size, small members) of each sample in ``shard``."""
    try:
        tar = tarfile.open(shard, "r:")
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"{shard}: not a readable tar file ({exc})") from None
    with tar:
        key, group = None, []
        try:
            for m in tar:
                match = _KEY.match(m.name) if m.isfile() else None
                if match is None:
                    continue
                if match.group(1) != key and group:
                    yield _sample(tar, key, group)
                    group = []
                key = match.group(1)
                group.append((match.group(2).lower(), m))
        except tarfile.TarError as exc:
            raise SourceError(f"{shard}: damaged tar file ({exc})") from None
        if group:
            yield _sample(tar, key, group)


def _sample(tar: tarfile.TarFile, key: str, group: list) -> tuple[str, str, int, int, dict[str, bytes]]:
    image = next(((ext, m) for ext, m in group if ext in _IMAGE_EXTS), None)
    small = {ext: tar.extractfile(m).read() for ext, m in group if ext in ("cls", "json") and m.size < 1 << 20}
    if image is None:
        return key, "", 0, 0, small
    ext, m = image
    return key, ext, m.offset_data, m.size, small


class _Labels:
    """The labels read, as the shards give them: class indexes (8 bytes each) or class names (a number
    each, for the names seen so far); one kind only."""

    def __init__(self) -> None:
        self.ints = array.array("q")
        self.names: dict[str, int] = {}
        self.named = array.array("i")  # number of each sample's name in ``names``, in order of appearance

    def append(self, label: int | str, where: Path) -> None:
        if (self.named if isinstance(label, int) else self.ints):
            raise SourceError(f"{where}: labels mix class indexes and class names; use one kind")
        if isinstance(label, int):
            self.ints.append(label)
        else:
            self.named.append(self.names.setdefault(label, len(self.names)))

    def classes(self, member: Callable[[int], str]) -> tuple[list[str], np.ndarray]:
        """Class names and labels; ``member(i)``: where sample ``i``'s label was read, for messages."""
        if self.ints:
            raw = np.frombuffer(self.ints, dtype=np.int64)
            low, high = int(raw.min()), int(raw.max())
            if low < 0:
                raise SourceError(f"{member(int(raw.argmin()))}: negative class index {low} in the labels")
            limit = max(MIN_CLASS_LIMIT, len(raw))
            if high >= limit:
                raise SourceError(f"{member(int(raw.argmax()))}: class index {high:,} is too large: at most "
                                  f"{limit:,} classes (max of {MIN_CLASS_LIMIT:,} and the {len(raw):,} labelled "
                                  "samples) are taken from integer labels")
            return [str(i) for i in range(high + 1)], raw.astype(np.int32)
        names = sorted(self.names)  # labels are the names' positions, like ImageFolder's sorted class folders
        position = np.empty(len(names), dtype=np.int32)
        for i, name in enumerate(names):
            position[self.names[name]] = i
        return names, position[np.frombuffer(self.named, dtype=np.int32)]


def scan_wds(src: Path) -> Source:
    """Scan the shards of ``src`` (a .tar file, or a folder of them) into a :class:`Source`."""
    shards = [src] if src.is_file() else shard_files(src)
    root = src
    # compact columns, no Python object per sample (see packer.source.StringColumn)
    names, raw, sizes, shard_at, offset_at = StringBuilder(), _Labels(), IntBuilder("q"), IntBuilder("i"), \
        IntBuilder("q")
    ignored: list[str] = []
    for k, shard in enumerate(shards):
        for key, ext, offset, size, small in _samples(shard):
            rel = f"{shard.name}/{key}"
            label = _label_of(small, f"{shard}:{key}")
            if not ext or label is None:
                ignored.append(rel)
                continue
            raw.append(label, src)
            names.append(f"{rel}.{ext}")
            sizes.append(size)
            shard_at.append(k)
            offset_at.append(offset)
    paths, shard_of = names.build(), shard_at.build()
    if not len(paths):
        raise SourceError(f"{src}: no labelled images in the shards (each sample needs an image, e.g. key.jpg, "
                          "and a label: key.cls, or key.json with a \"label\")")
    if ignored:
        log.warning("%d sample(s) without an image or a label ignored, e.g. %s", len(ignored), ignored[0])
    def member(i: int) -> str:  # "<shard path>:<key> label": sample i, whose .cls (or .json) gave the label
        key = paths[i].partition("/")[2].rsplit(".", 1)[0]
        return f"{shards[shard_of[i]]}:{key} label"

    classes, labels = raw.classes(member)
    size_column = sizes.build()
    where = (shard_of, offset_at.build())
    source = Source(root, classes, paths, IntColumn(spilled(labels)), size_column, ignored=ignored, kind="wds",
                    details={"shards": len(shards), "first_shard": shards[0].name if shards else None})
    source.prepare = bytes_stage(lambda positions, opts: _read(shards, where, size_column, positions, opts))
    return source


def _read(shards: list[Path], where: tuple[Sequence[int], Sequence[int]], sizes: Sequence[int],
          positions: Sequence[int], opts: ImageOptions) -> Iterator[Any]:
    """The image bytes of the samples at ``positions`` (scan positions), in that order; a member whose
    header declares more than the byte budget is a reject, not read. ``where``: each sample's shard
    number and data offset."""
    fd, open_k = None, -1
    shard_of, offsets = where
    try:
        for pos in positions:
            k, offset = shard_of[pos], offsets[pos]
            try:
                check_file_size(sizes[pos], opts)
            except RejectedImage as exc:
                yield str(exc)
                continue
            if k != open_k:
                if fd is not None:
                    os.close(fd)
                fd, open_k = os.open(shards[k], os.O_RDONLY), k
            try:
                data = os.pread(fd, sizes[pos], offset)
            except OSError as exc:
                yield Unreadable(f"{shards[k]}: read error at byte {offset}: {exc.strerror or exc}")
                continue
            if len(data) != sizes[pos]:
                yield Unreadable(f"{shards[k]} changed while it was being packed (ends before byte "
                                 f"{offset + sizes[pos]}); re-run with --resume once the source is stable")
                continue
            yield data
    finally:
        if fd is not None:
            os.close(fd)
