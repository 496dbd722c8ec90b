"""The journal of a pack in progress: ``pack-state.json`` and the side files it vouches for.

While a split is packed its folder holds, besides the format's data files:

* ``records.bin`` -- one :data:`readers.contract.spec.RECORD_DTYPE` record per written
  sample (turned into the index arrays at the end);
* ``names.jsonl`` -- each written sample's source path (kept as is);
* ``rejects.jsonl`` -- the files that could not be packed;
* ``repairs.jsonl`` -- the files stored after a lossless repair;
* ``pack-state.json`` -- the :class:`Journal`: counters, the lengths of the
  four files above and the writer's state, as of the last checkpoint.

At a checkpoint the writer's data is made durable first, then the side
files are fsynced, then the journal is replaced atomically. Resume cuts the
side files back to the journal's lengths (and the writer its data files to
the writer state), so everything past the last checkpoint is dropped.

Resume continues only the same pack: same format, split and options (a
difference is named, flag by flag), and the same source. "Same source"
means the files already packed are unchanged: the journal keeps a hash of
the source list up to its position (``source_prefix``: names, sizes and
labels, and for a folder the files' modification times, so a file rewritten
with the same size is seen); files after it may have changed (one that
vanished or changed while being read stops a pack), and are packed as the
source now is, exactly as a fresh pack of it would.

The journal's size does not grow with the pack: what grows (the wds shard
list) lives in an append-only side file the writer keeps, and the writer
state records only its length.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from json.encoder import encode_basestring_ascii as json_string  # json.dumps(a str), without its per-call setup
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packer.errors import PackError
from packer.options import PackOptions, cli_fields
from packer.output import APPEND_STATE_NAME, SHARD_LOG_NAME, failed_report, leftovers
from packer.sources.source import Source
from readers.contract import spec

__all__ = ["Journal", "SideFiles", "RECORDS_NAME", "option_differences"]

log = logging.getLogger(__name__)

RECORDS_NAME = "records.bin"
#: records kept in memory before they are written (unsynced) to records.bin: a checkpoint every
#: 256 MB of tiny images is ~200k samples, which must not wait in memory as Python tuples
RECORD_BATCH = 4096


def option_differences(then: dict[str, Any], now: dict[str, Any]) -> str:
    """The recorded options that differ, spelled as flags: ``--shard-count 9 then, 10 now; ...``."""
    flags = {f.name: flag for f, flag in cli_fields()}
    parts = []
    for key in sorted(set(then) | set(now), key=lambda k: list(flags).index(k) if k in flags else len(flags)):
        a, b = then.get(key, "unset"), now.get(key, "unset")
        if a == b:
            continue
        flag = flags.get(key)
        show = (lambda v: v if v in (None, "unset") or isinstance(v, bool) else flag.show(v)) if flag else str
        parts.append(f"{flag.flags[-1] if flag else key} {show(a)} then, {show(b)} now")
    return "; ".join(parts)


@dataclass
class Journal:
    """Progress of one split's pack as of its last checkpoint (``pack-state.json``)."""

    identity: dict[str, Any]  # format, split, options, source fingerprint: must match to resume
    done: int = 0  # samples written
    next_source: int = 0  # source position to continue from (written + rejected)
    bytes_in: int = 0  # source bytes consumed
    changed: int = 0  # samples stored re-encoded
    rejected: int = 0
    repaired: int = 0  # samples stored after a lossless repair (repairs.jsonl)
    encodings: dict[str, int] = field(default_factory=dict)  # stored extension -> samples
    records_len: int = 0  # byte lengths of the side files at the checkpoint
    names_len: int = 0
    rejects_len: int = 0
    repairs_len: int = 0
    writer: dict[str, Any] | None = None  # the writer's checkpoint state
    source_prefix: str = ""  # hash of the source list before next_source (Source.prefix_fingerprint)

    @staticmethod
    def identity_of(split: str, source: Source, options: PackOptions) -> dict[str, Any]:
        """What must match to resume (format, split, options, fingerprint), plus where the source
        is (``source``: for ``pack-dataset info`` to say how to resume; not compared)."""
        return {"format": options.format, "split": split, "options": options.recorded(),
                "fingerprint": source.fingerprint(),
                "source": {**source.describe(), "images": len(source.paths)}}

    @classmethod
    def load(cls, out: Path, identity: dict[str, Any], source: Source | None = None) -> Journal | None:
        """The journal in ``out`` if it belongs to this pack; None when ``out`` is empty.

        Refuses (PackError naming what differs) a journal of another pack, or
        one whose already-packed part of the source changed.
        """
        path = out / spec.STATE_NAME
        if not os.path.lexists(path):
            if failed_report(out):
                raise PackError(f"{out}: nothing to resume: the last pack into it packed nothing (every image was "
                                f"rejected, listed in {out / spec.REJECTS_NAME}); fix the images and run the same "
                                "command without --resume (it replaces that list; no --overwrite needed)")
            if leftovers(out):
                raise PackError(f"{out}: nothing to resume (no {spec.STATE_NAME} journal); "
                                "start again with --overwrite")
            return None
        state = cls._read(path)
        for key in ("format", "split"):
            if state.get(key) != identity[key]:
                raise PackError(f"{out}: the interrupted pack wrote {key} {state.get(key)!r}, this one asks for "
                                f"{identity[key]!r}; resume with the same command, or start again with --overwrite")
        diff = option_differences(state["options"], json.loads(json.dumps(identity["options"])))
        if diff:
            raise PackError(f"{out}: the interrupted pack used other options ({diff}); "
                            "resume with the same options, or start again with --overwrite")
        if state["fingerprint"] != identity["fingerprint"]:
            cls._check_prefix(out, state, source)
        elif source is not None:
            cls._check_times(out, state, source)
        defaults = asdict(cls(identity))  # journals written before a field existed lack it
        counters = {f.name: state.get(f.name, defaults[f.name]) for f in fields(cls) if f.name != "identity"}
        return cls(identity=identity, **counters)

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(state, dict):
                raise ValueError(f"a JSON {type(state).__name__}, not an object")
            for key, kind in (("options", dict), ("fingerprint", str), ("done", int), ("next_source", int)):
                if not isinstance(state.get(key), kind):
                    raise ValueError(f"{key!r} is missing or not a {kind.__name__}")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise PackError(f"{path} is damaged ({exc}): the interrupted pack cannot be resumed; "
                            "start again with --overwrite") from None
        return state

    @staticmethod
    def _check_times(out: Path, state: dict[str, Any], source: Source) -> None:
        """The same file list: refuse if a file already packed was rewritten (its modification time)."""
        n, prefix = state["next_source"], state.get("source_prefix")
        if not isinstance(prefix, str) or "/" not in prefix or not 0 <= n <= len(source.paths):
            return  # a journal of an earlier version, or a source without times
        now = source.prefix_fingerprint(n)
        if "/" in now and now != prefix:
            culprit = source.changed_last(n)
            which = f"; the one changed last is {source.root / culprit}" if culprit else ""
            raise PackError(f"{out}: a source file already packed (one of the first {n}) was modified since: same "
                            f"name and size, another modification time{which}; start again with --overwrite")

    @staticmethod
    def _check_prefix(out: Path, state: dict[str, Any], source: Source | None) -> None:
        """The source changed: resume only if the part already packed is the same."""
        n, prefix = state["next_source"], state.get("source_prefix")
        now = source.prefix_fingerprint(n) if source is not None and 0 <= n <= len(source.paths) else None
        if source is not None and now is not None and prefix and now.split("/")[0] == prefix.split("/")[0]:
            Journal._check_times(out, state, source)
            log.warning("%s: the source changed after the %d files already packed; resuming with the source "
                        "as it is now", out, n)
            return
        then = (state.get("source") or {}).get("images") if isinstance(state.get("source"), dict) else None
        if source is not None and source.order.get("kind", "source") != "source" and then != len(source.paths):
            raise PackError(f"{out}: the source folder holds {len(source.paths)} images, {then} when the pack "
                            "started, and a shuffled order (--order shuffled) changes with the count; restore the "
                            "source and --resume, or start again with --overwrite")
        raise PackError(f"{out}: the source folder changed in the part already packed (its first {n} files); "
                        "start again with --overwrite")

    def save(self, out: Path) -> None:
        """Replace ``pack-state.json`` atomically (after the data it describes is durable)."""
        state = asdict(self)
        state.update(state.pop("identity"))
        spec.write_json_atomic(out / spec.STATE_NAME, state)

    @staticmethod
    def discard(out: Path) -> None:
        """Remove the journal and the records once the index is committed."""
        for name in (RECORDS_NAME, SHARD_LOG_NAME, spec.STATE_NAME, spec.STATE_NAME + ".tmp", APPEND_STATE_NAME):
            (out / name).unlink(missing_ok=True)


def _truncate(path: Path, length: int) -> None:
    with open(path, "ab") as f:
        f.truncate(length)


class SideFiles:
    """``records.bin``, ``names.jsonl``, ``rejects.jsonl`` and ``repairs.jsonl``: appended per sample,
    cut back on resume."""

    def __init__(self, out: Path, journal: Journal) -> None:
        self.paths = (out / RECORDS_NAME, out / spec.NAMES_FILE, out / spec.REJECTS_NAME, out / spec.REPAIRS_NAME)
        lengths = (journal.records_len, journal.names_len, journal.rejects_len, journal.repairs_len)
        for path, length in zip(self.paths, lengths):
            _truncate(path, length)
        files: list[BinaryIO] = []
        try:
            for path in self.paths:
                files.append(open(path, "ab"))
        except BaseException:
            for f in files:
                f.close()
            raise
        self._files = tuple(files)
        self.records, self.names, self.rejects, self.repairs = self._files
        self._pending = np.zeros(RECORD_BATCH, dtype=spec.RECORD_DTYPE)
        self._filled = 0
        self._synced = False  # the first sync makes every file durable (resume may have truncated them)

    def add_sample(self, record: tuple, rel: str) -> None:
        """One written sample: its index record (fields of RECORD_DTYPE, in order) and source path."""
        self._pending[self._filled] = record
        self._filled += 1
        if self._filled == RECORD_BATCH:
            self._drain()
        self.names.write((json_string(rel) + "\n").encode())  # ASCII escapes: any file name round-trips

    def add_reject(self, rel: str, reason: str) -> None:
        self.rejects.write((json.dumps({"path": rel, "reason": reason}) + "\n").encode())

    def add_repair(self, rel: str, sample: int, what: str) -> None:
        self.repairs.write((json.dumps({"path": rel, "sample": sample, "repair": what}) + "\n").encode())

    def sync(self, journal: Journal) -> None:
        """Make everything added so far durable and record the files' lengths in ``journal``."""
        self._drain()
        lengths = (journal.records_len, journal.names_len, journal.rejects_len, journal.repairs_len)
        for f, synced in zip(self._files, lengths):
            f.flush()
            if f.tell() != synced or not self._synced:  # unchanged since the last sync: durable already
                os.fsync(f.fileno())
        self._synced = True
        journal.records_len, journal.names_len, journal.rejects_len, journal.repairs_len = (
            f.tell() for f in self._files)

    def _drain(self) -> None:
        """Write the records kept so far (durable at the next sync; a resume cuts back what is not)."""
        if self._filled:
            self.records.write(self._pending[:self._filled].tobytes())
            self._filled = 0

    def close(self) -> None:
        for f in self._files:
            if not f.closed:
                f.close()

    def abandon(self) -> None:
        """Close after an error without raising another one (a full disk fails the flush again);
        what was not synced is dropped by the next resume anyway."""
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass

    @staticmethod
    def read_records(out: Path) -> np.ndarray:
        """The records, mapped read-only (file-backed, not read into memory; 36 bytes a sample)."""
        path = out / RECORDS_NAME
        count = path.stat().st_size // spec.RECORD_DTYPE.itemsize
        if not count:
            return np.zeros(0, dtype=spec.RECORD_DTYPE)
        return np.memmap(path, dtype=spec.RECORD_DTYPE, mode="r", shape=(count,))
