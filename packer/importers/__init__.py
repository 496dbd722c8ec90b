"""Sources other than an image folder: data in the forms users already have.

* WebDataset tar shards written by other tools (:mod:`packer.importers.wds`);
* a Hugging Face ``datasets`` image dataset, saved to disk or as Parquet
  (:mod:`packer.importers.hf`; needs the optional ``datasets`` package).

:func:`scan_import` recognizes them by their files and returns one
:class:`packer.sources.source.Source` per split, each with its own prepare stage
(``source.prepare``) that reads the images' bytes; validation, rejects,
journal and summary are the folder's (``packer.pipeline``).
"""

from __future__ import annotations

import re
from pathlib import Path

from packer.errors import SourceError
from packer.importers.hf import is_hf_source, scan_hf
from packer.importers.wds import is_wds_source, scan_wds, shard_files
from packer.sources.source import Source, list_folder

__all__ = ["scan_import", "source_kind"]


def _holds_shards(folder: Path) -> bool:
    """Recognition only: a folder that cannot be listed holds no shards here (the folder scan names it)."""
    try:
        return is_wds_source(folder)
    except OSError:
        return False


def _wds_splits(src: Path) -> list[Path]:
    """Sub-folders of ``src`` holding .tar shards, when those are all it holds (``train/``, ``val/``).

    The first sub-folder without shards rules the layout out: an image folder's class folders are
    not all listed here (that was a second full listing of the source before its scan), only one.
    """
    if not src.is_dir() or _holds_shards(src):
        return []
    try:
        subdirs = [Path(e.path) for e in list_folder(src) if e.is_dir() and not e.name.startswith(".")]
    except OSError:
        return []
    for d in subdirs:
        if not _holds_shards(d):
            return []
    return subdirs


def source_kind(src: Path) -> str:
    """"wds", "hf" or "folder" (an ImageFolder tree, or anything else: the folder scan judges it)."""
    if _holds_shards(src) or _wds_splits(src):
        return "wds"
    try:
        if is_hf_source(src):
            return "hf"
    except OSError:  # cannot be read: the folder scan names what
        pass
    return "folder"


def _split_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "data"


def scan_import(src: Path) -> list[tuple[str, Source]] | None:
    """(split, source) for each split of ``src`` when it is WebDataset shards or a Hugging Face
    dataset; None when it is none of these (then it is scanned as an image folder)."""
    kind = source_kind(src)
    if kind == "folder":
        return None
    if kind == "wds":
        splits = _wds_splits(src)
        if splits:
            found = [(_split_name(d.name), scan_wds(d)) for d in splits]
        else:
            found = [(_split_name(src.stem if src.is_file() else src.name), scan_wds(src))]
    else:
        found = [(_split_name(split), source) for split, source in scan_hf(src)]
    names = [n for n, _ in found]
    if len(set(names)) != len(names):
        raise SourceError(f"{src}: splits {', '.join(names)} would share an output folder; rename them")
    for _name, source in found:  # what the user named: `pack-dataset info` resumes with it
        source.details.update(given=str(src.resolve()), splits=len(found))
    return found
