"""The per-sample index arrays of a dataset (``labels.npy``, ``offsets.npy``, ...): their dtypes, which
ones each format has, their file names, and each one loaded and saved with its checksum.

Every array is a plain little-endian ``.npy`` file beside ``index.json`` (:mod:`readers.contract.spec`),
which records each file's CRC-32 and size under ``index_arrays``. Index arrays are mapped read-only,
not read into memory (:func:`readers.contract.safeio.map_npy`): every process and loader worker that
opens the dataset shares the page cache's copy, and each array's CRC-32 is still compared with the
one ``index.json`` records (streamed over the mapping). A remote array is read whole, up to
:func:`array_bytes_limit`, and checked the same way. A re-pack renames new arrays over the old ones,
never rewrites them in place, so a mapped array never changes under a reader.

:mod:`readers.contract.spec` re-exports what its callers use of it (``spec.ARRAY_DTYPES``, ``spec.save_array``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from readers.contract.env import check_threads
from readers.contract.safeio import (
    INDEX_NAME,
    NPY_HEADER_LIMIT,
    DatasetFormatError,
    atomic_write,
    checksum,
    file_checksum,
    map_npy,
    member_path,
    parse_npy,
)

__all__ = [
    "ARRAY_DTYPES", "REQUIRED_ARRAYS", "RECORD_DTYPE", "GENERATION_KEY", "has_label", "required_arrays",
    "field_array_name", "array_file", "array_bytes_limit", "load_array", "array_from_bytes", "save_array",
    "write_array",
]

#: index.json key of an append's generation: an array of generation g is named by it (:func:`array_file`).
GENERATION_KEY = "generation"  # 0 when absent, +1 per append (readers.contract.generations)

# Explicit little-endian dtypes so an index written on one machine reads the same on any other. int64 for
# byte positions (ImageNet is ~140 GB, far past 2**31); int32 for labels and shapes (compact: 1.28M labels
# = 5 MB); uint32 for CRC-32 values.
ARRAY_DTYPES: Mapping[str, np.dtype] = {
    "labels": np.dtype("<i4"),  # class index, sorted class-folder order
    "checksums": np.dtype("<u4"),  # crc32 of the stored bytes of the sample
    "sizes": np.dtype("<i8"),  # stored byte length of the sample
    "offsets": np.dtype("<i8"),  # byte position of the sample in its file
    "shards": np.dtype("<i4"),  # which shard file (wds) holds the sample
    "heights": np.dtype("<i4"),  # mmap: pixel rows
    "widths": np.dtype("<i4"),  # mmap: pixel columns
}
REQUIRED_ARRAYS: Mapping[str, tuple[str, ...]] = {
    "wds": ("labels", "checksums", "sizes", "offsets", "shards"),
    "lmdb": ("labels", "checksums", "sizes"),
    "hdf5": ("labels", "checksums", "sizes", "offsets"),
    "mmap": ("labels", "checksums", "sizes", "offsets", "heights", "widths"),
}

#: One record per sample, a field per index array (the packer's journal appends these).
RECORD_DTYPE = np.dtype([(name, dtype) for name, dtype in ARRAY_DTYPES.items()])


def has_label(meta: Mapping[str, Any]) -> bool:
    """Whether ``labels.npy`` holds the samples' ``label`` (an ``int32`` field named ``label``, as in
    every index without ``"fields"``); otherwise it holds zeros or is left out, and is not range-checked."""
    fields = meta.get("fields")
    return not isinstance(fields, list) or any(isinstance(f, dict) and f.get("name") == "label"
                                               and f.get("type") == "int32" for f in fields)


def required_arrays(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The index arrays a dataset with this metadata has: :data:`REQUIRED_ARRAYS` of its format,
    less ``labels`` when its schema has no ``label`` (a caption dataset may leave it out)."""
    names = REQUIRED_ARRAYS[meta["format"]]
    if has_label(meta):
        return names
    return tuple(n for n in names if n != "labels")


def field_array_name(field: str) -> str:
    """The index array (``field-<name>.npy``) holding fixed-size field ``field`` (wds, lmdb, mmap)."""
    return f"field-{field}"


def array_file(name: str, meta: Mapping[str, Any] | None = None) -> str:
    """Index array ``name``'s file in the dataset whose index is ``meta``: ``labels.npy``, or for an
    append's generation g ``labels.g00000g.npy`` (new files: ``readers.contract.generations``)."""
    g = int((meta or {}).get(GENERATION_KEY) or 0)
    return f"{name}.g{g:06d}.npy" if g else f"{name}.npy"


def load_array(root: Path, name: str, expected_len: int, recorded: Any, identity: tuple | None = None,
               meta: Mapping[str, Any] | None = None) -> tuple[np.ndarray, tuple]:
    """Index array ``name``: a regular file inside ``root``, mapped read-only (page cache shared by
    every process, no private copy), its checksum (when index.json records one) streamed over the
    mapping, then a strict parse (nothing is allocated from what its header claims).
    ``identity``: the file was checked before as that file (:mod:`readers.contract.checkcache`): it must
    still be it (:class:`readers.contract.safeio.FileChanged` otherwise) and its checksum is not computed again."""
    path = member_path(root, array_file(name, meta), "index array")
    crc = _recorded_crc(path, recorded)
    return map_npy(path, ARRAY_DTYPES[name], expected_len, crc32=None if identity else crc, what="index array",
                   limit=array_bytes_limit(name, expected_len), identity=identity and identity[:4],
                   threads=check_threads())


def array_bytes_limit(name: str, n: int) -> int:
    """The most bytes index array ``name`` of ``n`` samples can hold: the largest ``.npy`` header
    (magic, version, length, then at most NPY_HEADER_LIMIT) plus ``n`` values. Local arrays are
    mapped only up to it and remote ones read only up to it (an endless body is cut there)."""
    return NPY_HEADER_LIMIT + 16 + n * ARRAY_DTYPES[name].itemsize


def _recorded_crc(where: Path | str, recorded: Any) -> int | None:
    """The CRC-32 index.json records for one array (None: none recorded, an older pack)."""
    if recorded is None:
        return None
    if not isinstance(recorded, dict) or type(recorded.get("crc32")) is not int:
        raise _damaged(where)
    return recorded["crc32"]


def _damaged(where: Path | str) -> DatasetFormatError:
    return DatasetFormatError(f"{where}: checksum differs from the one {INDEX_NAME} records: "
                              "the array is damaged or was edited")


def array_from_bytes(where: Path | str, name: str, buf: bytearray, expected_len: int, recorded: Any) -> np.ndarray:
    """An index array from its file's bytes (a remote dataset's): checksum (when recorded), then the strict parse."""
    want = _recorded_crc(where, recorded)
    if want is not None and want != checksum(buf):
        raise _damaged(where)
    return parse_npy(where, buf, ARRAY_DTYPES[name], expected_len, what="index array")


def save_array(root: str | os.PathLike[str], name: str, values: Any) -> np.ndarray:
    """Save one per-sample array with the contract's dtype, durably."""
    return write_array(Path(root), name, values)[0]


def write_array(root: Path, name: str, values: Any, meta: Mapping[str, Any] | None = None,
                durable: bool = True) -> tuple[np.ndarray, dict[str, int]]:
    """(the array as saved, its record under ``index.json``'s
    :data:`readers.contract.spec.ARRAYS_KEY`: CRC-32 and bytes of the file)."""
    arr = np.ascontiguousarray(values, dtype=ARRAY_DTYPES[name])
    if arr.ndim != 1:
        raise ValueError(f"index array {name!r} must be one-dimensional, got shape {arr.shape}")
    # Renamed over, never rewritten in place: a reader that has the old array mapped keeps its inode
    # (writing into a mapped file would change, or cut short, what that reader sees).
    with atomic_write(root / array_file(name, meta), durable=durable) as f:
        np.save(f, arr, allow_pickle=False)  # header, then the values straight from the array: no copy of them
        f.flush()
        size = f.tell()
        crc = file_checksum(f.name)  # read back in 8 MB blocks (page cache): memory flat in N
    return arr, {"crc32": crc, "bytes": size}
