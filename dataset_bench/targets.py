"""What a benchmark reads: packed datasets (packed here when asked) and the source folder.

A :class:`Target` names the files a reader reads (what a cold run evicts),
its sample count and its data bytes, from which MB/s follows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from dataset_bench.naive import NaiveImageFolder
from readers.contract.spec import FORMATS

__all__ = ["NAIVE", "Target", "dataset_target", "folder_target", "pack_formats", "index_source"]

NAIVE = "naive"  # the naive baseline's name in rows, tables and charts
MB = 1e6


@dataclass
class Target:
    """Something to read: a packed dataset (``name`` = its format) or the naive folder."""

    name: str
    path: Path
    files: list[Path]  # what the reader reads (evicted for cold runs)
    samples: int
    data_bytes: int

    @property
    def bytes_per_sample(self) -> float:
        return self.data_bytes / self.samples if self.samples else 0.0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "samples": self.samples,
                "data_mb": round(self.data_bytes / MB, 1), "files": len(self.files),
                "kb_per_sample": round(self.bytes_per_sample / 1e3, 1)}


def dataset_target(path: str | os.PathLike) -> Target:
    """A packed dataset folder as a :class:`Target` (data files from its index)."""
    from readers.contract import spec

    meta = spec.read_index(path).meta
    files = [Path(path) / name for name in sorted(meta.get("files", {}))]
    data = sum(f.stat().st_size for f in files)
    return Target(meta["format"], Path(path), files, int(meta["num_samples"]), data)


def folder_target(src: str | os.PathLike) -> Target:
    """The source image folder as the naive baseline's :class:`Target`."""
    ds = NaiveImageFolder(src)
    return Target(NAIVE, Path(src), [Path(f) for f in ds.files], len(ds), sum(ds.sizes))


def index_source(path: str | os.PathLike) -> str | None:
    """The source folder a packed dataset's index records, or None."""
    from readers.contract import spec

    return spec.read_index(path).meta.get("source", {}).get("root")


def pack_formats(src: str | os.PathLike, out_root: str | os.PathLike, formats: Sequence[str] = FORMATS, *,
                 workers: int | None = None, mmap_resize: int = 256, shard_count: int | None = None,
                 shard_size: int | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Pack ``src`` into each format under ``out_root/<format>`` (mmap at ``mmap_resize``); format -> folder.

    ``shard_count`` / ``shard_size`` apply to ``wds``; ``progress(format)``
    is called after each format is packed.
    """
    from packer.api import pack
    from packer.options import PackOptions

    out = {}
    Path(out_root).mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        kw: dict[str, Any] = {}
        if fmt == "mmap":
            kw["resize"] = mmap_resize
        if fmt == "wds" and shard_count:
            kw["shard_count"] = shard_count
        if fmt == "wds" and shard_size:
            kw["shard_size"] = shard_size
        results = pack(src, Path(out_root) / fmt, PackOptions(format=fmt, workers=workers, overwrite=True, **kw))
        out[fmt] = results[0].out
        if progress is not None:
            progress(fmt)
    return out
