"""LMDB writer: one environment (``data.mdb``) in the dataset folder.

Counterpart: ``readers/formats/lmdb.py``. Layout::

    key  b"0000000000" .. b"<N-1 as 10 digits>"  ->  encoded image bytes (as stored)
    key  b"__meta__"                             ->  the index metadata (UTF-8 JSON; index.json
                                                     adds file sizes, spec_version, checksum)

Keys are fixed-width digits, so LMDB's byte order is sample order and every
put is an append (``MDB_APPEND``: no page splits, dense pages). Labels live in
``labels.npy`` beside it (and in ``__meta__``'s class list for names).

``map_size`` starts at twice the source bytes (plus 1 GiB) -- LMDB's map is
virtual address space and the file grows only as pages are used -- and if it
still runs out, the pending transaction is replayed into a doubled map, so a
pack never dies with MDB_MAP_FULL. Transactions commit at checkpoints only,
so the committed state always matches the journal.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import lmdb

from packer.formats.base import FormatWriter
from packer.images import Prepared
from readers import spec

__all__ = ["LmdbWriter"]


def _lmdb_error(exc: Exception, root: os.PathLike) -> OSError:
    """liblmdb reports a failed write as EIO (``mdb_txn_commit: Input/output error``): say ENOSPC
    when the filesystem is full, so the pack reports a full disk."""
    st = os.statvfs(root)
    code = errno.ENOSPC if st.f_bavail * st.f_frsize < (4 << 20) else errno.EIO
    return OSError(code, f"LMDB: {exc}", os.path.join(root, "data.mdb"))


class LmdbWriter(FormatWriter):
    format = "lmdb"

    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        map_size = max(2 * self.estimated_bytes + (1 << 30), 1 << 30)
        # meminit=True: unused parts of pages are zeroed, so no stale process
        # memory lands in the file and the same input gives the same bytes.
        self.env = lmdb.open(str(self.root), map_size=map_size, subdir=True, readahead=False,
                             meminit=True, max_dbs=0, sync=True, metasync=True)
        if self.env.info()["map_size"] < map_size:
            self.env.set_mapsize(map_size)
        with self.env.begin(write=True) as txn:  # drop samples past the last checkpoint
            cursor = txn.cursor()
            if cursor.set_range(spec.lmdb_key(samples)):
                while cursor.key() and cursor.key() != spec.LMDB_META_KEY:
                    cursor.delete()
            txn.delete(spec.LMDB_META_KEY)
        self._txn = self.env.begin(write=True)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def _put(self, key: bytes, value: bytes) -> None:
        try:
            self._txn.put(key, value, append=True)
        except lmdb.MapFullError:
            self._txn.abort()
            self.env.set_mapsize(self.env.info()["map_size"] * 2)
            self._txn = self.env.begin(write=True)
            for k, v in self._pending:
                self._txn.put(k, v, append=True)
            self._txn.put(key, value, append=True)
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc

    def append(self, sample_no: int, prepared: Prepared, label: int) -> tuple[()]:
        key = spec.lmdb_key(sample_no)
        self._put(key, prepared.data)
        self._pending.append((key, prepared.data))
        self._pending_bytes += len(prepared.data)
        return ()

    def at_checkpoint_boundary(self) -> bool:
        return self._pending_bytes >= self.options.checkpoint_bytes

    def checkpoint(self) -> dict[str, Any]:
        try:
            self._txn.commit()  # sync=True: durable on return
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc
        self._txn = self.env.begin(write=True)
        self._pending.clear()
        self._pending_bytes = 0
        return {}

    def finalize(self, meta: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
        try:
            self._put(spec.LMDB_META_KEY, json.dumps(meta, sort_keys=True).encode())
            self._txn.commit()
            self.env.sync(True)
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc
        self.env.close()
        data = self.root / spec.DATA_FILE[self.format]
        return {"files": {data.name: data.stat().st_size}}

    def abort(self) -> None:
        try:
            self._txn.abort()
            self.env.close()
        except lmdb.Error:
            pass
