"""LMDB writer: one environment (``data.mdb``) in the dataset folder.

Counterpart: ``readers/formats/lmdb.py``. Layout::

    key  b"0000000000" .. b"<N-1 as 10 digits>"  ->  encoded image bytes (as stored)
    key  b"__meta__"                             ->  the index metadata (UTF-8 JSON; index.json
                                                     adds file sizes, spec_version, checksum)

    key  b"<10 digits>/<name>"                   ->  a variable field's blob (typed fields; fixed
                                                     ones are field-<name>.npy beside it)

Keys are fixed-width digits, so LMDB's byte order is sample order and every
put is an append (``MDB_APPEND``: no page splits, dense pages). Labels live in
``labels.npy`` beside it (and in ``__meta__``'s class list for names).

``map_size`` starts at twice the source bytes (plus 1 GiB) -- LMDB's map is
virtual address space and the file grows only as pages are used. The writer
counts the pages each put takes; before the map could run out it commits and
doubles the map, so a pack never meets MDB_MAP_FULL (which would lose the
open transaction). Transactions commit every :data:`TXN_BYTES` (``packer.Writer``'s every
:data:`WRITER_TXN_BYTES`, :class:`StreamLmdbWriter`) and at every
checkpoint; a resume first deletes what was committed past the journal's
last checkpoint, so the samples kept always match the journal.

At the end ``data.mdb`` gets ``lmdbcheck.TAIL_PAD`` (128 KiB) of zero bytes
past the last page LMDB uses, which LMDB ignores: no page then lies near the
end of the file, so the readers' open check reads the two meta pages only.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from typing import Any, ClassVar

import lmdb

from packer.formats.base import FormatWriter
from packer.prepare.images import Prepared
from packer.prepare.readahead import outside_gil
from readers.contract import spec
from readers.contract.fields import lmdb_field_key
from readers.formats.lmdbcheck import TAIL_PAD, read_meta

__all__ = ["LmdbWriter", "StreamLmdbWriter", "TXN_BYTES", "WRITER_TXN_BYTES", "drop_keys_from"]

#: A write transaction commits after this many bytes of values, checkpoint or not. LMDB keeps a
#: transaction's dirty pages in malloc'd memory until commit and frees them there; 32 MB stays
#: under the heap size glibc keeps after :func:`_keep_freed_pages`, so the next transaction reuses
#: those pages instead of faulting in new ones. Commits between checkpoints are safe: a resume
#: deletes every key past the journal's last checkpoint (``open``).
TXN_BYTES = 32 << 20
#: ``packer.Writer``'s transactions (:class:`StreamLmdbWriter`): a quarter of a pack's.
WRITER_TXN_BYTES = 8 << 20
_SPARE_PAGES = 1024  # kept free in the map for the freelist, branch pages and the metadata value


def _keep_freed_pages() -> None:
    """Have glibc keep up to ~62 MB of freed heap instead of returning it to the kernel at once.

    Each commit frees the transaction's dirty pages (:data:`TXN_BYTES` of them); with glibc's
    initial trim threshold (128 KB) they go back to the kernel, and the next transaction faults
    every page in again. Where the source is read in another thread (``packer.prepare.readahead``), that
    thread's freed buffers cannot be reused for LMDB's pages either (another malloc arena): puts
    ran 5x slower (0.04 -> 0.20 s per 5,000 images). glibc raises its thresholds by itself when a
    large mapped block is freed (to its size, trim to twice that, for blocks up to 32 MB); freeing
    one such block here is that, once. It changes no setting and keeps glibc's adaptive mode, as any
    program that frees a 31 MB buffer would. Elsewhere than glibc it does nothing.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    libc.free(libc.malloc(31 << 20))


def _lmdb_error(exc: Exception, root: os.PathLike) -> OSError:
    """liblmdb reports a failed write as EIO (``mdb_txn_commit: Input/output error``): say ENOSPC
    when the filesystem is full, so the pack reports a full disk."""
    st = os.statvfs(root)
    code = errno.ENOSPC if st.f_bavail * st.f_frsize < (4 << 20) else errno.EIO
    return OSError(code, f"LMDB: {exc}", os.path.join(root, "data.mdb"))


def _pad_tail(data: os.PathLike) -> None:
    """Append ``TAIL_PAD`` zero bytes past the last page LMDB uses (it ignores them; the file stays
    a plain LMDB environment): then no page lies close enough to the end of the file for a damaged
    one to make liblmdb read past it, and a reader's open check reads the meta pages only."""
    fd = os.open(data, os.O_RDWR | os.O_CLOEXEC)
    try:
        used = read_meta(fd, str(data)).used_bytes
        if os.fstat(fd).st_size < used + TAIL_PAD:
            os.ftruncate(fd, used + TAIL_PAD)
            os.fsync(fd)
    finally:
        os.close(fd)


class LmdbWriter(FormatWriter):
    format = "lmdb"
    gil_free_commits = True
    #: a write transaction commits after this many bytes of values
    txn_bytes: ClassVar[int] = TXN_BYTES

    def initial_map_size(self) -> int:
        """Bytes of address space the map starts with (it grows when a pack needs more)."""
        return max(2 * self.estimated_bytes + (1 << 30), 1 << 30)

    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        map_size = self.initial_map_size()
        _keep_freed_pages()
        # meminit=True: unused parts of pages are zeroed, so no stale process
        # memory lands in the file and the same input gives the same bytes.
        # metasync=False: a commit fdatasyncs its data pages but not its meta page (one sync, not
        # two). LMDB keeps its integrity; a system crash can only undo commits since the last
        # sync, and every checkpoint syncs, so the journal never claims more than the file keeps.
        self.env = lmdb.open(str(self.root), map_size=map_size, subdir=True, readahead=False,
                             meminit=True, max_dbs=0, sync=True, metasync=False)
        if self.env.info()["map_size"] < map_size:
            self.env.set_mapsize(map_size)
        # An append: this read transaction holds the previous generation's pages until finalize, so
        # LMDB reuses none of them for new ones while readers (lock=False, unseen) may read them.
        self._pin = self.env.begin() if self.options.append else None
        with self.env.begin(write=True) as txn:  # drop samples past the last checkpoint
            cursor = txn.cursor()
            if cursor.set_range(spec.lmdb_key(samples)):
                while cursor.key() and cursor.key() != spec.LMDB_META_KEY:
                    cursor.delete()
            txn.delete(spec.LMDB_META_KEY)
        if self.field_store is not None:
            self.field_store.open(samples)
        # variable fields' values, put in key order after the image (MDB_APPEND needs ascending keys)
        self._var = sorted(((lmdb_field_key(b"", f.name), i) for i, f in enumerate(self.extra) if not f.type.fixed))
        self._psize = self.env.stat()["psize"]
        self._txn = self.env.begin(write=True)
        self._committed()
        self._since_checkpoint = 0

    def _committed(self) -> None:
        """After a commit: pages in use, the map's size in pages, an empty transaction."""
        info = self.env.info()
        self._base_pages, self._map_pages = info["last_pgno"] + 1, info["map_size"] // self._psize
        self._txn_pages = self._txn_bytes = 0

    def _put(self, key: bytes, value: bytes) -> None:
        size = len(value)
        # Pages this value takes (overflow pages, plus one for its share of leaf and branch pages).
        pages = (size + 16 + self._psize - 1) // self._psize + 1
        if self._base_pages + self._txn_pages + pages + _SPARE_PAGES > self._map_pages:
            self._grow(pages)
        try:
            self._txn.put(key, value, append=True)
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc
        self._txn_pages += pages
        self._txn_bytes += size
        self._since_checkpoint += size

    def _grow(self, pages: int) -> None:
        """Commit, then double the map (or more) before it could run out: a transaction that hits
        MDB_MAP_FULL is lost, and no transaction keeps its values to replay them."""
        used = self._base_pages + self._txn_pages  # after the commit, at most this many pages
        self._commit(max(2 * self._map_pages, 2 * (used + pages + 2 * _SPARE_PAGES)) * self._psize)

    def append(self, sample_no: int, prepared: Prepared, label: int,
               fields: tuple[bytes, ...] | None = None) -> tuple[()]:
        key = spec.lmdb_key(sample_no)
        self._put(key, prepared.data)
        if fields is not None or self.extra:
            blobs = self.store_fields(fields)
            for suffix, i in self._var:
                self._put(key + suffix, blobs[i])
        if self._txn_bytes >= self.txn_bytes:
            self._commit()
        return ()

    def at_checkpoint_boundary(self) -> bool:
        return self._since_checkpoint >= self.options.checkpoint_bytes

    def _commit(self, map_size: int | None = None) -> None:
        """Commit the open transaction and begin the next; ``map_size``: resize the map in between
        (no write transaction may be open while it is resized)."""
        try:
            with outside_gil():  # a packer.Writer's caller checks its next samples meanwhile
                self._txn.commit()  # data pages fdatasync'd; the meta page is flushed by the next sync
            if map_size is not None:
                self.env.set_mapsize(map_size)
            self._txn = self.env.begin(write=True)
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc
        self._committed()

    def checkpoint(self) -> dict[str, Any]:
        self._commit()
        try:
            with outside_gil():
                self.env.sync(True)  # metasync=False: the last commit's meta page is durable from here
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc
        if self.field_store is not None:
            self.field_store.checkpoint()
        self._since_checkpoint = 0
        return {}

    def finalize(self, meta: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
        try:
            self._put(spec.LMDB_META_KEY, json.dumps(meta, sort_keys=True).encode())
            self._txn.commit()
            self.env.sync(True)
            self._unpin()
        except lmdb.Error as exc:
            raise _lmdb_error(exc, self.root) from exc
        self.env.close()
        data = self.root / spec.DATA_FILE[self.format]
        _pad_tail(data)
        files = {data.name: data.stat().st_size}
        if self.field_store is not None:
            files.update(self.field_store.finalize(meta["num_samples"], meta=meta))
        return {"files": files}

    def _unpin(self) -> None:
        pin, self._pin = getattr(self, "_pin", None), None
        if pin is not None:
            pin.abort()

    def abort(self) -> None:
        if self.field_store is not None:
            self.field_store.close()
        try:
            self._unpin()
            self._txn.abort()
            self.env.close()
        except lmdb.Error:
            pass


class StreamLmdbWriter(LmdbWriter):
    """LMDB for ``packer.Writer``, whose samples come from the caller's thread: transactions of
    :data:`WRITER_TXN_BYTES`, so each commit writes pages still in the CPU cache (32 MB of L3 here) and
    the last commit before the index is small.

    Measured (2,000 bench_writer samples, 96 MB, ``validate=False``, 6 writes each way): commits and
    the final checkpoint took 83-96 ms of wall time together at 8 MB, 103-187 ms at 32 MB (their CPU
    32-36 ms against 40-115 ms); 5 processes each way, interleaved: median 12.5k against 11.1k samples/s.
    A pack, fed by its read-ahead thread, is not faster with them (466 MB: commits 348-433 ms at 8 MB,
    304-368 ms at 32 MB), so it keeps :data:`TXN_BYTES`."""

    txn_bytes = WRITER_TXN_BYTES


def drop_keys_from(root: os.PathLike, samples: int) -> None:
    """Delete every key of samples ``samples`` on (an interrupted append rolled back), in one commit."""
    env = lmdb.open(str(root), subdir=True, readahead=False, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(spec.lmdb_key(samples)):
                while cursor.key() and cursor.key() != spec.LMDB_META_KEY:
                    cursor.delete()
        env.sync(True)
    finally:
        env.close()
