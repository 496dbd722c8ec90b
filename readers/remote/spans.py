"""Building blocks for reading shards remotely: coalesced span streaming, and cache prefetch.

``read_spans`` is how a streaming reader gets its samples without one
request per sample: it takes the byte spans it wants, in the order it wants
them (for ``ShardDataset``: each sample's tar header + data, shard after
shard), merges neighbours into range requests of about ``chunk_size`` bytes,
keeps ``readahead`` requests in flight in background threads (across shard
boundaries, so no round trip is waited for between shards), and yields each
span's bytes as its own ``bytes`` object (copied out of the chunk, so a
shuffle buffer holding a few samples never pins whole chunks).

``prefetch_cached`` is the same idea with a node cache: while the caller
reads one object from the cache, the next ``depth`` are fetched into it in a
background thread; each yielded path stays pinned (never evicted) until the
caller asks for the next one.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from readers.remote.cache import NodeCache
from readers.remote.store import DEFAULT_CHUNK, Store

__all__ = ["read_spans", "prefetch_cached", "plan_requests", "Request"]

#: Spans closer than this are fetched in one request (tar padding, the .cls member between samples).
MAX_GAP = 64 << 10


@dataclass
class Request:
    """One range GET covering several wanted spans (offsets relative to ``start``)."""

    name: str
    start: int
    end: int
    cuts: list[tuple[int, int]] = field(default_factory=list)


def plan_requests(spans: Iterable[tuple[str, int, int]], chunk_size: int = DEFAULT_CHUNK,
                  max_gap: int = MAX_GAP) -> Iterator[Request]:
    """Merge ``(name, offset, length)`` spans, in order, into range requests (lazily)."""
    cur: Request | None = None
    for name, offset, length in spans:
        if offset < 0 or length < 0:
            raise ValueError(f"{name}: bad span offset={offset} length={length}")
        end = offset + length
        if (cur is not None and name == cur.name and cur.end <= offset <= cur.end + max_gap
                and end - cur.start <= chunk_size):
            cur.cuts.append((offset - cur.start, length))
            cur.end = end
            continue
        if cur is not None:
            yield cur
        cur = Request(name, offset, end, [(0, length)])
    if cur is not None:
        yield cur


def read_spans(store: Store, spans: Iterable[tuple[str, int, int]], *, chunk_size: int = DEFAULT_CHUNK,
               readahead: int = 2, max_gap: int = MAX_GAP) -> Iterator[bytes]:
    """The bytes of each ``(name, offset, length)`` span, in order, fetched in coalesced range requests.

    Each request is retried on its own (see :mod:`readers.remote.retry`), so
    the stream survives a server restart within the retry budget. Close the
    generator to stop the background requests.
    """
    requests = plan_requests(spans, chunk_size, max_gap)
    pending: collections.deque[tuple[Request, cf.Future]] = collections.deque()
    pool = cf.ThreadPoolExecutor(max_workers=max(1, readahead), thread_name_prefix="span-readahead")

    def submit() -> None:
        req = next(requests, None)
        if req is not None:
            pending.append((req, pool.submit(store.read_range, req.name, req.start, req.end - req.start)))

    try:
        for _ in range(max(1, readahead) + 1):
            submit()
        while pending:
            req, fut = pending.popleft()
            data = memoryview(fut.result())
            submit()
            for rel, length in req.cuts:
                yield bytes(data[rel:rel + length])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def prefetch_cached(cache: NodeCache, store: Store, items: Iterable[str | tuple[str, int | None, int | None]],
                    *, depth: int = 1, workers: int = 4) -> Iterator[tuple[str, Path]]:
    """``(name, local path)`` for each item, fetched into ``cache`` ``depth`` items ahead.

    An item is a name or ``(name, size, crc32)`` (checked on download). The
    yielded path is pinned until the next item is requested.
    """
    todo = iter([(it, None, None) if isinstance(it, str) else tuple(it) for it in items])
    pending: collections.deque[tuple[tuple, cf.Future]] = collections.deque()
    pool = cf.ThreadPoolExecutor(max_workers=max(1, depth), thread_name_prefix="cache-prefetch")

    def submit() -> None:
        item = next(todo, None)
        if item is not None:
            name, size, crc = item
            pending.append((item, pool.submit(cache.fetch, store, name, size=size, crc32=crc, workers=workers)))

    try:
        for _ in range(max(1, depth)):
            submit()
        while pending:
            (name, size, crc), fut = pending.popleft()
            fut.result()  # downloaded (or failed: raise here, in the caller's thread)
            submit()
            # open() re-checks and pins; it only downloads again if the entry was evicted meanwhile.
            with cache.open(store, name, size=size, crc32=crc, workers=workers) as path:
                yield name, path
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
