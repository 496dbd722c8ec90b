"""``pack-dataset verify PATH``: recompute every checksum, name what is damaged.

Each sample's stored bytes are re-read through the format's reader and
their CRC-32 compared with the index; for ``wds`` each whole shard's CRC-32
and size are checked too, and every tar header in front of a sample.
Exit code 0 when everything matches, 1 when anything is damaged or missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from readers import spec

__all__ = ["Problem", "VerifyReport", "verify", "main", "add_arguments", "run"]


@dataclass(frozen=True)
class Problem:
    where: str  # file (and sample) that is damaged
    what: str  # one-line reason


@dataclass
class VerifyReport:
    root: Path
    samples: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _file_crc(path: Path) -> tuple[int, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = spec.checksum(chunk, crc)
            size += len(chunk)
    return crc, size


def _verify_wds(ds, report: VerifyReport, tick: Callable[[int], None]) -> None:
    checksums = ds.index.arrays["checksums"]
    _check_shard_array(ds, report)
    for k, shard in enumerate(ds.meta["shards"]):
        path = ds.shard_path(k)
        if not path.exists():
            report.problems.append(Problem(str(path), "shard file is missing"))
            tick(int(shard["samples"]))
            continue
        crc, size = _file_crc(path)
        if size != shard["bytes"]:
            report.problems.append(Problem(str(path), f"shard is {size} bytes, index says {shard['bytes']}"))
        elif crc != shard["crc32"]:
            report.problems.append(Problem(str(path), "shard checksum differs from the index"))
        fd = os.open(path, os.O_RDONLY)
        try:
            for i in ds.samples_of_shard(k):
                _check_sample(report, f"{path} sample {i}", lambda: ds.read_from(fd, k, i), checksums[i])
                tick(1)
        finally:
            os.close(fd)


def _check_shard_array(ds, report: VerifyReport) -> None:
    """The shards array (random access) must agree with index.json's shard list (iteration)."""
    expected = np.repeat(np.arange(len(ds.shard_sizes)), ds.shard_sizes)
    if not np.array_equal(ds.index.arrays["shards"], expected):
        report.problems.append(Problem(str(ds.root / spec.array_file("shards")),
                                       f"disagrees with the shard list in {spec.INDEX_NAME}"))


def _check_sample(report: VerifyReport, where: str, read: Callable[[], object], expected: int) -> None:
    report.samples += 1
    try:
        data = read()
    except (spec.DatasetFormatError, OSError, KeyError, ValueError) as exc:
        report.problems.append(Problem(where, f"unreadable: {exc}"))
        return
    buf = np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data
    if spec.checksum(buf) != int(expected):
        report.problems.append(Problem(where, "checksum mismatch: stored bytes changed since packing"))


def verify(path: str | os.PathLike | spec.Index,
           progress: Callable[[int], None] | None = None, *,
           storage_options: dict[str, Any] | None = None,
           download_progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check one dataset folder or URL (or its index, already read); returns a report listing every
    damaged sample or file. Remote datasets: see :mod:`packer.verify_remote` (``storage_options``,
    and ``download_progress(done, total)`` for the data file download of lmdb/hdf5/mmap)."""
    if not isinstance(path, spec.Index) and spec.is_remote(path):
        from readers.remote import read_index

        path = read_index(path, storage_options)
    if isinstance(path, spec.Index) and path.store is not None:
        from packer.verify_remote import verify_remote

        report = VerifyReport(path.root)
        verify_remote(path, report, progress or (lambda n: None), download_progress, Problem)
        return report
    from readers.registry import open_dataset  # imports torch: not needed for `pack-dataset --help`

    ds = open_dataset(path, decode=False)
    root = ds.root
    report = VerifyReport(root)
    tick = progress or (lambda n: None)
    try:
        for name, size in ds.meta.get("files", {}).items():
            f = root / name
            if not f.exists():
                report.problems.append(Problem(str(f), "data file is missing"))
            elif f.stat().st_size != size:
                report.problems.append(Problem(str(f), f"file is {f.stat().st_size} bytes, index says {size}"))
        if ds.format == "wds":
            _verify_wds(ds, report, tick)
        else:
            checksums = ds.index.arrays["checksums"]
            for i in range(len(ds)):
                _check_sample(report, f"{ds.data_file} sample {i}", lambda: ds.read(i), checksums[i])
                tick(1)
    finally:
        ds.close()
    return report


def _location(text: str) -> Path | str:
    return text if spec.is_remote(text) else Path(text)


def _roots(path: Path | str) -> list[Path | str]:
    if isinstance(path, str):
        from packer.verify_remote import remote_roots

        return list(remote_roots(path))
    if not (path / spec.INDEX_NAME).exists() and spec.find_splits(path):
        return [path / s for s in spec.find_splits(path)]
    return [path]


def _read_index(root: Path | str) -> spec.Index:
    if isinstance(root, str):
        from readers.remote import read_index

        return read_index(root)
    return spec.read_index(root)


def _download_bar(quiet: bool) -> Callable[[int, int], None] | None:
    """A byte progress bar for the data file download of a remote lmdb/hdf5/mmap dataset."""
    if quiet:
        return None
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        from tqdm import tqdm

        bar = state.get("bar")
        if bar is None:
            bar = state["bar"] = tqdm(total=total, unit="B", unit_scale=True, desc="download", mininterval=0.5)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``pack-dataset verify``."""
    p.add_argument("path", type=_location, help="dataset folder or s3:// / http(s):// URL "
                                                "(or a folder of split datasets)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pack-dataset verify",
                                description="Recompute the checksums of a packed dataset and name damaged samples.")
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """``pack-dataset verify`` with parsed arguments; returns the exit code."""
    try:
        roots = _roots(args.path)
    except OSError as exc:  # remote: unreachable, refused credentials
        print(f"pack-dataset verify: error: {exc}", file=sys.stderr)
        return 1
    status = 0
    for root in roots:
        try:
            index = _read_index(root)
        except (spec.DatasetFormatError, OSError) as exc:
            print(f"pack-dataset verify: error: {exc}", file=sys.stderr)
            return 1
        bar = None
        if not args.quiet:
            from tqdm import tqdm

            label = str(root).rstrip("/").rsplit("/", 1)[-1]
            bar = tqdm(total=index.num_samples, unit="img", desc=f"verify {label}", mininterval=0.5)
        try:
            report = verify(index, bar.update if bar else None, download_progress=_download_bar(args.quiet))
        except OSError as exc:  # remote: the store went away past the retry budget
            print(f"pack-dataset verify: error: {exc}", file=sys.stderr)
            return 1
        finally:
            if bar:
                bar.close()
        for prob in report.problems:
            print(f"DAMAGED {prob.where}: {prob.what}")
        verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
        print(f"{root}: {report.samples} samples checked, {verdict}")
        status = status or (0 if report.ok else 1)
    return status
