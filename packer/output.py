"""Output-folder policy: may ``out`` be written, who holds it, and what may ``--overwrite`` delete.

**Lock.** A pack (fresh, ``--resume`` or ``--overwrite``) holds an exclusive
``fcntl.flock`` on ``.pack-lock`` inside the output folder, and inside each
split folder it writes, for its whole run; the file holds the holder's pid.
A second pack into the same folder stops at once with exit code 2, naming
the folder and that pid. The lock file is removed when the pack ends (a
``kill -9`` leaves it behind: a stale lock file is free and ignored). Forked
worker processes close their copy of the descriptor, so a lock dies with
the pack that took it.

**Overwrite.** ``--overwrite`` deletes only files it knows to be the
previous pack's: the names a dataset folder holds (index, journal, side
files, index arrays, the format's data files, the shards its index or
journal names, the open shard of an interrupted ``wds`` pack), in a folder
that shows it is ours (an ``index.json``, a ``pack-state.json``, a lock
file or a ``rejects.jsonl`` of ours), or split folders that are each such
a folder. Anything else
in the folder (a file or folder it does not know) makes it refuse, naming
that entry, and nothing is deleted.

**Re-run without a flag.** A folder that holds only the rejects list of a pack whose every
image was rejected (:func:`failed_report`) is replaced by the same command: nothing of a
dataset is lost. A folder holding an interrupted pack (a journal, no index) is refused with
a line that says so and names ``--resume``; any other non-empty folder "already exists".
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from packer.errors import OutputError, OutputExistsError
from packer.formats.fieldstore import is_field_file
from packer.options import PackOptions
from readers.contract import spec
from readers.contract.generations import is_generation_file
# The lock file a running pack holds in each folder it writes is the on-disk contract's (readers see it).
from readers.contract.locks import LOCK_NAME, lock_holder, lock_pid, try_lock

__all__ = ["prepare_output", "OutputLock", "OutputBusyError", "SHARD_LOG_NAME", "UPLOADS_NAME",
           "UPLOADS_NAME_V1", "APPEND_STATE_NAME", "known_names", "leftovers", "start_writeback", "failed_report"]

#: A wds pack in progress: one JSON line per closed shard (``packer.formats.wds``).
SHARD_LOG_NAME = "shard-log.jsonl"
#: A staged ``s3://`` pack: one JSON line per object uploaded so far (``packer.remote_output``);
UPLOADS_NAME = "uploads.jsonl"
#: ... and the JSON object earlier versions rewrote whole after each upload (still read on resume).
UPLOADS_NAME_V1 = "uploads.json"
#: An append in progress: the generation it adds to and what that generation held (``packer.appending``).
APPEND_STATE_NAME = "append-state.json"
#: Written by the packer beside a dataset's spec files (journal.RECORDS_NAME, LMDB's lock table, the
#: shard log, the upload logs of a staging folder).
_PACKER_FILES = ("records.bin", "lock.mdb", SHARD_LOG_NAME, UPLOADS_NAME, UPLOADS_NAME_V1, APPEND_STATE_NAME)


class OutputBusyError(OutputError):
    """Another pack holds the output folder."""


def known_names() -> set[str]:
    """Every fixed file name a dataset folder of any format may hold (shards aside)."""
    names = {spec.INDEX_NAME, spec.STATE_NAME, spec.NAMES_FILE, spec.REJECTS_NAME, spec.HDF5_CHUNK_TABLE,
             LOCK_NAME, *_PACKER_FILES, *spec.DATA_FILE.values(), *(spec.array_file(a) for a in spec.ARRAY_DTYPES)}
    names |= {getattr(spec, n) for n in ("REPAIRS_NAME", "WIDS_INDEX_NAME") if hasattr(spec, n)}
    # temp files renamed into place: index.json, the journal, and each index array (spec.write_index)
    return names | {n + ".tmp" for n in (spec.INDEX_NAME, spec.STATE_NAME, *map(spec.array_file, spec.ARRAY_DTYPES))}


# ---------------------------------------------------------------- early writeback
def _sync_file_range() -> Any:
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages in ``[offset, offset + nbytes)`` (``nbytes``
    0: to the end of the file) to disk now, without waiting (Linux ``sync_file_range`` with
    ``SYNC_FILE_RANGE_WRITE``; nothing elsewhere).

    Not a durability step -- the fsync at a checkpoint still is. Below the kernel's dirty
    thresholds nothing reaches the disk until that fsync, which then waits for the whole
    shard; started as the bytes are written, the disk works while the packer does, and the
    fsync finds little left to wait for.
    """
    if _SYNC_FILE_RANGE is not None and nbytes >= 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # a failure only loses the head start


# ---------------------------------------------------------------- the lock
_HELD: set[int] = set()  # descriptors of lock files this process holds


def _close_in_child() -> None:
    for fd in list(_HELD):  # a forked child never holds its parent's locks
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class OutputLock:
    """Exclusive locks on output folders, held until :meth:`release` (a context manager)."""

    def __init__(self) -> None:
        self._held: dict[Path, int] = {}

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def holds(self, folder: Path) -> bool:
        return Path(folder) in self._held

    def probe(self, folder: Path) -> None:
        """Raise OutputBusyError if another process holds ``folder``'s lock (writes nothing)."""
        if Path(folder) in self._held:
            return
        pid = lock_holder(folder)
        if pid is not None:
            raise OutputBusyError(_busy(folder, pid))

    def acquire(self, folder: Path) -> None:
        """Create ``folder`` if missing (its parent must exist), then lock it and write our pid."""
        folder = Path(folder)
        if folder in self._held:
            return
        try:
            folder.mkdir(exist_ok=True)
            while True:
                fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
                try:
                    self._flock(fd, folder)
                    if _same_file(fd, folder / LOCK_NAME):
                        break
                except BaseException:
                    os.close(fd)
                    raise
                os.close(fd)  # the holder removed the file as we locked it: lock the new one
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            raise OutputError(f"{folder}: cannot write into the output folder ({exc.strerror or exc})") from None
        self._held[folder] = fd
        _HELD.add(fd)

    @staticmethod
    def _flock(fd: int, folder: Path) -> None:
        if not try_lock(fd):
            raise OutputBusyError(_busy(folder, lock_pid(fd)))

    def release_one(self, folder: Path, *, remove: bool = True) -> None:
        fd = self._held.pop(Path(folder), None)
        if fd is None:
            return
        _HELD.discard(fd)
        try:
            if remove and _same_file(fd, Path(folder) / LOCK_NAME):
                os.unlink(Path(folder) / LOCK_NAME)  # removed while still locked: see acquire's retry
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the flock

    def release(self) -> None:
        for folder in reversed(list(self._held)):
            self.release_one(folder)


def _busy(folder: Path, pid: int | str) -> str:
    return (f"{folder}: another pack-dataset (pid {pid}) is writing this folder; wait for it to end "
            "(or stop it), then run again")


def _same_file(fd: int, path: Path) -> bool:
    try:
        st, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


# ---------------------------------------------------------------- what is ours
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return [e for e in it if e.name != LOCK_NAME]


def leftovers(folder: str | os.PathLike) -> list[str]:
    """Names in ``folder`` besides a lock file ([] for an empty or missing folder)."""
    try:
        return sorted(e.name for e in _entries(Path(folder)))
    except FileNotFoundError:
        return []


def failed_report(folder: str | os.PathLike) -> bool:
    """``folder`` holds nothing but the rejects list a pack whose every image was rejected leaves
    (``packer.pipeline``): one file, ``rejects.jsonl``, whose first line is a reject of ours."""
    folder = Path(folder)
    if leftovers(folder) != [spec.REJECTS_NAME] or not (folder / spec.REJECTS_NAME).is_file():
        return False
    try:
        with open(folder / spec.REJECTS_NAME, "rb") as f:
            first = json.loads(f.readline(1 << 16))
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and {"path", "reason"} <= first.keys()


def _interrupted(out: Path) -> str:
    """What of an interrupted pack ``out`` holds (a journal and no index, in it or in its split
    folders): ``"12 samples written"``, ``"split train: 12 samples written"``; "" when none."""
    found = []
    for folder in [out, *sorted(p for p in out.iterdir() if p.is_dir() and not p.is_symlink())]:
        if os.path.lexists(folder / spec.STATE_NAME) and not os.path.lexists(folder / spec.INDEX_NAME):
            state = _read_json(folder / spec.STATE_NAME)
            done = state.get("done") if isinstance(state, dict) else None
            what = f"{done:,} samples written" if isinstance(done, int) else "its journal is damaged"
            found.append(what if folder == out else f"split {folder.name}: {what}")
        if folder == out and found:
            break
    return "; ".join(found)


def _shard_names(folder: Path, splits: set[str]) -> tuple[set[str], list[re.Pattern]]:
    """Shard file names that the folder's index or journal names, and patterns of its split's shards."""
    names: set[str] = set()
    for doc in (_read_json(folder / spec.INDEX_NAME), _read_json(folder / spec.STATE_NAME)):
        if not isinstance(doc, dict):
            continue
        if isinstance(doc.get("split"), str):
            splits.add(doc["split"])
        writer: dict[str, Any] = doc["writer"] if isinstance(doc.get("writer"), dict) else {}
        for shard in list(doc.get("shards") or []) + list(writer.get("shards") or []):
            if isinstance(shard, dict) and isinstance(shard.get("name"), str):
                names.add(shard["name"])
    # the open shard's temp file; the Ray engine's shard tasks write <shard>.<12 hex digits>.tmp
    patterns = [re.compile(re.escape(s) + r"-\d{6}\.tar(\.[0-9a-f]{12}\.tmp|\.tmp)?") for s in splits if s]
    return names, patterns


def _owned(folder: Path) -> bool:
    """``folder`` shows it is ours: an index, a journal, a lock file, or the rejects list that a
    pack whose every image was rejected leaves."""
    return any(os.path.lexists(folder / n) for n in (spec.INDEX_NAME, spec.STATE_NAME, LOCK_NAME, spec.REJECTS_NAME))


def _foreign(folder: Path, split_hint: str | None) -> str | None:
    """The first entry of dataset folder ``folder`` that is not a file a pack wrote (None: all are)."""
    if not _owned(folder):
        return "" if any(True for _ in _entries(folder)) else None
    known = known_names()
    shards, patterns = _shard_names(folder, {split_hint} if split_hint else set())
    for e in _entries(folder):
        ours = e.is_file(follow_symlinks=False) and (
            e.name in known or is_field_file(e.name) or is_generation_file(e.name) or e.name in shards
            or any(p.fullmatch(e.name) for p in patterns))
        if not ours:
            return e.name
    return None


def _check_overwrite(out: Path, split_hint: str | None) -> list[Path]:
    """The dataset folders ``--overwrite`` will clear (``out``, or its split folders); refuses otherwise."""
    entries = _entries(out)  # a stale lock file of a killed pack aside
    dirs = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    dataset_files = (spec.INDEX_NAME, spec.STATE_NAME, spec.REJECTS_NAME)
    if not dirs or any(os.path.lexists(out / n) for n in dataset_files):
        bad, folders = _foreign(out, split_hint), [out]  # one dataset folder
    else:  # split folders, each a dataset folder of ours
        bad = next((e.name for e in entries if not e.is_dir(follow_symlinks=False)), None)
        folders = dirs
        for d in dirs if bad is None else []:
            inner = _foreign(d, None) if _owned(d) else ""
            if inner is not None:
                bad = f"{d.name}/{inner}" if inner else d.name
                break
    if bad is not None:
        what = f"{out / bad}, which pack-dataset did not write" if bad else "no dataset written by pack-dataset"
        raise OutputExistsError(
            f"{out} is not empty and holds {what}; refusing to delete anything with --overwrite "
            "(move it away, or choose an empty or new output folder)")
    return folders


def _clear(folders: list[Path], out: Path, lock: OutputLock) -> None:
    """Delete the previous pack's files (index first, so the folder stops reading as a dataset)."""
    for folder in folders:
        if folder != out:
            lock.acquire(folder)  # a pack writing straight into this split folder stops us here
        names = sorted((e.name for e in _entries(folder)), key=lambda n: n != spec.INDEX_NAME)
        for name in names:
            (folder / name).unlink()
        spec.fsync_dir(folder)
        if folder != out:
            lock.release_one(folder)
            folder.rmdir()


# ---------------------------------------------------------------- the policy
def prepare_output(out: Path, options: PackOptions, dests: Iterable[Path] = (), lock: OutputLock | None = None,
                   split_hint: str | None = None, role: str = "") -> None:
    """Check that ``out`` may be written, lock it (and the split folders ``dests``), clear it on overwrite.

    Nothing is written before every check has passed (then missing parent
    folders of ``out`` are created). ``lock`` keeps the
    locks for the caller's whole pack; without one they are released on
    return (a check only). ``split_hint``: the split name the new pack
    writes, whose shards ``--overwrite`` may also delete when the old
    journal cannot be read. ``role`` follows ``out`` in the message that asks
    for ``--overwrite`` or ``--resume`` (`` (the staging folder of s3://...)``).
    """
    own = lock if lock is not None else OutputLock()
    try:
        if out.is_symlink() and not out.exists():
            raise OutputError(f"{out} is a symlink to nothing; choose another output path")
        if out.exists() and not out.is_dir():
            raise OutputError(f"{out} exists and is a file; choose another output path")
        folders: list[Path] = []
        if out.exists():
            own.probe(out)
            folders = _check_existing(out, options, split_hint, role)
        else:  # every check passed: missing parent folders are created
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"{out.parent}: cannot create the output's parent folder "
                                  f"({exc.strerror or exc})") from None
        own.acquire(out)
        if folders:
            _clear(folders, out, own)
        for dest in dests:
            if Path(dest) != out:
                own.acquire(Path(dest))
    except PermissionError as exc:
        raise OutputError(f"{exc.filename or out}: cannot use the output folder ({exc.strerror})") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OutputError(f"{out}: no space left to start a pack ({exc.strerror})") from None
        raise
    finally:
        if lock is None:
            own.release()


def _check_existing(out: Path, options: PackOptions, split_hint: str | None, role: str = "") -> list[Path]:
    """Read-only checks of an existing output; the folders to clear (overwrite) or []."""
    try:
        empty = not _entries(out)
    except OSError as exc:
        raise OutputError(f"{out}: cannot read the output folder ({exc.strerror})") from None
    if empty or options.resume:
        return []
    if not options.overwrite:
        if failed_report(out):  # every image of the last pack was rejected: its report only, replaced
            return [out]
        interrupted = _interrupted(out)
        if interrupted:
            raise OutputExistsError(
                f"{out}{role} holds an interrupted pack ({interrupted}); re-run the same command with --resume "
                "to finish it, or with --overwrite to start again")
        raise OutputExistsError(
            f"{out}{role} already exists; pass --overwrite to replace it or --resume to finish an interrupted pack"
        )
    return _check_overwrite(out, split_hint)
