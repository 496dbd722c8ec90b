"""Is the GPU starving? Time spent waiting for the next batch versus time spent in the step.

Wrap any iterable loader::

    meter = StarvationMeter(loader)
    for images, labels in meter:
        images = meter.to_device(images, "cuda")   # optional: times the host-to-device copy
        loss = step(images, labels)
    print(meter.report())   # or meter.summary() for the numbers

Per step the meter records two intervals with ``time.perf_counter``:

``wait``
    from asking the loader for the next batch to getting it (the trainer is
    idle: data-bound time);
``step``
    from getting the batch to asking for the next one (whatever the loop body
    does: the training step, logging, the copy to the device).

The first wait includes the loader's start-up (worker processes, opening
files) and is reported on its own (``first_wait_s``); the shares, the
percentiles and the verdict use the steady state, steps 2..n (all steps
when there is only one).

CUDA runs asynchronously: a step that only *queues* kernels returns at once
and its GPU time would then be counted as the next wait. With
``cuda_sync=True`` (the default when CUDA is initialized) the meter calls
``torch.cuda.synchronize()`` at the end of every step, so that GPU time is
counted as step time. This removes some overlap; use it to measure, not in
production runs.

Host-to-device copy ("ToCUDA") time comes from, in order of preference:
:meth:`StarvationMeter.to_device` (CUDA events around the copy on the current
stream, ``perf_counter`` on CPU), :meth:`StarvationMeter.record_copy` (a hook
for your own timing, seconds), or the wrapped loader's ``copy_times`` list
(seconds, e.g. :class:`readers.loader.prefetch.DevicePrefetcher`).

``StarvationMeter(loader, profile_dir=...)`` also runs ``torch.profiler`` over
a few steps (``profile_steps``, after one skipped and one warm-up step) and
writes a Chrome trace (``chrome://tracing`` or https://ui.perfetto.dev) with
``StarvationMeter.wait`` and ``StarvationMeter.step`` ranges.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

__all__ = ["StarvationMeter", "verdict"]


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method), ``q`` in 0..100."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def verdict(wait_share: float | None, threshold: float = 0.2) -> str:
    """A one-line reading of a data-wait share (0..1)."""
    if wait_share is None:
        return "no steps measured"
    pct = f"{wait_share:.0%}"
    if wait_share >= threshold:
        return f"loader-bound: {pct} of time waiting for data"
    if wait_share >= 0.05:
        return f"mostly compute-bound: {pct} of time waiting for data"
    return f"compute-bound: the loader keeps up ({pct} of time waiting for data)"


def _count(batch: Any) -> int | None:
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    try:
        return len(first)
    except TypeError:
        return None


def _move(value: Any, device: Any, non_blocking: bool) -> Any:
    """Tensors inside tuples / lists / dicts / named tuples, moved to ``device``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # named tuple (e.g. ByteBatch)
        return type(value)(*(_move(v, device, non_blocking) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_move(v, device, non_blocking) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device, non_blocking) for k, v in value.items()}
    return value


class StarvationMeter:
    """Wraps an iterable loader; measures data-wait versus step time per step.

    ``batch_size`` is used to count samples when a batch has no length;
    ``count(batch) -> int`` overrides the count. ``threshold`` is the wait
    share above which the verdict says "loader-bound". ``cuda_sync``: see the
    module docstring (None: on when CUDA is initialized). ``profile_dir``:
    write a ``torch.profiler`` Chrome trace there, covering
    ``profile_steps`` steps.
    """

    def __init__(self, loader: Iterable, *, batch_size: int | None = None,
                 count: Callable[[Any], int] | None = None, threshold: float = 0.2,
                 cuda_sync: bool | None = None, profile_dir: str | os.PathLike | None = None,
                 profile_steps: int = 3) -> None:
        if profile_steps < 1:
            raise ValueError(f"profile_steps must be >= 1, got {profile_steps}")
        self.loader = loader
        self.batch_size = batch_size
        self._count = count
        self.threshold = threshold
        self.cuda_sync = cuda_sync
        self.profile_dir = Path(profile_dir) if profile_dir is not None else None
        self.profile_steps = profile_steps
        self.trace_path: Path | None = None
        self.reset()

    # ------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every measurement (e.g. between epochs, to summarize each one)."""
        self.waits: list[float] = []
        self.steps: list[float] = []
        self.samples = 0
        self.wall = 0.0
        self._copies: list[float] = []
        self._pending_events: list[tuple[Any, Any]] = []
        self._loader_copies_start = len(getattr(self.loader, "copy_times", None) or [])

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _sync_wanted(self) -> bool:
        if self.cuda_sync is not None:
            return self.cuda_sync
        try:
            import torch

            return torch.cuda.is_available() and torch.cuda.is_initialized()
        except (ImportError, RuntimeError):
            return False

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        profiler = self._start_profiler()
        sync = self._sync_wanted()
        if sync:
            import torch
        it = iter(self.loader)
        t_begin = time.perf_counter()
        try:
            while True:
                t0 = time.perf_counter()
                with self._range(profiler, "StarvationMeter.wait"):
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                t1 = time.perf_counter()
                self.waits.append(t1 - t0)
                n = self._count(batch) if self._count is not None else _count(batch)
                self.samples += n if n is not None else (self.batch_size or 0)
                with self._range(profiler, "StarvationMeter.step"):
                    yield batch
                    if sync:
                        torch.cuda.synchronize()
                self.steps.append(time.perf_counter() - t1)
                if profiler is not None:
                    profiler.step()
        finally:
            self.wall += time.perf_counter() - t_begin
            if profiler is not None:
                self._stop_profiler(profiler)

    @staticmethod
    def _range(profiler: Any, name: str) -> Any:
        if profiler is None:
            import contextlib

            return contextlib.nullcontext()
        from torch.profiler import record_function

        return record_function(name)

    # ------------------------------------------------------------ profiler
    def _start_profiler(self) -> Any:
        if self.profile_dir is None:
            return None
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.profile_dir.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        path = self.profile_dir / f"starvation-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.json"

        def export(prof: Any) -> None:
            prof.export_chrome_trace(str(path))
            self.trace_path = path

        prof = profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=self.profile_steps, repeat=1),
                       on_trace_ready=export, record_shapes=False)
        prof.start()
        return prof

    def _stop_profiler(self, prof: Any) -> None:
        prof.stop()
        if self.trace_path is None and self.profile_dir is not None:  # fewer steps than the schedule: export what was recorded
            try:
                path = self.profile_dir / f"starvation-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.json"
                prof.export_chrome_trace(str(path))
                self.trace_path = path
            except (RuntimeError, AssertionError):  # nothing was recorded
                pass

    # ------------------------------------------------------------ host-to-device copies
    def to_device(self, batch: Any, device: Any, non_blocking: bool = True) -> Any:
        """Move the tensors in ``batch`` to ``device`` and time the copy.

        On CUDA the copy is timed with events on the current stream (read
        lazily, no synchronization here); elsewhere with ``perf_counter``.
        """
        import torch

        dev = torch.device(device)
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = _move(batch, dev, non_blocking)
            end.record()
            self._pending_events.append((start, end))
            return out
        t0 = time.perf_counter()
        out = _move(batch, dev, non_blocking)
        self._copies.append(time.perf_counter() - t0)
        return out

    def record_copy(self, seconds: float) -> None:
        """Record one host-to-device copy timed elsewhere (seconds)."""
        self._copies.append(float(seconds))

    def copy_times(self) -> tuple[list[float], str | None]:
        """(copy seconds per batch, where they came from) -- waits for pending CUDA events."""
        if self._pending_events:
            for start, end in self._pending_events:
                end.synchronize()
                self._copies.append(start.elapsed_time(end) / 1000.0)
            self._pending_events.clear()
        if self._copies:
            return list(self._copies), "meter"
        loader_times = getattr(self.loader, "copy_times", None)
        stats = getattr(self.loader, "stats", None)
        if loader_times is not None and callable(stats):
            stats()  # DevicePrefetcher: resolves copies whose CUDA events are still pending
            loader_times = getattr(self.loader, "copy_times", None)
        if loader_times:
            times = list(loader_times)
            start = self._loader_copies_start if self._loader_copies_start <= len(times) else 0
            return [float(t) for t in times[start:]], "loader.copy_times"
        return [], None

    # ------------------------------------------------------------ results
    def summary(self) -> dict[str, Any]:
        """The numbers: counts, totals (s), shares (0..1 and %), percentiles (ms), rates, verdict."""
        waits, steps = self.waits, self.steps[: len(self.waits)]
        paired = min(len(waits), len(steps))
        steady_w = waits[1:paired] if paired > 1 else waits[:paired]
        steady_s = steps[1:paired] if paired > 1 else steps[:paired]
        busy = sum(steady_w) + sum(steady_s)
        share = sum(steady_w) / busy if busy > 0 else None
        all_busy = sum(waits[:paired]) + sum(steps[:paired])
        copies, source = self.copy_times()

        def ms(v: float | None) -> float | None:
            return None if v is None else v * 1e3

        return {
            "steps": paired,
            "samples": self.samples,
            "wall_s": self.wall,
            "total_wait_s": sum(waits),
            "total_step_s": sum(steps),
            "first_wait_s": waits[0] if waits else None,
            "wait_share": share,
            "wait_share_pct": None if share is None else 100.0 * share,
            "wait_share_incl_first_pct": 100.0 * sum(waits[:paired]) / all_busy if all_busy > 0 else None,
            "wait_p50_ms": ms(_percentile(steady_w, 50)),
            "wait_p95_ms": ms(_percentile(steady_w, 95)),
            "wait_max_ms": ms(max(steady_w) if steady_w else None),
            "step_p50_ms": ms(_percentile(steady_s, 50)),
            "step_p95_ms": ms(_percentile(steady_s, 95)),
            "samples_per_s": self.samples / self.wall if self.wall > 0 else None,
            "steps_per_s": paired / self.wall if self.wall > 0 else None,
            "to_device_s": sum(copies) if copies else None,
            "to_device_p50_ms": ms(_percentile(copies, 50)),
            "to_device_source": source,
            "cuda_sync": self._sync_wanted(),
            "trace": str(self.trace_path) if self.trace_path else None,
            "verdict": verdict(share, self.threshold),
        }

    def report(self) -> str:
        """A few human-readable lines."""
        s = self.summary()

        def f(v: float | None, fmt: str = ".1f") -> str:
            return "-" if v is None else format(v, fmt)

        lines = [
            f"{s['steps']} steps, {s['samples']} samples in {s['wall_s']:.2f} s "
            f"({f(s['samples_per_s'], '.0f')} samples/s)",
            f"waiting for data {s['total_wait_s']:.2f} s, in the step {s['total_step_s']:.2f} s; "
            f"first batch {f(s['first_wait_s'], '.2f')} s",
            f"wait per step p50 {f(s['wait_p50_ms'])} ms, p95 {f(s['wait_p95_ms'])} ms; "
            f"step p50 {f(s['step_p50_ms'])} ms",
        ]
        if s["to_device_s"] is not None:
            lines.append(f"to device {s['to_device_s']:.3f} s (p50 {f(s['to_device_p50_ms'], '.2f')} ms per batch, "
                         f"from {s['to_device_source']})")
        if s["trace"]:
            lines.append(f"profiler trace: {s['trace']}")
        lines.append(s["verdict"])
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"StarvationMeter({self.loader!r}, steps={len(self.steps)})"
