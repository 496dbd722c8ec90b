"""Page-cache control: evict files, check what is still cached, read files front to back.

Eviction: ``os.sync()`` then ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)``
on every file. Residency: ``mincore(2)`` through ctypes on a read-only
mapping of each file (no page is touched). Pages that are mapped by a live
process or dirty cannot be dropped, so a "cold" measurement checks what was
left (:meth:`CacheControl.resident_fraction`) instead of assuming.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["BLOCK", "CacheControl", "read_all", "sequential_read"]

BLOCK = 8 << 20  # read size of the sequential reads (8 MiB)
MB = 1e6


def _libc() -> Any:
    """libc with ``mmap``/``munmap``/``mincore`` typed for ctypes, or None off Linux or when it cannot load."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


class CacheControl:
    """Evict files from the page cache and measure how much of them is cached.

    ``can_evict`` / ``can_verify`` say what works on this system.
    """

    def __init__(self) -> None:
        self.can_evict = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")
        self._libc = _libc()
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
                return int((np.frombuffer(memoryview(vec), dtype=np.uint8) & 1).sum()), pages
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
    def warm(paths: Iterable[str | os.PathLike], block: int = BLOCK) -> int:
        """Read the files once so that they are cached; returns the bytes read."""
        return read_all(paths, block)[0]


def read_all(paths: Iterable[str | os.PathLike], block: int = BLOCK) -> tuple[int, float]:
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


def sequential_read(paths: Sequence[str | os.PathLike], cold: bool, cache: CacheControl,
                    block: int = BLOCK) -> dict[str, Any]:
    """Read the files front to back with ``block``-sized reads; cold = evicted first, warm = read once first."""
    if cold:
        cache.evict(paths)
    else:
        cache.warm(paths, block)
    before = cache.resident_fraction(paths)
    nbytes, seconds = read_all(paths, block)
    return {"bytes": nbytes, "seconds": seconds, "mb_per_s": nbytes / seconds / MB if seconds > 0 else 0.0,
            "cached_before": before}
