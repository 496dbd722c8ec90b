"""Where the packed datasets that ``convert`` and ``merge`` read are: a local folder or a URL
(:func:`locations`), its dataset folders (:func:`dataset_roots`: itself or its split folders; on object storage
the prefix or its split prefixes that hold an ``index.json``), their indexes (:func:`read_dataset`), and the
check that an output does not overlap them (:func:`check_no_overlap`). Every refusal is one line naming the
folder or URL (:class:`~packer.errors.SourceError` / :class:`~packer.errors.OutputError`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from packer.errors import OutputError, SourceError
from packer.options import RemoteOptions
from packer.sources.source import URLRoot
from readers.contract import spec
from readers.contract.locks import lock_holder

__all__ = ["locations", "dataset_roots", "read_dataset", "check_no_overlap"]


def locations(src: str | os.PathLike, out: str | os.PathLike) -> tuple[Path | str, Path | str]:
    """``src`` and ``out`` as the CLI reads them (``readers.contract.location``): a local folder as a Path, a
    URL as a str; an unsupported scheme is a SourceError / OutputError naming it."""
    from readers.contract.location import UnsupportedLocationError, parse_location

    where: list[Path | str] = []
    for value, error in ((src, SourceError), (out, OutputError)):
        try:
            where.append(parse_location(value))
        except UnsupportedLocationError as exc:
            raise error(str(exc)) from None
    return where[0], where[1]


def _remote_roots(url: str, verb: tuple[str, str], remote: RemoteOptions) -> list[Path]:
    """:func:`dataset_roots` of a dataset on object storage (``s3://``, ``gs://``, ``az://``, ``https://``):
    the prefix itself when it holds ``index.json``, else each split prefix that does."""
    from readers.remote import open_store

    try:
        store = open_store(url, remote.storage_options, remote.retry)
    except (OSError, ValueError) as exc:
        raise SourceError(f"{url}: cannot open the source ({exc})") from None
    try:
        if store.exists(spec.INDEX_NAME):
            return [URLRoot(store.url)]  # type: ignore[list-item]  # joins and names like a Path
        names = [] if getattr(store, "read_only", False) else store.list()
    except OSError as exc:  # unreachable store, refused credentials, no such bucket
        raise SourceError(f"{url}: cannot read the source ({exc})") from None
    finally:
        store.close()
    splits = spec.listed_splits(names)
    if splits:
        return [URLRoot(url.rstrip("/")) / s for s in splits]  # type: ignore[misc]
    if any(n.endswith(".tar") or n == spec.NAMES_FILE for n in names):
        raise SourceError(f"{url}: this pack never finished (no {spec.INDEX_NAME}); finish it with --resume "
                          f"before {verb[1]} it")
    raise SourceError(f"{url}: not a packed dataset (no {spec.INDEX_NAME})")


def dataset_roots(src: Path | str, verb: tuple[str, str] = ("convert", "converting"),
                  remote: RemoteOptions | None = None) -> list[Path]:
    """The dataset folders of ``src``: itself, or each of its split folders; SourceError (one line naming
    ``src``) for anything else. ``verb``: the command, and its -ing form, the messages name. ``src`` may be
    a URL (``s3://``, ``gs://``, ``az://``, ``https://``; reached with ``remote``): its roots are then
    :class:`~packer.sources.source.URLRoot` s."""
    if isinstance(src, str):
        return _remote_roots(src, verb, remote or RemoteOptions())
    if not src.exists():
        raise SourceError(f"{src}: no such dataset folder")
    if (src / spec.INDEX_NAME).is_file():
        return [src]
    splits = spec.find_splits(src)
    if splits:
        return [src / s for s in splits]
    if (src / spec.STATE_NAME).exists():
        holder = lock_holder(src)
        if holder is not None:
            raise SourceError(f"{src} is being packed by pid {holder} right now; {verb[0]} it once that pack ends")
        raise SourceError(f"{src}: this pack never finished; finish it with --resume before {verb[1]} it")
    raise SourceError(f"{src}: not a packed dataset (no {spec.INDEX_NAME}); "
                      "to pack an image folder use 'pack-dataset pack'")


def read_dataset(root: Path, remote: RemoteOptions | None = None) -> spec.Index:
    """The index of the dataset folder ``root`` (or of the dataset at a URL, reached with ``remote``);
    SourceError (one line) when it cannot be read."""
    from readers.formats.resolve import resolve_index

    remote = remote or RemoteOptions()
    try:
        return resolve_index(str(root) if isinstance(root, URLRoot) else root, remote.storage_options, remote.retry)
    except (spec.DatasetFormatError, OSError) as exc:
        raise SourceError(str(exc)) from None


def check_no_overlap(out: Path | str, src: Path | str, roots: Sequence[Path]) -> None:
    """OutputError when ``out`` is the source ``src``, holds it, or lies inside one of its dataset folders
    (URLs: the same prefix, or one inside the other; a URL and a local folder never overlap)."""
    if isinstance(out, str) or isinstance(src, str):
        a, b = str(out).rstrip("/") + "/", str(src).rstrip("/") + "/"
        if isinstance(out, str) and isinstance(src, str) and (a.startswith(b) or b.startswith(a)):
            raise OutputError(f"{out} overlaps the source dataset {src}; choose another output prefix")
        return
    if out.resolve() == src.resolve() or src.resolve().is_relative_to(out.resolve()) or any(
            out.resolve().is_relative_to(r.resolve()) for r in roots):
        raise OutputError(f"{out} overlaps the source dataset {src}; choose another output folder")


