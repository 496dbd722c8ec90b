"""``Writer``: write a dataset from Python, one sample dict at a time, through the pack's own write stage.

    from packer import Writer, PackOptions

    with Writer("out", format="lmdb", classes=["cat", "dog"]) as w:
        for image, label, caption in produce():
            w.write({"image": image, "label": label, "caption": caption})

The seam: a pack (``packer.pipeline.pack_split``) consumes a prepare stage, an iterator of
:class:`~packer.prepare.workers.Outcome` in source order. A ``Writer`` runs that same
``pack_split`` in one background thread over a source that grows as samples are written, and
its prepare stage is a bounded queue fed by :meth:`Writer.write`. So the format writers
(``packer.formats``), the journal and its checkpoints (``packer.journal``), the output policy and
lock (``packer.output``), the CRCs, the index (written last, atomically, by a clean close only)
and ``resume`` are the pack's, not copies. Each sample is checked in the caller's thread
(``write`` raises at once, naming the sample and field): its image by
``packer.prepare.workers.outcome_of`` (the pack's validation and normalization: ``max_side``,
``resize``, re-encoding, rejects), its other fields by their types' ``encode``
(``readers.contract.fields``, as a manifest pack does).

A sample is a dict: ``image`` (encoded bytes, a PIL image or an ``HxWx3`` / ``HxW`` uint8 array; a
PIL image or array is encoded as a lossless PNG, as a pack stores a BMP), an optional integer
``label`` (``classes=`` names them), an optional ``__key__`` (the sample's name in
``names.jsonl``; default its position) and any typed fields (``fields=``, else inferred from the
first sample: ``str`` -> text, ``int`` -> int, ``float`` -> float, ``bool`` -> uint8, dict / list ->
json, ``bytes`` -> bytes, a numpy array -> ``DTYPE[*,...]`` (state ``DTYPE[N]`` for a fixed
column), a numpy scalar -> its dtype); ``packer.samples`` makes the schema and the image bytes.
``out`` may be an ``s3://``, ``gs://`` or ``az://`` prefix: then the write is a pack to object storage
(``packer.remote_output``: staged locally, uploaded, ``index.json`` last, resumable).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Iterator

from packer import appending
from packer.api import WRITERS
from packer.errors import PackError, UsageError
from packer.formats.lmdb import StreamLmdbWriter
from packer.journal import Journal, SideFiles
from packer.options import PackOptions, RemoteOptions
from packer.output import OutputLock, prepare_output
from packer.pipeline import SplitResult, pack_split
from packer.remote_output import StagedOutput
from packer.samples import image_bytes, infer_schema
from packer.prepare.images import ImageOptions
from packer.prepare.readahead import Handoff
from packer.prepare.workers import Outcome, outcome_of
from packer.sources.source import Source
from readers.contract import spec
from readers.contract.location import parse_location
from readers.contract.fields import FieldType, FieldValueError, Schema
from readers.contract.messages import one_line

__all__ = ["Writer", "SampleError", "infer_schema"]

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "reject")
#: Bytes of checked samples waiting for the write thread (a bounded window, never an unbounded pile). They go
#: over in chunks, in bursts (packer.prepare.readahead.Handoff): while the thread waits on LMDB's commit or an
#: fsync the caller goes on checking the next samples, and the two seldom wait on each other for the GIL.
_QUEUE_BYTES = 64 << 20
#: Into LMDB the hand-over is gated (``Handoff(gated_below=...)``): once this many chunks wait (about one 8 MB
#: transaction of 48 KB samples, and one more), the caller goes on only while the write thread commits. A prototype
#: of the gate chose the number (2,000 samples, 9 writes each, interleaved, median wall ms): ungated 204; gated
#: below 6 chunks 152, 8: 169, 12: 184, 15: 190.
_GATED_BELOW = 6
_ABORT = object()  # the caller aborts: the write thread stops there


class SampleError(PackError, ValueError):
    """A sample that cannot be written (``on_error="raise"``): one line naming its position and field."""


class _Aborted(Exception):
    """The ``with`` block of a Writer ended by an exception: the write thread stops, resumable."""


# ------------------------------------------------------------------------------------ the growing source
class _Column(Sequence):
    """A source column that grows as samples are written (the caller's thread appends); the write
    thread reads each entry once and drops them, 64 at a time (:meth:`forget_before`), so memory stays flat."""

    def __init__(self) -> None:
        self.size = 0  # positions so far (a resume starts past 0)
        self._base = 0  # the position of _kept[0]
        self._kept: deque[Any] = deque()  # append and popleft are thread-safe

    def restart(self, start: int) -> None:
        self.size = self._base = start

    def append(self, value: Any) -> None:
        self._kept.append(value)
        self.size += 1

    def forget_before(self, pos: int) -> None:
        while self._base < pos and self._kept:
            self._kept.popleft()
            self._base += 1

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: Any) -> Any:
        try:
            j = i - self._base
        except TypeError:  # a slice
            j = -1
        if not 0 <= j < len(self._kept):
            raise IndexError(f"position {i}: a Writer's source keeps only the samples not yet written")
        return self._kept[j]


class _StreamSource(Source):
    """A :class:`Source` whose entries are the samples written so far. Its fingerprint is the schema's
    (and the class names given), so a resume with other fields is refused; the samples themselves are
    the caller's to repeat (``Writer.count``)."""

    def fingerprint(self) -> str:
        text = json.dumps({"fields": self.details["fields"], "classes": self.details.get("classes")}, sort_keys=True)
        return "writer:" + hashlib.sha256(text.encode()).hexdigest()

    def prefix_fingerprint(self, n: int) -> str:
        return ""  # the samples are not known again on resume: the journal checks the schema only

    def describe(self) -> dict[str, Any]:
        return {"root": "packer.Writer", "kind": self.kind, **self.details}  # no path: a resume is the same write

    @property
    def total_bytes(self) -> int:
        return 0


# ------------------------------------------------------------------------------------ the writer
class Writer:
    """Write samples into a dataset folder ``out`` (see the module docstring); a context manager.

    ``format`` overrides ``options.format``; ``options`` are a pack's (``max_side``, ``quality``,
    ``validate``, ``shard_size``, ``checkpoint_bytes``, ...; the order written is the order given).
    ``on_error``: ``"raise"`` (a bad sample raises :class:`SampleError` from :meth:`write`; it is
    not counted) or ``"reject"`` (it becomes a line of ``rejects.jsonl``, counted); :meth:`reject`
    makes such a line for something that never became a sample. ``resume=True``
    continues an interrupted write into ``out``: :attr:`count` says how many samples of the
    sequence it holds (written or rejected); write the rest. ``overwrite=True`` replaces a dataset
    of ours. ``split``: the dataset's split name (wds shards are ``<split>-NNNNNN.tar``).

    ``out`` may be an ``s3://``, ``gs://`` or ``az://`` prefix: the write is a pack's to such an
    output (``packer.remote_output.StagedOutput``: staged in a local folder, shards uploaded as
    checkpoints close them, the rest after, ``index.json`` last; ``resume=True`` continues from the
    staging folder's journal). ``remote`` (:class:`packer.RemoteOptions`) says how the store is
    reached and where the staging folder is, as for ``pack``.
    """

    def __init__(self, out: str | os.PathLike, format: str | None = None, *,
                 fields: Mapping[str, FieldType | str] | str | None = None, classes: Sequence[str] | None = None,
                 options: PackOptions | None = None, on_error: str = "raise", resume: bool = False,
                 overwrite: bool = False, append: bool = False, split: str = "data",
                 remote: RemoteOptions | None = None) -> None:
        if on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", split):
            raise UsageError(f"split {split!r}: letters, digits, '_' and '-' only (it names the shards)")
        options = options or PackOptions()
        change: dict[str, Any] = {"resume": resume or options.resume, "overwrite": overwrite or options.overwrite,
                                  "append": append or options.append}
        if format is not None:
            change["format"] = format
        if options.order is None:
            change["order"] = "source"
        options = dataclasses.replace(options, **change)
        refused = [(options.order == "shuffled", "order='shuffled' (a Writer writes the order given: shuffle "
                                                 "the samples before writing them)"),
                   (options.engine != "local", f"engine={options.engine!r} (a Writer writes in this process)"),
                   (options.fields is not None, "options.fields (pass fields= to the Writer)")]
        for bad, what in refused:
            if bad:
                raise UsageError(f"Writer: {what}")
        if options.append and options.overwrite:
            raise UsageError("Writer: append=True adds to the dataset, overwrite=True replaces it: choose one")
        if options.resume and options.format == "lmdb" and not options.append:
            raise UsageError("Writer(resume=True) is not offered for lmdb: its data.mdb depends on the commit "
                             "history, so a resumed write would hold the same samples in other bytes; write wds, "
                             "hdf5 or mmap (pack-dataset convert makes the lmdb), or start again with overwrite=True")
        location = parse_location(os.fspath(out)) if isinstance(out, (str, os.PathLike)) else out
        remote = remote or RemoteOptions()
        self._target: StagedOutput | None = None  # an object-store output, staged in a local folder
        if isinstance(location, str):
            if options.append:
                raise UsageError(f"{location}: Writer(append=True) appends to a local dataset folder, not one on "
                                 "object storage yet (append to a local copy and upload it)")
            self._target = StagedOutput(location, options, remote)
        else:
            unused = remote.unused(remote_source=False, remote_output=False)
            if unused:
                raise TypeError(f"RemoteOptions {', '.join(unused)}: only for an s3://, gs:// or az:// output; "
                                f"{location} is a local folder")
        self.url = location if isinstance(location, str) else None  #: the object-store output, if any
        self.out = self._target.folder if self._target is not None else Path(location)
        self.options, self.on_error, self.split = options, on_error, split
        self._fields, self._classes = fields, list(classes) if classes is not None else None
        self._writer_cls = StreamLmdbWriter if options.format == "lmdb" else WRITERS[options.format]
        self.count = 0  #: samples of the caller's sequence taken so far (written or rejected)
        self.result: SplitResult | None = None  #: the pack's result, after a clean close
        self._schema: Schema | None = None
        self._names: frozenset[str] = frozenset()  # the schema's field names (a sample's keys, but __key__)
        self._thread: threading.Thread | None = None
        self._handoff: Handoff[Any] = Handoff(
            _QUEUE_BYTES, gated_below=_GATED_BELOW if self._writer_cls.gil_free_commits else None)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._opts: ImageOptions | None = None
        self._closed = False
        self._complete = False
        self._max_label = -1
        self._waiting: list[tuple[str, str]] = []  # (name, reason) of rejects before the write thread starts
        self._lock = OutputLock()
        self._base: spec.Index | None = None  # append: the dataset's generation this write grows
        try:
            if options.append and not os.path.lexists(self.out / spec.INDEX_NAME):
                self.options = options = dataclasses.replace(options, append=False)  # nothing yet: a new dataset
            if self._target is not None:
                self._target.check(self._lock)  # may the prefix be written? nothing is written yet
            prepare_output(self.out, dataclasses.replace(options, resume=True) if options.append else options,
                           [self.out], self._lock, split_hint=split,
                           role=self._target.role if self._target is not None else "")
            if self._target is not None:
                self._target.ready()  # overwrite=True: the old objects go, index.json first
            if self._target is not None and options.resume and not os.path.lexists(self.out / spec.STATE_NAME) \
                    and self._target.store.exists(spec.INDEX_NAME):
                self._finished(json.loads(self._target.store.read(spec.INDEX_NAME)))
            elif options.append:
                self._begin_append()
            elif os.path.lexists(self.out / spec.INDEX_NAME) and options.resume:
                appending.refuse_plain_resume(self.out)
                self._finished()
            elif options.resume and os.path.lexists(self.out / spec.STATE_NAME):
                self._start(self._journal_schema())  # count is known before the first write
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        """The output lock goes; an object-store output's staging folder too, when the upload emptied it."""
        self._lock.release()
        if self._target is not None:
            self._target.close()

    # ---- context manager
    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # ---- the caller's side
    def write(self, sample: Mapping[str, Any]) -> None:
        """Check ``sample`` and queue it for the write thread (see the class docstring for errors)."""
        self._check_open()
        if not isinstance(sample, Mapping):
            raise SampleError(f"sample {self.count}: expected a dict of field values, got {type(sample).__name__}")
        self._raise_failure()
        if self._thread is None:
            self._start(infer_schema(sample, self._fields, self._classes))
            waiting, self._waiting = self._waiting, []
            for name, reason in waiting:  # rejects before the first sample, in their places
                self._put_reject(name, reason)
        pos = self.count
        outcome, label, name, size = self._check(pos, sample)
        if outcome.prepared is None and self.on_error == "raise":
            raise SampleError(outcome.problem)
        for column, value in zip(self._columns, (name, label, size)):
            column.append(value)
        if outcome.prepared is not None and label > self._max_label:
            self._max_label = label
            self._grow_classes()
        self._put(outcome, size)
        self.count += 1

    def reject(self, name: str, reason: str) -> None:
        """Take the next position of the caller's sequence as rejected: one line of ``rejects.jsonl``
        (``{"path": name, "reason": reason}``, the reason made one line), counted in :attr:`count` and
        in the result's ``rejected`` as a sample :meth:`write` rejects is, so a resume skips it as it
        skips a written sample. For an input that never became a sample (``pack_map``: ``fn`` failed
        on it); it is the caller's decision, so ``on_error`` does not apply (``options.strict`` does:
        the pack stops at the first reject). Before the first sample (whose fields the schema is made
        of) a reject waits, and takes its place in the sequence when the write thread starts."""
        self._check_open()
        reason = one_line(reason)
        if self._thread is None:
            self._waiting.append((str(name), reason))
            self.count += 1
            return
        self._raise_failure()
        self._put_reject(str(name), reason)

    def _put_reject(self, name: str, reason: str) -> None:
        for column, value in zip(self._columns, (name, 0, 0)):
            column.append(value)
        self._put(Outcome(None, problem=reason), 0)
        self.count += 1

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"{self.out}: this Writer is closed")
        if self._complete:
            raise UsageError(f"{self.out} is complete already ({self.count} samples); nothing to resume")

    def close(self) -> SplitResult | None:
        """Finish: the write thread writes what is queued, then the index (the dataset is complete)."""
        if self._closed:
            return self.result
        self._closed = True
        try:
            if self._complete:
                return self.result
            if self._thread is None:
                rejected = f" ({len(self._waiting)} rejected)" if self._waiting else ""
                raise PackError(f"{self.out}: no sample was written{rejected}; nothing was packed")
            if not self._handoff.end(self._thread.is_alive):
                self._raise_failure()
            self._thread.join()
            if self._error is not None:
                raise self._error
            return self.result
        finally:
            self._release()

    def abort(self) -> None:
        """Stop without writing the index: what was checkpointed stays resumable (``resume=True``)."""
        if self._closed:
            self._release()  # a failure that closed the writer may have left it held
            return
        self._closed = True
        try:
            if self._thread is not None:
                self._handoff.put(_ABORT, 0, self._thread.is_alive)  # after the samples before it, as a sample
                self._handoff.flush(self._thread.is_alive)
                self._thread.join()
        finally:
            self._release()

    # ---- checks, in the caller's thread
    def _check(self, pos: int, sample: Mapping[str, Any]) -> tuple[Outcome, int, str, int]:
        """(outcome, label, name, source bytes) of one sample; a bad one's outcome names it."""
        schema, where = self._schema, f"sample {pos}"
        assert schema is not None and self._opts is not None
        keys = sample.keys()
        if keys == self._names or keys - {"__key__"} == self._names:
            return self._check_values(pos, sample)
        names = set(keys) - {"__key__"}
        missing, unknown = [n for n in schema.names if n not in names], sorted(names - set(schema.names))
        if missing or unknown:
            what = "; ".join(filter(None, [f"missing field {', '.join(map(repr, missing))}" if missing else "",
                                           f"field {', '.join(map(repr, unknown))} not in the schema "
                                           f"({', '.join(schema.names)})" if unknown else ""]))
            return Outcome(None, problem=f"{where}: {what}"), 0, self._name(pos, sample), 0
        return self._check_values(pos, sample)

    def _check_values(self, pos: int, sample: Mapping[str, Any]) -> tuple[Outcome, int, str, int]:
        """:meth:`_check` of a sample with the schema's fields."""
        schema, where = self._schema, f"sample {pos}"
        assert schema is not None and self._opts is not None
        name = self._name(pos, sample)
        try:
            data = image_bytes(sample["image"])
            label = self._label(sample)
            blobs = tuple(f.type.encode(sample[f.name], f.name) for f in schema.extra_fields)
        except FieldValueError as exc:
            return Outcome(None, problem=f"{where}: {exc}"), 0, name, 0
        outcome = outcome_of(data, self._opts)
        if outcome.prepared is None:
            return Outcome(None, problem=f"{where}: field 'image': {outcome.problem}"), 0, name, len(data)
        return outcome._replace(fields=blobs if schema.extra_fields else None), label, name, len(data)

    def _name(self, pos: int, sample: Mapping[str, Any]) -> str:
        key = sample.get("__key__")
        return str(pos) if key is None else str(key)

    def _label(self, sample: Mapping[str, Any]) -> int:
        schema = self._schema
        assert schema is not None
        field = schema.labels_field
        if field is None:
            return 0
        value = field.type.check(sample["label"], "label")
        if value < 0 or self._classes is not None and value >= len(self._classes):
            known = f"0 .. {len(self._classes) - 1} (classes=)" if self._classes is not None else ">= 0"
            raise FieldValueError(f"field 'label': {value} is not a class index ({known})")
        return int(value)

    def _grow_classes(self) -> None:
        """Without ``classes=``, the class names are ``"0"``, ``"1"``, ... up to the largest label."""
        classes = self._source.classes
        while len(classes) <= self._max_label and self._classes is None:
            classes.append(str(len(classes)))

    # ---- the write thread
    def _start(self, schema: Schema) -> None:
        self._schema = schema
        self._names = frozenset(schema.names)
        has_label = schema.labels_field is not None
        classes = list(self._classes) if self._classes is not None and has_label else []
        if self._base is not None:  # append: the dataset's fields and classes (new classes after them)
            then = Schema.from_index(self._base.meta, str(self.out / spec.INDEX_NAME))
            if self._fields is None and set(schema.names) == set(then.names):  # the types are the dataset's
                schema = self._schema = Schema(tuple(dataclasses.replace(f, classes=schema[f.name].classes)
                                                     for f in then))
            appending.check_schema(self.out, self._base, schema)
            classes = appending.merge_classes(self.out, self._base.meta["classes"], self._classes)
        details = {"fields": schema.to_json()["fields"], "classes": self._classes if has_label else None}
        self._columns = (_Column(), _Column(), _Column())  # paths (names), labels, sizes
        self._source = _StreamSource(Path(self.out), classes, *self._columns, kind="writer", details=details,
                                     schema=schema, order={"kind": "source"})
        if self._base is not None:
            self.options = appending.start(self.out, self.split, self._source, self.options, self._base)
        self._thread = threading.Thread(target=self._run, name="packer-writer", daemon=True)
        self._thread.start()
        while not self._ready.wait(0.05):
            if not self._thread.is_alive():
                self._thread.join()
                if self._error is not None:
                    error, self._error = self._error, None
                    self._closed = True
                    self._release()
                    raise error
                if self.result is not None and self.result.already_complete:
                    self._complete = True
                    return
                raise PackError(f"{self.out}: the write thread ended before it started")

    def _run(self) -> None:
        try:
            with self._handoff.consuming():  # the format writer's long GIL-free calls open the caller's gate
                if self._target is not None:  # staged, uploaded as it goes, index.json last (packer.remote_output)
                    self.result = self._target.pack_split(self._pack, self._source, self.out, self.split,
                                                          self._writer_cls, None)
                else:
                    self.result = self._pack(self._source, self.out, self.split, self._writer_cls, None)
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._error = exc

    def _pack(self, source: Source, out: Path, split: str, writer_cls: type, progress: Any, *, output: Any = None,
              after_checkpoint: Callable[[Journal], None] | None = None) -> SplitResult:
        """The engine (``packer.engines.SplitPacker``) of a Writer: the pack's write stage over its queue."""
        return pack_split(source, out, split, self.options, writer_cls, 1, prepare=self._stage,
                          after_checkpoint=after_checkpoint)

    def _stage(self, source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        """The prepare stage ``pack_split`` calls (after the journal, writer and side files are open)."""
        self.count = start
        for column in self._columns:
            column.restart(start)
        if start:  # the labels already written decide the class names, as in an uninterrupted write
            records = SideFiles.read_records(self.out)
            labels = records["labels"] if self._base is not None else records["labels"][:start]
            self._max_label = int(labels.max(initial=-1)) if len(records) else -1
            del records
            self._grow_classes()
        self._opts = opts
        self._ready.set()
        return self._outcomes(source, start)

    def _outcomes(self, source: Source, start: int) -> Iterator[Outcome]:
        pos = forgotten = start
        try:
            for item in self._handoff.items():
                if item is _ABORT:
                    raise _Aborted()
                if pos - forgotten >= 64:  # the columns' entries the write stage is done with, 64 at a time
                    for column in self._columns:
                        column.forget_before(pos)
                    forgotten = pos
                yield item
                pos += 1
        finally:
            self._handoff.stop()  # the pack stopped taking samples (done, or an error): a waiting caller goes on

    def _put(self, item: Any, weight: int) -> None:
        assert self._thread is not None
        if not self._handoff.put(item, weight, self._thread.is_alive):  # the write thread stopped taking them
            self._thread.join()
            self._raise_failure()
            raise PackError(f"{self.out}: the write thread stopped taking samples")

    def _raise_failure(self) -> None:
        """The write thread's error (a full disk, an I/O error), raised in the caller's thread."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread.join()
            self._closed = True
            self._release()
            if self._error is not None:
                raise self._error
            raise PackError(f"{self.out}: the write thread ended early")

    # ---- append
    def _begin_append(self) -> None:
        """``append=True`` on a finished dataset: its split, and a resume of an interrupted append
        starts now (its fields come from the journal); a fresh one starts at the first sample."""
        self._base = appending.base_index(self.out, self.options)
        self.split = str(self._base.meta.get("split") or self.split)
        if self._classes is not None:
            appending.merge_classes(self.out, self._base.meta["classes"], self._classes)
        if appending.resumable(self.out, self.options):
            self._start(self._journal_schema())

    # ---- resume
    def _journal_schema(self) -> Schema:
        """The schema of the interrupted write in ``out`` (its journal's source record); ``fields=``,
        when given, must be the same."""
        try:
            state = json.loads((self.out / spec.STATE_NAME).read_text(encoding="utf-8"))
            record = state["source"]
            then = Schema.from_json(record, str(self.out / spec.STATE_NAME))
        except (OSError, ValueError, KeyError, TypeError):
            raise PackError(f"{self.out}: not an interrupted Writer's output ({spec.STATE_NAME} names no "
                            "fields); resume it with the command that wrote it, or start again with "
                            "overwrite=True") from None
        if self._fields is not None:
            now = infer_schema({}, self._fields, self._classes)
            if not self._fields_match(now, then):
                raise PackError(f"{self.out}: the interrupted write had fields "
                                f"{', '.join(f'{f.name}:{f.type.name}' for f in then)}, this one "
                                f"{', '.join(f'{f.name}:{f.type.name}' for f in now)}; resume with the same "
                                "fields, or start again with overwrite=True")
        if self._classes is not None and record.get("classes") not in (None, self._classes):
            raise PackError(f"{self.out}: the interrupted write had classes {record['classes']}, this one "
                            f"{self._classes}; resume with the same classes, or start again with overwrite=True")
        if self._classes is None and record.get("classes") is not None:
            self._classes = list(record["classes"])
        return Schema(tuple(dataclasses.replace(f, classes=None) if f.name == "label" and self._classes is None
                            else f for f in then))

    @staticmethod
    def _fields_match(a: Schema, b: Schema) -> bool:
        return [(f.name, f.type.name) for f in a] == [(f.name, f.type.name) for f in b]

    def _finished(self, meta: dict[str, Any] | None = None) -> None:
        """``resume=True`` on a complete dataset (``meta``: its index, read from the store): nothing to
        write; :attr:`count` is its sample count."""
        meta = meta if meta is not None else spec.read_index(self.out).meta
        src: dict[str, Any] = meta["source"] if isinstance(meta.get("source"), dict) else {}
        if src.get("kind") != "writer":
            raise PackError(f"{self.url or self.out} holds a finished pack, not a Writer's; nothing to resume")
        self.count = int(src.get("images_found", meta.get("num_samples", 0)))
        self._complete = True
