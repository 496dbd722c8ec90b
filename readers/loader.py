"""``make_loader``: a DataLoader with the settings the field learned the hard way.

* ``num_workers`` from the CPUs this process may use (affinity + cgroup
  quota), not ``os.cpu_count()`` (which reports the host's CPUs in a container);
* ``persistent_workers=True`` (no worker start-up cost per epoch),
  ``prefetch_factor=2``, ``pin_memory`` only when CUDA is available;
* ``/dev/shm`` checked against what the prefetch queue needs; when too small
  (Docker's default is 64 MB) the ``file_system`` sharing strategy is used,
  with a warning that says how to fix it;
* reproducible: a seeded generator (so workers' base seeds repeat), a
  ``worker_init_fn`` that seeds numpy and ``random`` per worker, and an
  epoch counter that reaches samplers and persistent workers;
* batches as tensors, which travel from workers through shared memory:
  ``decode=False`` samples (Python ``bytes``) are packed by the worker into
  a :class:`ByteBatch` (one flat uint8 tensor in shared memory plus
  offsets), not sent as a list of ``bytes`` that must be pickled.
"""

from __future__ import annotations

import logging
import random
import shutil
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler, get_worker_info

from readers import shmring
from readers.batch import GatheredItems
from readers.env import available_cpus, current_worker_env
from readers.shmring import ByteBatch

__all__ = ["make_loader", "PackedLoader", "EpochSampler", "ByteBatch", "collate", "shm_check", "ShmSpace",
           "use_file_system_sharing"]

log = logging.getLogger(__name__)


def _collate_bytes(items: Sequence[Any]) -> ByteBatch:
    """Pack encoded samples into one uint8 tensor, written straight into shared memory
    when running in a loader worker (so sending it to the main process copies nothing)."""
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in items], out=offsets[1:])
    data = torch.empty(int(offsets[-1]), dtype=torch.uint8)
    if get_worker_info() is not None:
        data.share_memory_()  # empty segment: no copy yet
    view = data.numpy()
    for k, b in enumerate(items):
        view[offsets[k]:offsets[k + 1]] = np.frombuffer(b, dtype=np.uint8)
    return ByteBatch(data, torch.from_numpy(offsets))


def _collate_images(images: Sequence[Any]) -> Any:
    # numpy stack, not torch.stack: torch's intra-op threads spin against the
    # loader's own workers on a busy machine (measured here: 0.3 ms vs up to
    # 100 ms for a 6 MB batch).
    first = images[0]
    if isinstance(first, (bytes, bytearray, memoryview)):
        return _collate_bytes(images)
    if isinstance(first, torch.Tensor):
        same = all(t.shape == first.shape for t in images)
        if same and first.dtype != torch.bfloat16:
            return torch.from_numpy(np.stack([t.numpy() for t in images]))
        if same:
            return torch.stack(list(images))
        return list(images)  # images of different sizes and no resizing transform
    return torch.utils.data.default_collate(list(images))


def collate(batch: Sequence[tuple]) -> tuple:
    """Collate (image, label[, index]) items: stack equal-shape images, pack bytes flat."""
    if isinstance(batch, GatheredItems):  # a whole-batch read (readers.batch)
        return batch.gather()
    columns = list(zip(*batch))
    out = [_collate_images(columns[0])]
    out += [torch.as_tensor(c, dtype=torch.int64) for c in columns[1:]]
    return tuple(out)


class Collate:
    """``collate`` plus reusable shared-memory slots for encoded bytes (see readers.shmring).

    In a loader worker, a batch of ``bytes`` items is written into one of the
    worker's reusable slots and rebuilt as a ByteBatch in the main process;
    everything else (and the main process itself) goes through ``collate``.
    """

    def __init__(self, slots: int = 4) -> None:
        self.ring = shmring.ShmSlots(slots) if shmring.available() else None

    def __call__(self, batch: Sequence[tuple]) -> Any:
        if isinstance(batch, GatheredItems):  # the reader read the whole batch: nothing per sample
            return batch.gather()
        if (self.ring is not None and batch and isinstance(batch[0][0], (bytes, bytearray))
                and get_worker_info() is not None):
            columns = list(zip(*batch))
            rest = tuple(torch.as_tensor(c, dtype=torch.int64) for c in columns[1:])
            packed = self.ring.pack(columns[0], rest)
            if packed is not None:
                return packed
        return collate(batch)


class EpochSampler(Sampler[int]):
    """Shuffles ``range(n)`` with ``(seed, epoch)``: new order per epoch, same for the same seed."""

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0) -> None:
        self.n, self.shuffle, self.seed, self.epoch = n, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class PackedLoader(DataLoader):
    """A DataLoader that passes an epoch number to its sampler and dataset.

    Each ``iter(loader)`` starts the next epoch (0, 1, 2, ...) unless
    ``set_epoch(n)`` was called first. The dataset's epoch lives in shared
    memory, so persistent workers see it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._epoch, self._explicit = 0, False

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch, self._explicit = int(epoch), True

    def __iter__(self):
        if not self._explicit and getattr(self, "_started", False):
            self._epoch += 1
        self._explicit, self._started = False, True
        for obj in (self.sampler, self.batch_sampler, self.dataset):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(self._epoch)
        shmring.release_dead()  # slots of earlier loaders' workers that have exited
        return super().__iter__()

    def _get_iterator(self):
        it = super()._get_iterator()
        if self.num_workers > 0:  # once the iterator is gone its workers have exited: unmap their slots
            weakref.finalize(it, shmring.release_dead).atexit = False
        return it


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def _item_bytes(dataset: Any) -> int:
    """Rough size of one item as it crosses to the main process."""
    index = getattr(dataset, "index", None)
    sizes = index.arrays.get("sizes") if index is not None else None
    mean = float(sizes.mean()) if sizes is not None and len(sizes) else 150_000.0
    if getattr(dataset, "format", "") == "mmap" or not getattr(dataset, "decode", True):
        return int(mean)
    if getattr(dataset, "transform", None) is not None:
        return 3 * 224 * 224
    return int(mean * 10)  # JPEG compresses ~10:1


@dataclass(frozen=True)
class ShmSpace:
    """Free space in a shared-memory folder against what a loader needs. True when enough."""

    path: str
    free: int | None  # None: the folder could not be examined (then assumed enough)
    needed: int

    @property
    def enough(self) -> bool:
        return self.free is None or self.free >= self.needed

    def __bool__(self) -> bool:
        return self.enough


def shm_check(need_bytes: int, path: str = "/dev/shm") -> ShmSpace:
    """How much room ``path`` has for ``need_bytes`` (changes nothing; ``bool()`` of it: enough)."""
    try:
        free: int | None = shutil.disk_usage(path).free
    except OSError:
        free = None
    return ShmSpace(path, free, int(need_bytes))


def use_file_system_sharing(space: ShmSpace, stacklevel: int = 1) -> None:
    """Switch torch.multiprocessing (process-wide) to the 'file_system' sharing strategy and
    warn, naming how short ``space`` is and how to fix it. ``make_loader`` calls this when
    :func:`shm_check` finds too little room. ``stacklevel`` as for ``warnings.warn``, counted
    from the caller (1: the warning names the line that called this)."""
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        torch.multiprocessing.set_sharing_strategy("file_system")
    warnings.warn(
        f"{space.path} has {(space.free or 0) / 2**20:.0f} MB free but the loader's prefetch queue needs about "
        f"{space.needed / 2**20:.0f} MB; switched torch.multiprocessing to the 'file_system' sharing "
        "strategy (slower, may leak files on crashes). Give the container more shared memory, "
        "e.g. `docker run --shm-size=8g`, or lower num_workers / prefetch_factor / batch_size.",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


def _generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def make_loader(
    dataset: Any,
    batch_size: int = 256,
    *,
    shuffle: bool | None = None,
    num_workers: int | None = None,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    pin_memory: bool | None = None,
    drop_last: bool = False,
    seed: int = 0,
    collate_fn: Callable | None = None,
    distributed: bool | None = None,
    multiprocessing_context: Any = None,
    workers: str = "processes",
    **kwargs: Any,
) -> Any:
    """Build a :class:`PackedLoader` over a reader from ``readers``; every setting overridable.

    ``shuffle`` (default True): map-style readers shuffle globally through the
    sampler (a ``DistributedSampler`` under DDP); ``ShardDataset`` shuffles
    shards and a buffer itself, and the loader gets a copy of it
    (``ShardDataset.with_order``) with ``seed``/``shuffle`` applied: the
    dataset passed in is never changed. ``distributed`` defaults to "a process group
    is initialised or WORLD_SIZE > 1".

    ``workers="threads"`` runs the ``num_workers`` workers as threads of this
    process instead (:class:`readers.threads.ThreadLoader`: same sampler,
    order, epochs and seeding; no pickling or shared memory between them).
    """
    if workers not in ("processes", "threads"):
        raise ValueError(f"workers must be 'processes' or 'threads', got {workers!r}")
    workers_kind, workers = workers, available_cpus() if num_workers is None else num_workers
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    env = current_worker_env()
    ddp = env.world_size > 1 if distributed is None else distributed
    sampler = None
    if isinstance(dataset, IterableDataset):
        if hasattr(dataset, "with_order"):
            # ShardDataset shuffles itself: the loader's seed decides, on the loader's own copy.
            dataset = dataset.with_order(shuffle=shuffle, seed=seed)
    elif ddp:
        sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank,
                                     shuffle=shuffle is not False, seed=seed, drop_last=drop_last)
    else:
        sampler = EpochSampler(len(dataset), shuffle=shuffle is not False, seed=seed)
    if workers_kind == "threads":
        from readers.threads import ThreadLoader

        return ThreadLoader(dataset, batch_size, num_workers=workers, sampler=sampler, drop_last=drop_last,
                            collate_fn=collate_fn or collate, prefetch_factor=prefetch_factor,
                            generator=_generator(seed), pin_memory=pin, whole_batches=collate_fn is None)
    if workers > 0:
        space = shm_check(workers * prefetch_factor * batch_size * _item_bytes(dataset) * 2)
        if not space:
            use_file_system_sharing(space, stacklevel=2)
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=multiprocessing_context)
    generator = _generator(seed)
    return PackedLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=pin,
        drop_last=drop_last, collate_fn=collate_fn or Collate(slots=prefetch_factor + 2), worker_init_fn=_seed_worker,
        generator=generator, **kwargs,
    )
