"""Append: add samples to a finished dataset as its next generation, without rewriting what is there.

``Writer(out, append=True)``, ``pack_map(..., append=True)`` and ``pack-dataset SRC --append OUT``
all come here. An append is a pack resumed from the dataset's last sample: :func:`start` seeds the
pack's own journal (``packer.journal``) from the finished index, so the pipeline, the format
writers, checkpoints, ``--resume`` and the CRCs are the pack's. Each format continues its files
the way a resumed pack does (wds: new shards; lmdb: new keys, the previous generation pinned by a
read transaction; hdf5: ``/images`` extended; mmap: ``images.npy`` grown), and the pipeline's
:func:`finish_meta` makes the new index the next generation: arrays under new names, the previous
``index.json`` kept as ``index.g00000N.json``, ``index.json`` renamed over last
(``readers.contract.generations`` says what a reader of the previous generation may rely on).

While an append runs, ``append-state.json`` names the generation it grows (and the side files'
lengths then). An interrupted append leaves that generation readable; ``resume=True`` /
``--resume`` finishes it, :func:`roll_back` removes what it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from packer.errors import PackError, UsageError
from packer.journal import RECORDS_NAME, Journal
from packer.options import PackOptions
from packer.output import APPEND_STATE_NAME, SHARD_LOG_NAME
from packer.sources.source import Source
from readers.contract import spec
from packer.formats.fieldstore import FIELD_CHECKSUMS, CRC_PART, SIZES_PART
from readers.contract.fields import Schema, column_file
from readers.contract.generations import GENERATIONS_KEY, generation_of, history, index_copy_name

__all__ = ["start", "resumable", "refuse_plain_resume", "finish_meta", "merge_field_stats", "roll_back", "interrupted",
           "base_index", "check_schema", "merge_classes", "remap_source"]

log = logging.getLogger(__name__)


def interrupted(out: Path) -> dict[str, Any] | None:
    """The record of an append into ``out`` that was interrupted (None: none is)."""
    path = out / APPEND_STATE_NAME
    if not (path.is_file() and (out / spec.STATE_NAME).is_file()):
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        int(state["generation"]), int(state["num_samples"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PackError(f"{path} is damaged: the interrupted append cannot be resumed nor rolled back") from None
    return state


def base_index(out: Path, options: PackOptions) -> spec.Index:
    """The finished dataset in ``out`` that an append grows, checked against the append's options."""
    try:
        index = spec.read_index(out)
    except (FileNotFoundError, spec.DatasetFormatError) as exc:
        raise PackError(f"cannot append to {out}: {exc}") from None
    meta = index.meta
    if meta["format"] != options.format:
        raise UsageError(f"{out} is a {meta['format']} dataset; append to it with format {meta['format']!r} "
                         f"(not {options.format!r})")
    if meta["format"] == "mmap":
        fixed = (meta.get("storage") or {}).get("fixed_shape")
        if (fixed[0] if fixed else None) != options.resize:
            raise UsageError(f"{out}: its samples are {'resize ' + str(fixed[0]) if fixed else 'not resized'}; "
                             f"append with the same resize (not {options.resize})")
    schema = Schema.from_index(meta, str(out / spec.INDEX_NAME))
    # hdf5 copies every field into data.h5 at the end, mmap keeps a variable one as blob + offsets: not
    # grown yet; wds and lmdb keep them per sample, and fixed ones (all formats) as columns, as the index
    unsupported = [f.name for f in schema.extra_fields if meta["format"] == "hdf5"
                   or meta["format"] == "mmap" and not f.type.fixed]
    if unsupported:
        raise UsageError(f"{out}: appending to a {meta['format']} dataset with field(s) {', '.join(unsupported)} "
                         "is not supported yet (wds and lmdb datasets with fields, and mmap ones with fixed-size "
                         "fields, are); write a new dataset and merge them (pack-dataset merge)")
    return index


def check_schema(out: Path, index: spec.Index, schema: Schema) -> None:
    """The append's fields must be the dataset's: an error naming the first field that differs."""
    then = Schema.from_index(index.meta, str(out / spec.INDEX_NAME))
    have = {f.name: f.type.name for f in then}
    now = {f.name: f.type.name for f in schema}
    for name in [*have, *(n for n in now if n not in have)]:
        if have.get(name) != now.get(name):
            was = f"{have[name]}" if name in have else "not a field"
            got = f"{now[name]}" if name in now else "missing"
            raise UsageError(f"cannot append to {out}: field {name!r} is {was} there, {got} in the samples "
                             "appended (an append keeps the dataset's schema)")


def merge_classes(out: Path, have: Sequence[str], given: Sequence[str] | None) -> list[str]:
    """The dataset's classes with ``given``'s new names added at the end; an error when ``given``
    renames or reorders one the dataset has."""
    have = list(have)
    if given is None:
        return have
    given = list(given)
    if given[:len(have)] != have[:len(given)] or len(given) < len(have):
        raise UsageError(f"cannot append to {out}: its classes are {have}; the classes given must start with "
                         f"them (new classes go at the end), got {given}")
    return given


def remap_source(out: Path, index: spec.Index, source: Source) -> None:
    """A folder source's classes (its own sorted names) as the dataset's: a name the dataset has
    keeps its index, a new one is added at the end."""
    classes = list(index.meta["classes"])
    where = {name: i for i, name in enumerate(classes)}
    mapping = []
    for name in source.classes:
        if name not in where:
            where[name] = len(classes)
            classes.append(name)
        mapping.append(where[name])
    table = np.asarray(mapping, dtype=np.int64)
    if len(source.labels):
        source.labels = table[np.asarray(source.labels, dtype=np.int64)].tolist()
    source.classes = classes


def resumable(out: Path, options: PackOptions) -> bool:
    """Whether an append into ``out`` continues an interrupted one (``options.resume``); a PackError
    for an interrupted append without ``resume``, or ``resume`` with none to continue."""
    state = interrupted(out)
    if state is not None:
        if not options.resume:
            raise PackError(f"{out}: an append to generation {state['generation']} was interrupted; finish it "
                            "with resume=True (--resume) or roll it back with packer.roll_back"
                            f"({str(out)!r}); generation {state['generation']} is intact meanwhile")
        return True
    (out / APPEND_STATE_NAME).unlink(missing_ok=True)  # an append that committed, its clean-up cut short
    if options.resume:
        raise PackError(f"{out}: no interrupted append to resume (generation "
                        f"{generation_of(spec.read_meta(out))} is complete)")
    return False


def refuse_plain_resume(out: Path) -> None:
    """A resume that is not an append, on a dataset whose append was interrupted: a PackError saying
    what finishes it (the journal is the append's; taking the dataset as complete would drop it)."""
    state = interrupted(out)
    if state is not None:
        raise PackError(f"{out}: the interrupted work is an append to generation {state['generation']}: "
                        "finish it with append=True, resume=True (--append OUT --resume), or roll it back "
                        "with packer.roll_back")


def start(out: Path, split: str, source: Source, options: PackOptions, index: spec.Index | None = None
          ) -> PackOptions:
    """Ready ``out`` for ``pack_split`` to append ``source``: seed the journal from the finished
    index (or keep an interrupted append's, with ``options.resume``). Returns the options to pack
    with (``resume=True``: the pipeline continues the journal). Call it holding the output lock."""
    if resumable(out, options):
        return dataclasses.replace(options, resume=True, append=True)
    index = index or base_index(out, options)
    _seed(out, split, source, options, index)
    return dataclasses.replace(options, resume=True, append=True)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _seed(out: Path, split: str, source: Source, options: PackOptions, index: spec.Index) -> None:
    """Write what an interrupted pack of the dataset's samples would leave at its last checkpoint."""
    meta, n = index.meta, index.num_samples
    g = generation_of(meta)
    copy = out / index_copy_name(g)
    if not copy.exists():  # the index a reader of generation g opens again (readers.contract.generations)
        with spec.atomic_write(copy) as f:
            f.write(spec.read_regular(out / spec.INDEX_NAME, "index", limit=spec.MAX_INDEX_JSON_BYTES))
    records = np.zeros(n, dtype=spec.RECORD_DTYPE)
    for name, values in index.arrays.items():
        records[name] = values
    with spec.atomic_write(out / RECORDS_NAME) as f:
        f.write(records.tobytes())
    del records
    lengths = {name: _size(out / file) for name, file in
               (("names_len", spec.NAMES_FILE), ("rejects_len", spec.REJECTS_NAME), ("repairs_len", spec.REPAIRS_NAME))}
    src: dict[str, Any] = meta["source"] if isinstance(meta.get("source"), dict) else {}
    stats: dict[str, Any] = meta["stats"] if isinstance(meta.get("stats"), dict) else {}
    state = {"generation": g, "num_samples": n, "images_found": int(src.get("images_found", n)),
             "rejected": int(src.get("rejected", 0)), "data_bytes": _data_bytes(out, meta, index), **lengths}
    spec.write_json_atomic(out / APPEND_STATE_NAME, state)
    _seed_fields(out, index)
    journal = Journal(Journal.identity_of(split, source, options), done=n, next_source=0,
                      bytes_in=int(stats.get("bytes_in", 0)), changed=int(stats.get("reencoded", 0)),
                      rejected=state["rejected"], repaired=int(stats.get("repaired", 0)),
                      encodings=dict((meta.get("storage") or {}).get("encodings") or {}),
                      records_len=n * spec.RECORD_DTYPE.itemsize, writer=_writer_state(out, meta, state),
                      source_prefix=source.prefix_fingerprint(0), **lengths)
    journal.save(out)


def _seed_fields(out: Path, index: spec.Index) -> None:
    """The typed fields' side files (``packer.formats.fieldstore``) as a checkpoint after the dataset's
    samples would leave them: their CRCs, their sizes (-1 where only the blob would tell: those
    fields' stats are the index's, added to in :func:`merge_field_stats`) and the fixed columns."""
    schema = Schema.from_index(index.meta, str(out / spec.INDEX_NAME))
    extra, n = schema.extra_fields, index.num_samples
    if not extra:
        return
    crcs = np.load(out / FIELD_CHECKSUMS, mmap_mode="r", allow_pickle=False)
    with spec.atomic_write(out / CRC_PART) as fh:
        fh.write(np.ascontiguousarray(crcs, dtype="<u4").tobytes())
    del crcs
    sizes = np.full((n, len(extra)), -1, dtype="<i8")
    for j, f in enumerate(extra):
        if f.type.fixed:
            dtype, shape = f.type.column_layout(1)
            sizes[:, j] = dtype.itemsize * int(np.prod(shape))
            column = np.load(out / column_file(f.name, index.meta), mmap_mode="r", allow_pickle=False)
            with spec.atomic_write(out / (column_file(f.name) + ".part")) as part:
                part.write(np.ascontiguousarray(column).tobytes())
            del column
    with spec.atomic_write(out / SIZES_PART) as fh:
        fh.write(sizes.tobytes())


def merge_field_stats(out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """An append's ``field_stats``: a field whose earlier sizes were unknown (-1, :func:`_seed_fields`)
    has its new samples' stats added to the previous generation's."""
    state = json.loads((out / APPEND_STATE_NAME).read_text(encoding="utf-8"))
    base = json.loads((out / index_copy_name(int(state["generation"]))).read_text(encoding="utf-8"))
    then, now = base.get("field_stats") or {}, dict(meta.get("field_stats") or {})
    for name, old in then.items():
        new = now.get(name)
        if not isinstance(new, dict) or not isinstance(old, dict) or "min" in new:  # fixed: computed whole
            continue
        merged = {"bytes": int(old.get("bytes", 0)) + int(new.get("bytes", 0))}
        for key, pick in (("min_bytes", min), ("max_bytes", max), ("min_rows", min), ("max_rows", max)):
            values = [v[key] for v in (old, new) if key in v]
            if values:
                merged[key] = pick(values)
        now[name] = merged
    return {**meta, "field_stats": now}


def _data_bytes(out: Path, meta: dict[str, Any], index: spec.Index) -> int:
    """Where the format's data continues: hdf5 /images' bytes, mmap the pixels' (after the header)."""
    if meta["format"] == "hdf5":
        n = index.num_samples
        return int(index.arrays["offsets"][-1] + index.arrays["sizes"][-1]) if n else 0
    if meta["format"] == "mmap":
        return int((meta.get("files") or {})[spec.DATA_FILE["mmap"]]) - spec.MMAP_HEADER_BYTES
    return 0


def _writer_state(out: Path, meta: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The format writer's checkpoint state at the dataset's end (``FormatWriter.open`` resumes from it)."""
    fmt = meta["format"]
    if fmt == "wds":
        shards = list(meta.get("shards") or [])
        with spec.atomic_write(out / SHARD_LOG_NAME) as f:
            for shard in shards:
                f.write((json.dumps(shard, sort_keys=True) + "\n").encode())
        return {"shards_closed": len(shards), "log_bytes": _size(out / SHARD_LOG_NAME)}
    if fmt in ("hdf5", "mmap"):
        return {"bytes": state["data_bytes"]}
    return {}


def finish_meta(out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The index of the generation an append writes: ``meta`` (the pack's, for every sample) with the
    generation, the generations' records and the source counts of every generation."""
    state = json.loads((out / APPEND_STATE_NAME).read_text(encoding="utf-8"))
    base = json.loads((out / index_copy_name(int(state["generation"]))).read_text(encoding="utf-8"))
    g = generation_of(base) + 1
    n = int(meta["num_samples"])
    records = history(base) + [{"generation": g, "num_samples": n, "added": n - int(base["num_samples"]),
                                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
    src = dict(meta["source"])
    src["images_found"] = int(state["images_found"]) + int(src.get("images_found", 0))
    return {**meta, spec.GENERATION_KEY: g, GENERATIONS_KEY: records, "source": src}


def roll_back(out: str | os.PathLike) -> int:
    """Undo an interrupted append into ``out``: the data it added is cut off (new shards deleted,
    new LMDB keys deleted, ``/images`` and ``images.npy`` cut back), the side files cut back to the
    generation it grew, the journal removed. Returns that generation's number. An append that had
    already committed its index is only cleaned up (it is the newest generation)."""
    out = Path(out)
    state = interrupted(out)
    if state is None:
        raise PackError(f"{out}: no interrupted append to roll back")
    index = spec.read_index(out)
    meta = index.meta
    if generation_of(meta) == int(state["generation"]):
        fmt = meta["format"]
        if fmt == "wds":
            keep = {s["name"] for s in meta.get("shards") or []}
            split = meta.get("split") or "data"
            for p in out.glob(f"{split}-*.tar*"):
                if p.name not in keep:
                    p.unlink()
        elif fmt == "lmdb":
            from packer.formats.lmdb import drop_keys_from

            drop_keys_from(out, index.num_samples)
        elif fmt == "hdf5":
            import h5py

            with h5py.File(out / spec.DATA_FILE["hdf5"], "r+") as h5:
                h5["images"].resize((int(state["data_bytes"]),))
        else:  # the header too, in case the append had written its own before it stopped
            from packer.formats.mmap import npy_header

            fixed = (meta.get("storage") or {}).get("fixed_shape")
            with open(out / spec.DATA_FILE["mmap"], "r+b") as f:
                f.truncate(int(state["data_bytes"]) + spec.MMAP_HEADER_BYTES)
                f.write(npy_header((index.num_samples, *fixed) if fixed else (int(state["data_bytes"]),)))
        for key, name in (("names_len", spec.NAMES_FILE), ("rejects_len", spec.REJECTS_NAME),
                          ("repairs_len", spec.REPAIRS_NAME)):
            path = out / name
            if path.exists():
                with open(path, "r+b") as f:
                    f.truncate(int(state[key]))
                if not state[key]:
                    path.unlink()
    Journal.discard(out)
    if generation_of(meta) == int(state["generation"]):  # no append started since it, after all
        (out / index_copy_name(generation_of(meta))).unlink(missing_ok=True)
    spec.fsync_dir(out)
    return generation_of(meta)
