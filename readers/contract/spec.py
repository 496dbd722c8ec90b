"""The on-disk contract shared by ``packer`` (writes) and ``readers`` (reads).

Every packed dataset is one folder. Whatever the format, it holds:

* ``index.json`` -- the metadata record, written *last* (temp file, fsync,
  rename). Its presence is the commit marker: a folder without it is an
  unfinished or interrupted pack and readers refuse it.
* ``<name>.npy`` -- per-sample index arrays (labels, checksums, offsets,
  ...), plain little-endian numpy files that ``numpy.load`` opens
  (``<name>.gNNNNNN.npy`` from an append's generation N: ``readers.contract.generations``).
* ``names.jsonl`` -- one JSON string per line: each sample's source path
  relative to the class folder's parent (``<class>/<file>``). Readers never
  load it unless asked (it is the only per-sample text).
* the format's data files (see each format's module for its byte layout).
  ``index.json`` lists them under ``files`` (name -> bytes) and, since
  packs that can be uploaded, under ``files_crc32`` (name -> CRC-32 of the
  whole file) so that a download can be verified; older indexes lack
  ``files_crc32`` and stay readable.

The same folder may live in an object store or behind a web server
(``s3://bucket/prefix``, ``https://host/path``): :func:`read_index` then
reads it through a :class:`readers.remote.Store` it is given (duck-typed:
this module imports nothing else of ``readers``) and the :class:`Index`
keeps that store in ``index.store``.

A folder packed from a source that holds split folders (``train/``, ``val/``) has one such
dataset folder per split and no ``index.json`` of its own.

Beside it: the index arrays' dtypes, names, loads and saves (:mod:`readers.contract.indexarrays`), safe
I/O of a dataset's files (:mod:`readers.contract.safeio`) and where a dataset lives
(:mod:`readers.contract.location`), all three re-exported here; the lock a running pack holds
(:mod:`readers.contract.locks`); ``names.jsonl``'s parse (:mod:`readers.contract.samplenames`).
Nothing here imports torch: the packer and command-line tools use it.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generator, Iterable, Iterator, Mapping

import numpy as np

# Safe I/O, locations and the index arrays live in their own modules; their names stay importable from
# here (__all__).
from readers.contract import checkcache
from readers.contract.indexarrays import (
    ARRAY_DTYPES,
    GENERATION_KEY,
    RECORD_DTYPE,
    REQUIRED_ARRAYS,
    array_bytes_limit,
    array_file,
    array_from_bytes,
    field_array_name,
    has_label,
    load_array,
    required_arrays,
    save_array,
    write_array,
)
from readers.contract.locks import pack_in_progress
from readers.contract.samplenames import parse_names
from readers.contract.location import REMOTE_SCHEMES, UnsupportedLocationError, is_remote, parse_location
from readers.contract.safeio import (
    INDEX_NAME,
    atomic_write,
    fsync_dir,
    fsync_files,
    publish,
    DatasetFormatError,
    IncompleteDatasetError,
    check_member_name,
    checksum,
    FileChanged,
    file_checksum,
    map_file,
    map_npy,
    member_path,
    open_data_file,
    open_member,
    open_regular,
    parse_npy,
    read_range,
    read_regular,
)


__all__ = [
    # the index: read, written, checked
    "Index", "read_index", "read_meta", "write_index", "save_array", "write_json_atomic", "find_splits",
    "listed_splits",
    "recorded_files", "array_bytes_limit", "CRC_CHECK", "VALUES_CHECK",
    # index.json: versions, formats, keys
    "SPEC_VERSION", "READABLE_VERSIONS", "spec_version_for", "FORMATS", "CHECKSUM_ALGO", "ARRAYS_KEY",
    "FILES_CRC_KEY", "GENERATION_KEY", "MAX_SAMPLES", "MAX_INDEX_JSON_BYTES",
    # the index arrays, the schema's labels
    "ARRAY_DTYPES", "REQUIRED_ARRAYS", "RECORD_DTYPE", "array_file", "required_arrays", "has_label",
    "field_array_name",
    # file names, each format's layout, sample order
    "INDEX_NAME", "NAMES_FILE", "STATE_NAME", "REJECTS_NAME", "REPAIRS_NAME", "WIDS_INDEX_NAME", "DATA_FILE",
    "HDF5_CHUNK_TABLE", "HDF5_CHUNK_BYTES", "MMAP_HEADER_BYTES", "TAR_BLOCK", "LMDB_META_KEY", "shard_name",
    "wds_key", "lmdb_key", "JPEG_MAGIC", "is_jpeg", "ORDER_KINDS", "DEFAULT_ORDER", "order_permutation",
    # shards indexed in place (pack-dataset index; readers.formats.inplace)
    "INPLACE_KEY", "INPLACE_VERSION", "MEMBER_ARRAYS", "is_inplace",
    # safe I/O (readers.contract.safeio) and locations (readers.contract.location)
    "IncompleteDatasetError", "DatasetFormatError", "checksum", "file_checksum", "atomic_write", "publish",
    "fsync_dir", "fsync_files", "check_member_name", "member_path", "open_regular", "open_member", "open_data_file",
    "read_regular", "read_range", "parse_npy", "map_file", "map_npy", "is_remote", "REMOTE_SCHEMES",
    "parse_location", "UnsupportedLocationError",
]

# ---------------------------------------------------------------- index.json
#: The version written for a dataset of image + label (the default schema): every release reads it.
SPEC_VERSION = 1
#: Versions this release reads: 1 (image + label; ``"fields"`` optional) and 2 (any schema, see
#: docs/fields.md; written only when the schema is not the default one, so that a release reading
#: only version 1 refuses it instead of misreading it) and 3 (an index of shards in place, below).
READABLE_VERSIONS = (1, 2, 3)
FORMATS = ("wds", "lmdb", "hdf5", "mmap")
CHECKSUM_ALGO = "crc32"
#: readers.contract.checkcache kind of the index arrays' checksums (read_index) and of their values (checks).
CRC_CHECK, VALUES_CHECK = "index-crc32", "index-values"
#: index.json key: data file name -> CRC-32 of the whole file (beside ``files``: name -> bytes).
FILES_CRC_KEY = "files_crc32"
#: index.json key: array name -> {"crc32": CRC-32 of the whole .npy file, "bytes": its size}.
#: Optional: datasets packed before it existed open without it (same spec_version).
ARRAYS_KEY = "index_arrays"
#: Most samples a dataset may hold (labels and shard numbers are int32).
MAX_SAMPLES = 2**31 - 1
#: index.json is metadata (classes, shard list): never near this size.
MAX_INDEX_JSON_BYTES = 1 << 28

# ---------------------------------------------------------------- file names, each format's layout
#: Each sample's source path, one JSON string a line (:mod:`readers.contract.samplenames`).
NAMES_FILE = "names.jsonl"
#: A pack in progress (or interrupted) leaves this journal beside its data.
STATE_NAME = "pack-state.json"
#: Images that could not be packed, one JSON object per line (only when there are any).
REJECTS_NAME = "rejects.jsonl"
#: Images stored after a lossless repair (JPEG header junk removed), one JSON object per line.
REPAIRS_NAME = "repairs.jsonl"
#: The one data file of each single-file format (wds has shards, see shard_name).
DATA_FILE: Mapping[str, str] = {"lmdb": "data.mdb", "hdf5": "data.h5", "mmap": "images.npy"}
#: wds: the shard list in the ``wids`` library's JSON format (``wids.ShardListDataset(path)``).
WIDS_INDEX_NAME = "wids-index.json"
#: wds: tar block size (headers and padding).
TAR_BLOCK = 512
#: hdf5: byte offset of each chunk of /images inside data.h5 (<i8), beside it.
HDF5_CHUNK_TABLE = "h5chunks.npy"
#: hdf5: bytes per chunk of /images (1 MiB: whole-chunk writes, small table).
HDF5_CHUNK_BYTES = 1 << 20
#: mmap: images.npy's .npy header is padded to exactly this many bytes.
MMAP_HEADER_BYTES = 128
#: LMDB: reserved key holding a copy of index.json (keys of samples are digits, so ``__`` sorts after
#: every one of them and appends stay ordered).
LMDB_META_KEY = b"__meta__"
#: The JPEG SOI marker and a marker byte: how a stored image is known to be a JPEG.
JPEG_MAGIC = b"\xff\xd8\xff"

#: Sample order of a pack (index.json ``"order": {"kind": ..., "seed": ...}``): ``"source"`` =
#: sorted by class then path, exactly torchvision's ImageFolder order; ``"shuffled"`` = the
#: source order permuted by :func:`order_permutation` (sample k is source file ``perm[k]``,
#: rejects left out). names.jsonl, labels.npy and every index array follow the written order.
ORDER_KINDS = ("shuffled", "source")
#: The pack-time order each format gets by default: wds is read sequentially shard by shard, so
#: its samples are shuffled at pack time; the map-style readers shuffle globally when read.
DEFAULT_ORDER: Mapping[str, str] = {"wds": "shuffled", "lmdb": "source", "hdf5": "source", "mmap": "source"}


# Shards indexed in place (``pack-dataset index``; layout in readers.formats.inplace): a wds index whose
# INPLACE_KEY says where its shards live; written as INPLACE_VERSION so that older releases refuse it.
INPLACE_KEY, INPLACE_VERSION = "inplace", 3
#: (N, members) arrays of an in-place index: each non-image member's data offset, size and CRC-32.
MEMBER_ARRAYS: Mapping[str, np.dtype] = {"member_offsets.npy": np.dtype("<i8"), "member_sizes.npy": np.dtype("<i8"),
                                         "member_crcs.npy": np.dtype("<u4")}
is_inplace = lambda meta: isinstance(meta.get(INPLACE_KEY), dict)  # noqa: E731 (an index of shards in place)



def spec_version_for(meta: Mapping[str, Any]) -> int:
    """The ``spec_version`` an index with this metadata is written with: 1 when its ``"fields"``
    are absent or exactly the default schema (``image``, then ``label`` int32 named by the
    ``classes``), 2 for any other schema (see :data:`READABLE_VERSIONS`)."""
    if is_inplace(meta):
        return INPLACE_VERSION
    fields = meta.get("fields")
    if fields is None:
        return SPEC_VERSION
    default = [{"name": "image", "type": "image"},
               {"name": "label", "type": "int32", "classes": list(meta.get("classes") or [])}]
    return SPEC_VERSION if fields == default else 2



def is_jpeg(data: bytes | bytearray | memoryview | np.ndarray) -> bool:
    """True when ``data`` starts with the JPEG SOI marker and a marker byte (``FF D8 FF``)."""
    return bytes((data.data if isinstance(data, np.ndarray) else memoryview(data))[:3]) == JPEG_MAGIC


def order_permutation(n: int, seed: int) -> np.ndarray:
    """``"shuffled"`` order of ``n`` scanned files: the source position of the k-th written one."""
    return np.random.default_rng([int(seed), 0x5EED_0D4E]).permutation(n)



def shard_name(split: str, index: int) -> str:
    """wds: file name of shard ``index`` of ``split``."""
    return f"{split}-{index:06d}.tar"


def recorded_files(meta: Mapping[str, Any]) -> dict[str, tuple[int | None, int | None]]:
    """Data file name -> (bytes, CRC-32) as ``index.json`` records them: ``files`` and
    :data:`FILES_CRC_KEY`, and for wds each shard's entry (``bytes``, ``crc32``). A value an
    older index lacks is None. What a download, a cached copy or ``verify`` is checked against."""
    out: dict[str, tuple[int | None, int | None]] = {}
    crcs = meta.get(FILES_CRC_KEY) or {}
    for name, size in (meta.get("files") or {}).items():
        out[name] = (int(size), int(crcs[name]) if crcs.get(name) is not None else None)
    for name, crc in crcs.items():
        out.setdefault(name, (None, int(crc)))
    for shard in meta.get("shards") or []:
        size, crc = out.get(shard["name"], (None, None))
        out[shard["name"]] = (size if size is not None else int(shard["bytes"]),
                              crc if crc is not None else (int(shard["crc32"]) if shard.get("crc32") is not None
                                                           else None))
    return out


def wds_key(index: int) -> str:
    """WebDataset key of sample ``index``: digits only, so never a dot."""
    return f"{index:010d}"


def lmdb_key(index: int) -> bytes:
    """LMDB key of sample ``index``: fixed-width ASCII digits sort in index order."""
    return b"%010d" % index


@dataclass(frozen=True)
class Index:
    """A dataset's metadata plus its per-sample arrays (local: mapped read-only from the .npy files)."""

    root: Path | str  # a local folder, or the URL of a remote one (then ``store`` is set)
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    store: Any = None  # readers.remote.Store for a remote dataset, None for a local folder
    #: Local mapped arrays: name -> identity of the file mapped (readers.contract.safeio.file_identity).
    sources: Mapping[str, tuple[int, int, int, int]] | None = field(default=None, compare=False, repr=False)
    #: :func:`readers.contract.checkcache.meta_digest` of ``meta`` as read (a local index with array checksums;
    #: "" otherwise): computed once per open (1.5 MB of JSON for 10k shards), not by each check.
    digest: str = field(default="", compare=False, repr=False)

    def __reduce__(self) -> tuple:
        """Pickled (a spawned loader worker, DDP): a local index travels as its folder and metadata,
        and the receiving process maps the same files again -- no copy of the arrays in the pickle
        nor in the process's private memory. Remote and unmapped indexes travel whole."""
        if self.store is None and self.sources is not None:
            return _reopen_index, (str(self.root), self.meta, dict(self.sources))
        return Index, (self.root, self.meta, self.arrays, self.store, self.sources)

    @property
    def location(self) -> str:
        """The dataset's folder or URL, as shown in messages."""
        return str(self.root)

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
        """``labels.npy``; for a dataset whose schema has no ``label`` and that left it out, zeros
        (read-only, no memory: what ``len``, subsets and samplers count by)."""
        labels = self.arrays.get("labels")
        if labels is None:
            labels = np.broadcast_to(np.zeros(1, dtype=ARRAY_DTYPES["labels"]), (self.num_samples,))
        return labels

    def names(self, grown: bool = False) -> Generator[str, None, None]:
        """Source path of each sample, in sample order (read lazily).

        A line that is not a JSON string, and a line count other than ``num_samples``, is a
        one-line :class:`DatasetFormatError` naming ``names.jsonl:LINE`` (``verify`` reports it);
        ``grown``: more lines are an append's (``readers.contract.generations.appended_since``)."""
        n = self.num_samples
        if self.store is not None:
            yield from parse_names(self.store.url_of(NAMES_FILE), self.store.read(NAMES_FILE).splitlines(), n)
            return
        path = member_path(self.root, NAMES_FILE, "names file")
        with os.fdopen(open_regular(path, "names file"), "rb") as f:
            yield from parse_names(str(path), f, n, grown)


def _reopen_index(root: str, meta: dict[str, Any], sources: dict[str, tuple[int, int, int, int]]) -> Index:
    """Unpickle a local :class:`Index`: map the files the sending process mapped and checked. Files
    that are no longer those (another machine, a re-pack) are read and checked again; an index
    that changed meanwhile is refused rather than mixed with the sender's view of it."""
    n = meta["num_samples"]
    try:
        arrays = {name: map_npy(member_path(root, array_file(name, meta), "index array"), ARRAY_DTYPES[name], n,
                                what="index array", identity=ident)[0] for name, ident in sources.items()}
    except FileChanged:
        index = read_index(root)
        if index.meta != meta:
            raise DatasetFormatError(f"{root}: the dataset changed since this reader was made "
                                     "(re-packed?): open it again") from None
        return index
    return Index(root=Path(root), meta=meta, arrays=arrays, sources=sources)



def find_splits(root: str | os.PathLike) -> list[str]:
    """Names of the split sub-folders of ``root`` that hold a finished dataset."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / INDEX_NAME).is_file())


def listed_splits(names: Iterable[str]) -> list[str]:
    """:func:`find_splits` of an object-store prefix, from its listing ``names`` (relative keys)."""
    return sorted({n.split("/")[0] for n in names if n.count("/") == 1 and n.endswith("/" + INDEX_NAME)})


def read_meta(root: str | os.PathLike | Any) -> dict[str, Any]:
    """``index.json`` of the dataset at ``root`` (a local folder or a :class:`readers.remote.Store`),
    parsed and checked as :func:`read_index` checks it, without reading any index array: what
    ``pack-dataset info`` needs (O(1) in the number of samples). Same errors as :func:`read_index`."""
    if not isinstance(root, (str, os.PathLike)) and is_remote(root):
        try:
            raw = root.read(INDEX_NAME)
        except FileNotFoundError:
            raise _missing_remote_index(root) from None
        return _parse_meta(raw, root.url_of(INDEX_NAME))
    return _local_meta(root)[1]


def read_index(root: str | os.PathLike | Any) -> Index:
    """Read and check ``root/index.json`` and its arrays; clear errors otherwise.

    ``root`` is a local folder or a :class:`readers.remote.Store` (this module
    imports nothing of ``readers``: for a URL, ``readers.remote.read_index(url,
    storage_options=...)`` opens the store and calls this).

    Only regular files inside ``root`` are read, never blocking (a FIFO or a
    device in their place is an error), and each array's checksum is compared
    with the one ``index.json`` records (datasets packed before array checksums
    existed have none and still open). What the values mean is checked by
    :func:`readers.contract.checks.check_index`, which every reader runs.
    """
    if not isinstance(root, (str, os.PathLike)) and is_remote(root):
        return _read_index_store(root)
    root, meta = _local_meta(root)
    n, recorded = meta["num_samples"], _recorded(meta, root / INDEX_NAME)
    optional = () if has_label(meta) or not (root / array_file("labels", meta)).exists() else ("labels",)
    names = required_arrays(meta) + optional
    # Checksums that passed on this machine for these very files are not computed again (readers.contract.checkcache).
    digest = checkcache.meta_digest(meta) if recorded else ""
    files = {name: array_file(name, meta) for name in names}
    key = checkcache.files_key(root, digest, files) if recorded else None
    loaded = None
    if recorded and key is not None and checkcache.passed(CRC_CHECK, key):
        idents = {name: tuple(ident) for name, ident in key[2]}
        try:
            loaded = {name: load_array(root, name, n, recorded.get(name), idents[name], meta) for name in names}
        except FileChanged:
            loaded = None
        if loaded is not None and checkcache.files_key(root, digest, files) != key:
            loaded = None  # written to while being mapped: check in full
    if loaded is None:
        loaded = {name: load_array(root, name, n, recorded and recorded.get(name), meta=meta) for name in names}
        if key is not None and checkcache.files_key(root, digest, files) == key:
            checkcache.record(CRC_CHECK, key)
    return Index(root=root, meta=meta, arrays={k: v[0] for k, v in loaded.items()},
                 sources={k: v[1] for k, v in loaded.items()}, digest=digest)


def _local_meta(root: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(folder, parsed index.json) of a local dataset; the errors :func:`read_index` documents."""
    root = parse_location(root)  # file:// -> its path; gs:// and other schemes: UnsupportedLocationError
    if isinstance(root, str):
        raise ValueError(f"{root} is a URL: open it with readers.open_dataset(url, storage_options=...) "
                         "or readers.remote.read_index(url, storage_options=...)")
    path = root / INDEX_NAME
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such dataset folder")
    if not os.path.lexists(path):
        splits = find_splits(root)
        if splits:
            raise DatasetFormatError(f"{root} holds several splits ({', '.join(splits)}); open one of them, "
                                     f"e.g. {root / splits[0]}")
        holder = pack_in_progress(root)
        if holder is not None:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder[1]))
            raise IncompleteDatasetError(
                f"{root}: being packed by pid {holder[0]} (started {started}): wait for it to finish, "
                "then open it")
        if (root / STATE_NAME).exists():
            raise IncompleteDatasetError(
                f"{root}: this pack never finished (no {INDEX_NAME}, a {STATE_NAME} journal is "
                "present). Re-run the same pack-dataset command with --resume to complete it.")
        if (root / REJECTS_NAME).exists():
            raise DatasetFormatError(
                f"{root}: not a packed dataset: no image could be packed (every one was rejected; "
                f"see {root / REJECTS_NAME})")
        raise DatasetFormatError(f"{root}: not a packed dataset (no {INDEX_NAME})")
    buf = read_regular(member_path(root, INDEX_NAME, "index"), "index", limit=MAX_INDEX_JSON_BYTES)
    return root, _parse_meta(buf, path)


def _recorded(meta: dict[str, Any], path: Path | str) -> dict[str, Any] | None:
    """index.json's array checksums (None for a dataset packed before they were recorded)."""
    recorded = meta.get(ARRAYS_KEY)
    if recorded is not None and not (isinstance(recorded, dict)
                                     and all(a in recorded for a in required_arrays(meta))):
        raise DatasetFormatError(f"{path}: {ARRAYS_KEY!r} must list a checksum for each of "
                                 f"{', '.join(required_arrays(meta))}")
    return recorded


def _parse_meta(raw: bytes | bytearray, path: Path | str) -> dict[str, Any]:
    """index.json's bytes -> metadata, with the fields every reader needs before anything else checked."""
    try:
        meta = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DatasetFormatError(f"{path}: unreadable index ({exc})") from exc
    if not isinstance(meta, dict):
        raise DatasetFormatError(f"{path}: unreadable index (a JSON {type(meta).__name__}, not an object)")
    version = meta.get("spec_version")
    readable = READABLE_VERSIONS if is_inplace(meta) else tuple(v for v in READABLE_VERSIONS if v != INPLACE_VERSION)
    if type(version) is not int or version not in readable:
        raise DatasetFormatError(f"{path}: spec_version {version!r}, this dataset-packer reads version "
                                 f"{' or '.join(map(str, readable))}")
    fmt = meta.get("format")
    if not isinstance(fmt, str) or fmt not in REQUIRED_ARRAYS:
        raise DatasetFormatError(f"{path}: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    n = meta.get("num_samples")
    if type(n) is not int or not 0 <= n <= MAX_SAMPLES:
        raise DatasetFormatError(f"{path}: num_samples must be a whole number in 0..{MAX_SAMPLES}, got {n!r}")
    return meta


def _read_index_store(store: Any) -> Index:
    """``read_index`` for a dataset in an object store or behind a web server (a ``Store``).

    index.json first, then the arrays in parallel (one GET each): a
    1.28M-sample wds index is ~34 MB in six objects.
    """
    try:
        raw = store.read(INDEX_NAME)
    except FileNotFoundError:
        raise _missing_remote_index(store) from None
    path = store.url_of(INDEX_NAME)
    meta = _parse_meta(raw, path)
    n, recorded = meta["num_samples"], _recorded(meta, path)
    names = required_arrays(meta)

    def load(name: str) -> np.ndarray:
        try:
            data = store.read(array_file(name, meta), max_bytes=array_bytes_limit(name, n))
        except FileNotFoundError:
            raise DatasetFormatError(f"{store.url}: index array {array_file(name, meta)} is missing") from None
        return array_from_bytes(store.url_of(array_file(name, meta)), name, bytearray(data), n,
                                 recorded and recorded[name])

    with cf.ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="index-read") as pool:
        arrays = dict(zip(names, pool.map(load, names)))
    return Index(root=store.url, meta=meta, arrays=arrays, store=store)


def _missing_remote_index(store: Any) -> Exception:
    """The error for a remote location without index.json: splits, an unfinished upload, or nothing."""
    try:
        names = store.list()
    except OSError:  # a web server without directory listings: say what is known
        names = []
    splits = listed_splits(names)
    if splits:
        return DatasetFormatError(f"{store.url} holds several splits ({', '.join(splits)}); open one of them, "
                                  f"e.g. {store.url_of(splits[0])}")
    if names:
        return IncompleteDatasetError(
            f"{store.url}: this upload never finished (no {INDEX_NAME}; {INDEX_NAME} is uploaded last). "
            "If the pack was interrupted, re-run the same pack-dataset command with --resume.")
    return FileNotFoundError(f"{store.url_of(INDEX_NAME)}: no such dataset (no {INDEX_NAME} there)")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to ``path`` whole or not at all (:func:`readers.contract.safeio.atomic_write`)."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")



def write_index(root: str | os.PathLike, meta: dict[str, Any], arrays: Mapping[str, Any],
                written: Iterable[str | os.PathLike] = ()) -> None:
    """Write the per-sample arrays, then ``index.json`` last, as the commit marker.

    ``index.json`` records each array file's CRC-32 and size (under :data:`ARRAYS_KEY`), so a damaged
    or edited array is refused on open. The arrays and ``written`` (the caller's files, written with
    ``atomic_write(durable=False)``) are fsynced together (``fsync_files``) before ``index.json``.
    """
    root = Path(root)
    fmt = meta["format"]
    missing = set(required_arrays(meta)) - set(arrays)
    if missing:
        raise ValueError(f"format {fmt!r} needs index arrays {sorted(missing)}")
    recorded = {name: write_array(root, name, values, meta, durable=False)[1] for name, values in arrays.items()}
    fsync_files([*(root / array_file(name, meta) for name in arrays), *written])
    meta = dict(meta, spec_version=spec_version_for(meta), checksum=CHECKSUM_ALGO)
    meta[ARRAYS_KEY] = {name: recorded[name] for name in arrays if name in REQUIRED_ARRAYS[fmt]}
    write_json_atomic(root / INDEX_NAME, meta)
