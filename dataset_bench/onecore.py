"""Per-image work timed on one core: the decode, transform and validation benchmarks' common timer.

:func:`single_core` pins the process to one CPU and torch to one thread
(restoring both after); :func:`per_image_rates` times functions over images
held in memory, passes interleaved, and reports images per wall-second and
per CPU-second. On one core the CPU time is the time the work took whether
or not other processes shared the core, so the CPU rate is the robust figure
on a busy machine; on an idle one the two agree.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

__all__ = ["single_core", "per_image_rates"]

MB = 1e6


@contextmanager
def single_core(cpu: int | None = None) -> Iterator[int | None]:
    """Run the block on one CPU (``cpu``, default the lowest usable) with torch on one thread.

    Yields the CPU pinned to (None where the OS cannot pin). The affinity
    and torch's thread count are restored afterwards.
    """
    import torch

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pinned = cpu if cpu is not None else (min(affinity) if affinity else None)
    threads = torch.get_num_threads()
    if pinned is not None and affinity is not None:
        os.sched_setaffinity(0, {pinned})
    torch.set_num_threads(1)
    try:
        yield pinned if affinity is not None else None
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def _one_pass(make: Callable[[], Callable[[bytes], Any]], blobs: Sequence[bytes]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one pass of a fresh ``make()`` over ``blobs``."""
    fn = make()  # fresh callable each pass: a seeded transform does the same work every pass
    c0, t0 = time.process_time(), time.perf_counter()
    for data in blobs:
        fn(data)
    return time.process_time() - c0, time.perf_counter() - t0


def per_image_rates(cases: Sequence[tuple[Callable[[], Callable[[bytes], Any]], Sequence[bytes]]],
                    repeats: int = 1) -> list[dict[str, Any]]:
    """Median rates of each ``(make, blobs)`` case: ``make()`` returns the per-image function.

    Each case first warms up on 1/20 of its images (imports, probes, caches).
    Passes are interleaved -- repeat 1 of every case, then repeat 2, ... -- so
    a burst of load from elsewhere hits all cases alike. Per case:
    ``images``, ``images_per_s`` (wall), ``images_per_cpu_s``, ``mb_per_s``
    (compressed input per wall-second), ``seconds`` (wall time of a pass at
    the median rate) and each pass's rates (``runs_wall``, ``runs_cpu``).
    """
    for make, blobs in cases:
        fn = make()
        for data in blobs[: max(1, len(blobs) // 20)]:
            fn(data)
    runs: list[list[tuple[float, float]]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, (make, blobs) in enumerate(cases):
            runs[i].append(_one_pass(make, blobs))
    out = []
    for (_make, blobs), passes in zip(cases, runs):
        n, nbytes = len(blobs), sum(len(b) for b in blobs)
        runs_wall = [n / max(w, 1e-9) for _, w in passes]
        runs_cpu = [n / max(c, 1e-9) for c, _ in passes]
        rate = statistics.median(runs_wall)
        out.append({"images": n, "seconds": n / rate, "images_per_s": rate,
                    "images_per_cpu_s": statistics.median(runs_cpu), "mb_per_s": nbytes / n * rate / MB,
                    "runs_wall": runs_wall, "runs_cpu": runs_cpu})
    return out
