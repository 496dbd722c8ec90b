"""``make_loader``: a DataLoader with the settings the field learned the hard way.

* ``num_workers`` from the CPUs this process may use (affinity + cgroup
  quota), not ``os.cpu_count()`` (which reports the host's CPUs in a container),
  shared by the training processes on the machine (``LOCAL_WORLD_SIZE``);
* ``persistent_workers=True`` (no worker start-up cost per epoch),
  ``prefetch_factor=2``, ``pin_memory`` only when CUDA is available;
* ``/dev/shm`` checked against what the prefetch queue needs; when too small
  (Docker's default is 64 MB) the ``file_system`` sharing strategy is used,
  with a warning that says how to fix it;
* reproducible: a seeded generator (so workers' base seeds repeat), a
  ``worker_init_fn`` that seeds numpy and ``random`` per worker, and an
  epoch counter that reaches samplers and persistent workers;
* worker threads where the reader's own work releases the GIL, worker
  processes where Python code of the caller's own runs (``workers="auto"``,
  :func:`choose_workers`; one log line says which and why);
* batches as tensors, which travel from worker processes through reusable
  shared-memory slots (:mod:`readers.loader.shmring`): a whole-batch read, a batch
  of ``decode=False`` samples as a :class:`ByteBatch` (one flat uint8 tensor
  plus offsets) or decoded images of one shape, handed out as views of the
  slot, never a list of ``bytes`` that must be pickled;
* exact mid-epoch resume: ``state_dict()`` / ``load_state_dict()`` (the
  protocol of torchdata's ``StatefulDataLoader``, which Lightning and
  ``accelerator.save_state`` call), skipping by index arithmetic, never by
  reading the skipped samples (see ``readers.order.epoch`` and ``readers.order.sampler``);
* workers die with the main process (``PR_SET_PDEATHSIG``), so a killed
  trainer leaves no worker behind holding shared memory or its output pipes.

The pieces live beside it and are re-exported here: ``collate`` / ``Collate`` in
:mod:`readers.loader.collation`, ``choose_workers`` and the thread workers in
:mod:`readers.loader.threads`, the ``/dev/shm`` check in :mod:`readers.loader.shmspace`.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import weakref
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from readers.contract.env import default_workers, die_with_parent
from readers.contract.messages import one_line
from readers.formats.registry import open_dataset
from readers.loader import shmring
from readers.loader.collation import BatchTransform, Collate, collate
from readers.loader.shmring import ByteBatch
from readers.loader.shmspace import ShmSpace, item_bytes, shm_check, use_file_system_sharing
from readers.loader.threads import WORKER_KINDS, ThreadBatches, choose_workers
from readers.order.epoch import batch_counts, worker_lengths
from readers.order.sampler import EpochSampler, EpochSpec

# make_loader and its loaders; the rest re-exported from where it lives (collation, shmspace, threads,
# shmring, readers.order.sampler), so one import reaches everything a training script names
__all__ = ["make_loader", "PackedLoader", "ThreadLoader", "choose_workers", "EpochSampler", "ByteBatch", "collate",
           "Collate", "shm_check", "ShmSpace", "use_file_system_sharing"]

log = logging.getLogger(__name__)


STATE_VERSION = 1


def _epoch_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(epoch), 0x10AD]).generate_state(1, np.uint64)[0] >> 1)


class _WorkerInit:
    """``worker_init_fn``: the worker dies with the main process, seeds numpy and ``random``, then
    runs the caller's own ``worker_init_fn``. Picklable (spawn workers)."""

    def __init__(self, user_fn: Callable[[int], None] | None = None) -> None:
        self.user_fn = user_fn
        self.parent_pid = os.getpid()
        self.die_with_parent = True  # set per iteration: only when started from the main thread

    def __call__(self, worker_id: int) -> None:
        if self.die_with_parent:
            die_with_parent(self.parent_pid)
        seed = torch.initial_seed() % 2**32
        np.random.seed(seed)
        random.seed(seed)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class PackedLoader(DataLoader):
    """A DataLoader that passes an epoch number to its sampler and dataset, and can resume mid-epoch.

    Each ``iter(loader)`` starts the next epoch (0, 1, 2, ...) unless
    ``set_epoch(n)`` was called first (an epoch set on the sampler by a
    framework, as Lightning does, counts as ``set_epoch``). The dataset's
    epoch lives in shared memory, so persistent workers see it.

    ``state_dict()`` is plain data (``torch.save``-able, JSON-able): the epoch,
    the batches delivered in it, and the settings that decide the order.
    ``load_state_dict(state)`` makes the next ``iter()`` deliver exactly the
    rest of that epoch, in the uninterrupted order when ranks, workers, batch
    size and seed are unchanged, and each remaining sample once otherwise.
    """

    #: accelerate's save_state / load_state call state_dict() / load_state_dict() on loaders with this flag.
    use_stateful_dataloader = True

    def __init__(self, *args: Any, seed: int = 0, distributed: bool | None = None, **kwargs: Any) -> None:
        """``DataLoader``'s arguments, and two of ``make_loader``'s: ``seed``, the order's seed when
        the sampler has none of its own (what a state records; the workers' per-epoch base seed is
        drawn from it), and ``distributed``, as ``make_loader`` was given it (None: split by rank when
        a job has several, False: every rank reads everything, so a framework may shard the loader)."""
        super().__init__(*args, **kwargs)
        self._epoch, self._explicit, self._started = 0, False, False
        self._delivered, self._finished = 0, False
        self._resume: dict[str, Any] | None = None  # what the epoch in progress resumed from
        self._pending: dict[str, Any] | None = None  # a loaded state, applied by the next iter()
        self._sampler_epoch = 0  # the epoch this loader last gave its sampler
        self._seed: int = int(seed)
        self._distributed: bool | None = distributed
        self._marked = False

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch, self._explicit, self._pending = int(epoch), True, None

    # ------------------------------------------------------------ frameworks
    @property
    def _is_accelerate_prepared(self) -> bool:
        """accelerate returns a loader with this flag from ``prepare`` unchanged. This loader splits
        by rank itself unless made with ``distributed=False``: wrapping it would shard it twice."""
        return self._marked or self._distributed is not False

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self._marked = bool(value)

    # ------------------------------------------------------------ state
    def _run_settings(self) -> dict[str, Any]:
        """What decides this loader's order, as a resume point records it."""
        ds: Any = self.dataset  # a reader, a subset, a mixture or a dataset of the caller's own
        iterable = isinstance(ds, IterableDataset)
        num_samples = len(getattr(ds, "labels", ()))
        if iterable and hasattr(ds, "settings"):
            env = ds._env()
            world, extra = env.world_size, ds.settings.as_dict()
            num_samples = ds.layout.num_samples  # a subset: its samples
        else:
            sampler = self.sampler
            world = sampler.num_replicas if isinstance(sampler, EpochSampler) else 1
            spec = getattr(sampler, "spec", None)
            extra = {"seed": getattr(sampler, "seed", self._seed), "shuffle": getattr(sampler, "shuffle", False),
                     "sampler_drop_last": bool(getattr(sampler, "drop_last", False)),
                     "map_order": getattr(sampler, "map_order", None),  # a state without it: numpy's shuffle
                     "epoch_spec": None if spec is None else spec.as_dict()}
        return {"kind": "shards" if iterable else "map", "num_samples": num_samples,
                "batch_size": self.batch_size, "drop_last": self.drop_last, "world_size": world,
                "num_workers": max(1, self.num_workers), **extra}

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: epoch, batches delivered in it, and the settings of its order."""
        if self._pending is not None:
            return dict(self._pending)
        state = {"version": STATE_VERSION, **self._run_settings(), "epoch": self._epoch, "delivered": 0,
                 "finished": False, "after": None}
        if self._started and not self._explicit:
            state.update(delivered=self._delivered, finished=self._finished)
            if self._resume is not None:  # this epoch resumed with other settings: its batches came after those
                state["after"] = {k: v for k, v in self._resume.items() if k != "exact"}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``) at the next ``iter()``."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"not a PackedLoader state (version {state.get('version')!r}, "
                             f"this reader writes {STATE_VERSION})")
        here = self._run_settings()
        for key in ("kind", "num_samples"):
            if state[key] != here[key]:
                raise ValueError(f"the saved loader state is for {key} {state[key]!r}; this loader has "
                                 f"{here[key]!r}: resume with the same dataset and reader")
        if state.get("epoch_spec") != here.get("epoch_spec"):
            raise ValueError(f"the saved loader state is for epochs of {_spec_text(state.get('epoch_spec'))}; this "
                             f"loader's are {_spec_text(here.get('epoch_spec'))}: the mixture's weights or sources "
                             "or samples_per_epoch changed, so the saved epoch cannot be continued; "
                             "start the next epoch with loader.set_epoch(state['epoch'] + 1) instead")
        spec = here.get("epoch_spec")
        if (spec is not None and not state["finished"] and (state["delivered"] or state.get("after"))
                and (state["seed"], bool(state["shuffle"])) != (here["seed"], bool(here["shuffle"]))
                and (spec["replacement"] or spec["counts"] != spec["sizes"] or state.get("after"))):
            raise ValueError(f"the saved loader state is for seed {state['seed']} (shuffle={bool(state['shuffle'])}); "
                             f"this loader has seed {here['seed']} (shuffle={bool(here['shuffle'])}), and its "
                             "mixture draws a share of its sources (or with replacement, or was resumed once "
                             "already), so which samples the rest of the epoch holds depends on the seed: resume "
                             "with the same seed, or start the next epoch with loader.set_epoch(state['epoch'] + 1)")
        if state["finished"]:
            self.set_epoch(state["epoch"] + 1)
        elif state["delivered"] == 0 and not state.get("after"):
            self.set_epoch(state["epoch"])
        else:
            self.set_epoch(state["epoch"])
            self._pending = dict(state)

    def source_counts(self) -> list[int]:
        """Samples of each source of a mixture (one source otherwise) this rank has delivered in
        the epoch in progress (or the one that just finished); after a resume with unchanged
        settings, counting the batches delivered before it, after a resume with other settings,
        from the resume on. Computed from the epoch's order, not by looking at the batches."""
        sampler = self.sampler
        if not isinstance(sampler, EpochSampler):
            raise TypeError("source_counts needs the EpochSampler of a map-style reader or a mixture")
        spec = sampler.spec
        k = 1 if spec is None else len(spec.sizes)
        taken = self._delivered * (self.batch_size or 1)
        if not self._started:
            return [0] * k
        return np.bincount(sampler.sources(self._resume)[:taken], minlength=k).tolist()

    # ------------------------------------------------------------ epochs
    def _next_epoch(self) -> dict[str, Any] | None:
        """Decide the epoch this iteration runs and the resume point it starts from (or None)."""
        sampler_epoch = getattr(self.sampler, "epoch", None)
        if not self._explicit and sampler_epoch is not None and sampler_epoch != self._sampler_epoch:
            self._epoch, self._explicit = int(sampler_epoch), True  # a framework set the sampler's epoch
        if not self._explicit and self._started:
            self._epoch += 1
        pending, self._pending = self._pending, None
        self._explicit, self._started, self._finished = False, True, False
        if pending is None:
            self._delivered = 0
            return None
        here = self._run_settings()
        same = all(pending.get(k) == v for k, v in here.items()) and not pending.get("after")
        point = {k: pending[k] for k in pending if k not in ("version", "epoch", "finished")}
        point["exact"] = same
        self._delivered = pending["delivered"] if same else 0
        return point

    def __iter__(self):
        point = self._next_epoch()
        self._resume = point if point is not None and not point["exact"] else None
        for obj in (self.sampler, self.batch_sampler, self.dataset):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(self._epoch)
        self._sampler_epoch = self._epoch
        if isinstance(self.sampler, EpochSampler):
            self.sampler.resume = point
        elif hasattr(self.dataset, "resume_at"):
            self.dataset.resume_at(point)
        if self.generator is not None:  # workers' base seed: a function of (seed, epoch), so a resume repeats it
            self.generator.manual_seed(_epoch_seed(self._seed, self._epoch))
        init = self.worker_init_fn
        if isinstance(init, _WorkerInit):
            init.parent_pid = os.getpid()
            init.die_with_parent = threading.current_thread() is threading.main_thread()
        shmring.release_dead()  # slots of earlier loaders' workers that have exited
        return _Counted(super().__iter__(), self)

    def __len__(self) -> int:
        """Batches a whole epoch delivers on this rank, exactly.

        A ``ShardDataset`` is split over the loader's workers and each worker batches its own
        part (its last batch may be short), so the count is the sum over workers, not
        ``ceil(len(dataset) / batch_size)`` as a plain DataLoader says. A resumed epoch
        delivers fewer: ``len`` is always the whole epoch's (what an LR schedule is sized by)."""
        ds: Any = self.dataset  # a ShardDataset counts its own samples; a DataLoader does the rest
        shards = isinstance(ds, IterableDataset) and hasattr(ds, "sample_order")
        if not (shards and self.batch_size is not None):
            return super().__len__()
        # len(ds): this rank's samples, which its workers split as one rank of one splits them
        lengths = worker_lengths(len(ds), 1, max(1, self.num_workers), True)
        total = sum(batch_counts(lengths, self.batch_size, self.drop_last))
        # DataLoader warns if an epoch yields more than this (torch declares it None; it holds the count)
        self._IterableDataset_len_called = total  # type: ignore[assignment]
        return total

    def _get_iterator(self):
        it = super()._get_iterator()
        if self.num_workers > 0:  # once the iterator is gone its workers have exited: unmap their slots
            weakref.finalize(it, shmring.release_dead).atexit = False
        return it


def _spec_text(spec: dict[str, Any] | None) -> str:
    if spec is None:
        return "one pass over the dataset"
    what = "drawn with replacement" if spec["replacement"] else "without replacement"
    return f"{sum(spec['counts'])} samples ({'+'.join(map(str, spec['counts']))} from sources of " \
           f"{'+'.join(map(str, spec['sizes']))} samples, {what})"


class _Counted:
    """The DataLoader's iterator, counting the batches it hands out for ``PackedLoader.state_dict``.
    Everything else (``_workers``, ``_shutdown_workers``, ``len``) is the wrapped iterator's."""

    def __init__(self, inner: Any, loader: PackedLoader) -> None:
        self._inner, self._loader = inner, loader

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except StopIteration:
            self._loader._finished = True
            raise
        self._loader._delivered += 1
        return batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ThreadLoader(PackedLoader):
    """A :class:`PackedLoader` whose ``num_workers`` workers are threads of this process
    (``make_loader(..., workers="threads")``; see :mod:`readers.loader.threads`).

    Everything but the workers is PackedLoader's: sampler, epochs, the per-epoch
    base seed, ``state_dict`` / ``load_state_dict`` and mid-epoch resume. Batch ``k``
    of a map-style reader is made by thread ``k % num_workers``, a ``ShardDataset``
    sees thread ``w`` as worker ``w``, and batches come out in the order worker
    processes would deliver them.
    """

    def __init__(self, dataset: Any, *, num_workers: int, pin_memory: bool = False, whole_batches: bool = True,
                 prefetch_factor: int = 2, batch_transform: BatchTransform | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, num_workers=num_workers, pin_memory=False, persistent_workers=False,
                         prefetch_factor=prefetch_factor if num_workers else None, **kwargs)
        self.pin_batches = pin_memory  # pinned by the loader threads, not by DataLoader's pin thread
        self.pin_now = False  # this epoch's: pin_batches where an accelerator is there (readers.loader.threads)
        self.whole_batches = whole_batches
        self.batch_transform = batch_transform  # run by each loader thread on the batches it makes
        self._shard_maps: dict[int, Any] = {}  # thread -> its ShardMaps (shard mappings, headers checked), kept between epochs

    def _get_iterator(self) -> Any:  # a ThreadBatches: DataLoader's iterator protocol, not its _BaseDataLoaderIter
        return ThreadBatches(self)


def _check_picklable(bt: BatchTransform, context: Any) -> None:
    """A ``batch_transform`` must reach worker processes that are not forked (spawn, forkserver) by pickle:
    refused here in one line, not as a traceback from the first worker."""
    import multiprocessing
    import pickle

    method = context if isinstance(context, str) else (
        context.get_start_method() if context is not None else multiprocessing.get_start_method())
    if method == "fork":
        return
    try:
        pickle.dumps(bt)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the same refusal
        raise ValueError(f"make_loader: batch_transform {bt.name} cannot be sent to {method} worker processes "
                         f"({one_line(exc)}): define it at module level (a def or a class), not a lambda or "
                         "a local function") from None


# Over 60 lines only because the public entry point lists and documents every knob; the body is ~35.
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
    worker_init_fn: Callable[[int], None] | None = None,
    workers: str = "auto",
    samples_per_epoch: int | None = None,
    replacement: bool = False,
    batch_transform: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> PackedLoader:
    """Build a :class:`PackedLoader` over a reader from ``readers``; every setting overridable.

    ``shuffle`` (default True): map-style readers shuffle globally through an
    :class:`EpochSampler` (split over DDP ranks); ``ShardDataset`` shuffles
    shards and a buffer itself, and the loader gets a copy of it
    (``ShardDataset.with_order``) with ``seed``/``shuffle`` applied: the
    dataset passed in is never changed. A ``ShardDataset`` of stored bytes (``decode=False``, local
    shards) is read a whole batch at a time in every worker kind, unless a ``collate_fn`` of your own
    is given: threads (and ``num_workers=0`` with ``workers="auto"``) through
    ``readers.formats.shardbatch``, worker processes (and ``num_workers=0`` with
    ``workers="processes"``) through that copy's ``with_batch_reads`` (it yields samples unread; the
    loader's collate reads them).

    ``distributed``: None (default) splits over DDP ranks when a process group
    is initialised or ``WORLD_SIZE > 1`` (decided when iterated); False reads
    the whole dataset on every rank, for a framework that shards the loader
    itself; True splits by the rank in force.

    ``num_workers`` (default): the usable CPUs divided by the training
    processes on this machine (``LOCAL_WORLD_SIZE``), at least 1.

    ``workers``: ``"auto"`` (default) picks by what the pipeline does
    (:func:`choose_workers`) and logs one line saying which and why:
    ``"threads"`` (:class:`ThreadLoader`: the same sampler, order, epochs,
    seeds and resume; a batch never crosses a process wall) where the
    per-sample work releases the GIL, as this package's readers, decode and
    transforms do; ``"processes"`` (DataLoader worker processes) where Python
    code of your own runs per sample or batch (a transform, a ``collate_fn``,
    a dataset) or in each worker (a ``worker_init_fn``). Either value forces that kind; see ``readers/loader/threads.py``.
    ``worker_init_fn(worker_id)`` runs in each worker, process or thread.

    ``dataset``: a reader, or a path / URL, opened with ``readers.open_dataset``
    and its defaults (call ``open_dataset`` yourself for other options).
    ``sampler`` / ``batch_sampler`` (map-style readers): yours replaces the
    :class:`EpochSampler` (``seed``, ``shuffle``, ``distributed`` then do not
    apply to it; mid-epoch resume needs the EpochSampler). Other keyword
    arguments go to ``DataLoader``.

    ``len(loader)``: the batches a whole epoch delivers on this rank, exactly
    (see :meth:`PackedLoader.__len__`).

    ``samples_per_epoch``: epochs of that many samples (all ranks together) instead of one
    pass: shorter ones take the next stretch of an endless shuffled stream (the next epoch
    continues where this one stopped), longer ones go on with the next pass, a new shuffle;
    ``replacement=True`` draws them uniformly with replacement. A ``ShardDataset`` with
    ``samples_per_epoch`` is read as a one-source ``readers.mix`` (random access). A
    :class:`readers.order.mixture.Mixture` brings its own epochs (``mix(..., samples_per_epoch=)``)
    and its ``seed``, when given, decides its order. See docs/training.md.

    ``batch_transform``: ``f(images) -> images`` run on each collated batch's images (one ``uint8``
    tensor ``[B, C, H, W]`` of stored pixels or decoded images; a ``ByteBatch`` for ``decode=False``)
    where the batch is made: in the worker process or thread, in the main process with
    ``num_workers=0``; labels and indices pass through. One tensor op per batch instead of a
    ``transform=`` call per sample (a crop, flip or normalisation of stored pixels); it composes with
    the whole-batch read of ``ResizeCenterCrop`` at the stored size. It does not make ``"auto"`` pick
    processes (a batch op holds the GIL once per batch). See :class:`readers.loader.collation.BatchTransform`.
    """
    if workers is None:
        workers = "auto"
    if workers not in WORKER_KINDS:
        raise ValueError(f"workers must be one of {', '.join(map(repr, WORKER_KINDS))}, got {workers!r}")
    if batch_transform is not None and collate_fn is not None:
        raise ValueError("make_loader: batch_transform runs after make_loader's own collate; with a collate_fn "
                         "of your own, apply it at the end of your collate_fn instead")
    bt = None if batch_transform is None else BatchTransform(batch_transform)
    if isinstance(dataset, (str, os.PathLike)):
        dataset = open_dataset(dataset)
    spec: EpochSpec | None = getattr(dataset, "spec", None)
    if spec is not None and samples_per_epoch is not None:
        raise ValueError("make_loader: a mixture sets its own samples_per_epoch (readers.mix(..., samples_per_epoch=))")
    if samples_per_epoch is not None and isinstance(dataset, IterableDataset):
        from readers.order.mixture import mix

        dataset = mix([(dataset, 1.0)], samples_per_epoch=samples_per_epoch, replacement=replacement)
        spec = dataset.spec
    elif samples_per_epoch is not None:
        spec = EpochSpec.of((len(dataset),), (1.0,), samples_per_epoch, replacement)
    elif replacement and spec is None:
        raise ValueError("make_loader: replacement=True needs samples_per_epoch")
    if getattr(dataset, "sources", None) is not None and getattr(dataset, "seed", None) is not None:
        seed = int(dataset.seed)  # the mixture's own seed
    kind, count = workers, default_workers() if num_workers is None else num_workers
    if kind == "auto":
        kind, why = choose_workers(dataset, num_workers=count, collate_fn=collate_fn,
                                   multiprocessing_context=multiprocessing_context, worker_init_fn=worker_init_fn)
        log.info("make_loader: %d worker %s: %s (workers='threads' or 'processes' to choose)", count, kind, why)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    sampler = kwargs.pop("sampler", None)
    if "batch_sampler" in kwargs:  # DataLoader's rule: a batch sampler replaces all four
        batch_size, drop_last, sampler = 1, False, None
    elif isinstance(dataset, IterableDataset):
        if hasattr(dataset, "with_order"):
            # ShardDataset shuffles itself: the loader's seed decides, on the loader's own copy.
            dataset = dataset.with_order(shuffle=shuffle, seed=seed, distributed=distributed)
    elif sampler is None:
        sampler = EpochSampler(len(dataset), shuffle=shuffle is not False, seed=seed, distributed=distributed,
                               drop_last=drop_last, spec=spec)
    elif spec is not None:
        raise ValueError("make_loader: samples_per_epoch and mixtures need make_loader's own sampler, not sampler=")
    generator = torch.Generator()
    generator.manual_seed(seed)
    if kind == "threads":
        return ThreadLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=count, pin_memory=pin,
                              drop_last=drop_last, collate_fn=collate_fn or collate, generator=generator,
                              prefetch_factor=prefetch_factor, whole_batches=collate_fn is None,
                              batch_transform=bt, worker_init_fn=worker_init_fn, seed=seed, distributed=distributed, **kwargs)
    if collate_fn is None and hasattr(dataset, "with_batch_reads"):
        # ShardDataset bytes: its samples yielded unread, each batch read whole by Collate (readers.formats.shardbatch)
        dataset = dataset.with_batch_reads()
    if count > 0 and bt is not None:
        _check_picklable(bt, multiprocessing_context)
    if count > 0:
        space = shm_check(count * prefetch_factor * batch_size * item_bytes(dataset) * 2)
        if not space:
            use_file_system_sharing(space, stacklevel=2)
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=multiprocessing_context)
    return PackedLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=count, pin_memory=pin,
        drop_last=drop_last, collate_fn=collate_fn or Collate(slots=prefetch_factor + 3, batch_transform=bt),
        worker_init_fn=_WorkerInit(worker_init_fn), generator=generator, seed=seed, distributed=distributed, **kwargs,
    )
