"""One shard of ``pack-dataset index``, read once front to back: every member's place, size and CRC-32.

Counterpart: ``readers/formats/inplace.py`` (what the index holds). :func:`scan_shard` runs in a
worker of the pack's pool (``packer.prepare.pool``): it streams the tar (a local file, or a
store's large sequential range requests), never writes it, and groups members into samples as
webdataset does (``packer.importers.wds.KEY``: consecutive members with one key); the tar headers
are walked here (:class:`_Tar`: ustar, GNU long names, pax records), not by ``tarfile``, whose stream
mode copies every member several times. Each member is
checked as its field type will read it (the same mapping as the wds importer,
``packer.importers.wds.field_of``): ``.txt`` UTF-8, ``.json`` JSON, ``.cls`` a decimal integer,
``.npy`` an array of numbers; a member that does not parse, a key seen twice in a shard and a
member suffix twice in a sample make the sample a reject, with the reason.

The result (:class:`ShardScan`, JSON-able: resumed runs keep it in the index folder) holds per
sample ``[key, [[suffix, data offset, size, crc32, value], ...], reason or None]``; ``value`` is
what the index needs beyond the place: the class index of ``.cls``, the label of a ``.json``
(``packer.importers.wds.label_of``), a ``.npy`` member's bytes (base64, for columns and types).
"""

from __future__ import annotations

import base64
import json
import mmap
import os
from typing import Any, Iterator

from packer.errors import SourceError
from packer.importers.wds import IMAGE_EXTS, JSON_LABEL_KEYS, KEY, field_of, label_of
from readers.contract import spec
from readers.contract.safeio import npy_header

__all__ = ["scan_shard", "close_stores", "ShardScan", "is_gzip_name", "GZIP_HINT"]

#: A shard read in place must be a plain tar (random access); the hint of the one-line refusal.
GZIP_HINT = ("compressed shards cannot be read by offset: convert them to plain .tar first (gunzip turns "
             "x.tar.gz into x.tar), then index those")
_NPY_MAX = 16 << 20  # a .npy member larger than this is a reject: its bytes travel in the scan
ShardScan = dict  # {"name", "bytes", "crc32", "mtime_ns" | "etag"/"mtime", "samples": [...]}


def is_gzip_name(name: str) -> bool:
    return name.lower().endswith((".tar.gz", ".tgz", ".gz"))


class _Tar:
    """The members of a tar read front to back from a stream of chunks (no seek), keeping the CRC-32
    and count of every byte: ``members()`` gives ``(name, data offset, data)`` of each regular file,
    ``data`` a view valid until the next one. ustar and GNU names, pax ``path``/``size`` records;
    a header whose checksum is wrong ends the scan with a SourceError naming the byte."""

    _KEEP = 32 << 20  # bytes before the current member dropped from the buffer past this

    def __init__(self, chunks: Iterator[bytes] | memoryview, where: str) -> None:
        self.where = where
        self._start = 0  # position of _buf[0] in the shard
        self.crc = self.size = 0
        self._buf: bytearray | memoryview
        if isinstance(chunks, memoryview):  # a whole local shard, mapped: no copy at all
            self._chunks: Iterator[bytes] = iter(())
            self._buf, self._whole = chunks, True
            self.crc, self.size = spec.checksum(chunks), len(chunks)
        else:
            self._chunks, self._buf, self._whole = chunks, bytearray(), False

    def _have(self, end: int) -> bool:
        while self._start + len(self._buf) < end:
            chunk = next(self._chunks, None)
            if chunk is None or self._whole:
                return False
            self.crc, self.size = spec.checksum(chunk, self.crc), self.size + len(chunk)
            self._buf += chunk  # type: ignore[operator]
        return True

    def _view(self, pos: int, n: int) -> memoryview:
        if not self._have(pos + n):
            raise SourceError(f"{self.where}: truncated tar file (ends inside the member at byte {pos})")
        return memoryview(self._buf)[pos - self._start:pos - self._start + n]

    def head(self, n: int) -> bytes:
        self._have(n)
        return bytes(self._buf[:n])

    def drain(self) -> None:
        """Read the rest (the end-of-archive blocks and padding): the whole shard's CRC-32 and size."""
        for chunk in self._chunks:
            self.crc, self.size = spec.checksum(chunk, self.crc), self.size + len(chunk)

    def _drop(self, pos: int) -> None:
        if isinstance(self._buf, bytearray) and pos - self._start > self._KEEP:
            del self._buf[:pos - self._start]
            self._start = pos

    def members(self) -> Iterator[tuple[str, int, memoryview]]:
        pos, long_name = 0, None
        pax: dict[str, str] = {}
        while self._have(pos + BLOCK):
            header = bytes(self._view(pos, BLOCK))
            if header == _ZERO:
                return
            size = _number(header[124:136])
            if size < 0 or _number(header[148:156]) != sum(header) - sum(header[148:156]) + 256:
                raise SourceError(f"{self.where}: damaged tar header at byte {pos}")
            kind = header[156:157]
            size = int(pax.get("size", size)) if kind in _FILE else size
            data = self._view(pos + BLOCK, size)
            if kind in (b"L", b"x", b"g"):
                if kind == b"L":
                    long_name = bytes(data).rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif kind == b"x":
                    pax = _pax(bytes(data))
            elif kind in _FILE:
                name = long_name or pax.get("path") or _ustar_name(header)
                yield name, pos + BLOCK, data
                long_name, pax = None, {}
            else:
                long_name, pax = None, {}
            data.release()
            pos += BLOCK + -(-size // BLOCK) * BLOCK
            self._drop(pos)


BLOCK = spec.TAR_BLOCK
_ZERO = bytes(BLOCK)
_FILE = (b"0", b"\0", b"7")


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # base-256 (GNU, sizes past 8 GiB)
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.strip(b"\0 ") or b"0", 8)
    except ValueError:
        return -1


def _ustar_name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar" and header[345:346] != b"\0":
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
        chunks = iter(store.stream(name))
    else:
        where = os.path.join(base, name)
        try:
            st = os.stat(where)
        except OSError as exc:
            raise SourceError(f"{where}: cannot read the shard ({exc.strerror or exc})") from None
        out["mtime_ns"] = st.st_mtime_ns
        mapped = _mapped(where)
    view = memoryview(mapped) if mapped is not None else None
    try:
        tar = _Tar(chunks if view is None else view, where)
        if tar.head(2) == b"\x1f\x8b":
            raise SourceError(f"{where}: gzip-compressed; {GZIP_HINT}")
        try:
            out["samples"] = list(_samples(tar, where))
        except ValueError as exc:  # a pax record that does not parse
            raise SourceError(f"{where}: not a readable tar file ({exc})") from None
        tar.drain()
        out.update(bytes=tar.size, crc32=tar.crc)
    finally:
        if mapped is not None:
            tar = None  # type: ignore[assignment]  # its views of the mapping go first
            try:
                view.release()  # type: ignore[union-attr]
                mapped.close()
            except BufferError:  # a view still held by an error's traceback: closed when it goes
                pass
    if spec.is_remote(base) and info.size != out["bytes"]:
        raise SourceError(f"{where}: changed while it was read ({out['bytes']} bytes read, {info.size} listed)")
    return out


def _samples(tar: _Tar, where: str) -> Iterator[list]:
    key: str | None = None
    group: list[list] = []
    seen: set[str] = set()
    reason: str | None = None
    for name, offset, view in tar.members():
        match = KEY.match(name)
        if match is None:
            continue
        k, suffix = match.group(1), match.group(2).lower()
        if k != key:
            if key is not None:
                yield [key, group, reason]
            key, group, reason = k, [], None
            if k in seen:
                reason = f"{where}:{k}: key {k!r} appears twice in the shard (duplicate key)"
            seen.add(k)
        if any(g[0] == suffix for g in group):
            reason = reason or f"{where}:{k}: member {k}.{suffix} appears twice"
        value, bad = _check_member(suffix, view, f"{where}:{k}.{suffix}")
        reason = reason or bad
        group.append([suffix, offset, len(view), spec.checksum(view), value])
    if key is not None:
        yield [key, group, reason]


_LABEL_KEYS = frozenset(JSON_LABEL_KEYS)  # a .json member with one of these may be a sample's label
_KINDS: dict[str, str] = {}  # member suffix -> field kind (packer.importers.wds.field_of), per process


def _check_member(suffix: str, view: memoryview, where: str) -> tuple[Any, str | None]:
    """(the value the index keeps, or None; why the member does not parse, or None)."""
    if suffix in IMAGE_EXTS:
        return None, None if len(view) else f"{where}: empty image member"
    data = bytes(view)
    kind = _KINDS.get(suffix)
    if kind is None:
        kind = _KINDS[suffix] = field_of(suffix, where)[1]
    try:
        if kind == "text":
            data.decode("utf-8")
        elif kind == "json":
            obj = json.loads(data)
            if isinstance(obj, dict) and not _LABEL_KEYS.isdisjoint(obj):  # parsed again only then
                return label_of({"json": data}, where), None
        elif kind == "int":
            return int(data.decode("ascii").strip()), None
        elif kind == "npy":
            if len(data) > _NPY_MAX:
                return None, f"{where}: .npy member of {len(data)} bytes is larger than {_NPY_MAX} bytes"
            npy_header(data, len(data))
            return base64.b64encode(data).decode("ascii"), None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"{where}: not a {kind} member ({str(exc)[:80]})"
    return None, None
