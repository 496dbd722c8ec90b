"""Find the images of an ImageFolder tree (``root/<class>/<image>``) in a stable order."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from packer.errors import SourceError
from readers import spec

__all__ = ["IMAGE_EXTENSIONS", "Source", "SourceError", "scan", "find_split_dirs"]

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


@dataclass
class Source:
    """One split: classes in sorted order and samples sorted by class then path."""

    root: Path
    classes: list[str]
    paths: list[str]  # relative to root: "<class>/<file>" (or deeper, as ImageFolder walks)
    labels: list[int]
    sizes: list[int]
    ignored: list[str] = field(default_factory=list)  # files that are not images by name
    skipped_links: list[str] = field(default_factory=list)  # symlinks leaving root
    _fingerprint: str | None = field(default=None, repr=False, compare=False)
    #: the order of ``paths`` as index.json records it (``scan`` gives the source order)
    order: dict = field(default_factory=lambda: {"kind": "source"})

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def fingerprint(self) -> str:
        """Hash of the file list and sizes: resume refuses a source that changed.

        Computed once (ImageNet: 1.28M entries, about a second) and cached:
        the journal records it at every checkpoint.
        """
        if self._fingerprint is None:
            self._fingerprint = self._hash()
        return self._fingerprint

    def ordered(self, kind: str, seed: int = 0) -> Source:
        """This source in the order to write: ``"source"`` (as scanned) or ``"shuffled"``.

        The one place a pack's sample order is decided (``packer.api.plan``), so the writer,
        the journal, ``--resume`` and any prepare engine see the same list. The fingerprint
        stays the scanned order's: it identifies the files, the order is a packing option.
        """
        if kind not in spec.ORDER_KINDS:
            raise ValueError(f"unknown order {kind!r}; choose one of {', '.join(spec.ORDER_KINDS)}")
        if kind == self.order["kind"] and self.order.get("seed", seed) == seed:
            return self
        if self.order["kind"] != "source":
            raise ValueError("ordered() applies to a source in scanned order")
        if kind == "source":
            return self
        perm = spec.order_permutation(len(self.paths), seed).tolist()
        return Source(self.root, self.classes, [self.paths[i] for i in perm], [self.labels[i] for i in perm],
                      [self.sizes[i] for i in perm], self.ignored, self.skipped_links, self.fingerprint(),
                      {"kind": kind, "seed": int(seed)})

    def _hash(self) -> str:
        h = hashlib.sha256()
        for p, s, label in zip(self.paths, self.sizes, self.labels):
            h.update(f"{label}\0{p}\0{s}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _has_images(folder: Path) -> bool:
    for _dirpath, _dirs, files in os.walk(folder):
        if any(_is_image_name(f) for f in files):
            return True
    return False


def find_split_dirs(root: Path) -> list[Path]:
    """Sub-folders of ``root`` that are themselves ImageFolder trees (``train/``, ``val/``).

    ``root`` holds splits when none of its sub-folders has images directly
    inside but each of their own sub-folders does (one level deeper).
    """
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        return []
    for d in subdirs:
        if any(f.is_file() and _is_image_name(f.name) for f in d.iterdir()):
            return []
    splits = [d for d in subdirs if any(c.is_dir() and _has_images(c) for c in d.iterdir())]
    deep = all(
        not any(f.is_file() and _is_image_name(f.name) for c in d.iterdir() if c.is_dir() for f in c.iterdir())
        for d in splits
    )
    return [] if deep else splits


def _class_folders(root: Path, real_root: Path, follow_symlinks: bool, skipped: list[str]) -> list[str]:
    """Class folder names in sorted order; symlinked ones leaving ``root`` go to ``skipped``."""
    try:
        classes = []
        for e in sorted(os.scandir(root), key=lambda e: e.name):
            if not e.is_dir() or e.name.startswith("."):
                continue
            if e.is_symlink() and not follow_symlinks and not Path(e.path).resolve().is_relative_to(real_root):
                skipped.append(e.name)
                continue
            classes.append(e.name)
    except PermissionError as exc:
        raise SourceError(f"{root}: cannot list the folder ({exc.strerror})") from exc
    return classes


def _walk_class(root: Path, cls: str, real_root: Path, follow_symlinks: bool,
                skipped: list[str]) -> list[tuple[str, list[str]]]:
    """(folder, sorted file names) for every folder under ``root/cls``, in ImageFolder's order.

    torchvision's ImageFolder order: sorted(os.walk(class_dir)), then sorted file names
    (files directly in a folder come before those of its sub-folders).
    """
    steps = []
    visited: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True):
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
        steps.append((dirpath, sorted(filenames)))
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
    classes = _class_folders(root, real_root, follow_symlinks, skipped)
    paths: list[str] = []
    labels: list[int] = []
    sizes: list[int] = []
    ignored: list[str] = []
    for label, cls in enumerate(classes):
        for dirpath, filenames in _walk_class(root, cls, real_root, follow_symlinks, skipped):
            rel_dir = Path(dirpath).relative_to(root).as_posix()
            for name in filenames:
                # plain strings and one lstat per regular file: ImageNet has 1.28M of them
                rel = f"{rel_dir}/{name}" if rel_dir != "." else name
                if not _is_image_name(name):
                    ignored.append(rel)
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                    if stat.S_ISLNK(st.st_mode):
                        if not follow_symlinks and not Path(full).resolve().is_relative_to(real_root):
                            skipped.append(rel)
                            continue
                        st = os.stat(full)
                except OSError as exc:
                    raise SourceError(f"{full}: cannot read ({exc.strerror})") from exc
                paths.append(rel)
                labels.append(label)
                sizes.append(st.st_size)
    loose = [e.name for e in os.scandir(root) if e.is_file() and not e.name.startswith(".")]
    ignored.extend(sorted(loose))
    if not paths:
        hint = ""
        if any(_is_image_name(n) for n in loose):
            hint = " (the images lie directly in it: put them in one sub-folder per class)"
        raise SourceError(f"{root}: no images found (.jpg/.jpeg/.png in root/<class>/){hint}")
    used = set(labels)
    empty = [c for i, c in enumerate(classes) if i not in used]
    if empty:
        log.warning("%d class folder(s) hold no images and keep their label: %s", len(empty), ", ".join(empty[:5]))
    return Source(root, classes, paths, labels, sizes, ignored, skipped)
