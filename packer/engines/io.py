"""How engine tasks reach the source files and publish finished files: two small, picklable objects.

A task runs on whichever node the cluster picks. It reads source images
only through a *source* (``read(rel) -> bytes``) and publishes a finished
file only through an *output* (``temp_path(name)``: where to write it
locally, then ``put(tmp, name)``: make it appear whole under its final
name). The implementations here serve a folder that every node sees at the
same path (a local disk for a one-machine cluster, NFS or another shared
filesystem for many). Object storage is another pair of implementations of
the same five methods over ``readers.remote``'s ``Store`` (``read``,
``put``, ``list``, ``delete``): a temp file in the task's local temp
folder, then ``store.put``. See docs/distributed.md.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from packer.workers import read_source  # the local pool's reader: the same checks, the same errors
from readers import spec

__all__ = ["LocalFiles", "LocalOutput"]


class LocalFiles:
    """Source images under ``root``, a folder every node sees at the same path."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def read(self, rel: str) -> bytes:
        """The bytes of source file ``rel``; OSError if it cannot be read (or is no longer a regular file)."""
        return read_source(self.root / rel)

    def where(self, rel: str) -> str:
        """How messages name source file ``rel``."""
        return str(self.root / rel)


class LocalOutput:
    """Finished files in ``root``, a folder every node sees at the same path."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def temp_path(self, name: str) -> Path:
        """A fresh path to write ``name`` to before :meth:`put`; unique per call, so a retried
        task never writes into a file a killed attempt left behind. It lies beside the final
        name (same filesystem: the rename in ``put`` is atomic) and matches ``<name>*``, so a
        sweep for the final names' prefix finds leftovers too."""
        return self.root / f"{name}.{uuid.uuid4().hex[:12]}.tmp"

    def put(self, tmp: Path, name: str) -> None:
        """Publish the complete, fsynced file ``tmp`` as ``name``, atomically."""
        os.replace(tmp, self.root / name)
        spec.fsync_dir(self.root)

    def open_read(self, name: str):
        """A binary file object for reading finished file ``name`` (FileNotFoundError if absent)."""
        return open(self.root / name, "rb")

    def remove_except(self, pattern: str, keep: set[str]) -> None:
        """Delete the files matching glob ``pattern`` whose names are not in ``keep``."""
        for p in self.root.glob(pattern):
            if p.name not in keep:
                p.unlink(missing_ok=True)

    def where(self, name: str) -> str:
        return str(self.root / name)
