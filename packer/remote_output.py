"""Packing into an object store (``-o s3://bucket/prefix``): stage locally, upload as files close, index last.

Each split is packed exactly as locally, into a staging folder on this
machine (``--stage-dir``, default ``$DATASET_PACKER_STAGE`` or
``~/.cache/dataset-packer/stage/<url>-<hash>``), with the same journal and
the same ``--resume``. On top of that:

* every wds shard is uploaded as soon as a checkpoint makes it durable (a
  background thread, while packing goes on), verified by the object's size,
  recorded in ``uploads.json`` beside the journal, and then deleted from the
  staging folder, so the staging folder holds a few shards, not the dataset;
* once the split is packed, every other file (``data.mdb``/``data.h5``/
  ``images.npy``, the index arrays, ``names.jsonl``, ...) is uploaded
  (multipart above 64 MB: an object appears whole or not at all), and
  ``index.json`` goes LAST: a dataset whose upload was interrupted has no
  ``index.json`` and never opens as complete;
* ``--resume`` re-checks what ``uploads.json`` lists against the store
  (size), continues the local pack from its journal and uploads the rest.
  The objects are the same as an uninterrupted pack's (tested by killing a
  real ``pack-dataset`` process with SIGKILL);
* the staging folder is removed when the split's ``index.json`` is uploaded.

``--overwrite`` deletes the objects under the prefix only if every one of
them is a file pack-dataset writes (``index.json`` objects first). Plain
``http(s)://`` locations are read-only.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Callable

from packer.errors import OutputError, OutputExistsError, PackError
from packer.journal import RECORDS_NAME, Journal
from packer.options import PackOptions
from packer.pipeline import SplitResult
from readers import spec

log = logging.getLogger(__name__)

__all__ = ["pack_remote", "default_stage_dir", "UPLOADS_NAME", "STAGE_ENV"]

#: Environment variable naming the staging root (``--stage-dir`` wins over it).
STAGE_ENV = "DATASET_PACKER_STAGE"
#: In a split's staging folder: the objects uploaded so far (name -> size, crc32).
UPLOADS_NAME = "uploads.json"
#: Never uploaded: the journal, its records, the upload journal, LMDB's lock file (readers open it
#: lock-free), temp files; index.json goes last on its own.
_LOCAL_ONLY = {spec.STATE_NAME, RECORDS_NAME, UPLOADS_NAME, "lock.mdb"}
#: What pack-dataset writes into a dataset folder (for --overwrite's "is this ours?").
_OURS = re.compile(r"(^|/)([^/]+\.(json|jsonl|npy|tar|mdb|h5))$")

Progress = Callable[[int], None]


def default_stage_dir(url: str) -> Path:
    """Where a pack to ``url`` is staged when neither ``--stage-dir`` nor ``$DATASET_PACKER_STAGE`` says."""
    base = os.environ.get(STAGE_ENV)
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "dataset-packer", "stage")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1]).strip("_")[-60:]
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return Path(base) / f"{slug}-{hashlib.sha1((url + ' ' + endpoint).encode()).hexdigest()[:12]}"


# --------------------------------------------------------------------------- upload journal
class Uploads:
    """``uploads.json``: objects of one split already in the store, written atomically after each upload."""

    def __init__(self, stage: Path) -> None:
        self.path = stage / UPLOADS_NAME
        self._lock = threading.Lock()
        try:
            self.done: dict[str, dict[str, int]] = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.done = {}

    def record(self, name: str, size: int, crc32: int) -> None:
        with self._lock:
            self.done[name] = {"size": size, "crc32": crc32}
            spec.write_json_atomic(self.path, self.done)

    def forget(self, name: str) -> None:
        with self._lock:
            self.done.pop(name, None)
            spec.write_json_atomic(self.path, self.done)


class Uploader:
    """Uploads one split's files in a background thread, in the order offered; errors surface on the next call."""

    def __init__(self, store: Any, stage: Path, progress: Progress | None = None) -> None:
        self.store, self.stage, self.progress = store, stage, progress
        self.uploads = Uploads(stage)
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
        self._futures: list[cf.Future] = []
        self.offered: set[str] = set()

    def recheck(self) -> None:
        """Resume: keep only the recorded uploads the store still holds at the recorded size."""
        for name, rec in list(self.uploads.done.items()):
            try:
                ok = self.store.size(name) == rec["size"]
            except FileNotFoundError:
                ok = False
            if ok:
                continue
            self.uploads.forget(name)
            if not (self.stage / name).exists():
                raise PackError(f"{self.store.url_of(name)} was uploaded before the interruption but is now "
                                "missing or changed, and its staged copy is gone; start again with --overwrite")
            log.warning("%s: missing or changed in the store; uploading it again", self.store.url_of(name))

    def offer(self, name: str, crc32: int | None = None, *, drop_local: bool = False) -> None:
        """Upload ``name`` (a file of the staging folder) unless it is already in the store."""
        self.check()
        if name in self.offered:
            return
        self.offered.add(name)
        if name in self.uploads.done:
            if drop_local:
                (self.stage / name).unlink(missing_ok=True)
            return
        self._futures.append(self._pool.submit(self._upload, name, crc32, drop_local))

    def _upload(self, name: str, crc32: int | None, drop_local: bool) -> None:
        path = self.stage / name
        size = path.stat().st_size
        crc = crc32 if crc32 is not None else spec.file_checksum(path)
        self.store.put(name, path, progress=self.progress)
        got = self.store.size(name)
        if got != size:
            raise PackError(f"{self.store.url_of(name)}: uploaded {size} bytes but the store holds {got}; "
                            "re-run with --resume")
        self.uploads.record(name, size, crc)
        if drop_local:
            path.unlink(missing_ok=True)
        log.info("uploaded %s (%d bytes)", self.store.url_of(name), size)

    def check(self) -> None:
        """Raise the first failed upload's error (the pack stops; --resume continues)."""
        for fut in [f for f in self._futures if f.done()]:
            self._futures.remove(fut)
            fut.result()

    def wait(self) -> None:
        for fut in self._futures:
            fut.result()
        self._futures.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- the output prefix
def _check_output(store: Any, options: PackOptions, stage: Path) -> None:
    """Before anything is written: may the prefix be written (empty, --resume, or ours with --overwrite)?"""
    if getattr(store, "read_only", False):
        raise OutputError(f"{store.url}: {store.url.split('://')[0]}:// locations are read-only; "
                          "pack to a local folder or an s3:// URL")
    names = store.list()
    if not names or options.resume:
        return
    if not options.overwrite:
        raise OutputExistsError(f"{store.url} already holds {len(names)} objects; pass --overwrite to replace "
                                "them or --resume to finish an interrupted pack")
    foreign = [n for n in names if not _OURS.search(n)]
    if foreign:
        raise OutputExistsError(f"{store.url} holds objects pack-dataset does not write (e.g. {foreign[0]}); "
                                "refusing to delete them with --overwrite (choose an empty prefix)")
    # index.json first: from the first deletion on, no split opens as complete.
    for name in sorted(names, key=lambda n: (not n.endswith(spec.INDEX_NAME), n)):
        store.delete(name)
    log.info("%s: deleted %d objects of a previous pack (--overwrite)", store.url, len(names))


def _clear_stage(stage: Path, options: PackOptions) -> None:
    """A fresh (not resumed) pack starts from an empty staging folder; only ours is ever deleted."""
    if options.resume or not stage.exists():
        return
    from packer.output import _looks_like_ours

    if any(stage.iterdir()) and not _looks_like_ours(stage):
        raise OutputError(f"{stage}: the staging folder holds files pack-dataset did not write; "
                          "choose another --stage-dir")
    shutil.rmtree(stage)


def _child_store(store: Any, rel: str) -> Any:
    if not rel or rel == ".":
        return store
    from readers.remote import open_store

    return open_store(f"{store.url}/{rel}", store.storage_options, store.retry)


# --------------------------------------------------------------------------- packing
def pack_remote(src: str | os.PathLike, url: str, options: PackOptions, *,
                progress: Callable[[str, Any], Any] | None = None,
                upload_progress: Callable[[str], Progress | None] | None = None,
                storage_options: dict[str, Any] | None = None, stage_dir: str | os.PathLike | None = None,
                retry: Any = None) -> list[SplitResult]:
    """``pack(src, url)`` for an ``s3://`` URL: stage, upload, index.json last (see the module docstring)."""
    from packer.api import WRITERS, plan
    from packer.engines import open_engine
    from readers.remote import open_store

    store = open_store(url, storage_options, retry)
    stage = Path(stage_dir) if stage_dir is not None else default_stage_dir(store.url)
    # The engine connects first: a Ray cluster that cannot be reached changes nothing (as locally).
    with open_engine(options) as pack_split:
        try:
            _check_output(store, options, stage)
        except OSError as exc:  # unreachable store, refused credentials, no such bucket: nothing written
            raise OutputError(str(exc)) from exc
        _clear_stage(stage, options)
        stage.parent.mkdir(parents=True, exist_ok=True)
        jobs = plan(src, stage, options, storage_options=storage_options, retry=retry)
        results = []
        for split, source, dest in jobs:
            split_store = _child_store(store, dest.relative_to(stage).as_posix())
            callback = progress(split, source) if progress else None
            uploading = upload_progress(split) if upload_progress else None
            results.append(_pack_split(split_store, source, dest, split, options, WRITERS[options.format],
                                       pack_split, callback, uploading))
    if stage.exists() and not any(stage.iterdir()):
        stage.rmdir()
    return results


def _shards_closed(uploader: Uploader, store: Any, dest: Path) -> Callable[[Journal], None]:
    """``after_checkpoint`` for wds: every shard the journal lists as closed goes to the store.

    A staged shard (the local writer's) is uploaded from the staging folder. A shard
    with no staged copy that was never offered was put into the store by the task that
    wrote it (``--engine ray``): its object is checked (size) and recorded as uploaded,
    with the CRC-32 the task computed.
    """
    def upload_closed(journal: Journal) -> None:
        for shard in (journal.writer or {}).get("shards", []):
            name = shard["name"]
            if name in uploader.uploads.done or name in uploader.offered or (dest / name).exists():
                uploader.offer(name, int(shard["crc32"]), drop_local=True)
                continue
            got = store.size(name) if store.exists(name) else None
            if got != shard["bytes"]:
                raise PackError(f"{store.url_of(name)}: a task wrote {shard['bytes']} bytes but the store holds "
                                f"{'nothing' if got is None else got}; re-run with --resume")
            uploader.uploads.record(name, got, int(shard["crc32"]))

    return upload_closed


def _pack_split(store: Any, source: Any, dest: Path, split: str, options: PackOptions, writer_cls: type,
                pack_split: Callable[..., SplitResult], callback: Any, uploading: Progress | None) -> SplitResult:
    from packer.engines.io import StoreOutput

    try:
        if options.resume and not (dest / spec.STATE_NAME).exists() and not (dest / spec.INDEX_NAME).exists() \
                and store.exists(spec.INDEX_NAME):
            log.info("%s is already complete; nothing to resume", store.url)
            return _remote_result(split, store, json.loads(store.read(spec.INDEX_NAME)))
    except OSError as exc:
        raise PackError(f"{store.url}: {exc}; re-run with --resume") from exc
    dest.mkdir(parents=True, exist_ok=True)
    uploader = Uploader(store, dest, uploading)
    try:
        if options.resume:
            uploader.recheck()

        wds = options.format == "wds"
        result = pack_split(source, dest, split, writer_cls, callback, output=StoreOutput(store),
                            after_checkpoint=_shards_closed(uploader, store, dest) if wds else None)
        _upload_rest(uploader, dest, result.meta)
        store.put(spec.INDEX_NAME, dest / spec.INDEX_NAME)  # last: the dataset is complete from now on
    except OSError as exc:
        raise PackError(f"upload to {store.url} failed: {exc}; re-run with --resume") from exc
    finally:
        uploader.close()
    shutil.rmtree(dest)
    log.info("%s: complete (index.json uploaded); staging folder %s removed", store.url, dest)
    rejects = store.url_of(spec.REJECTS_NAME) if result.rejects_file is not None else None
    return dataclasses.replace(result, out=store.url, rejects_file=rejects)


def _upload_rest(uploader: Uploader, dest: Path, meta: dict[str, Any]) -> None:
    """Every staged file but the journal and index.json (shards already uploaded are skipped); then wait."""
    crcs = meta.get(spec.FILES_CRC_KEY, {})
    for path in sorted(dest.iterdir()):
        name = path.name
        if path.is_file() and name not in _LOCAL_ONLY and name != spec.INDEX_NAME and not name.endswith(".tmp"):
            uploader.offer(name, crcs.get(name), drop_local=name.endswith(".tar"))
    uploader.wait()


def _remote_result(split: str, store: Any, meta: dict[str, Any]) -> SplitResult:
    src = meta["source"]
    return SplitResult(
        split=split, out=store.url, images=meta["num_samples"], classes=len(meta["classes"]),
        rejected=src["rejected"], changed=meta["stats"]["reencoded"], ignored=src["ignored_files"],
        skipped_links=src["skipped_symlinks"], bytes_in=meta["stats"]["bytes_in"],
        bytes_out=sum(meta.get("files", {}).values()), seconds=0.0, meta=meta)
