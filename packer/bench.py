"""``dataset-bench``: measure the packed formats against a naive PIL ImageFolder, side by side.

One run on one machine measures, for every format (``wds``, ``lmdb``,
``hdf5``, ``mmap``) and for the naive baseline:

* samples/s and MB/s through :func:`readers.make_loader` for each
  ``num_workers``, without decoding (``raw``: the stored bytes, or the stored
  pixels for ``mmap``) and decoded through the ImageNet eval transform to
  224 x 224 (``decoded``);
* the naive baseline -- the original folder read per file with PIL (open,
  convert RGB, resize the shorter side to 256, center crop 224, float tensor)
  through a plain ``DataLoader`` with its defaults -- with the same worker
  counts;
* with a warm page cache and a cold one (every file evicted with
  ``posix_fadvise(DONTNEED)`` after ``os.sync()``, eviction checked with
  ``mincore``);
* time to first batch and the PSS of the loader's processes (main + workers);
* the machine's raw limits in the same run: sequential read rate of the
  dataset files (cold and warm, 8 MiB reads) and single-core decode rates.

Each measurement runs in a fresh process (``isolate``, the default; not
with ``--quick``), so the PSS is that loader's alone. Every figure is the
median of ``repeats`` runs. Samples/s is the steady
rate: counted from the moment every worker has delivered its first batch
(batch ``max(1, num_workers)``) to the last batch, so neither worker
start-up nor the batches the workers made in parallel during it inflate or
deflate it; the time to the first batch, start-up included, is reported
beside it.

:func:`run_benchmark` is the Python API; :func:`main` (the console command)
is a thin layer that parses arguments, prints and saves.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import io
import json
import logging
import math
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from readers.env import available_cpus
from readers.spec import FORMATS

__all__ = [
    "BenchConfig",
    "BenchResult",
    "LoaderStats",
    "CacheControl",
    "CpuMonitor",
    "NaiveImageFolder",
    "naive_load",
    "run_benchmark",
    "generate_image_folder",
    "pack_formats",
    "machine_info",
    "measure_loader",
    "measure_naive",
    "measure_format",
    "run_isolated",
    "sequential_read",
    "decode_rates",
    "eval_transform",
    "format_table",
    "format_limits",
    "headline",
    "draw_chart",
    "report_text",
    "main",
]

log = logging.getLogger(__name__)

MODES = ("raw", "decoded")
CACHES = ("warm", "cold")
NAIVE = "naive"
MB = 1e6


# --------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_info() -> dict[str, Any]:
    """Where the figures come from: host, CPU, usable cores, RAM, software versions."""
    import PIL
    import torch

    ram = _ram_bytes()
    info = {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "usable_cpus": available_cpus(),
        "os_cpu_count": os.cpu_count(),
        "ram_gb": round(ram / 2**30, 1) if ram else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
    try:
        from readers.decode import decoder_report

        info["decoders"] = decoder_report()
    except ImportError:  # pragma: no cover - older readers
        pass
    return info


def machine_label(info: dict[str, Any]) -> str:
    """One line naming the machine, for tables and charts."""
    ram = f", {info['ram_gb']:g} GB RAM" if info.get("ram_gb") else ""
    return (f"{info['hostname']}: {info['cpu_model']}, {info['usable_cpus']} usable cores{ram}; "
            f"Python {info['python']}, torch {info['torch']}")


# --------------------------------------------------------------------------- test data


def generate_image_folder(root: str | os.PathLike, n: int, *, classes: int = 10, seed: int = 0,
                          processes: int | None = None, progress: Callable[[int], None] | None = None) -> Path:
    """Write an ImageNet-like ImageFolder tree of ``n`` JPEGs under ``root``; return ``root``.

    The project's one generator, :func:`packer.synth.make_imagenet_like`
    (random crops of the bundled real photos, about 480 x 400 pixels, noise,
    quality 90: ~95 KB each, like ImageNet's training images), run on
    ``processes`` CPUs (default: all usable). Deterministic for a given
    ``seed``. ``progress(n)`` is called once at the end.
    """
    from packer.synth import SynthOptions, make_imagenet_like

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    root = make_imagenet_like(root, n, classes=max(1, min(classes, n)), options=SynthOptions(seed=seed),
                              processes=processes or available_cpus())
    if progress is not None:
        progress(n)
    return root


def pack_formats(src: str | os.PathLike, out_root: str | os.PathLike, formats: Sequence[str] = FORMATS, *,
                 workers: int | None = None, mmap_resize: int = 256, shard_count: int | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Pack ``src`` into each format under ``out_root/<format>`` (mmap at ``mmap_resize``); format -> folder."""
    from packer.api import pack
    from packer.options import PackOptions

    out = {}
    Path(out_root).mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        kw: dict[str, Any] = {}
        if fmt == "mmap":
            kw["resize"] = mmap_resize
        if fmt == "wds" and shard_count:
            kw["shard_count"] = shard_count
        dest = Path(out_root) / fmt
        results = pack(src, dest, PackOptions(format=fmt, workers=workers, overwrite=True, **kw))
        out[fmt] = results[0].out
        if progress is not None:
            progress(fmt)
    return out


# --------------------------------------------------------------------------- page cache


class CacheControl:
    """Evict files from the page cache and measure how much of them is cached.

    Eviction: ``os.sync()`` then ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)``
    on every file. Residency: ``mincore(2)`` through ctypes on a read-only
    mapping of each file (no page is touched). ``can_evict`` /
    ``can_verify`` say what works on this system.
    """

    def __init__(self) -> None:
        self.can_evict = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")
        self._libc = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_long]
                libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
                self._libc = libc
            except (OSError, AttributeError):
                self._libc = None
        self.can_verify = self._libc is not None

    def evict(self, paths: Iterable[str | os.PathLike]) -> None:
        """Drop the files' pages from the page cache (no-op where posix_fadvise is missing)."""
        if not self.can_evict:
            return
        os.sync()
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def resident(self, path: str | os.PathLike) -> tuple[int, int] | None:
        """(cached pages, total pages) of one file, or None when it cannot be told."""
        if self._libc is None:
            return None
        size = os.path.getsize(path)
        page = os.sysconf("SC_PAGE_SIZE")
        pages = (size + page - 1) // page
        if pages == 0:
            return 0, 0
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = self._libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * pages)()
                if self._libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                    return None
                return int((np.frombuffer(vec, dtype=np.uint8) & 1).sum()), pages
            finally:
                self._libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)

    def resident_fraction(self, paths: Iterable[str | os.PathLike]) -> float | None:
        """Share of the files' pages that are in the page cache (0..1), or None when unknown."""
        cached = total = 0
        for p in paths:
            r = self.resident(p)
            if r is None:
                return None
            cached, total = cached + r[0], total + r[1]
        return cached / total if total else 0.0

    @staticmethod
    def warm(paths: Iterable[str | os.PathLike], block: int = 8 << 20) -> int:
        """Read the files once so that they are cached; returns the bytes read."""
        return _read_all(paths, block)[0]


def _read_all(paths: Iterable[str | os.PathLike], block: int = 8 << 20) -> tuple[int, float]:
    """Read every file front to back with ``block``-sized reads: (bytes, seconds)."""
    buf = memoryview(bytearray(block))
    total = 0
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
    return total, time.perf_counter() - t0


# --------------------------------------------------------------------------- memory


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of one process (``/proc/<pid>/smaps_rollup``, else psutil), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        import psutil

        return int(psutil.Process(pid).memory_full_info().pss)
    except Exception:  # noqa: BLE001 - psutil missing, process gone, no permission, no pss field
        return None


def process_tree_pss() -> tuple[int | None, int]:
    """(PSS of this process, summed PSS of its live child processes, e.g. loader workers)."""
    children: list[int] = []
    try:
        import psutil

        children = [c.pid for c in psutil.Process().children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing: fall back to /proc
        try:
            me = str(os.getpid())
            for d in Path("/proc").iterdir():
                if d.name.isdigit():
                    stat = (d / "stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[1] == me:
                        children.append(int(d.name))
        except OSError:
            pass
    workers = sum(p for p in (pss_bytes(c) for c in children) if p)
    return pss_bytes(os.getpid()), workers


class CpuMonitor:
    """How much CPU time *other* processes took while we measured.

    Busy time of the whole machine (``/proc/stat``: user, nice, system, irq,
    softirq, steal) minus the CPU time of this process and its reaped
    children (``os.times``; loader workers are joined before each sample),
    as a share of ``usable cpus x wall time``. None where ``/proc/stat`` is
    missing.
    """

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._now()
        self.shares: list[float] = []
        self._first = self._last

    def _now(self) -> tuple[float, float, float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields)) / self.hz
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return time.perf_counter(), busy, own

    @staticmethod
    def _share(a: tuple | None, b: tuple | None, cpus: int) -> float | None:
        if a is None or b is None or b[0] <= a[0]:
            return None
        foreign = (b[1] - a[1]) - (b[2] - a[2])
        return min(1.0, max(0.0, foreign / ((b[0] - a[0]) * cpus)))

    def sample(self, keep: bool = True, min_s: float = 0.5) -> float | None:
        """Foreign CPU share since the previous sample; kept in ``shares`` when ``keep`` and >= ``min_s`` long."""
        now = self._now()
        share = self._share(self._last, now, self.cpus)
        if share is not None and keep and now[0] - self._last[0] >= min_s:
            self.shares.append(share)
        self._last = now
        return share

    def summary(self) -> dict[str, float] | None:
        overall = self._share(self._first, self._now(), self.cpus)
        if overall is None:
            return None
        return {"overall": round(overall, 3), "max_interval": round(max(self.shares, default=0.0), 3)}


# --------------------------------------------------------------------------- transforms


class SimpleEvalTransform:
    """Fallback eval transform: CHW uint8 -> shorter side ``resize`` -> center crop ``size`` (uint8)."""

    def __init__(self, size: int = 224, resize: int = 256) -> None:
        self.size, self.resize = size, resize

    def __call__(self, image: Any) -> Any:
        import torch
        import torch.nn.functional as F

        if not isinstance(image, torch.Tensor):
            image = torch.from_numpy(np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1)))
        h, w = image.shape[-2:]
        s = self.resize / min(h, w)
        nh, nw = max(self.size, round(h * s)), max(self.size, round(w * s))
        x = F.interpolate(image[None].float(), size=(nh, nw), mode="bilinear", antialias=True,
                          align_corners=False)[0]
        top, left = (nh - self.size) // 2, (nw - self.size) // 2
        return x[:, top:top + self.size, left:left + self.size].round().clamp(0, 255).to(torch.uint8)

    def __repr__(self) -> str:
        return f"SimpleEvalTransform(resize={self.resize}, size={self.size})"


def eval_transform(size: int = 224, resize: int = 256) -> Any:
    """``readers.transforms.imagenet_eval_transform`` when the package has it, else :class:`SimpleEvalTransform`."""
    try:
        from readers.transforms import imagenet_eval_transform
    except ImportError:
        return SimpleEvalTransform(size, resize)
    return imagenet_eval_transform(size=size, resize=resize)


class NaiveImageFolder:
    """The baseline: one file per sample read with PIL, the usual torchvision-style eval pipeline.

    ``open -> convert("RGB") -> resize shorter side to 256 (bilinear) ->
    center crop 224 -> float32 tensor in [0, 1]`` (what ``ImageFolder`` with
    ``Resize(256), CenterCrop(224), ToTensor()`` does), no torchvision needed.
    """

    def __init__(self, root: str | os.PathLike, resize: int = 256, crop: int = 224) -> None:
        from packer.source import scan

        source = scan(root)
        self.root = Path(root)
        self.files = [str(self.root / p) for p in source.paths]
        self.labels = list(source.labels)
        self.sizes = list(source.sizes)
        self.resize, self.crop = resize, crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return naive_load(self.files[i], self.resize, self.crop), self.labels[i]


def naive_load(fp: Any, resize: int = 256, crop: int = 224) -> Any:
    """The naive per-file work: PIL open, RGB, shorter side to ``resize``, center crop, float32 CHW in [0, 1]."""
    import torch
    from PIL import Image

    with Image.open(fp) as im:
        img = im.convert("RGB")
    w, h = img.size
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    img = img.crop((left, top, left + crop, top + crop))
    arr = np.array(img, dtype=np.uint8)
    # exactly torchvision's ToTensor: HWC -> contiguous CHW, then float / 255
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous().to(torch.float32).div(255)


# --------------------------------------------------------------------------- measuring a loader


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _batch_len(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    try:
        return len(first)
    except TypeError:
        return 1


def _shutdown(loader: Any, it: Any) -> None:
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
    peak = {"main": None, "workers": None, "total": None}
    next_pss = 0.0

    def sample_pss() -> None:
        main_pss, workers_pss = process_tree_pss()
        if main_pss is not None:
            for key, value in (("main", main_pss), ("workers", workers_pss), ("total", main_pss + workers_pss)):
                peak[key] = max(peak[key] or 0, value)

    try:
        it = iter(loader)
        samples = 0
        for batch in it:
            samples += _batch_len(batch)
            if on_batch is not None:
                on_batch(batch)
            now = time.perf_counter()
            arrivals.append((now, samples))
            if now >= next_pss:
                sample_pss()
                next_pss = time.perf_counter() + pss_interval
            if max_samples is not None and samples >= max_samples:
                break
        sample_pss()
    finally:
        _shutdown(loader, it)
        del it
    return _loader_stats(t0, arrivals, warmup, bytes_per_sample, peak)


def _loader_stats(t0: float, arrivals: list[tuple[float, int]], warmup: int, bytes_per_sample: float,
                  peak: dict[str, int | None]) -> LoaderStats:
    samples = arrivals[-1][1] if arrivals else 0
    t_first = arrivals[0][0] if arrivals else t0
    t_last = arrivals[-1][0] if arrivals else t0
    total = t_last - t0
    epoch_rate = samples / total if total > 0 else 0.0
    if len(arrivals) > warmup:
        t_start, n_start = arrivals[warmup - 1]
        rate = (samples - n_start) / (t_last - t_start) if t_last > t_start else epoch_rate
    else:
        rate = epoch_rate

    def mb(key: str) -> float | None:
        return None if peak["main"] is None else round((peak[key] or 0) / MB, 1)

    return LoaderStats(
        samples=samples, batches=len(arrivals), seconds=total, first_batch_s=t_first - t0,
        samples_per_s=rate, epoch_samples_per_s=epoch_rate, mb_per_s=rate * bytes_per_sample / MB,
        pss_main_mb=mb("main"), pss_workers_mb=mb("workers"), pss_total_mb=mb("total"),
    )


# --------------------------------------------------------------------------- datasets under test


@dataclass
class Target:
    """Something to read: a packed dataset (``name`` = its format) or the naive folder."""

    name: str
    path: Path
    files: list[Path]  # what the reader reads (evicted for cold runs)
    samples: int
    data_bytes: int

    @property
    def bytes_per_sample(self) -> float:
        return self.data_bytes / self.samples if self.samples else 0.0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "samples": self.samples,
                "data_mb": round(self.data_bytes / MB, 1), "files": len(self.files),
                "kb_per_sample": round(self.bytes_per_sample / 1e3, 1)}


def dataset_target(path: str | os.PathLike) -> Target:
    """A packed dataset folder as a :class:`Target` (data files from its index)."""
    from readers import spec

    index = spec.read_index(path)
    meta = index.meta
    files = [Path(path) / name for name in sorted(meta.get("files", {}))]
    data = sum(f.stat().st_size for f in files)
    return Target(meta["format"], Path(path), files, int(meta["num_samples"]), data)


def folder_target(src: str | os.PathLike) -> Target:
    """The source image folder as the naive baseline's :class:`Target`."""
    ds = NaiveImageFolder(src)
    return Target(NAIVE, Path(src), [Path(f) for f in ds.files], len(ds), sum(ds.sizes))


def measure_naive(src: str | os.PathLike, *, num_workers: int, batch_size: int, max_samples: int | None = None,
                  bytes_per_sample: float = 0.0, seed: int = 0) -> LoaderStats:
    """The baseline: :class:`NaiveImageFolder` through a plain ``DataLoader`` (defaults: no pinning, not persistent)."""
    import torch
    from torch.utils.data import DataLoader

    def make() -> Any:
        g = torch.Generator()
        g.manual_seed(seed)
        return DataLoader(NaiveImageFolder(src), batch_size=batch_size, shuffle=True, num_workers=num_workers,
                          generator=g)

    return measure_loader(make, bytes_per_sample=bytes_per_sample, max_samples=max_samples)


def measure_format(path: str | os.PathLike, *, mode: str, num_workers: int, batch_size: int,
                   max_samples: int | None = None, bytes_per_sample: float = 0.0, seed: int = 0,
                   transform: Any = None, **loader_kwargs: Any) -> LoaderStats:
    """A packed dataset through ``make_loader``: ``mode`` "raw" (decode=False) or "decoded" (eval transform)."""
    from readers import make_loader, open_dataset

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    def make() -> Any:
        if mode == "raw":
            ds = open_dataset(path, decode=False)
        else:
            ds = open_dataset(path, transform=transform if transform is not None else eval_transform())
        return make_loader(ds, batch_size=batch_size, num_workers=num_workers, seed=seed, **loader_kwargs)

    return measure_loader(make, bytes_per_sample=bytes_per_sample, max_samples=max_samples)


# --------------------------------------------------------------------------- raw limits


def sequential_read(paths: Sequence[str | os.PathLike], cold: bool, cache: CacheControl,
                    block: int = 8 << 20) -> dict[str, Any]:
    """Read the files front to back with ``block``-sized reads; cold = evicted first."""
    if cold:
        cache.evict(paths)
    else:
        cache.warm(paths, block)
    before = cache.resident_fraction(paths)
    nbytes, seconds = _read_all(paths, block)
    return {"bytes": nbytes, "seconds": seconds, "mb_per_s": nbytes / seconds / MB if seconds > 0 else 0.0,
            "cached_before": before}


def _jpeg_sample(files: Sequence[str | os.PathLike], limit: int) -> list[bytes]:
    out = []
    for f in files:
        data = Path(f).read_bytes()
        if data[:3] == b"\xff\xd8\xff":
            out.append(data)
            if len(out) >= limit:
                break
    return out


def decode_rates(files: Sequence[str | os.PathLike], *, limit: int = 300, transform: Any = None) -> dict[str, dict]:
    """Single-core rates over up to ``limit`` source JPEGs held in memory (no I/O in the timing).

    ``pil_decode``: ``Image.open(...).convert("RGB")`` (full decode);
    ``decode_rgb``: ``readers.decode.decode_rgb`` (the readers' decoder,
    ``auto``); ``eval_transform``: decode + resize + crop to 224 as the
    decoded mode runs it per sample (the readers hand the transform bytes
    only when it says ``accepts_bytes``; otherwise they decode first);
    ``eval_transform_bytes``: the transform called on the bytes itself
    (its fused, size-aware decode), when the readers do not do that;
    ``naive_item``: the baseline's per-file work minus the file read.
    """
    import torch
    from PIL import Image

    from readers.base import to_chw
    from readers.decode import decode_rgb

    blobs = _jpeg_sample(files, limit)
    if not blobs:
        return {}
    nbytes = sum(len(b) for b in blobs)
    transform = transform if transform is not None else eval_transform()

    def pil(b: bytes) -> None:
        with Image.open(io.BytesIO(b)) as im:
            im.convert("RGB")

    def transformed(b: bytes) -> None:
        if getattr(transform, "accepts_bytes", False):
            transform(b)
        else:
            transform(to_chw(decode_rgb(b)))

    def naive_item(b: bytes) -> None:
        naive_load(io.BytesIO(b))

    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # single core: no intra-op threads in the torch-based steps
    try:
        steps = [("pil_decode", pil), ("decode_rgb", decode_rgb), ("eval_transform", transformed)]
        if not isinstance(transform, SimpleEvalTransform) and not getattr(transform, "accepts_bytes", False):
            steps.append(("eval_transform_bytes", transform))  # the transform's own fused decode, given bytes
        steps.append(("naive_item", naive_item))
        for name, fn in steps:
            fn(blobs[0])  # warm-up (imports, probes)
            t0 = time.perf_counter()
            for b in blobs:
                fn(b)
            dt = time.perf_counter() - t0
            out[name] = {"images": len(blobs), "seconds": dt, "images_per_s": len(blobs) / dt,
                         "mb_per_s": nbytes / dt / MB}
    finally:
        torch.set_num_threads(threads)
    return out


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class BenchConfig:
    """What :func:`run_benchmark` measures; see ``dataset-bench --help``."""

    src: str | None = None
    datasets: tuple[str, ...] = ()
    generate: int | None = None
    work_dir: str | None = None
    formats: tuple[str, ...] = FORMATS
    workers: tuple[int, ...] = (0, 2)
    modes: tuple[str, ...] = MODES
    caches: tuple[str, ...] = CACHES
    batch_size: int = 64
    repeats: int = 3
    max_samples: int | None = None
    baseline: bool = True
    limits: bool = True
    decode_files: int = 300
    pack_workers: int | None = None
    mmap_resize: int = 256
    shard_count: int | None = None
    seed: int = 0
    torch_threads: int | None = None  # torch.set_num_threads for the run (None: torch's default)
    isolate: bool = True  # each measurement in a fresh interpreter (clean PSS; ~1-2 s start-up each, not timed)
    quick: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("formats", FORMATS), ("modes", MODES), ("caches", CACHES)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ValueError(f"unknown {name} {bad}; choose from {', '.join(allowed)}")
        if any(w < 0 for w in self.workers) or not self.workers:
            raise ValueError(f"workers must be one or more counts >= 0, got {self.workers}")
        if self.repeats < 1 or self.batch_size < 1:
            raise ValueError("repeats and batch_size must be >= 1")
        if self.generate is not None and self.generate < 1:
            raise ValueError(f"generate must be >= 1, got {self.generate}")
        if not (self.src or self.datasets or self.generate):
            raise ValueError("nothing to measure: give src, datasets or generate")

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> "BenchConfig":
        """A tiny run for tests and smoke checks: 48 images, one repeat, small batches, in one process."""
        base = {"generate": 48, "repeats": 1, "batch_size": 16, "decode_files": 24, "workers": (0, 1),
                "isolate": False, "quick": True}
        if overrides.get("src") or overrides.get("datasets"):
            base.pop("generate")
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass
class BenchResult:
    """Everything one run measured. ``rows`` hold medians over repeats (and each repeat's values)."""

    machine: dict[str, Any]
    config: dict[str, Any]
    targets: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    limits: dict[str, Any]
    notes: list[str]
    transform: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> "BenchResult":
        return cls(**json.loads(Path(path).read_text()))

    def row(self, target: str, mode: str, workers: int, cache: str) -> dict[str, Any] | None:
        for r in self.rows:
            if (r["target"], r["mode"], r["workers"], r["cache"]) == (target, mode, workers, cache):
                return r
        return None

    def table(self) -> str:
        return format_table(self)

    def headline(self) -> list[str]:
        return headline(self)


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


_FIGURES = ("samples_per_s", "epoch_samples_per_s", "mb_per_s", "first_batch_s", "seconds", "pss_main_mb",
            "pss_workers_mb", "pss_total_mb")


def _summarize(runs: list[LoaderStats], cached_after_evict: list[float | None]) -> dict[str, Any]:
    out: dict[str, Any] = {k: _median([getattr(r, k) for r in runs]) for k in _FIGURES}
    out["samples"] = runs[0].samples if runs else 0
    out["repeats"] = {k: [getattr(r, k) for r in runs] for k in ("samples_per_s", "first_batch_s", "pss_total_mb")}
    known = [c for c in cached_after_evict if c is not None]
    out["cached_after_evict"] = max(known) if known else None
    return out


def _prepare(cfg: BenchConfig, work: Path, notes: list[str], bar: Any) -> tuple[dict[str, Path], Path | None]:
    """Generate and/or pack what the config asks for; returns (format -> dataset folder, source folder)."""
    datasets: dict[str, Path] = {}
    src = Path(cfg.src) if cfg.src else None
    if cfg.generate:
        src = work / "images"
        if src.exists():
            shutil.rmtree(src)
        bar.set_description(f"generating {cfg.generate} images")
        generate_image_folder(src, cfg.generate, seed=cfg.seed,
                              progress=lambda k: bar.set_postfix_str(f"{k} images"))
        notes.append(f"generated {cfg.generate} ImageNet-like JPEGs with packer.synth (crops of "
                     f"examples/real-images, ~480x400, noise, quality 90) in {src}")
    for p in cfg.datasets:
        t = dataset_target(p)
        if t.name in datasets:
            raise ValueError(f"two {t.name} datasets given ({datasets[t.name]}, {p}); give one per format")
        datasets[t.name] = Path(p)
    if src is not None and not cfg.datasets:
        bar.set_description("packing")
        datasets = pack_formats(src, work / "packed", cfg.formats, workers=cfg.pack_workers,
                                mmap_resize=cfg.mmap_resize, shard_count=cfg.shard_count,
                                progress=lambda f: bar.set_postfix_str(f"packed {f}"))
    if src is None and cfg.baseline:
        # the source recorded in a dataset's index, when it is still there
        for p in datasets.values():
            root = _index_source(p)
            if root and Path(root).is_dir():
                src = Path(root)
                notes.append(f"naive baseline reads {src} (the source recorded in {p}/index.json)")
                break
    return {f: datasets[f] for f in FORMATS if f in datasets and (cfg.datasets or f in cfg.formats)}, src


def _index_source(path: Path) -> str | None:
    from readers import spec

    return spec.read_index(path).meta.get("source", {}).get("root")


def _plan(cfg: BenchConfig, targets: dict[str, Target]) -> list[tuple[str, str, int, str]]:
    """(target, mode, workers, cache) for one repeat, in run order."""
    cases = []
    for cache in cfg.caches:
        for w in cfg.workers:
            if NAIVE in targets:
                cases.append((NAIVE, "decoded", w, cache))
            for mode in cfg.modes:
                for name in targets:
                    if name != NAIVE:
                        cases.append((name, mode, w, cache))
    return cases


def _progress_bar(enabled: bool, total: int) -> Any:
    if enabled:
        from tqdm import tqdm

        tqdm.monitor_interval = 0  # no monitor thread in a process that forks loader workers
        return tqdm(total=total, file=sys.stderr, unit="step", dynamic_ncols=True)

    class _Null:
        def update(self, n: int = 1) -> None: ...
        def set_description(self, s: str) -> None: ...
        def set_postfix_str(self, s: str) -> None: ...
        def close(self) -> None: ...

    return _Null()


def run_benchmark(config: BenchConfig | None = None, *, progress: bool = False, **kwargs: Any) -> BenchResult:
    """Measure every format (and the naive baseline) on this machine; see the module docstring.

    Pass a :class:`BenchConfig` or its fields as keywords, e.g.
    ``run_benchmark(generate=2000, workers=(0, 2), repeats=3)``.
    ``progress=True`` draws a tqdm bar on stderr.
    """
    if config is None:
        config = BenchConfig.quick_defaults(**kwargs) if kwargs.get("quick") else BenchConfig(**kwargs)
    elif kwargs:
        config = replace(config, **kwargs)
    cfg = config
    started = time.perf_counter()
    notes: list[str] = []
    own_work = cfg.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="dataset-bench-")) if own_work else Path(cfg.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    bar = _progress_bar(progress, 0)
    try:
        datasets, src = _prepare(cfg, work, notes, bar)
        targets: dict[str, Target] = {}
        if cfg.baseline and src is not None:
            targets[NAIVE] = folder_target(src)
        elif cfg.baseline:
            notes.append("no naive baseline: no source folder given (--src) or found")
        for fmt, path in datasets.items():
            targets[fmt] = dataset_target(path)
        if len(targets) == (NAIVE in targets):
            raise ValueError("no packed dataset to measure")
        result = _measure_all(cfg, targets, src, notes, bar)
    finally:
        bar.close()
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result


def _measure_all(cfg: BenchConfig, targets: dict[str, Target], src: Path | None, notes: list[str],
                 bar: Any) -> BenchResult:
    """Loader cases, then raw limits, under ``cfg.torch_threads``; collects the notes."""
    import torch

    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    try:
        machine = machine_info()
        loads = [_load()]
        monitor = CpuMonitor(machine["usable_cpus"])
        cache = CacheControl()
        transform = eval_transform()
        if isinstance(transform, SimpleEvalTransform):
            notes.append("readers.transforms has no imagenet_eval_transform: decoded mode used the bench's "
                         "fallback (decode_rgb + torch resize 256 + center crop 224)")
        cases = _plan(cfg, targets)
        if hasattr(bar, "reset"):
            limit_steps = (len(targets) * 2 + 1) if cfg.limits else 0
            bar.reset(total=(len(cases) + limit_steps) * cfg.repeats)
        rows = _run_cases(cfg, cases, targets, cache, transform, bar, loads, monitor)
        limits = _measure_limits(cfg, targets, src, cache, transform, bar) if cfg.limits else {}
        loads.append(_load())
        notes.extend(_cache_notes(cfg, cache, rows, limits))
        machine["loadavg_during_run"] = _load_summary(loads)
        machine["foreign_cpu"] = monitor.summary()
        notes.extend(_load_notes(machine, torch.get_num_threads()))
    finally:
        torch.set_num_threads(threads)
    return BenchResult(
        machine=machine, config={k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        targets=[t.describe() for t in targets.values()], rows=rows, limits=limits, notes=notes,
        transform=repr(transform),
    )


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _run_case(cfg: BenchConfig, case: tuple[str, str, int, str], t: Target, cache: CacheControl,
              transform: Any) -> tuple[LoaderStats, float | None]:
    """Prepare the page cache for one case and measure it: (stats, share still cached after eviction)."""
    name, mode, w, state = case
    left = None
    if state == "cold":
        gc.collect()  # drop mappings a closed reader may still hold: mapped pages are not evicted
        cache.evict(t.files)
        left = cache.resident_fraction(t.files)
    else:
        cache.warm(t.files)
    kwargs = {"num_workers": w, "batch_size": cfg.batch_size, "max_samples": cfg.max_samples,
              "bytes_per_sample": t.bytes_per_sample, "seed": cfg.seed}
    if name == NAIVE:
        fn, kwargs = measure_naive, {"src": t.path, **kwargs}
    else:
        fn, kwargs = measure_format, {"path": t.path, "mode": mode, "transform": transform, **kwargs}
    if cfg.isolate:
        return run_isolated(fn, kwargs, torch_threads=cfg.torch_threads), left
    return fn(**kwargs), left


def _isolated_main() -> None:
    """Entry point of the fresh interpreter :func:`run_isolated` starts (job on stdin, result to argv[1])."""
    import pickle

    fn, kwargs, torch_threads = pickle.load(sys.stdin.buffer)
    try:
        import torch

        import readers.registry  # noqa: F401 - every reader module imported before the clock starts

        if torch_threads:
            torch.set_num_threads(torch_threads)
        result = (True, fn(**kwargs))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        import traceback

        result = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(sys.argv[1], "wb") as f:
        pickle.dump(result, f)


def run_isolated(fn: Callable[..., Any], kwargs: dict[str, Any], *, torch_threads: int | None = None) -> Any:
    """``fn(**kwargs)`` in a fresh Python interpreter (a subprocess); returns its result.

    Each measurement then starts from a clean process: its PSS is the
    loader's alone, and nothing an earlier case left behind (memory the
    generator, the packer or another reader kept, torch settings) shows in it.
    ``fn`` must be importable (a module-level function); ``kwargs`` and the
    result must pickle. The child's own output is discarded unless it fails.
    """
    import pickle
    import subprocess

    fd, out = tempfile.mkstemp(prefix="dataset-bench-", suffix=".pkl")
    os.close(fd)
    try:
        proc = subprocess.run([sys.executable, "-c", "from packer.bench import _isolated_main; _isolated_main()", out],
                              input=pickle.dumps((fn, kwargs, torch_threads)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
        try:
            with open(out, "rb") as f:
                ok, payload = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            ok, payload = False, proc.stderr.decode(errors="replace")[-2000:] or "no result"
    finally:
        os.unlink(out)
    if not ok:
        raise RuntimeError(f"measurement {getattr(fn, '__name__', fn)} failed in its process "
                           f"(exit code {proc.returncode}): {payload}")
    return payload


def _run_cases(cfg: BenchConfig, cases: list[tuple[str, str, int, str]], targets: dict[str, Target],
               cache: CacheControl, transform: Any, bar: Any, loads: list[float | None],
               monitor: CpuMonitor | None = None) -> list[dict[str, Any]]:
    """Every case ``cfg.repeats`` times (repeat-major, so slow drift spreads over all cases); median rows."""
    runs: dict[tuple, list[LoaderStats]] = {c: [] for c in cases}
    cached: dict[tuple, list[float | None]] = {c: [] for c in cases}
    foreign: dict[tuple, list[float | None]] = {c: [] for c in cases}
    for rep in range(cfg.repeats):
        for case in cases:
            name, mode, w, state = case
            bar.set_description(f"[{rep + 1}/{cfg.repeats}] {name} {mode} w={w} {state}")
            loads.append(_load())
            if monitor is not None:
                monitor.sample(keep=False)
            stats, left = _run_case(cfg, case, targets[name], cache, transform)
            foreign[case].append(monitor.sample() if monitor is not None else None)
            runs[case].append(stats)
            cached[case].append(left)
            bar.update()
    rows = []
    for case in cases:
        name, mode, w, state = case
        row = {"target": name, "mode": mode, "workers": w, "cache": state}
        row.update(_summarize(runs[case], cached[case]))
        known = [f for f in foreign[case] if f is not None]
        row["foreign_cpu_max"] = round(max(known), 3) if known else None  # other processes' CPU share
        rows.append(row)
    _add_ratios(rows)
    return rows


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """``x_naive``: decoded samples/s over the naive baseline's at the same workers and cache state."""
    base = {(r["workers"], r["cache"]): r["samples_per_s"] for r in rows if r["target"] == NAIVE}
    for r in rows:
        b = base.get((r["workers"], r["cache"]))
        r["x_naive"] = (r["samples_per_s"] / b if r["mode"] == "decoded" and b and r["samples_per_s"] is not None
                        else None)


def _measure_limits(cfg: BenchConfig, targets: dict[str, Target], src: Path | None, cache: CacheControl,
                    transform: Any, bar: Any) -> dict[str, Any]:
    src_files = targets[NAIVE].files if NAIVE in targets else (folder_target(src).files if src else [])
    reads: dict[str, dict[str, list]] = {}
    decodes: list[dict[str, dict]] = []
    for rep in range(cfg.repeats):
        for name, t in targets.items():
            for state in ("cold", "warm"):
                bar.set_description(f"[{rep + 1}/{cfg.repeats}] sequential read {name} {state}")
                r = sequential_read(t.files, state == "cold", cache)
                entry = reads.setdefault(name, {}).setdefault(state, [])
                entry.append(r)
                bar.update()
        bar.set_description(f"[{rep + 1}/{cfg.repeats}] single-core decode")
        if src_files:
            decodes.append(decode_rates(src_files, limit=cfg.decode_files, transform=transform))
        bar.update()
    seq = {}
    for name, states in reads.items():
        seq[name] = {
            state: {"mb_per_s": _median([r["mb_per_s"] for r in rs]),
                    "mb": round(rs[0]["bytes"] / MB, 1),
                    "cached_before": _median([r["cached_before"] for r in rs]),
                    "repeats": [r["mb_per_s"] for r in rs]}
            for state, rs in states.items()
        }
        seq[name]["files"] = len(targets[name].files)
    dec = {}
    for key in (decodes[0] if decodes else {}):
        dec[key] = {"images": decodes[0][key]["images"],
                    "images_per_s": _median([d[key]["images_per_s"] for d in decodes]),
                    "mb_per_s": _median([d[key]["mb_per_s"] for d in decodes]),
                    "repeats": [d[key]["images_per_s"] for d in decodes]}
    return {"sequential_read": seq, "decode_single_core": dec, "block_bytes": 8 << 20}


def _load_summary(loads: list[float | None]) -> dict[str, float] | None:
    known = [v for v in loads if v is not None]
    if not known:
        return None
    return {"min": round(min(known), 2), "median": round(statistics.median(known), 2), "max": round(max(known), 2)}


def _load_notes(machine: dict[str, Any], threads: int) -> list[str]:
    notes = [f"torch intra-op threads in the main process: {threads} (loader workers use 1); at num_workers=0 "
             "the transform runs in the main process with these threads"]
    foreign = machine.get("foreign_cpu")
    if foreign is None:
        return notes
    share, worst = foreign["overall"], foreign["max_interval"]
    if share > 0.1 or worst > 0.3:
        notes.append(f"the machine was busy: other processes used {share:.0%} of its CPU time during the run "
                     f"(up to {worst:.0%} during a single measurement); these figures understate the machine and "
                     "are noisier")
    else:
        notes.append(f"other processes used {share:.0%} of the machine's CPU time during the run "
                     f"(at most {worst:.0%} during a single measurement)")
    return notes


def _cache_notes(cfg: BenchConfig, cache: CacheControl, rows: list[dict], limits: dict) -> list[str]:
    notes = []
    if "cold" not in cfg.caches:
        return notes
    if not cache.can_evict:
        return ["cold runs are NOT cold: os.posix_fadvise is not available here, nothing was evicted"]
    if not cache.can_verify:
        return ["cold runs: files were evicted with posix_fadvise(DONTNEED) but eviction could not be "
                "verified (mincore unavailable)"]
    left = [r["cached_after_evict"] for r in rows if r["cache"] == "cold" and r["cached_after_evict"] is not None]
    worst = max(left) if left else 0.0
    if worst > 0.05:
        notes.append(f"cold runs: eviction incomplete, up to {worst:.0%} of a dataset's pages stayed cached "
                     "(mapped or dirty pages cannot be dropped)")
    else:
        notes.append(f"cold runs: eviction verified with mincore (at most {worst:.1%} of pages still cached "
                     "after posix_fadvise(DONTNEED))")
    seq = limits.get("sequential_read", {})
    if seq:
        cold = [v["cold"]["mb_per_s"] for v in seq.values() if v.get("cold", {}).get("mb_per_s")]
        warm = [v["warm"]["mb_per_s"] for v in seq.values() if v.get("warm", {}).get("mb_per_s")]
        if cold and warm and statistics.median(cold) > 0.5 * statistics.median(warm):
            notes.append("cold sequential reads run at more than half the warm rate: the storage below this "
                         "machine (e.g. a VM host's cache) may serve 'cold' reads from memory")
    return notes


# --------------------------------------------------------------------------- reporting


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def format_table(result: BenchResult) -> str:
    """The main table as GitHub markdown: decoded rows first, then raw; warm before cold; by workers."""
    head = ("| mode | cache | workers | reader | samples/s | MB/s | x naive | first batch s | PSS MB (workers) |\n"
            "|---|---|---:|---|---:|---:|---:|---:|---:|")
    lines = [head]
    order = {n: i for i, n in enumerate((NAIVE,) + FORMATS)}
    rows = sorted(result.rows, key=lambda r: (r["mode"] != "decoded", r["cache"] != "warm", r["workers"],
                                              order[r["target"]]))
    for r in rows:
        pss = "-" if r["pss_total_mb"] is None else f"{r['pss_total_mb']:,.0f} ({r['pss_workers_mb']:,.0f})"
        ratio = "-" if r["x_naive"] is None else f"{r['x_naive']:.2f}x"
        label = "naive PIL folder" if r["target"] == NAIVE else r["target"]
        lines.append(f"| {r['mode']} | {r['cache']} | {r['workers']} | {label} | {_fmt(r['samples_per_s'])} | "
                     f"{_fmt(r['mb_per_s'], 1)} | {ratio} | {_fmt(r['first_batch_s'], 2)} | {pss} |")
    return "\n".join(lines)


def format_limits(result: BenchResult) -> str:
    """The raw limits as markdown: sequential read per dataset, single-core decode rates."""
    lim = result.limits
    if not lim:
        return ""
    lines = ["| files read sequentially (8 MiB reads) | MB | cold MB/s | warm MB/s |", "|---|---:|---:|---:|"]
    for name, v in lim.get("sequential_read", {}).items():
        label = f"source folder ({v['files']} files)" if name == NAIVE else f"{name} ({v['files']} files)"
        lines.append(f"| {label} | {_fmt(v['cold']['mb'], 1)} | {_fmt(v['cold']['mb_per_s'])} | "
                     f"{_fmt(v['warm']['mb_per_s'])} |")
    dec = lim.get("decode_single_core", {})
    if dec:
        labels = {"pil_decode": "PIL decode (open + convert RGB)",
                  "decode_rgb": "readers.decode.decode_rgb (auto)",
                  "eval_transform": "decoded mode's per-sample work (decode + eval transform 224)",
                  "eval_transform_bytes": "eval transform called on the JPEG bytes (fused reduced decode)",
                  "naive_item": "naive per-file work (PIL decode + resize + crop + float tensor)"}
        lines += ["", "| single core, source JPEGs in memory | images/s | MB/s (compressed) |", "|---|---:|---:|"]
        for key, v in dec.items():
            lines.append(f"| {labels.get(key, key)} | {_fmt(v['images_per_s'])} | {_fmt(v['mb_per_s'], 1)} |")
    return "\n".join(lines)


def headline(result: BenchResult) -> list[str]:
    """One line per (cache, workers): each format's decoded samples/s as a multiple of the naive baseline."""
    out = []
    for cache in CACHES:
        for w in result.config["workers"]:
            parts = [f"{r['target']} {r['x_naive']:.1f}x" for r in result.rows
                     if r["cache"] == cache and r["workers"] == w and r["x_naive"] is not None
                     and r["target"] != NAIVE]
            base = result.row(NAIVE, "decoded", w, cache)
            if parts and base:
                out.append(f"decoded to 224, {cache} cache, {w} workers: " + ", ".join(parts)
                           + f" the naive PIL folder ({base['samples_per_s']:.0f} samples/s)")
    return out


def draw_chart(result: BenchResult, path: str | os.PathLike) -> Path:
    """Bar chart (PNG, matplotlib Agg): samples/s per reader, one panel per mode, bars per workers x cache."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from matplotlib.ticker import FuncFormatter

    modes = [m for m in ("decoded", "raw") if any(r["mode"] == m and r["target"] != NAIVE for r in result.rows)]
    if not modes:
        modes = ["decoded"]
    names = [n for n in (NAIVE,) + FORMATS if any(r["target"] == n for r in result.rows)]
    combos = [(c, w) for c in CACHES for w in result.config["workers"]
              if any(r["cache"] == c and r["workers"] == w for r in result.rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6.2 * len(modes), 4.8), squeeze=False)
    cmap = plt.get_cmap("tab20")
    width = 0.8 / max(1, len(combos))
    for ax, mode in zip(axes[0], modes):
        shown = [n for n in names if n != NAIVE or mode == "decoded"]
        for k, (cache, w) in enumerate(combos):
            xs, ys, ratios = [], [], []
            for i, n in enumerate(shown):
                r = result.row(n, "decoded" if n == NAIVE else mode, w, cache)
                if r and r["samples_per_s"]:
                    xs.append(i + (k - (len(combos) - 1) / 2) * width)
                    ys.append(r["samples_per_s"])
                    ratios.append(r["x_naive"])
            color = cmap((2 * (k % len(result.config["workers"]))) + (1 if cache == "cold" else 0))
            bars = ax.bar(xs, ys, width, label=f"{w} worker{'s' if w != 1 else ''}, {cache} cache", color=color,
                          hatch="//" if cache == "cold" else None, edgecolor="black", linewidth=0.4)
            if mode == "decoded":
                for b, ratio in zip(bars, ratios):
                    if ratio is not None and b.get_x() > 0.5:  # not on the naive bars themselves
                        ax.annotate(f"{ratio:.1f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                                    ha="center", va="bottom", fontsize=6.5, rotation=90, xytext=(0, 2),
                                    textcoords="offset points")
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(["naive\nPIL folder" if n == NAIVE else n for n in shown])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}" if str(int(v))[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_ylabel("samples/s (log scale, median)")
        title = ("decoded + eval transform to 224 (labels: x naive)" if mode == "decoded"
                 else "raw: stored bytes (mmap: stored 256x256 pixels)")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        values = [b.get_height() for b in ax.patches if b.get_height() > 0]
        if values:  # every bar visible from its base; room above for the ratio labels
            ax.set_ylim(min(values) / 1.6, max(values) * 1.8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    m = result.machine
    fig.suptitle(f"dataset-bench: {result.targets[0]['samples'] if result.targets else '?'} images, "
                 f"batch {result.config['batch_size']}, median of {result.config['repeats']}\n"
                 f"{machine_label(m)}", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_text(result: BenchResult) -> str:
    """Everything the command prints: machine, headline, table, limits, notes."""
    parts = [f"machine: {machine_label(result.machine)}",
             "datasets: " + "; ".join(f"{t['name']} {t['samples']} samples, {t['data_mb']} MB in "
                                      f"{t['files']} files" for t in result.targets),
             f"decoded mode transform: {result.transform}",
             f"batch size {result.config['batch_size']}, median of {result.config['repeats']} repeats; "
             "samples/s: steady rate, from batch max(1, workers) to the last; first batch s includes worker "
             "start-up", ""]
    lines = headline(result)
    if lines:
        parts += ["headline (decoded samples/s vs the naive baseline):"] + [f"  {h}" for h in lines] + [""]
    parts += [format_table(result), ""]
    if result.limits:
        parts += ["raw limits of this machine:", format_limits(result), ""]
    parts += [f"note: {n}" for n in result.notes]
    parts.append(f"total run time {result.seconds:.0f} s")
    return "\n".join(parts)


# --------------------------------------------------------------------------- command line


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected counts >= 0, got {text!r}")
    return values


def _choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}; got {text!r}")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dataset-bench",
        description="Measure packed datasets (wds, lmdb, hdf5, mmap) against a naive PIL ImageFolder "
        "on this machine: samples/s, MB/s, time to first batch, PSS, warm and cold page cache, plus the "
        "machine's raw read and decode rates.",
        epilog="examples:\n"
        "  dataset-bench --generate 2000 --json bench.json --chart bench.png\n"
        "  dataset-bench --src imagenet/val --workers 0,4,8 --repeats 3\n"
        "  dataset-bench --src imagenet/val --datasets out/val-wds out/val-mmap --cache warm\n"
        "  dataset-bench --quick",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--src", help="image folder (root/<class>/<image>): the naive baseline; packed into every "
                   "format when --datasets is not given")
    p.add_argument("--datasets", nargs="+", default=(), metavar="PATH", help="packed dataset folders to measure")
    p.add_argument("--generate", type=int, metavar="N", help="generate N ImageNet-like JPEGs and pack them "
                   "into all formats (mmap with resize=256)")
    p.add_argument("--work", metavar="DIR", help="keep generated and packed data here (default: a temporary "
                   "folder, removed afterwards)")
    p.add_argument("--formats", type=_choices(FORMATS), default=FORMATS, help="formats to pack/measure "
                   "(default: all)")
    p.add_argument("--workers", type=_int_list, default=None, help="num_workers values (default 0,2)")
    p.add_argument("--modes", type=_choices(MODES), default=MODES, help="raw (decode=False) and/or decoded")
    p.add_argument("--cache", type=_choices(CACHES), default=CACHES, help="warm and/or cold page cache")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default 64; --quick 16)")
    p.add_argument("--repeats", type=int, default=None, help="runs per figure; the median is reported "
                   "(default 3; --quick 1)")
    p.add_argument("--max-samples", type=int, help="stop each pass after this many samples")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the naive baseline")
    p.add_argument("--no-limits", dest="limits", action="store_false", help="skip raw read/decode limits")
    p.add_argument("--shard-count", type=int, help="wds: samples per shard when packing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-isolate", dest="isolate", action="store_false", default=None,
                   help="measure in this process instead of a fresh process per measurement (faster start, "
                   "but PSS then includes whatever earlier cases left behind; --quick does this)")
    p.add_argument("--torch-threads", type=int, help="torch.set_num_threads for the run (default: torch's); "
                   "matters at --workers 0, where the transform runs in the main process")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON")
    p.add_argument("--chart", metavar="FILE", help="draw a PNG bar chart")
    p.add_argument("--quick", action="store_true", help="tiny run for smoke tests (48 images, one repeat)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    fields = {
        "src": args.src, "datasets": tuple(args.datasets), "generate": args.generate, "work_dir": args.work,
        "formats": tuple(args.formats), "workers": args.workers, "modes": tuple(args.modes),
        "caches": tuple(args.cache), "batch_size": args.batch_size, "repeats": args.repeats,
        "max_samples": args.max_samples, "baseline": args.baseline, "limits": args.limits,
        "shard_count": args.shard_count, "seed": args.seed, "torch_threads": args.torch_threads,
        "isolate": args.isolate,
    }
    if args.quick:
        return BenchConfig.quick_defaults(**fields)
    return BenchConfig(**{k: v for k, v in fields.items() if v is not None})


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        result = run_benchmark(config, progress=args.progress)
    except (ValueError, OSError, RuntimeError) as exc:  # PackError is a RuntimeError
        print(f"dataset-bench: error: {exc}", file=sys.stderr)
        return 1
    print(report_text(result))
    if args.json:
        print(f"wrote {result.save_json(args.json)}")
    if args.chart:
        print(f"wrote {draw_chart(result, args.chart)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
