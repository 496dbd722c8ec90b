"""Find the images of an ImageFolder tree (``root/<class>/<image>``) in a stable order.

Only regular files are packed: a FIFO, socket or device named like an image
(or a symlink to one, with ``--follow-symlinks``) is ignored and counted
with the non-image files, with a warning naming it; nothing ever opens it.

Splits: a source whose sub-folders are named like splits (:data:`SPLIT_NAMES`,
any letter case, optionally followed by digits or a word like ``set``:
``train``, ``val2017``, ``train_set``) and
are each an ImageFolder tree is packed split by split, unless told
otherwise (``splits="none"``: one dataset; ``"a,b"``: exactly those
sub-folders). Any other nesting (``root/cat/2020/x.jpg``) is one dataset
whose classes are the top folders, as torchvision's ImageFolder reads it.

Memory: a :class:`Source` holds its paths, labels, sizes and modification
times as columns (``packer.sources.columns``: no Python object per file; past 1 MB a
column lives in a mapped temporary file). Inside :func:`listings` (``plan``)
every folder is listed once, whether to recognize the source or to scan it.
"""

from __future__ import annotations

import array
import contextlib
import contextvars
import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from packer.sources.columns import CHUNK, IntBuilder, IntColumn, StringBuilder, StringColumn, spilled
from packer.errors import SourceError
from readers.contract import spec

__all__ = ["IMAGE_EXTENSIONS", "SPLIT_NAMES", "Source", "SourceError", "scan", "scan_listing", "URLRoot",
           "find_split_dirs", "parse_splits", "list_folder", "listings", "StringColumn", "StringBuilder", "IntColumn",
           "IntBuilder"]

log = logging.getLogger(__name__)

#: torchvision's ImageFolder extensions (``torchvision.datasets.folder.IMG_EXTENSIONS``), plus ``.mpo``
#: (multi-picture JPEGs from cameras), matched in any letter case. What a file is, its content decides.
TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGE_EXTENSIONS = TORCHVISION_EXTENSIONS + (".mpo",)

#: Sub-folder names taken for splits, in any letter case, optionally followed by digits or one of
#: :data:`SPLIT_SUFFIXES` (``val2017``, ``train_set``, ``test-images``).
SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval", "evaluation",
               "holdout")
SPLIT_SUFFIXES = ("set", "data", "split", "images", "imgs")
_SPLIT_RE = re.compile(r"(%s)(?:[-_ ]?\d+|[-_ ]?(?:%s))?" % ("|".join(SPLIT_NAMES), "|".join(SPLIT_SUFFIXES)),
                       re.IGNORECASE)


#: entries hashed per step (bounds the Python objects alive at once)
_CHUNK = CHUNK
#: entries between two saved states of the fingerprint's hash (``Source._marks``)
_MARK_EVERY = 1 << 16


def _column(values: Any, dtype: Any) -> Any:
    """``values`` as an :class:`IntColumn` (lists, tuples, arrays); any other sequence is kept as it is."""
    if isinstance(values, IntColumn):
        return values
    if isinstance(values, (list, tuple, np.ndarray, array.array, range)):
        return IntColumn(np.asarray(values, dtype=dtype) if not isinstance(values, np.ndarray) else values)
    return values


def _strings(values: Any) -> Any:
    """``values`` as a :class:`StringColumn` (lists and tuples); any other sequence is kept as it is."""
    return StringColumn.of(values) if isinstance(values, (list, tuple)) else values


def _label_dtype(classes: int) -> Any:
    return np.int16 if classes <= np.iinfo(np.int16).max else np.int32


@dataclass
class Source:
    """One split: classes in sorted order and samples sorted by class then path.

    ``paths``, ``labels`` and ``sizes`` are sequences indexed by position; lists given to the
    constructor are turned into compact columns (:class:`StringColumn`, :class:`IntColumn`: no
    Python object per file). Any other sequence (``packer.tools.convert``'s names read on demand) is
    kept as it is.
    """

    root: Path
    classes: list[str]
    paths: Sequence[str]  # relative to root: "<class>/<file>" (or deeper, as ImageFolder walks)
    labels: Sequence[int]
    sizes: Sequence[int]
    ignored: list[str] = field(default_factory=list)  # files that are not images by name
    skipped_links: list[str] = field(default_factory=list)  # symlinks leaving root
    #: what the source is: "folder" (ImageFolder tree), "wds" (tar shards), "hf" (Hugging Face
    #: datasets), "dataset" (a packed dataset, for convert)
    kind: str = "folder"
    #: more about the source for index.json's "source" record (JSON-able)
    details: dict[str, Any] = field(default_factory=dict)
    #: the prepare stage that reads this source (``packer.prepare.workers.PrepareStage``); None: files under root
    prepare: Any = field(default=None, repr=False, compare=False)
    #: how the prepare stage reads ``paths`` (``read(rel) -> bytes``, ``where(rel) -> str``, e.g.
    #: ``packer.engines.io.StoreFiles`` for an s3:// folder); None: files under ``root``
    files: Any = field(default=None, repr=False, compare=False)
    _fingerprint: str | None = field(default=None, repr=False, compare=False)
    #: the order of ``paths`` as index.json records it (``scan`` gives the source order)
    order: dict = field(default_factory=lambda: {"kind": "source"})
    #: scan position of each entry of ``paths``, an int64 array (None: the scan order itself); sources
    #: read by position (``prepare`` stages of imports) follow it
    origin: np.ndarray | None = field(default=None, repr=False, compare=False)
    #: [entries hashed, their sha256, modification times hashed, their sha256] (``prefix_fingerprint``)
    _prefix: list | None = field(default=None, repr=False, compare=False)
    #: (position, sha256 of the entries before it) every _MARK_EVERY entries, kept by ``fingerprint``:
    #: the prefix fingerprint of any position starts from the mark before it, not from the top
    _marks: list | None = field(default=None, repr=False, compare=False)
    #: modification time (ns) of each entry of ``paths``, as an int64 array, where the source has them (a
    #: folder scan; None otherwise): ``prefix_fingerprint`` covers them, so ``--resume`` sees a file already
    #: packed that was rewritten with the same size
    mtimes: Any = field(default=None, repr=False, compare=False)
    #: the samples' typed fields (``readers.contract.fields.Schema``); None: image + label, as an ImageFolder gives.
    #: A source with other fields has its own ``prepare`` stage, whose outcomes carry the fields' blobs.
    schema: Any = field(default=None, repr=False, compare=False)
    #: the manifest or COCO json the samples are rows of (messages name it); None: ``root`` is the source
    file: Path | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.paths = _strings(self.paths)
        self.labels = _column(self.labels, _label_dtype(len(self.classes)))
        self.sizes = _column(self.sizes, np.int64)
        if self.origin is not None:
            self.origin = np.asarray(self.origin, dtype=np.int64)
        if self.mtimes is not None:
            self.mtimes = _column(self.mtimes, np.int64)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_prefix"] = state["_marks"] = None  # a hash object does not pickle; rebuilt on demand
        return state

    @property
    def total_bytes(self) -> int:
        return self.sizes.sum() if isinstance(self.sizes, IntColumn) else sum(self.sizes)

    def describe(self) -> dict[str, Any]:
        """Where the samples come from (index.json's ``source`` record and the journal)."""
        return {"root": str(self.root.resolve()), "kind": self.kind, **self.details}

    def fingerprint(self) -> str:
        """Hash of the file list and sizes: resume refuses a source that changed.

        Computed once (ImageNet: 1.28M entries, about a second) and cached:
        the journal records it at every checkpoint.
        """
        if self._fingerprint is None:
            h, marks, n = hashlib.sha256(), [], len(self.paths)
            for a in range(0, n, _MARK_EVERY):
                marks.append((a, h.copy()))
                for data in self._entries(a, min(a + _MARK_EVERY, n)):
                    h.update(data)
            marks.append((n, h.copy()))
            self._fingerprint, self._marks = h.hexdigest(), marks
        return self._fingerprint

    def ordered(self, kind: str, seed: int = 0) -> Source:
        """This source in the order to write: ``"source"`` (as scanned) or ``"shuffled"``.

        The one place a pack's sample order is decided (``packer.api.plan``), so the writer,
        the journal, ``--resume`` and any prepare engine see the same list. The fingerprint
        stays the scanned order's: it identifies the files, the order is a packing option.
        The shuffled paths are a permuted view of the scanned ones (one int64 a file).
        """
        if kind not in spec.ORDER_KINDS:
            raise ValueError(f"unknown order {kind!r}; choose one of {', '.join(spec.ORDER_KINDS)}")
        if kind == self.order["kind"] and self.order.get("seed", seed) == seed:
            return self
        if self.order["kind"] != "source":
            raise ValueError("ordered() applies to a source in scanned order")
        if kind == "source":
            return self
        perm = spilled(spec.order_permutation(len(self.paths), seed).astype(np.int64, copy=False))
        mtimes = None if self.mtimes is None else _take(self.mtimes, perm)
        return replace(self, paths=_take(self.paths, perm), labels=_take(self.labels, perm),
                       sizes=_take(self.sizes, perm), _fingerprint=self.fingerprint(),
                       order={"kind": kind, "seed": int(seed)}, origin=perm, _prefix=None, _marks=None,
                       mtimes=mtimes)

    def positions(self, start: int) -> Sequence[int]:
        """Scan positions of the samples from ``start`` on, in the order they are written."""
        return range(start, len(self.paths)) if self.origin is None else IntColumn(self.origin[start:])

    def _entries(self, a: int, b: int) -> Iterator[bytes]:
        """:func:`_entry` of the entries ``a`` to ``b``, joined a chunk at a time (what is hashed)."""
        paths = self.paths[a:b]
        if isinstance(paths, StringColumn) and isinstance(self.sizes, IntColumn) \
                and isinstance(self.labels, IntColumn):
            pos = a
            for chunk in paths.encoded_chunks():
                end = pos + len(chunk)
                sizes, labels = self.sizes.values(pos, end).tolist(), self.labels.values(pos, end).tolist()
                yield b"".join([b"%d\0%s\0%d\n" % (label, p, size) for p, size, label in zip(chunk, sizes, labels)])
                pos = end
            return
        batch: list[bytes] = []
        for p, s, label in zip(paths, self.sizes[a:b], self.labels[a:b]):
            batch.append(_entry(p, s, label))
            if len(batch) >= _CHUNK:
                yield b"".join(batch)
                batch.clear()
        yield b"".join(batch)

    def prefix_fingerprint(self, n: int) -> str:
        """Hash of the first ``n`` entries in writing order (``paths`` as they are: the resume
        check of the part already packed). Incremental: checkpoints ask for growing ``n``, so
        the whole pack hashes each entry once.

        With ``mtimes``, ``"<hash of the list>/<hash of their modification times>"``: the
        part after the slash changes when a file is rewritten with the same size."""
        pos, h, tpos, t = self._prefix if self._prefix is not None else (0, hashlib.sha256(), 0, hashlib.sha256())
        if pos > n:
            pos, h = 0, hashlib.sha256()
        if tpos > n:
            tpos, t = 0, hashlib.sha256()
        if self._marks:  # the whole list was hashed in this order: start from the mark before n
            k = min(n // _MARK_EVERY, len(self._marks) - 1)
            at, mark = self._marks[k] if self._marks[k][0] <= n else self._marks[k - 1]
            if pos < at <= n:
                pos, h = at, mark.copy()
        for data in self._entries(pos, n):
            h.update(data)
        if self.mtimes is not None:
            for a in range(tpos, n, _CHUNK):
                t.update(np.ascontiguousarray(self.mtimes.values(a, min(a + _CHUNK, n)), dtype="<i8").tobytes())
        self._prefix = [n, h, n, t]
        return h.copy().hexdigest() + ("" if self.mtimes is None else "/" + t.copy().hexdigest())

    def changed_last(self, n: int) -> str | None:
        """Of the first ``n`` files (a folder scan), the one whose inode changed last (``st_ctime``,
        which a rewrite or ``os.utime`` sets to now): the likely culprit when their times differ."""
        newest, found = -1, None
        for rel in self.paths[:n]:
            try:
                ctime = os.stat(Path(self.root) / rel).st_ctime_ns
            except OSError:
                continue
            if ctime > newest:
                newest, found = ctime, rel
        return found


def _take(values: Sequence, perm: np.ndarray) -> Sequence:
    take = getattr(values, "take", None)
    return take(perm) if take is not None else [values[i] for i in perm.tolist()]


def _entry(path: str, size: int, label: int) -> bytes:
    return f"{label}\0{path}\0{size}\n".encode("utf-8", "surrogateescape")


def _is_hidden(name: str) -> bool:
    """Dot files (``.DS_Store``, ``._x.jpg``) are hidden; a name starting with ``..`` is not."""
    return name.startswith(".") and not name.startswith("..")


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not _is_hidden(name)


_LISTINGS: contextvars.ContextVar[dict[str, list[os.DirEntry]] | None] = contextvars.ContextVar(
    "packer_source_listings", default=None)


@contextlib.contextmanager
def listings() -> Iterator[None]:
    """Within this block every folder is listed once (``packer.api.plan``: recognizing the source, finding
    its splits and scanning it). A listing taken to recognize the source is kept until the scan walks
    that folder and takes it; the scan keeps none, so what is kept is the few folders looked at first."""
    token = _LISTINGS.set({})
    try:
        yield
    finally:
        _LISTINGS.reset(token)


def list_folder(folder: str | os.PathLike, *, take: bool = False) -> list[os.DirEntry]:
    """The entries of ``folder`` sorted by name (OSError if it cannot be listed), listed once inside
    :func:`listings`; ``take``: the last use (the scan's), the listing is not kept."""
    cache, key = _LISTINGS.get(), os.fspath(folder)
    if cache is not None and key in cache:
        return cache.pop(key) if take else cache[key]
    with os.scandir(key) as it:
        entries = sorted(it, key=lambda e: e.name)
    if cache is not None and not take:
        cache[key] = entries
    return entries


def _listdir(folder: Path, *, take: bool = False) -> list[os.DirEntry]:
    try:
        return list_folder(folder, take=take)
    except OSError as exc:
        raise SourceError(f"{folder}: cannot read the folder ({exc.strerror or exc})") from None


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a symlink, as os.walk(followlinks=True) does
    except OSError:
        return False


def _walk(top: str, *, take: bool = False) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top, followlinks=True)`` (top-down, names sorted) over :func:`list_folder`, so a folder
    listed to recognize the source is not listed again; an unreadable folder is a SourceError."""
    dirs: list[str] = []
    files: list[str] = []
    for e in _listdir(Path(top), take=take):
        (dirs if _is_dir(e) else files).append(e.name)
    yield top, dirs, files
    for d in dirs:
        yield from _walk(os.path.join(top, d), take=take)


def _has_images(folder: Path) -> bool:
    for _dirpath, _dirs, files in _walk(os.fspath(folder)):
        if any(_is_image_name(f) for f in files):
            return True
    return False


def _is_tree(folder: Path) -> bool:
    """``folder`` is an ImageFolder tree: some sub-folder of it holds images."""
    return any(_is_dir(e) and not _is_hidden(e.name) and _has_images(Path(e.path)) for e in _listdir(folder))


def parse_splits(text: str) -> str:
    """``--splits``: ``auto``, ``none`` or comma-separated sub-folder names."""
    value = text.strip()
    if value in ("auto", "none"):
        return value
    names = [n.strip() for n in value.split(",")]
    if not value or any(not n or "/" in n or n in (".", "..") for n in names):
        raise ValueError(f"expected auto, none or sub-folder names separated by commas, got {text!r}")
    return ",".join(names)


def find_split_dirs(root: Path, splits: str = "auto") -> list[Path]:
    """Sub-folders of ``root`` to pack as splits (``train/``, ``val/``); [] for one dataset.

    ``auto``: the sub-folders named like splits (:data:`SPLIT_NAMES`) that are
    ImageFolder trees, when no other sub-folder holds images and none holds
    images directly. ``none``: []. ``"a,b"``: those sub-folders, which must be
    ImageFolder trees.
    """
    if splits == "none":
        return []
    if splits != "auto":
        chosen = [root / name for name in splits.split(",")]
        for d in chosen:
            if not d.is_dir() or not _is_tree(d):
                raise SourceError(f"{d}: --splits names it, but it is not a folder of class folders with images")
        return sorted(chosen)
    subdirs = [Path(e.path) for e in _listdir(root) if _is_dir(e) and not _is_hidden(e.name)]
    for d in subdirs:
        if any(e.is_file() and _is_image_name(e.name) for e in _listdir(d)):
            return []  # a class folder with images inside: root itself is the ImageFolder
    named = [d for d in subdirs if _SPLIT_RE.fullmatch(d.name)]
    splits_found = [d for d in named if _is_tree(d)]
    others = [d for d in subdirs if d not in splits_found and _has_images(d)]
    return [] if others else splits_found


def _class_folders(entries: list[os.DirEntry], real_root: Path, follow_symlinks: bool,
                   skipped: list[str]) -> list[str]:
    """Class folder names of the root's ``entries`` in sorted order; symlinked ones leaving the root go
    to ``skipped``."""
    classes = []
    for e in entries:
        if not _is_dir(e) or _is_hidden(e.name):
            continue
        if e.is_symlink() and not follow_symlinks and not Path(e.path).resolve().is_relative_to(real_root):
            skipped.append(e.name)
            continue
        classes.append(e.name)
    return classes


def _walk_class(root: Path, cls: str, real_root: Path, follow_symlinks: bool,
                skipped: list[str]) -> list[tuple[str, list[str]]]:
    """(folder, sorted file names) for every folder under ``root/cls``, in ImageFolder's order.

    torchvision's ImageFolder order: sorted(os.walk(class_dir)), then sorted file names
    (files directly in a folder come before those of its sub-folders).
    """
    steps = []
    visited: set[str] = set()
    for dirpath, dirnames, filenames in _walk(os.path.join(root, cls), take=True):
        real = os.path.realpath(dirpath)
        if real in visited:  # a symlink loop
            dirnames.clear()
            continue
        visited.add(real)
        for d in list(dirnames):
            full = Path(dirpath) / d
            if full.is_symlink() and not follow_symlinks and not full.resolve().is_relative_to(real_root):
                dirnames.remove(d)
                skipped.append(full.relative_to(root).as_posix())
        steps.append((dirpath, filenames))  # sorted by name already
    return sorted(steps)


def scan(root: str | os.PathLike, *, follow_symlinks: bool = False) -> Source:
    """Scan ``root/<class>/...`` like torchvision's ImageFolder, deterministically."""
    root = Path(root)
    if not root.exists():
        raise SourceError(f"{root}: no such folder")
    if not root.is_dir():
        raise SourceError(f"{root}: not a folder (expected an ImageFolder tree root/<class>/<image>)")
    real_root = root.resolve()
    skipped: list[str] = []
    top = _listdir(root, take=True)  # listed once: class folders, and the loose files ignored
    classes = _class_folders(top, real_root, follow_symlinks, skipped)
    loose = [e.name for e in top if not _is_hidden(e.name) and e.is_file()]
    del top
    # No Python object per file is kept: ImageNet has 1.28M of them (compact columns, see StringColumn)
    paths, sizes, mtimes = StringBuilder(), IntBuilder("q"), IntBuilder("q")
    labels = IntBuilder("h" if _label_dtype(len(classes)) == np.int16 else "i")
    ignored: list[str] = []
    special: list[str] = []
    for label, cls in enumerate(classes):
        for dirpath, filenames in _walk_class(root, cls, real_root, follow_symlinks, skipped):
            rel_dir = Path(dirpath).relative_to(root).as_posix()
            try:  # each file's lstat relative to its folder: the kernel resolves one name, not the whole path
                folder = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                raise SourceError(f"{dirpath}: cannot read the folder ({exc.strerror})") from exc
            try:
                for name in filenames:
                    # plain strings and one lstat per regular file: ImageNet has 1.28M of them
                    rel = f"{rel_dir}/{name}" if rel_dir != "." else name
                    if not _is_image_name(name):
                        ignored.append(rel)
                        continue
                    try:
                        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                        if stat.S_ISLNK(st.st_mode):
                            full = os.path.join(dirpath, name)
                            if not follow_symlinks and not Path(full).resolve().is_relative_to(real_root):
                                skipped.append(rel)
                                continue
                            st = os.stat(full)
                    except OSError as exc:
                        raise SourceError(f"{os.path.join(dirpath, name)}: cannot read ({exc.strerror})") from exc
                    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the pack, a device never ends
                        special.append(rel)
                        ignored.append(rel)
                        continue
                    paths.append(rel)
                    labels.append(label)
                    sizes.append(st.st_size)
                    mtimes.append(st.st_mtime_ns)
            finally:
                os.close(folder)
    if special:
        log.warning("%d file(s) named like images are not regular files (FIFO, device, socket) and are "
                    "ignored: %s", len(special), ", ".join(str(root / r) for r in special[:5]))
    ignored.extend(loose)  # sorted by name already
    if not len(paths):
        hint = ""
        if any(_is_image_name(n) for n in loose):
            hint = " (the images lie directly in it: put them in one sub-folder per class)"
        raise SourceError(f"{root}: no images found ({'/'.join(IMAGE_EXTENSIONS)} in root/<class>/){hint}")
    label_column = labels.build()
    counts = np.bincount(label_column.array, minlength=len(classes))
    empty = [c for i, c in enumerate(classes) if not counts[i]]
    if empty:
        log.warning("%d class folder(s) hold no images and keep their label: %s", len(empty), ", ".join(empty[:5]))
    return Source(root, classes, paths.build(), label_column, sizes.build(), ignored, skipped,
                  mtimes=mtimes.build())


class URLRoot(str):
    """The root of a source under an object-store prefix: joins like a ``Path``, prints as its URL."""

    def __truediv__(self, rel: str) -> URLRoot:
        return URLRoot(f"{self.rstrip('/')}/{rel}")

    def resolve(self) -> URLRoot:
        return self

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]


def scan_listing(root: URLRoot, objects: dict[str, int]) -> Source:
    """:func:`scan`'s result for a listing of ``name -> size`` under an object-store prefix.

    The folder scan's rules on object names: class folders are the first name
    components (not hidden), images are chosen by :func:`_is_image_name`, and the
    order is ImageFolder's (by folder, then by name); objects directly under the
    prefix are ignored. An object store has no links and no empty folders.
    """
    folders: dict[str, list[str]] = {}
    loose: list[str] = []
    for name in objects:
        top, sep, _rest = name.partition("/")
        if name.endswith("/"):
            continue  # a "folder" marker some tools create
        if not sep:
            if not _is_hidden(name):
                loose.append(name)
        elif not _is_hidden(top):
            folders.setdefault(top, []).append(name)
    classes = sorted(folders)
    if classes and all(_SPLIT_RE.fullmatch(c) and all(n.count("/") >= 2 for n in folders[c]) for c in classes):
        raise SourceError(f"{root}: holds split folders ({', '.join(classes)}); pack each split's prefix "
                          f"on its own (e.g. {root / classes[0]})")
    paths, labels, sizes, ignored = StringBuilder(), IntBuilder("i"), IntBuilder("q"), []
    for label, cls in enumerate(classes):
        for name in sorted(folders.pop(cls), key=lambda n: tuple(n.rsplit("/", 1))):
            if _is_image_name(name.rsplit("/", 1)[1]):
                paths.append(name)
                labels.append(label)
                sizes.append(objects[name])
            else:
                ignored.append(name)
    ignored.extend(sorted(loose))
    if not len(paths):
        raise SourceError(f"{root}: no images found ({'/'.join(IMAGE_EXTENSIONS)} in root/<class>/)")
    return Source(root, classes, paths.build(), labels.build(), sizes.build(), ignored)  # type: ignore[arg-type]
