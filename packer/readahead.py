"""Run an iterator a little ahead of its consumer, in a thread.

The write stage spends much of its time where the GIL is released: LMDB's
commit (it writes and fdatasyncs the transaction's pages), shard and HDF5
writes, fsyncs at checkpoints. Whatever produces the samples (reading the
source files, checking headers, CRC-32s) can run in those gaps when it runs
in another thread. :func:`read_ahead` does that with a bounded queue, so
memory stays bounded by bytes as well as by count.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")
_DONE = object()


def read_ahead(items: Iterator[T], size: Callable[[T], int], *, max_bytes: int = 64 << 20,
               chunk_items: int = 32, name: str = "read-ahead") -> Iterator[T]:
    """``items``, produced by a thread that runs up to about ``max_bytes`` ahead.

    ``size(item)`` is the item's weight in bytes; the thread hands items over
    in chunks of ``chunk_items`` or ``max_bytes / 16`` bytes, whichever comes
    first, and keeps at most 16 chunks queued. An error in the thread is raised
    here, after the items before it; closing this generator stops the thread
    (and closes ``items`` there, if it is a generator).
    """
    depth = 16
    chunk_bytes = max(1, max_bytes // depth)
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(chunk: object) -> bool:
        while not stop.is_set():
            try:
                q.put(chunk, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        chunk: list = []
        try:
            weight = 0
            for item in items:
                chunk.append(item)
                weight += size(item)
                if len(chunk) >= chunk_items or weight >= chunk_bytes:
                    if not put(chunk):
                        return
                    chunk, weight = [], 0
            if chunk and not put(chunk):
                return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            if not chunk or put(chunk):  # the items before the error first
                put(exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while (chunk := q.get()) is not _DONE:
            if isinstance(chunk, BaseException):
                raise chunk
            yield from chunk
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue, then let it finish
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.05)
