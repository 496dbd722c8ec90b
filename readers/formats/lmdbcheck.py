"""Check an LMDB file before liblmdb maps it, so that what it reads lies inside the file.

liblmdb trusts its file. It maps the whole map size (usually far larger than
the file), so a page number, node offset or value size that points past the
end of the file makes it touch unbacked memory and the process dies with
SIGBUS. It does check one thing itself: a page number at or beyond
``last_pg + 1`` (from the meta page it picks) is ``MDB_PAGE_NOTFOUND``.

Two levels of checking:

**The open check** (:func:`check_file`, once per process and file; O(1)
pages, whatever the size of the database):

1. **Meta pages**: both must be LMDB meta pages of data version 1 with the
   same page size; liblmdb uses the one with the larger transaction id. The
   file must hold ``(last_pg + 1) * page_size`` bytes. Database flags must be
   those of a plain database (no duplicates, no integer or reverse keys, no
   fixed key size), as the packer writes them.
2. **The last pages**: inside a branch or leaf page, liblmdb reads at most
   :data:`REACH` bytes from the page's start whatever the page says (node
   pointer array, node headers, up to 10 key bytes compared: the packer's
   keys, and a big value's overflow page number). Only a page starting less
   than that before the end of the file can make those reads leave it: each
   such page that liblmdb would take for a branch or leaf must pass the
   full page check below. The packer pads ``data.mdb`` with
   :data:`TAIL_PAD` zero bytes, so for its packs there is none. When one
   fails (it may only be the bytes of a big value, never read as a page) the
   whole tree is checked, which decides.
3. A tree of at most :data:`SMALL_PAGES` pages is checked whole (bounded
   cost: at most 1 MB read at 4 KB pages).

**The full check** (``full=True``: ``pack-dataset verify``): every branch
and leaf page reachable from the root (each read once, with ``pread``,
never mapped): the page header names its own number, the page is a branch
or leaf, every node offset and key lies inside the page, every child is a
page number below ``last_pg + 1`` met only once, the tree is at most 32
levels deep (liblmdb's cursor stack). A leaf value is either inside its
page or, for a big value, on overflow pages that end before ``last_pg + 1``.
It reads every branch and leaf page, which for thumbnails is the whole file
(1.3 s per process at 1.28M, ~100 s at 100M): it used to run in every
reader process and now runs in ``verify``.

What the open check leaves to ``verify``: in a tree of more than
:data:`SMALL_PAGES` pages, a leaf away from the end of the file whose value
size or overflow page number was damaged (or crafted) to reach past the end
of the file. py-lmdb touches every page of a value it returns (it prefaults
them, inside ``txn.get`` and ``Cursor.value``), before the reader can
compare the value's size with ``sizes.npy``: the reader process then dies
with SIGBUS. ``pack-dataset verify`` finds and names such a page.

Results are cached per process for an unchanged file (same inode, size and
mtime), and forked DataLoader workers inherit the cache.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from readers.contract import spec

__all__ = ["LmdbMeta", "read_meta", "check_file", "TAIL_PAD"]

_P_BRANCH, _P_LEAF, _P_META = 0x01, 0x02, 0x08
_F_BIGDATA = 0x01
_MAGIC, _DATA_VERSION = 0xBEEFC0DE, 1
_HDR = 16  # page header: pgno u64, pad u16, flags u16, lower u16, upper u16
_NODE = 8  # node header: lo u16, hi u16, flags u16, ksize u16
_P_INVALID = 2**64 - 1
_MAX_DEPTH = 32  # liblmdb's CURSOR_STACK
_BATCH = 1024  # pages checked per vectorized step
#: Bytes past the start of a page that liblmdb may read taking it for a branch or leaf: pointer array
#: (lower <= 65535), a node header at a pointer <= 65535 (8 bytes), up to 10 key bytes compared
#: and a big value's 8-byte overflow page number.
REACH = 65535 + 8 + 10 + 8
#: Zero bytes the packer appends to data.mdb (liblmdb ignores them): no page then starts within
#: REACH bytes of the end, so the open check reads the two meta pages and nothing else.
TAIL_PAD = 128 << 10
#: A tree of at most this many pages is checked whole at open (at most 1 MB read at 4 KB pages).
SMALL_PAGES = 256

# (path, st_dev, st_ino, st_size, st_mtime_ns, full) of files already checked in this process
_CHECKED: set[tuple] = set()


@dataclass(frozen=True)
class LmdbMeta:
    """What liblmdb takes from the meta page it picks."""

    psize: int  # page size
    last_pg: int  # last page in use: liblmdb reads no page beyond it
    root: int  # main database's root page (P_INVALID when empty)
    flags: int  # main database flags
    entries: int
    key_pad: int = 0  # main database md_pad: the key size liblmdb uses on LEAF2 pages (0 but for DUPFIXED)

    @property
    def used_bytes(self) -> int:
        return (self.last_pg + 1) * self.psize


def _meta_page(buf: bytes, path: str, k: int) -> tuple[int, LmdbMeta, int]:
    if len(buf) < 152:
        raise spec.DatasetFormatError(f"{path}: LMDB meta page {k} is cut off: the file is truncated")
    flags = struct.unpack_from("<H", buf, 10)[0]
    magic, version = struct.unpack_from("<II", buf, 16)
    if not flags & _P_META or magic != _MAGIC or version != _DATA_VERSION:
        raise spec.DatasetFormatError(f"{path}: not an LMDB file this reader knows (meta page {k} is damaged)")
    psize = struct.unpack_from("<I", buf, 40)[0]  # mm_dbs[FREE_DBI].md_pad holds the page size
    key_pad, db_flags = struct.unpack_from("<IH", buf, 88)
    entries, root = struct.unpack_from("<QQ", buf, 88 + 32)
    last_pg, txnid = struct.unpack_from("<QQ", buf, 136)
    return psize, LmdbMeta(psize, last_pg, root, db_flags, entries, key_pad), txnid


def read_meta(fd: int, path: str) -> LmdbMeta:
    """The meta page liblmdb would use (the one with the larger transaction id), checked."""
    psize, meta0, txn0 = _meta_page(os.pread(fd, 152, 0), path, 0)
    if psize & (psize - 1) or not 512 <= psize <= 65536:
        raise spec.DatasetFormatError(f"{path}: LMDB page size {psize} in meta page 0 is impossible")
    psize1, meta1, txn1 = _meta_page(os.pread(fd, 152, psize), path, 1)
    if psize1 != psize:
        raise spec.DatasetFormatError(f"{path}: the two LMDB meta pages disagree on the page size")
    meta = meta1 if txn1 > txn0 else meta0
    if meta.last_pg < 1 or meta.last_pg >= 2**63 // psize:
        raise spec.DatasetFormatError(f"{path}: LMDB meta page says the last page is {meta.last_pg}: damaged")
    return meta


def check_file(fd: int, path: str, *, full: bool = False) -> LmdbMeta:
    """Raise DatasetFormatError naming ``path`` unless the open check passes (module docstring: O(1)
    pages); ``full``: every branch and leaf page (then liblmdb reads nothing past the file's end)."""
    st = os.fstat(fd)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    meta = read_meta(fd, path)
    if (*key, True) in _CHECKED or (not full and (*key, False) in _CHECKED):
        return meta
    if st.st_size < meta.used_bytes:
        raise spec.DatasetFormatError(
            f"{path}: data file is {st.st_size} bytes, its LMDB meta page says the database uses "
            f"{meta.used_bytes}: the file is truncated")
    if meta.flags != 0 or meta.key_pad != 0:
        raise spec.DatasetFormatError(f"{path}: the LMDB database has flags {meta.flags:#x} (key size "
                                      f"{meta.key_pad}); a packed dataset is a plain database (no duplicates, "
                                      "integer or reverse keys)")
    full = full or meta.last_pg < SMALL_PAGES
    if meta.root != _P_INVALID and (full or not _tail_ok(fd, path, meta, st.st_size)):
        _check_tree(fd, path, meta)
        full = True
    _CHECKED.add((*key, full))
    return meta


def _tail_ok(fd: int, path: str, meta: LmdbMeta, size: int) -> bool:
    """True when every page starting within REACH bytes of the file's end that liblmdb would take for
    a branch or leaf page passes the page check (False: maybe damage, maybe a big value's bytes)."""
    first = max(2, (size - REACH) // meta.psize + 1)
    for p in range(first, meta.last_pg + 1):
        flags = struct.unpack("<H", os.pread(fd, 12, p * meta.psize)[10:12])[0]
        if flags & (_P_BRANCH | _P_LEAF):
            try:
                _check_pages(fd, path, meta, np.array([p], dtype=np.uint64))
            except spec.DatasetFormatError:
                return False
    return True


def _fail(path: str, page: int, why: str) -> spec.DatasetFormatError:
    return spec.DatasetFormatError(f"{path}: LMDB page {page} is damaged ({why})")


def _check_tree(fd: int, path: str, meta: LmdbMeta) -> None:
    level = np.array([meta.root], dtype=np.uint64)
    seen = 0
    for depth in range(_MAX_DEPTH + 1):
        if not len(level):
            return
        if depth == _MAX_DEPTH:
            raise spec.DatasetFormatError(f"{path}: the LMDB tree is deeper than {_MAX_DEPTH} levels: damaged")
        seen += len(level)
        if seen > meta.last_pg:
            raise spec.DatasetFormatError(f"{path}: the LMDB tree has more pages than the file: damaged")
        children = [_check_pages(fd, path, meta, level[lo:lo + _BATCH]) for lo in range(0, len(level), _BATCH)]
        level = np.concatenate(children)
        if len(np.unique(level)) != len(level):
            raise spec.DatasetFormatError(f"{path}: an LMDB page is the child of two branches: damaged")


def _u16(flat: np.ndarray, at: np.ndarray) -> np.ndarray:
    return flat[at].astype(np.int64) | flat[at + 1].astype(np.int64) << 8


def _u64(flat: np.ndarray, at: np.ndarray) -> np.ndarray:
    out = np.zeros(len(at), dtype=np.uint64)
    for b in range(8):
        out |= flat[at + b].astype(np.uint64) << np.uint64(8 * b)
    return out


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def _check_pages(fd: int, path: str, meta: LmdbMeta, pgnos: np.ndarray) -> np.ndarray:
    """Check a batch of branch/leaf pages; return the page numbers of their children."""
    psize, limit = meta.psize, meta.last_pg + 1
    bad = _first((pgnos < 2) | (pgnos >= limit))
    if bad is not None:
        raise spec.DatasetFormatError(f"{path}: an LMDB branch points at page {pgnos[bad]}, outside the "
                                      f"database's {limit} pages: damaged")
    buf = bytearray(len(pgnos) * psize)
    for j, p in enumerate(pgnos.tolist()):
        buf[j * psize:(j + 1) * psize] = os.pread(fd, psize, p * psize)
    pages = np.frombuffer(buf, dtype=np.uint8).reshape(len(pgnos), psize)
    flat = pages.reshape(-1)
    head = np.arange(len(pgnos), dtype=np.int64) * psize
    own, flags = _u64(flat, head), _u16(flat, head + 10)
    lower, upper = _u16(flat, head + 12), _u16(flat, head + 14)
    bad = _first((own != pgnos) | ((flags != _P_BRANCH) & (flags != _P_LEAF)) | (lower < _HDR)
                 | (lower > upper) | (upper > psize) | ((lower - _HDR) % 2 == 1) | (lower == _HDR))
    if bad is not None:
        raise _fail(path, int(pgnos[bad]), "not a branch or leaf page with a sane header")
    nkeys = (lower - _HDR) // 2
    page, k = np.nonzero(np.arange(nkeys.max())[None, :] < nkeys[:, None])
    ptr = _u16(flat, head[page] + _HDR + 2 * k)
    bad = _first((ptr < upper[page]) | (ptr + _NODE > psize))
    if bad is not None:
        raise _fail(path, int(pgnos[page[bad]]), f"node {k[bad]} lies outside the page")
    node = head[page] + ptr
    lo, hi, nflags, ksize = _u16(flat, node), _u16(flat, node + 2), _u16(flat, node + 4), _u16(flat, node + 6)
    key_end = ptr + _NODE + ksize
    bad = _first(key_end > psize)
    if bad is not None:
        raise _fail(path, int(pgnos[page[bad]]), f"the key of node {k[bad]} runs past the page")
    branch = flags[page] == _P_BRANCH
    _check_leaf_nodes(flat, path, meta, pgnos, page[~branch], k[~branch], node[~branch], key_end[~branch],
                      (lo | hi << 16)[~branch], nflags[~branch])
    return (lo | hi << 16 | nflags << 32)[branch].astype(np.uint64)


def _check_leaf_nodes(flat: np.ndarray, path: str, meta: LmdbMeta, pgnos: np.ndarray, page: np.ndarray,
                      k: np.ndarray, node: np.ndarray, key_end: np.ndarray, dsize: np.ndarray,
                      nflags: np.ndarray) -> None:
    psize, limit = meta.psize, meta.last_pg + 1
    bad = _first((nflags != 0) & (nflags != _F_BIGDATA))
    if bad is not None:
        raise _fail(path, int(pgnos[page[bad]]), f"node {k[bad]} has flags {nflags[bad]:#x} (sub-databases "
                                                 "or duplicates, which a packed dataset never has)")
    big = nflags == _F_BIGDATA
    bad = _first(~big & (key_end + dsize > psize) | big & (key_end + 8 > psize))
    if bad is not None:
        raise _fail(path, int(pgnos[page[bad]]), f"the value of node {k[bad]} runs past the page")
    if not big.any():
        return
    start = node[big] - node[big] % psize + key_end[big]  # the overflow page number follows the key
    first = _u64(flat, start)
    size = dsize[big].astype(np.uint64)
    end_ok = (first >= 2) & (first < limit) & (size <= (np.uint64(limit) - np.minimum(first, np.uint64(limit)))
                                               * np.uint64(psize) - np.uint64(_HDR))
    bad = _first(~end_ok)
    if bad is not None:
        raise _fail(path, int(pgnos[page[big][bad]]), f"the big value of node {k[big][bad]} ({int(size[bad])} "
                                                      f"bytes on page {int(first[bad])}) lies past the "
                                                      "database's last page")
