"""A remote dataset's data files as a reader uses them: local copies in a node cache, or byte ranges.

Every reader of a remote dataset holds one :class:`RemoteFiles`. It knows
the store, each file's size and CRC-32 from the index (``files``,
``files_crc32``, and for wds each shard's entry), and the cache:

* with ``cache_dir``: a shared :class:`~readers.remote.cache.NodeCache`
  (all processes and jobs on the node that name the same folder share it);
* without: a private temporary cache, created only if a format needs a
  local file (py-lmdb opens files only), removed when the creating process
  drops the reader or exits.

:meth:`fetch` downloads a file into the cache (parallel ranged GETs,
resumable, verified against the index's size and CRC-32); :meth:`local`
does the same and pins the copy in this process until :meth:`close`, so
eviction never removes a file a reader has open. :meth:`read_range` reads
bytes without any local copy.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Mapping

from readers.contract.perprocess import PerProcess
from readers.contract.spec import recorded_files
from readers.remote.cache import NodeCache, Pin
from readers.remote.download import TransferProgress
from readers.remote.store import Store

log = logging.getLogger(__name__)

__all__ = ["RemoteFiles"]

def _release_pins(pins: dict[str, Pin]) -> None:
    for pin in pins.values():
        pin.release()
    pins.clear()


def _remove_private(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker's copy of the reader never removes its parent's folder
        shutil.rmtree(path, ignore_errors=True)


class RemoteFiles:
    """Sizes, checksums and local copies of the files of one remote dataset."""

    def __init__(self, store: Store, meta: Mapping[str, Any], cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None) -> None:
        self.store = store
        recorded = recorded_files(meta)  # the one reading of the sizes and CRC-32s index.json records
        self.sizes: dict[str, int] = {k: size for k, (size, _) in recorded.items() if size is not None}
        self.crcs: dict[str, int] = {k: crc for k, (_, crc) in recorded.items() if crc is not None}
        if cache_limit is not None and cache_dir is None:
            raise ValueError("cache_limit needs cache_dir (the folder the cache lives in)")
        self._cache = NodeCache(cache_dir, cache_limit) if cache_dir is not None else None
        self.private_dir: str | None = None
        self._pins: PerProcess[dict[str, Pin]] = PerProcess(dict, _release_pins)

    def __repr__(self) -> str:
        return f"RemoteFiles({self.store.url!r}, cache={self._cache!r})"

    @property
    def cached(self) -> bool:
        """True when the caller gave a cache folder (reads may then go through local copies)."""
        return self.private_dir is None and self._cache is not None

    def cache(self) -> NodeCache:
        """The cache: the shared one, or a private temporary one made now."""
        if self._cache is None:
            self.private_dir = tempfile.mkdtemp(prefix="dataset-packer-remote-")
            weakref.finalize(self, _remove_private, self.private_dir, os.getpid())
            self._cache = NodeCache(self.private_dir)
            log.info("%s: no cache_dir given; downloading into the temporary folder %s (removed when the "
                     "dataset is closed); pass cache_dir to keep the copy across runs", self.store.url,
                     self.private_dir)
        return self._cache

    def url_of(self, name: str) -> str:
        return self.store.url_of(name)

    def fetch(self, name: str, progress: TransferProgress | None = None) -> Path:
        """Local path of a complete, verified copy of ``name`` (downloaded now if needed; not pinned)."""
        return self.cache().fetch(self.store, name, size=self.sizes.get(name), crc32=self.crcs.get(name),
                                  progress=progress)

    def local(self, name: str) -> str:
        """Local path of ``name``, fetched if needed and pinned in this process until :meth:`close`."""
        pins = self._pins.get()
        pin = pins.get(name)
        if pin is None or not pin.path.exists():
            pin = pins[name] = self.cache().pin(self.store, name, size=self.sizes.get(name),
                                                crc32=self.crcs.get(name))
        return str(pin.path)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self.store.read_range(name, start, length)

    def close(self) -> None:
        """Unpin this process's local copies (they stay in the cache) and close its connections."""
        self._pins.close()
        self.store.close()
