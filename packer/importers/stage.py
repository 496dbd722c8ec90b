"""A prepare stage for sources whose images are read as bytes by this process (tar shards, Arrow/Parquet
tables, packed datasets): the bytes go to worker processes, outcomes come back in source order.

:func:`ordered_outcomes` is the engine: a fork pool with a bounded window of
jobs in flight (``Pool.imap`` would read the whole source ahead of the
workers, and hold it in memory). :func:`bytes_stage` turns "iterate the
source's bytes from position N" into a ``packer.workers.PrepareStage``
that validates and normalizes each image with ``packer.images.prepare_image``,
exactly as for a folder.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from typing import Any, Callable, Iterator

from packer.images import ImageOptions
from packer.workers import Outcome, init_pool_worker, outcome_of, stop_pool

__all__ = ["ordered_outcomes", "bytes_stage", "prepare_bytes", "Unreadable"]

#: jobs in flight per worker: enough to keep every worker busy, little memory
_PER_WORKER = 4
_SETTLE_S = 60.0  # at most this long for the tasks still out when a stage stops early (see _settle)


class Unreadable(str):
    """An item that could not be read: its one-line reason, which stops the pack (resumable)."""


def prepare_bytes(data: Any, opts: ImageOptions) -> Outcome:
    """One source image's bytes -> its outcome (stored data and CRC, or why it was rejected)."""
    if isinstance(data, Unreadable):
        return Outcome(None, problem=str(data), unreadable=True)
    if isinstance(data, str):  # a reason to reject the sample, found while reading it
        return Outcome(None, problem=data)
    return outcome_of(data, opts)


def _call(args: tuple) -> Outcome:
    fn, item, opts = args
    return fn(item, opts)


def ordered_outcomes(items: Iterator[Any], fn: Callable[[Any, ImageOptions], Outcome], opts: ImageOptions,
                     workers: int, *, inline: Callable[[Any], Outcome | None] | None = None) -> Iterator[Outcome]:
    """``fn(item, opts)`` for every item, in order, in ``workers`` forked processes (in this one when
    ``workers <= 1``). ``inline(item)`` may return an outcome directly (no worker needed) or None."""
    if workers <= 1:
        for item in items:
            done = inline(item) if inline else None
            yield done if done is not None else fn(item, opts)
        return
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(workers, initializer=init_pool_worker, initargs=(os.getpid(),))
    window: deque = deque()
    completed = False
    try:
        for item in items:
            done = inline(item) if inline else None
            window.append(done if done is not None else pool.apply_async(_call, ((fn, item, opts),)))
            while len(window) >= _PER_WORKER * workers:
                yield _result(window.popleft())
        while window:
            yield _result(window.popleft())
        completed = True
    finally:
        if not completed:
            _settle(window)
        stop_pool(pool, completed)


def _settle(window: deque) -> None:
    """Let the tasks still out finish before the pool is terminated (:func:`packer.workers.stop_pool`).

    ``Pool.terminate`` kills workers where they stand; one killed while it writes a result (the
    image's bytes: often more than a pipe holds) leaves the pool's result thread waiting for the
    rest of that message forever, and ``terminate`` joins that thread: a hang, seen when a pack
    stops early. At most ``_PER_WORKER`` images per worker are out; a worker that died never
    answers, hence the bound.
    """
    deadline = time.monotonic() + _SETTLE_S
    for entry in window:
        if not isinstance(entry, Outcome):
            entry.wait(max(0.0, deadline - time.monotonic()))


def _result(entry: Any) -> Outcome:
    return entry if isinstance(entry, Outcome) else entry.get()


def bytes_stage(read: Callable[[list[int]], Iterator[Any]]) -> Callable[..., Iterator[Outcome]]:
    """A prepare stage over ``read(positions)``: the items at those scan positions, in that order, each
    the image's bytes, a ``str`` (reject it with this reason) or an :class:`Unreadable`. The stage
    asks for ``source.positions(start)``: the written order, shuffled or not."""

    def stage(source: Any, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        items = read(source.positions(start))
        try:
            yield from ordered_outcomes(items, prepare_bytes, opts, workers)
        finally:
            close = getattr(items, "close", None)
            if close:
                close()

    return stage
