"""Loading with threads instead of worker processes: ``make_loader(..., workers="threads")``, and what
``make_loader`` picks by default (``workers="auto"``) for the readers' own work.

Where a sample's work releases the GIL -- ``os.pread`` and LMDB reads,
memory copies of whole batches (``numpy.take``), libjpeg-turbo decoding
(simplejpeg) and torch's resize kernels -- threads in the training process
do the work of worker processes without their one big cost: a batch made in
a thread is already in the process that uses it, so nothing is copied into
shared memory, pickled or copied out again. Measured in
``docs/throughput.md`` (``dataset-bench --peers``).

:class:`readers.loader.dataloader.ThreadLoader` is a ``PackedLoader`` (sampler, epochs,
the per-epoch base seed, ``state_dict`` and exact mid-epoch resume are all
PackedLoader's); only its workers are threads, run by :class:`ThreadBatches`:

* the same batches in the same order as worker processes: batch ``k`` of a
  map-style reader is made by thread ``k % num_workers`` and batches come out
  in order; ``ShardDataset`` sees thread ``w`` of ``W`` exactly as it sees
  worker process ``w`` of ``W`` (``readers.contract.env.current_worker_env``), so each
  thread reads its slice of the rank's stream, and batches come out
  round-robin over the threads as they do from worker processes;
* seeding: each epoch's base seed is drawn from the loader's generator (as a
  DataLoader draws it) and thread ``w`` gets ``base_seed + w``
  (``readers.contract.env.thread_worker().seed``); the transforms of ``readers.decode.transforms``
  keep one random generator per thread, seeded from it, so a seeded run
  repeats. A transform that draws from torch's or numpy's global generator
  shares it between threads and does not repeat;
* ``worker_init_fn(w)`` runs at the start of thread ``w`` each epoch (a DataLoader runs it
  in each worker process it starts); with ``num_workers=0`` it is not run, as a DataLoader
  does not run it without workers;
* an exception in a thread is raised in the caller (the same exception,
  with a note naming the batch's samples), and stopping early (``break``)
  stops the threads;
* whole batches where the reader can read them (``get_batch``, and
  :mod:`readers.formats.shardbatch` for ``ShardDataset`` bytes) unless a
  ``collate_fn`` of the caller's own is given.

Each thread runs torch ops single-threaded (``torch.set_num_threads(1)`` is
per thread with the OpenMP backend): two loader threads on two cores each
asking for two intra-op threads would spin against each other.

``num_workers=0`` runs everything in the calling thread.
"""

from __future__ import annotations

import functools
import queue
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import IterableDataset

from readers.contract.env import ThreadWorker, as_thread_worker

__all__ = ["ThreadBatches", "fetch_batch"]

_DONE = object()


class _Failed:
    """An exception raised in a loader thread, with what it was doing."""

    def __init__(self, exc: BaseException, what: str) -> None:
        self.exc, self.what = exc, what


def fetch_batch(dataset: Any, indices: list[int], collate_fn: Callable[[list], Any],
                whole_batches: bool = True) -> Any:
    """One batch of a map-style dataset: its batch reader when it has one and ``whole_batches``
    (``get_batch``, no per-sample objects), else ``__getitems__`` (or one ``__getitem__`` per
    index) + ``collate_fn``."""
    get_batch = getattr(dataset, "get_batch", None) if whole_batches else None
    if get_batch is not None:
        batch = get_batch(indices)
        if batch is not None:
            return batch
    getitems = getattr(dataset, "__getitems__", None)
    items = getitems(indices) if getitems is not None else [dataset[i] for i in indices]
    return collate_fn(items)


class _Stop(Exception):
    pass


class _Worker(threading.Thread):
    """One loader thread: runs ``jobs()`` as loader thread ``worker`` and queues each result."""

    def __init__(self, worker: ThreadWorker, jobs: Callable[[], Iterable[Any]], depth: int,
                 stop: threading.Event) -> None:
        super().__init__(name=f"loader-thread-{worker.worker_id}", daemon=True)
        self.worker, self.jobs, self.stop = worker, jobs, stop
        self.out: queue.Queue = queue.Queue(maxsize=max(1, depth))

    def _put(self, item: Any) -> None:
        while True:
            if self.stop.is_set():
                raise _Stop
            try:
                self.out.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        torch.set_num_threads(1)  # per thread (OpenMP): this thread's torch ops stay on this thread
        try:
            with as_thread_worker(self.worker):
                for result in self.jobs():
                    self._put(result)
                self._put(_DONE)
        except _Stop:
            pass

    def get(self) -> Any:
        while True:
            try:
                return self.out.get(timeout=0.1)
            except queue.Empty:
                if not self.is_alive() and self.out.empty():
                    raise RuntimeError(f"{self.name} ended without finishing its batches") from None


class ThreadBatches:
    """One epoch of a :class:`readers.loader.dataloader.ThreadLoader`: starts its threads, hands out their
    batches in order, and stops them when done, closed, or dropped (the threads hold no
    reference to this object, so dropping it is enough)."""

    def __init__(self, loader: Any) -> None:
        # the workers' base seed, drawn like a DataLoader draws it (PackedLoader seeds the
        # generator per epoch, so an epoch -- and a resumed one -- repeats its seeds)
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
        # pinning needs an accelerator: without one, warn and do not pin, as a DataLoader's iterator does
        loader.pin_now = loader.pin_batches and torch.accelerator.is_available()
        if loader.pin_batches and not loader.pin_now:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used.", stacklevel=3)
        if isinstance(loader.dataset, IterableDataset):
            self._len = len(loader)
            jobs: Callable[[int, int], Iterable[Any]] = functools.partial(_stream_jobs, loader)
        else:
            batches = list(loader._index_sampler)
            self._len = len(batches)
            jobs = functools.partial(_map_jobs, loader, batches)
        self._gen = _run(loader, jobs, base_seed)

    def __iter__(self) -> "ThreadBatches":
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        """Stop the threads now (also done when this iterator is dropped)."""
        self._gen.close()

    _shutdown_workers = close  # the name DataLoader's iterators use

    def __del__(self) -> None:
        try:
            self._gen.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def _pinned(loader: Any, batch: Any) -> Any:
    if not loader.pin_now:
        return batch
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch)


def _map_jobs(loader: Any, batches: list[list[int]], w: int, n: int) -> Iterator[Any]:
    """Thread ``w`` of ``n``: batches ``w, w + n, ...`` of the epoch."""
    for indices in batches[w::n]:
        try:
            yield _pinned(loader, fetch_batch(loader.dataset, indices, loader.collate_fn, loader.whole_batches))
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            yield _Failed(exc, f"the batch of samples {indices[:8]}{'...' if len(indices) > 8 else ''}")


def _stream_jobs(loader: Any, w: int, _n: int) -> Iterator[Any]:
    """Thread ``w``: its part of an iterable dataset (ShardDataset: its slice of the rank's stream)."""
    from readers.formats import shardbatch

    batch: list = []
    try:
        if loader.whole_batches and shardbatch.supported(loader.dataset):  # whole batches, no items
            maps = loader._shard_maps.setdefault(w, shardbatch.ShardMaps())  # kept from epoch to epoch
            for whole in shardbatch.iter_batches(loader.dataset, loader.batch_size, loader.drop_last, maps):
                yield _pinned(loader, whole)
            return
        for item in loader.dataset:
            batch.append(item)
            if len(batch) == loader.batch_size:
                yield _pinned(loader, loader.collate_fn(batch))
                batch = []
        if batch and not loader.drop_last:
            yield _pinned(loader, loader.collate_fn(batch))
    except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
        yield _Failed(exc, "reading the stream")


def _run(loader: Any, jobs: Callable[[int, int], Iterable[Any]], base_seed: int) -> Iterator[Any]:
    if loader.num_workers == 0:  # the calling thread, as a DataLoader with no workers
        yield from (_check(r) for r in jobs(0, 1))
        return
    n, stop = loader.num_workers, threading.Event()
    init = loader.worker_init_fn
    threads = [_Worker(ThreadWorker(w, n, base_seed + w), functools.partial(_started, init, jobs, w, n),
                       loader.prefetch_factor or 2, stop) for w in range(n)]
    for t in threads:
        t.start()
    try:
        live = list(threads)
        while live:  # round-robin, skipping threads that are done (as DataLoader does)
            for t in list(live):
                result = t.get()
                if result is _DONE:
                    live.remove(t)
                    continue
                yield _check(result)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5.0)


def _started(init: Callable[[int], None] | None, jobs: Callable[[int, int], Iterable[Any]], w: int,
             n: int) -> Iterator[Any]:
    """Thread ``w``'s jobs, after the loader's ``worker_init_fn(w)`` (run in that thread, as a
    DataLoader runs it in each worker process; ``get_worker_info()`` is None there, and
    ``readers.contract.env.thread_worker()`` says which thread it is)."""
    if init is not None:
        try:
            init(w)
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            yield _Failed(exc, f"worker_init_fn({w})")
            return
    yield from jobs(w, n)


def _check(result: Any) -> Any:
    if isinstance(result, _Failed):  # the original exception, as a DataLoader worker's arrives
        result.exc.add_note(f"(raised in a loader thread, on {result.what})")
        raise result.exc
    return result
