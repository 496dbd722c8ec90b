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
  ``readers.loader.prefetch.DevicePrefetcher`` takes as it is -- or a
  :class:`ByteBatch` for ``decode=False``.

A reader returns None from ``get_batch`` when it has no whole-batch path for
its settings (a transform, samples of different shapes); the loaders then
fall back to ``__getitems__`` + collate. ``readers.loader.threads`` and the
loader's collate in worker processes (``readers.loader.collation.Collate``) call it.

Every :class:`ByteBatch` is built by :func:`new_byte_batch` (or
:func:`byte_batch`, which copies pieces into one).
"""

from __future__ import annotations

import copy
import ctypes
import sys
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from readers.contract.env import native_library
from readers.contract.perprocess import PerProcess

__all__ = ["ByteBatch", "index_array", "finish_batch", "byte_offsets", "new_byte_batch", "byte_batch", "shared_tensor", "Allocator",
           "BufferPool", "batch_buffer", "concat_into", "copy_runs", "gather_library", "GatheredItems", "Pending",
           "gathered"]

#: ``alloc(nbytes) -> uint8 numpy array`` (or uint8 tensor) of at least that many bytes: where a batch
#: is written (this process's pool by default; a reusable shared-memory slot in a worker process).
Allocator = Callable[[int], Any]


class ByteBatch(NamedTuple):
    """A batch of encoded samples: ``data[offsets[k]:offsets[k+1]]`` is sample k."""

    data: torch.Tensor  # uint8, all samples back to back
    offsets: torch.Tensor  # int64, len B + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, k: int) -> bytes:
        return self.data[int(self.offsets[k]):int(self.offsets[k + 1])].cpu().numpy().tobytes()  # also after .to(device)


def shared_tensor(nbytes: int) -> torch.Tensor:
    """An :data:`Allocator` for a loader worker: an empty uint8 tensor in shared memory (sending
    it to the main process copies nothing; an empty segment: nothing copied yet)."""
    return torch.empty(nbytes, dtype=torch.uint8).share_memory_()


def byte_offsets(sizes: Any) -> np.ndarray:
    """``offsets`` of a ByteBatch of samples of ``sizes`` bytes: int64, ``[0, s0, s0+s1, ...]``."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def new_byte_batch(offsets: np.ndarray, alloc: Allocator | None = None) -> tuple[ByteBatch, np.ndarray]:
    """The one ByteBatch builder: an unfilled batch whose sample k goes to ``data[offsets[k]:offsets[k+1]]``.

    Returns the batch and its data as a uint8 numpy array to write into (the same memory).
    ``alloc`` gives the memory (default: this process's :class:`BufferPool`); it may return a
    numpy array or a tensor (a shared-memory one in a loader worker stays shared).
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    n = int(offsets[-1])
    buf = (alloc or _fresh)(n)[:n]
    if isinstance(buf, torch.Tensor):
        return ByteBatch(buf, torch.from_numpy(offsets)), buf.numpy()
    return ByteBatch(torch.from_numpy(buf), torch.from_numpy(offsets)), buf


class BufferPool:
    """Batch buffers reused once nothing refers to them any more.

    A fresh multi-megabyte array per batch costs a page fault per 4 KB page
    on first write (measured here: ``os.preadv`` of 100 KB samples into a
    fresh buffer 33-45 us per sample, into a reused one 10-12 us). A batch
    handed out keeps its buffer alive (every numpy view, and the torch tensor
    made from one, holds the buffer), so a buffer is free exactly when this
    pool holds the only reference to it. At most ``max_buffers`` are kept;
    past that (a caller keeping many batches) buffers are plain fresh arrays.
    Thread-safe; one pool per process (a forked child starts with its own).
    """

    def __init__(self, max_buffers: int = 12) -> None:
        self.max_buffers = max_buffers
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> np.ndarray:
        with self._lock:
            best = None
            for k in range(len(self._buffers)):
                buf = self._buffers[k]
                # references: the list, ``buf`` and getrefcount's argument -- nothing else holds it
                if buf.nbytes >= nbytes and sys.getrefcount(buf) <= 3 and (best is None or buf.nbytes < best.nbytes):
                    best = buf
                del buf
            if best is not None:
                return best[:nbytes]
            fresh = np.empty(max(nbytes, (nbytes + nbytes // 4 + (1 << 20) - 1) >> 20 << 20), dtype=np.uint8)
            if len(self._buffers) < self.max_buffers:
                self._buffers.append(fresh)
            return fresh[:nbytes]


_POOL = PerProcess(BufferPool)


def _fresh(nbytes: int) -> np.ndarray:
    """A batch buffer of ``nbytes`` from this process's :class:`BufferPool`."""
    return _POOL.get()(nbytes)


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


def batch_buffer(nbytes: int, alloc: Allocator | None = None) -> np.ndarray:
    """``nbytes`` of uint8 to write a batch into: from ``alloc`` when given, else from the pool."""
    return (alloc or _fresh)(nbytes)[:nbytes]


def byte_batch(pieces: Sequence[Any], sizes: Any = None, alloc: Allocator | None = None) -> ByteBatch:
    """Copy ``pieces`` (buffers of ``sizes`` bytes each; default their lengths) back to back into one ByteBatch."""
    offsets = byte_offsets([memoryview(p).nbytes for p in pieces] if sizes is None else sizes)
    batch, data = new_byte_batch(offsets, alloc)
    concat_into([np.frombuffer(p, dtype=np.uint8) for p in pieces], data)
    return batch


GATHER = "readers.formats._gather"  # setup.py's optional extension: a plain C library, loaded by path
_GATHER_VERSION = 1
_GATHER_ENV = "DATASET_PACKER_GATHER"  # "off": numpy copies


def gather_library() -> ctypes.CDLL | None:
    """The native batch gather (``readers/formats/_gather.c``), or None (not built, or
    ``DATASET_PACKER_GATHER=off``): then :func:`copy_runs` copies with numpy, the same bytes."""
    return native_library(GATHER, version_symbol="gt_version", version=_GATHER_VERSION, off_env=_GATHER_ENV,
                          without="batches are copied with numpy",
                          functions=(("gt_gather", None, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                          ctypes.c_int64)),))


def copy_runs(data: np.ndarray, sources: Sequence[np.ndarray], which: np.ndarray, starts: np.ndarray,
              sizes: np.ndarray) -> None:
    """Copy run k, ``sources[which[k]][starts[k]:starts[k] + sizes[k]]``, back to back into ``data``,
    which the runs fill exactly: the one copy of a whole-batch read (a shard's or a file's mapping
    into the batch buffer).

    ``sources`` are 1-D uint8 arrays (mappings, buffers); each run must lie inside its source (checked
    here, as a ValueError: the readers check their own bounds first and say which file is short).
    With the native gather (:func:`gather_library`) it is one call for the whole batch, without the GIL,
    and runs of 4 KB or more go to memory without passing through the cache (see ``_gather.c``); else one
    ``numpy.concatenate`` of views (:func:`concat_into`). A memoryview slice assignment per piece took
    1.3x as long in one thread as that, and with two loader threads the Python between pieces passed
    the GIL back and forth (lmdb ``decode=False``, 2 threads: 52k samples/s that way, 87k with one numpy
    call)."""
    n = len(sizes)
    if not n:
        return
    which = np.asarray(which, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    lengths = np.array([len(s) for s in sources], dtype=np.int64)[which]
    if (starts < 0).any() or (sizes < 0).any() or (starts + sizes > lengths).any() or int(sizes.sum()) != data.nbytes:
        raise ValueError("copy_runs: a run lies outside its source, or the runs do not fill the batch exactly")
    lib = gather_library()
    if lib is None or not data.flags.c_contiguous or not all(s.flags.c_contiguous and s.dtype == np.uint8
                                                              and s.ndim == 1 for s in sources):
        concat_into([sources[w][a:a + m] for w, a, m in zip(which.tolist(), starts.tolist(), sizes.tolist())], data)
        return
    bases = np.array([s.ctypes.data for s in sources], dtype=np.uint64)
    addrs = bases[which] + starts.astype(np.uint64)
    lens = sizes.astype(np.uint64)
    lib.gt_gather(data.ctypes.data, addrs.ctypes.data, lens.ctypes.data, n)  # sources stay referenced here


def concat_into(pieces: Sequence[np.ndarray], data: np.ndarray) -> None:
    """Copy ``pieces`` (1-D uint8 arrays, e.g. LMDB's values) back to back into ``data``, which they fill
    exactly, in one numpy call. Pieces with an address each, not runs of a few sources: finding each
    one's address for the native gather (``__array_interface__``, ~1.1 us) cost more than the gather
    saved (lmdb bytes, 0 workers: 98k-101k samples/s with numpy, 80k-82k that way)."""
    if len(pieces):
        np.concatenate(pieces, out=data)


class GatheredItems:
    """What a reader's ``__getitems__`` returns when it can read the batch whole (``batchable()``).

    A sequence of the batch's ``(image, label[, index])`` items for anyone who
    treats it as one (a custom ``collate_fn``, ``default_collate``, a direct
    call), built from one whole-batch read. ``readers.loader.collation.Collate`` asks for
    :meth:`gather` instead and gets the batch itself: no per-sample objects at
    all. The read happens on first use, so a collate can say where the batch
    goes (``alloc``: a reusable shared-memory slot in a worker process).
    """

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = index_array(indices, len(dataset))  # out-of-range indices fail here, as before
        self._batch: tuple | None = None

    def gather(self, alloc: Allocator | None = None) -> tuple:
        """The collated batch, read with ``dataset.get_batch`` (into ``alloc``'s memory when given)."""
        if self._batch is None:
            self._batch = self._read(alloc)
            if self._batch is None:
                raise RuntimeError(f"{type(self.dataset).__name__}.get_batch declined a batch its batchable() took")
        return self._batch

    def _read(self, alloc: Allocator | None) -> tuple | None:
        return self.dataset.get_batch(self.indices.tolist(), **({} if alloc is None else {"alloc": alloc}))

    def again(self) -> "GatheredItems":
        """The same samples, not read yet (to read them again into other memory)."""
        fresh = copy.copy(self)
        fresh._batch = None
        return fresh

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> tuple:
        if not isinstance(k, (int, np.integer)):
            raise TypeError(f"GatheredItems indices must be integers, got {type(k).__name__}")
        images, *rest = self.gather()
        if isinstance(images, ByteBatch):
            image: Any = images.get(int(k))
        else:
            image = images[k].contiguous()  # one sample as the per-sample path gives it: contiguous CHW
        return (image, *(int(r[k]) for r in rest))

    def __iter__(self):
        return (self[k] for k in range(len(self)))


class Pending:
    """Sample ``index`` of ``dataset``, not read yet: what an iterable reader yields to a loader that
    reads whole batches (``ShardDataset.with_batch_reads``). The loader's collate turns a batch of them
    into one whole-batch read (:func:`gathered`), so no per-sample ``bytes`` is ever made; anyone
    else gets the item itself on first use (``image, label = pending``; :meth:`item`)."""

    __slots__ = ("dataset", "index")

    def __init__(self, dataset: Any, index: int) -> None:
        self.dataset, self.index = dataset, index

    def item(self) -> tuple:
        """The sample's item, as the reader's per-sample path gives it (read now)."""
        return self.dataset.pending_item(self.index)

    def __iter__(self) -> Any:
        return iter(self.item())

    def __len__(self) -> int:
        return len(self.item())

    def __getitem__(self, k: Any) -> Any:
        return self.item()[k]

    def __repr__(self) -> str:
        return f"Pending(sample {self.index} of {self.dataset!r})"


def gathered(batch: Sequence[Any]) -> Any:
    """``batch`` as its reader's :class:`GatheredItems` when it is a list of :class:`Pending` samples
    of one reader (``dataset.gathered(indices)``: read whole when collated), else as it is."""
    if not (isinstance(batch, list) and batch and isinstance(batch[0], Pending)):
        return batch
    ds = batch[0].dataset
    if all(type(p) is Pending and p.dataset is ds for p in batch):
        return ds.gathered([p.index for p in batch])
    return [p.item() if isinstance(p, Pending) else p for p in batch]
