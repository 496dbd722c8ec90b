"""``pack-dataset info PATH``: what a packed dataset holds, or how far an interrupted pack got.

:func:`describe` returns a JSON-able description (``--json`` prints it);
:func:`render` turns it into the text that ``pack-dataset info`` prints. A
complete dataset is described from its ``index.json`` alone (no index array is read: O(1)
in the number of samples, :func:`readers.contract.spec.read_meta`); an interrupted one
from its journal (``pack-state.json``), with the command that resumes it.
A folder of split datasets is described split by split.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from packer.appending import interrupted
from readers.contract import spec
from readers.contract.generations import generation_of, history
from readers.contract.locks import lock_holder

__all__ = ["describe", "render", "write_json", "ClassList", "resume_command", "add_arguments", "run", "main",
           "field_stats_text", "source_line", "size_text", "path_or_url"]

_SHOWN_CLASSES = 30  # text output lists this many classes; --json lists all


def _disk_usage(root: Path) -> tuple[int, int]:
    """(bytes, files) of everything in ``root`` (not following links)."""
    total = count = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            count += 1
    return total, count


def _flag_value(flag: Any, value: Any) -> list[str]:
    if flag.action == "store_true":
        return [flag.flags[-1]] if value else []
    if flag.action == "store_false":
        return [] if value else [flag.flags[-1]]
    return [flag.flags[-1], flag.show(value)]


def resume_command(state: dict[str, Any], out: Path) -> str:
    """The ``pack-dataset`` command line that finishes the interrupted pack in ``out``."""
    from packer.options import cli_fields

    source = state.get("source") or {}
    if source.get("kind") == "writer":  # written from Python: the same Writer call, resumed
        return (f"packer.Writer({str(out)!r}, format={state.get('format')!r}, ..., resume=True) in Python, then "
                "skip the first w.count samples")
    command = "convert" if source.get("kind") in ("dataset", "merged") else "pack"
    options = state.get("options", {})
    words = ["pack-dataset"] + (["convert"] if command == "convert" else [])
    if source.get("kind") == "merged":  # the same merge (all its splits at once), resumed
        words = ["pack-dataset", "merge", *source.get("sources_given", ["DATASET", "..."]), "-f", state["format"],
                 "-o", source.get("output") or str(out)]
    elif source.get("splits", 1) > 1:  # an imported source with several splits: resume them all at once
        words += [source["given"], "-f", state["format"], "-o", str(out.parent)]
    else:
        words += [source.get("given") or source.get("root", "SRC"), "-f", state["format"], "-o", str(out)]
    for f, flag in cli_fields(command):
        if f.name in ("format", "overwrite", "resume") or f.name not in options:
            continue
        if options[f.name] != f.default:
            words += _flag_value(flag, options[f.name])
    return shlex.join(words + ["--resume"])


class ClassList(Sequence):
    """The classes of a :func:`describe` result: ``{"label", "name", "samples"}`` per class, made as
    they are asked for (``list(d["classes"])`` for all of them). An index may list 50M classes: the
    text output shows a count and the first few, ``--json`` writes them one at a time
    (:func:`write_json`), so neither holds more than the index's own list of names."""

    def __init__(self, names: Sequence[str], counts: Sequence[int] | None) -> None:
        self._names, self._counts = names, counts

    def __len__(self) -> int:
        return len(self._names)

    def _one(self, i: int) -> dict[str, Any]:
        return {"label": i, "name": self._names[i], "samples": int(self._counts[i]) if self._counts else 0}

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._one(k) for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"class {i} of {len(self)}")
        return self._one(i % len(self))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._one(i) for i in range(len(self)))

    def count_range(self) -> tuple[int, int]:
        """(fewest, most) samples of a class (0, 0 without recorded counts)."""
        return (min(self._counts), max(self._counts)) if self._counts else (0, 0)


class _Streamed(list):
    """A :class:`ClassList` handed to the pure-Python JSON encoder (``indent`` set): it takes
    ``len`` and iterates, so each class is encoded as it is made; nothing is stored here."""

    def __init__(self, classes: ClassList) -> None:
        super().__init__()
        self._classes = classes

    def __len__(self) -> int:
        return len(self._classes)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._classes)


def _stream_default(o: Any) -> Any:
    if isinstance(o, ClassList):
        return _Streamed(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def write_json(d: dict[str, Any], out: TextIO) -> None:
    """``d`` (a :func:`describe` result) as ``json.dumps(d, indent=1, sort_keys=True)`` writes it,
    streamed: the class list is encoded one class at a time."""
    for chunk in json.JSONEncoder(indent=1, sort_keys=True, default=_stream_default).iterencode(d):
        out.write(chunk)
    out.write("\n")


def _origin(source: dict[str, Any], stats: dict[str, Any]) -> tuple[list[dict[str, str]], dict, dict]:
    """For a converted dataset, the datasets it was converted from (newest first) and the source record
    and stats of the original pack; for any other, ``([], source, stats)``."""
    chain = []
    while source.get("kind") == "dataset":
        chain.append({"format": source.get("dataset_format", "?"), "path": source.get("root", "?")})
        source, stats = source.get("original_source", {}), source.get("original_stats", {})
    return chain, source, stats


def _complete(root: Path | str, meta: dict[str, Any], usage: tuple[int, int] | None = None) -> dict[str, Any]:
    chain, source, stats = _origin(meta.get("source", {}), meta.get("stats", {}))
    size, files = usage if usage is not None else _disk_usage(Path(root))
    return {
        "path": str(root), "state": "complete", "format": meta["format"], "split": meta.get("split"),
        "spec_version": meta.get("spec_version"), "checksum": meta.get("checksum"),
        "samples": int(meta["num_samples"]),
        "classes": ClassList(meta["classes"], meta.get("class_counts")),  # made as asked for (50M classes)
        "fields": meta.get("fields") or [{"name": "image", "type": "image"}, {"name": "label", "type": "int32"}],
        "field_stats": meta.get("field_stats") or {},
        "bytes_on_disk": size, "files": files,
        "storage": meta.get("storage", {}),
        "shards": len(meta.get("shards", [])) if meta["format"] == "wds" else None,
        "options": meta.get("options", {}),
        "order": meta.get("order"),
        "source": source,
        "rejected": source.get("rejected", 0), "repaired": stats.get("repaired", 0),
        "reencoded": stats.get("reencoded", 0),
        "converted_from": chain,
        "created_by": meta.get("created_by"),
    }


def _journal_order(options: dict[str, Any]) -> dict[str, Any] | None:
    """The order an interrupted pack writes, from its options (``--order``, ``--shuffle-seed``)."""
    kind = options.get("order")
    if not kind:
        return None
    return {"kind": kind, "seed": options.get("shuffle_seed", 0)} if kind == "shuffled" else {"kind": kind}


def _incomplete(root: Path) -> dict[str, Any]:
    try:
        state = json.loads((root / spec.STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise spec.DatasetFormatError(f"{root / spec.STATE_NAME}: unreadable journal ({exc})") from exc
    size, files = _disk_usage(root)
    source = state.get("source") or {}
    holder = lock_holder(root)  # a pack writing it right now: not "interrupted", nothing to resume yet
    return {
        "path": str(root), "state": "incomplete" if holder is None else "packing",
        **({} if holder is None else {"packing_pid": holder}),
        "format": state.get("format"), "split": state.get("split"),
        "spec_version": spec.SPEC_VERSION, "checksum": spec.CHECKSUM_ALGO,
        "samples": state.get("done", 0),  # durable as of the last checkpoint
        "source_done": state.get("next_source", 0), "source_images": None if source.get("kind") == "writer" else source.get("images"),
        "bytes_on_disk": size, "files": files,
        "options": state.get("options", {}),
        "order": _journal_order(state.get("options", {})),
        "source": source,
        "rejected": state.get("rejected", 0), "repaired": state.get("repaired", 0),
        "reencoded": state.get("changed", 0),
        "resume": resume_command(state, root.resolve()),
    }


def _recorded_usage(meta: dict[str, Any]) -> tuple[int, int]:
    """(bytes, files) of a dataset as its index records them: data files, index arrays, index.json."""
    arrays = meta.get(spec.ARRAYS_KEY) or {}
    size = sum(int(n) for n in (meta.get("files") or {}).values())
    size += sum(int(a.get("bytes", 0)) for a in arrays.values() if isinstance(a, dict))
    return size, len(meta.get("files") or {}) + len(arrays) + 1


def describe_remote(url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`describe` for an ``s3://`` or ``http(s)://`` dataset (or a prefix holding split datasets).

    Sizes are the ones the index records (no request per object). An upload
    that never finished has no ``index.json`` there: its journal lives in the
    packing machine's staging folder, so it is reported as not a dataset.
    """
    from packer.tools.verify_remote import remote_roots
    from readers.remote import open_store

    store = open_store(url, storage_options)
    try:
        if store.exists(spec.INDEX_NAME):
            meta = spec.read_meta(store)  # index.json only: info never reads the index arrays
            return _complete(url, meta, _recorded_usage(meta))
    finally:
        store.close()  # its connections now, not whenever the garbage collector runs
    roots = remote_roots(url, storage_options)
    if roots != [url]:
        return {"path": url, "state": "complete", "splits": [describe_remote(u, storage_options) for u in roots]}
    raise spec.DatasetFormatError(f"{url}: not a packed dataset (no {spec.INDEX_NAME}; an interrupted upload "
                                  "is resumed from the packing machine with the same command and --resume)")


def _appends(root: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """A finished dataset's generations (``packer.appending``) and the append into it that was
    interrupted, if one was: how far it got and the command that finishes it (``meta``: its index.json,
    read once by the caller: a second read would hold every class name twice)."""
    out: dict[str, Any] = {"generation": generation_of(meta), "generations": history(meta)}
    state = interrupted(root)
    if state is not None:
        journal = json.loads((root / spec.STATE_NAME).read_text(encoding="utf-8"))
        command = resume_command(journal, root.resolve())
        if (journal.get("source") or {}).get("kind") == "writer":
            command = command.replace(", resume=True)", ", append=True, resume=True)")
        else:
            command = command.replace(" -o ", " --append ", 1)
        out["append"] = {"generation": int(state["generation"]) + 1, "given": journal.get("next_source", 0),
                         "samples": int(journal.get("done", 0)) - int(state["num_samples"]),
                         "resume": command, "roll_back": f"packer.roll_back({str(root.resolve())!r})"}
    return out


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """Describe the dataset folder ``path`` (complete or interrupted), or each split inside it; an
    ``s3://`` or ``http(s)://`` URL is described by :func:`describe_remote`.

    Raises FileNotFoundError / ``spec.DatasetFormatError`` when ``path`` is neither.
    """
    root = spec.parse_location(path)  # file:// is a local path; unsupported schemes: ValueError
    if isinstance(root, str):
        return describe_remote(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such dataset folder")
    if (root / spec.INDEX_NAME).is_file():
        meta = spec.read_meta(root)
        return dict(_complete(root, meta), **_appends(root, meta))
    if (root / spec.STATE_NAME).is_file():
        return _incomplete(root)
    splits = sorted(p for p in root.iterdir() if p.is_dir()
                    and ((p / spec.INDEX_NAME).is_file() or (p / spec.STATE_NAME).is_file()))
    if splits:
        described = [describe(p) for p in splits]
        done = all(d["state"] == "complete" for d in described)
        return {"path": str(root), "state": "complete" if done else "incomplete", "splits": described}
    raise spec.DatasetFormatError(f"{root}: not a packed dataset (no {spec.INDEX_NAME} or {spec.STATE_NAME})")


# ---------------------------------------------------------------------------- text
def size_text(n: int) -> str:
    """A byte count as ``12.3 MB`` / ``1.23 GB``."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


_SOURCE_ORDER = {"folder": "sorted by class, then path (as scanned)", "wds": "the shards' order",
                 "hf": "the dataset's row order", "dataset": "the source dataset's order"}


def _order(order: Any, kind: str) -> str:
    if not order:
        return "source order: " + _SOURCE_ORDER.get(kind, "as scanned")
    if isinstance(order, dict):
        kind = order.get("kind") or order.get("order") or "custom"
        rest = ", ".join(f"{k} {v}" for k, v in order.items() if k not in ("kind", "order"))
        return f"{kind}" + (f" ({rest})" if rest else "")
    return str(order)


def _options(options: dict[str, Any]) -> str:
    from packer.options import cli_fields

    show = {f.name: flag.show for f, flag in cli_fields("pack")}
    return " ".join(f"{k}={show.get(k, str)(v) if v is not None else None}" for k, v in sorted(options.items()))


def _class_lines(classes: Sequence[dict[str, Any]]) -> list[str]:
    """A count, the range of samples per class and the first few classes (never the whole list)."""
    if not classes:
        return ["  classes      0"]
    if isinstance(classes, ClassList):
        lo, hi = classes.count_range()
    else:  # a description read back from --json
        lo, hi = min(c["samples"] for c in classes), max(c["samples"] for c in classes)
    lines = [f"  classes      {len(classes)} ({lo}..{hi} samples each)"]
    shown = classes[:_SHOWN_CLASSES]
    width = max(len(c["name"]) for c in shown)
    for c in shown:
        lines.append(f"    {c['label']:>5}  {c['name']:<{width}}  {c['samples']}")
    if len(classes) > _SHOWN_CLASSES:
        lines.append(f"    ... {len(classes) - _SHOWN_CLASSES} more (--json lists every class)")
    return lines


def field_stats_text(f: dict[str, Any], stats: dict[str, Any]) -> str:
    """What index.json's ``field_stats`` says of the field ``f`` (one schema entry), as one phrase."""
    name = f.get("name")  # index.json's keys are strings: another name has no stats
    st, text = (stats.get(name) if isinstance(name, str) else None) or {}, ""
    if "min_bytes" in st:
        text = f"{st['min_bytes']}..{st['max_bytes']} bytes per sample, {st['bytes']:,} in all"
    if "min_rows" in st:
        text += f"; {st['min_rows']}..{st['max_rows']} rows"
    if "min" in st:
        text += f"; values {st['min']}..{st['max']}"
    if f.get("classes"):
        text += f"; {len(f['classes'])} class names"
    return text.removeprefix("; ")


def _field_lines(fields: list[dict[str, Any]], stats: dict[str, Any]) -> list[str]:
    """The schema, one line per field with what index.json's ``field_stats`` says of it."""
    if not fields:
        return []
    if not stats:  # image + label, as every dataset before fields: one line (the classes follow)
        return ["  fields       " + ", ".join(f"{f.get('name')} ({f.get('type')})" for f in fields)]
    width = max(len(str(f.get("name"))) for f in fields)
    lines = [f"  fields       {len(fields)}"]
    for f in fields:
        lines.append(f"    {str(f.get('name')):<{width}}  {str(f.get('type')):<14} {field_stats_text(f, stats)}".rstrip())
    return lines


def source_line(d: dict[str, Any]) -> str:
    """A complete dataset's source and what its pack did: ``folder /data/train: 3 rejected, ...``."""
    src = d.get("source") or {}
    return (f"{src.get('kind', 'folder')} {src.get('root', '?')}: "
            f"{d['rejected']} rejected, {d['repaired']} repaired, {d['reencoded']} re-encoded")


def render(d: dict[str, Any]) -> str:
    """The text ``pack-dataset info`` prints for a :func:`describe` result."""
    if "splits" in d:
        head = f"{d['path']}: {len(d['splits'])} splits, {d['state']}"
        return "\n\n".join([head] + [render(s) for s in d["splits"]])
    src = d.get("source") or {}
    lines = [d["path"], f"  state        {d['state']}"]
    if d["state"] == "packing":
        lines[-1] = (f"  state        being packed by pid {d['packing_pid']} (another pack-dataset is writing it "
                     "now; wait for it to end)")
    if d["state"] in ("incomplete", "packing"):
        total = d.get("source_images")
        of = f" of {total}" if total is not None else ""
        what = "samples given to the Writer" if src.get("kind") == "writer" else "source images"
        lines.append(f"  progress     {d['source_done']}{of} {what} done at the last checkpoint, "
                     f"{d['samples']} samples written")
        if d["state"] == "incomplete":
            lines.append(f"  resume with  {d['resume']}")
    fmt = f"  format       {d['format']} (spec version {d['spec_version']})"
    if d.get("storage"):
        enc = ", ".join(f"{k} {v}" for k, v in (d["storage"].get("encodings") or {}).items())
        fmt += f", {d['storage'].get('kind', '?')}" + (f": {enc}" if enc else "")
    lines.append(fmt)
    lines.append(f"  split        {d.get('split')}")
    if d["state"] == "complete":
        lines.append(f"  samples      {d['samples']}")
        lines += _generation_lines(d)
        lines += _field_lines(d.get("fields") or [], d.get("field_stats") or {})
        if d["classes"] or any(f.get("name") == "label" for f in d.get("fields") or []):
            lines += _class_lines(d["classes"])
    shards = f", {d['shards']} shard{'s' if d.get('shards') != 1 else ''}" if d.get("shards") else ""
    size = d["bytes_on_disk"]
    lines.append(f"  on disk      {size_text(size)} ({size:,} bytes in {d['files']} files{shards})")
    lines.append(f"  order        {_order(d.get('order'), (d.get('source') or {}).get('kind', 'folder'))}")
    lines.append(f"  source       {source_line(d)}")
    for k, c in enumerate(d.get("converted_from") or []):
        lines.append(f"  {'converted' if k == 0 else '':<12} from {c['format']} dataset {c['path']}")
    lines.append(f"  checksums    {d['checksum']} of every sample" + (" and shard" if d["format"] == "wds" else ""))
    lines.append(f"  options      {_options(d['options'])}")
    if d.get("created_by"):
        lines.append(f"  created by   {d['created_by']}")
    return "\n".join(lines)


def _generation_lines(d: dict[str, Any]) -> list[str]:
    """``generations`` (a dataset grown by appends) and ``append`` (one interrupted) lines."""
    lines = []
    gens = d.get("generations") or []
    if len(gens) > 1:
        lines.append(f"  generations  {len(gens)}: " + ", ".join(
            f"{g['generation']}: {g['num_samples']}"
            + (f" (+{g['added']} on {g['written']})" if g.get("written") else "") for g in gens))
    if d.get("append"):
        a = d["append"]
        lines.append(f"  append       interrupted: {a['given']} samples of generation {a['generation']} given, "
                     f"{a['samples']} written at the last checkpoint; generation {a['generation'] - 1} reads as "
                     "before")
        lines.append(f"  resume with  {a['resume']}")
        lines.append(f"  or undo with {a['roll_back']}")
    return lines


# ---------------------------------------------------------------------------- command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``pack-dataset info``."""
    p.add_argument("path", type=path_or_url,
                   help="dataset folder (complete or interrupted), a folder of split datasets, or an s3:// / "
                        "http(s):// dataset URL (credentials and endpoint from the AWS environment variables)")
    p.add_argument("--json", action="store_true", help="print the description as JSON (for scripts)")


def path_or_url(text: str) -> Path | str:
    """``PATH``: a local folder (``file://`` too) or a remote URL; other schemes: a usage error (exit 2)."""
    try:
        return spec.parse_location(text)
    except spec.UnsupportedLocationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """``pack-dataset info`` with parsed arguments; returns the exit code (2: not a dataset)."""
    try:
        d = describe(args.path)
    except (spec.DatasetFormatError, OSError) as exc:  # remote errors (not found, auth, down) are OSErrors
        print(f"pack-dataset info: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        write_json(d, sys.stdout)
    else:
        print(render(d))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pack-dataset info", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))
