"""``pack-dataset index SHARDS -o IDX``: index WebDataset shards where they are, without copying them.

Every shard is read once, streamed, in the pack's process pool (:mod:`packer.tools.index_scan`);
the shards are never written (read-only folders and buckets work). IDX then holds only an index
(layout: :mod:`readers.formats.inplace`) that ``open_dataset(IDX)`` reads like a wds pack:
fields by name, shuffle, exact resume, DDP, mixtures, subsets, ``verify``, ``info``, ``convert``.

Fields come from member extensions exactly as the wds importer maps them
(``packer.importers.wds``: ``.jpg``/``.png`` images, ``.txt`` text, ``.json`` json, ``.cls`` int,
``.npy`` arrays, other bytes); shards of image + ``.cls`` (and/or a ``.json`` label) only give
image + label, as a pack of them does. Samples without an image are ignored; samples with a member
missing, a member that does not parse or a duplicate key (twice in a shard, or a key an earlier shard
has) are rejects (``rejects.jsonl``).

Resumable: each scanned shard is appended to ``IDX/index-journal.jsonl`` as it finishes (after a
first line naming the shards); ``--resume`` scans only the others. ``index.json`` is written last
(with the index files fsynced before it), then the journal is removed. The journal itself is never
fsynced: a line a crash left torn ends what a resume reuses, and those shards are scanned again.

A small index runs in this process: a worker process is started per :data:`POOL_BYTES` of local
shards at most (forking one costs more than scanning less than that); remote shards, whose scan
waits on the store, get the workers asked for, forked after this process made the store's client
(``index_scan.warm_store``: its imports and session are then made once, not in each worker).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import logging
import os
import shutil
import sys
from collections import Counter
from json.encoder import encode_basestring_ascii as json_string  # json.dumps(a str), without its per-call setup
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

import numpy as np

from packer.errors import PackerError, SourceError, UsageError
from packer.importers.wds import IMAGE_EXTS, MIN_CLASS_LIMIT, Labels, field_of, npy_type
from packer.pipeline import VERSION
from packer.prepare.pool import ordered_map
from packer.prepare.stage import label_names
from packer.progress import bar as progress_bar
from packer.tools.index_list import list_shards
from packer.tools.index_scan import ShardScan, close_stores, gc_paused, scan_line, warm_store
from readers.contract import spec
from readers.contract.fields import Field, FieldType, FieldTypeError, ImageType, NumericType, Schema, column_file, \
    parse_type
from readers.contract.safeio import npy_header

__all__ = ["index_shards", "add_arguments", "run", "JOURNAL", "POOL_BYTES"]

log = logging.getLogger(__name__)

JOURNAL = "index-journal.jsonl"  # the shards of the run, then one {"k", "scan"} line per shard scanned
POOL_BYTES = 64 << 20  # local shards per worker process at least (a fork and its pipes: ~10 ms, ~20 MB of scan)
_FIELD_CHECKSUMS = "field_checksums.npy"  # packer.formats.fieldstore.FIELD_CHECKSUMS (the fields' contract)


def _prepare_output(out: Path, base: str, names: list[str], resume: bool, overwrite: bool) -> dict[int, ShardScan]:
    """The shards the interrupted run scanned (``--resume``), kept in a new journal; the folder made ready."""
    state = {"base": base, "shards": names}
    if not spec.is_remote(base) and Path(os.path.commonpath([out.resolve(), Path(base).resolve()])) == out.resolve():
        raise UsageError(f"{out} holds the shards: write the index to another folder (the shards are never written)")
    if (out / spec.INDEX_NAME).exists() and not overwrite:
        raise UsageError(f"{out} already holds an index: --overwrite replaces it")
    if (out / JOURNAL).exists() and not (resume or overwrite):
        raise UsageError(f"{out} holds an interrupted index: --resume continues it, --overwrite starts again")
    if out.exists() and not resume:
        if any(out.iterdir()) and not ((out / JOURNAL).exists() or (out / spec.INDEX_NAME).exists()):
            raise UsageError(f"{out} is not empty and holds no index: choose an empty or new folder")
        shutil.rmtree(out)
    lines = _journal(out / JOURNAL, len(names)) if resume else []
    if lines and lines[0] != state:
        raise UsageError(f"{out}: the interrupted index was of other shards; --overwrite starts again")
    done = {line["k"]: line["scan"] for line in lines[1:]}
    out.mkdir(parents=True, exist_ok=True)
    with spec.atomic_write(out / JOURNAL, "w", encoding="utf-8", durable=False) as fh:  # the lines kept, whole
        fh.write(json.dumps(state) + "\n")
        fh.writelines(json.dumps({"k": k, "scan": scan}) + "\n" for k, scan in done.items())
    return done


def _journal(path: Path, shards: int) -> list[Any]:
    """The journal's lines up to the first that a crash left torn (none when it is missing)."""
    lines: list[Any] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return lines
    for line in text.split("\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            break
        if lines and not (isinstance(obj, dict) and obj.keys() == {"k", "scan"} and isinstance(obj["k"], int)
                          and 0 <= obj["k"] < shards and isinstance(obj["scan"], dict)):
            break
        lines.append(obj)
    return lines


def _workers(asked: int | None, base: str, names: list[str], todo: list[int], engine: str) -> int:
    """Worker processes for ``todo``: those asked (default: the CPU count), at most one per shard and,
    for local shards in the local pool, one per :data:`POOL_BYTES` (1: the scan runs in this process)."""
    n = max(1, min(asked or os.cpu_count() or 1, len(todo)))
    if spec.is_remote(base) or engine != "local":
        return n
    total = 0
    for k in todo:  # stops as soon as the shards are enough for n workers
        with contextlib.suppress(OSError):  # a shard that is not there: its scan says so
            total += os.stat(os.path.join(base, names[k])).st_size
        if total >= n * POOL_BYTES:
            return n
    return max(1, min(n, total // POOL_BYTES))


def index_shards(sources: Sequence[str], out: str | os.PathLike, *, workers: int | None = None,
                 resume: bool = False, overwrite: bool = False, storage_options: Any = None,
                 quiet: bool = True, engine: str = "local", ray_address: str | None = None) -> dict[str, Any]:
    """Index the shards ``sources`` (see :mod:`packer.tools.index_list`) into the folder ``out``;
    returns a summary (samples, shards, rejects, ignored, bytes). ``engine="ray"``: each shard
    is scanned by a Ray task (:mod:`packer.tools.index_ray`; the store's environment reaches them)."""
    out = Path(out)
    base, names = list_shards(list(sources), storage_options)
    scanned = _prepare_output(out, base, names, resume, overwrite)  # this run's scans join them
    todo = [k for k in range(len(names)) if k not in scanned]
    workers = _workers(workers, base, names, todo, engine)
    bar = progress_bar(len(names), "shard", f"index {out.name}", quiet)
    if bar is not None:
        bar.update(len(scanned))
    total = 0
    journal: IO[str] = open(out / JOURNAL, "a", encoding="utf-8")
    try:
        jobs = ((base, names[k], storage_options) for k in todo)
        if engine == "ray":
            try:
                from packer.tools.index_ray import ray_scans
            except ModuleNotFoundError as exc:
                if exc.name != "ray":
                    raise
                raise UsageError("--engine ray needs Ray: pip install 'dataset-packer[ray]'") from None
            scans: Iterator[ShardScan | str] = ray_scans(jobs, workers, ray_address)
        else:
            if spec.is_remote(base) and todo:
                warm_store(base, names[todo[0]], storage_options)  # before the pool forks: see warm_store
            scans = ordered_map(scan_line, jobs, workers, chunk=1, describe=lambda n: f"shard {names[todo[n]]}")
        for k, got in zip(todo, scans):
            line = got if isinstance(got, str) else json.dumps(got)  # the pool's workers send it encoded
            scan = json.loads(got) if isinstance(got, str) else got
            journal.write(f'{{"k": {k}, "scan": {line}}}\n')  # json.dumps({"k": k, "scan": scan})'s bytes
            journal.flush()  # not fsynced: a line a crash left torn is scanned again
            scanned[k] = scan
            total += scan["bytes"]
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{total / 1e6:.0f} MB")
    finally:
        journal.close()
        close_stores()
        if bar is not None:
            bar.close()
    with gc_paused():  # after the pool: its workers are forked with the collector on
        summary = _write(out, base, [scanned[k] for k in range(len(names))])
    (out / JOURNAL).unlink()  # index.json is written: the index is complete, the journal a leftover
    return summary


# ------------------------------------------------------------------------------- the index from the scans
def _has_fields(samples: list[tuple]) -> bool:
    """As the importer decides: members beyond image, ``.cls`` and ``.json``, or no sample labelled."""
    labelled = False
    for _k, _key, image, others, _reason in samples:
        if image is None:
            continue
        if any(s not in ("cls", "json") for s in others):
            return True
        if "cls" in others and others["cls"][4] is None:
            return True
        labelled = labelled or _label(others) is not None
    return not labelled


def _label(others: dict[str, list]) -> Any:
    return others["cls"][4] if "cls" in others else (others["json"][4] if "json" in others else None)


def _npy(member: list) -> tuple[bytes, np.dtype, tuple[int, ...]]:
    data = base64.b64decode(member[4])
    h = npy_header(data, len(data))
    dtype = h.dtype.newbyteorder("<") if h.dtype.byteorder != "|" else h.dtype
    return data, dtype, tuple(h.shape)


def _schema(samples: list[tuple], src: str) -> tuple[Schema, dict[str, str]]:
    """The schema (image, then a field per member suffix, first seen first) and each field's suffix."""
    order: dict[str, tuple[str, str]] = {}
    npys: dict[str, list] = {}
    for k, key, _image, others, reason in samples:
        for suffix, m in others.items():
            if suffix not in order:
                order[suffix] = field_of(suffix, f"{src}:{key}.{suffix}")
            if order[suffix][1] == "npy" and m[4] is not None and reason is None:
                _data, dtype, shape = _npy(m)
                npys.setdefault(suffix, []).append((dtype, shape))
    fields = [Field("image", ImageType())]
    for suffix, (name, kind) in order.items():
        t: FieldType
        try:
            if kind == "npy":
                if not npys.get(suffix):
                    raise SourceError(f"{src}: no member .{suffix} is a .npy array of numbers")
                t = npy_type(npys[suffix], f"{src}: member .{suffix}")
                parse_type(t.name)
            elif kind == "int":
                t = NumericType("int32" if name == "label" else "int64")
            else:
                t = parse_type(kind)
            fields.append(Field(name, t))
        except FieldTypeError as exc:
            raise SourceError(f"{src}: member .{suffix}: {exc}") from None
    try:
        return Schema(tuple(fields)), {name: suffix for suffix, (name, _kind) in order.items()}
    except FieldTypeError as exc:
        raise SourceError(f"{src}: {exc}") from None


def _value(f: Field, m: list) -> tuple[bytes, Any]:
    """(the member's bytes as the scan kept them, its value) of a numeric field's member."""
    data = base64.b64decode(m[4]) if isinstance(m[4], str) else str(m[4]).encode()
    return data, f.type.from_member(data, f.name)


def _write(out: Path, base: str, scans: list[ShardScan]) -> dict[str, Any]:
    src = base
    samples = []  # (shard, key, image member: the first with an image suffix, the others by suffix, reject reason)
    images = frozenset(IMAGE_EXTS)
    for k, scan in enumerate(scans):
        for key, members, reason in scan["samples"]:
            image, others = None, {}
            for m in members:
                if image is None and m[0] in images:
                    image = m
                else:
                    others[m[0]] = m
            samples.append((k, key, image, others, reason))
    fielded = _has_fields(samples)
    schema, suffix_of = _schema(samples, src) if fielded else (Schema.default(), {})
    members = [f.name for f in schema.fields[1:]] if fielded else []
    extra = schema.extra_fields if fielded else ()
    n_cols = len(members)
    kept: list[tuple] = []
    rejects: list[dict[str, str]] = []
    ignored = 0
    labels = Labels()
    shard_of_key: dict[str, int] = {}  # each key's first shard: the same key in a later shard is a reject
    for k, key, image, others, reason in samples:
        name = f"{scans[k]['name']}/{key}"
        if image is None or (not fielded and _label(others) is None):
            ignored += 1
            continue
        first = shard_of_key.setdefault(key, k)  # twice in one shard: the scan said so already
        if reason is None and first != k:
            reason = (f"{src}/{scans[k]['name']}:{key}: key {key!r} also in shard {scans[first]['name']} "
                      "(duplicate key)")
        missing = [f for f in members if suffix_of[f] not in others]
        if reason is None and missing:
            reason = f"{src}/{scans[k]['name']}:{key}: no member {key}.{suffix_of[missing[0]]} (field {missing[0]!r})"
        if reason is not None:
            rejects.append({"path": name, "reason": reason})
            continue
        if not fielded:
            labels.append(_label(others), Path(src))
        kept.append((k, key, image, others))
    if not kept:
        raise SourceError(f"{src}: no sample to index (each needs an image member, e.g. key.jpg"
                          f"{'' if fielded else ', and a label: key.cls'}); {len(rejects)} rejected")
    n = len(kept)
    shard_of = np.array([s[0] for s in kept], dtype=np.int32)
    offsets = np.array([s[2][1] for s in kept], dtype=np.int64)
    sizes = np.array([s[2][2] for s in kept], dtype=np.int64)
    crcs = np.array([s[2][3] for s in kept], dtype=np.uint32)
    # (n, members, 3): each member's data offset, size and CRC-32, in one pass over the scans
    places = np.array([[others[suffix_of[f]][1:4] for f in members] for _k, _key, _image, others in kept],
                      dtype=np.int64).reshape(n, n_cols, 3)
    cols = {name: places[:, :, c].astype(dt) for c, (name, dt) in enumerate(spec.MEMBER_ARRAYS.items())}
    field_crcs = np.zeros((n, len(extra)), dtype="<u4")
    columns = {f.name: np.zeros((n, *f.type.row_shape), dtype=f.type.dtype) for f in extra
               if isinstance(f.type, NumericType) and f.type.fixed}
    label_field = schema.labels_field if fielded else None
    label_values = np.zeros(n, dtype=np.int32)
    if label_field is not None:
        label_values[:] = [int(others[suffix_of["label"]][4]) for _k, _key, _image, others in kept]
    for j, f in enumerate(extra):
        if not isinstance(f.type, NumericType):  # the stored blob is the member itself
            field_crcs[:, j] = cols["member_crcs.npy"][:, members.index(f.name)]
            continue
        for i, (_k, _key, _image, others) in enumerate(kept):  # numbers: the blob is their encoding
            _data, value = _value(f, others[suffix_of[f.name]])
            field_crcs[i, j] = spec.checksum(f.type.encode(value))
            if f.type.fixed:
                columns[f.name][i] = f.type.to_row(value)
    if fielded:
        classes = label_names(label_field, label_values.tolist(), src, MIN_CLASS_LIMIT) if label_field else []
    else:
        classes, label_values = labels.classes(lambda i: f"{src}/{scans[kept[i][0]]['name']}:{kept[i][1]} label")
    first, shards = 0, []
    counts = np.bincount(shard_of, minlength=len(scans))
    for k, scan in enumerate(scans):
        entry = {key: scan[key] for key in ("name", "bytes", "crc32", "mtime_ns", "etag", "mtime") if key in scan}
        shards.append(dict(entry, samples=int(counts[k]), first=first))
        first += int(counts[k])
    files: dict[str, int] = {}
    file_crcs: dict[str, int] = {}
    written: list[Path] = []  # made durable together, with the index arrays, before index.json (fsync once)

    def save(name: str, arr: np.ndarray) -> None:
        data = io.BytesIO()
        np.save(data, np.ascontiguousarray(arr), allow_pickle=False)
        with spec.atomic_write(out / name, durable=False) as fh:
            fh.write(data.getbuffer())
        files[name], file_crcs[name] = len(data.getbuffer()), spec.checksum(data.getbuffer())
        written.append(out / name)

    if n_cols:
        for name, arr in cols.items():
            save(name, arr)
    if extra:
        save(_FIELD_CHECKSUMS, field_crcs)
        for fname, arr in columns.items():
            save(column_file(fname), arr)
    with spec.atomic_write(out / spec.NAMES_FILE, "w", encoding="utf-8", durable=False) as text:
        text.writelines(json_string(f"{scans[k]['name']}/{key}.{image[0]}") + "\n" for k, key, image, _others in kept)
    written.append(out / spec.NAMES_FILE)
    (out / spec.REJECTS_NAME).unlink(missing_ok=True)
    if rejects:
        with spec.atomic_write(out / spec.REJECTS_NAME, "w", encoding="utf-8", durable=False) as text:
            text.writelines(json.dumps(r) + "\n" for r in rejects)
        written.append(out / spec.REJECTS_NAME)
    rel = base if spec.is_remote(base) else os.path.relpath(base, out.absolute())
    meta: dict[str, Any] = {
        "format": "wds", "num_samples": n, "classes": list(classes), "shards": shards, "split": out.name,
        "storage": {"kind": "encoded", "pixel_layout": None,
                    "encodings": {e: c for e, c in Counter(s[2][0] for s in kept).items()}},
        "files": files, spec.FILES_CRC_KEY: file_crcs, "order": {"kind": "source"},
        "options": {"format": "wds", "order": "source"}, "created_by": f"dataset-packer {VERSION}",
        spec.INPLACE_KEY: {"base": rel, "members": members},
        "source": {"kind": "wds-inplace", "given": base, "root": base, "shards": len(scans),
                   "first_shard": scans[0]["name"], "images_found": n + len(rejects), "rejected": len(rejects),
                   "ignored_files": ignored},
        "stats": {"bytes_in": int(sizes.sum()), "bytes_out": int(sizes.sum()), "reencoded": 0, "repaired": 0},
    }
    stats = {f.name: cols["member_sizes.npy"][:, members.index(f.name)] for f in extra if not f.type.fixed}
    if stats:
        meta["field_stats"] = {k: {"bytes": int(v.sum()), "min_bytes": int(v.min()), "max_bytes": int(v.max())}
                               for k, v in stats.items()}
    if fielded:
        meta["fields"] = schema.to_json()["fields"]
    arrays = {"checksums": crcs, "sizes": sizes, "offsets": offsets, "shards": shard_of, "labels": label_values}
    spec.write_index(out, meta, arrays, written)
    return {"samples": n, "shards": len(scans), "rejected": len(rejects), "ignored": ignored,
            "bytes": sum(s["bytes"] for s in scans)}


# ------------------------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``pack-dataset index``."""
    p.add_argument("shards", nargs="+", metavar="SHARDS",
                   help="a folder, glob, brace pattern (shard-{000000..000999}.tar) or list file of .tar shards; "
                        "local paths or s3:// gs:// az:// https:// URLs")
    p.add_argument("-o", "--output", required=True, type=Path, help="the index folder to write (local)")
    p.add_argument("-w", "--workers", type=int, default=None, help="shards read at once (default: the CPU count)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="who reads the shards: local (a process pool, the default) or ray (a task per shard on a "
                        "Ray cluster; pip install 'dataset-packer[ray]')")
    p.add_argument("--ray-address", default=None, help="the Ray cluster to use (default: RAY_ADDRESS, else a "
                                                       "one-machine Ray with --workers CPUs)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted index")
    p.add_argument("--overwrite", action="store_true", help="replace the index in the output folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """``pack-dataset index`` with parsed arguments; returns the exit code (3: some samples rejected)."""
    if args.ray_address is not None and args.engine != "ray":
        print("pack-dataset index: error: --ray-address applies to --engine ray only", file=sys.stderr)
        return 2
    try:
        s = index_shards(args.shards, args.output, workers=args.workers, resume=args.resume,
                         overwrite=args.overwrite, quiet=args.quiet, engine=args.engine,
                         ray_address=args.ray_address)
    except PackerError as exc:
        word = "error" if isinstance(exc, UsageError) else "failed"
        print(f"pack-dataset index: {word}: {exc}", file=sys.stderr)
        return exc.exit_code
    except (OSError, spec.DatasetFormatError) as exc:
        print(f"pack-dataset index: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM (the CLI raises it so): the shards scanned are kept
        if (args.output / JOURNAL).exists():
            word = "stopped by SIGTERM" if getattr(exc, "exit_code", 130) == 143 else "interrupted"
            print(f"pack-dataset index: {word}; {args.output} is incomplete, re-run the same command with --resume "
                  "to finish it", file=sys.stderr)
            return getattr(exc, "exit_code", 130)
        raise
    print(f"{args.output}: {s['samples']} samples in {s['shards']} shards ({s['bytes'] / 1e6:.1f} MB) indexed "
          f"in place; {s['rejected']} rejected{f' (see {args.output / spec.REJECTS_NAME})' if s['rejected'] else ''}"
          f", {s['ignored']} without an image ignored")
    return 3 if s["rejected"] else 0
