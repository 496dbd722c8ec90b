"""Subsets of a packed dataset without re-packing: by class names, by an index array, by a fraction.

``readers.subset(ds, classes=[...])``, ``subset(ds, indices=array)``,
``subset(ds, fraction=0.1, seed=0)`` (a fraction of all samples, or of the
chosen classes / indices when given with them). The result is cheap at any
size: one numpy index array, no per-sample Python object.

* map-style readers (lmdb, hdf5, mmap): a :class:`Subset`, a map-style dataset
  of the chosen samples; ``make_loader`` shuffles, splits over ranks, resumes
  and counts ``len`` over it as over any reader;
* ``ShardDataset`` (wds): a copy of the reader that keeps only the chosen
  samples (``ShardDataset.with_samples``): the shard-based order of
  ``readers.order.epoch`` runs on them (shards still read front to back, skipping
  what is not kept).

Labels stay as stored (``classes=["b", "d"]`` gives labels 1 and 3, not 0 and 1);
``return_index=True`` items carry the sample's index in the packed dataset.
A subset of a subset selects among the first subset's samples.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["subset", "Subset", "positions_labels"]


class Subset(torch.utils.data.Dataset):
    """The samples ``indices`` of the map-style reader ``dataset``, as a map-style dataset."""

    def __init__(self, dataset: Any, indices: np.ndarray) -> None:
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        #: Labels of the subset's samples, by position in the subset.
        self.labels = np.asarray(dataset.labels)[self.indices]
        self.classes = getattr(dataset, "classes", None)
        self.format = getattr(dataset, "format", "")
        self.index = getattr(dataset, "index", None)

    def __len__(self) -> int:
        return len(self.indices)

    def _map(self, positions: Sequence[int]) -> list[int]:
        return self.indices[np.asarray(positions, dtype=np.int64)].tolist()

    def __getitem__(self, j: int) -> tuple:
        return self.dataset[int(self.indices[j])]

    def __getitems__(self, positions: list[int]) -> Any:
        return self.dataset.__getitems__(self._map(positions))

    def batchable(self) -> bool:
        return bool(getattr(self.dataset, "batchable", lambda: False)())

    def get_batch(self, positions: list[int], alloc: Any = None) -> tuple | None:
        get_batch = getattr(self.dataset, "get_batch", None)
        if get_batch is None:
            return None
        return get_batch(self._map(positions)) if alloc is None else get_batch(self._map(positions), alloc=alloc)

    def close(self) -> None:
        self.dataset.close()

    def __repr__(self) -> str:
        return f"Subset({self.dataset!r}, samples={len(self.indices)})"


def positions_labels(dataset: Any) -> np.ndarray:
    """The label of each sample of ``dataset`` by its position (a wds subset: its kept samples)."""
    kept = getattr(dataset, "kept", None)
    labels = np.asarray(dataset.labels)
    return labels if kept is None else labels[kept]


def _class_ids(dataset: Any, classes: Sequence[str | int]) -> np.ndarray:
    names = list(getattr(dataset, "classes", None) or [])
    ids = []
    for c in classes:
        if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
            if not 0 <= int(c) < len(names):
                raise ValueError(f"class {int(c)} out of range: the dataset has {len(names)} classes")
            ids.append(int(c))
        elif c in names:
            ids.append(names.index(c))
        else:
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            raise ValueError(f"no class {c!r} in the dataset (its classes: {shown})")
    return np.asarray(ids, dtype=np.int64)


def subset(dataset: Any, *, classes: Sequence[str | int] | None = None, indices: Any = None,
           fraction: float | None = None, seed: int = 0) -> Any:
    """The samples of ``dataset`` (a reader or a subset) that are in ``classes`` (names or
    label numbers) or at ``indices`` (positions in ``dataset``: a set, order and repeats do not
    count), then, with ``fraction``, that fraction of them (rounded, at least one) chosen at
    random with ``seed``. Returns a :class:`Subset`, or for a ``ShardDataset`` a ShardDataset."""
    if classes is not None and indices is not None:
        raise ValueError("subset: give classes or indices, not both")
    if classes is None and indices is None and fraction is None:
        raise ValueError("subset: give classes, indices or fraction")
    if getattr(dataset, "sources", None) is not None:  # a readers.order.mixture.Mixture
        raise ValueError("subset: take subsets of the sources, then mix them")
    labels = positions_labels(dataset)
    n = len(labels)
    if classes is not None:
        chosen = np.flatnonzero(np.isin(labels, _class_ids(dataset, classes)))
    elif indices is not None:
        arr = np.asarray(indices)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"subset: indices must be integers, got dtype {arr.dtype}")
        chosen = np.unique(arr.astype(np.int64).ravel())
        if chosen.size and (chosen[0] < 0 or chosen[-1] >= n):
            bad = chosen[0] if chosen[0] < 0 else chosen[-1]
            raise ValueError(f"subset: index {int(bad)} out of range for {n} samples")
    else:
        chosen = np.arange(n, dtype=np.int64)
    if fraction is not None:
        if not 0 < float(fraction) <= 1:
            raise ValueError(f"subset: fraction must be in (0, 1], got {fraction}")
        k = max(1, int(round(float(fraction) * len(chosen)))) if len(chosen) else 0
        pick = np.random.default_rng([int(seed), 0xF4AC]).choice(len(chosen), size=k, replace=False)
        chosen = chosen[np.sort(pick)]
    if len(chosen) == 0:
        raise ValueError("subset: no sample selected")
    if hasattr(dataset, "with_samples"):
        kept = getattr(dataset, "kept", None)
        return dataset.with_samples(chosen if kept is None else kept[chosen])
    if isinstance(dataset, Subset):
        return Subset(dataset.dataset, dataset.indices[chosen])
    return Subset(dataset, chosen)
