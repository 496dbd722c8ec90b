"""The on-disk contract shared by ``packer`` (writes) and ``readers`` (reads).

Every packed dataset is one folder. Whatever the format, it holds:

* ``index.json`` -- the metadata record, written *last* (temp file, fsync,
  rename). Its presence is the commit marker: a folder without it is an
  unfinished or interrupted pack and readers refuse it.
* ``<name>.npy`` -- per-sample index arrays (labels, checksums, offsets,
  ...), plain little-endian numpy files that ``numpy.load`` opens.
* ``names.jsonl`` -- one JSON string per line: each sample's source path
  relative to the class folder's parent (``<class>/<file>``). Readers never
  load it unless asked (it is the only per-sample text).
* the format's data files (see each format's module for its byte layout).

A folder packed from a source that holds split folders (``train/``,
``val/``) has one such dataset folder per split and no ``index.json`` of
its own.

Nothing in this module imports torch: the packer and command-line tools use it.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

__all__ = [
    "INDEX_NAME",
    "NAMES_FILE",
    "SPEC_VERSION",
    "FORMATS",
    "ARRAY_DTYPES",
    "REQUIRED_ARRAYS",
    "CHECKSUM_ALGO",
    "IncompleteDatasetError",
    "DatasetFormatError",
    "Index",
    "checksum",
    "read_index",
    "write_index",
    "find_splits",
    "wds_key",
    "lmdb_key",
    "LMDB_META_KEY",
    "DATA_FILE",
    "HDF5_CHUNK_TABLE",
    "HDF5_CHUNK_BYTES",
    "MMAP_HEADER_BYTES",
    "TAR_BLOCK",
    "REJECTS_NAME",
    "RECORD_DTYPE",
    "STATE_NAME",
    "shard_name",
    "array_file",
    "write_json_atomic",
    "fsync_dir",
]

INDEX_NAME = "index.json"
NAMES_FILE = "names.jsonl"
#: A pack in progress (or interrupted) leaves this journal beside its data.
STATE_NAME = "pack-state.json"
SPEC_VERSION = 1
FORMATS = ("wds", "lmdb", "hdf5", "mmap")
CHECKSUM_ALGO = "crc32"

# Explicit little-endian dtypes so an index written on one machine reads the
# same on any other. int64 for byte positions (ImageNet is ~140 GB, far past
# 2**31); int32 for labels and shapes (compact: 1.28M labels = 5 MB);
# uint32 for CRC-32 values.
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

#: LMDB: reserved key holding a copy of index.json (keys of samples are digits,
#: so ``__`` sorts after every one of them and appends stay ordered).
LMDB_META_KEY = b"__meta__"

# ---------------------------------------------------------------- file names
#: The one data file of each single-file format (wds has shards, see shard_name).
DATA_FILE: Mapping[str, str] = {"lmdb": "data.mdb", "hdf5": "data.h5", "mmap": "images.npy"}
#: hdf5: byte offset of each chunk of /images inside data.h5 (<i8), beside it.
HDF5_CHUNK_TABLE = "h5chunks.npy"
#: hdf5: bytes per chunk of /images (1 MiB: whole-chunk writes, small table).
HDF5_CHUNK_BYTES = 1 << 20
#: mmap: images.npy's .npy header is padded to exactly this many bytes.
MMAP_HEADER_BYTES = 128
#: wds: tar block size (headers and padding).
TAR_BLOCK = 512
#: Images that could not be packed, one JSON object per line (only when there are any).
REJECTS_NAME = "rejects.jsonl"

#: Sample order of a pack (index.json ``"order": {"kind": ..., "seed": ...}``): ``"source"`` =
#: sorted by class then path, exactly torchvision's ImageFolder order; ``"shuffled"`` = the
#: source order permuted by :func:`order_permutation` (sample k is source file ``perm[k]``,
#: rejects left out). names.jsonl, labels.npy and every index array follow the written order.
ORDER_KINDS = ("shuffled", "source")
#: The pack-time order each format gets by default: wds is read sequentially shard by shard, so
#: its samples are shuffled at pack time; the map-style readers shuffle globally when read.
DEFAULT_ORDER: Mapping[str, str] = {"wds": "shuffled", "lmdb": "source", "hdf5": "source", "mmap": "source"}


def order_permutation(n: int, seed: int) -> np.ndarray:
    """``"shuffled"`` order of ``n`` scanned files: the source position of the k-th written one."""
    return np.random.default_rng([int(seed), 0x5EED_0D4E]).permutation(n)


#: One record per sample with every index array as a field (the packer's
#: journal appends these; each format keeps the fields REQUIRED_ARRAYS names).
RECORD_DTYPE = np.dtype([(name, dtype) for name, dtype in ARRAY_DTYPES.items()])


def array_file(name: str) -> str:
    """File name of the per-sample index array ``name`` (one of ARRAY_DTYPES)."""
    return f"{name}.npy"


def shard_name(split: str, index: int) -> str:
    """wds: file name of shard ``index`` of ``split``."""
    return f"{split}-{index:06d}.tar"


class DatasetFormatError(ValueError):
    """The folder is not a dataset this version can read."""


class IncompleteDatasetError(DatasetFormatError):
    """The folder holds a pack that never finished (no ``index.json``)."""


try:  # ISA-L's CRC-32 (carry-less multiply): the same function as zlib's, ~30x faster here
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    _crc32 = zlib.crc32


def checksum(data: bytes | memoryview | np.ndarray, value: int = 0) -> int:
    """CRC-32 (zlib's polynomial) of ``data``; chain calls by passing the previous value."""
    return _crc32(data, value) & 0xFFFFFFFF


def wds_key(index: int) -> str:
    """WebDataset key of sample ``index``: digits only, so never a dot."""
    return f"{index:010d}"


def lmdb_key(index: int) -> bytes:
    """LMDB key of sample ``index``: fixed-width ASCII digits sort in index order."""
    return b"%010d" % index


@dataclass(frozen=True)
class Index:
    """A dataset's metadata plus its per-sample arrays (loaded eagerly, small)."""

    root: Path
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    @property
    def format(self) -> str:
        return self.meta["format"]

    @property
    def num_samples(self) -> int:
        return int(self.meta["num_samples"])

    @property
    def classes(self) -> list[str]:
        return list(self.meta["classes"])

    @property
    def labels(self) -> np.ndarray:
        return self.arrays["labels"]

    def names(self) -> Iterator[str]:
        """Source path of each sample, in sample order (read lazily)."""
        with open(self.root / NAMES_FILE, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)


def _load_array(root: Path, name: str, expected_len: int | None) -> np.ndarray:
    path = root / array_file(name)
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DatasetFormatError(f"{root}: index array {path.name} is missing") from None
    except ValueError as exc:
        raise DatasetFormatError(f"{root}: index array {path.name} is damaged: {exc}") from exc
    want = ARRAY_DTYPES[name]
    if arr.dtype != want:
        raise DatasetFormatError(f"{root}: {path.name} has dtype {arr.dtype}, expected {want}")
    if expected_len is not None and len(arr) != expected_len:
        raise DatasetFormatError(
            f"{root}: {path.name} holds {len(arr)} entries, index.json says {expected_len} samples"
        )
    return arr


def find_splits(root: str | os.PathLike) -> list[str]:
    """Names of the split sub-folders of ``root`` that hold a finished dataset."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / INDEX_NAME).is_file())


def read_index(root: str | os.PathLike) -> Index:
    """Read and check ``root/index.json`` and its arrays; clear errors otherwise."""
    root = Path(root)
    path = root / INDEX_NAME
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such dataset folder")
    if not path.is_file():
        splits = find_splits(root)
        if splits:
            raise DatasetFormatError(
                f"{root} holds several splits ({', '.join(splits)}); open one of them, "
                f"e.g. {root / splits[0]}"
            )
        if (root / STATE_NAME).exists():
            raise IncompleteDatasetError(
                f"{root}: this pack never finished (no {INDEX_NAME}, a {STATE_NAME} journal is "
                "present). Re-run the same pack-dataset command with --resume to complete it."
            )
        raise DatasetFormatError(f"{root}: not a packed dataset (no {INDEX_NAME})")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetFormatError(f"{path}: unreadable index ({exc})") from exc
    version = meta.get("spec_version")
    if version != SPEC_VERSION:
        raise DatasetFormatError(
            f"{path}: spec_version {version!r}, this dataset-packer reads version {SPEC_VERSION}"
        )
    fmt = meta.get("format")
    if fmt not in REQUIRED_ARRAYS:
        raise DatasetFormatError(f"{path}: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    n = int(meta["num_samples"])
    arrays = {name: _load_array(root, name, n) for name in REQUIRED_ARRAYS[fmt]}
    return Index(root=root, meta=meta, arrays=arrays)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or file creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to ``path`` via a temp file, fsync and rename (never half-written)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def save_array(root: str | os.PathLike, name: str, values: Any) -> np.ndarray:
    """Save one per-sample array with the contract's dtype, durably."""
    arr = np.ascontiguousarray(values, dtype=ARRAY_DTYPES[name])
    path = Path(root) / array_file(name)
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return arr


def write_index(root: str | os.PathLike, meta: dict[str, Any], arrays: Mapping[str, Any]) -> None:
    """Write the per-sample arrays, then ``index.json`` last, as the commit marker."""
    root = Path(root)
    fmt = meta["format"]
    missing = set(REQUIRED_ARRAYS[fmt]) - set(arrays)
    if missing:
        raise ValueError(f"format {fmt!r} needs index arrays {sorted(missing)}")
    for name, values in arrays.items():
        save_array(root, name, values)
    meta = dict(meta, spec_version=SPEC_VERSION, checksum=CHECKSUM_ALGO)
    write_json_atomic(root / INDEX_NAME, meta)
