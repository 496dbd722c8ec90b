"""Which shards ``pack-dataset index SHARDS`` reads: a folder, a glob, a brace pattern, a list file.

Each SHARDS argument is a local path or an ``s3://`` / ``gs://`` / ``az://`` / ``https://`` URL:

* a folder (or a URL prefix): its ``.tar`` files (a store: every ``.tar`` object under the prefix);
* a glob, ``shards/*.tar``, ``s3://bucket/laion/0*.tar`` (in a store: matched against a listing);
* a brace pattern, ``shard-{000000..000999}.tar`` (zero-padded ranges) or ``{a,b}``, expanded as
  webdataset and the ``braceexpand`` package expand it, without any listing;
* a ``.tar`` file or object;
* any other local file: a list file, one path or URL per line (relative lines are relative to
  the list file's folder; blank lines and ``#`` comments skipped).

:func:`list_shards` returns the shards' common folder (``base``) and each shard's path under it.
"""

from __future__ import annotations

import fnmatch
import glob
import itertools
import os
import re
from pathlib import Path
from typing import Any

from packer.errors import SourceError, UsageError
from packer.tools.index_scan import GZIP_HINT, is_gzip_name
from readers.contract import spec

__all__ = ["list_shards", "expand_braces"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)\Z")
_GLOB = re.compile(r"[*?\[]")


def expand_braces(text: str) -> list[str]:
    """``a-{00..02}.tar`` -> ``a-00.tar``, ``a-01.tar``, ``a-02.tar``; ``{x,y}`` -> both; several braces multiply."""
    parts: list[list[str]] = []
    pos = 0
    for m in _BRACE.finditer(text):
        parts.append([text[pos:m.start()]])
        body = m.group(1)
        r = _RANGE.match(body)
        if r:
            lo, hi = int(r.group(1)), int(r.group(2))
            width = len(r.group(1)) if r.group(1).startswith("0") else 0
            step = 1 if hi >= lo else -1
            parts.append([str(v).zfill(width) for v in range(lo, hi + step, step)])
        elif "," in body:
            parts.append(body.split(","))
        else:
            parts.append(["{" + body + "}"])
        pos = m.end()
    parts.append([text[pos:]])
    return ["".join(p) for p in itertools.product(*parts)]


def _remote(text: str, storage_options: Any) -> list[str]:
    if _BRACE.search(text):
        return expand_braces(text)
    if _GLOB.search(text):
        head = text[:_GLOB.search(text).start()]  # type: ignore[union-attr]
        parent = head[:head.rfind("/")]
        pattern = text[len(parent) + 1:]
        return [f"{parent}/{n}" for n in _listing(parent, storage_options) if fnmatch.fnmatchcase(n, pattern)]
    if text.lower().endswith(".tar") or is_gzip_name(text):
        return [text]
    url = text.rstrip("/")
    return [f"{url}/{n}" for n in _listing(url, storage_options) if n.lower().endswith(".tar") or is_gzip_name(n)]


def _listing(url: str, storage_options: Any) -> list[str]:
    """The object names under ``url``, sorted (the store closed after)."""
    from readers.remote import open_store

    store = open_store(url, storage_options)
    try:
        return sorted(store.list())
    finally:
        store.close()


def _local(text: str) -> list[str]:
    if _BRACE.search(text):
        return [os.path.abspath(p) for p in expand_braces(text)]
    if _GLOB.search(text):
        return sorted(os.path.abspath(p) for p in glob.glob(text))
    path = Path(text)
    if path.is_dir():
        return sorted(os.path.abspath(e.path) for e in os.scandir(path) if e.is_file() and not e.name.startswith(".")
                      and (e.name.lower().endswith(".tar") or is_gzip_name(e.name)))
    if not path.exists():
        raise UsageError(f"{text}: no such file or folder")
    if text.lower().endswith(".tar") or is_gzip_name(text):
        return [os.path.abspath(text)]
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line if spec.is_remote(line) or os.path.isabs(line) else str(path.parent.absolute() / line))
    return out


def list_shards(sources: list[str], storage_options: Any = None) -> tuple[str, list[str]]:
    """(base: the shards' common folder or URL prefix, each shard's path under it), in the order given."""
    locations: list[str] = []
    for text in sources:
        found = _remote(text, storage_options) if spec.is_remote(text) else _local(text)
        if not found:
            raise UsageError(f"{text}: no .tar shards there")
        locations += found
    for loc in locations:
        if is_gzip_name(loc):
            raise SourceError(f"{loc}: compressed; {GZIP_HINT}")
    if len(set(locations)) != len(locations):
        dup = next(x for x in locations if locations.count(x) > 1)
        raise UsageError(f"{dup}: given twice")
    remote = {spec.is_remote(x) for x in locations}
    if len(remote) > 1:
        raise UsageError("SHARDS mixes local paths and URLs: index each place separately")
    if remote == {True}:
        parents = [x.rsplit("/", 1)[0] for x in locations]
        base = os.path.commonpath([p.replace("://", ":/", 1) for p in parents]).replace(":/", "://", 1)
        if "://" not in base or base.endswith(":"):
            raise UsageError("SHARDS lie in different stores or buckets: index each one separately")
    else:
        base = os.path.commonpath([os.path.dirname(x) for x in locations])
    names = [x[len(base):].lstrip("/") for x in locations]
    for x, name in zip(locations, names):
        spec.check_member_name(name, f"{x}: shard")
    return base, names
