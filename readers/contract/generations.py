"""Generations of a dataset that grows by appends (``packer.Writer(out, append=True)``,
``pack-dataset SRC --append OUT``): what a reader of an earlier generation may rely on.

An append adds samples at the end and never rewrites a byte a reader of the previous generation
can reach: the first ``N_g`` samples of generation ``g + 1`` are generation ``g``'s, byte for byte.
What changes is committed by one atomic rename of ``index.json``::

    index.json                 generation g+1: "generation": g+1, "generations": one record per
                               generation ({"generation", "num_samples", "added", "written"})
    labels.g00000N.npy, ...    generation N's index arrays and fixed-size field columns
                               (field-<name>.g00000N.npy): new files (spec.array_file), so a reader
                               that read the previous index.json maps the previous arrays, whole
    index.g00000N.json         a copy of generation N's index.json, kept when N+1 is written
    data files                 wds: new shards; lmdb: new keys (data.mdb grows, MVCC); hdf5: /images
                               extended (data.h5 grows; the chunk table is replaced by a rename);
                               mmap: images.npy grows (its 128-byte .npy header is rewritten with
                               the new shape: readers take positions from the index, never from it)
    names.jsonl, rejects.jsonl grown: a reader reads only its first num_samples lines
    field_checksums.npy        renamed over (verify reads the newest generation's)

So a reader (or a loader, or a worker forked from one) that opened generation ``g`` keeps reading
exactly it: its arrays are mapped or kept by name, and every data byte it can reach stays. A job
resuming from a saved ``state_dict`` opens the generation it saved (:func:`open_generation`, or
``open_dataset(path, generation=g)``); the old generation's view is the newest index cut to its
``num_samples`` with its own ``index.json`` copy, so nothing but the copy is kept per generation
besides its arrays.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from readers.contract import spec

__all__ = ["GENERATIONS_KEY", "appended_since", "generation_of", "history", "index_copy_name",
           "is_generation_file", "open_generation"]

#: index.json key: one record per generation, oldest first (absent before the first append).
GENERATIONS_KEY = "generations"
_FILE = re.compile(r"[a-z_]+\.g\d{6}\.(npy|json)(\.tmp)?")


def generation_of(meta: Mapping[str, Any]) -> int:
    """The generation an index is: 0 for a dataset never appended to."""
    g = meta.get(spec.GENERATION_KEY, 0)
    return g if type(g) is int and g >= 0 else 0


def history(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The generations' records, oldest first; one record (generation 0, every sample) for a dataset
    never appended to."""
    records = meta.get(GENERATIONS_KEY)
    if isinstance(records, list) and records and all(isinstance(r, dict) for r in records):
        return [dict(r) for r in records]
    n = int(meta.get("num_samples", 0))
    return [{"generation": 0, "num_samples": n, "added": n}]


def index_copy_name(generation: int) -> str:
    """The copy of generation ``generation``'s ``index.json`` an append keeps."""
    return f"index.g{generation:06d}.json"


def appended_since(index: spec.Index) -> bool:
    """Whether an append has started since generation ``index`` (local: the copy of its index.json
    exists): its single data file (lmdb, hdf5, mmap) may then be longer than ``index`` records, and
    ``names.jsonl`` hold more lines; what ``index`` reaches is unchanged."""
    if index.store is not None:
        return False
    return os.path.lexists(Path(index.root) / index_copy_name(generation_of(index.meta)))


def is_generation_file(name: str) -> bool:
    """A file an append writes beside the dataset's own (an index copy, a generation's index array)."""
    return bool(_FILE.fullmatch(name))


def open_generation(index: spec.Index, generation: int) -> spec.Index:
    """Generation ``generation`` of the dataset whose newest index is ``index``: its own metadata
    (the kept copy of its ``index.json``) over the first ``num_samples`` values of the newest arrays
    (which are the same values: appends only add). ValueError for a generation it does not have."""
    current = generation_of(index.meta)
    if generation == current:
        return index
    if type(generation) is not int or not 0 <= generation < current:
        raise ValueError(f"{index.location}: no generation {generation!r}: it has generations 0 to {current}")
    name = index_copy_name(generation)
    try:
        if index.store is not None:
            raw = bytes(index.store.read(name))
        else:
            raw = bytes(spec.read_regular(spec.member_path(index.root, name, "index"), "index",
                                          limit=spec.MAX_INDEX_JSON_BYTES))
        meta = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise spec.DatasetFormatError(f"{index.location}: the index of generation {generation} ({name}) is "
                                      "missing") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise spec.DatasetFormatError(f"{index.location}/{name}: unreadable index ({exc})") from None
    n = meta.get("num_samples") if isinstance(meta, dict) else None
    if (type(n) is not int or not 0 <= n <= index.num_samples or generation_of(meta) != generation
            or meta.get("format") != index.format):
        raise spec.DatasetFormatError(f"{index.location}/{name}: not generation {generation} of this dataset")
    arrays = {name: values[:n] for name, values in index.arrays.items()}
    return spec.Index(root=index.root, meta=meta, arrays=arrays, store=index.store)
