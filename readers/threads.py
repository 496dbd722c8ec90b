"""Loading with threads instead of worker processes: ``make_loader(..., workers="threads")``.

Where a sample's work releases the GIL -- ``os.pread`` and LMDB reads,
memory copies of whole batches (``numpy.take``), libjpeg-turbo decoding
(simplejpeg) and torch's resize kernels -- threads in the training process
do the work of worker processes without their one big cost: a batch made in
a thread is already in the process that uses it, so nothing is copied into
shared memory, pickled or copied out again. Measured in
``docs/throughput.md`` (``dataset-bench --peers``).

:class:`ThreadLoader` keeps the DataLoader's contract where it matters:

* the same batches in the same order as ``make_loader`` with as many worker
  processes: map-style readers take the same sampler (``EpochSampler``, or
  ``DistributedSampler`` under DDP), batch ``k`` is made by thread
  ``k % num_workers`` and batches come out in order; ``ShardDataset`` sees
  thread ``w`` of ``W`` exactly as it sees worker process ``w`` of ``W``
  (``readers.env.current_worker_env``), so each thread reads its slice of the
  rank's stream, and batches come out round-robin over the threads as they
  do from worker processes;
* an epoch counter (``set_epoch``, or the next epoch per ``iter()``) that
  reaches the sampler and the dataset;
* seeding: each ``iter()`` draws a base seed from the loader's generator
  (as a DataLoader does) and thread ``w`` gets ``base_seed + w``
  (``readers.env.thread_worker().seed``); the transforms of ``readers.transforms``
  keep one random generator per thread, seeded from it, so a seeded run
  repeats. A transform that draws from torch's or numpy's global generator
  shares it between threads and does not repeat;
* an exception in a thread is raised in the caller (the same exception,
  with a note naming the batch's samples), and stopping early (``break``)
  stops the threads.

Each thread runs torch ops single-threaded (``torch.set_num_threads(1)`` is
per thread with the OpenMP backend): two loader threads on two cores each
asking for two intra-op threads would spin against each other.

``num_workers=0`` runs everything in the calling thread.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import BatchSampler, IterableDataset

from readers.env import ThreadWorker, as_thread_worker

__all__ = ["ThreadLoader", "fetch_batch"]

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


class ThreadLoader:
    """Iterates batches made by ``num_workers`` threads; see the module docstring.

    Build it with ``readers.make_loader(dataset, ..., workers="threads")``.
    """

    def __init__(self, dataset: Any, batch_size: int, *, num_workers: int, sampler: Any = None,
                 drop_last: bool = False, collate_fn: Callable[[list], Any], prefetch_factor: int = 2,
                 generator: torch.Generator | None = None, pin_memory: bool = False,
                 whole_batches: bool = True) -> None:
        """``whole_batches``: ``collate_fn`` is the readers' own, so a reader's whole-batch read
        (``get_batch``, ``readers.shardbatch``) may stand in for items + collate."""
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers
        self.sampler, self.drop_last, self.collate_fn = sampler, drop_last, collate_fn
        self.prefetch_factor, self.generator, self.pin_memory = prefetch_factor, generator, pin_memory
        self.whole_batches = whole_batches
        self.iterable = isinstance(dataset, IterableDataset)
        self.batch_sampler = None if self.iterable else BatchSampler(sampler, batch_size, drop_last)
        self._epoch, self._explicit, self._started = 0, False, False
        self._shard_maps: dict[int, dict] = {}  # thread -> its shards' mappings (readers.shardbatch)

    # ------------------------------------------------------------ epochs (as PackedLoader)
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch, self._explicit = int(epoch), True

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        # an iterable dataset split evenly over the threads (as ShardDataset splits a rank's
        # samples), each thread batching its own part
        n, w = len(self.dataset), max(1, self.num_workers)
        parts = [n // w + (1 if k < n % w else 0) for k in range(w)]
        return sum(p // self.batch_size if self.drop_last else -(-p // self.batch_size) for p in parts)

    def _begin_epoch(self) -> int:
        if not self._explicit and self._started:
            self._epoch += 1
        self._explicit, self._started = False, True
        for obj in (self.sampler, self.dataset):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(self._epoch)
        # A base seed per iter(), drawn like a DataLoader draws its workers' base seed.
        return int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        base_seed = self._begin_epoch()
        if self.iterable:
            return self._run(self._stream_jobs, base_seed)
        batches = list(self.batch_sampler)
        return self._run(lambda w, n: self._map_jobs(batches[w::n]), base_seed)

    def _pinned(self, batch: Any) -> Any:
        if not self.pin_memory:
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch)

    def _map_jobs(self, batches: list[list[int]]) -> Iterator[Any]:
        for indices in batches:
            try:
                yield self._pinned(fetch_batch(self.dataset, indices, self.collate_fn, self.whole_batches))
            except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
                yield _Failed(exc, f"the batch of samples {indices[:8]}{'...' if len(indices) > 8 else ''}")

    def _stream_jobs(self, w: int, _n: int) -> Iterator[Any]:
        from readers import shardbatch

        batch: list = []
        try:
            if self.whole_batches and shardbatch.supported(self.dataset):  # whole batches, no items
                maps = self._shard_maps.setdefault(w, {})  # kept from epoch to epoch
                for whole in shardbatch.iter_batches(self.dataset, self.batch_size, self.drop_last, maps):
                    yield self._pinned(whole)
                return
            for item in self.dataset:
                batch.append(item)
                if len(batch) == self.batch_size:
                    yield self._pinned(self.collate_fn(batch))
                    batch = []
            if batch and not self.drop_last:
                yield self._pinned(self.collate_fn(batch))
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            yield _Failed(exc, "reading the stream")

    def _run(self, jobs: Callable[[int, int], Iterable[Any]], base_seed: int) -> Iterator[Any]:
        n = max(1, self.num_workers)
        if self.num_workers == 0:  # the calling thread, as a DataLoader with no workers
            yield from (self._check(r) for r in jobs(0, 1))
            return
        stop = threading.Event()
        workers = [_Worker(ThreadWorker(w, n, base_seed + w), lambda w=w: jobs(w, n), self.prefetch_factor, stop)
                   for w in range(n)]
        for t in workers:
            t.start()
        try:
            live = list(workers)
            while live:  # round-robin, skipping threads that are done (as DataLoader does)
                for t in list(live):
                    result = t.get()
                    if result is _DONE:
                        live.remove(t)
                        continue
                    yield self._check(result)
        finally:
            stop.set()
            for t in workers:
                t.join(timeout=5.0)

    @staticmethod
    def _check(result: Any) -> Any:
        if isinstance(result, _Failed):  # the original exception, as a DataLoader worker's arrives
            result.exc.add_note(f"(raised in a loader thread, on {result.what})")
            raise result.exc
        return result
