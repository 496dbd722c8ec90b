"""WebDataset under the Ray engine: the driver lays shards out, tasks write them.

The driver runs the usual write stage (``packer.pipeline``), with this
writer in place of :class:`~packer.formats.wds.WdsWriter`. The samples'
stored bytes never reach the driver: the prepare tasks leave them in the
Ray object store and the outcomes carry :class:`DeferredBytes` (a length
and where the bytes are). From the lengths alone the writer decides what
``WdsWriter`` decides -- the same shard boundaries, sample keys and byte
offsets, so the index and the shards are identical to the local engine's --
and when a shard is complete it hands a ``write_shard`` task the list of
its samples. That task runs where most of those bytes are, writes the tar
with the same layout function as ``WdsWriter``, fsyncs it and publishes it
under its final name.

Durability. A checkpoint waits for every shard dispatched so far, so the
shard log (:class:`~packer.formats.wds.ShardLog`, ``shard-log.jsonl``, as
the local writer keeps it) lists only shards that exist whole, with their
CRC-32 as the task computed it; the journal records only how much of the
log to trust, so a checkpoint writes O(1) journal bytes however many shards
came before. Checkpoints happen when a shard closes and at least
``checkpoint_bytes`` were dispatched since the last one (waiting costs the
driver one shard's write; prepare tasks keep running meanwhile). On resume,
every journaled shard is read back (in tasks) and checked against its
size and CRC before it is trusted; any other shard or temp file of the
split is deleted and rewritten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from packer.engines.io import LocalOutput
from packer.engines.tasks import ShardPart
from packer.errors import PackError
from packer.formats.wds import END_OF_ARCHIVE, ShardLog, WdsWriter, sample_span
from packer.prepare.images import Prepared
from packer.options import PackOptions
from readers.contract import spec

__all__ = ["DeferredBytes", "RayWdsWriter", "ShardTasks"]


class ShardTasks(Protocol):
    """What the writer asks of the engine (``packer.engines.ray.RaySession`` provides it)."""

    def write_shard(self, output: Any, name: str, parts: list[ShardPart], refs: list[Any]) -> Any:
        """Start a task that writes shard ``name`` from ``parts``; a handle for :meth:`shard_written`."""

    def shard_written(self, task: Any) -> dict[str, Any]:
        """Wait for a ``write_shard`` task; the record of the shard it wrote."""

    def file_crcs(self, output: Any, names: list[str]) -> list[tuple[int, int] | None]:
        """(CRC-32, size) of each file of ``output`` named, or None where it is missing."""

    def cancel(self, tasks: list[Any]) -> None:
        """Cancel tasks that are still running."""


class DeferredBytes:
    """Stands in for a sample's stored bytes, which stay in the Ray object store.

    ``len()`` is the byte count (all the write stage needs); the bytes are
    ``ray.get(ref)[start:start + size]``.
    """

    __slots__ = ("size", "ref", "start")

    def __init__(self, size: int, ref: Any, start: int) -> None:
        self.size, self.ref, self.start = size, ref, start

    def __len__(self) -> int:
        return self.size


class _OpenShard:
    """The shard being laid out: its samples and the payload objects they come from."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.pos = 0  # tar bytes so far, as WdsWriter counts them (no end-of-archive yet)
        self.parts: list[ShardPart] = []
        self.refs: list[Any] = []
        self._ref_no: dict[Any, int] = {}

    def payload_no(self, ref: Any) -> int:
        if ref not in self._ref_no:
            self._ref_no[ref] = len(self.refs)
            self.refs.append(ref)
        return self._ref_no[ref]


class RayWdsWriter(WdsWriter):
    """WdsWriter's decisions and finish, with the shard bytes written by Ray tasks."""

    def __init__(self, root: Path, split: str, options: PackOptions, estimated_bytes: int, *,
                 session: ShardTasks, output: Any = None, schema: Any = None) -> None:
        # a source with fields is prepared on this machine (packer.engines.ray), so schema is None here
        super().__init__(root, split, options, estimated_bytes, schema=schema)
        self.session = session
        self.output = output if output is not None else LocalOutput(root)  # or a StoreOutput (s3://)

    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        self._file = None  # no shard file is open here: tasks write them (WdsWriter.abort's test)
        self._pending: list[tuple[Any, dict[str, Any]]] = []  # (task, the record it must return)
        self._log = ShardLog(self.root)  # abort() closes it, also when the check below fails
        self.shards: list[dict[str, Any]] = self._log.resume(state)
        self._check_written(self.shards)
        self.output.remove_except(f"{self.split}-*.tar*", {s["name"] for s in self.shards})
        self._open: _OpenShard | None = None
        self._closed = len(self.shards)
        self._since = 0  # shard bytes dispatched since the last checkpoint
        self._just_closed = False

    def _check_written(self, shards: list[dict[str, Any]]) -> None:
        """Resume trusts a journaled shard only if its size and CRC still match."""
        found = self.session.file_crcs(self.output, [s["name"] for s in shards])
        for shard, got in zip(shards, found):
            if got != (shard["crc32"], shard["bytes"]):
                what = "is missing" if got is None else "no longer matches its CRC-32 and size"
                raise PackError(f"{self.output.where(shard['name'])}, written before the interruption, {what}; "
                                "start again with --overwrite")

    def append(self, sample_no: int, prepared: Prepared, label: int,
               fields: tuple[bytes, ...] | None = None) -> tuple[int, int]:
        if fields is not None:
            raise TypeError("RayWdsWriter takes image + label samples (a source with fields is prepared on this machine)")
        self._just_closed = False
        data = prepared.data
        if not isinstance(data, DeferredBytes):
            raise TypeError("RayWdsWriter takes samples prepared by the Ray engine (DeferredBytes)")
        if self._open is None:
            self._open = _OpenShard(sample_no)
        shard = self._open
        start, span = sample_span(data.size)  # the bytes sample_tar's tasks write around it
        offset = shard.pos + start
        shard.pos += span
        shard.parts.append(ShardPart(shard.payload_no(data.ref), data.start, data.size, sample_no,
                                     prepared.ext, label))
        index = self._closed
        limit = self.options.shard_count
        if shard.pos >= self.options.shard_size or (limit is not None and len(shard.parts) >= limit):
            self._dispatch()
        return offset, index

    def _dispatch(self) -> None:
        shard, self._open = self._open, None
        assert shard is not None
        name = spec.shard_name(self.split, self._closed)
        expect: dict[str, Any] = {"name": name, "samples": len(shard.parts), "bytes": shard.pos + len(END_OF_ARCHIVE),
                  "first": shard.first}
        self._pending.append((self.session.write_shard(self.output, name, shard.parts, shard.refs), expect))
        self._closed += 1
        self._since += expect["bytes"]
        self._just_closed = True

    def at_checkpoint_boundary(self) -> bool:
        return self._just_closed and self._since >= self.options.checkpoint_bytes

    def checkpoint(self) -> dict[str, Any]:
        """Wait for every dispatched shard; the journal may then list them."""
        log = self._log
        assert log is not None, "open() opens the log"
        pending, self._pending = self._pending, []
        for task, expect in pending:
            record = self.session.shard_written(task)
            if {k: record[k] for k in expect} != expect:
                raise PackError(f"{self.output.where(expect['name'])}: internal error, the task wrote "
                                f"{record} where {expect} was laid out")
            self.shards.append(record)
            log.append(record)
        self._since = 0
        self._just_closed = False
        return log.checkpoint(len(self.shards))

    def end_samples(self) -> None:
        if self._open is not None:
            self._dispatch()

    def finalize(self, meta: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
        self.end_samples()
        self.checkpoint()
        # temp files of attempts that were killed (their retries published the shard)
        self.output.remove_except(f"{self.split}-*.tar.*.tmp", set())
        return super().finalize(meta, arrays)  # every shard is written: what WdsWriter adds at the end

    def abort(self) -> None:
        self.session.cancel([task for task, _ in self._pending])
        self._pending = []
        super().abort()
