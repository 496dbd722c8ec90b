"""``EpochSampler``: the map-style readers' sampler (global shuffle, DDP split, mid-epoch resume).

One permutation of all samples per ``(seed, epoch)``, split over DDP ranks
the way ``DistributedSampler`` splits (rank r takes positions r, r+R, ... of
the permutation, padded by repeating its start, or cut with ``drop_last``):
see :func:`readers.order.mapstyle.rank_indices`. Each rank computes only its own share
of the permutation (:func:`readers.order.mapstyle.shuffle_at`, a keyed bijection), so
an epoch start and an exact resume cost O(N / ranks) per rank.

It *is* a ``DistributedSampler`` (frameworks such as Lightning check that and
then leave the loader alone), but the rank and world size are read when it is
iterated, not when it is built: a loader made before the process group starts
(at the top of a script that Lightning re-launches per rank, say) still splits
correctly once it runs.

Mid-epoch resume: ``resume`` (set by ``PackedLoader.load_state_dict``) names
how many batches of which size a loader with which settings had delivered.
Every rank had taken the first ``batches x batch_size`` samples of its list,
so the samples delivered so far are known from the index alone; they are left
out and the rest is split over the current ranks. With unchanged settings
that is exactly the uninterrupted rank's list from where it stopped (the
delivered samples are a prefix of the permutation); with another world size
or batch size every remaining sample still comes once (plus padding).
A point saved by a release before ``map_order`` was recorded (numpy's
permutation of all N, ``"rng"``) resumes that way too: its delivered samples
are those of numpy's permutation, the rest comes in this release's order.

Epochs of a set length and mixtures (``spec``, an :class:`EpochSpec`): the
epoch is the list of :func:`readers.order.draw.epoch_draw` (``samples_per_epoch``
samples of one dataset, or of several sources laid end to end in the index
space of a :class:`readers.order.mixture.Mixture`); the split over ranks and the resume
then work on positions of that list exactly as above on a permutation (the
list is already shuffled, so the positions are taken in order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from torch.utils.data import DistributedSampler

from readers.contract.env import current_worker_env
from readers.order.draw import epoch_draw, shares
from readers.order.epoch import as_ints
from readers.order.mapstyle import MAP_ORDER, permutation, rank_indices, rank_order

__all__ = ["EpochSampler", "EpochSpec", "map_delivered", "exact_resume"]


#: The most positions one epoch of a mixture (or of ``samples_per_epoch``) may have: its order is drawn
#: whole, a source and an index (int64 each) per position, 64 GiB at this bound.
MAX_EPOCH = 1 << 32


@dataclass(frozen=True)
class EpochSpec:
    """What an epoch is made of: ``counts[j]`` samples of source ``j`` (``sizes[j]`` samples; the
    sources lie end to end in the dataset's index space), drawn with or without ``replacement``."""

    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    replacement: bool = False

    @classmethod
    def of(cls, sizes: tuple[int, ...], weights: tuple[float, ...], samples_per_epoch: int | None,
           replacement: bool = False) -> "EpochSpec":
        """``samples_per_epoch`` (default: all samples of all sources) split by ``weights``."""
        if any(int(n) <= 0 for n in sizes):
            raise ValueError(f"every source needs at least one sample, got sizes {list(sizes)}")
        total = sum(int(n) for n in sizes) if samples_per_epoch is None else int(samples_per_epoch)
        if total < 1:
            raise ValueError(f"samples_per_epoch must be >= 1, got {samples_per_epoch}")
        if total > MAX_EPOCH:
            what = "samples_per_epoch" if samples_per_epoch is not None else "the sources' samples together"
            raise ValueError(f"{what} is {total:,}, more than one epoch can index ({MAX_EPOCH:,}: each rank "
                             "holds the epoch's order, 16 bytes a position); make epochs shorter and more")
        return cls(tuple(int(n) for n in sizes), tuple(int(c) for c in shares(weights, total)), bool(replacement))

    @property
    def length(self) -> int:
        return sum(self.counts)

    def as_dict(self) -> dict[str, Any]:
        """As a resume point records it (a loader refuses a state saved with another spec)."""
        return {"sizes": list(self.sizes), "counts": list(self.counts), "replacement": self.replacement}

    def draw(self, seed: int, epoch: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(source, index)`` per position of the epoch; ``index`` in the dataset's index space."""
        which, sample = epoch_draw(self.sizes, self.counts, seed, epoch, shuffle, self.replacement)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        return which, offsets[which] + sample


def map_delivered(n: int, epoch: int, point: dict[str, Any], perm: np.ndarray | None = None) -> np.ndarray:
    """Mask of the samples a map-style loader had delivered this epoch at ``point`` (all ranks).

    ``point``: ``delivered`` batches of ``batch_size`` per rank over ``world_size`` ranks with
    ``seed``/``shuffle``/``drop_last``; ``after``: an earlier point of the same epoch this run had
    resumed from (its samples were left out of this run's lists).

    Rank r took positions r, r+R, ... of the (padded or cut) list the ranks split, so together
    the ranks took its first ``R x taken`` positions: one permutation (``perm``, when the caller
    has it already) and a prefix, never a list per rank.
    """
    if perm is None:  # a point saved before ``map_order`` was recorded shuffled with numpy's permutation
        perm = permutation(n, point["seed"], epoch, bool(point["shuffle"]), point.get("map_order", "rng"))
    prior = map_delivered(n, epoch, point["after"], perm) if point.get("after") else None
    world, take = point["world_size"], point["delivered"] * point["batch_size"]
    rest = perm if prior is None else perm[~prior[perm]]
    drop_last = bool(point.get("sampler_drop_last", point["drop_last"]))
    size = len(rest) - len(rest) % world if drop_last else len(rest) + (-len(rest) % world if len(perm) else 0)
    taken = min(world * take, size)
    mask = np.zeros(n, dtype=bool) if prior is None else prior.copy()
    mask[rest[:min(taken, len(rest))]] = True
    if taken > len(rest):  # into the padding, which repeats the permutation's start
        mask[np.resize(perm, taken - len(rest))] = True
    return mask


def exact_resume(point: dict[str, Any], world: int, seed: int, shuffle: bool, drop_last: bool,
                 spec: bool = False) -> bool:
    """True when a rank of ``world`` with these settings continues ``point`` by skipping its own
    first ``delivered x batch_size`` samples (same ranks and order, no earlier resume). ``spec``:
    the epoch is an :class:`EpochSpec`'s draw (its order does not depend on ``map_order``)."""
    return (not point.get("after") and point["world_size"] == world and point["seed"] == seed
            and bool(point["shuffle"]) == shuffle
            and bool(point.get("sampler_drop_last", point["drop_last"])) == drop_last
            and (spec or not shuffle or _same_order(point)))


def _same_order(point: dict[str, Any]) -> bool:
    """The point was saved with this release's map-style shuffle (one without ``map_order``: numpy's)."""
    return point.get("map_order", "rng") == MAP_ORDER


class EpochSampler(DistributedSampler):
    """Shuffles ``range(n)`` with ``(seed, epoch)`` and splits it over DDP ranks (see module doc).

    ``distributed``: None (default) splits when a process group is initialised
    or ``WORLD_SIZE > 1`` at iteration time; False never splits; True splits by
    the rank in force. ``drop_last`` as ``DistributedSampler``'s.
    """

    #: The shuffle this sampler uses (:data:`readers.order.mapstyle.MAP_ORDERS`); a loader's state records it.
    map_order = MAP_ORDER

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0, *, distributed: bool | None = None,
                 drop_last: bool = False, spec: EpochSpec | None = None) -> None:
        # No DistributedSampler.__init__: it insists on a process group or explicit ranks now.
        self.n, self.shuffle, self.seed, self.epoch, self.drop_last = int(n), bool(shuffle), int(seed), 0, drop_last
        #: An epoch other than one pass over ``range(n)`` (``samples_per_epoch``, a mixture), or None.
        self.spec = spec
        if spec is not None and sum(spec.sizes) != self.n:
            raise ValueError(f"the epoch spec covers {sum(spec.sizes)} samples, the dataset has {self.n}")
        # what frameworks read as the sampler's dataset (its len): the epoch's positions, not a Dataset
        self.dataset = range(self.length)  # type: ignore[assignment]
        self.distributed = distributed
        #: A resume point for the next iteration (``PackedLoader`` sets and clears it), or None.
        self.resume: dict[str, Any] | None = None
        self._draw_cache: tuple[tuple[Any, ...], np.ndarray, np.ndarray] | None = None  # see _drawn

    def _ranks(self) -> tuple[int, int]:
        if self.distributed is False:
            return 0, 1
        env = current_worker_env()
        return (env.rank, env.world_size) if env.world_size > 1 else (0, 1)

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return self._ranks()[1]

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self._ranks()[0]

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples per rank in a whole epoch."""
        world, n = self.num_replicas, self.length
        return n // world if self.drop_last else math.ceil(n / world)

    @property
    def length(self) -> int:
        """Samples in a whole epoch, all ranks together (before padding)."""
        return self.n if self.spec is None else self.spec.length

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch (after the resume point, if one is set)."""
        if self.spec is None:
            return self._positions(self.resume)
        return self._drawn()[1][self._positions(self.resume)]

    def sources(self, point: dict[str, Any] | None = None) -> np.ndarray:
        """The source of each sample of this rank's epoch after ``point`` (None: the whole epoch),
        in order; all 0 without a mixture."""
        positions = self._positions(point)
        if self.spec is None:
            return np.zeros(len(positions), dtype=np.int64)
        return self._drawn()[0][positions]

    def _drawn(self) -> tuple[np.ndarray, np.ndarray]:
        """The spec's draw for this epoch, kept until the seed, epoch or order changes."""
        spec = self.spec
        if spec is None:
            raise TypeError("EpochSampler: no epoch spec to draw from (one pass over range(n) is not drawn)")
        key = (spec, self.seed, self.epoch, self.shuffle)
        cached = self._draw_cache
        if cached is None or cached[0] != key:
            cached = self._draw_cache = (key, *spec.draw(self.seed, self.epoch, self.shuffle))
        return cached[1], cached[2]

    def _positions(self, point: dict[str, Any] | None) -> np.ndarray:
        """This rank's positions in the epoch's list (with a spec: the drawn list, taken in order;
        else: ``range(n)``, shuffled), after ``point``."""
        rank, world = self._ranks()
        n, shuffle = (self.n, self.shuffle) if self.spec is None else (self.spec.length, False)
        if not point or exact_resume(point, world, self.seed, self.shuffle, self.drop_last, self.spec is not None):
            # an epoch start, or the ranks had taken a prefix of the same list each: skip it. Only this
            # rank's share of the permutation is computed (O(n / world)), from where it resumes.
            start = point["delivered"] * point["batch_size"] if point else 0
            return rank_order(n, self.seed, self.epoch, shuffle, world, rank, self.drop_last, start)
        perm = permutation(n, self.seed, self.epoch, shuffle)
        if self.spec is not None and (int(point["seed"]), bool(point["shuffle"])) != (self.seed, self.shuffle):
            consumed = self._consumed_in_this_draw(point, perm)
        else:
            same = (point["seed"] == self.seed and bool(point["shuffle"]) == self.shuffle
                    and (not self.shuffle or _same_order(point))) or self.spec is not None
            consumed = map_delivered(n, self.epoch, point, perm if same else None)
        return rank_indices(n, self.seed, self.epoch, shuffle, world, rank, self.drop_last, consumed, perm)

    def _consumed_in_this_draw(self, point: dict[str, Any], positions: np.ndarray) -> np.ndarray:
        """The positions of this epoch's draw whose samples ``point`` had delivered, where ``point`` was
        saved with another seed or shuffle: another draw. Only for an epoch that holds each sample of
        its sources once (the loader refuses the others): a sample delivered then is left out now."""
        assert self.spec is not None and not self.spec.replacement and self.spec.counts == self.spec.sizes
        taken = map_delivered(len(positions), self.epoch, point, positions)  # positions of the saved draw
        _, then = self.spec.draw(int(point["seed"]), self.epoch, bool(point["shuffle"]))
        return np.isin(self._drawn()[1], then[taken])

    def __iter__(self) -> Iterator[int]:
        yield from as_ints(self.indices())  # Python ints a block at a time, not 36 B per sample

    def __len__(self) -> int:
        return self.num_samples

    def permutation(self) -> np.ndarray:
        """The epoch's order of all samples, before the split over ranks."""
        if self.spec is not None:
            return self._drawn()[1]
        return permutation(self.n, self.seed, self.epoch, self.shuffle)
