"""The LMDB per-process open check reads O(1) pages (issue 22 item 8: it read every B-tree page in
each process, 1.3 s at 1.28M thumbnails, ~100 s per worker at 100M), while a damaged or crafted
data.mdb still cannot make liblmdb read past the file's end; ``verify`` walks every page."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest

from packer.formats.lmdb import LmdbWriter
from packer.prepare.images import Prepared
from packer.options import PackOptions
from readers import open_dataset
from readers.contract import spec
from readers.formats import lmdbcheck
from reliability_helpers import probe_read

_P_LEAF = 0x02


def _values(n: int, big_every: int = 0) -> list[bytes]:
    """Thumbnail-sized values (kept inside leaf pages); every ``big_every``-th a 5 KB one (on overflow
    pages, whose bytes an unpadded file's tail check cannot tell from a damaged page: it walks then)."""
    rng = np.random.default_rng(n)
    return [rng.integers(0, 256, 5000 if big_every and k % big_every == big_every - 1 else int(rng.integers(60, 200)),
                        dtype=np.uint8).tobytes() for k in range(n)]


def _write_mdb(root, values: list[bytes], meta: dict | None = None) -> None:
    """data.mdb as the packer's writer makes it, of thumbnail-sized values (kept inside leaf pages)."""
    writer = LmdbWriter(root, "train", PackOptions(format="lmdb"), sum(map(len, values)))
    writer.open(0, None)
    try:
        for k, data in enumerate(values):
            writer.append(k, Prepared(data=data, ext="jpg", height=1, width=1, changed=False), 0)
        writer.end_samples()
        writer.checkpoint()
        extra = writer.finalize(meta or {}, {})
    except BaseException:
        writer.abort()
        raise
    return extra


def _pages_read(path, monkeypatch, **kw) -> tuple[int, int]:
    """(pread calls, bytes read) of one open check of ``path`` in a fresh cache."""
    calls = []
    real = os.pread

    def counting(fd, n, offset):
        data = real(fd, n, offset)
        calls.append(len(data))
        return data

    monkeypatch.setattr(lmdbcheck, "_CHECKED", set())
    fd = os.open(path, os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "pread", counting)
        lmdbcheck.check_file(fd, str(path), **kw)
    finally:
        monkeypatch.setattr(os, "pread", real)
        os.close(fd)
    return len(calls), sum(calls)


def test_the_open_check_reads_the_same_pages_at_any_size(tmp_path, monkeypatch):
    sizes = {}
    for n in (10_000, 40_000):
        root = tmp_path / f"n{n}"
        root.mkdir()
        _write_mdb(root, _values(n))
        path = root / spec.DATA_FILE["lmdb"]
        fd = os.open(path, os.O_RDONLY)
        meta = lmdbcheck.read_meta(fd, str(path))
        os.close(fd)
        assert path.stat().st_size == meta.used_bytes + lmdbcheck.TAIL_PAD  # the packer pads data.mdb
        padded = _pages_read(path, monkeypatch)
        full = _pages_read(path, monkeypatch, full=True)
        os.truncate(path, meta.used_bytes)  # as packed before the padding: the pages near the end are read
        unpadded = _pages_read(path, monkeypatch)
        sizes[n] = (meta.last_pg, padded, unpadded, full)
    (small_pages, small_padded, small_unpadded, small_full), (big_pages, big_padded, big_unpadded, big_full) = \
        sizes[10_000], sizes[40_000]
    assert big_pages > 3 * small_pages > 3 * lmdbcheck.SMALL_PAGES
    assert small_padded == big_padded == (2, 2 * 152), sizes  # the two meta pages, nothing else
    assert small_unpadded[0] == big_unpadded[0] <= 2 + 2 * (lmdbcheck.REACH // 4096 + 1), sizes
    assert big_full[1] >= big_pages * 4096 * 0.9 and big_full[1] > 3 * small_full[1], sizes  # verify: all


def _dataset(root, template, n: int) -> list[bytes]:
    """A whole lmdb dataset of ``n`` thumbnail-sized values, indexed like a pack of ``template``."""
    values = _values(n, big_every=200)
    index = spec.read_index(template)
    classes = len(index.meta["classes"])
    labels = (np.arange(n) % classes).astype(np.int32)
    meta = dict(index.meta, num_samples=n, class_counts=np.bincount(labels, minlength=classes).tolist())
    meta.pop(spec.FILES_CRC_KEY, None)
    root.mkdir()
    meta["files"] = _write_mdb(root, values, meta)["files"]
    (root / "names.jsonl").write_text("".join(json.dumps(f"c/{k}.jpg") + "\n" for k in range(n)))
    arrays = {"labels": labels, "checksums": np.array([spec.checksum(v) for v in values], dtype=np.uint32),
              "sizes": np.array([len(v) for v in values], dtype=np.int64)}
    spec.write_index(root, meta, arrays)
    return values


def _big_value_node(raw: bytes, pages) -> tuple[int, int, int]:
    """(page number, byte offset of the node, its sample number) of the first node holding a value on
    overflow pages, in the first leaf page of ``pages`` that has one."""
    psize = struct.unpack_from("<I", raw, 40)[0]
    for p in pages:
        base = p * psize
        own, _pad, flags, lower = struct.unpack_from("<QHHH", raw, base)
        if own != p or flags != _P_LEAF:
            continue
        for k in range((lower - 16) // 2):
            node = base + struct.unpack_from("<H", raw, base + 16 + 2 * k)[0]
            nflags, ksize = struct.unpack_from("<HH", raw, node + 4)
            if nflags == 0x01 and raw[node + 8:node + 8 + ksize].isdigit():
                return p, node, int(raw[node + 8:node + 8 + ksize])
    raise AssertionError("no leaf page with a big value found")


def _rightmost_leaf(raw: bytes) -> tuple[int, int]:
    """(page number, page size) of the main database's last leaf (the last node of every branch on
    the way down from the root of the newer meta page)."""
    psize = struct.unpack_from("<I", raw, 40)[0]
    metas = [struct.unpack_from("<QQ", raw, k * psize + 136)[1] for k in (0, 1)]
    page = struct.unpack_from("<Q", raw, int(metas[1] > metas[0]) * psize + 88 + 40)[0]
    while True:
        flags, lower = struct.unpack_from("<HH", raw, page * psize + 10)
        if flags == _P_LEAF:
            return page, psize
        last = struct.unpack_from("<H", raw, page * psize + 16 + 2 * ((lower - 16) // 2 - 1))[0]
        lo, hi, nflags = struct.unpack_from("<HHH", raw, page * psize + last)
        page = lo | hi << 16 | nflags << 32


@pytest.mark.slow
@pytest.mark.parametrize("where", ["middle", "tail"])
def test_damage_that_would_read_past_the_file_is_found_by_verify_and_near_the_end_at_open(
        packed_generated, tmp_path, where, monkeypatch, capsys):
    """middle: a big value's size raised to run past the end of data.mdb, and sizes.npy raised to match
    (a crafted dataset). The open check reads O(1) pages and does not see that leaf (py-lmdb would
    touch the value's pages inside txn.get: SIGBUS; lmdbcheck's docstring says so): verify, which
    checks every page, names it. tail: in a pack without the padding, the main database's last leaf (near the end of the file) has its first node moved
    past the page, which liblmdb would read past the end of the file: the open check finds it."""
    from packer.tools.verify import main as verify_main

    root = tmp_path / "ds"
    _dataset(root, packed_generated["lmdb"], 8_000)
    data = root / spec.DATA_FILE["lmdb"]
    assert data.stat().st_size > lmdbcheck.TAIL_PAD + 1.3 * lmdbcheck.SMALL_PAGES * 4096  # not read whole at open
    index = spec.read_index(root)
    arrays = {name: np.array(a) for name, a in index.arrays.items()}
    fd = os.open(data, os.O_RDONLY)
    used = lmdbcheck.read_meta(fd, str(data)).used_bytes
    os.close(fd)
    if where == "tail":
        os.truncate(data, used)
    blob = bytearray(data.read_bytes())
    psize = struct.unpack_from("<I", blob, 40)[0]
    if where == "middle":
        pages = len(blob) // psize
        page, node, sample = _big_value_node(blob, range(pages // 2, pages))
        ksize = struct.unpack_from("<H", blob, node + 6)[0]
        first = struct.unpack_from("<Q", blob, node + 8 + ksize)[0]  # its first overflow page
        size = len(blob) - (first * psize + 16) + 4096  # to 4 KB past the end of the file
        struct.pack_into("<HH", blob, node, size & 0xFFFF, size >> 16)
        arrays["sizes"][sample] = size
    else:
        page, _ = _rightmost_leaf(blob)
        assert len(blob) - page * psize < lmdbcheck.REACH
        struct.pack_into("<H", blob, page * psize + 16, 0xFFF0)  # node 0 at byte 65520 of the page
    data.write_bytes(bytes(blob))
    spec.write_index(root, dict(index.meta, files={data.name: len(blob)}), arrays)

    if where == "middle":  # in this process: the damaged sample is never read
        ds = open_dataset(root, decode=False)
        assert ds.read(0) == _values(8_000, big_every=200)[0]  # the environment opened: the check passed
        ds.close()
    else:
        got = probe_read(root)  # in a child: a read past the end of the file is a SIGBUS
        assert got == {"error": "DatasetFormatError",
                       "message": f"{data}: LMDB page {page} is damaged (node 0 lies outside the page)"}, got
    monkeypatch.setattr(lmdbcheck, "_CHECKED", set())
    code = verify_main([str(root), "-q"])
    out = capsys.readouterr().out
    assert code == 1 and f"DAMAGED {data}: LMDB page {page} is damaged" in out, out
    shutil.rmtree(root)
