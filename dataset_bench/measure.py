"""One loader measurement: build a loader, iterate it once, time it and weigh its processes.

:func:`measure_loader` is the one timing loop; :func:`measure_format` (a
packed dataset through ``readers.make_loader``) and :func:`measure_naive`
(the naive baseline) are the two kinds of loader ``dataset-bench`` times, and
the benchmark scripts and notebooks call :func:`measure_loader` on loaders of
their own (e.g. the official ``webdataset`` reader).
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from dataset_bench.machine import process_tree_pss
from dataset_bench.naive import naive_loader

__all__ = ["MODES", "MIN_WINDOW_BATCHES", "MIN_WINDOW_S", "LoaderStats", "short_window", "batch_len", "best_time", "shutdown_loader", "measure_loader", "measure_format",
           "measure_naive", "eval_transform"]

MODES = ("raw", "decoded")  # raw: decode=False (stored bytes / pixels); decoded: the eval transform
MB = 1e6
#: the shortest timing window a samples/s figure is reported from: a window of a batch or two times the
#: batches the workers had already prefetched (e.g. 2,106,249 samples/s for decoded mmap from 200 images)
MIN_WINDOW_BATCHES = 10
MIN_WINDOW_S = 0.1


@dataclass
class LoaderStats:
    """One pass of one loader."""

    samples: int
    batches: int
    seconds: float  # loader construction to last batch
    first_batch_s: float  # loader construction to first batch (worker start-up included)
    samples_per_s: float  # steady rate: samples after batch max(1, num_workers) / time after it
    epoch_samples_per_s: float  # all samples / all time, start-up included
    mb_per_s: float  # dataset bytes behind the samples read, per second (steady)
    pss_main_mb: float | None  # peak PSS of the main process during the pass
    pss_workers_mb: float | None  # peak summed PSS of the worker processes
    pss_total_mb: float | None
    shuffle_ratio: float | None = None  # distinct classes per batch / a uniform shuffle's (readers.order.quality)
    displacement_ratio: float | None = None  # mean move from the packed position / a uniform shuffle's
    window_batches: int = 0  # batches inside the timing window of samples_per_s
    window_s: float = 0.0  # seconds of that window

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def short_window(batches: int, seconds: float, min_batches: int = MIN_WINDOW_BATCHES,
                 min_s: float = MIN_WINDOW_S) -> str | None:
    """Why a rate timed over ``batches`` batches in ``seconds`` is not a figure (None: it is one).

    A window needs at least ``min_batches`` batches and ``min_s`` seconds.
    """
    if batches >= min_batches and seconds >= min_s:
        return None
    return (f"timed over {batches} batch{'es' if batches != 1 else ''} in {seconds:.3f} s, under the minimum "
            f"{min_batches} batches and {min_s:g} s")


def eval_transform(size: int = 224, resize: int = 256) -> Any:
    """The decoded mode's transform: the readers' ImageNet eval transform (resize, center crop, uint8 CHW)."""
    from readers.decode.transforms import imagenet_eval_transform

    return imagenet_eval_transform(size=size, resize=resize)


def batch_len(batch: Any) -> int:
    """Samples in a batch: the length of its first field (a tensor, a ByteBatch, a list), else 1."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    try:
        return len(first)
    except TypeError:
        return 1


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def shutdown_loader(loader: Any, it: Any = None) -> None:
    """Stop the loader's workers now (persistent workers would outlive the pass) and close the dataset."""
    for obj in (it, getattr(loader, "_iterator", None)):
        stop = getattr(obj, "_shutdown_workers", None)
        if stop is not None:
            stop()
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None
    close = getattr(getattr(loader, "dataset", None), "close", None)
    if close is not None:
        close()


class _PeakPss:
    """Peak PSS of this process, its children and both together, sampled at most every ``interval`` s."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.peak: dict[str, int | None] = {"main": None, "workers": None, "total": None}
        self._next = 0.0

    def sample(self, now: float | None = None) -> None:
        if now is not None and now < self._next:
            return
        main_pss, workers_pss = process_tree_pss()
        if main_pss is not None:
            for key, value in (("main", main_pss), ("workers", workers_pss), ("total", main_pss + workers_pss)):
                self.peak[key] = max(self.peak[key] or 0, value)
        self._next = time.perf_counter() + self.interval

    def mb(self, key: str) -> float | None:
        return None if self.peak["main"] is None else round((self.peak[key] or 0) / MB, 1)


def measure_loader(make: Callable[[], Any], *, bytes_per_sample: float = 0.0, max_samples: int | None = None,
                   pss_interval: float = 0.25, on_batch: Callable[[Any], None] | None = None) -> LoaderStats:
    """Build a loader with ``make()``, iterate it once, and time it.

    The clock starts before ``make()``. The steady rate counts from the
    arrival of batch ``k = max(1, loader.num_workers)`` -- by then each
    worker has delivered the batch it built during start-up -- to the last
    batch; with ``k`` batches or fewer it falls back to the whole pass. PSS of
    this process and its children is sampled at the first batch, then at most
    every ``pss_interval`` seconds and after the last batch (before the
    workers stop); the peaks are reported. ``max_samples`` stops the pass
    early. ``on_batch(batch)`` runs on every batch (inside the timing).
    """
    gc.collect()
    t0 = time.perf_counter()
    loader = make()
    warmup = max(1, int(getattr(loader, "num_workers", 0) or 0))
    it = None
    arrivals: list[tuple[float, int]] = []  # (time, samples so far) per batch
    pss = _PeakPss(pss_interval)
    try:
        it = iter(loader)
        samples = 0
        for batch in it:
            samples += batch_len(batch)
            if on_batch is not None:
                on_batch(batch)
            now = time.perf_counter()
            arrivals.append((now, samples))
            pss.sample(now)
            if max_samples is not None and samples >= max_samples:
                break
        pss.sample()
    finally:
        shutdown_loader(loader, it)
        del it
    return _loader_stats(t0, arrivals, warmup, bytes_per_sample, pss)


def _loader_stats(t0: float, arrivals: list[tuple[float, int]], warmup: int, bytes_per_sample: float,
                  pss: _PeakPss) -> LoaderStats:
    samples = arrivals[-1][1] if arrivals else 0
    t_first = arrivals[0][0] if arrivals else t0
    t_last = arrivals[-1][0] if arrivals else t0
    total = t_last - t0
    epoch_rate = samples / total if total > 0 else 0.0
    window_batches, window_s, rate = len(arrivals), total, epoch_rate  # a pass of `warmup` batches or fewer
    if len(arrivals) > warmup:
        t_start, n_start = arrivals[warmup - 1]
        if t_last > t_start:
            window_batches, window_s = len(arrivals) - warmup, t_last - t_start
            rate = (samples - n_start) / window_s
    return LoaderStats(
        samples=samples, batches=len(arrivals), seconds=total, first_batch_s=t_first - t0,
        samples_per_s=rate, epoch_samples_per_s=epoch_rate, mb_per_s=rate * bytes_per_sample / MB,
        pss_main_mb=pss.mb("main"), pss_workers_mb=pss.mb("workers"), pss_total_mb=pss.mb("total"),
        window_batches=window_batches, window_s=window_s,
    )


def measure_naive(src: str | os.PathLike, *, num_workers: int, batch_size: int, max_samples: int | None = None,
                  bytes_per_sample: float = 0.0, seed: int = 0) -> LoaderStats:
    """The baseline: :func:`dataset_bench.naive.naive_loader` (plain ``DataLoader``: no pinning, not persistent)."""
    return measure_loader(lambda: naive_loader(src, batch_size=batch_size, num_workers=num_workers, seed=seed),
                          bytes_per_sample=bytes_per_sample, max_samples=max_samples)


def measure_format(path: str | os.PathLike, *, mode: str, num_workers: int, batch_size: int,
                   max_samples: int | None = None, bytes_per_sample: float = 0.0, seed: int = 0,
                   transform: Any = None, **loader_kwargs: Any) -> LoaderStats:
    """A packed dataset through ``make_loader``: ``mode`` "raw" (decode=False) or "decoded" (eval transform)."""
    from readers import make_loader, open_dataset

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    made: list[Any] = []
    seen: list[tuple] = []

    def make() -> Any:
        if mode == "raw":
            ds = open_dataset(path, decode=False, return_index=True)
        else:
            ds = open_dataset(path, transform=transform if transform is not None else eval_transform(),
                              return_index=True)
        made.append(ds)
        return make_loader(ds, batch_size=batch_size, num_workers=num_workers, seed=seed, **loader_kwargs)

    stats = measure_loader(make, bytes_per_sample=bytes_per_sample, max_samples=max_samples,
                           on_batch=lambda batch: seen.append((None, batch[1], batch[2])))
    return _with_shuffle_quality(stats, made[0].index, seen)


def _with_shuffle_quality(stats: LoaderStats, index: Any, batches: list[tuple]) -> LoaderStats:
    """``stats`` with the shuffle quality of the batches it timed (labels and sample indices)."""
    from readers.order.quality import measure

    if not batches:
        return stats
    quality = measure(batches, index.meta["class_counts"], index.num_samples)
    stats.shuffle_ratio = round(quality.distinct_ratio, 3)
    stats.displacement_ratio = None if quality.displacement_ratio is None else round(quality.displacement_ratio, 3)
    return stats
