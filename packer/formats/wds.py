"""WebDataset writer: POSIX (ustar) tar shards ``<split>-000000.tar``.

Counterpart: ``readers/formats/wds.py``. Byte layout of one shard::

    +--------------+--------------------------+--------------+-------------+
    | 512 B header | image bytes, 0-padded to | 512 B header | "<label>"   | ... 2x512 B
    | <key>.jpg    | a multiple of 512        | <key>.cls    | padded      |     zeros
    +--------------+--------------------------+--------------+-------------+
    ^ offsets[i] (in the index) points at the first image byte, so readers
      can slice a sample out of a shard without parsing tar headers.

Keys are the sample index as ten digits (``0000000042``): no dots, so the
official ``webdataset`` library groups ``.jpg``/``.png`` and ``.cls`` into one
sample. Beside the shards, ``wids-index.json`` lists them (name, samples,
bytes) in the ``wids`` library's shard-index format, so ``wids`` opens the
dataset for indexed (random) access without scanning the shards first. Headers carry mtime 0, uid/gid 0 and empty owner names so the same
input gives byte-identical shards. A shard is written as ``.tmp``, fsynced and
renamed when full: a complete-looking shard is always complete.

While the pack runs, each closed shard's record (name, samples, bytes, CRC-32,
first sample) is appended to ``shard-log.jsonl`` (:class:`ShardLog`); a
checkpoint fsyncs it and the journal records only its length, so a checkpoint
writes O(1) bytes however many shards came before. The log goes with the
journal once the index (which lists every shard) is written.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

from packer.errors import PackError
from packer.formats.base import FormatWriter
from packer.prepare.images import Prepared
from packer.output import SHARD_LOG_NAME, start_writeback
from readers.contract import spec
from readers.contract.fields import Schema, blob_member, member_suffix
from readers.contract.safeio import checksum_then

__all__ = ["WdsWriter", "ShardLog", "sample_tar", "sample_span", "END_OF_ARCHIVE"]


class ShardLog:
    """``shard-log.jsonl``: the closed shards of a wds pack in progress, one JSON line each.

    The checkpoint state is ``{"shards_closed": n, "log_bytes": b}``: the log's first ``b``
    bytes hold the first ``n`` shards, durable. Journals of earlier versions held the whole
    list (``{"shards": [...]}``, rewritten at every checkpoint); they still resume (the Ray
    engine's ``RayWdsWriter`` wrote such lists too, and now keeps this log as well).
    """

    def __init__(self, root: Path) -> None:
        self.path = root / SHARD_LOG_NAME
        self._file: BinaryIO | None = None
        self._synced = -1

    def resume(self, state: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The shards ``state`` vouches for; the log is cut back to them (or rebuilt from an old journal)."""
        if not state:
            shards: list[dict[str, Any]] = []
            self.path.unlink(missing_ok=True)
        elif "shards" in state:
            shards = list(state["shards"])
            self.path.unlink(missing_ok=True)
        else:
            shards, _ = self.read(self.path.parent, state)
            with open(self.path, "ab") as f:
                f.truncate(int(state["log_bytes"]))
        self._file = open(self.path, "ab")
        if "shards" in (state or {}):
            for shard in shards:
                self.append(shard)
        return shards

    def append(self, shard: dict[str, Any]) -> None:
        assert self._file is not None, "resume() opens the log"
        self._file.write((json.dumps(shard, sort_keys=True) + "\n").encode())

    def checkpoint(self, count: int) -> dict[str, Any]:
        """Make every appended record durable; the state that vouches for them."""
        assert self._file is not None, "resume() opens the log"
        self._file.flush()
        end = self._file.tell()
        if end != self._synced:
            os.fsync(self._file.fileno())
            self._synced = end
        return {"shards_closed": count, "log_bytes": end}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def read(root: Path, state: dict[str, Any], since: tuple[int, int] = (0, 0)
             ) -> tuple[list[dict[str, Any]], tuple[int, int]]:
        """The shards of checkpoint ``state`` after the first ``since[0]`` (which end at byte
        ``since[1]`` of the log), and the position after them: a caller that follows the
        checkpoints reads each record once."""
        if "shards" in state:  # an earlier version's journal (either engine's) listed every shard
            return list(state["shards"][since[0]:]), (len(state["shards"]), 0)
        path, (count, start) = root / SHARD_LOG_NAME, since
        want, end = int(state["shards_closed"]), int(state["log_bytes"])
        if (want, end) == (count, start):
            return [], since
        try:
            with open(path, "rb") as f:
                f.seek(start)
                raw = f.read(end - start)
        except OSError as exc:
            raise PackError(f"{path}: cannot read the shard log of the interrupted pack ({exc.strerror or exc}); "
                            "start again with --overwrite") from None
        try:
            shards = [json.loads(line) for line in raw.splitlines()]
        except ValueError:
            shards = []
        if len(raw) != end - start or len(shards) != want - count or not all(isinstance(s, dict) for s in shards):
            raise PackError(f"{path} is damaged (it should hold {want - count} more shard records in "
                            f"{end - start} bytes); start again with --overwrite")
        return shards, (want, end)


def tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


#: Bytes written to a shard between requests to start writing them back (``start_writeback``).
WRITEBACK_BYTES = 8 << 20

# The ustar header fields after the name (tarfile's layout and spelling), fixed but for the size:
_MODE_IDS = b"0000444\0" + b"0000000\0" * 2  # mode 0o444, uid 0, gid 0
_MTIME = b"00000000000\0"  # mtime 0
_REST = (b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * 64  # type, linkname, magic+version, uname+gname
         + b"\0" * 16 + b"\0" * 155 + b"\0" * 12)  # devmajor+devminor (empty: not a device), prefix, padding
_FIXED_SUM = sum(_MODE_IDS) + sum(_MTIME) + sum(_REST) + 8 * ord(" ")  # the checksum field counts as spaces


def tar_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header ``tarfile`` (Python 3.11+) writes for a regular file ``name`` of ``size``
    bytes with mode 0o444, mtime 0, uid/gid 0 and no owner names, built directly: tarfile's path costs
    ~40 us per header (a tenth of a sample's cost when converting), and its bytes vary between Python
    versions (device fields), while these do not."""
    raw = name.encode("utf-8")
    if len(raw) > 100 or size >= 8**11:  # a long name (prefix field) or a huge file: tarfile's own rules
        return tarfile_header(name, size)
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(raw) + sum(size_field)
    return raw.ljust(100, b"\0") + _MODE_IDS + size_field + _MTIME + b"%06o\0 " % checksum + _REST


def _pad(size: int) -> bytes:
    return b"\0" * (-size % spec.TAR_BLOCK)


class WdsWriter(FormatWriter):
    format = "wds"
    location_fields = ("offsets", "shards")

    _log: ShardLog | None = None

    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        if self.field_store is not None:
            self.field_store.open(samples)
        self._log = ShardLog(self.root)
        self.shards: list[dict[str, Any]] = self._log.resume(state)
        keep = {s["name"] for s in self.shards}
        for p in self.root.glob(f"{self.split}-*.tar*"):
            if p.name not in keep:
                p.unlink()  # a shard that was open when the pack was interrupted
        self._file: BinaryIO | None = None  # the open shard's temporary file (None between shards)
        self._first: int | None = None  # the open shard's first sample
        self._just_closed = False

    def _start_shard(self) -> None:
        name = spec.shard_name(self.split, len(self.shards))
        self._path = self.root / name
        self._tmp = self._path.with_name(name + ".tmp")
        self._file = open(self._tmp, "wb", buffering=1 << 20)
        self._pos = self._count = self._written_back = 0
        self._crc = 0
        self._first = None

    def _emit(self, chunk: bytes, crc: int | None = None) -> None:
        """Write ``chunk``; ``crc``: the shard's CRC-32 with it, when the caller has it already."""
        assert self._file is not None, "append() starts a shard"
        self._file.write(chunk)
        self._crc = spec.checksum(chunk, self._crc) if crc is None else crc
        self._pos += len(chunk)
        if self._pos - self._written_back >= WRITEBACK_BYTES:  # the disk starts on it now, not at the fsync
            self._file.flush()
            start_writeback(self._file.fileno(), self._written_back, self._pos - self._written_back)
            self._written_back = self._pos

    def append(self, sample_no: int, prepared: Prepared, label: int,
               fields: tuple[bytes, ...] | None = None) -> tuple[int, int]:
        if self._file is None:
            self._start_shard()
            self._first = sample_no
        offset = self._pos + sample_span(len(prepared.data))[0]
        if self.schema is None or self.schema.is_default:
            head, tail = sample_tar(sample_no, prepared.ext, len(prepared.data), label)
        else:
            head, tail = self._field_tar(self.schema, sample_no, prepared, label, fields)
        # one write per sample; the image's CRC-32 of the prepare stage is joined, not computed again
        crc = spec.checksum(tail, checksum_then(spec.checksum(head, self._crc), prepared.data, prepared.crc))
        self._emit(b"".join((head, prepared.data, tail)), crc)
        self._count += 1
        shard = len(self.shards)
        limit = self.options.shard_count
        if self._pos >= self.options.shard_size or (limit is not None and self._count >= limit):
            self._close_shard()
        return offset, shard

    def _field_tar(self, schema: Schema, sample_no: int, prepared: Prepared, label: int,
                   fields: tuple[bytes, ...] | None) -> tuple[bytes, bytes]:
        """The members around the image of a sample with typed fields: ``key.<image ext>`` first (its data
        at ``offsets[i]`` as always), ``key.cls`` when the schema keeps a label, then one member per extra
        field, ``key.<member_suffix(name, ext)>`` (``key.caption.txt``, ``key.boxes.npy``, ``key.txt``)."""
        blobs = self.store_fields(fields)
        key = spec.wds_key(sample_no)
        size = len(prepared.data)
        parts = [_pad(size)]
        members = []
        if schema.labels_field is not None:
            members.append(("cls", str(label).encode()))
        for f, blob in zip(self.extra, blobs, strict=True):
            ext, data = blob_member(f.type, blob)
            members.append((member_suffix(f.name, ext), data))
        for suffix, data in members:
            parts += [tar_header(f"{key}.{suffix}", len(data)), data, _pad(len(data))]
        return tar_header(f"{key}.{prepared.ext}", size), b"".join(parts)

    def _close_shard(self) -> None:
        self._emit(b"\0" * (2 * spec.TAR_BLOCK))  # end-of-archive marker
        assert self._file is not None, "append() starts a shard"
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        spec.publish(self._tmp, self._path)
        self.shards.append({"name": self._path.name, "samples": self._count, "bytes": self._pos,
                            "crc32": self._crc, "first": self._first})
        assert self._log is not None
        self._log.append(self.shards[-1])
        self._just_closed = True

    def at_checkpoint_boundary(self) -> bool:
        return self._just_closed

    def checkpoint(self) -> dict[str, Any]:
        # Only closed shards are durable (each fsynced as it closed); an open one is rewritten on resume.
        self._just_closed = False
        assert self._log is not None
        if self.field_store is not None:
            self.field_store.checkpoint()
        return self._log.checkpoint(len(self.shards))

    def end_samples(self) -> None:
        if self._file is not None:
            self._close_shard()

    def finalize(self, meta: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
        self.end_samples()
        if self._log is not None:
            self._log.close()  # the index lists the shards from now on; the journal's clean-up deletes the log
        self._write_wids_index()
        files = {s["name"]: s["bytes"] for s in self.shards}
        if self.field_store is not None:
            files.update(self.field_store.finalize(meta["num_samples"], meta=meta))
        return {"shards": self.shards, "files": files,
                "storage": {"wids_index": spec.WIDS_INDEX_NAME}}

    def _write_wids_index(self) -> None:
        """The shard list in the ``wids`` library's format (``wids.ShardListDataset(path)`` opens the
        dataset with random access; shard URLs are relative to the file, so the folder can move)."""
        spec.write_json_atomic(self.root / spec.WIDS_INDEX_NAME, {
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "name": self.split,
            "shardlist": [{"url": s["name"], "nsamples": s["samples"], "filesize": s["bytes"]} for s in self.shards],
        })

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._log is not None:
            self._log.close()
        if self.field_store is not None:
            self.field_store.close()


#: closes every shard: two zero blocks
END_OF_ARCHIVE = b"\0" * (2 * spec.TAR_BLOCK)


def sample_tar(sample_no: int, ext: str, size: int, label: int) -> tuple[bytes, bytes]:
    """The tar bytes around a sample's ``size`` stored bytes (the layout drawn at the top of this
    module): (the image member's header, the padding plus the ``.cls`` member). ``WdsWriter`` and
    the Ray engine's shard tasks both write these; :func:`sample_span` gives their sizes."""
    key = spec.wds_key(sample_no)
    cls = str(label).encode()
    return tar_header(f"{key}.{ext}", size), _pad(size) + tar_header(f"{key}.cls", len(cls)) + cls + _pad(len(cls))


def sample_span(size: int) -> tuple[int, int]:
    """(where a sample's data starts, the bytes it takes in all) from the sample's first byte in its
    shard, for ``size`` stored bytes: what :func:`sample_tar` writes around it (a header block, the
    data padded to whole blocks, the ``.cls`` header and one block for its label, under 512 bytes)."""
    return spec.TAR_BLOCK, spec.TAR_BLOCK + size + (-size % spec.TAR_BLOCK) + 2 * spec.TAR_BLOCK
