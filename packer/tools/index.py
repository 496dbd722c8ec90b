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
from packer.tools.index_scan import COLUMNS, ShardScan, close_stores, gc_paused, scan_line, warm_store
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
                          and 0 <= obj["k"] < shards and isinstance(obj["scan"], dict)
                          and all(column in obj["scan"] for column in COLUMNS)):  # (older scans: scanned again)
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
class _Members:
    """Every shard's scan joined (``index_scan.COLUMNS``), with what each sample's members are as the wds
    importer sees a sample: its image is its first member with an image suffix, its other members are
    keyed by suffix (a suffix twice: the later one, as in a dict; the scan made that sample a reject)."""

    def __init__(self, scans: list[ShardScan]) -> None:
        join = lambda column: [v for scan in scans for v in scan[column]]  # noqa: E731
        self.keys, self.reasons, self.suffixes, self.values = join("keys"), join("reasons"), join("suffixes"), \
            join("values")
        self.offsets, self.sizes = np.array(join("offsets"), np.int64), np.array(join("sizes"), np.int64)
        self.crcs = np.array(join("crcs"), np.int64)
        n = len(self.keys)
        self.shard = np.repeat(np.arange(len(scans), dtype=np.int32), [len(scan["keys"]) for scan in scans])
        self.owner = np.repeat(np.arange(n), np.array(join("counts"), np.int64))  # each member's sample
        self.names = list(dict.fromkeys(self.suffixes))  # the suffixes, each once, first seen first
        code_of = {suffix: c for c, suffix in enumerate(self.names)}
        self.code = np.fromiter(map(code_of.__getitem__, self.suffixes), np.int64, len(self.suffixes))
        images = frozenset(IMAGE_EXTS)
        imaged = np.flatnonzero(np.array([x in images for x in self.names], bool)[self.code]) \
            if self.names else np.zeros(0, np.int64)
        with_image, first = np.unique(self.owner[imaged], return_index=True)
        self.image = np.full(n, -1, np.int64)  # each sample's image member, or -1
        self.image[with_image] = imaged[first]
        other = np.ones(len(self.suffixes), bool)
        other[self.image[with_image]] = False
        self.others = np.flatnonzero(other)  # the other members, in order
        pair = self.owner[self.others] * max(1, len(self.names)) + self.code[self.others]
        _pairs, from_end = np.unique(pair[::-1], return_index=True)
        self._last = self.others[::-1][from_end]  # per (sample, suffix): the later member
        self._by_suffix: dict[str, np.ndarray] = {}

    def member(self, suffix: str) -> np.ndarray:
        """Per sample, its other member with this suffix, or -1."""
        if suffix not in self._by_suffix:
            at = np.full(len(self.keys), -1, np.int64)
            if suffix in self.names:
                last = self._last[self.code[self._last] == self.names.index(suffix)]
                at[self.owner[last]] = last
            self._by_suffix[suffix] = at
        return self._by_suffix[suffix]

    def label_members(self) -> np.ndarray:
        """Per sample, the member its label is read from (as the importer's ``label_of``), or -1:
        ``.cls``, else ``.json``."""
        cls = self.member("cls")
        return np.where(cls >= 0, cls, self.member("json"))

    def value(self, m: int) -> Any:
        """Member ``m``'s value (``index_scan``'s), None for none (-1)."""
        return self.values[m] if m >= 0 else None

    def has_fields(self) -> bool:
        """As the importer decides: members beyond image, ``.cls`` and ``.json``, or no sample labelled."""
        imaged = self.image >= 0
        their = self.others[imaged[self.owner[self.others]]]  # the other members of the samples with an image
        usual = [self.names.index(x) for x in ("cls", "json") if x in self.names]
        if not np.isin(self.code[their], usual).all():
            return True
        cls = self.member("cls")
        if any(self.values[m] is None for m in cls[imaged & (cls >= 0)].tolist()):
            return True
        return not any(self.value(m) is not None for m in self.label_members()[imaged].tolist())

    def field_order(self, src: str) -> dict[str, tuple[str, str]]:
        """Each other member's suffix, first seen first: (its field name, its kind) (``field_of``)."""
        codes, first = np.unique(self.code[self.others], return_index=True)
        order: dict[str, tuple[str, str]] = {}
        for at, c in sorted(zip(first.tolist(), codes.tolist())):
            m = int(self.others[at])
            suffix = self.names[c]
            order[suffix] = field_of(suffix, f"{src}:{self.keys[self.owner[m]]}.{suffix}")
        return order


def _npy(value: str) -> tuple[bytes, np.dtype, tuple[int, ...]]:
    data = base64.b64decode(value)
    h = npy_header(data, len(data))
    dtype = h.dtype.newbyteorder("<") if h.dtype.byteorder != "|" else h.dtype
    return data, dtype, tuple(h.shape)


def _schema(found: _Members, src: str) -> tuple[Schema, dict[str, str]]:
    """The schema (image, then a field per member suffix, first seen first) and each field's suffix."""
    order = found.field_order(src)
    npys: dict[str, list] = {}
    for suffix, (_name, kind) in order.items():
        if kind == "npy":  # each array's dtype and shape, from the samples that are no reject
            npys[suffix] = [_npy(found.values[m])[1:] for i, m in enumerate(found.member(suffix).tolist())
                            if found.value(m) is not None and found.reasons[i] is None]
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


def _value(f: Field, value: Any) -> tuple[bytes, Any]:
    """(the member's bytes as the scan kept them, its value) of a numeric field's member."""
    data = base64.b64decode(value) if isinstance(value, str) else str(value).encode()
    return data, f.type.from_member(data, f.name)


def _write(out: Path, base: str, scans: list[ShardScan]) -> dict[str, Any]:
    src = base
    found = _Members(scans)
    fielded = found.has_fields()
    schema, suffix_of = _schema(found, src) if fielded else (Schema.default(), {})
    members = [f.name for f in schema.fields[1:]] if fielded else []
    extra = schema.extra_fields if fielded else ()
    n_cols = len(members)
    at = [found.member(suffix_of[f]) for f in members]  # per field, each sample's member
    label_at = found.label_members() if not fielded else None
    keys, reasons, shard, image, values = found.keys, found.reasons, found.shard.tolist(), found.image, found.values
    names = [scan["name"] for scan in scans]
    # ignored: no image, or (a dataset of labels) no label
    considered = image >= 0
    if label_at is not None:
        considered &= np.array([found.value(m) is not None for m in label_at.tolist()], bool)
    ignored = len(keys) - int(considered.sum())
    missing = np.full(len(keys), -1, np.int64)  # each sample's first field without a member
    for j in reversed(range(n_cols)):
        missing[at[j] < 0] = j
    kept: list[int] = []
    rejects: list[dict[str, str]] = []
    labels = Labels()
    shard_of_key: dict[str, int] = {}  # each key's first shard: the same key in a later shard is a reject
    for i in np.flatnonzero(considered).tolist():
        key, k, reason = keys[i], shard[i], reasons[i]
        first = shard_of_key.setdefault(key, k)  # twice in one shard: the scan said so already
        if reason is None and first != k:
            reason = f"{src}/{names[k]}:{key}: key {key!r} also in shard {names[first]} (duplicate key)"
        if reason is None and missing[i] >= 0:
            f = members[missing[i]]
            reason = f"{src}/{names[k]}:{key}: no member {key}.{suffix_of[f]} (field {f!r})"
        if reason is not None:
            rejects.append({"path": f"{names[k]}/{key}", "reason": reason})
            continue
        if label_at is not None:
            labels.append(values[label_at[i]], Path(src))
        kept.append(i)
    if not kept:
        raise SourceError(f"{src}: no sample to index (each needs an image member, e.g. key.jpg"
                          f"{'' if fielded else ', and a label: key.cls'}); {len(rejects)} rejected")
    rows = np.array(kept, np.int64)
    n = len(kept)
    shard_of = found.shard[rows]
    images = image[rows]
    offsets, sizes, crcs = found.offsets[images], found.sizes[images], found.crcs[images].astype(np.uint32)
    # each field's member: its data offset, size and CRC-32 (n, members)
    places = np.stack([a[rows] for a in at], axis=1) if n_cols else np.zeros((n, 0), np.int64)
    cols = {name: column[places].astype(dt) for column, (name, dt) in
            zip((found.offsets, found.sizes, found.crcs), spec.MEMBER_ARRAYS.items())}
    field_crcs = np.zeros((n, len(extra)), dtype="<u4")
    columns = {f.name: np.zeros((n, *f.type.row_shape), dtype=f.type.dtype) for f in extra
               if isinstance(f.type, NumericType) and f.type.fixed}
    label_field = schema.labels_field if fielded else None
    label_values = np.zeros(n, dtype=np.int32)
    if label_field is not None:
        label_values[:] = [int(values[m]) for m in places[:, members.index("label")].tolist()]
    for j, f in enumerate(extra):
        c = members.index(f.name)
        if not isinstance(f.type, NumericType):  # the stored blob is the member itself
            field_crcs[:, j] = cols["member_crcs.npy"][:, c]
            continue
        for i, m in enumerate(places[:, c].tolist()):  # numbers: the blob is their encoding
            _data, value = _value(f, values[m])
            field_crcs[i, j] = spec.checksum(f.type.encode(value))
            if f.type.fixed:
                columns[f.name][i] = f.type.to_row(value)
    if fielded:
        classes = label_names(label_field, label_values.tolist(), src, MIN_CLASS_LIMIT) if label_field else []
    else:
        classes, label_values = labels.classes(lambda i: f"{src}/{names[shard[kept[i]]]}:{keys[kept[i]]} label")
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
        text.writelines(json_string(f"{names[shard[i]]}/{keys[i]}.{found.suffixes[m]}") + "\n"
                        for i, m in zip(kept, images.tolist()))
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
                    "encodings": dict(Counter(found.suffixes[m] for m in images.tolist()))},
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
