"""Engines: who runs the prepare stage of a pack (``PackOptions.engine``).

* ``local`` -- a process pool on this machine (``packer.prepare.pool``, for every stage);
* ``ray`` -- tasks on a Ray cluster (``packer.engines.ray``; needs the
  optional ``ray`` extra, imported only when this engine is asked for).

Both feed the same write stage (``packer.pipeline``), so they write the
same dataset. :func:`open_engine` gives a function that packs one split.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from packer.errors import UsageError
from packer.formats.base import FormatWriter
from packer.journal import Journal
from packer.options import PackOptions
from packer.pipeline import PackProgress, SplitResult, pack_split
from packer.sources.source import Source
from readers.contract.env import available_cpus

__all__ = ["SplitPacker", "open_engine", "ray_session"]

#: (source, output folder, split name, writer class, progress callback) -> result; keywords
#: ``output`` (where wds shard tasks put shards: a StoreOutput for s3://) and ``after_checkpoint``
#: (``packer.pipeline.pack_split``'s)
SplitPacker = Callable[..., SplitResult]


@contextmanager
def ray_session(options: PackOptions) -> Iterator[Any]:
    """A :class:`packer.engines.ray.RaySession` on the cluster ``options`` name (``pack_map`` maps with it);
    without Ray installed, one line saying how to get it."""
    try:
        from packer.engines import ray as ray_engine
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise UsageError("--engine ray needs Ray: pip install 'dataset-packer[ray]'") from None
    with ray_engine.RaySession.connect(options) as session:
        yield session


@contextmanager
def open_engine(options: PackOptions) -> Iterator[SplitPacker]:
    """The engine ``options`` ask for, ready to pack splits; released on exit."""
    if options.engine == "ray":
        with ray_session(options) as session:
            yield session.pack_split
        return
    workers = options.workers or available_cpus()

    def pack_locally(source: Source, out: Path, split: str, writer_cls: type[FormatWriter],
                     progress: PackProgress | None, *, output: Any = None,
                     after_checkpoint: Callable[[Journal], None] | None = None) -> SplitResult:
        # ``output`` is where the Ray engine's tasks put wds shards; here the writer writes ``out``.
        stage = {"prepare": source.prepare} if source.prepare is not None else {}  # imported sources read bytes
        if source.files is not None:  # an s3:// folder: read through its store
            from packer.engines.tasks import prepare_in_pool

            stage = {"prepare": partial(prepare_in_pool, source.files)}
        return pack_split(source, out, split, options, writer_cls, workers, progress,
                          after_checkpoint=after_checkpoint, **stage)

    yield pack_locally
