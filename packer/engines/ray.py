"""The Ray engine: the prepare stage as Ray tasks over contiguous chunks of the source list.

``pack(..., PackOptions(engine="ray"))`` / ``pack-dataset --engine ray``.
This module is imported only when that engine is asked for (Ray is an
optional extra); see docs/distributed.md for running it on a cluster.

How a split is packed. The driver (this process) cuts the source list into
chunks (:func:`packer.engines.tasks.plan_chunks`: a fixed number of images,
at most 64 MB of source each) and keeps a bounded window of ``prepare_chunk``
tasks in flight. It takes their results in chunk order and feeds the
outcomes to the usual write stage (``packer.pipeline``) -- the same journal,
index, ``names.jsonl`` and ``rejects.jsonl`` code as the local engine, so
the output is the local engine's whatever the cluster looks like:

* lmdb / hdf5 / mmap (one file each): the driver is the one writer; the
  prepared bytes travel to it through the object store. The window (at most
  twice the cluster's CPUs, and about 1 GiB of prepared chunks) bounds its
  memory whatever the dataset size.
* wds: the prepared bytes stay in the object store where they were made;
  the driver lays shards out from the sample sizes alone and ``write_shard``
  tasks write them (``packer.engines.ray_wds``).

``pack_map(..., engine="ray")`` (``packer.mapping``) uses the same session:
:meth:`RaySession.map_ordered` runs the user's function over chunks of the inputs
as ``map_chunk`` tasks and hands the results back in input order to one Writer.

Failures. Tasks are pure (prepare) or idempotent (a shard goes to a unique
temp name, then is renamed whole), so Ray retries a task whose worker died
(``MAX_RETRIES``) and the output does not change. A task that fails for good
stops the pack with a one-line error naming its files; the output is left
resumable. A killed driver leaves the journal of the last checkpoint, and the
same command with ``--resume`` (either engine) carries on from there.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import ray
import ray.exceptions

import packer.engines.tasks as tasks
from packer.engines.io import LocalFiles, LocalOutput
from packer.engines.ray_wds import DeferredBytes, RayWdsWriter
from packer.errors import PackError, UsageError
from packer.formats.base import FormatWriter
from packer.prepare.images import ImageOptions
from packer.journal import Journal
from packer.options import PackOptions
from packer.pipeline import PackProgress, SplitResult, pack_split
from packer.sources.source import Source
from packer.prepare.workers import Outcome
from readers.contract.env import available_cpus
from readers.contract.messages import one_line

__all__ = ["RaySession", "RaySplitResult", "MAX_CHUNK_BYTES", "MAX_RETRIES"]

log = logging.getLogger(__name__)

#: a chunk ends after ``PackOptions.ray_chunk`` images or this many source bytes
MAX_CHUNK_BYTES = 64 << 20
#: prepared chunks in flight are held to about this many bytes (and 2 per cluster CPU)
IN_FLIGHT_BYTES = 1 << 30
#: times Ray re-runs a task whose worker process or node died
MAX_RETRIES = 3


class ChunkSummary(NamedTuple):
    """What the driver receives for one chunk."""

    outcomes: list[Outcome]
    spans: list[tuple[int, int]]  # wds: where each sample's bytes sit in the chunk's payload
    nbytes: int  # bytes the chunk stores
    node: str  # Ray node that prepared it


# SPREAD: chunks go round the nodes that have a free CPU rather than filling the driver's node first
# (Ray's default packs a node before spilling, so a small pack could leave the other nodes idle).
@ray.remote(num_cpus=1, max_retries=MAX_RETRIES, scheduling_strategy="SPREAD")
def prepare_chunk(files: LocalFiles, rels: list[str], opts: ImageOptions, detach: bool,
                  sizes: list[int] | None = None):
    """Prepare one chunk (``sizes``: the files' as scanned, checked against the byte budget before a
    read); ``detach`` (wds): two returns, the summary and the stored bytes."""
    done = tasks.prepare_files(files, rels, opts, detach=detach, sizes=sizes)
    summary = ChunkSummary(done.outcomes, done.spans, done.nbytes, ray.get_runtime_context().get_node_id())
    return (summary, done.payload) if detach else summary


# Writing and checking shards is I/O: no CPU is reserved, so these tasks never
# queue behind prepare tasks (a checkpoint waits for them).
@ray.remote(num_cpus=0, max_retries=MAX_RETRIES)
def write_shard(output: LocalOutput, name: str, parts: list[tasks.ShardPart], *payloads) -> tuple[dict, str]:
    return tasks.write_tar(output, name, parts, payloads), ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0, max_retries=MAX_RETRIES)
def file_crc(output: LocalOutput, name: str) -> tuple[int, int] | None:
    return tasks.file_crc(output, name)


@ray.remote(num_cpus=1, max_retries=MAX_RETRIES, scheduling_strategy="SPREAD")
def map_chunk(fn: Callable[[Any], Any], jobs: list[Any]) -> tuple[list[Any], str]:
    """``fn`` over one chunk of a ``pack_map``'s inputs (``fn`` catches an input's failure itself)."""
    return [fn(job) for job in jobs], ray.get_runtime_context().get_node_id()


@dataclass
class RaySplitResult(SplitResult):
    nodes: int = 0  # Ray nodes that ran at least one task of this split
    cpus: int = 0  # their CPUs

    def summary(self) -> str:
        text = super().summary()
        if self.nodes:
            text += f" [ray: {self.nodes} node{'s' * (self.nodes != 1)}, {self.cpus} CPUs]"
        return text


def _cluster_address(address: str | None) -> str | None:
    """The HOST:PORT ``ray.init(address)`` would connect to; None when it would start a new Ray."""
    if address == "local":
        return None
    try:
        from ray._private.services import canonicalize_bootstrap_address  # RAY_ADDRESS, then `ray start`'s record

        # ray annotates addr as str, but its docstring and code take None (RAY_ADDRESS, then `ray start`'s record)
        return canonicalize_bootstrap_address(address)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 -- a private helper: if it is gone or fails, ray.init decides
        return address or "auto"


def _check_reachable(address: str, shown: str) -> None:
    """Fail fast when nothing listens at ``address`` (ray.init would retry for many minutes)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return  # "auto", ray://...: Ray's own resolution
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise UsageError(f"cannot reach the Ray cluster at {shown} ({exc.strerror or exc}); start it with "
                         "'ray start --head', or pass its address with --ray-address") from None


class RaySession:
    """A connection to a Ray cluster for the duration of one ``pack`` call."""

    def __init__(self, options: PackOptions) -> None:
        self.options = options
        self.cpus = int(ray.cluster_resources().get("CPU", 0))
        self.node_cpus = {n["NodeID"]: int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"]}
        self.nodes_used: set[str] = set()
        log.info("Ray cluster: %d nodes, %d CPUs", len(self.node_cpus), self.cpus)

    @classmethod
    @contextmanager
    def connect(cls, options: PackOptions) -> Iterator[RaySession]:
        """Connect (or start a one-machine Ray with ``options.workers`` CPUs); disconnect after.

        A Ray session the caller already opened (``ray.init`` before ``pack``) is used as is.
        """
        owned = not ray.is_initialized()
        if owned:
            kwargs: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
            aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
            if aws:  # object storage configured by the environment: the tasks see the driver's settings
                kwargs["runtime_env"] = {"env_vars": aws}
            address = options.ray_address
            target = _cluster_address(address)
            if target is None:
                kwargs.update(num_cpus=options.workers or available_cpus(), include_dashboard=False)
            else:
                _check_reachable(target, address or target)
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, ValueError, RuntimeError, ray.exceptions.RayError) as exc:
                raise UsageError(f"cannot connect to the Ray cluster at {address or 'auto'}: "
                                 f"{one_line(exc, 300)}") from None
        try:
            yield cls(options)
        finally:
            if owned:
                ray.shutdown()

    # ------------------------------------------------------------ one split
    def pack_split(self, source: Source, out: Path, split: str, writer_cls: type[FormatWriter],
                   progress: PackProgress | None, *, output: Any = None,
                   after_checkpoint: Callable[[Journal], None] | None = None) -> SplitResult:
        """Pack one split into ``out``; wds shards go to ``output`` (default: ``out`` itself; a
        :class:`~packer.engines.io.StoreOutput` for an object store) from the tasks that write them."""
        if source.prepare is not None:  # an import (shards, a Hugging Face dataset): its own reader
            log.warning("%s: %s sources are read and prepared on this machine; --engine ray distributes "
                        "image folders", source.root, source.kind)
            return pack_split(source, out, split, self.options, writer_cls, self.cpus, progress,
                              prepare=source.prepare, after_checkpoint=after_checkpoint)
        detach = writer_cls.format == "wds"
        if detach:
            writer_cls = partial(RayWdsWriter, session=self, output=output)  # type: ignore[assignment]
        self.nodes_used = set()
        files = source.files if source.files is not None else LocalFiles(source.root)
        stage = _ChunkStage(self, files, detach)
        result = pack_split(source, out, split, self.options, writer_cls, self.cpus, progress, prepare=stage,
                            after_checkpoint=after_checkpoint)
        nodes = self.nodes_used
        return RaySplitResult(**{f.name: getattr(result, f.name) for f in fields(SplitResult)},
                              nodes=len(nodes), cpus=sum(self.node_cpus.get(n, 0) for n in nodes))

    # ------------------------------------------------------------ pack_map
    def map_ordered(self, fn: Callable[[Any], Any], jobs: Iterable[Any], chunk: int,
                    describe: Callable[[Any, Any], str]) -> Iterator[Any]:
        """``fn(job)`` for each job, in the jobs' order, as ``map_chunk`` tasks of ``chunk`` jobs (a window
        of two per cluster CPU, taken in order, so memory stays bounded however many jobs there are).
        ``fn`` is pickled once (``ray.put``; a closure or lambda is pickled by value). A chunk that fails
        for good is one line naming its jobs (``describe(first, last)``)."""
        try:
            fn_ref = ray.put(fn)
        except Exception as exc:  # noqa: BLE001 -- cloudpickle's errors are of many kinds
            raise UsageError(f"--engine ray: the function cannot be sent to the cluster ({one_line(exc, 200, kind=True)})"
                             ) from None
        self.nodes_used = set()
        window = max(2, 2 * self.cpus)
        pending: deque[tuple[str, Any]] = deque()
        todo, more = iter(jobs), True
        try:
            while True:
                while more and len(pending) < window:
                    batch = list(itertools.islice(todo, chunk))
                    more = len(batch) == chunk
                    if batch:
                        pending.append((describe(batch[0], batch[-1]), map_chunk.remote(fn_ref, batch)))
                if not pending:
                    return
                what, ref = pending.popleft()
                results, node = self.get(ref, what)
                self.nodes_used.add(node)
                yield from results
        finally:
            self.cancel([ref for _, ref in pending])

    # ------------------------------------------------------------ tasks and their failures
    def get(self, ref: Any, what: str) -> Any:
        """``ray.get(ref)``; a task that failed for good becomes a one-line error about ``what``.

        An OSError raised in a task (disk full, ...) is raised as is: the write
        stage reports it as it does locally.
        """
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, OSError):
                raise cause from None
            raise PackError(f"{what}: a Ray task failed: {one_line(cause, 300, kind=True)}; "
                            "re-run with --resume") from None
        except ray.exceptions.RayError as exc:
            raise PackError(f"{what}: the Ray cluster could not finish it ({type(exc).__name__}: "
                            f"{one_line(exc, 300)}); re-run with --resume") from None

    def submit_chunk(self, files: ray.ObjectRef[LocalFiles] | LocalFiles, rels: Sequence[str], sizes: Sequence[int],
                     opts: ImageOptions, detach: bool) -> list[Any]:
        if detach:
            return list(prepare_chunk.options(num_returns=2).remote(files, rels, opts, True, sizes))
        return [prepare_chunk.remote(files, rels, opts, False, sizes)]

    def write_shard(self, output: LocalOutput, name: str, parts: list[tasks.ShardPart], refs: list[Any]) -> Any:
        return write_shard.remote(output, name, parts, *refs)

    def shard_written(self, task: Any) -> dict[str, Any]:
        record, node = self.get(task, "writing a shard")
        self.nodes_used.add(node)
        return record

    def file_crcs(self, output: LocalOutput, names: Sequence[str]) -> list[tuple[int, int] | None]:
        return [self.get(ref, output.where(name)) for ref, name in
                zip([file_crc.remote(output, n) for n in names], names)]

    @staticmethod
    def cancel(refs: Sequence[Any]) -> None:
        for ref in refs:
            ray.cancel(ref)


class _ChunkStage:
    """The prepare stage (``packer.prepare.workers.PrepareStage``) as a window of Ray tasks."""

    def __init__(self, session: RaySession, files: LocalFiles, detach: bool) -> None:
        self.session, self.files, self.detach = session, files, detach

    def __call__(self, source: Source, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        chunks = tasks.plan_chunks(source.sizes, start, self.session.options.ray_chunk, MAX_CHUNK_BYTES)
        return self._outcomes(source, chunks, opts)

    def _window(self, chunk_bytes: int) -> int:
        """Chunks kept in flight: enough to keep every CPU busy, within the memory bound."""
        return max(2, min(2 * self.session.cpus, IN_FLIGHT_BYTES // max(chunk_bytes, 1)))

    def _outcomes(self, source: Source, chunks: list[tuple[int, int]], opts: ImageOptions) -> Iterator[Outcome]:
        pending: deque[tuple[int, int, list[Any]]] = deque()
        files_ref = ray.put(self.files)
        biggest = max((sum(source.sizes[a:b]) for a, b in chunks[:8]), default=1)  # until results say more
        todo = iter(chunks)
        try:
            while True:
                while len(pending) < self._window(biggest) and (chunk := next(todo, None)) is not None:
                    a, b = chunk
                    submitted = self.session.submit_chunk(files_ref, source.paths[a:b], source.sizes[a:b], opts,
                                                          self.detach)
                    pending.append((a, b, submitted))
                if not pending:
                    return
                a, b, refs = pending.popleft()
                summary = self.session.get(refs[0], f"{self.files.where(source.paths[a])} .. {source.paths[b - 1]}")
                self.session.nodes_used.add(summary.node)
                biggest = max(biggest, summary.nbytes)
                yield from self._with_bytes(summary, refs)
        finally:
            self.session.cancel([refs[0] for _, _, refs in pending])

    def _with_bytes(self, summary: ChunkSummary, refs: list[Any]) -> Iterator[Outcome]:
        if not self.detach:
            yield from summary.outcomes
            return
        for outcome, (start, size) in zip(summary.outcomes, summary.spans):
            prep = outcome.prepared
            if prep is not None and prep.pixels is None:
                prep.data = DeferredBytes(size, refs[1], start)  # type: ignore[assignment]
            yield outcome
