"""LMDB reader. Counterpart: ``packer/formats/lmdb.py`` (layout there).

The environment opens read-only, without the lock file (``lock=False``: what a
reader reads never changes after packing; an append adds keys while holding a read
transaction on the previous generation, so no page of it is reused meanwhile:
``readers.contract.generations``). Readahead stays on: the usual advice
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

LMDB maps ``data.mdb`` into memory, and a page past the end of a truncated
file kills the process with SIGBUS. So before the environment opens (once
per process and file), the file must be a regular file (inside the dataset
folder when local), at least the size index.json records, and pass
:mod:`readers.formats.lmdbcheck`: meta pages, file length and the pages
near the end of the file, O(1) pages (a tree of at most 256 pages is read
whole). Every B-tree page is checked by ``verify`` (``full=True``), not in
each reader process: see lmdbcheck for what that leaves to ``verify``. Each
value must be as long as ``sizes.npy`` says before it is copied out of the map.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import lmdb
import numpy as np

from readers.contract import spec
from readers.formats.base import MapReader
from readers.formats.batch import Allocator, byte_batch, finish_batch, index_array
from readers.contract.fields import Field, lmdb_field_key
from readers.formats.lmdbcheck import check_file
from readers.contract.perprocess import PerProcess

__all__ = ["LMDBDataset"]


def _close_inherited(envs: dict[str, list]) -> None:
    """A forked child's copy of its parent's registry: py-lmdb would refuse to re-open them."""
    for env, _users in envs.values():
        env.close()  # unmaps this process's copy only (lock=False: no shared lock table)


# py-lmdb refuses to open one environment twice in a process, so readers of
# the same folder share it: path -> [env, users], one registry per process.
_ENVS: PerProcess[dict[str, list]] = PerProcess(dict, inherited=_close_inherited)


def check_data_file(path: str, size: int | None, *, full: bool = False) -> None:
    """Raise DatasetFormatError unless liblmdb may map ``path`` (readers.formats.lmdbcheck): a regular
    file of at least ``size`` bytes whose meta pages and last pages (``full``: B-tree) stay inside it."""
    fd = spec.open_data_file(path, size)
    try:
        check_file(fd, path, full=full)
    finally:
        os.close(fd)


def _acquire(root: str, subdir: bool = True, size: int | None = None) -> lmdb.Environment:
    envs = _ENVS.get()  # forked: the parent's environments are closed here, not reused
    entry = envs.get(root)
    if entry is None:
        path = str(spec.member_path(root, spec.DATA_FILE["lmdb"], "data file")) if subdir else root
        check_data_file(path, size)
        try:
            env = lmdb.open(root, readonly=True, lock=False, readahead=True, meminit=False, subdir=subdir)
        except lmdb.Error as exc:
            raise spec.DatasetFormatError(f"{path}: cannot open the LMDB environment ({exc})") from None
        entry = envs[root] = [env, 0]
    entry[1] += 1
    return entry[0]


def _acquire_file(file: Callable[[], str], size: int | None = None) -> lmdb.Environment:
    """A remote dataset's cached ``data.mdb``, opened as a single file (the cache folder holds others)."""
    return _acquire(os.path.realpath(file()), subdir=False, size=size)


def _release_env(root: str, _env: lmdb.Environment) -> None:
    _release(root)


def _release_by_env(env: lmdb.Environment) -> None:
    _release(env.path())  # the registry key it was opened under


def _release(root: str) -> None:
    envs = _ENVS.peek()  # None in a process that never opened one (or forked since)
    entry = envs.get(root) if envs is not None else None
    if envs is None or entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        entry[0].close()
        del envs[root]


class LMDBDataset(MapReader):
    format = "lmdb"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._sizes = self.index.arrays["sizes"]
        size = (self.meta.get("files") or {}).get(self.data_name)
        if self.remote is not None:
            self._fetch_data()
            file = self.file_ref(self.data_name)
            self._env = PerProcess(functools.partial(_acquire_file, file, size), _release_by_env)
            return
        root = os.path.realpath(self.root)
        self._env = PerProcess(functools.partial(_acquire, root, True, size), functools.partial(_release_env, root))

    def _view(self, txn: Any, i: int) -> memoryview:
        """Sample ``i``'s value as a buffer into the map (nothing copied), its size checked."""
        try:
            value = txn.get(spec.lmdb_key(i))
        except lmdb.Error as exc:
            raise spec.DatasetFormatError(f"{self.data_location} sample {i}: unreadable ({exc})") from None
        if value is None:
            raise spec.DatasetFormatError(f"{self.data_location}: sample {i} (key {spec.lmdb_key(i).decode()}) "
                                          "is missing")
        if len(value) != self._sizes[i]:
            raise spec.DatasetFormatError(f"{self.data_location} sample {i}: stored value is {len(value)} bytes, "
                                          f"{spec.array_file('sizes')} says {self._sizes[i]}: damaged")
        return value

    def _txn(self) -> Any:
        env = self._env.get()
        try:
            try:
                return env.begin(buffers=True)
            except lmdb.MapResizedError:  # an append grew the map since this process opened it
                env.set_mapsize(0)
                return env.begin(buffers=True)
        except lmdb.Error as exc:
            raise spec.DatasetFormatError(f"{self.data_location}: cannot read ({exc})") from None

    def _read(self, indices: list[int]) -> list[bytes]:
        with self._txn() as txn:
            return [bytes(self._view(txn, i)) for i in indices]

    def read(self, i: int) -> bytes:
        return self._read([i])[0]

    def _read_blobs(self, i: int, fields: Sequence[Field]) -> dict[str, bytes]:
        """Variable fields: the values at ``lmdb_key(i) + b"/" + name`` (docs/fields.md), one
        transaction; fixed ones are ``field-<name>.npy`` columns (``PackedDataset._column``)."""
        out = {}
        with self._txn() as txn:
            for f in fields:
                key = lmdb_field_key(spec.lmdb_key(i), f.name)
                try:
                    value = txn.get(key)
                except lmdb.Error as exc:
                    raise spec.DatasetFormatError(f"{self.data_location} sample {i} field {f.name!r}: "
                                                  f"unreadable ({exc})") from None
                if value is None:
                    raise spec.DatasetFormatError(f"{self.data_location}: sample {i} field {f.name!r} (key "
                                                  f"{key.decode()}) is missing")
                out[f.name] = bytes(value)
        return out

    def read_many(self, indices: list[int]) -> list[bytes]:
        return self._read(indices)

    def batchable(self) -> bool:
        return not self.decode and self.fields is None

    def get_batch(self, indices: list[int], alloc: Allocator | None = None) -> tuple | None:
        """``decode=False``: the batch's values copied straight out of the map into one ByteBatch
        (one transaction, no per-sample ``bytes``; each value's size checked as in ``read``);
        see ``readers.formats.batch``. None when decoding."""
        if not self.batchable():
            return None
        idx = index_array(indices, len(self.labels))
        sizes = self._sizes[idx]
        with self._txn() as txn:
            get, key = txn.get, spec.lmdb_key
            try:
                views = [get(key(i)) for i in idx.tolist()]
            except (lmdb.Error, TypeError):
                views = [self._view(txn, int(i)) for i in idx]  # the per-sample path names the sample
            got = np.fromiter((-1 if v is None else len(v) for v in views), dtype=np.int64, count=len(views))
            for k in np.flatnonzero(got != sizes):  # a missing or resized value: the per-sample error
                self._view(txn, int(idx[k]))
            batch = byte_batch(views, sizes, alloc)
        return finish_batch(self, batch, idx)

    def close(self) -> None:
        self._env.close()
        super().close()
