"""Sources other than an image folder: data in the forms users already have.

* WebDataset tar shards written by other tools (:mod:`packer.importers.wds`);
* a Hugging Face ``datasets`` image dataset, saved to disk or as Parquet
  (:mod:`packer.importers.hf`; needs the optional ``datasets`` package).

:func:`scan_import` recognizes them by their files and returns one
:class:`packer.source.Source` per split, each with its own prepare stage
(``source.prepare``) that reads the images' bytes; validation, rejects,
journal and summary are the folder's (``packer.pipeline``).
"""

from __future__ import annotations

import re
from pathlib import Path

from packer.errors import SourceError
from packer.importers.hf import is_hf_source, scan_hf
from packer.importers.wds import is_wds_source, scan_wds, shard_files
from packer.source import Source

__all__ = ["scan_import", "source_kind"]


def _has_shards(folder: Path) -> bool:
    try:
        return bool(shard_files(folder))
    except OSError:  # an unreadable sub-folder holds no shards we can see; the folder scan names it
        return False


def _wds_splits(src: Path) -> list[Path]:
    """Sub-folders of ``src`` holding .tar shards, when those are all it holds (``train/``, ``val/``)."""
    if not src.is_dir() or shard_files(src):
        return []
    subdirs = sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    with_shards = [d for d in subdirs if _has_shards(d)]
    return with_shards if with_shards and len(with_shards) == len(subdirs) else []


def source_kind(src: Path) -> str:
    """"wds", "hf" or "folder" (an ImageFolder tree, or anything else: the folder scan judges it)."""
    if is_wds_source(src) or _wds_splits(src):
        return "wds"
    if is_hf_source(src):
        return "hf"
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
