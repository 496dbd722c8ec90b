"""What every format writer implements; ``packer.pipeline`` drives it.

A writer only knows how to open its files, append one sample, make what it
has written durable (a checkpoint) and finish. The pipeline owns the rest:
the source, parallel preparation, index arrays, journal, resume, progress.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from packer.images import Prepared
from packer.options import PackOptions

__all__ = ["FormatWriter"]


class FormatWriter(ABC):
    format: str = ""
    #: index arrays this writer fills per sample besides labels/checksums/sizes
    fields: tuple[str, ...] = ()
    #: True when samples are decoded pixels rather than encoded bytes
    pixels: bool = False

    def __init__(self, root: Path, split: str, options: PackOptions, estimated_bytes: int) -> None:
        self.root = root
        self.split = split
        self.options = options
        self.estimated_bytes = estimated_bytes

    @abstractmethod
    def open(self, done: int, state: dict[str, Any] | None) -> None:
        """Start writing; on resume, drop anything past ``done`` samples / ``state``."""

    @abstractmethod
    def write(self, index: int, sample: Prepared, label: int) -> dict[str, int]:
        """Append one sample; return its values for ``fields``."""

    @abstractmethod
    def ready(self) -> bool:
        """True when this is a good moment for a checkpoint (e.g. a shard just closed)."""

    @abstractmethod
    def checkpoint(self) -> dict[str, Any]:
        """Make all samples written so far durable; return state needed to resume."""

    def seal(self) -> None:
        """All samples are written: reach a durable boundary (wds closes its open shard)."""

    @abstractmethod
    def close(self, meta: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
        """Finish the data files (durably) given the final index arrays; return extra metadata."""

    def abort(self) -> None:
        """Release handles after an error; the journal keeps the output resumable."""
