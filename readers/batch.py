"""Whole-batch reads: a map-style reader's ``get_batch(indices)`` and what it builds on.

A DataLoader builds a batch one sample at a time: one ``__getitem__`` (or
one item of ``__getitems__``) per index, one Python object per sample, and
``collate`` copies them all once more into the batch. When a sample is
only a memory copy (memory-mapped pixels, stored bytes), those per-sample
steps cost more than the copy itself. ``get_batch`` reads the whole batch
in one call, straight into the batch's own buffer, and returns what
``collate`` would have returned:

* ``(images, labels)`` (``+ indices`` with ``return_index=True``), labels and
  indices ``int64`` tensors;
* ``images`` a ``uint8`` ``[B, 3, H, W]`` tensor for pixels -- for ``mmap``
  a ``channels_last`` view of the stored HWC rows, which
  ``readers.prefetch.DevicePrefetcher`` takes as it is -- or a
  :class:`readers.shmring.ByteBatch` for ``decode=False``.

A reader returns None from ``get_batch`` when it has no whole-batch path for
its settings (a transform, samples of different shapes); the loaders then
fall back to ``__getitems__`` + collate. ``readers.threads`` and
``readers.batched`` (worker processes) call it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from readers.shmring import ByteBatch

__all__ = ["index_array", "finish_batch", "byte_batch", "Allocator"]

#: ``alloc(nbytes) -> uint8 numpy array`` of at least that many bytes: where a batch is written
#: (a fresh array by default; a reusable shared-memory slot in a worker process).
Allocator = Callable[[int], np.ndarray]


def _fresh(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def index_array(indices: Sequence[int], n: int) -> np.ndarray:
    """``indices`` as int64, negative ones counted from the end; IndexError when out of range."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = int(idx[(idx < -n) | (idx >= n)][0])
        raise IndexError(f"sample index {bad} out of range for {n} samples")
    return np.where(idx < 0, idx + n, idx)


def finish_batch(dataset: Any, images: Any, idx: np.ndarray) -> tuple:
    """``(images, labels[, indices])`` as ``collate`` builds it for ``dataset``'s items."""
    labels = torch.from_numpy(np.asarray(dataset.labels[idx], dtype=np.int64))
    if getattr(dataset, "return_index", False):
        return images, labels, torch.from_numpy(idx.copy())
    return images, labels


def byte_batch(pieces: Sequence[Any], sizes: np.ndarray, alloc: Allocator = _fresh) -> ByteBatch:
    """Copy ``pieces`` (buffers of ``sizes`` bytes each) back to back into one ByteBatch."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = alloc(int(offsets[-1]))[: int(offsets[-1])]
    for k, piece in enumerate(pieces):
        data[offsets[k]:offsets[k + 1]] = np.frombuffer(piece, dtype=np.uint8)
    return ByteBatch(torch.from_numpy(data), torch.from_numpy(offsets))
