"""One shard of ``pack-dataset index``, read once front to back: every member's place, size and CRC-32.

Counterpart: ``readers/formats/inplace.py`` (what the index holds). :func:`scan_shard` runs in a
worker of the pack's pool (``packer.prepare.pool``): it streams the tar (a local file, or a
store's large sequential range requests), never writes it, and groups members into samples as
webdataset does (``packer.importers.wds.KEY``: consecutive members with one key). Each member is
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
import os
import tarfile
from typing import Any, Iterator

from packer.errors import SourceError
from packer.importers.wds import IMAGE_EXTS, KEY, field_of, label_of
from readers.contract import spec
from readers.contract.safeio import npy_header

__all__ = ["scan_shard", "close_stores", "ShardScan", "is_gzip_name", "GZIP_HINT"]

#: A shard read in place must be a plain tar (random access); the hint of the one-line refusal.
GZIP_HINT = ("compressed shards cannot be read by offset: decompress them (gunzip) or pack them "
             "(pack-dataset SHARDS -f wds -o OUT)")
_NPY_MAX = 16 << 20  # a .npy member larger than this is a reject: its bytes travel in the scan
ShardScan = dict  # {"name", "bytes", "crc32", "mtime_ns" | "etag"/"mtime", "samples": [...]}


def is_gzip_name(name: str) -> bool:
    return name.lower().endswith((".tar.gz", ".tgz", ".gz"))


class _Reader:
    """A file-like over a byte stream that keeps the CRC-32 and the count of every byte read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = memoryview(b"")
        self.crc = self.size = 0

    def read(self, n: int = -1) -> bytes:
        out = []
        want = n
        while want != 0:
            if not self._buf:
                nxt = next(self._chunks, None)
                if nxt is None:
                    break
                self._buf = memoryview(nxt)
            take = self._buf if want < 0 else self._buf[:want]
            out.append(take)
            self._buf = self._buf[len(take):]
            want = want - len(take) if want > 0 else want
        data = b"".join(out)
        self.crc = spec.checksum(data, self.crc)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(8 << 20):
            pass


def _local_chunks(path: str) -> Iterator[bytes]:
    fd = spec.open_regular(path, "shard")
    try:
        while chunk := os.read(fd, 8 << 20):
            yield chunk
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
    if spec.is_remote(base):
        store = _store(base, storage_options)
        where = store.url_of(name)
        info = store.stat(name)
        out.update(etag=info.etag, mtime=info.mtime)
        chunks: Iterator[bytes] = iter(store.stream(name))
    else:
        where = os.path.join(base, name)
        try:
            st = os.stat(where)
        except OSError as exc:
            raise SourceError(f"{where}: cannot read the shard ({exc.strerror or exc})") from None
        out["mtime_ns"] = st.st_mtime_ns
        chunks = _local_chunks(where)
    reader = _Reader(chunks)
    head = reader.read(2)
    if head == b"\x1f\x8b":
        raise SourceError(f"{where}: gzip-compressed; {GZIP_HINT}")
    reader._buf = memoryview(head + bytes(reader._buf))  # put the two bytes back (counted again below)
    reader.crc = reader.size = 0
    try:
        out["samples"] = list(_samples(tarfile.open(fileobj=reader, mode="r|"), where))  # type: ignore[call-overload]
        reader.drain()
    except (tarfile.TarError, EOFError) as exc:
        raise SourceError(f"{where}: not a readable tar file ({exc})") from None
    out.update(bytes=reader.size, crc32=reader.crc)
    if spec.is_remote(base) and info.size != reader.size:
        raise SourceError(f"{where}: changed while it was read ({reader.size} bytes read, {info.size} listed)")
    return out


def _samples(tar: tarfile.TarFile, where: str) -> Iterator[list]:
    key: str | None = None
    group: list[list] = []
    seen: set[str] = set()
    reason: str | None = None
    with tar:
        for m in tar:
            match = KEY.match(m.name) if m.isfile() else None
            if match is None:
                continue
            k, suffix = match.group(1), match.group(2).lower()
            fh = tar.extractfile(m)
            data = fh.read() if fh is not None else b""
            if k != key:
                if key is not None:
                    yield [key, group, reason]
                key, group, reason = k, [], None
                if k in seen:
                    reason = f"{where}:{k}: key {k!r} appears twice in the shard (duplicate key)"
                seen.add(k)
            if any(g[0] == suffix for g in group):
                reason = reason or f"{where}:{k}: member {k}.{suffix} appears twice"
            value, bad = _check_member(suffix, data, f"{where}:{k}.{suffix}")
            reason = reason or bad
            group.append([suffix, m.offset_data, m.size, spec.checksum(data), value])
        if key is not None:
            yield [key, group, reason]


def _check_member(suffix: str, data: bytes, where: str) -> tuple[Any, str | None]:
    """(the value the index keeps, or None; why the member does not parse, or None)."""
    if suffix in IMAGE_EXTS:
        return None, None if data else f"{where}: empty image member"
    _name, kind = field_of(suffix, where)
    try:
        if kind == "text":
            data.decode("utf-8")
        elif kind == "json":
            json.loads(data)
            try:
                return label_of({"json": data}, where), None
            except SourceError:
                return None, None
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
