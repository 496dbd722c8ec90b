"""A prepare stage for sources whose images are read as bytes by this process (tar shards, Arrow/Parquet
tables, packed datasets): the bytes go to worker processes, outcomes come back in source order.

:func:`ordered_outcomes` runs a per-item function in the one process pool of
every prepare stage (``packer.prepare.pool``: a bounded window of items in flight,
the same stopping and dead-worker detection as a folder pack).
:func:`bytes_stage` turns "iterate the source's bytes from position N" into
a ``packer.prepare.workers.PrepareStage`` that validates and normalizes each image
with ``packer.prepare.images.prepare_image``, exactly as for a folder.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Generator, Iterator

from packer.errors import SourceError
from packer.prepare.images import ImageOptions, RejectedImage
from packer.prepare.pool import ordered_map
from packer.prepare.workers import Outcome, outcome_bytes, outcome_of
from readers.contract.fields import Field, FieldValueError

__all__ = ["ordered_outcomes", "bytes_stage", "prepare_bytes", "Unreadable", "fields_stage", "encode_fields",
           "label_names"]


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
    rejects an item over ``opts``' byte budget (``packer.prepare.images.check_file_size``) before it reads it.
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


# ---------------------------------------------------------------------------- sources with typed fields
def fields_stage(entries: list[Any], extra: tuple[Field, ...], *, reader: Callable[[], Any],
                 members: bool = False) -> Callable[..., Iterator[Outcome]]:
    """The prepare stage of a source with typed fields (manifests, COCO, WebDataset and Hugging Face
    imports): reads each entry's image and values in this process, then validates the image (as a
    folder's) and encodes the fields in the workers (:func:`encode_fields`).

    ``entries[pos]``: a reject's one-line reason, or ``(image ref, values, where)``. ``reader()`` gives
    an object with ``read(ref, opts)`` (the image bytes, or a reason to reject it), ``values(values)``
    (the values, or a reason), ``where(ref)`` and ``close()``. ``members=True``: the values are
    WebDataset members, decoded by their types first."""

    def read_refs(positions: list[int], opts: ImageOptions) -> Generator[Any, None, None]:
        r = reader()
        try:
            for pos in positions:
                entry = entries[pos]
                if isinstance(entry, str):
                    yield (entry, (), "")
                    continue
                ref, values, where = entry
                try:
                    data = r.read(ref, opts)
                    if not isinstance(data, (bytes, bytearray, memoryview)):
                        yield (f"{where} column 'image': {data}", (), where)
                        continue
                    got = r.values(values)
                    yield (data, got, where) if isinstance(got, tuple) else (f"{where} {got}", (), where)
                except RejectedImage as exc:
                    yield (f"{where} column 'image': {exc}", (), where)
                except OSError as exc:
                    yield (Unreadable(f"{r.where(ref)}: read error: {exc.strerror or exc}"), (), where)
        finally:
            r.close()

    def stage(source: Any, start: int, opts: ImageOptions, workers: int) -> Iterator[Outcome]:
        items = read_refs(source.positions(start), opts)
        try:
            yield from ordered_outcomes(items, partial(encode_fields, extra, members), opts, workers,
                                        describe=lambda n: f"{source.root}/{source.paths[start + n]}")
        finally:
            items.close()

    return stage


def encode_fields(extra: tuple[Field, ...], members: bool, item: tuple[Any, tuple, str],
                  opts: ImageOptions) -> Outcome:
    """Runs in a worker: one row's image validated (``outcome_of``, as a folder's) and its extra fields
    encoded (``members``: each value is a WebDataset member, decoded first); a reject names the row
    (or shard and key) and the column (field)."""
    data, values, where = item
    if isinstance(data, Unreadable):
        return Outcome(None, problem=str(data), unreadable=True)
    if isinstance(data, str):
        return Outcome(None, problem=data)
    outcome = outcome_of(data, opts)
    if outcome.prepared is None:
        return outcome._replace(problem=f"{where} column 'image': {outcome.problem}")
    try:
        if members:
            values = tuple(f.type.from_member(v, f.name) for f, v in zip(extra, values, strict=True))
        blobs = tuple(f.type.encode(v, f.name) for f, v in zip(extra, values, strict=True))
    except FieldValueError as exc:
        return Outcome(None, problem=f"{where}: {exc}")
    return outcome._replace(fields=blobs)


def label_names(label_field: Field, labels: list[int], where: Any, min_limit: int) -> list[str]:
    """index.json's ``classes`` for the values of the ``label`` field: its class names, else ``"0"``,
    ``"1"``, ... up to the largest value, at most ``max(min_limit, samples)`` of them (a label of
    500,000,000 is broken or hostile: one line naming ``where``, as for imported shards'
    ``packer.importers.wds.MIN_CLASS_LIMIT``)."""
    low, high = (min(labels), max(labels)) if labels else (0, -1)
    limit = max(min_limit, len(labels))
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise SourceError(f"{where}: label {bad:,} is not a class index (0 .. {limit - 1:,}: the labels of the "
                          "'label' field name classes)")
    names = dict(label_field.classes or {})
    count = max(high + 1, max(names) + 1 if names else 0)
    return [names.get(i, str(i)) for i in range(count)]
