"""What an index's values may be: checked when a dataset is opened, before any data file is read.

:func:`readers.contract.spec.read_index` checks that ``index.json`` and the ``.npy``
arrays are intact (regular files inside the folder, checksums, dtypes,
lengths). :func:`check_index` checks what they *say*, so that no reader
(and not ``verify``) ever computes a read from a value it has not bounded:

* ``index.json``: the fields every reader uses have the right types
  (``classes`` a list of names, ``storage`` an object, ``files`` a map of
  file name to size, the ``wds`` shard list with counts that add up);
  every file name it holds passes :func:`readers.contract.spec.check_member_name`.
* arrays: labels within the class list; shard numbers within the shard
  list; sizes, offsets, heights and widths non-negative; each sample's
  bytes inside its file as ``index.json`` records the file's size (tar
  shards: after its 512-byte header; mmap: ``offset + height*width*3``).

Both checks are O(N): a local dataset whose files pass them is recorded once per machine
(:mod:`readers.contract.checkcache`) and later opens of the same, unchanged files skip them.

Every failure is a :class:`readers.contract.spec.DatasetFormatError` naming the file
(``index.json`` or the array) and, for arrays, the first bad sample.
Memory stays flat at ImageNet size: arrays are checked in slices, one pass for every rule,
on :func:`readers.contract.env.check_threads` threads.
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path
from typing import Any, Callable, TypeGuard

import numpy as np

from readers.contract import checkcache
from readers.contract import spec
from readers.contract.env import check_threads

__all__ = ["check_index", "data_files"]

_SLICE = 1 << 18  # samples per vectorized step (bounded temporaries for 1.28M-sample indexes)
_BYTES_LIMIT = 1 << 63  # byte counts and sample counts are compared with int64 arrays
_NONE = np.zeros(0, dtype=bool)  # a rule's mask for a slice where a reduction showed no bad sample


def _fail(path: Path | str, why: str) -> spec.DatasetFormatError:
    return spec.DatasetFormatError(f"{path}: {why}")


def _where(index: spec.Index, name: str) -> Path | str:
    """The dataset's file ``name`` as messages show it (a path, or a URL for a remote dataset)."""
    if index.store is not None:
        return index.store.url_of(name)
    return Path(index.root) / name


def _whole(value: Any) -> TypeGuard[int]:
    return type(value) is int


def _field(meta: dict, key: str, kind: type | tuple, path: Path | str, default: Any = ...) -> Any:
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
    digest = index.digest or (checkcache.meta_digest(index.meta) if index.store is None and index.sources else "")
    key = _checked_key(index, digest)
    meta, path = index.meta, _where(index, spec.INDEX_NAME)
    if key is not None and checkcache.passed(spec.VALUES_CHECK, key):
        # This very index.json and these very files passed on this machine before (readers.contract.checkcache).
        # The labels are range-checked still: a write through a mapping held open while the record was
        # written changes no stat field, and a label is the one value served as it is, unchecked on read.
        _scan(index, _label_rules(index, len(meta["classes"])), index.num_samples)
        return
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
    _check_arrays(index, len(classes), path)
    if key is not None and _checked_key(index, digest) == key:
        checkcache.record(spec.VALUES_CHECK, key)


def _checked_key(index: spec.Index, digest: str) -> list | None:
    """The record of :mod:`readers.contract.checkcache` for the values of a local index's arrays, when each
    array is the file it was mapped from (None otherwise: a remote index, one built in memory);
    ``digest``: :func:`readers.contract.checkcache.meta_digest` of its metadata."""
    sources = index.sources
    if index.store is not None or not sources or set(sources) != set(index.arrays):
        return None
    files = {name: spec.array_file(name, index.meta) for name in index.arrays}
    key = checkcache.files_key(index.root, digest, files)
    if key is None or any(tuple(ident[:4]) != tuple(sources[name]) for name, ident in key[2]):
        return None
    return key


def _check_shard_list(index: spec.Index, path: Path | str) -> None:
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


def _check_hdf5_storage(storage: dict, path: Path | str) -> None:
    table = storage.get("chunk_table")
    if table is not None:
        spec.check_member_name(table, f"{path}: storage.chunk_table")
        cb = storage.get("chunk_bytes")
        if not _whole(cb) or not 1 <= cb <= 1 << 30:
            raise _fail(path, f"storage.chunk_bytes must be in 1..{1 << 30} with a chunk table, got {cb!r}")


def _check_mmap_storage(storage: dict, path: Path | str) -> None:
    offset = storage.get("data_offset", spec.MMAP_HEADER_BYTES)
    if offset != spec.MMAP_HEADER_BYTES:
        raise _fail(path, f"storage.data_offset must be {spec.MMAP_HEADER_BYTES}, got {offset!r}")
    shape = storage.get("fixed_shape")
    if shape is not None and not (isinstance(shape, list) and len(shape) == 3 and all(
            _whole(x) and x >= 1 for x in shape) and shape[2] == 3):
        raise _fail(path, f"storage.fixed_shape must be [height, width, 3] or null, got {shape!r}")


#: A rule of :func:`_scan`: (the array a message names, the mask of a slice's bad samples -- given the
#: slice and a dict shared by the rules of that slice --, the message for bad sample ``i``).
Rule = tuple[str, Callable[[slice, dict], np.ndarray], Callable[[int], str]]


def _scan(index: spec.Index, rules: list[Rule], n: int,
          tally: Callable[[slice], np.ndarray] | None = None) -> np.ndarray | None:
    """Check ``rules`` over samples ``0..n-1`` in slices of :data:`_SLICE`, in one pass: a slice's
    values are read from memory once for all of its rules (and ``tally``, summed over the slices
    that pass). Contiguous runs of slices go to :func:`readers.contract.env.check_threads` threads (numpy's
    comparisons and gathers release the GIL), each stopping at its first bad slice. Raises naming
    the array of the first rule that fails in the first bad slice, and its first bad sample there;
    a rule runs on a slice only after the ones before it passed there (a later rule may gather by
    the values an earlier one bounds)."""
    bounds = list(range(0, n, _SLICE)) + [n]
    runs = min(check_threads(), len(bounds) - 1)

    def run(k: int) -> tuple[tuple[int, int] | None, np.ndarray | None]:
        total = None
        for j in range(k * (len(bounds) - 1) // runs, (k + 1) * (len(bounds) - 1) // runs):
            sl = slice(bounds[j], bounds[j + 1])
            memo: dict[Any, Any] = {}  # shared by the rules of this slice
            for r, (_, bad, _) in enumerate(rules):
                hits = np.flatnonzero(bad(sl, memo))
                if len(hits):
                    return (r, sl.start + int(hits[0])), total
            if tally is not None:
                counted = tally(sl)
                total = counted if total is None else total + counted
        return None, total

    if runs <= 1:
        results = [run(0)] if n else []
    else:
        with cf.ThreadPoolExecutor(max_workers=runs, thread_name_prefix="index-check") as pool:
            results = list(pool.map(run, range(runs)))
    total = None
    for failed, counted in results:
        if failed is not None:
            r, i = failed
            name, _, why = rules[r]
            raise spec.DatasetFormatError(f"{_where(index, spec.array_file(name, index.meta))}: sample {i}: {why(i)}")
        if counted is not None:
            total = counted if total is None else total + counted
    return total


def _below(values: np.ndarray, low: int) -> np.ndarray:
    """The mask of ``values`` under ``low``; :data:`_NONE` when their minimum shows there is none (a
    reduction reads the slice once and makes no temporary: most slices of a sound index end here)."""
    return values < low if values.min() < low else _NONE


def _above(values: np.ndarray, high: int) -> np.ndarray:
    """The mask of ``values`` over ``high``; :data:`_NONE` when their maximum shows there is none."""
    return values > high if values.max() > high else _NONE


def _at_least(name: str, arr: np.ndarray, low: int) -> Rule:
    """The rule: every value of index array ``name`` is at least ``low``."""
    return name, lambda s, m: _below(arr[s], low), lambda i: f"value {arr[i]} is below {low}"


def _check_arrays(index: spec.Index, num_classes: int, path: Path | str) -> None:
    """Every array's values in range (one :func:`_scan`), and labels.npy counted per class against
    index.json's class_counts when it records them (a label edited along with its checksum shows here)."""
    a, n, fmt = index.arrays, index.num_samples, index.format
    labels = a.get("labels")
    rules = _label_rules(index, num_classes)
    ranged = bool(rules)
    sizes = a["sizes"]
    rules.append(("sizes", lambda s, m: _below(sizes[s], 0), lambda i: f"size {sizes[i]} is negative"))
    for name in ("offsets", "heights", "widths"):
        if name in a and not (fmt == "wds" and name == "offsets"):  # wds: at least a tar header, below
            rules.append(_at_least(name, a[name], 1 if name in ("heights", "widths") else 0))
    if fmt == "wds":
        rules += _wds_rules(index)
    elif fmt == "mmap":
        heights, widths = a["heights"], a["widths"]
        rules += _extent_rules(index, "offsets", lambda s: heights[s].astype(np.int64) * widths[s] * 3,
                               lambda s: int(heights[s].max()) * int(widths[s].max()) * 3)
    elif fmt == "hdf5":
        rules += _extent_rules(index, "sizes", lambda s: sizes[s], lambda s: int(sizes[s].max()))
    else:
        limit = data_files(index).get(spec.DATA_FILE[fmt])
        if limit is not None:
            rules.append(("sizes", lambda s, m: sizes[s] > limit,
                          lambda i: f"size {sizes[i]} is larger than the data file ({limit} bytes)"))
    counts = index.meta.get("class_counts") if labels is not None else None
    if counts is not None and not (
            isinstance(counts, list) and len(counts) == num_classes and all(_whole(c) for c in counts)):
        raise _fail(path, f"class_counts must list one count per class ({num_classes})")

    def tally(s: slice) -> np.ndarray:  # a slice at a time: a bincount of all labels is an int64 copy of them
        got = a["labels"]  # counts is None when there are no labels
        got = got[s]
        if not ranged:  # not range-checked: a value outside the classes is counted apart, never indexed
            got = np.where((got < 0) | (got >= num_classes), num_classes, got)
        return np.bincount(got, minlength=num_classes + 1)

    counted = _scan(index, rules, n, tally if counts is not None else None)
    if counts is None:
        return
    actual: list[int] = [0] * (num_classes + 1) if counted is None else counted.tolist()
    where = _where(index, spec.array_file("labels", index.meta))
    if actual[num_classes]:
        raise spec.DatasetFormatError(f"{where}: holds {actual[num_classes]} labels outside the {num_classes} "
                                      f"classes {spec.INDEX_NAME} lists: the labels were changed")
    for cls, (got, recorded) in enumerate(zip(actual, counts)):
        if got != recorded:
            raise spec.DatasetFormatError(f"{where}: holds {got} samples of class {cls}, {spec.INDEX_NAME} "
                                          f"counts {recorded}: the labels were changed")


def _label_rules(index: spec.Index, num_classes: int) -> list[Rule]:
    """Each label is one of the ``num_classes`` classes (no rule without a label field: labels.npy means nothing then)."""
    labels = index.arrays.get("labels")
    if labels is None or not spec.has_label(index.meta):
        return []
    return [("labels", lambda s, m: _above(labels[s].view(np.uint32), num_classes - 1),  # also < 0, as uint32
             lambda i: f"label {labels[i]} is outside the {num_classes} classes {spec.INDEX_NAME} lists")]


def _wds_rules(index: spec.Index) -> list[Rule]:
    """Each sample in the shard index.json's shard list puts it in (its ``first`` .. ``first +
    samples``: what :meth:`ShardDataset.samples_of_shard` reads), after a tar header, and its bytes
    inside that shard. A slice's samples lie in a few runs of one shard each: per run a min and a
    max (``reduceat``) decide, and only a slice holding a bad sample is compared sample by sample."""
    a = index.arrays
    shards, offsets, sizes = a["shards"], a["offsets"], a["sizes"]
    listed = index.meta["shards"]
    count, block = len(listed), spec.TAR_BLOCK
    limit = np.array([s["bytes"] for s in listed], dtype=np.int64)
    held = np.flatnonzero(np.array([s["samples"] for s in listed], dtype=np.int64) > 0)  # shards with samples
    firsts = np.array([listed[k]["first"] for k in held], dtype=np.int64)  # ascending (_check_shard_list)

    def runs(s: slice, memo: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the shards holding the slice's samples, where each one's run starts in the slice, its length)."""
        if "runs" not in memo:
            lo = int(np.searchsorted(firsts, s.start, "right")) - 1
            hi = int(np.searchsorted(firsts, s.stop - 1, "right"))
            at = np.maximum(firsts[lo:hi] - s.start, 0)
            memo["runs"] = held[lo:hi], at, np.diff(np.append(at, s.stop - s.start))
        return memo["runs"]

    def owner(i: int) -> int:
        return int(held[np.searchsorted(firsts, i, "right") - 1])

    def wrong_shard(s: slice, memo: dict) -> np.ndarray:
        ks, at, lens = runs(s, memo)
        got = shards[s]
        if (np.minimum.reduceat(got, at) == ks).all() and (np.maximum.reduceat(got, at) == ks).all():
            return _NONE
        return got != np.repeat(ks, lens)

    def outside(s: slice, memo: dict) -> np.ndarray:
        ks, at, lens = runs(s, memo)
        off = offsets[s]
        if off.min() >= block and (np.maximum.reduceat(off, at) <= limit[ks]).all():
            return _NONE
        return (off < block) | (off > np.repeat(limit[ks], lens))

    def past_end(s: slice, memo: dict) -> np.ndarray:
        ks, at, lens = runs(s, memo)
        # offsets and sizes passed their rules (>= block, >= 0): as uint64 their sum cannot wrap
        end = offsets[s].view(np.uint64) + sizes[s].view(np.uint64)
        if (np.maximum.reduceat(end, at) <= limit[ks].view(np.uint64)).all():
            return _NONE
        return end > np.repeat(limit[ks].view(np.uint64), lens)

    def shard_why(i: int) -> str:
        if not 0 <= shards[i] < count:
            return f"shard {shards[i]} is outside the {count} shards {spec.INDEX_NAME} lists"
        return f"shard {shards[i]}, but the shard list in {spec.INDEX_NAME} puts it in shard {owner(i)}"

    return [
        ("shards", wrong_shard, shard_why),
        ("offsets", outside, lambda i: f"offset {offsets[i]} is not inside shard {shards[i]} after a tar header"),
        ("sizes", past_end, lambda i: f"size {sizes[i]} at offset {offsets[i]} runs past the end of shard "
                                      f"{shards[i]} ({limit[shards[i]]} bytes)"),
    ]


def _extent_rules(index: spec.Index, blame: str, lengths: Callable[[slice], np.ndarray],
                  longest: Callable[[slice], int]) -> list[Rule]:
    """offsets[i] + lengths(i) within the data (mmap: the pixels after the header; hdf5: the file);
    ``blame``: the array the message names; ``longest(s)``: a bound of ``lengths(s)`` (from maxima,
    in Python ints): a slice whose longest sample at its largest offset ends inside the data needs
    no sample-by-sample sum. No rules when index.json records no size for the data file: the
    reader checks against the file itself."""
    offsets = index.arrays["offsets"]
    size = data_files(index).get(spec.DATA_FILE[index.format])
    if size is None:
        return []
    limit = size - spec.MMAP_HEADER_BYTES if index.format == "mmap" else size

    def highest(s: slice, m: dict) -> int:
        if "offsets.max" not in m:  # once per slice for both rules
            m["offsets.max"] = int(offsets[s].max())
        return m["offsets.max"]

    def past_end(s: slice, m: dict) -> np.ndarray:
        if longest(s) + highest(s, m) <= limit:
            return _NONE
        return lengths(s) > limit - offsets[s]

    return [
        ("offsets", lambda s, m: offsets[s] > limit if highest(s, m) > limit else _NONE,
         lambda i: f"offset {offsets[i]} lies past the end of the data ({limit} bytes)"),
        (blame, past_end,
         lambda i: f"sample at offset {offsets[i]} with {int(lengths(slice(i, i + 1))[0])} bytes ends "
                   f"past the end of the data ({limit} bytes)"),
    ]
