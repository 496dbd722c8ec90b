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
  ``collate_fn`` of the caller's own is given; ``make_loader(batch_transform=f)``
  runs ``f`` on each batch in the thread that made it (``_pinned``).

Each thread runs torch ops single-threaded (``torch.set_num_threads(1)`` is
per thread with the OpenMP backend): two loader threads on two cores each
asking for two intra-op threads would spin against each other.

``num_workers=0`` runs everything in the calling thread; ``make_loader`` (``workers="auto"``) then
picks this loader where it reads whole batches (:func:`_whole_batches`), the DataLoader otherwise.
"""

from __future__ import annotations

import functools
import queue
import threading
import warnings
from typing import Any, Callable, Generator, Iterable, Iterator

import torch
from torch.utils.data import IterableDataset

from readers.contract.env import ThreadWorker, as_thread_worker
from readers.decode import compose
from readers.formats.base import MapReader, PackedDataset, ReadsBatches, ReadsItems
from readers.loader.collation import then
from readers.order.mixture import Mixture
from readers.order.subsets import Subset

__all__ = ["ThreadBatches", "fetch_batch", "choose_workers", "WORKER_KINDS"]

_DONE = object()


class _Failed:
    """An exception raised in a loader thread, with what it was doing."""

    def __init__(self, exc: BaseException, what: str) -> None:
        self.exc, self.what = exc, what


def fetch_batch(dataset: Any, indices: list[int], collate_fn: Callable[[list], Any],
                whole_batches: bool = True) -> Any:
    """One batch of a map-style dataset: its batch reader when it has one and ``whole_batches``
    (:class:`~readers.formats.base.ReadsBatches`, no per-sample objects), else its items in one call
    (:class:`~readers.formats.base.ReadsItems`) or one ``dataset[i]`` per index, + ``collate_fn``."""
    if whole_batches and isinstance(dataset, ReadsBatches):
        batch = dataset.get_batch(indices)
        if batch is not None:
            return batch
    items = dataset.__getitems__(indices) if isinstance(dataset, ReadsItems) else [dataset[i] for i in indices]
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
        elif loader.num_workers == 0:  # the calling thread: the sampler's batches one by one, as a DataLoader
            self._len = len(loader._index_sampler)
            jobs = functools.partial(_map_jobs, loader, loader._index_sampler)
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
    """A batch this thread made, through the loader's ``batch_transform`` (if any), then pinned."""
    batch = then(loader.batch_transform, batch)
    if not loader.pin_now:
        return batch
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch)


def _map_jobs(loader: Any, batches: Iterable[list[int]], w: int, n: int) -> Iterator[Any]:
    """Thread ``w`` of ``n``: batches ``w, w + n, ...`` of the epoch (``batches`` a list, or any iterable
    when ``n`` is 1)."""
    for indices in (batches if n == 1 else batches[w::n]):  # type: ignore[index]
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


def _run(loader: Any, jobs: Callable[[int, int], Iterable[Any]], base_seed: int) -> Generator[Any, None, None]:
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


# --------------------------------------------------------------------------- workers="auto"


WORKER_KINDS = ("auto", "threads", "processes")


def _own_transform(transform: Any) -> bool:
    """A transform of this package (``readers.decode.transforms``), or a Compose of nothing else: its work
    (JPEG decode in libjpeg-turbo, torch resize kernels) runs with the GIL released."""
    parts = compose.steps(transform)
    if parts is not None:
        return bool(parts) and all(_own_transform(t) for t in parts)
    return type(transform).__module__.startswith("readers.")


def _first_reason(dataset: Any, reason: Callable[[Any], str | None]) -> str | None:
    """``reason(reader)`` for the first reader under ``dataset`` that has one: each source of a mixture,
    the dataset under a subset, else ``dataset`` itself."""
    if isinstance(dataset, Mixture):  # every source must do
        return next((why for why in (_first_reason(s, reason) for s in dataset.sources) if why is not None), None)
    if isinstance(dataset, Subset):
        return _first_reason(dataset.dataset, reason)
    return reason(dataset)


def _gil_free(dataset: Any) -> str | None:
    """Why ``dataset``'s per-sample work may hold the GIL (so worker processes suit it better), or None
    when it releases it: a reader of this package reading stored bytes, stored pixels, or decoding
    with its own decode and transforms."""
    if not isinstance(dataset, PackedDataset):
        return f"a dataset of your own ({type(dataset).__name__})"
    sample_transform = getattr(dataset, "sample_transform", None)
    if sample_transform is not None:  # Python of the caller's own per sample, like a transform (issue 33 item 12)
        return f"a Python sample_transform of your own ({getattr(sample_transform, '__name__', type(sample_transform).__name__)})"
    if not dataset.decode:
        return None
    if dataset.image == "pil":
        return "image='pil' (PIL images)"
    if dataset.transform is not None and not _own_transform(dataset.transform):
        return f"a Python transform of your own ({type(dataset.transform).__name__})"
    return None


def _decodes_per_sample(dataset: Any) -> str | None:
    """Why worker processes beat threads for ``dataset`` although its work releases the GIL, or None:
    a map-style reader that decodes (or resamples) each sample with its own decode and transforms.
    Between those GIL-free calls each sample still runs Python (read, crop box, collate), and loader
    threads queue for one GIL there: with 2 workers on 2 cores, worker processes delivered 0-20%
    more images/s than threads for lmdb and hdf5 (eval and train transforms; ``ShardDataset`` the same
    in both kinds, so it keeps threads)."""
    if isinstance(dataset, MapReader) and dataset.decode and not dataset.batchable():
        return "a map-style reader decoding each sample (processes keep the Python between decodes off one GIL)"
    return None


def _whole_batches(dataset: Any) -> bool:
    """True for a reader whose batches a :class:`~readers.loader.dataloader.ThreadLoader` reads whole
    (no object per sample): a ``ShardDataset`` of stored bytes (``readers.formats.shardbatch``), or a
    map-style reader whose ``get_batch`` takes its settings (stored bytes, stored pixels). With no
    workers the DataLoader still fetches such a batch through one ``Pending`` or index per sample and
    its collate; the ThreadLoader reads it in one call in the calling thread: 0-worker bytes
    measured 1.1-1.3x as fast that way (docs/throughput.md)."""
    from readers.formats import shardbatch

    if shardbatch.supported(dataset):
        return True
    return isinstance(dataset, MapReader) and dataset.batchable()


def choose_workers(dataset: Any, *, num_workers: int, collate_fn: Callable | None = None,
                   multiprocessing_context: Any = None, worker_init_fn: Callable | None = None) -> tuple[str, str]:
    """The worker kind ``make_loader(workers="auto")`` picks for ``dataset``, and why: ``("threads", why)``
    when the per-sample work releases the GIL (this package's readers, with ``decode=False``, stored
    pixels, or ``ShardDataset``'s own decode and transforms) so threads do it without copying batches
    between processes; ``("processes", why)`` when Python code of the caller's own runs per sample or
    per batch (a transform, a ``collate_fn``, a dataset), which would hold the GIL in threads, a
    ``worker_init_fn`` (often written for worker processes: ``get_worker_info()``, global seeds), or a
    map-style reader decodes each sample (:func:`_decodes_per_sample`: measured faster in processes)."""
    if num_workers == 0:
        if collate_fn is None and _whole_batches(dataset):
            return "threads", "num_workers=0: whole batches read in the calling thread, no per-sample fetch"
        return "processes", "num_workers=0: everything runs in the calling thread"
    if multiprocessing_context is not None:
        return "processes", "a multiprocessing_context was given"
    if worker_init_fn is not None:
        return "processes", "a worker_init_fn of your own"
    if collate_fn is not None:
        return "processes", f"a collate_fn of your own ({getattr(collate_fn, '__name__', type(collate_fn).__name__)})"
    why = _first_reason(dataset, _gil_free) or _first_reason(dataset, _decodes_per_sample)
    if why is not None:
        return "processes", why
    return "threads", "the reader's own work releases the GIL (stored bytes, stored pixels, its own decode and transforms)"
