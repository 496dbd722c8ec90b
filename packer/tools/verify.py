"""``pack-dataset verify PATH``: recompute every checksum, name what is damaged.

Before any sample is read, the index itself is checked: ``index.json`` and
every ``.npy`` array (regular files inside the folder, array checksums,
values in range: :mod:`readers.contract.checks`), then every data file (a regular
file inside the folder, of the size ``index.json`` records; LMDB: at least
as long as its meta page says; HDF5: ``/images`` a plain dataset stored in
``data.h5`` whose chunks sit where the chunk table says). A data file that
fails those checks is reported once and its samples are not read (mapping
a truncated file could kill the process). Then each sample's stored bytes
are re-read through the format's reader and their CRC-32 compared with the
index; for ``wds`` each whole shard's CRC-32 and size too, and every tar
header in front of a sample. Typed fields: each extra field's blob against
``field_checksums.npy`` (:mod:`packer.tools.verify_fields`).

Exit code 0 when everything matches, 1 when anything is damaged, missing
or unreadable (one line each; never a traceback). Remote datasets
(``s3://``, ``http(s)://``): :mod:`packer.tools.verify_remote`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from packer.progress import bar as progress_bar
from packer.progress import download_bar
from packer.tools.verify_report import Problem, VerifyReport, check_sample, reason
from readers.contract import checkcache
from readers.contract import spec
from readers.contract.generations import appended_since
from readers.contract.checks import data_files
from readers.contract.location import UnsupportedLocationError
from readers.formats.resolve import resolve_index

__all__ = ["Problem", "VerifyReport", "verify", "main", "add_arguments", "run"]


def _file_crc(fd: int) -> tuple[int, int]:
    crc, size = 0, 0
    while chunk := os.read(fd, 8 << 20):
        crc = spec.checksum(chunk, crc)
        size += len(chunk)
    return crc, size


def _verify_wds(ds, report: VerifyReport, tick: Callable[[int], None]) -> None:
    checksums = ds.index.arrays["checksums"]
    for k, shard in enumerate(ds.meta["shards"]):
        path = ds.shard_path(k)
        try:
            fd = ds.open_shard(k)
        except spec.DatasetFormatError as exc:
            report.problems.append(Problem(str(path), reason(exc, path)))
            tick(int(shard["samples"]))
            continue
        try:
            crc, size = _file_crc(fd)
            if size != shard["bytes"]:
                report.problems.append(Problem(str(path), f"shard is {size} bytes, index says {shard['bytes']}"))
            elif crc != shard["crc32"]:
                report.problems.append(Problem(str(path), "shard checksum differs from the index"))
            for i in ds.samples_of_shard(k):
                check_sample(report, f"{path} sample {i}", lambda: ds.read_from(fd, k, i), checksums[i])
                tick(1)
        finally:
            os.close(fd)


def _check_data_files(ds, report: VerifyReport) -> bool:
    """Single-file formats: the data file (and chunk table) before any sample is read.
    False when the samples must not be read (reported once here instead)."""
    root, ok = ds.root, True
    grown = appended_since(ds.index)  # an append has grown the data files past this generation's end
    for name, size in data_files(ds.index).items():
        path = root / name
        try:
            fd = spec.open_member(root, name, "data file")
        except spec.DatasetFormatError as exc:
            report.problems.append(Problem(str(path), reason(exc, path)))
            ok = False
            continue
        try:
            actual = os.fstat(fd).st_size
            if size is not None and actual != size and not (grown and actual > size):
                report.problems.append(Problem(str(path), f"file is {actual} bytes, index says {size}"))
                ok = ok and actual > size  # a longer file reads safely; a shorter one is not mapped
            if ds.format == "lmdb" and name == spec.DATA_FILE["lmdb"]:
                from readers.formats.lmdb import check_data_file

                check_data_file(str(path), None, full=True)  # every B-tree page (readers check O(1) pages)
        except spec.DatasetFormatError as exc:
            report.problems.append(Problem(str(path), reason(exc, path)))
            ok = False
        finally:
            os.close(fd)
    if ok and ds.format == "hdf5":
        problem = _hdf5_structure(ds)
        if problem:
            report.problems.append(Problem(str(ds.data_file), problem))
            ok = False
    return ok


# The child reads the chunk table (raw <i8) from stdin: as a command-line argument it passed Linux's
# 128 KiB limit per argument at ~10 GB of data.h5 ("Argument list too long").
_H5_CHECK = r"""
import sys
import h5py
import numpy as np
from readers.formats.h5layout import check_chunks, check_images
from readers.contract.spec import DatasetFormatError
file, chunk_bytes = sys.argv[1], int(sys.argv[2])
raw = sys.stdin.buffer.read()
try:
    with h5py.File(file, "r") as f:
        images = check_images(f, file, chunk_bytes)
        if sys.argv[3] == "table":
            check_chunks(images, file, np.frombuffer(raw, dtype="<i8"), chunk_bytes)
except DatasetFormatError as exc:
    print(str(exc).removeprefix(file + ": "))
except Exception as exc:
    print(f"HDF5 cannot read the file's structure ({type(exc).__name__}: {exc})")
"""


def _hdf5_structure(ds) -> str | None:
    """Check data.h5's structure with h5py in a child process (libhdf5 may crash on a damaged
    file; a crash is reported, not suffered). None when it is sound. The chunk table goes
    through the child's stdin and is checked in one pass over HDF5's chunk index (linear)."""
    table = ds.chunk_table
    args = [str(ds.data_file), str(ds.chunk_bytes if table is not None else spec.HDF5_CHUNK_BYTES),
            "table" if table is not None else "none"]
    payload = b"" if table is None else np.ascontiguousarray(table, dtype="<i8").tobytes()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                       os.environ.get("PYTHONPATH")])))
    try:
        res = subprocess.run([sys.executable, "-c", _H5_CHECK, *args], input=payload, capture_output=True,
                             timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return "HDF5 did not finish reading the file's structure in 10 minutes"
    if res.returncode != 0:
        return f"HDF5 crashed reading the file's structure (exit {res.returncode}): the file is damaged"
    return res.stdout.decode("utf-8", "replace").strip() or None


@checkcache.full_checks  # verify finds damage that changes no file's metadata: never skip a check
def verify(path: str | os.PathLike | spec.Index,
           progress: Callable[[int], None] | None = None, *,
           storage_options: dict[str, Any] | None = None,
           download_progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check one dataset folder or URL (or its index, already read); returns a report listing every
    damaged sample or file. Raises DatasetFormatError when the index itself is unusable.
    Remote datasets: see :mod:`packer.tools.verify_remote` (``storage_options``, and
    ``download_progress(done, total)`` for the data file download of lmdb/hdf5/mmap)."""
    index = resolve_index(path, storage_options)
    if index.store is not None and not spec.is_inplace(index.meta):  # in place: its shards may live elsewhere
        from packer.tools.verify_remote import verify_remote
        from readers.contract.checks import check_index

        check_index(index)  # the same range checks as a local dataset, before any data is read
        report = VerifyReport(index.root)
        verify_remote(index, report, progress or (lambda n: None), download_progress)
        _check_names(index, report)
        return report
    from readers.formats.registry import open_dataset  # imports torch: not needed for `pack-dataset --help`

    ds = open_dataset(index, decode=False, storage_options=storage_options)
    root = ds.root
    report = VerifyReport(root)
    if spec.ARRAYS_KEY not in ds.meta:
        report.notes.append(f"{root / spec.INDEX_NAME} records no checksums of the index arrays "
                            "(packed by an older version): the arrays were checked for range only")
    tick = progress or (lambda n: None)
    try:
        if ds.format == "wds" and ds.inplace is not None:  # shards indexed in place
            from packer.tools.verify_inplace import verify_inplace

            verify_inplace(ds, report, tick)
        elif ds.format == "wds":
            _verify_wds(ds, report, tick)
        elif _check_data_files(ds, report):
            checksums = ds.index.arrays["checksums"]
            for i in range(len(ds)):
                check_sample(report, f"{ds.data_file} sample {i}", lambda: ds.read(i), checksums[i])
                tick(1)
        else:
            tick(len(ds))
    finally:
        ds.close()
    from packer.tools.verify_fields import verify_fields

    if index.store is None:  # (an in-place index in a store: each member's CRC-32 was checked above)
        verify_fields(index, report)  # typed fields, read as the readers read them: field_checksums.npy
    _check_names(index, report)
    return report


def _check_names(index: spec.Index, report: VerifyReport) -> None:
    """``names.jsonl``: every line a JSON string, one line per sample (``spec.Index.names`` checks
    both); its first damage is reported as ``names.jsonl:LINE``, like any other damaged file."""
    where = f"{index.location}/{spec.NAMES_FILE}"
    try:
        for _ in index.names(grown=appended_since(index)):
            pass
    except spec.DatasetFormatError as exc:
        text = str(exc)
        at, sep, what = text.partition(": ")
        report.problem(at if sep and at.startswith(where) else where, what if sep else text)
    except OSError as exc:  # missing or unreadable (remote: the store's one-line error)
        report.problem(where, f"cannot be read ({exc.strerror or exc})")


def _location(text: str) -> Path | str:
    """``PATH``: a local folder (``file://`` too) or a remote URL; other schemes: a usage error."""
    try:
        return spec.parse_location(text)
    except UnsupportedLocationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _roots(path: Path | str) -> list[Path | str]:
    if isinstance(path, str):
        from packer.tools.verify_remote import remote_roots

        return list(remote_roots(path))
    if not os.path.lexists(path / spec.INDEX_NAME) and spec.find_splits(path):
        return [path / s for s in spec.find_splits(path)]
    return [path]


def _verify_one(root: Path | str, quiet: bool) -> int:
    try:
        index = resolve_index(root)
    except (spec.DatasetFormatError, OSError) as exc:
        print(f"pack-dataset verify: error: {exc}", file=sys.stderr)
        return 1
    label = str(root).rstrip("/").rsplit("/", 1)[-1]
    bar = progress_bar(index.num_samples, "img", f"verify {label}", quiet)
    try:
        report = verify(index, bar.update if bar else None, download_progress=download_bar(quiet))
    except (spec.DatasetFormatError, OSError) as exc:  # an unusable index; remote: the store went away
        print(f"pack-dataset verify: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if bar:
            bar.close()
        if index.store is not None:  # a remote dataset's connections: verify runs in-process too (tests, callers)
            index.store.close()
    for prob in report.problems:
        print(f"DAMAGED {prob.where}: {prob.what}")
    for note in report.notes:
        print(f"note: {note}")
    verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{root}: {report.samples} samples checked, {verdict}")
    return 0 if report.ok else 1


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
    """``pack-dataset verify`` with parsed arguments; returns the exit code (1: damage found, 2: no
    dataset there -- a missing path or bucket, as ``info``, ``convert`` and ``pack`` say it)."""
    if isinstance(args.path, Path) and not os.path.lexists(args.path):
        print(f"pack-dataset verify: error: {args.path}: no such dataset folder", file=sys.stderr)
        return 2
    from readers.remote.errors import BucketNotFoundError  # here: a local verify never loads readers.remote

    try:
        roots = _roots(args.path)
    except BucketNotFoundError as exc:  # the URL is wrong (as a missing path): its one line names it
        print(f"pack-dataset verify: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unreadable folder; remote: unreachable, refused credentials
        print(f"pack-dataset verify: error: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    status = 0
    for root in roots:
        status = _verify_one(root, args.quiet) or status
    return status
