"""One ``dataset-bench`` run: prepare the data, measure every case ``repeats`` times, collect the result.

For every format (``wds``, ``lmdb``, ``hdf5``, ``mmap``) and for the naive
baseline, one run on one machine measures:

* samples/s and MB/s through :func:`readers.make_loader` for each
  ``num_workers``, without decoding (``raw``: the stored bytes, or the stored
  pixels for ``mmap``) and decoded through the ImageNet eval transform to
  224 x 224 (``decoded``);
* the naive baseline (:mod:`dataset_bench.naive`) with the same worker counts;
* with a warm page cache and a cold one (:mod:`dataset_bench.cache`: every file
  evicted, eviction checked);
* time to first batch and the PSS of the loader's processes (main + workers);
* the machine's raw limits in the same run (:mod:`dataset_bench.limits`).

Each measurement runs in a fresh process (``isolate``, the default; not
with ``quick``), so the PSS is that loader's alone. Every figure is the
median of ``repeats`` runs, taken repeat-major so that slow drift in the
machine's load spreads over all cases. Samples/s is the steady rate
(:func:`dataset_bench.measure.measure_loader`); the time to the first batch, start-up
included, is reported beside it.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from dataset_bench.cache import CacheControl
from dataset_bench.isolate import run_isolated
from dataset_bench.limits import measure_limits
from dataset_bench.machine import CpuMonitor, load_average, load_notes, load_summary, machine_info
from dataset_bench.measure import LoaderStats, eval_transform, measure_format, measure_naive
from dataset_bench.plan import BenchConfig, Case, plan_cases, total_steps
from dataset_bench.results import BenchResult, add_ratios, summarize
from dataset_bench.synth import generate_image_folder
from dataset_bench.targets import NAIVE, Target, dataset_target, folder_target, index_source, pack_formats
from readers.contract.spec import FORMATS

__all__ = ["BenchProgress", "Stopped", "request_stop", "clear_stop", "run_benchmark"]


class Stopped(SystemExit):
    """A stop asked for by a signal (``dataset-bench`` turns SIGTERM into it): raised where the run is, so
    that every ``finally`` runs, and raised again at the next step should something swallow it."""


_STOP: list[int] = []  # the exit code of a requested stop


def request_stop(code: int) -> None:
    """Ask the running benchmark to stop (from a signal handler): the next step raises :class:`Stopped`."""
    _STOP.append(code)


def clear_stop() -> None:
    """Forget a requested stop (the command that asked for it has returned)."""
    _STOP.clear()


@dataclass(frozen=True)
class BenchProgress:
    """Where a run stands, for a progress bar: ``done`` of ``total`` steps finished, ``step`` running now.

    ``total`` is 0 while the data is generated and packed (those steps are
    not counted); the last report has ``done == total`` and ``step == "done"``.
    """

    done: int
    total: int
    step: str


class _Steps:
    """Counts the run's steps and reports each start to the caller's progress callback."""

    def __init__(self, callback: Callable[[BenchProgress], None] | None) -> None:
        self.callback, self.done, self.total, self.running = callback, 0, 0, False

    def _emit(self, step: str) -> None:
        if _STOP:
            raise Stopped(_STOP[0])
        if self.callback is not None:
            self.callback(BenchProgress(self.done, self.total, step))

    def note(self, step: str) -> None:
        """An uncounted step (generating, packing)."""
        self._emit(step)

    def start(self, step: str) -> None:
        """A counted step begins; the one before it, if any, has finished."""
        if self.running:
            self.done += 1
        self.running = True
        self._emit(step)

    def finish(self) -> None:
        if self.running:
            self.done, self.running = self.done + 1, False
        self._emit("done")


def run_benchmark(config: BenchConfig | None = None, *, progress: Callable[[BenchProgress], None] | None = None,
                  **kwargs: Any) -> BenchResult:
    """Measure every format (and the naive baseline) on this machine; see the module docstring.

    Pass a :class:`BenchConfig` or its fields as keywords, e.g.
    ``run_benchmark(generate=2000, workers=(0, 2), repeats=3)``; keywords
    given with a config replace its fields. ``progress(BenchProgress)`` is called
    as each step starts (``dataset-bench`` draws a bar from it).
    """
    if config is None:
        config = BenchConfig.quick_defaults(**kwargs) if kwargs.get("quick") else BenchConfig(**kwargs)
    elif kwargs:
        config = replace(config, **kwargs)
    cfg = config
    started = time.perf_counter()
    notes: list[str] = []
    own_work = cfg.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="dataset-bench-") if cfg.work_dir is None else cfg.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    steps = _Steps(progress)
    try:
        datasets, src = _prepare(cfg, work, notes, steps)
        targets: dict[str, Target] = {}
        if cfg.baseline and src is not None:
            targets[NAIVE] = folder_target(src)
        elif cfg.baseline:
            notes.append("no naive baseline: no source folder given (--src) or found")
        for fmt, path in datasets.items():
            targets[fmt] = dataset_target(path)
        if len(targets) == (NAIVE in targets):
            raise ValueError("no packed dataset to measure")
        result = _measure_all(cfg, targets, src, notes, steps)
        steps.finish()
    except (KeyboardInterrupt, SystemExit):
        _stop_children()  # before the folder goes: a pool stopped while it started has no __exit__ to end it
        raise
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result


def _stop_children() -> None:
    """Kill the multiprocessing children this process still has (a pack's pool, when SIGTERM or Ctrl-C
    came while it was being made), and reap them."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)


def _prepare(cfg: BenchConfig, work: Path, notes: list[str], steps: _Steps) -> tuple[dict[str, Path], Path | None]:
    """Generate and/or pack what the config asks for; returns (format -> dataset folder, source folder)."""
    datasets: dict[str, Path] = {}
    src = Path(cfg.src) if cfg.src else None
    if cfg.generate:
        src = work / "images"
        if src.exists():
            shutil.rmtree(src)
        steps.note(f"generating {cfg.generate} images")
        generate_image_folder(src, cfg.generate, seed=cfg.seed)
        notes.append(f"generated {cfg.generate} ImageNet-like JPEGs with dataset_bench.synth (crops of "
                     f"examples/real-images, ~480x400, noise, quality 90) in {src}")
    for p in cfg.datasets:
        t = dataset_target(p)
        if t.name in datasets:
            raise ValueError(f"two {t.name} datasets given ({datasets[t.name]}, {p}); give one per format")
        datasets[t.name] = Path(p)
    if src is not None and not cfg.datasets:
        steps.note("packing")
        datasets = pack_formats(src, work / "packed", cfg.formats, workers=cfg.pack_workers,
                                mmap_resize=cfg.mmap_resize, shard_count=cfg.shard_count,
                                progress=lambda f: steps.note(f"packed {f}"))
    if src is None and cfg.baseline:
        # the source recorded in a dataset's index, when it is still there
        for folder in datasets.values():
            root = index_source(folder)
            if root and Path(root).is_dir():
                src = Path(root)
                notes.append(f"naive baseline reads {src} (the source recorded in {folder}/index.json)")
                break
    return {f: datasets[f] for f in FORMATS if f in datasets and (cfg.datasets or f in cfg.formats)}, src


def _measure_all(cfg: BenchConfig, targets: dict[str, Target], src: Path | None, notes: list[str],
                 steps: _Steps) -> BenchResult:
    """Loader cases, then raw limits, under ``cfg.torch_threads`` (restored after); collects the notes."""
    import torch

    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    try:
        machine = machine_info()
        loads = [load_average()]
        monitor = CpuMonitor(machine["usable_cpus"])
        cache = CacheControl()
        transform = eval_transform()
        cases = plan_cases(cfg, targets)
        steps.total = total_steps(cfg, len(cases), len(targets))
        rows = _run_cases(cfg, cases, targets, cache, transform, steps, loads, monitor)
        limits = {}
        if cfg.limits:
            src_files = targets[NAIVE].files if NAIVE in targets else (folder_target(src).files if src else [])
            limits = measure_limits({name: t.files for name, t in targets.items()}, src_files, repeats=cfg.repeats,
                                    cache=cache, transform=transform, decode_files=cfg.decode_files,
                                    step=steps.start)
        loads.append(load_average())
        notes.extend(_cache_notes(cfg, cache, rows, limits))
        machine["loadavg_during_run"] = load_summary(loads)
        machine["foreign_cpu"] = monitor.summary()
        notes.extend(load_notes(machine, torch.get_num_threads()))
    finally:
        torch.set_num_threads(threads)
    return BenchResult(machine=machine, config=cfg.as_dict(), targets=[t.describe() for t in targets.values()],
                       rows=rows, limits=limits, notes=notes, transform=repr(transform))


def _run_case(cfg: BenchConfig, case: Case, t: Target, cache: CacheControl,
              transform: Any) -> tuple[LoaderStats, float | None]:
    """Prepare the page cache for one case and measure it: (stats, share still cached after eviction)."""
    left = None
    if case.cache == "cold":
        gc.collect()  # drop mappings a closed reader may still hold: mapped pages are not evicted
        cache.evict(t.files)
        left = cache.resident_fraction(t.files)
    else:
        cache.warm(t.files)
    kwargs: dict[str, Any] = {"num_workers": case.workers, "batch_size": cfg.batch_size,
                              "max_samples": cfg.max_samples, "bytes_per_sample": t.bytes_per_sample, "seed": cfg.seed}
    fn: Callable[..., LoaderStats]
    if case.target == NAIVE:
        fn, kwargs = measure_naive, {"src": t.path, **kwargs}
    else:
        fn, kwargs = measure_format, {"path": t.path, "mode": case.mode, "transform": transform, **kwargs}
    if cfg.isolate:
        return run_isolated(fn, kwargs, torch_threads=cfg.torch_threads), left
    return fn(**kwargs), left


def _run_cases(cfg: BenchConfig, cases: list[Case], targets: dict[str, Target], cache: CacheControl,
               transform: Any, steps: _Steps, loads: list[float | None],
               monitor: CpuMonitor | None = None) -> list[dict[str, Any]]:
    """Every case ``cfg.repeats`` times (repeat-major, so slow drift spreads over all cases); median rows."""
    runs: dict[Case, list[LoaderStats]] = {c: [] for c in cases}
    cached: dict[Case, list[float | None]] = {c: [] for c in cases}
    foreign: dict[Case, list[float | None]] = {c: [] for c in cases}
    for rep in range(cfg.repeats):
        for case in cases:
            steps.start(f"[{rep + 1}/{cfg.repeats}] {case.label()}")
            loads.append(load_average())
            if monitor is not None:
                monitor.sample(keep=False)
            stats, left = _run_case(cfg, case, targets[case.target], cache, transform)
            foreign[case].append(monitor.sample() if monitor is not None else None)
            runs[case].append(stats)
            cached[case].append(left)
    window = (cfg.min_window_batches, cfg.min_window_s)
    rows = [{**case._asdict(), **summarize(runs[case], cached[case], foreign[case], min_window=window)}
            for case in cases]
    add_ratios(rows)
    return rows


def _cache_notes(cfg: BenchConfig, cache: CacheControl, rows: list[dict], limits: dict) -> list[str]:
    """What the cold runs really were: evicted and verified, evicted unverified, or not evicted at all."""
    if "cold" not in cfg.caches:
        return []
    if not cache.can_evict:
        return ["cold runs are NOT cold: os.posix_fadvise is not available here, nothing was evicted"]
    if not cache.can_verify:
        return ["cold runs: files were evicted with posix_fadvise(DONTNEED) but eviction could not be "
                "verified (mincore unavailable)"]
    notes = []
    left = [r["cached_after_evict"] for r in rows if r["cache"] == "cold" and r["cached_after_evict"] is not None]
    worst = max(left) if left else 0.0
    if worst > 0.05:
        notes.append(f"cold runs: eviction incomplete, up to {worst:.0%} of a dataset's pages stayed cached "
                     "(mapped or dirty pages cannot be dropped)")
    else:
        notes.append(f"cold runs: eviction verified with mincore (at most {worst:.1%} of pages still cached "
                     "after posix_fadvise(DONTNEED))")
    seq = limits.get("sequential_read", {})
    cold = [v["cold"]["mb_per_s"] for v in seq.values() if v.get("cold", {}).get("mb_per_s")]
    warm = [v["warm"]["mb_per_s"] for v in seq.values() if v.get("warm", {}).get("mb_per_s")]
    if cold and warm and statistics.median(cold) > 0.5 * statistics.median(warm):
        notes.append("cold sequential reads run at more than half the warm rate: the storage below this "
                     "machine (e.g. a VM host's cache) may serve 'cold' reads from memory")
    return notes
