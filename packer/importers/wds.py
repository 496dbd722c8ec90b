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

**Every member as a field.** Shards with members beyond the image and its label (img2dataset's
``key.jpg`` + ``key.txt`` + ``key.json``, ``key.boxes.npy``, ``key.mask.png``, ...), or whose
samples have no label, are imported with typed fields (``readers.contract.fields``): each member suffix
becomes a field, as ``readers.contract.fields.member_suffix`` names them (``txt`` -> field ``txt``,
``caption.txt`` -> ``caption``, ``cls`` -> ``label``), typed by its extension (``txt`` text,
``json`` json, ``cls`` int, ``npy`` an array of the dtype and shape the members have -- a
varying leading dim gives ``DTYPE[*,...]`` --, an image extension a second image, anything else
bytes). A sample lacking a member that others have is a one-line reject naming the shard, the
key and the field; so is a member its type cannot decode.
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
from packer.prepare.images import ImageOptions, RejectedImage, check_file_size
from packer.prepare.stage import Unreadable, bytes_stage, fields_stage, label_names
from packer.sources.columns import IntBuilder, IntColumn, StringBuilder, spilled
from packer.sources.source import IMAGE_EXTENSIONS, Source, list_folder
from readers.contract.fields import (NUMERIC_DTYPES, Field, FieldType, FieldTypeError, ImageType, NumericType, Schema,
                            check_field_name, parse_type)
from readers.contract.safeio import NPY_HEADER_LIMIT, npy_header

__all__ = ["is_wds_source", "scan_wds", "shard_files", "MIN_CLASS_LIMIT", "KEY", "IMAGE_EXTS", "JSON_LABEL_KEYS",
           "label_of", "Labels", "field_of", "npy_type"]

log = logging.getLogger(__name__)

KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
IMAGE_EXTS = tuple(e.lstrip(".") for e in IMAGE_EXTENSIONS)
JSON_LABEL_KEYS = ("label", "cls", "class", "target")
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


def label_of(members: dict[str, bytes], where: str) -> int | str | None:
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
            for key in JSON_LABEL_KEYS:
                value = obj.get(key)
                if isinstance(value, (int, str)) and not isinstance(value, bool):
                    return value
    return None


def _samples(shard: Path) -> Iterator[tuple[str, str, int, int, dict[str, bytes], dict[str, tuple[int, int]]]]:
    """(key, image extension, data offset, size, small members, every other member's (offset, size)) of each
    sample in ``shard``."""
    try:
        tar = tarfile.open(shard, "r:")
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"{shard}: not a readable tar file ({exc})") from None
    with tar:
        key = ""
        group: list[tuple[str, tarfile.TarInfo]] = []
        try:
            for m in tar:
                match = KEY.match(m.name) if m.isfile() else None
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


def _member_bytes(tar: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    fh = tar.extractfile(m)
    if fh is None:  # only regular files are grouped: not seen
        raise SourceError(f"{os.fsdecode(tar.name or '')}: member {m.name} is not a regular file")
    return fh.read()


def _sample(tar: tarfile.TarFile, key: str, group: list[tuple[str, tarfile.TarInfo]]
            ) -> tuple[str, str, int, int, dict[str, bytes], dict[str, tuple[int, int]]]:
    image = next(((ext, m) for ext, m in group if ext in IMAGE_EXTS), None)
    small = {ext: _member_bytes(tar, m) for ext, m in group if ext in ("cls", "json") and m.size < 1 << 20}
    others = {ext: (m.offset_data, m.size) for ext, m in group if image is None or m is not image[1]}
    if image is None:
        return key, "", 0, 0, small, others
    ext, m = image
    return key, ext, m.offset_data, m.size, small, others


class Labels:
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
    if _has_fields(shards):
        return _scan_fields(src, shards)
    # compact columns, no Python object per sample (see packer.sources.source.StringColumn)
    names, raw, sizes, shard_at, offset_at = StringBuilder(), Labels(), IntBuilder("q"), IntBuilder("i"), \
        IntBuilder("q")
    ignored: list[str] = []
    for k, shard in enumerate(shards):
        for key, ext, offset, size, small, _others in _samples(shard):
            rel = f"{shard.name}/{key}"
            label = label_of(small, f"{shard}:{key}")
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
    fd: int | None = None
    open_k = -1
    shard_of, offsets = where
    try:
        for pos in positions:
            k, offset = shard_of[pos], offsets[pos]
            try:
                check_file_size(sizes[pos], opts)
            except RejectedImage as exc:
                yield str(exc)
                continue
            if k != open_k or fd is None:
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


# ------------------------------------------------------------------------- every member as a field
def _has_fields(shards: list[Path]) -> bool:
    """Some sample holds members beyond its image and label (``cls`` / ``json``), or no sample has a label."""
    labelled = False
    for k, shard in enumerate(shards):
        for key, ext, _offset, _size, small, others in _samples(shard):
            if ext and any(e not in ("cls", "json") for e in others):  # samples without an image are ignored
                return True
            if ext and not labelled:
                try:
                    labelled = label_of(small, f"{shard}:{key}") is not None
                except SourceError:
                    return True  # a .json that is no label: a json field
    return not labelled


def field_of(suffix: str, where: str) -> tuple[str, str]:
    """(field name, type kind) of member suffix ``suffix``: ``caption.txt`` -> (caption, text)."""
    name, _, ext = suffix.rpartition(".")
    if not name:
        name = {"cls": "label"}.get(ext, ext)
    kind = {"txt": "text", "text": "text", "json": "json", "cls": "int", "npy": "npy"}.get(ext)
    if kind is None:
        kind = "image" if ext in IMAGE_EXTS else "bytes"
    try:
        check_field_name(name)
    except FieldTypeError as exc:
        raise SourceError(f"{where}: member suffix {suffix!r} cannot be a field ({exc})") from None
    return name, kind


def npy_type(arrays: list[tuple[np.dtype, tuple[int, ...]]], where: str) -> FieldType:
    dtypes = {d for d, _ in arrays}
    if len(dtypes) != 1:
        raise SourceError(f"{where}: the .npy members hold different dtypes ({', '.join(sorted(map(str, dtypes)))})")
    dtype = dtypes.pop()
    shapes = {s for _, s in arrays}
    if len(shapes) == 1 and all(d >= 1 for d in next(iter(shapes))):
        return NumericType(dtype, next(iter(shapes)))
    rest = {s[1:] for s in shapes}
    if len(rest) != 1 or any(len(s) == 0 for s in shapes):
        raise SourceError(f"{where}: the .npy members' shapes differ beyond their first dim ({sorted(shapes)[:3]})")
    return NumericType(dtype, (None, *rest.pop()))


def _npy_member(fd: int, offset: int, size: int) -> tuple[np.dtype, tuple[int, ...]]:
    """(little-endian dtype, shape) of the ``.npy`` member of ``size`` bytes at ``offset``: its header
    only is read, and checked against the member's size before anything is built from it
    (:func:`readers.contract.safeio.npy_header`, as the readers check it); ValueError with the reason."""
    head = os.pread(fd, min(size, 4096), offset)
    if len(head) >= 12 and head[6] in (2, 3):
        need = 12 + int.from_bytes(head[8:12], "little")
    else:
        need = 10 + int.from_bytes(head[8:10], "little") if len(head) >= 10 else 0
    if len(head) < need <= min(size, NPY_HEADER_LIMIT + 12):  # a header longer than numpy writes
        head = os.pread(fd, need, offset)
    h = npy_header(head, size)
    dtype = h.dtype.newbyteorder("<") if h.dtype.byteorder != "|" else h.dtype
    if dtype.name not in NUMERIC_DTYPES:
        raise ValueError(f"dtype {h.dtype.str} is not a field dtype ({', '.join(NUMERIC_DTYPES)})")
    return NUMERIC_DTYPES[dtype.name], tuple(h.shape)


def _scan_fields(src: Path, shards: list[Path]) -> Source:

    order: dict[str, str] = {}  # suffix -> field name, first seen first
    kinds: dict[str, str] = {}
    npy: dict[str, list] = {}
    bad_npy: dict[tuple[int, str], str] = {}  # (shard, key) -> why its .npy member is no field value
    samples = []  # (k, key, image ext, offset, size, others, label or None)
    for k, shard in enumerate(shards):
        fd = None
        try:
            for key, ext, offset, size, small, others in _samples(shard):
                label = label_of({"cls": small["cls"]}, f"{shard}:{key}") if "cls" in small else None
                if isinstance(label, int) and label < 0:
                    raise SourceError(f"{shard}:{key}.cls: negative class index {label}")
                samples.append((k, key, ext, offset, size, others, label))
                for suffix, (off, n) in others.items():
                    if suffix not in order:
                        order[suffix], kinds[suffix] = field_of(suffix, f"{shard}:{key}.{suffix}")
                    if kinds[suffix] == "npy":
                        fd = fd if fd is not None else os.open(shard, os.O_RDONLY)
                        try:
                            npy.setdefault(suffix, []).append(_npy_member(fd, off, n))
                        except ValueError as exc:  # this sample is rejected, the others packed
                            bad_npy.setdefault((k, key), f"{shard}:{key}.{suffix}: not a .npy array of numbers "
                                                         f"({exc})")
        finally:
            if fd is not None:
                os.close(fd)
    fields = [Field("image", ImageType())]
    types: dict[str, FieldType] = {}
    for suffix, name in order.items():
        kind = kinds[suffix]
        if kind == "npy":
            if not npy.get(suffix):
                raise SourceError(f"{src}: no member .{suffix} is a .npy array of numbers (e.g. "
                                  f"{next(iter(bad_npy.values()))})")
            try:
                t = npy_type(npy[suffix], f"{src}: member .{suffix}")
                parse_type(t.name)  # what index.json will say must read back
            except FieldTypeError as exc:
                raise SourceError(f"{src}: member .{suffix}: {exc}") from None
        elif kind == "int":
            t = NumericType("int32" if name == "label" else "int64")
        else:
            t = parse_type(kind)
        types[suffix] = t
        fields.append(Field(name, t))
    try:
        schema = Schema(tuple(fields))
    except FieldTypeError as exc:
        raise SourceError(f"{src}: {exc}") from None
    extra = schema.extra_fields
    suffix_of = {name: suffix for suffix, name in order.items()}
    paths: list[str] = []
    labels: list[int] = []
    sizes: list[int] = []
    entries: list[Any] = []  # per sample: (image ref, field refs, where), or why it is rejected
    ignored: list[str] = []
    needed = [f.name for f in schema.fields[1:]]
    for k, key, ext, offset, size, others, label in samples:
        rel = f"{shards[k].name}/{key}"
        if not ext:
            ignored.append(rel)
            continue
        where = f"{shards[k]}:{key}"
        missing = [name for name in needed if suffix_of[name] not in others]
        paths.append(f"{rel}.{ext}")
        sizes.append(size)
        labels.append(label if isinstance(label, int) and schema.labels_field is not None else 0)
        if missing:
            entries.append(f"{where}: no member {key}.{suffix_of[missing[0]]} (field {missing[0]!r})")
            continue
        if (k, key) in bad_npy:
            entries.append(bad_npy[(k, key)])
            continue
        entries.append(((k, offset, size), tuple((k, *others[suffix_of[f.name]]) for f in extra), where))
    if not paths:
        raise SourceError(f"{src}: no images in the shards (each sample needs an image, e.g. key.jpg)")
    if ignored:
        log.warning("%d sample(s) without an image ignored, e.g. %s", len(ignored), ignored[0])
    classes = label_names(schema.labels_field, labels, src, MIN_CLASS_LIMIT) if schema.labels_field else []
    source = Source(src, classes, paths, labels, sizes, ignored=ignored, kind="wds", schema=schema,
                    details={"shards": len(shards), "first_shard": shards[0].name if shards else None})
    source.prepare = fields_stage(entries, extra, reader=lambda: _MemberReader(shards), members=True)
    return source


class _MemberReader:
    """Reads ``(shard number, offset, size)`` members, one shard open at a time."""

    def __init__(self, shards: list[Path]) -> None:
        self.shards = shards
        self._fd: int | None = None
        self._k = -1

    def read(self, ref: tuple[int, int, int], opts: ImageOptions | None = None) -> bytes:
        k, offset, size = ref
        if opts is not None:
            check_file_size(size, opts)
        if k != self._k or self._fd is None:
            self.close()
            self._fd, self._k = os.open(self.shards[k], os.O_RDONLY | os.O_CLOEXEC), k
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise OSError(f"{self.shards[k]} changed while it was being packed (ends before byte {offset + size})")
        return data

    def values(self, refs: tuple) -> tuple[bytes, ...]:
        return tuple(self.read(r) for r in refs)

    def where(self, ref: tuple[int, int, int]) -> str:
        return str(self.shards[ref[0]])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._k = None, -1
