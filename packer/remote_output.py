"""Packing into an object store (``-o s3://bucket/prefix``): stage locally, upload as files close, index last.

Each split is packed exactly as locally, into a staging folder on this
machine (``--stage-dir``, default ``$DATASET_PACKER_STAGE`` or
``~/.cache/dataset-packer/stage/<url>-<hash>``), with the same journal and
the same ``--resume``. On top of that:

* every wds shard is uploaded as soon as a checkpoint makes it durable (a
  background thread, while packing goes on), verified by the object's size,
  recorded in ``uploads.jsonl`` beside the journal (one line appended per
  object), and then deleted from the staging folder, so the staging folder
  holds a few shards, not the dataset;
* once the split is packed, every other file (``data.mdb``/``data.h5``/
  ``images.npy``, the index arrays, ``names.jsonl``, ...) is uploaded
  (multipart above 64 MB: an object appears whole or not at all), and
  ``index.json`` goes LAST: a dataset whose upload was interrupted has no
  ``index.json`` and never opens as complete;
* ``--resume`` re-checks what ``uploads.jsonl`` lists against the store
  (size), continues the local pack from its journal and uploads the rest.
  The objects are the same as an uninterrupted pack's (tested by killing a
  real ``pack-dataset`` process with SIGKILL);
* the staging folder is emptied when the split's ``index.json`` is uploaded,
  and removed once the pack releases its lock.

The staging folder is the pack's local output folder: ``packer.api.pack``
checks, locks and clears it exactly as a local output (``packer.output``), so
a second pack into the same staging folder is refused while the first runs,
and an interrupted pack's staging folder needs ``--resume`` or
``--overwrite``. :class:`StagedOutput` adds the prefix: ``--overwrite``
deletes the objects under it only if every one of them is a file
pack-dataset writes (``index.json`` objects first, after the staging folder
is locked). Plain ``http(s)://`` locations are read-only.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import IO, Any, Callable

from packer.errors import OutputError, OutputExistsError, PackError
from packer.formats.wds import ShardLog
from packer.journal import RECORDS_NAME, Journal
from packer.options import PackOptions, RemoteOptions
from packer.output import SHARD_LOG_NAME, UPLOADS_NAME, UPLOADS_NAME_V1, OutputLock, leftovers
from packer.pipeline import SplitResult
from readers.contract import spec
from readers.contract.locks import LOCK_NAME

log = logging.getLogger(__name__)

__all__ = ["StagedOutput", "default_stage_dir", "UPLOADS_NAME", "STAGE_ENV"]

#: Environment variable naming the staging root (``--stage-dir`` wins over it).
STAGE_ENV = "DATASET_PACKER_STAGE"
#: Never uploaded: the journal, its records, the shard log, the upload journals, LMDB's lock file (readers
#: open it lock-free), the output lock, temp files; index.json goes last on its own.
_LOCAL_ONLY = {spec.STATE_NAME, RECORDS_NAME, SHARD_LOG_NAME, UPLOADS_NAME, UPLOADS_NAME_V1, "lock.mdb", LOCK_NAME}
#: What pack-dataset writes into a dataset folder (for --overwrite's "is this ours?").
_OURS = re.compile(r"(^|/)([^/]+\.(json|jsonl|npy|tar|mdb|h5))$")

#: ``progress(bytes uploaded)`` of a staged output
UploadProgress = Callable[[int], None]
#: ``packer.engines.SplitPacker``: (source, folder, split, writer class, progress, *, output, after_checkpoint)
Engine = Callable[..., SplitResult]


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
    """``uploads.jsonl``: objects of one split already in the store, one line appended (and fsynced)
    per upload, so recording one costs the same however many came before.

    A line is ``{"name", "size", "crc32"}`` or ``{"name", "forget": true}``; a torn last line (a
    crash while it was appended) is ignored: that object is uploaded again. An ``uploads.json``
    of an earlier version is read first.
    """

    def __init__(self, stage: Path) -> None:
        self.path = stage / UPLOADS_NAME
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self.done: dict[str, dict[str, int]] = {}
        try:
            old = json.loads((stage / UPLOADS_NAME_V1).read_text(encoding="utf-8"))
            self.done.update(old if isinstance(old, dict) else {})
        except (OSError, ValueError):
            pass
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                name = rec["name"]
                if rec.get("forget"):
                    self.done.pop(name, None)
                else:
                    self.done[name] = {"size": int(rec["size"]), "crc32": int(rec["crc32"])}
            except (ValueError, KeyError, TypeError):
                log.warning("%s: skipping a damaged line (the object it names is uploaded again)", self.path)

    def _append(self, rec: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "ab")
            self._file.write(b"\n")  # after a torn last line, the next record starts a line of its own
        self._file.write((json.dumps(rec, sort_keys=True) + "\n").encode())
        self._file.flush()
        os.fsync(self._file.fileno())

    def record(self, name: str, size: int, crc32: int) -> None:
        with self._lock:
            self.done[name] = {"size": size, "crc32": crc32}
            self._append({"name": name, "size": size, "crc32": crc32})

    def forget(self, name: str) -> None:
        with self._lock:
            self.done.pop(name, None)
            self._append({"name": name, "forget": True})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class Uploader:
    """Uploads one split's files in a background thread, in the order offered; errors surface on the next call."""

    def __init__(self, store: Any, stage: Path, progress: UploadProgress | None = None) -> None:
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
        self.uploads.close()


# --------------------------------------------------------------------------- the output
class StagedOutput:
    """An ``s3://`` output for ``packer.api.pack``: splits are packed into the local staging folder
    :attr:`folder` (checked, locked and cleared by the caller as any output folder) and uploaded.

    The caller's order: :meth:`check` (read-only, before the staging folder is locked), then
    :meth:`ready` (the staging folder is locked: ``--overwrite`` deletes the old objects), then
    :meth:`pack_split` for each split, then :meth:`close` once the lock is released (also after an error).
    """

    def __init__(self, url: str, options: PackOptions, remote: RemoteOptions) -> None:
        from readers.remote import open_store

        self.options, self.upload_progress = options, remote.upload_progress
        self.store = open_store(url, remote.storage_options, remote.retry)
        stage_dir = remote.stage_dir
        self.folder = Path(stage_dir) if stage_dir is not None else default_stage_dir(self.store.url)
        self.role = f" (the staging folder of {self.store.url})"
        self._old: list[str] = []  # objects --overwrite deletes once the staging folder is ours
        self._staged: list[Path] = []

    def check(self, lock: OutputLock) -> None:
        """May the prefix be written (empty, --resume, or ours with --overwrite)? Nothing is written."""
        store, options = self.store, self.options
        if getattr(store, "read_only", False):
            raise OutputError(f"{store.url}: {store.url.split('://')[0]}:// locations are read-only; "
                              "pack to a local folder or an s3://, gs:// or az:// URL")
        if self.folder.is_dir():
            lock.probe(self.folder)  # a pack running into this staging folder is named first
        try:
            names = store.list()
        except OSError as exc:  # unreachable store, refused credentials, no such bucket: nothing written
            raise OutputError(str(exc)) from exc
        if not names or options.resume:
            return
        if not options.overwrite:
            staged = " and its staging folder holds an interrupted pack" if leftovers(self.folder) else ""
            raise OutputExistsError(f"{store.url} already holds {len(names)} objects{staged}; pass --overwrite to "
                                    "replace them or --resume to finish an interrupted pack")
        foreign = [n for n in names if not _OURS.search(n)]
        if foreign:
            raise OutputExistsError(f"{store.url} holds objects pack-dataset does not write (e.g. {foreign[0]}); "
                                    "refusing to delete them with --overwrite (choose an empty prefix)")
        self._old = names

    def ready(self) -> None:
        """The staging folder is locked and cleared (--overwrite): delete the previous pack's objects,
        ``index.json`` first, so from the first deletion on no split opens as complete."""
        try:
            for name in sorted(self._old, key=lambda n: (not n.endswith(spec.INDEX_NAME), n)):
                self.store.delete(name)
        except OSError as exc:
            raise PackError(f"{self.store.url}: deleting the previous pack's objects failed ({exc}); "
                            "run again with --overwrite") from exc
        if self._old:
            log.info("%s: deleted %d objects of a previous pack (--overwrite)", self.store.url, len(self._old))
        self._old = []

    def pack_split(self, engine: Engine, source: Any, dest: Path, split: str, writer_cls: type,
                   progress: Any) -> SplitResult:
        """Pack one split into ``dest`` (in the staging folder) with the engine, uploading as it goes."""
        store = _child_store(self.store, dest.relative_to(self.folder).as_posix())
        uploading = self.upload_progress(split) if self.upload_progress else None
        self._staged.append(dest)
        try:
            result = _pack_split(store, source, dest, split, self.options, writer_cls, engine, progress, uploading)
        finally:
            if store is not self.store:
                store.close()  # its connections now, not at garbage collection
        _empty(dest)  # everything is in the store; the lock file goes when the lock is released
        log.info("%s: complete (index.json uploaded); staging folder %s emptied", store.url, dest)
        rejects = store.url_of(spec.REJECTS_NAME) if result.rejects_file is not None else None
        repairs = store.url_of(spec.REPAIRS_NAME) if result.repairs_file is not None else None
        return dataclasses.replace(result, out=store.url, rejects_file=rejects, repairs_file=repairs)

    def close(self) -> None:
        """Once the lock is released: close the store's connections; remove the staging folders left empty
        (a failed pack's are not)."""
        self.store.close()
        for folder in [*reversed(self._staged), self.folder]:
            try:
                folder.rmdir()
            except OSError:  # not empty (another pack took it meanwhile), or gone already
                pass


def _child_store(store: Any, rel: str) -> Any:
    if not rel or rel == ".":
        return store
    from readers.remote import open_store

    return open_store(f"{store.url}/{rel}", store.storage_options, store.retry)


def _empty(folder: Path) -> None:
    for name in leftovers(folder):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            continue  # a split folder of its own
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- packing one split
def _shards_closed(uploader: Uploader, store: Any, dest: Path) -> Callable[[Journal], None]:
    """``after_checkpoint`` for wds: every shard the checkpoint closed goes to the store.

    Each checkpoint reads only the shards closed since the previous one (``ShardLog.read``).
    A staged shard (the local writer's) is uploaded from the staging folder. A shard
    with no staged copy that was never offered was put into the store by the task that
    wrote it (``--engine ray``): its object is checked (size) and recorded as uploaded,
    with the CRC-32 the task computed.
    """
    seen = (0, 0)

    def upload_closed(journal: Journal) -> None:
        nonlocal seen
        shards, seen = ShardLog.read(dest, journal.writer or {"shards": []}, seen)
        for shard in shards:
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
                engine: Engine, callback: Any, uploading: UploadProgress | None) -> SplitResult:
    from packer.engines.io import StoreOutput

    output = StoreOutput(store)
    try:
        if options.resume and not (dest / spec.STATE_NAME).exists() and not (dest / spec.INDEX_NAME).exists() \
                and store.exists(spec.INDEX_NAME):
            _fetch_index(store, dest)  # the pipeline compares its settings with this pack's, as locally
            try:
                return engine(source, dest, split, writer_cls, callback, output=output)
            except BaseException:
                _empty(dest)  # only copies of what the store holds
                raise
    except OSError as exc:
        raise PackError(f"{store.url}: {exc}; re-run with --resume") from exc
    dest.mkdir(parents=True, exist_ok=True)
    uploader = Uploader(store, dest, uploading)
    try:
        if options.resume:
            uploader.recheck()

        wds = options.format == "wds"
        result = engine(source, dest, split, writer_cls, callback, output=output,
                        after_checkpoint=_shards_closed(uploader, store, dest) if wds else None)
        _upload_rest(uploader, dest, result.meta)
        store.put(spec.INDEX_NAME, dest / spec.INDEX_NAME)  # last: the dataset is complete from now on
    except OSError as exc:
        raise PackError(f"upload to {store.url} failed: {exc}; re-run with --resume") from exc
    finally:
        uploader.close()
    return result


def _fetch_index(store: Any, dest: Path) -> None:
    """A finished pack's ``index.json``, index arrays and side lists, staged for the pipeline's
    "already complete" check (the data files stay in the store)."""
    dest.mkdir(parents=True, exist_ok=True)
    raw = store.read(spec.INDEX_NAME)
    try:
        meta = json.loads(raw)
        arrays = list(meta.get(spec.ARRAYS_KEY) or spec.REQUIRED_ARRAYS[meta["format"]])
        count = int(meta["num_samples"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PackError(f"{store.url_of(spec.INDEX_NAME)}: unreadable index ({exc}); start again with "
                        "--overwrite") from None
    # an index array is read only up to the size it can have (a misbehaving server's endless body is cut)
    caps = {spec.array_file(a, meta): spec.array_bytes_limit(a, count) for a in arrays if a in spec.ARRAY_DTYPES}
    names = list(caps) + [n for n in (spec.REJECTS_NAME, spec.REPAIRS_NAME) if store.exists(n)]
    for name in names:
        (dest / name).write_bytes(store.read(name, max_bytes=caps.get(name)))
    (dest / spec.INDEX_NAME).write_bytes(raw)  # last: a copy interrupted before this is no index


def _upload_rest(uploader: Uploader, dest: Path, meta: dict[str, Any]) -> None:
    """Every staged file but the journal and index.json (shards already uploaded are skipped); then wait."""
    recorded = spec.recorded_files(meta)  # name -> (bytes, CRC-32): the CRC is reused, not recomputed
    for path in sorted(dest.iterdir()):
        name = path.name
        if path.is_file() and name not in _LOCAL_ONLY and name != spec.INDEX_NAME and not name.endswith(".tmp"):
            uploader.offer(name, recorded.get(name, (None, None))[1], drop_local=name.endswith(".tar"))
    uploader.wait()
