"""How engine tasks reach the source files and publish finished files: two small, picklable objects.

A task runs on whichever node the cluster picks. It reads source images
only through a *source* (``read(rel) -> bytes``) and publishes a finished
file only through an *output* (``temp_path(name)``: where to write it
locally, then ``put(tmp, name)``: make it appear whole under its final
name). The implementations here serve a folder that every node sees at the
same path (a local disk for a one-machine cluster, NFS or another shared
filesystem for many). :class:`StoreFiles` and :class:`StoreOutput` are the
same methods over ``readers.remote``'s ``Store`` (``s3://``), for clusters
with no shared filesystem: a source object is one GET; a finished file is
written to the task's own local temp folder, then ``store.put`` (an object
appears whole or not at all) and the temp file is deleted. Stores pickle and
rebuild their client in each worker process. See docs/distributed.md.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from packer.prepare.workers import read_source  # the local pool's reader: the same checks, the same errors
from readers.contract import spec

__all__ = ["LocalFiles", "LocalOutput", "StoreFiles", "StoreOutput", "list_objects"]


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
        spec.publish(tmp, self.root / name)

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


class StoreFiles:
    """Source images under an object-store prefix (``s3://bucket/imagenet/train``): one GET each."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def read(self, rel: str) -> bytes:
        """The bytes of object ``rel``; OSError naming its URL if it cannot be read (missing: a FileNotFoundError)."""
        return self.store.read(rel)

    def where(self, rel: str) -> str:
        return self.store.url_of(rel)


class _ObjectReader:
    """``open_read`` of a store object: ``read()`` gives its bytes in consecutive large range requests."""

    def __init__(self, store: Any, name: str) -> None:
        self._chunks = store.stream(name)  # a missing object raises FileNotFoundError on the first read

    def read(self, _size: int = -1) -> bytes:
        return next(self._chunks, b"")

    def __enter__(self) -> _ObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._chunks.close()


class StoreOutput:
    """Finished files as objects of a store (``s3://bucket/prefix``), written by tasks on any node."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def temp_path(self, name: str) -> Path:
        """A fresh local path on the task's own node (its temp folder) to write ``name`` to."""
        folder = Path(tempfile.gettempdir()) / "dataset-packer-tasks"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{name.replace('/', '_')}.{uuid.uuid4().hex[:12]}.tmp"

    def put(self, tmp: Path, name: str) -> None:
        """Upload the complete file ``tmp`` as object ``name`` (whole or not at all), then delete ``tmp``."""
        try:
            self.store.put(name, tmp)
        finally:
            tmp.unlink(missing_ok=True)

    def open_read(self, name: str) -> _ObjectReader:
        if not self.store.exists(name):
            raise FileNotFoundError(self.store.url_of(name))
        return _ObjectReader(self.store, name)

    def remove_except(self, pattern: str, keep: set[str]) -> None:
        """Delete the objects (directly under the prefix) matching glob ``pattern`` not named in ``keep``."""
        for name in self.store.list():
            if "/" not in name and fnmatch.fnmatchcase(name, pattern) and name not in keep:
                self.store.delete(name)

    def where(self, name: str) -> str:
        return self.store.url_of(name)


def list_objects(store: Any) -> dict[str, int]:
    """``name -> size`` of every object under the store's prefix, in one listing (``Store.list`` gives
    names only, and a HEAD per object would cost a round trip per image): the store's public
    ``list_sizes`` (:class:`readers.remote.fsspec_store.FsspecStore`)."""
    return store.list_sizes()
