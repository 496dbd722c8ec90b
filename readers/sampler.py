"""``EpochSampler``: the map-style readers' sampler (global shuffle, DDP split, mid-epoch resume).

One permutation of all samples per ``(seed, epoch)``, split over DDP ranks
the way ``DistributedSampler`` splits (rank r takes positions r, r+R, ... of
the permutation, padded by repeating its start, or cut with ``drop_last``):
see :func:`readers.order.rank_indices`.

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
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
from torch.utils.data import DistributedSampler

from readers.env import current_worker_env
from readers.order import permutation, rank_indices

__all__ = ["EpochSampler", "map_delivered", "exact_resume"]


def map_delivered(n: int, epoch: int, point: dict[str, Any], perm: np.ndarray | None = None) -> np.ndarray:
    """Mask of the samples a map-style loader had delivered this epoch at ``point`` (all ranks).

    ``point``: ``delivered`` batches of ``batch_size`` per rank over ``world_size`` ranks with
    ``seed``/``shuffle``/``drop_last``; ``after``: an earlier point of the same epoch this run had
    resumed from (its samples were left out of this run's lists).

    Rank r took positions r, r+R, ... of the (padded or cut) list the ranks split, so together
    the ranks took its first ``R x taken`` positions: one permutation (``perm``, when the caller
    has it already) and a prefix, never a list per rank.
    """
    if perm is None:
        perm = permutation(n, point["seed"], epoch, bool(point["shuffle"]))
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


def exact_resume(point: dict[str, Any], world: int, seed: int, shuffle: bool, drop_last: bool) -> bool:
    """True when a rank of ``world`` with these settings continues ``point`` by skipping its own
    first ``delivered x batch_size`` samples (same ranks and order, no earlier resume)."""
    return (not point.get("after") and point["world_size"] == world and point["seed"] == seed
            and bool(point["shuffle"]) == shuffle
            and bool(point.get("sampler_drop_last", point["drop_last"])) == drop_last)


class EpochSampler(DistributedSampler):
    """Shuffles ``range(n)`` with ``(seed, epoch)`` and splits it over DDP ranks (see module doc).

    ``distributed``: None (default) splits when a process group is initialised
    or ``WORLD_SIZE > 1`` at iteration time; False never splits; True splits by
    the rank in force. ``drop_last`` as ``DistributedSampler``'s.
    """

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0, *, distributed: bool | None = None,
                 drop_last: bool = False) -> None:
        # No DistributedSampler.__init__: it insists on a process group or explicit ranks now.
        self.n, self.shuffle, self.seed, self.epoch, self.drop_last = int(n), bool(shuffle), int(seed), 0, drop_last
        self.dataset = range(self.n)
        self.distributed = distributed
        #: A resume point for the next iteration (``PackedLoader`` sets and clears it), or None.
        self.resume: dict[str, Any] | None = None

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
        world = self.num_replicas
        return self.n // world if self.drop_last else math.ceil(self.n / world)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch (after the resume point, if one is set)."""
        rank, world, point = *self._ranks(), self.resume
        if point and exact_resume(point, world, self.seed, self.shuffle, self.drop_last):
            # the ranks had taken a prefix of the same list each: skip it (one permutation, as any epoch)
            mine = rank_indices(self.n, self.seed, self.epoch, self.shuffle, world, rank, self.drop_last)
            return mine[point["delivered"] * point["batch_size"]:]
        perm = permutation(self.n, self.seed, self.epoch, self.shuffle)
        consumed = None
        if point:
            same = point["seed"] == self.seed and bool(point["shuffle"]) == self.shuffle
            consumed = map_delivered(self.n, self.epoch, point, perm if same else None)
        return rank_indices(self.n, self.seed, self.epoch, self.shuffle, world, rank, self.drop_last, consumed, perm)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def permutation(self) -> np.ndarray:
        """The epoch's order of all samples, before the split over ranks."""
        return permutation(self.n, self.seed, self.epoch, self.shuffle)
