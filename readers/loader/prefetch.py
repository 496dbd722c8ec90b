"""Feed uint8 image batches to the device: overlapped copy, normalize, optional channels_last.

Counterpart of ``readers/decode/transforms.py``, whose transforms produce the uint8
(3, H, W) tensors that a DataLoader batches into the ``[B, 3, H, W]`` inputs
this module moves and normalizes.

:class:`DevicePrefetcher` wraps any iterable of ``(images, labels, ...)``
batches. On CUDA it copies batch ``n+1`` to the device on a side
``torch.cuda.Stream`` with ``non_blocking=True`` while batch ``n`` is used:
the compute stream waits on the side stream (``wait_stream``) before it
touches a batch, and each tensor made on the side stream is marked with
``record_stream`` so the caching allocator does not recycle its memory while
the compute stream still reads it. For the copy to overlap, the host batch
must be in pinned memory (``DataLoader(pin_memory=True)``); otherwise it is a
synchronous copy and a debug message says so once. On the device the images
become ``dtype`` and are normalized as ``(x / 255 - mean) / std`` (computed
in float32, then cast), optionally in ``channels_last`` memory format. On a
CPU device the same work is done synchronously: same interface, same numbers.

The host-to-device copy time of each batch (CUDA events around the copies on
the side stream; ``time.perf_counter`` on CPU) is kept in ``copy_times``
(seconds) and summarized by :meth:`DevicePrefetcher.stats`, for a starvation
meter's "ToCUDA" column. CUDA timings are read once their events complete, so
``copy_times`` lags the iteration by at most a batch until the loop ends.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "DevicePrefetcher", "normalize"]

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _stat_tensor(values: Sequence[float] | torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.float32).flatten()
    if t.numel() != 3:
        raise ValueError(f"{name} must have 3 values (one per RGB channel), got {t.numel()}")
    if name == "std" and bool((t == 0).any()):
        raise ValueError("std must not contain zeros")
    return t.view(1, 3, 1, 1)


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, *, dtype: torch.dtype = torch.float32,
              channels_last: bool = False) -> torch.Tensor:
    """``(images.float() / 255 - mean) / std`` cast to ``dtype``; ``mean``/``std`` shaped (1, 3, 1, 1).

    Computed in float32 (float64 when ``dtype`` is float64), on ``images``' device.
    """
    work = torch.float64 if dtype == torch.float64 else torch.float32
    x = images.to(work)
    x = x.div_(255).sub_(mean.to(work)).div_(std.to(work))
    if x.dtype != dtype:
        x = x.to(dtype)
    # The input may be a channels_last view (MemmapDataset's batches are the stored HWC rows): the
    # layout asked for is made here, on the device, where the permute costs next to nothing.
    x = x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return x


class _Pending:
    """A batch already sent to the device, and how to time its copy."""

    __slots__ = ("batch", "start", "end")

    def __init__(self, batch: tuple, start: Any = None, end: Any = None) -> None:
        self.batch, self.start, self.end = batch, start, end


class DevicePrefetcher:
    """Iterate ``(images, labels, ...)`` batches already on ``device``, normalized.

    ``loader`` yields tuples/lists whose first item is a ``uint8`` tensor
    ``[B, 3, H, W]`` (any strides: a ``channels_last`` view of HWC rows is copied
    to the device as it is, one contiguous copy, and permuted there); the other items (labels, ...) are moved to the device
    unchanged (non-tensors pass through). Yields tuples ``(x, labels, ...)``
    where ``x`` is ``dtype`` ``[B, 3, H, W]``, ``(images / 255 - mean) / std``,
    in ``channels_last`` format when asked. ``device=None`` picks CUDA when
    available, else the CPU. Has ``len()`` when ``loader`` has one.
    """

    def __init__(self, loader: Iterable, device: torch.device | str | None = None,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 channels_last: bool = False, dtype: torch.dtype = torch.float32) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {self.device} requested but CUDA is not available")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
        self.loader = loader
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self.mean = _stat_tensor(mean, "mean").to(self.device)
        self.std = _stat_tensor(std, "std").to(self.device)
        self.copy_times: list[float] = []
        self._cuda = self.device.type == "cuda"
        self._unresolved: list[_Pending] = []
        self._warned_unpinned = False

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the wrapped {type(self.loader).__name__} has no len()") from None

    # ------------------------------------------------------------------ stats

    def _resolve(self, wait: bool) -> None:
        while self._unresolved:
            p = self._unresolved[0]
            if not wait and not p.end.query():
                return
            p.end.synchronize()
            self.copy_times.append(p.start.elapsed_time(p.end) / 1000.0)
            self._unresolved.pop(0)

    def stats(self) -> dict:
        """Host-to-device copy time summary: batches, total/mean/median/max seconds."""
        if self._cuda:
            self._resolve(wait=True)
        t = self.copy_times
        return {
            "device": str(self.device),
            "batches": len(t),
            "copy_s_total": float(sum(t)),
            "copy_s_mean": float(statistics.fmean(t)) if t else 0.0,
            "copy_s_median": float(statistics.median(t)) if t else 0.0,
            "copy_s_max": float(max(t)) if t else 0.0,
        }

    def reset_stats(self) -> None:
        """Forget the recorded copy times."""
        if self._cuda:
            self._resolve(wait=True)
        self.copy_times.clear()

    # ------------------------------------------------------------------ work

    @staticmethod
    def _split(batch: Any) -> tuple[torch.Tensor, tuple]:
        if not isinstance(batch, (tuple, list)) or len(batch) < 1:
            raise TypeError(f"expected (images, labels, ...) batches, got {type(batch).__name__}")
        images, rest = batch[0], tuple(batch[1:])
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4 \
                or images.shape[1] != 3:
            desc = f"{images.dtype} {tuple(images.shape)}" if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(f"expected uint8 images of shape [B, 3, H, W], got {desc}")
        return images, rest

    def _move(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=self._cuda)
        return value

    def _send_cpu(self, batch: Any) -> tuple:
        images, rest = self._split(batch)
        t0 = time.perf_counter()
        images = images.to(self.device)
        rest = tuple(self._move(v) for v in rest)
        self.copy_times.append(time.perf_counter() - t0)
        x = normalize(images, self.mean, self.std, dtype=self.dtype, channels_last=self.channels_last)
        return (x,) + rest

    def _send_cuda(self, batch: Any, stream: torch.cuda.Stream) -> _Pending:
        images, rest = self._split(batch)
        if not images.is_pinned() and not self._warned_unpinned:
            log.debug("host batches are not pinned: copies to %s will not overlap compute "
                      "(use DataLoader(pin_memory=True))", self.device)
            self._warned_unpinned = True
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            images = images.to(self.device, non_blocking=True)
            rest = tuple(self._move(v) for v in rest)
            end.record(stream)
            x = normalize(images, self.mean, self.std, dtype=self.dtype, channels_last=self.channels_last)
        return _Pending((x,) + rest, start, end)

    def __iter__(self) -> Iterator[tuple]:
        if not self._cuda:
            for batch in self.loader:
                yield self._send_cpu(batch)
            return
        yield from self._iter_cuda()

    def _iter_cuda(self) -> Iterator[tuple]:
        stream = torch.cuda.Stream(self.device)
        # Work queued on the compute stream before (mean/std upload, last epoch) precedes the side stream's.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        it = iter(self.loader)
        nxt = self._next_cuda(it, stream)
        while nxt is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)  # the copy and normalize of `nxt` finish before the caller uses it
            for value in nxt.batch:
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    value.record_stream(current)  # made on `stream`, used on `current`
            self._unresolved.append(nxt)
            batch = nxt.batch
            nxt = self._next_cuda(it, stream)  # start the next copy before handing this batch out
            self._resolve(wait=False)
            yield batch
        self._resolve(wait=True)

    def _next_cuda(self, it: Iterator, stream: torch.cuda.Stream) -> _Pending | None:
        try:
            batch = next(it)
        except StopIteration:
            return None
        return self._send_cuda(batch, stream)
