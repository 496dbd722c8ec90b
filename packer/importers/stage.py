"""A prepare stage for sources whose images are read as bytes by this process (tar shards, Arrow/Parquet
tables, packed datasets): the bytes go to worker processes, outcomes come back in source order.

:func:`ordered_outcomes` runs a per-item function in the one process pool of
every prepare stage (``packer.pool``: a bounded window of items in flight,
the same stopping and dead-worker detection as a folder pack).
:func:`bytes_stage` turns "iterate the source's bytes from position N" into
a ``packer.workers.PrepareStage`` that validates and normalizes each image
with ``packer.images.prepare_image``, exactly as for a folder.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator

from packer.images import ImageOptions
from packer.pool import ordered_map
from packer.workers import Outcome, outcome_bytes, outcome_of

__all__ = ["ordered_outcomes", "bytes_stage", "prepare_bytes", "Unreadable"]


class Unreadable(str):
    """An item that could not be read: its one-line reason, which stops the pack (resumable)."""


def prepare_bytes(data: Any, opts: ImageOptions) -> Outcome:
    """One source image's bytes -> its outcome (stored data and CRC, or why it was rejected)."""
    if isinstance(data, Unreadable):
        return Outcome(None, problem=str(data), unreadable=True)
    if isinstance(data, str):  # a reason to reject the sample, found while reading it
        return Outcome(None, problem=data)
    return outcome_of(data, opts)


def _item_bytes(item: Any) -> int:
    """An item's weight in the window: its bytes (an image's, or the first of a tuple's)."""
    data = item[0] if isinstance(item, tuple) and item else item
    return getattr(data, "nbytes", None) or (len(data) if isinstance(data, (bytes, bytearray, memoryview)) else 0)


def ordered_outcomes(items: Iterator[Any], fn: Callable[[Any, ImageOptions], Outcome], opts: ImageOptions,
                     workers: int, *, inline: Callable[[Any], Outcome | None] | None = None,
                     describe: Callable[[int], str] | None = None) -> Iterator[Outcome]:
    """``fn(item, opts)`` for every item, in order, in ``workers`` forked processes (in this one when
    ``workers <= 1``). ``inline(item)`` may return an outcome directly (no worker needed) or None.
    ``describe(n)``: the n-th item, as a dead worker's message names it."""
    yield from ordered_map(partial(_apply, fn, opts), items, workers, inline=inline, weight=_item_bytes,
                           result_weight=outcome_bytes, describe=describe)


def _apply(fn: Callable[[Any, ImageOptions], Outcome], opts: ImageOptions, item: Any) -> Outcome:
    return fn(item, opts)


def bytes_stage(read: Callable[[list[int], ImageOptions], Iterator[Any]]) -> Callable[..., Iterator[Outcome]]:
    """A prepare stage over ``read(positions, opts)``: the items at those scan positions, in that order,
    each the image's bytes, a ``str`` (reject it with this reason) or an :class:`Unreadable`. ``read``
    rejects an item over ``opts``' byte budget (``packer.images.check_file_size``) before it reads it.
    The stage asks for ``source.positions(start)``: the written order, shuffled or not."""

    def stage(source: Any, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        items = read(source.positions(start), opts)
        try:
            yield from ordered_outcomes(items, prepare_bytes, opts, workers,
                                        describe=lambda n: f"{source.root}/{source.paths[start + n]}")
        finally:
            close = getattr(items, "close", None)
            if close:
                close()

    return stage
