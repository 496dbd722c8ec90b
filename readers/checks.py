"""What an index's values may be: checked when a dataset is opened, before any data file is read.

:func:`readers.spec.read_index` checks that ``index.json`` and the ``.npy``
arrays are intact (regular files inside the folder, checksums, dtypes,
lengths). :func:`check_index` checks what they *say*, so that no reader
(and not ``verify``) ever computes a read from a value it has not bounded:

* ``index.json``: the fields every reader uses have the right types
  (``classes`` a list of names, ``storage`` an object, ``files`` a map of
  file name to size, the ``wds`` shard list with counts that add up);
  every file name it holds passes :func:`readers.spec.check_member_name`.
* arrays: labels within the class list; shard numbers within the shard
  list; sizes, offsets, heights and widths non-negative; each sample's
  bytes inside its file as ``index.json`` records the file's size (tar
  shards: after its 512-byte header; mmap: ``offset + height*width*3``).

Both checks are O(N): a local dataset whose files pass them is recorded once per machine
(:mod:`readers.checkcache`) and later opens of the same, unchanged files skip them.

Every failure is a :class:`readers.spec.DatasetFormatError` naming the file
(``index.json`` or the array) and, for arrays, the first bad sample.
Memory stays flat at ImageNet size: arrays are checked in slices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from readers import checkcache, spec

__all__ = ["check_index", "data_files"]

_SLICE = 1 << 18  # samples per vectorized step (bounded temporaries for 1.28M-sample indexes)
_BYTES_LIMIT = 1 << 63  # byte counts and sample counts are compared with int64 arrays


def _fail(path: Path | str, why: str) -> spec.DatasetFormatError:
    return spec.DatasetFormatError(f"{path}: {why}")


def _where(index: spec.Index, name: str) -> Path | str:
    """The dataset's file ``name`` as messages show it (a path, or a URL for a remote dataset)."""
    if index.store is not None:
        return index.store.url_of(name)
    return Path(index.root) / name


def _whole(value: Any) -> bool:
    return type(value) is int


def _field(meta: dict, key: str, kind: type | tuple, path: Path, default: Any = ...) -> Any:
    if key not in meta:
        if default is ...:
            raise _fail(path, f"field {key!r} is missing")
        return default
    value = meta[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _fail(path, f"field {key!r} is a {type(value).__name__}, expected {getattr(kind, '__name__', kind)}")
    return value


def data_files(index: spec.Index) -> dict[str, int | None]:
    """Data file name -> its size as index.json records it (None where it records none)."""
    meta, files = index.meta, index.meta.get("files") or {}
    if index.format == "wds":
        return {s["name"]: s["bytes"] for s in meta["shards"]}
    names = {spec.DATA_FILE[index.format]: files.get(spec.DATA_FILE[index.format])}
    table = meta.get("storage", {}).get("chunk_table")
    if table:
        names[table] = files.get(table)
    return names


def check_index(index: spec.Index) -> None:
    """Raise DatasetFormatError (naming the file) unless every value a reader uses is in range."""
    key = _checked_key(index)
    if key is not None and checkcache.passed(spec.VALUES_CHECK, key):
        return  # this very index.json and these very files passed on this machine before (readers.checkcache)
    meta, path = index.meta, _where(index, spec.INDEX_NAME)
    classes = _field(meta, "classes", list, path)
    if not all(isinstance(c, str) for c in classes):
        raise _fail(path, "field 'classes' must list class names (strings)")
    storage = _field(meta, "storage", dict, path)
    files = _field(meta, "files", dict, path, {})
    for name, size in files.items():
        spec.check_member_name(name, f"{path}: file")
        if not _whole(size) or not 0 <= size < _BYTES_LIMIT:
            raise _fail(path, f"files[{name!r}] must be a byte count, got {size!r}")
    crcs = _field(meta, spec.FILES_CRC_KEY, dict, path, {})
    for name, crc in crcs.items():
        spec.check_member_name(name, f"{path}: file")
        if not _whole(crc):
            raise _fail(path, f"{spec.FILES_CRC_KEY}[{name!r}] must be a CRC-32, got {crc!r}")
    fmt = index.format
    if fmt == "wds":
        _check_shard_list(index, path)
    elif fmt == "hdf5":
        _check_hdf5_storage(storage, path)
    elif fmt == "mmap":
        _check_mmap_storage(storage, path)
    _check_arrays(index, len(classes))
    _check_class_counts(index, len(classes), path)
    if key is not None and _checked_key(index) == key:
        checkcache.record(spec.VALUES_CHECK, key)


def _checked_key(index: spec.Index) -> list | None:
    """The record of :mod:`readers.checkcache` for the values of a local index's arrays, when each
    array is the file it was mapped from (None otherwise: a remote index, one built in memory)."""
    sources = index.sources
    if index.store is not None or not sources or set(sources) != set(index.arrays):
        return None
    key = spec.checked_files_key(Path(index.root), index.meta, index.arrays)
    if key is None or any(tuple(ident[:4]) != tuple(sources[name]) for name, ident in key[2]):
        return None
    return key


def _check_class_counts(index: spec.Index, num_classes: int, path: Path) -> None:
    """index.json's class_counts (when recorded) must be what labels.npy counts: a label changed
    without its checksum being kept in step (or in a dataset packed before checksums) shows here."""
    counts = index.meta.get("class_counts")
    if counts is None or "labels" not in index.arrays:
        return
    if not (isinstance(counts, list) and len(counts) == num_classes and all(_whole(c) for c in counts)):
        raise _fail(path, f"class_counts must list one count per class ({num_classes})")
    labels, actual = index.arrays["labels"], np.zeros(num_classes, dtype=np.int64)
    for lo in range(0, len(labels), _SLICE):  # bincount of all labels at once: an int64 copy (800 MB at 100M)
        actual += np.bincount(labels[lo:lo + _SLICE], minlength=num_classes)
    if actual.tolist() != counts:
        cls = int(np.flatnonzero(actual != np.array(counts))[0])
        raise spec.DatasetFormatError(
            f"{_where(index, spec.array_file('labels'))}: holds {actual[cls]} samples of class {cls}, "
            f"{spec.INDEX_NAME} counts {counts[cls]}: the labels were changed")


def _check_shard_list(index: spec.Index, path: Path) -> None:
    shards = _field(index.meta, "shards", list, path)
    first = 0
    for k, s in enumerate(shards):
        where = f"shards[{k}]"
        if not isinstance(s, dict):
            raise _fail(path, f"{where} is a {type(s).__name__}, expected an object")
        spec.check_member_name(s.get("name"), f"{path}: {where}: shard")
        for key in ("samples", "first", "bytes"):
            if not _whole(s.get(key)) or not 0 <= s[key] < _BYTES_LIMIT:
                raise _fail(path, f"{where}.{key} must be a whole number in 0..2**63-1, got {s.get(key)!r}")
        if not _whole(s.get("crc32")):
            raise _fail(path, f"{where}.crc32 must be a whole number, got {s.get('crc32')!r}")
        if s["first"] != first:
            raise _fail(path, f"{where}.first is {s['first']}, but the shards before it hold {first} samples")
        first += s["samples"]
    if first != index.num_samples:
        raise _fail(path, f"the shards hold {first} samples, num_samples says {index.num_samples}")
    names = [s["name"] for s in shards]
    if len(set(names)) != len(names):
        raise _fail(path, "the shard list names a file twice")


def _check_hdf5_storage(storage: dict, path: Path) -> None:
    table = storage.get("chunk_table")
    if table is not None:
        spec.check_member_name(table, f"{path}: storage.chunk_table")
        cb = storage.get("chunk_bytes")
        if not _whole(cb) or not 1 <= cb <= 1 << 30:
            raise _fail(path, f"storage.chunk_bytes must be in 1..{1 << 30} with a chunk table, got {cb!r}")


def _check_mmap_storage(storage: dict, path: Path) -> None:
    offset = storage.get("data_offset", spec.MMAP_HEADER_BYTES)
    if offset != spec.MMAP_HEADER_BYTES:
        raise _fail(path, f"storage.data_offset must be {spec.MMAP_HEADER_BYTES}, got {offset!r}")
    shape = storage.get("fixed_shape")
    if shape is not None and not (isinstance(shape, list) and len(shape) == 3 and all(
            _whole(x) and x >= 1 for x in shape) and shape[2] == 3):
        raise _fail(path, f"storage.fixed_shape must be [height, width, 3] or null, got {shape!r}")


def _first_bad(name: str, index: spec.Index, bad: Callable[[slice], np.ndarray], n: int,
               why: Callable[[int], str]) -> None:
    """Scan samples in slices; raise naming array ``name`` and the first sample where ``bad`` holds."""
    for lo in range(0, n, _SLICE):
        sl = slice(lo, min(n, lo + _SLICE))
        hits = np.flatnonzero(bad(sl))
        if len(hits):
            i = lo + int(hits[0])
            raise spec.DatasetFormatError(f"{_where(index, spec.array_file(name))}: sample {i}: {why(i)}")


def _check_arrays(index: spec.Index, num_classes: int) -> None:
    a, root, n, fmt = index.arrays, index, index.num_samples, index.format
    labels = a.get("labels")
    if labels is not None and spec.has_label(index.meta):  # a schema without a label: labels.npy means nothing
        _first_bad("labels", root, lambda s: (labels[s] < 0) | (labels[s] >= num_classes), n,
                   lambda i: f"label {labels[i]} is outside the {num_classes} classes {spec.INDEX_NAME} lists")
    sizes = a["sizes"]
    _first_bad("sizes", root, lambda s: sizes[s] < 0, n, lambda i: f"size {sizes[i]} is negative")
    for name in ("offsets", "heights", "widths"):
        if name in a:
            arr, low = a[name], 1 if name in ("heights", "widths") else 0
            _first_bad(name, root, lambda s, arr=arr, low=low: arr[s] < low, n,
                       lambda i, arr=arr, low=low: f"value {arr[i]} is below {low}")
    if fmt == "wds":
        _check_wds_arrays(index)
    elif fmt == "mmap":
        heights, widths = a["heights"], a["widths"]
        _check_extents(index, "offsets", lambda s: heights[s].astype(np.int64) * widths[s] * 3)
    elif fmt == "hdf5":
        _check_extents(index, "sizes", lambda s: sizes[s])
    else:
        limit = data_files(index).get(spec.DATA_FILE[fmt])
        if limit is not None:
            _first_bad("sizes", root, lambda s: sizes[s] > limit, n,
                       lambda i: f"size {sizes[i]} is larger than the data file ({limit} bytes)")


def _check_wds_arrays(index: spec.Index) -> None:
    a, root, n = index.arrays, index, index.num_samples
    shards, offsets, sizes = a["shards"], a["offsets"], a["sizes"]
    count = len(index.meta["shards"])
    _first_bad("shards", root, lambda s: (shards[s] < 0) | (shards[s] >= count), n,
               lambda i: f"shard {shards[i]} is outside the {count} shards {spec.INDEX_NAME} lists")
    limit = np.array([s["bytes"] for s in index.meta["shards"]], dtype=np.int64)
    block = spec.TAR_BLOCK

    def room(s: slice) -> np.ndarray:  # bytes from each sample's offset to the end of its shard
        return limit[shards[s]] - offsets[s]

    _first_bad("offsets", root, lambda s: (offsets[s] < block) | (room(s) < 0), n,
               lambda i: f"offset {offsets[i]} is not inside shard {shards[i]} after a tar header")
    _first_bad("sizes", root, lambda s: sizes[s] > room(s), n,
               lambda i: f"size {sizes[i]} at offset {offsets[i]} runs past the end of shard {shards[i]} "
                         f"({limit[shards[i]]} bytes)")


def _check_extents(index: spec.Index, blame: str, lengths: Callable[[slice], np.ndarray]) -> None:
    """offsets[i] + lengths(i) within the data (mmap: the pixels after the header; hdf5: the file);
    ``blame``: the array the message names."""
    offsets, root, n = index.arrays["offsets"], index, index.num_samples
    size = data_files(index).get(spec.DATA_FILE[index.format])
    if size is None:
        return  # nothing recorded: the reader checks against the file itself
    limit = size - spec.MMAP_HEADER_BYTES if index.format == "mmap" else size
    _first_bad("offsets", root, lambda s: offsets[s] > limit, n,
               lambda i: f"offset {offsets[i]} lies past the end of the data ({limit} bytes)")
    _first_bad(blame, root, lambda s: lengths(s) > limit - offsets[s], n,
               lambda i: f"sample at offset {offsets[i]} with {int(lengths(slice(i, i + 1))[0])} bytes ends "
                         f"past the end of the data ({limit} bytes)")
