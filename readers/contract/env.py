"""What this process may use: CPUs (affinity and cgroup quota), worker/rank identity, the native helpers built.

Shared by the packer (``--workers`` default) and the loader (``num_workers``).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import math
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["available_cpus", "cgroup_cpu_limit", "local_world_size", "default_workers", "check_threads",
           "die_with_parent", "WorkerEnv", "current_worker_env", "ThreadWorker", "thread_worker", "as_thread_worker",
           "worker_seed", "native_path", "native_library"]

log = logging.getLogger(__name__)


def native_path(module: str) -> Path | None:
    """Where the package build put the optional native helper ``module`` (setup.py's extensions, e.g.
    ``readers.decode._jpegcrop``: a plain C library that ctypes loads by this path, never imported), or
    None where the build could not compile it."""
    spec = importlib.util.find_spec(module)  # finds the file without importing it
    return Path(spec.origin) if spec is not None and spec.origin else None


#: A native helper's functions to declare: (name, restype, argtypes).
NativeFunctions = tuple[tuple[str, Any, tuple[Any, ...]], ...]


def native_library(module: str, *, version_symbol: str, version: int, off_env: str, without: str,
                   functions: NativeFunctions) -> ctypes.CDLL | None:
    """The optional native helper ``module`` (:func:`native_path`) loaded with ctypes, its ``functions``
    declared; None where it was not built (a debug line), where ``off_env`` says ``off``, or where it does
    not load or has another interface version than ``version`` (its ``int version_symbol(void)``): then a
    warning that ends with ``without``, what the package does instead. Loaded once per process."""
    if os.environ.get(off_env, "").lower() == "off":
        return None
    return _load_native(module, version_symbol, version, without, functions)


@functools.lru_cache(maxsize=None)
def _load_native(module: str, version_symbol: str, version: int, without: str,
                 functions: NativeFunctions) -> ctypes.CDLL | None:
    path = native_path(module)
    if path is None:
        log.debug("native helper %s not built (the install found no C compiler)", module)
        return None
    try:
        lib = ctypes.CDLL(str(path))
        getattr(lib, version_symbol).restype = ctypes.c_int
        if getattr(lib, version_symbol)() != version:
            log.warning("%s has another interface than this code's: rebuild it by reinstalling the package "
                        "(pip install -e .); %s", path, without)
            return None
        for name, restype, argtypes in functions:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, list(argtypes)
    except (OSError, AttributeError) as exc:
        log.warning("native helper %s not loaded (%s); %s", path, exc, without)
        return None
    return lib


def cgroup_cpu_limit(root: str | os.PathLike = "/sys/fs/cgroup") -> float | None:
    """CPU quota of this process's cgroup in CPUs (v2 ``cpu.max`` or v1 cfs), or None."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None


def available_cpus() -> int:
    """CPUs this process may actually use: affinity mask, capped by the cgroup quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.ceil(limit)))
    return max(1, n)


def local_world_size() -> int:
    """Training processes on this machine: ``LOCAL_WORLD_SIZE`` (torchrun, accelerate), else
    ``WORLD_SIZE`` when a launcher set ``LOCAL_RANK`` without it (Lightning's: one node assumed,
    which can only underestimate the CPUs per process), else 1."""
    for name in ("LOCAL_WORLD_SIZE",) + (("WORLD_SIZE",) if "LOCAL_RANK" in os.environ else ()):
        try:
            return max(1, int(os.environ[name]))
        except (KeyError, ValueError):
            continue
    return 1


def default_workers() -> int:
    """Loader workers per training process: usable CPUs shared by the local processes, at least 1
    (a worker overlaps loading with the training step even on one CPU)."""
    return max(1, available_cpus() // local_world_size())


#: The most threads :func:`check_threads` gives: each holds a slice's temporaries (a few MB).
CHECK_THREADS_MAX = 8


def check_threads() -> int:
    """Threads for the O(N) checks of a dataset's first open on a machine (CRC-32 of the index
    arrays, their value ranges): this process's share of the CPUs, as :func:`default_workers`,
    at most :data:`CHECK_THREADS_MAX`."""
    return min(CHECK_THREADS_MAX, default_workers())


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = 9) -> bool:
    """Ask the kernel to send ``sig`` (SIGKILL) to this process when its parent ``parent_pid`` dies
    (Linux ``prctl(PR_SET_PDEATHSIG)``). True if set. Nothing is set when this process is not a
    child of ``parent_pid`` (e.g. started by a forkserver); it exits at once if the parent died
    while this was being set.

    The signal fires when the parent *thread* that started this process ends, so call it only
    in processes started from the parent's main thread.

    A multiprocessing child of ``parent_pid`` whose parent has died already (killed while this
    process was starting, so it now has another parent) exits at once too: left to run, a loader
    worker would go on with no one to read what it sends."""
    if os.getppid() != parent_pid:
        import multiprocessing

        parent = multiprocessing.parent_process()
        if parent is not None and parent.pid == parent_pid and not parent.is_alive():
            os._exit(1)
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    return True


_trim: Any = None  # glibc's malloc_trim once looked up; False where there is none


def release_freed_memory() -> bool:
    """Hand the pages of freed heap memory back to the kernel (glibc ``malloc_trim``); True if done.

    glibc keeps freed blocks of a few MB in the heap, so an epoch's order leaves its temporaries
    (three to four times the order: 30 MB per wds worker at 100M samples) in each worker's private
    memory until the process ends. Elsewhere (musl, macOS) it does nothing."""
    global _trim
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim is False:
        return False
    _trim(0)
    return True


@dataclass(frozen=True)
class WorkerEnv:
    """Where this code runs: DDP rank/world size and DataLoader worker id/count."""

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1

    @property
    def global_worker(self) -> int:
        return self.rank * self.num_workers + self.worker_id

    @property
    def global_workers(self) -> int:
        return self.world_size * self.num_workers


def _torch_env() -> WorkerEnv:
    import torch.distributed as dist
    from torch.utils.data import get_worker_info

    rank, world = 0, 1
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
    info = get_worker_info()
    if info is not None:
        return WorkerEnv(rank, world, info.id, info.num_workers)
    tw = thread_worker()
    if tw is not None:
        return WorkerEnv(rank, world, tw.worker_id, tw.num_workers)
    return WorkerEnv(rank, world, 0, 1)


#: Tests replace this hook to simulate ranks and workers without a DataLoader.
worker_env_hook: Callable[[], WorkerEnv] = _torch_env


def current_worker_env() -> WorkerEnv:
    return worker_env_hook()


# --------------------------------------------------------------------------- loader threads


@dataclass
class ThreadWorker:
    """A loader thread's identity (``make_loader(..., workers="threads")``), the thread-mode
    counterpart of torch's ``get_worker_info()``: its id, the thread count, its seed
    (``base_seed + worker_id``, as a DataLoader worker process gets), and per-thread state
    that objects shared by the threads keep here (a transform's random generator)."""

    worker_id: int
    num_workers: int
    seed: int
    state: dict[int, Any] = field(default_factory=dict)


_THREAD = threading.local()


def thread_worker() -> ThreadWorker | None:
    """The :class:`ThreadWorker` of the calling loader thread; None outside loader threads."""
    return getattr(_THREAD, "worker", None)


@contextmanager
def as_thread_worker(worker: ThreadWorker) -> Iterator[ThreadWorker]:
    """Run the block as loader thread ``worker`` (the calling thread only)."""
    previous = thread_worker()
    _THREAD.worker = worker
    try:
        yield worker
    finally:
        _THREAD.worker = previous


def worker_seed() -> int | None:
    """The loader worker's seed: ``torch.initial_seed()`` in a DataLoader worker process, the
    thread's seed in a loader thread, None elsewhere (the main process)."""
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        import torch

        return int(torch.initial_seed())
    tw = thread_worker()
    return tw.seed if tw is not None else None
