"""Shards indexed in place: where ``ShardDataset`` finds shards that live outside their index folder.

``pack-dataset index SHARDS -o IDX`` (``packer/tools/index.py``) reads WebDataset shards written by
other tools (img2dataset, webdataset's ``ShardWriter``, ``tar``) once and writes only an index; the
shards are never written. The index is a wds index (``readers.contract.spec``) with::

    index.json   "spec_version": 3, "format": "wds",
                 "inplace": {"base": "../shards" | "/abs/shards" | "s3://bucket/shards",
                             "members": ["txt", "json"]},     # fields read from members, column order
                 "shards": [{"name": "part/000.tar",          # path under base
                             "samples", "first", "bytes", "crc32",
                             "mtime_ns" (local) | "etag", "mtime" (a store)}, ...]
    labels.npy, checksums.npy, sizes.npy, offsets.npy, shards.npy   the image member (as a wds pack)
    member_offsets.npy <i8, member_sizes.npy <i8, member_crcs.npy <u4   (N, len(members)): the others
    field_checksums.npy, field-<name>.npy    as a wds pack's typed fields (docs/fields.md)
    names.jsonl   "<shard name>/<key>.<image ext>" per sample

A relative ``base`` is relative to the index folder (or URL), so index and shards move together.
Every open of a local shard compares its size and mtime with the index, every first use of a
remote one its size and ETag: a changed, moved or missing shard is one line naming it. Tar
headers in front of members are checked (size, header checksum) but not their names, which are
the other tool's keys; the CRC-32 of each member is in the index (``verify``).
"""

from __future__ import annotations

import os
import posixpath
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from readers.contract import spec
from readers.contract.perprocess import PerProcess
from readers.formats import wds_io
from readers.remote.files import RemoteFiles  # no client library loads before the first request

__all__ = ["InPlace", "resolve_base", "changed"]


def resolve_base(root: Path | str, base: str) -> Path | str:
    """Where the shards of an index at ``root`` (a folder, or a URL) live: ``base`` as recorded."""
    if spec.is_remote(base) or os.path.isabs(base):
        return spec.parse_location(base)
    if isinstance(root, str):  # a remote index: base is relative to its URL
        scheme, _, path = root.partition("://")
        return f"{scheme}://{posixpath.normpath(posixpath.join(path, base))}"
    return Path(os.path.normpath(Path(root) / base))


def changed(location: str, what: str, detail: str = "") -> spec.DatasetFormatError:
    """The one line for a shard that is not the one indexed."""
    return spec.DatasetFormatError(f"{location}: shard {what} since it was indexed{detail}; index it again "
                                   "(pack-dataset index ... --overwrite)")


class InPlace:
    """The shards of an in-place index: their locations, identity checks and member arrays."""

    def __init__(self, ds: Any, storage_options: Any = None, retry: Any = None, cache_dir: Any = None,
                 cache_limit: Any = None) -> None:
        meta = ds.meta
        info = meta[spec.INPLACE_KEY]
        members = info.get("members", [])
        if not isinstance(info.get("base"), str) or not isinstance(members, list):
            raise spec.DatasetFormatError(f"{ds.location_of(spec.INDEX_NAME)}: {spec.INPLACE_KEY!r} must hold "
                                          "'base' (a path or URL) and 'members' (field names)")
        self.base = resolve_base(ds.root, info["base"])
        self.members: tuple[str, ...] = tuple(members)
        self.shards: list[dict[str, Any]] = meta["shards"]
        self.names = [s["name"] for s in self.shards]
        self.n = int(meta["num_samples"])
        self.image = (ds.index.arrays["offsets"], ds.index.arrays["sizes"])
        self._refs = {name: ds.file_ref(name) for name in spec.MEMBER_ARRAYS} if members else {}
        self._arrays: PerProcess[dict[str, np.ndarray]] = PerProcess(dict)
        self._inside: PerProcess[set[int]] = PerProcess(set)  # local shards checked to lie inside base
        #: Remote shards: sizes, CRC-32s and the node cache, each shard's identity checked on first use.
        self.remote: CheckedFiles | None = None
        if isinstance(self.base, str):
            from readers.remote import open_store

            self.remote = CheckedFiles(open_store(self.base, storage_options, retry), meta, cache_dir, cache_limit)
            self.remote.identities = {s["name"]: s for s in self.shards}

    def location(self, shard: int) -> str:
        if self.remote is not None:
            return self.remote.url_of(self.names[shard])
        return os.path.join(self.base, self.names[shard])

    def path(self, shard: int) -> Path:
        if self.remote is not None:
            raise ValueError(f"{self.base} is remote: its shards have URLs (shard_location), not paths")
        return Path(self.base) / self.names[shard]

    def open(self, shard: int, check: bool = True) -> int:
        """A descriptor of local shard ``shard``, after checking it is the file indexed (size, mtime;
        ``check=False``: ``verify``, which then reads what changed)."""
        where = self.location(shard)
        inside = self._inside.get()
        try:
            if shard not in inside:  # inside the shards' folder (symlinks resolved): once per process
                spec.member_path(self.base, self.names[shard], "shard file")
                inside.add(shard)
            fd = spec.open_regular(where, "shard file")
        except (FileNotFoundError, spec.DatasetFormatError):
            if not os.path.lexists(where):
                raise changed(where, "is missing (moved or deleted)") from None
            raise
        st = os.fstat(fd)
        s = self.shards[shard]
        if check and (st.st_size != s["bytes"] or ("mtime_ns" in s and st.st_mtime_ns != s["mtime_ns"])):
            os.close(fd)
            raise changed(where, "changed", f" ({st.st_size} bytes, the index says {s['bytes']}" +
                          (")" if st.st_size != s["bytes"] else "; its modification time differs)"))
        return fd

    def arrays(self) -> dict[str, np.ndarray]:
        """The member arrays (offsets, sizes, CRC-32s), mapped in this process on first use."""
        arrays = self._arrays.get()
        if not arrays and self.members:
            for name, dtype in spec.MEMBER_ARRAYS.items():
                path = self._refs[name]()
                os.close(spec.open_regular(path, "member array"))
                try:
                    arr = np.load(path, mmap_mode="r", allow_pickle=False)
                except (ValueError, OSError, EOFError) as exc:
                    raise spec.DatasetFormatError(f"{path}: member array is damaged ({exc})") from None
                if arr.dtype != dtype or arr.shape != (self.n, len(self.members)):
                    raise spec.DatasetFormatError(f"{path}: holds {arr.dtype.str} {arr.shape}, expected "
                                                  f"{dtype.str} {(self.n, len(self.members))}")
                arrays[name] = arr.view(np.ndarray)  # a plain view: memmap's own indexing is slow
        return arrays

    def member(self, pread: Callable[[int, int], bytes], shard: int, i: int, name: str) -> bytes:
        """The bytes of sample ``i``'s member holding field ``name``, its tar header checked."""
        if name == "image":  # the index arrays of a wds pack
            return self._read(pread, shard, i, name, int(self.image[0][i]), int(self.image[1][i]))
        j = self.members.index(name)
        a = self.arrays()
        return self._read(pread, shard, i, name, int(a["member_offsets.npy"][i, j]), int(a["member_sizes.npy"][i, j]))

    def _read(self, pread: Callable[[int, int], bytes], shard: int, i: int, name: str, offset: int, size: int) -> bytes:
        end = int(self.shards[shard]["bytes"])
        where = lambda: f"{self.location(shard)} sample {i} field {name!r} at byte {offset - spec.TAR_BLOCK}"  # noqa: E731
        if offset < spec.TAR_BLOCK or size < 0 or offset + size > end:
            raise spec.DatasetFormatError(f"{where()}: member outside the shard ({end} bytes): the index is damaged")
        return wds_io.check_sample(pread(offset - spec.TAR_BLOCK, spec.TAR_BLOCK + size), i, size, where,
                                   named=False)

    def members_of(self, pread: Callable[[int, int], bytes], shard: int, i: int, names: set[str]) -> dict[str, bytes]:
        """:meth:`member` of each field in ``names`` (one row of the member arrays read for all)."""
        out = {}
        if "image" in names:
            out["image"] = self.member(pread, shard, i, "image")
        if len(out) < len(names):
            a = self.arrays()
            offsets, sizes = a["member_offsets.npy"][i].tolist(), a["member_sizes.npy"][i].tolist()
            for j, name in enumerate(self.members):
                if name in names:
                    out[name] = self._read(pread, shard, i, name, offsets[j], sizes[j])
        return out

    def close(self) -> None:
        """Drop this process's mapped member arrays (and the remote shards' connections)."""
        self._arrays.close()
        if self.remote is not None:
            self.remote.close()

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _arrays=PerProcess(dict), _inside=PerProcess(set), image=None)


class CheckedFiles(RemoteFiles):
    """``RemoteFiles`` of shards in place: on the first use of each shard in a process, its size and
    ETag are compared with the index (one request), so a replaced object is refused in one line."""

    identities: dict[str, dict[str, Any]] = {}

    def _check(self, name: str) -> None:
        seen = self.__dict__.get("_seen")
        if seen is None or seen[0] != os.getpid():
            seen = self.__dict__["_seen"] = (os.getpid(), set[str](), threading.Lock())
        if name in seen[1]:
            return
        want = self.identities.get(name, {})
        try:
            info = self.store.stat(name)
        except FileNotFoundError:
            raise changed(self.url_of(name), "is missing (moved or deleted)") from None
        if info.size != want.get("bytes") or (want.get("etag") and info.etag and info.etag != want["etag"]):
            raise changed(self.url_of(name), "changed", f" (size {info.size}, ETag {info.etag}; the index says "
                                                        f"{want.get('bytes')}, {want.get('etag')})")
        with seen[2]:
            seen[1].add(name)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_seen", None)
        return state

    def fetch(self, name: str, progress: Any = None) -> Path:
        self._check(name)
        return super().fetch(name, progress)

    def local(self, name: str) -> str:
        self._check(name)
        return super().local(name)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        self._check(name)
        return super().read_range(name, start, length)
