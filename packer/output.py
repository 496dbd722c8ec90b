"""Output-folder policy: may ``out`` be written, and what may ``--overwrite`` delete.

``--overwrite`` deletes a previous output only when it holds nothing but
what pack-dataset wrote (one dataset, or one dataset per split), or is
empty: never a folder of someone else's files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from packer.errors import OutputError, OutputExistsError
from packer.options import PackOptions
from readers import spec

__all__ = ["prepare_output", "is_dataset"]


def is_dataset(path: Path) -> bool:
    """A folder written by pack-dataset: a parseable index or journal of ours."""
    for name in (spec.INDEX_NAME, spec.STATE_NAME):
        try:
            meta = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("format") in spec.FORMATS and (
                "spec_version" in meta or "fingerprint" in meta):
            return True
    return False


def _looks_like_ours(path: Path) -> bool:
    """``path`` holds only what pack-dataset wrote: one dataset, or split datasets."""
    if is_dataset(path):
        return True
    subdirs = [p for p in path.iterdir()]
    return bool(subdirs) and all(p.is_dir() and is_dataset(p) for p in subdirs)


def prepare_output(out: Path, options: PackOptions) -> None:
    """Check (before anything is written) that ``out`` may be written; clear it on overwrite.

    Missing parent folders of ``out`` are created (the last step, once every check passed).
    """
    if not out.exists():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{out.parent}: cannot create the output's parent folder "
                              f"({exc.strerror or exc})") from None
        return
    if not out.is_dir():
        raise OutputError(f"{out} exists and is a file; choose another output path")
    if not any(out.iterdir()):
        return
    if options.resume:
        return
    if not options.overwrite:
        raise OutputExistsError(
            f"{out} already exists; pass --overwrite to replace it or --resume to finish an interrupted pack"
        )
    if not _looks_like_ours(out):
        raise OutputExistsError(
            f"{out} is not empty and holds no dataset written by pack-dataset; refusing to delete it "
            "with --overwrite (choose an empty or new output folder)"
        )
    shutil.rmtree(out)
