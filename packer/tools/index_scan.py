"""One shard of ``pack-dataset index``, read once front to back: every member's place, size and CRC-32.

Counterpart: ``readers/formats/inplace.py`` (what the index holds). :func:`scan_shard` runs in a
worker of the pack's pool (``packer.prepare.pool``): it streams the tar (a local file, or a
store's large sequential range requests), never writes it, and groups members into samples as
webdataset does (``packer.importers.wds.KEY``: consecutive members with one key); the tar headers
are walked here (:class:`_Tar`: ustar, GNU long names, pax records), not by ``tarfile``, whose stream
mode copies every member several times. A mapped (local) shard's usual headers are walked by the
optional native helper ``packer/tools/_tarwalk.c`` where the build made it (:func:`tarwalk_library`;
``DATASET_PACKER_TARWALK=off`` turns it off): it hands every other header to the Python walk, so the
result is the same with it or without. Each member is
checked as its field type will read it (the same mapping as the wds importer,
``packer.importers.wds.field_of``): ``.txt`` UTF-8, ``.json`` JSON, ``.cls`` a decimal integer,
``.npy`` an array of numbers; a member that does not parse, a key seen twice in a shard and a
member suffix twice in a sample make the sample a reject, with the reason.

The result (:class:`ShardScan`, JSON-able: resumed runs keep it in the index folder) holds columns,
not a list per member (a fifth of the time to encode and parse, and ``index._write`` takes them as
arrays): per sample ``keys``, ``reasons`` (None or why it is a reject) and ``counts`` (its members),
and per member, in order, ``suffixes``, ``offsets`` (of the data), ``sizes``, ``crcs`` and ``values``;
a value is what the index needs beyond the place: the class index of ``.cls``, the label of a
``.json`` (``packer.importers.wds.label_of``), a ``.npy`` member's bytes (base64, for columns and
types), else None.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import gc
import json
import mmap
import os
from typing import Any, Iterator

from packer.errors import SourceError
import numpy as np

from packer.importers.wds import IMAGE_EXTS, JSON_LABEL_KEYS, KEY, field_of, label_of
from readers.contract import spec
from readers.contract.env import native_library
from readers.contract.safeio import checksum_combine, npy_header

__all__ = ["COLUMNS", "scan_shard", "scan_line", "warm_store", "close_stores", "ShardScan", "is_gzip_name", "GZIP_HINT", "gc_paused",
           "tarwalk_library", "TARWALK"]

#: The optional native header walk (setup.py builds it from ``packer/tools/_tarwalk.c``); loaded by ctypes.
TARWALK = "packer.tools._tarwalk"
_TARWALK_VERSION = 1
_TARWALK_ENV = "DATASET_PACKER_TARWALK"  # "off": the Python walk only

#: A shard read in place must be a plain tar (random access); the hint of the one-line refusal.
GZIP_HINT = ("compressed shards cannot be read by offset: convert them to plain .tar first (gunzip turns "
             "x.tar.gz into x.tar), then index those")
_NPY_MAX = 16 << 20  # a .npy member larger than this is a reject: its bytes travel in the scan
ShardScan = dict  # {"name", "bytes", "crc32", "mtime_ns" | "etag"/"mtime", and the COLUMNS}
#: The scan's columns: three per sample, then five per member (see the module's docstring).
COLUMNS = ("keys", "reasons", "counts", "suffixes", "offsets", "sizes", "crcs", "values")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cycle collector off for the block: a scan builds many small lists, none in a cycle
    (reference counting frees them all), and the collector's passes over them cost a fifth of a run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def is_gzip_name(name: str) -> bool:
    return name.lower().endswith((".tar.gz", ".tgz", ".gz"))


def tarwalk_library() -> ctypes.CDLL | None:
    """The native header walk, or None (not built, or ``DATASET_PACKER_TARWALK=off``)."""
    p64 = ctypes.POINTER(ctypes.c_int64)
    walk = ("tw_walk", ctypes.c_int, (ctypes.c_void_p, ctypes.c_int64, p64, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_void_p, p64))
    return native_library(TARWALK, version_symbol="tw_version", version=_TARWALK_VERSION, off_env=_TARWALK_ENV,
                          without="headers are walked in Python", functions=(walk,))


class _NativeWalk:
    """``tw_walk`` over a mapped shard: the regular files from a position on, up to :data:`CAP` a call,
    until a header it leaves to the Python walk (``_tarwalk.c`` says which)."""

    CAP = 4096
    END, FULL, SLOW = 0, 1, 2

    def __init__(self, lib: ctypes.CDLL, mapping: mmap.mmap) -> None:
        self._fn = lib.tw_walk
        self._bytes: np.ndarray | None = np.frombuffer(mapping, np.uint8)  # the mapping's buffer, exported
        self._len = len(mapping)
        self._heads, self._sizes = np.empty(self.CAP, np.int64), np.empty(self.CAP, np.int64)
        self._name_lens = np.empty(self.CAP, np.int32)
        self._pos, self._count = ctypes.c_int64(), ctypes.c_int64()

    def walk(self, pos: int) -> tuple[int, int, Iterator[tuple[int, int, int]]]:
        """(status, where it stopped, (header position, size, name length or -1) of each regular file)."""
        assert self._bytes is not None
        self._pos.value = pos
        status = self._fn(self._bytes.ctypes.data, self._len, ctypes.byref(self._pos), self.CAP,
                          self._heads.ctypes.data, self._sizes.ctypes.data, self._name_lens.ctypes.data,
                          ctypes.byref(self._count))
        n = self._count.value
        return status, self._pos.value, zip(self._heads[:n].tolist(), self._sizes[:n].tolist(),
                                            self._name_lens[:n].tolist())

    def release(self) -> None:
        self._bytes = None  # the mapping may close


class _Tar:
    """The members of a tar read front to back (no seek), from a local shard's mapping or a stream of
    chunks, keeping the CRC-32 and count of every byte: ``members()`` gives ``(name, data offset,
    data, CRC-32 of data)`` of each regular file, ``data`` a view valid until the next one. ustar and
    GNU names, pax ``path``/``size`` records; a header whose checksum is wrong ends the scan with a
    SourceError naming the byte.

    Each byte is read once: a mapped shard's CRC-32 is joined from its members' CRCs and the bytes
    between them (``checksum_combine``), never a second pass. Header checksums are summed with numpy,
    in batches (before any member of the batch leaves the scan, and before any other error is said)."""

    _KEEP = 32 << 20  # bytes before the current member dropped from the buffer past this
    _BATCH = 4096  # headers whose checksums are checked at once

    def __init__(self, chunks: Iterator[bytes] | mmap.mmap, where: str) -> None:
        self.where = where
        self._start = 0  # position of _buf[0] in the shard
        self.crc = self.size = 0
        self._heads: list[bytes] = []  # headers not checked yet, their positions and stated checksums
        self._head_pos: list[int] = []
        self._stated: list[int] = []
        self._buf: bytearray | mmap.mmap
        self._mv: memoryview | None = None
        self._joined = 0  # a mapped shard: bytes up to here are in self.crc
        self._native: _NativeWalk | None = None
        if isinstance(chunks, mmap.mmap):  # a whole local shard, mapped: no copy at all
            lib = tarwalk_library()
            self._native = _NativeWalk(lib, chunks) if lib is not None else None
            self._chunks: Iterator[bytes] = iter(())
            self._buf, self._mv, self.size = chunks, memoryview(chunks), len(chunks)
            self._join = checksum_combine(0, 0, 0) is not None
            if not self._join:  # no ISA-L: one pass over the whole shard first
                self.crc, self._joined = spec.checksum(self._mv), self.size
        else:
            self._chunks, self._buf = chunks, bytearray()

    def _have(self, end: int) -> bool:
        while self._start + len(self._buf) < end:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self.crc, self.size = spec.checksum(chunk, self.crc), self.size + len(chunk)
            self._buf += chunk  # type: ignore[operator]
        return True

    def _view(self, pos: int, n: int) -> memoryview:
        if not self._have(pos + n):
            raise SourceError(f"{self.where}: truncated tar file (ends inside the member at byte {pos})")
        if self._mv is not None:
            return self._mv[pos:pos + n]
        return memoryview(self._buf)[pos - self._start:pos - self._start + n]

    def head(self, n: int) -> bytes:
        self._have(n)
        return bytes(self._buf[:n])

    def drain(self) -> None:
        """Read the rest (the end-of-archive blocks and padding): the whole shard's CRC-32 and size."""
        if self._mv is not None:
            if self._joined < self.size:
                self.crc = spec.checksum(self._mv[self._joined:], self.crc)
                self._joined = self.size
            return
        for chunk in self._chunks:
            self.crc, self.size = spec.checksum(chunk, self.crc), self.size + len(chunk)

    def release(self) -> None:
        if self._native is not None:
            self._native.release()
        if self._mv is not None:
            self._mv.release()

    def _drop(self, pos: int) -> None:
        if isinstance(self._buf, bytearray) and pos - self._start > self._KEEP:
            del self._buf[:pos - self._start]
            self._start = pos

    def check_heads(self) -> None:
        """The checksums of the headers walked since the last check (numpy: one sum per batch)."""
        if not self._heads:
            return
        a = np.frombuffer(b"".join(self._heads), np.uint8).reshape(-1, BLOCK)  # summed as int64, not copied
        sums = a.sum(axis=1, dtype=np.int64) - a[:, 148:156].sum(axis=1, dtype=np.int64) + 256
        bad = np.flatnonzero(sums != np.array(self._stated, dtype=np.int64))
        if bad.size:
            raise SourceError(f"{self.where}: damaged tar header at byte {self._head_pos[int(bad[0])]}")
        self._heads, self._head_pos, self._stated = [], [], []

    def _join_member(self, at: int, size: int, crc: int) -> None:
        """A mapped shard's CRC-32 joined up to a member's end: the bytes since the last member (its header,
        padding), then the member's own CRC-32 (``crc``, of ``size`` bytes at ``at``), not read again."""
        assert self._mv is not None
        gap = spec.checksum(self._mv[self._joined:at], self.crc)
        self.crc = checksum_combine(gap, crc, size)  # type: ignore[assignment]
        self._joined = at + size

    def members(self) -> Iterator[tuple[str, int, memoryview, int]]:
        """The walk; on any error (here or in its consumer) call :meth:`check_heads` first."""
        yield from self._walk()
        self.check_heads()

    def _walk(self) -> Iterator[tuple[str, int, memoryview, int]]:
        pos, long_name = 0, None
        pax: dict[str, str] = _NO_PAX
        whole, join = self._mv is not None, self._mv is not None and self._join
        buf, mv, checksum, number, ustar_name = self._buf, self._mv, spec.checksum, _number, _ustar_name
        heads, head_pos, stated = self._heads, self._head_pos, self._stated
        join_member = self._join_member
        end = self.size if whole else -1  # a mapped shard: every byte is there, no _have needed
        native = self._native
        while (pos + BLOCK <= end) if whole else self._have(pos + BLOCK):
            if native is not None and long_name is None and not pax:  # the usual headers, walked in C
                status, pos, files = native.walk(pos)
                for head, size, name_len in files:
                    at = head + BLOCK
                    data = mv[at:at + size]  # type: ignore[index]
                    crc = checksum(data)
                    name = (str(buf[head:head + name_len], "utf-8", "surrogateescape") if name_len >= 0
                            else ustar_name(buf[head:head + BLOCK]))
                    if join:
                        join_member(at, size, crc)
                    yield name, at, data, crc
                    data.release()
                if status == native.END:
                    return
                if status == native.FULL or pos + BLOCK > end:
                    continue  # (the loop's test ends it where fewer than a block's bytes are left)
            start = pos - self._start
            header = buf[start:start + BLOCK]
            if header == _ZERO:
                return
            try:  # the usual fields (11 octal digits and a NUL; 6, a NUL and a space) without _number's strip
                if header[135] or header[154] or header[155] not in (0, 32):
                    raise ValueError
                size, check = int(header[124:135], 8), int(header[148:154], 8)
            except ValueError:
                size, check = number(header[124:136]), number(header[148:156])
            if size < 0:
                raise SourceError(f"{self.where}: damaged tar header at byte {pos}")
            heads.append(header)  # type: ignore[arg-type]
            head_pos.append(pos)
            stated.append(check)
            kind = header[156:157]
            if kind in _FILE:
                if pax:
                    size = int(pax.get("size", size))
                at = pos + BLOCK
                if whole and at + size <= end:
                    data = mv[at:at + size]  # type: ignore[index]
                else:
                    data = self._view(at, size)
                crc = checksum(data)
                name = long_name or (pax and pax.get("path")) or ustar_name(header)
                if join:
                    join_member(at, size, crc)
                yield name, at, data, crc
                data.release()
                if long_name is not None or pax:
                    long_name, pax = None, _NO_PAX
            elif kind in (b"L", b"x", b"g"):
                data = self._view(pos + BLOCK, size)
                if kind == b"L":
                    long_name = bytes(data).rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif kind == b"x":
                    pax = _pax(bytes(data))
                data.release()
            else:
                self._view(pos + BLOCK, size).release()
                long_name, pax = None, _NO_PAX
            pos += BLOCK + -(-size // BLOCK) * BLOCK
            if len(heads) >= self._BATCH:
                self.check_heads()
                heads, head_pos, stated = self._heads, self._head_pos, self._stated
            if not whole:
                self._drop(pos)
                buf = self._buf


_NO_PAX: dict[str, str] = {}  # no pax record before this member (shared, never written)
BLOCK = spec.TAR_BLOCK
_ZERO = bytes(BLOCK)
_FILE = (b"0", b"\0", b"7")


def _number(field: bytes | bytearray) -> int:
    if field[0] & 0x80:  # base-256 (GNU, sizes past 8 GiB)
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.strip(b"\0 ") or b"0", 8)
    except ValueError:
        return -1


def _ustar_name(header: bytes | bytearray) -> str:
    end = header.find(b"\0", 0, 100)
    name = header[:end if end >= 0 else 100]
    if header[345] and header[257:262] == b"ustar":
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax(data: bytes) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(data):
        length = int(data[pos:data.index(b" ", pos)])
        record = data[pos:pos + length].decode("utf-8", "surrogateescape")
        key, _, value = record.partition(" ")[2].rstrip("\n").partition("=")
        out[key] = value
        pos += length
    return out


def _mapped(path: str) -> mmap.mmap | None:
    """A read-only mapping of the local shard ``path`` (None when empty)."""
    fd = spec.open_regular(path, "shard")
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if os.fstat(fd).st_size else None
    finally:
        os.close(fd)


_STORES: dict[Any, Any] = {}  # per worker process: one store per base URL


def _store(base: str, storage_options: Any) -> Any:
    key = (os.getpid(), base, json.dumps(storage_options, sort_keys=True, default=str))
    if key not in _STORES:
        from readers.remote import open_store

        _STORES[key] = open_store(base, storage_options)
    return _STORES[key]


def warm_store(base: str, name: str, storage_options: Any) -> None:
    """This process's store for ``base``, its client made by one request (``stat`` of shard ``name``),
    before the pool forks: each worker then starts from the libraries imported and the session made
    here (botocore's parsed models), not again in each (measured on the S3 emulator: a worker's first
    request 0.2 s instead of 1.4 s)."""
    _store(base, storage_options).stat(name)


def close_stores() -> None:
    """Close the stores this process opened for scans (their connections), at the end of an index."""
    for key in [k for k in _STORES if k[0] == os.getpid()]:
        _STORES.pop(key).close()


def scan_shard(job: tuple[str, str, Any]) -> ShardScan:
    """Scan shard ``name`` under ``base`` (a folder or a URL); ``job`` = (base, name, storage_options).
    SourceError (one line naming the shard) when it is no readable tar."""
    base, name, storage_options = job
    out: ShardScan = {"name": name}
    mapped, chunks = None, iter(())
    if spec.is_remote(base):
        store = _store(base, storage_options)
        where = store.url_of(name)
        info = store.stat(name)
        out.update(etag=info.etag, mtime=info.mtime)
        chunks = iter(store.stream(name, 0, info.size))  # the size stated: no second HEAD before the GETs
    else:
        where = os.path.join(base, name)
        try:
            st = os.stat(where)
        except OSError as exc:
            raise SourceError(f"{where}: cannot read the shard ({exc.strerror or exc})") from None
        out["mtime_ns"] = st.st_mtime_ns
        mapped = _mapped(where)
    tar = _Tar(chunks if mapped is None else mapped, where)
    try:
        if tar.head(2) == b"\x1f\x8b":
            raise SourceError(f"{where}: gzip-compressed; {GZIP_HINT}")
        try:
            try:
                with gc_paused():
                    out.update(_samples(tar, where))
            except (SourceError, ValueError):  # a damaged header is what went wrong, when one is
                tar.check_heads()
                raise
        except ValueError as exc:  # a damaged header, a cut, a pax record that does not parse (the path said once)
            raise SourceError(f"{where}: not a readable tar file ({str(exc).removeprefix(f'{where}: ')})") from None
        tar.drain()
        out.update(bytes=tar.size, crc32=tar.crc)
    finally:
        if mapped is not None:
            tar.release()  # its views of the mapping go first
            try:
                mapped.close()
            except BufferError:  # a view still held by an error's traceback: closed when it goes
                pass
    if spec.is_remote(base) and info.size != out["bytes"]:
        raise SourceError(f"{where}: changed while it was read ({out['bytes']} bytes read, {info.size} listed)")
    return out


def scan_line(job: tuple[str, str, Any]) -> str:
    """:func:`scan_shard`'s result as JSON, made in the worker: the parent writes it to the journal as it
    is and parses it (``json.loads``, about what unpickling the lists costs) instead of also encoding it."""
    return json.dumps(scan_shard(job))


def _samples(tar: _Tar, where: str) -> dict[str, list]:
    keys: list[str] = []
    reasons: list[str | None] = []
    counts: list[int] = []
    suffixes: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    crcs: list[int] = []
    values: list[Any] = []
    key: str | None = None
    first = 0  # the current sample's first member
    seen: set[str] = set()
    reason: str | None = None
    match_key = KEY.match
    for name, offset, view, crc in tar.members():
        match = match_key(name)
        if match is None:
            continue
        k, suffix = match.group(1), match.group(2).lower()
        if k != key:
            if key is not None:
                keys.append(key)
                reasons.append(reason)
                counts.append(len(suffixes) - first)
            key, first, reason = k, len(suffixes), None
            if k in seen:
                reason = f"{where}:{k}: key {k!r} appears twice in the shard (duplicate key)"
            seen.add(k)
        elif suffix in suffixes[first:]:
            reason = reason or f"{where}:{k}: member {k}.{suffix} appears twice"
        kind = _KINDS.get(suffix) or _kind(suffix, f"{where}:{k}.{suffix}")
        if kind == "image":  # the common case first: an image is checked by its size only
            value, bad = None, None if len(view) else f"{where}:{k}.{suffix}: empty image member"
        else:
            value, bad = _check_member(kind, view, f"{where}:{k}.{suffix}")
        reason = reason or bad
        suffixes.append(suffix)
        offsets.append(offset)
        sizes.append(len(view))
        crcs.append(crc)
        values.append(value)
    if key is not None:
        keys.append(key)
        reasons.append(reason)
        counts.append(len(suffixes) - first)
    return {"keys": keys, "reasons": reasons, "counts": counts, "suffixes": suffixes, "offsets": offsets,
            "sizes": sizes, "crcs": crcs, "values": values}


_LABEL_KEYS = frozenset(JSON_LABEL_KEYS)  # a .json member with one of these may be a sample's label
_KINDS: dict[str, str] = {}  # member suffix -> field kind (packer.importers.wds.field_of), per process
_IMAGE_EXTS = frozenset(IMAGE_EXTS)


def _kind(suffix: str, where: str) -> str:
    """"image" for an image suffix (``jpg``), else the field kind; ``x.jpg`` ("image" there) is kept unchecked."""
    kind = "image" if suffix in _IMAGE_EXTS else field_of(suffix, where)[1]
    _KINDS[suffix] = kind = "unchecked" if kind == "image" and suffix not in _IMAGE_EXTS else kind
    return kind


_RAW_DECODE = json.JSONDecoder().raw_decode


def _json(data: bytes) -> Any:
    """``json.loads(data)``, a third of its time for the usual member (UTF-8, no surrounding blanks):
    parsed from the decoded text directly; anything else (a BOM, UTF-16, blanks, an error) is left
    to ``json.loads`` itself, so the result and the error are always its own."""
    try:
        text = str(data, "utf-8")
        obj, end = _RAW_DECODE(text)
        if end == len(text):
            return obj
    except (UnicodeDecodeError, ValueError, RecursionError):
        pass
    return json.loads(data)


def _check_member(kind: str, view: memoryview, where: str) -> tuple[Any, str | None]:
    """(the value the index keeps, or None; why the member does not parse, or None)."""
    try:
        if kind == "text":
            str(view, "utf-8")  # decoded from the mapping itself: no copy kept
        elif kind == "json":
            data = bytes(view)
            obj = _json(data)
            if isinstance(obj, dict) and not _LABEL_KEYS.isdisjoint(obj):  # parsed again only then
                return label_of({"json": data}, where), None
        elif kind == "int":
            return int(bytes(view).decode("ascii").strip()), None
        elif kind == "npy":
            if len(view) > _NPY_MAX:
                return None, f"{where}: .npy member of {len(view)} bytes is larger than {_NPY_MAX} bytes"
            data = bytes(view)
            npy_header(data, len(data))
            return base64.b64encode(data).decode("ascii"), None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"{where}: not a {kind} member ({str(exc)[:80]})"
    return None, None
