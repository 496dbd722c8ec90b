"""``packer.tools.merge.merge(srcs, out)``: packs made in parallel (separate jobs, one format, one schema) joined
into one dataset with one index, without re-encoding anything.

The work is ``convert``'s (:mod:`packer.tools.convert`): the sources are chained, in the order given, into one
:class:`~packer.sources.source.Source` and one prepare stage fed to :func:`packer.pipeline.pack_split`. So a
merge checks every copied sample (and typed field) against the CRC-32 in its source's index and stops at a
mismatch naming the source and the sample; it is deterministic, journaled, resumable (``resume=True``) and
commits ``index.json`` last. The stored bytes are copied, never decoded: the output format is the sources'
(an mmap merge copies pixels, and every source must hold pixels of one size).

What the merged dataset holds:

* the samples of the first source, then of the next, ...; ``names.jsonl`` is their ``names.jsonl`` files
  end to end;
* classes: the first source's, then each class name a later source adds, at the end; the labels of a later
  source are remapped to them (a label is an index into the class list, not part of the stored bytes);
* splits: a source with split folders (``train/``, ``val/``) is merged split by split; every source must
  then have the same splits;
* options: the first source's image options (what the images were packed with), with those of ``options``
  that a merge takes (those ``pack-dataset convert`` takes: shards, workers, checkpoints, overwrite/resume).

Refused, in one line naming the source and what differs, before anything is written
(:class:`~packer.errors.UsageError`): a source of another format, another field schema (field names, order,
types, class names of a field other than ``label``), other splits, an mmap source of another pixel size, a
source given twice, an output that overlaps a source.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from packer.errors import SourceError, UsageError
from packer.options import PackOptions
from packer.pipeline import PackProgress, SplitResult
from packer.sources.source import Source
from packer.tools.convert import Job, conversion_options, pack_jobs
from packer.tools.convert_sources import check_no_overlap, dataset_roots, read_dataset
from readers.contract import spec
from readers.contract.fields import Field, Schema

__all__ = ["merge", "merge_format"]

_VERB = ("merge", "merging")


def _datasets(src: Path) -> dict[str, spec.Index]:
    """split name -> index of the dataset folder ``src`` (one entry, keyed ``""``, when it has no splits),
    each index range-checked as the readers check it (a label outside the class list cannot be remapped)."""
    from readers.contract.checks import check_index

    roots = dataset_roots(src, _VERB)
    out = {}
    for root in roots:
        index = read_dataset(root)
        try:
            check_index(index)
        except spec.DatasetFormatError as exc:
            raise SourceError(str(exc)) from None
        out["" if root == src else root.name] = index
    return out


def merge_format(srcs: Sequence[str | os.PathLike]) -> str:
    """The format of the first dataset of ``srcs``: what :func:`merge` writes when no options are given."""
    if not srcs:
        raise UsageError("merge: no datasets given; name at least one packed dataset")
    return next(iter(_datasets(Path(srcs[0])).values())).format


def _field_text(f: Field) -> str:
    return f"{f.type.name}" + (f" with classes {dict(f.classes)}" if f.classes is not None else "")


def _check_schema(index: spec.Index, first: spec.Index) -> None:
    """UsageError naming ``index``'s folder and the first field that differs from ``first``'s schema (the
    classes of the ``label`` field may differ: they are merged, the labels remapped)."""
    a = Schema.from_index(first.meta, str(first.location))
    b = Schema.from_index(index.meta, str(index.location))
    hint = f"merge joins datasets of one schema ({', '.join(a.names)} in {first.root})"
    for k in range(max(len(a), len(b))):
        fa = a.fields[k] if k < len(a) else None
        fb = b.fields[k] if k < len(b) else None
        if fa is None:
            assert fb is not None
            raise UsageError(f"{index.root}: field {fb.name!r} is not in {first.root}; {hint}")
        if fb is None:
            raise UsageError(f"{index.root}: field {fa.name!r} is missing; {hint}")
        if fa.name != fb.name:
            where = f"field {fb.name!r} where {first.root} has {fa.name!r}"
            raise UsageError(f"{index.root}: {where} (field {k + 1}); {hint}")
        label = fa is a.labels_field and fb is b.labels_field
        if fa.type != fb.type or (not label and fa.classes != fb.classes):
            raise UsageError(f"{index.root}: field {fb.name!r} is {_field_text(fb)}, {_field_text(fa)} in "
                             f"{first.root}; {hint}")


def _pixel_size(index: spec.Index) -> int | None:
    """An mmap dataset's ``resize`` (every sample N x N), or None (each sample its own size)."""
    resize = (index.meta.get("options") or {}).get("resize")
    return int(resize) if resize is not None else None


def merge(srcs: Sequence[str | os.PathLike], out: str | os.PathLike, options: PackOptions | None = None, *,
          progress: Callable[[str, Source], PackProgress | None] | None = None) -> list[SplitResult]:
    """Join the packed datasets ``srcs`` (one format, one schema), in that order, into one dataset at ``out``
    (split by split when they have splits); one :class:`~packer.pipeline.SplitResult` per split written.

    ``options``: the output format (it must be the sources'; default: :func:`merge_format`), shards, workers,
    checkpoints, ``overwrite`` / ``resume`` as for ``convert``. Raises :class:`~packer.errors.SourceError` for
    a source that is not a readable, finished packed dataset, :class:`~packer.errors.UsageError` for sources
    that differ (format, field, splits, pixel size) or are given twice, :class:`~packer.errors.OutputError` /
    :class:`~packer.errors.OutputExistsError` for an output that overlaps a source or exists, and
    :class:`~packer.errors.PackError` when the work fails part-way (a source sample or field whose CRC-32
    differs from its index, named; an I/O error): the output is then resumable with ``resume=True``.
    """
    if not srcs:
        raise UsageError("merge: no datasets given; name at least one packed dataset")
    paths, out = [Path(s) for s in srcs], Path(out)
    seen: dict[Path, Path] = {}
    for p in paths:
        if p.resolve() in seen:
            raise UsageError(f"{p}: given twice (as {seen[p.resolve()]}); name each dataset once")
        seen[p.resolve()] = p
    datasets = [_datasets(p) for p in paths]
    for p, found in zip(paths, datasets):
        check_no_overlap(out, p, [Path(index.root) for index in found.values()])
    first = datasets[0]
    options = options if options is not None else PackOptions(format=next(iter(first.values())).format)
    for p, found in zip(paths, datasets):
        if found.keys() != first.keys():
            def show(d: dict[str, spec.Index]) -> str:
                return "splits " + ", ".join(sorted(d)) if "" not in d else "no splits"

            raise UsageError(f"{p}: {show(found)}, {paths[0]} has {show(first)}; merge joins datasets split by "
                             "split: give datasets with the same splits")
    jobs = []
    for split, head in first.items():
        chain = tuple(found[split] for found in datasets)
        for index in chain:
            if index.format != options.format:
                raise UsageError(f"{index.root}: a {index.format} dataset, not {options.format}; merge copies the "
                                 f"stored bytes into their own format (convert it first: pack-dataset convert "
                                 f"{index.root} -f {options.format})")
            _check_schema(index, head)
            if index.format == "mmap" and _pixel_size(index) != _pixel_size(head):
                raise UsageError(f"{index.root}: pixels resized to {_pixel_size(index)}, to {_pixel_size(head)} "
                                 f"in {head.root}; merge does not resize (convert one with --resize first)")
        opts = conversion_options(head.meta.get("options", {}), options)
        if opts.format == "mmap":
            if opts.resize not in (None, _pixel_size(head)):
                raise UsageError(f"resize={opts.resize}: the sources hold pixels resized to {_pixel_size(head)}; "
                                 "merge does not resize (leave resize out)")
            opts = replace(opts, resize=_pixel_size(head))
        dest = out / split if split else out
        jobs.append(Job(head.meta.get("split") or split or Path(head.root).name, chain, dest, opts, kind="merged",
                        details={"sources_given": [str(p) for p in paths], "output": str(out)}))
    from packer.api import FolderOutput

    return pack_jobs(FolderOutput(out), options, jobs, "merging", progress)
