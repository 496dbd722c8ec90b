"""Weighted mixtures of datasets: ``readers.mix([(ds_a, 0.7), (ds_b, 0.3)], samples_per_epoch=...)``.

A :class:`Mixture` is a map-style dataset over its sources laid end to end
(source ``j``'s sample ``i`` is index ``offset[j] + i``); what an epoch is
comes from its :class:`readers.order.sampler.EpochSpec`, which ``make_loader``
hands to the :class:`readers.order.sampler.EpochSampler`:

* each epoch has ``samples_per_epoch`` samples (default: all samples of all
  sources), ``floor`` or ``ceil`` of ``samples_per_epoch x w_j / sum(w)``
  from source ``j``: the proportions are exact in every epoch, and the sources
  are interleaved at random (:func:`readers.order.draw.epoch_draw`);
* each source keeps its own shuffle: it delivers its samples in a permutation
  of its own, without repeats until all of them came; a share larger than the
  source goes on with its next pass, a new permutation. The next epoch goes on
  where this one stopped in each source's stream (``replacement=True``: each
  source's samples are drawn uniformly with replacement instead);
* the split over ranks, ``len(loader)`` and mid-epoch resume are the
  EpochSampler's: every rank the same number of batches, and an exact resume
  through ``loader.state_dict()``;
* the state records the sources' sizes and per-epoch counts: loading it into
  a loader whose mixture has other weights, sources or ``samples_per_epoch``
  raises a one-line ``ValueError`` (the epoch it describes no longer exists;
  start the run's next epoch with ``loader.set_epoch`` instead);
* ``loader.source_counts()`` gives the samples of each source this rank has
  delivered in the epoch in progress.

Sources of any format, local or remote. A map-style source reads its batch
as it would alone; a ``ShardDataset`` source is read by random access (one
``pread``, or one range request when remote, per sample), not shard by shard.
Samples must be of one kind (``(image, label[, index])``: same ``decode`` /
``transform`` / ``return_index``); each source's labels stay as they are,
and ``return_source=True`` appends the source number to every item.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from readers.order.sampler import EpochSpec
from readers.order.subsets import positions_labels

__all__ = ["mix", "Mixture"]


def _size(dataset: Any) -> int:
    """Samples of a source (a ``ShardDataset``: all of them, not one rank's)."""
    layout = getattr(dataset, "layout", None)
    return int(layout.num_samples) if layout is not None else len(dataset)


#: Reader settings that decide what an item is: the sources of a mixture must agree on them.
ITEM_SETTINGS = ("decode", "return_index", "image")


def _check_same_items(sources: Sequence[Any]) -> None:
    def settings(ds: Any) -> dict[str, Any]:
        base = getattr(ds, "dataset", ds)  # a Subset: its reader's
        return {k: getattr(base, k) for k in ITEM_SETTINGS if hasattr(base, k)}

    first = settings(sources[0])
    for j, ds in enumerate(sources[1:], 1):
        other = settings(ds)
        differ = [k for k in first if k in other and first[k] != other[k]]
        if differ:
            k = differ[0]
            raise ValueError(f"mix: source {j} has {k}={other[k]!r} but source 0 has {k}={first[k]!r}: "
                             "open the sources with the same decode / return_index / image settings")


class Mixture(torch.utils.data.Dataset):
    """Sources read as one map-style dataset; see the module docstring and :func:`mix`."""

    def __init__(self, sources: Sequence[Any], weights: Sequence[float], *, samples_per_epoch: int | None = None,
                 replacement: bool = False, seed: int | None = None, return_source: bool = False) -> None:
        for ds in sources:
            if getattr(ds, "sources", None) is not None:
                raise ValueError("mix: a source is itself a mixture; list its sources instead")
        self.sources = list(sources)
        _check_same_items(self.sources)
        self.weights = tuple(float(w) for w in weights)
        sizes = tuple(_size(ds) for ds in self.sources)
        #: What an epoch is made of (the EpochSampler's ``spec``).
        self.spec = EpochSpec.of(sizes, self.weights, samples_per_epoch, replacement)
        self.seed, self.return_source = seed, bool(return_source)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        #: Each source's labels as they are, end to end (by index of the mixture).
        self.labels = np.concatenate([positions_labels(ds) for ds in self.sources])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """``(source, index in that source)`` of the mixture's index ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample index {i} out of range for a mixture of {len(self)} samples")
        j = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return j, int(i - self.offsets[j])

    def _items(self, j: int, local: list[int]) -> list[tuple]:
        ds = self.sources[j]
        if hasattr(ds, "get"):  # a ShardDataset: random access
            return [ds.get(i) for i in local]
        getitems = getattr(ds, "__getitems__", None)
        return list(getitems(local)) if getitems is not None else [ds[i] for i in local]

    def __getitem__(self, i: int) -> tuple:
        j, local = self.locate(int(i))
        item = self._items(j, [local])[0]
        return (*item, j) if self.return_source else item

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        """The batch's items in order, each source's read together."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"sample index out of range for a mixture of {len(self)} samples")
        src = np.searchsorted(self.offsets, idx, side="right") - 1
        out: list[Any] = [None] * len(idx)
        for j in np.unique(src).tolist():
            where = np.flatnonzero(src == j)
            items = self._items(j, (idx[where] - self.offsets[j]).tolist())
            for k, item in zip(where.tolist(), items):
                out[k] = (*item, j) if self.return_source else item
        return out

    def close(self) -> None:
        for ds in self.sources:
            close = getattr(ds, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        parts = ", ".join(f"({ds!r}, {w:g})" for ds, w in zip(self.sources, self.weights))
        return f"Mixture([{parts}], samples_per_epoch={self.spec.length})"


def mix(sources: Sequence[tuple[Any, float]], *, samples_per_epoch: int | None = None, seed: int | None = None,
        replacement: bool = False, return_source: bool = False) -> Mixture:
    """A weighted mixture of ``(dataset, weight)`` pairs (readers or subsets, any formats).

    ``samples_per_epoch``: samples per epoch, all sources together (default: their total).
    ``seed``: the mixture's order (default: ``make_loader``'s ``seed``). ``replacement``: draw
    each source's samples with replacement. ``return_source``: items end with the source number.
    Give it to ``make_loader``; see the module docstring for what an epoch is.
    """
    pairs = list(sources)
    if not pairs:
        raise ValueError("mix: no sources")
    for p in pairs:
        if not (isinstance(p, tuple) and len(p) == 2):
            raise ValueError(f"mix: sources are (dataset, weight) pairs, got {p!r:.80}")
    return Mixture([p[0] for p in pairs], [p[1] for p in pairs], samples_per_epoch=samples_per_epoch,
                   replacement=replacement, seed=seed, return_source=return_source)
