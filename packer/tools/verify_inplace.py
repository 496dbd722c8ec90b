"""``verify`` of an index of shards in place (``pack-dataset index``; ``readers.formats.inplace``).

Each shard is first checked as the one indexed (local: size and mtime; a store: size and ETag),
then read whole for its CRC-32 and size, then every member of every sample -- the image and each
member the index lists -- is read at its offset, its tar header checked and its CRC-32 compared
with the index's. Each damaged member is one line naming the shard, the sample and the field.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from packer.tools.verify_report import VerifyReport, check_sample, reason
from readers.contract import spec

__all__ = ["verify_inplace"]


def _whole(ds: Any, k: int, fd: int | None) -> tuple[int, int]:
    crc = size = 0
    if fd is not None:
        pos = 0
        while chunk := os.pread(fd, 8 << 20, pos):
            crc, size, pos = spec.checksum(chunk, crc), size + len(chunk), pos + len(chunk)
        return crc, size
    for chunk in ds.shard_remote.store.stream(ds.shard_names[k]):
        crc, size = spec.checksum(chunk, crc), size + len(chunk)
    return crc, size


def verify_inplace(ds: Any, report: VerifyReport, tick: Callable[[int], None]) -> None:
    """Check every shard and member of the in-place ShardDataset ``ds`` into ``report``."""
    inplace = ds.inplace
    checksums = ds.index.arrays["checksums"]
    try:
        member_crcs = inplace.arrays().get("member_crcs.npy")
    except spec.DatasetFormatError as exc:
        report.problem(ds.root, str(exc))
        member_crcs = None
    for k, shard in enumerate(ds.meta["shards"]):
        where = ds.shard_location(k)
        remote, fd = ds.shard_remote, None
        try:
            if remote is None:
                try:
                    fd = inplace.open(k)
                except spec.DatasetFormatError as exc:  # changed: say so, then name what changed in it
                    fd = inplace.open(k, check=False)
                    report.problem(where, reason(exc, where))
            else:
                remote.read_range(ds.shard_names[k], 0, 0)  # its identity, checked once
            crc, size = _whole(ds, k, fd)
        except (spec.DatasetFormatError, OSError) as exc:
            report.problem(where, reason(exc, where))
            tick(int(shard["samples"]))
            if fd is not None:
                os.close(fd)
            continue
        try:
            if size != shard["bytes"]:
                report.problem(where, f"shard is {size} bytes, index says {shard['bytes']}")
            elif crc != shard["crc32"]:
                report.problem(where, "shard checksum differs from the index")
            name = ds.shard_names[k]
            pread: Callable[[int, int], bytes] = ((lambda pos, n: os.pread(fd, n, pos)) if fd is not None
                                                  else (lambda pos, n: remote.read_range(name, pos, n)))
            for i in ds.samples_of_shard(k):
                check_sample(report, f"{where} sample {i}", lambda: inplace.member(pread, k, i, "image"), checksums[i])
                for j, field in enumerate(inplace.members if member_crcs is not None else ()):
                    _check_member(report, f"{where} sample {i} field {field!r}",
                                  lambda: inplace.member(pread, k, i, field), int(member_crcs[i, j]))
                tick(1)
        finally:
            if fd is not None:
                os.close(fd)


def _check_member(report: VerifyReport, where: str, read: Callable[[], bytes], expected: int) -> None:
    try:
        data = read()
    except (spec.DatasetFormatError, OSError) as exc:
        report.problem(where, f"unreadable: {exc}")
        return
    if spec.checksum(data) != expected:
        report.problem(where, "checksum mismatch: the member changed since it was indexed")
