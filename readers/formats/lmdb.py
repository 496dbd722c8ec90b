"""LMDB reader. Counterpart: ``packer/formats/lmdb.py`` (layout there).

The environment opens read-only, without the lock file (``lock=False``: the
data never changes after packing). Readahead stays on: the usual advice
(``readahead=False`` for random access) is for small values; an image is
~100 KB, and without readahead a cold read faults it in 4 KB page by page
(measured here after cache eviction: about 600 samples/s without readahead,
9,000 with it).
A batch is read in one read transaction.

Remote (``s3://``, ``http(s)://``): py-lmdb opens only local files, so
``data.mdb`` is downloaded when the dataset is opened (parallel ranged
GETs, resumable, verified) into ``cache_dir``, or without one into a
temporary folder removed when the dataset is dropped; it is then opened
from there as a single file (see docs/remote.md).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import lmdb

from readers import spec
from readers.base import LazyHandle, MapReader
from readers.perprocess import PerProcess

__all__ = ["LMDBDataset"]


def _close_inherited(envs: dict[str, list]) -> None:
    """A forked child's copy of its parent's registry: py-lmdb would refuse to re-open them."""
    for env, _users in envs.values():
        env.close()  # unmaps this process's copy only (lock=False: no shared lock table)


# py-lmdb refuses to open one environment twice in a process, so readers of
# the same folder share it: path -> [env, users], one registry per process.
_ENVS: PerProcess[dict[str, list]] = PerProcess(dict, inherited=_close_inherited)


def _acquire(root: str, subdir: bool = True) -> lmdb.Environment:
    envs = _ENVS.get()  # forked: the parent's environments are closed here, not reused
    entry = envs.get(root)
    if entry is None:
        env = lmdb.open(root, readonly=True, lock=False, readahead=True, meminit=False, subdir=subdir)
        entry = envs[root] = [env, 0]
    entry[1] += 1
    return entry[0]


def _acquire_file(file: Callable[[], str]) -> lmdb.Environment:
    """A remote dataset's cached ``data.mdb``, opened as a single file (the cache folder holds others)."""
    return _acquire(os.path.realpath(file()), subdir=False)


def _release_env(root: str, _env: lmdb.Environment) -> None:
    _release(root)


def _release_by_env(env: lmdb.Environment) -> None:
    _release(env.path())  # the registry key it was opened under


def _release(root: str) -> None:
    envs = _ENVS.peek()  # None in a process that never opened one (or forked since)
    entry = envs.get(root) if envs is not None else None
    if entry is not None:
        entry[1] -= 1
        if entry[1] <= 0:
            entry[0].close()
            del envs[root]


class LMDBDataset(MapReader):
    format = "lmdb"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        if self.remote is not None:
            self._fetch_data()
            file = self.file_ref(self.data_name)
            self._env = LazyHandle(functools.partial(_acquire_file, file), _release_by_env)
            return
        root = os.path.realpath(self.root)
        self._env = LazyHandle(functools.partial(_acquire, root), functools.partial(_release_env, root))

    def _get(self, txn: Any, i: int) -> bytes:
        value = txn.get(spec.lmdb_key(i))
        if value is None:
            raise spec.DatasetFormatError(f"{self.data_location}: sample {i} (key {spec.lmdb_key(i).decode()}) "
                                          "is missing")
        return value

    def read(self, i: int) -> bytes:
        with self._env.get().begin(buffers=False) as txn:
            return self._get(txn, i)

    def read_many(self, indices: list[int]) -> list[bytes]:
        with self._env.get().begin(buffers=False) as txn:
            return [self._get(txn, i) for i in indices]

    def close(self) -> None:
        self._env.close()
        super().close()
