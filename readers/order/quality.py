"""Shuffle quality: how close a loader's batches come to a uniform shuffle.

Two measures, each reported against its exact expectation under a uniform
random order of the same samples, so 1.0 means "as good as a global shuffle":

* **distinct classes per batch**. For a batch of ``b`` samples drawn uniformly
  without replacement from a dataset with class counts ``n_c`` (``N`` in all),
  class c is missing with probability ``C(N - n_c, b) / C(N, b)``, so the
  expected number of distinct classes is ``sum_c 1 - C(N - n_c, b) / C(N, b)``
  (ImageNet, 1000 x 1,281 images, b = 256: 226.2). A reader that streams
  class-sorted shards gets a handful instead.
* **displacement**: the mean of ``|t / T - i / N|`` over delivered samples,
  ``t`` the delivery position (of ``T``) and ``i`` the packed index (of ``N``):
  how far samples move from where they lie on disk. Its uniform expectation is
  computed exactly for the samples delivered (about 1/3).

:func:`measure` works on any loader's batches (labels, and indices when the
loader returns them: ``return_index=True``); :func:`measure_loader` iterates
one. :func:`simulate` runs each reader's real order logic (``readers.order.epoch``:
``ShardDataset``'s epoch plan, shard interleave and buffer; ``EpochSampler``'s
split over ranks) on a synthetic index of a given shape, without reading any
data, and measures the result as the training job would see it: per-rank
batches of ``batch_size``, delivered round-robin from each rank's workers as a
DataLoader does, the ranks' batches of one step side by side.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from readers.contract import spec
from readers.contract.env import WorkerEnv
from readers.order.epoch import ShardLayout, ShardSettings, round_robin, worker_order
from readers.order.mapstyle import rank_indices

__all__ = ["ShuffleQuality", "expected_distinct", "expected_displacement", "measure", "measure_loader", "simulate",
           "IMAGENET"]

#: ImageNet-1k train's shape for :func:`simulate`: classes, images per class (1,281,167 / 1000 ~ 1,281),
#: 8 ranks x 8 workers, batch 256, mean JPEG ~110 KB (~140 GB in all) in 256 MB shards.
IMAGENET: dict[str, Any] = {"classes": 1000, "per_class": 1281, "world_size": 8, "num_workers": 8,
                            "batch_size": 256, "shard_samples": (256 << 20) // 110_000}


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def expected_distinct(class_counts: Sequence[int], batch_size: int) -> float:
    """Expected distinct classes in a batch of ``batch_size`` drawn uniformly without replacement."""
    counts = [int(c) for c in class_counts if c > 0]
    n = sum(counts)
    b = min(int(batch_size), n)
    total = _log_comb(n, b)
    return float(sum(1.0 - (math.exp(_log_comb(n - c, b) - total) if n - c >= b else 0.0) for c in counts))


def _pair_mean_abs(p: np.ndarray, q: np.ndarray) -> float:
    """mean over all pairs of |p_t - q_j| (exact, O((T + J) log J))."""
    q = np.sort(q)
    prefix = np.concatenate([[0.0], np.cumsum(q)])
    k = np.searchsorted(q, p)  # q[:k] <= p
    below = p * k - prefix[k]
    above = (prefix[-1] - prefix[k]) - p * (len(q) - k)
    return float((below + above).sum() / (len(p) * len(q)))


def _positions(indices: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    t = (np.arange(len(indices)) + 0.5) / len(indices)
    return t, (np.asarray(indices, dtype=np.float64) + 0.5) / n


def expected_displacement(indices: np.ndarray, num_samples: int) -> float:
    """Mean |t/T - i/N| if the delivered ``indices`` came in a uniformly random order."""
    t, q = _positions(indices, num_samples)
    return _pair_mean_abs(t, q)


@dataclass(frozen=True)
class ShuffleQuality:
    """One loader's (or a simulated job's) shuffle quality; ratios are against a uniform shuffle."""

    batches: int
    batch_size: int  # the largest batch seen
    distinct: float  # mean distinct classes per batch
    expected_distinct: float  # the same under a uniform shuffle, for the same batch sizes
    displacement: float | None = None  # mean |t/T - i/N| (None without indices)
    expected_displacement: float | None = None

    @property
    def distinct_ratio(self) -> float:
        return self.distinct / self.expected_distinct if self.expected_distinct else float("nan")

    @property
    def displacement_ratio(self) -> float | None:
        if self.displacement is None or not self.expected_displacement:
            return None
        return self.displacement / self.expected_displacement

    def summary(self) -> str:
        text = (f"{self.distinct:.1f} distinct classes per batch of {self.batch_size} vs {self.expected_distinct:.1f} "
                f"for a uniform shuffle ({self.distinct_ratio:.2f}x)")
        if self.displacement_ratio is not None:
            text += (f"; displacement {self.displacement:.3f} vs {self.expected_displacement:.3f} "
                     f"({self.displacement_ratio:.2f}x)")
        return text

    def as_dict(self) -> dict[str, Any]:
        return dict(asdict(self), distinct_ratio=self.distinct_ratio, displacement_ratio=self.displacement_ratio)


def _columns(batch: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(labels, indices or None) of a loader batch ``(images, labels[, indices])`` or bare labels."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        labels = np.asarray(batch[1]).reshape(-1)
        return labels, (np.asarray(batch[2]).reshape(-1) if len(batch) >= 3 else None)
    return np.asarray(batch).reshape(-1), None


def measure(batches: Iterable[Any], class_counts: Sequence[int] | np.ndarray, num_samples: int | None = None) -> ShuffleQuality:
    """Shuffle quality of ``batches``: each a loader batch ``(images, labels[, indices])`` or an
    array of labels. ``class_counts``: the dataset's samples per class (``index.meta["class_counts"]``);
    ``num_samples``: for the displacement (default: the sum of ``class_counts``)."""
    counts = [int(c) for c in class_counts]
    n = num_samples or sum(counts)
    expect = lru_cache(maxsize=None)(lambda b: expected_distinct(counts, b))
    distinct, expected, seen, sizes = [], [], [], []
    for batch in batches:
        labels, indices = _columns(batch)
        if not len(labels):
            continue
        distinct.append(len(np.unique(labels)))
        expected.append(expect(len(labels)))
        sizes.append(len(labels))
        if indices is not None:
            seen.append(indices)
    if not distinct:
        raise ValueError("no batches to measure")
    disp = exp_disp = None
    if seen and len(seen) == len(distinct):
        order = np.concatenate(seen)
        t, q = _positions(order, n)
        disp, exp_disp = float(np.abs(t - q).mean()), expected_displacement(order, n)
    return ShuffleQuality(len(distinct), max(sizes), float(np.mean(distinct)), float(np.mean(expected)), disp,
                          exp_disp)


def measure_loader(loader: Iterable[Any], max_batches: int | None = None) -> ShuffleQuality:
    """Iterate ``loader`` (up to ``max_batches``) and measure its batches; the class counts come
    from its dataset's index."""
    dataset = getattr(loader, "dataset", None)
    index = getattr(dataset, "index", None)
    if index is None:
        raise ValueError("measure_loader needs a loader over a reader from readers (use measure() otherwise)")
    batches = []
    for k, batch in enumerate(loader):
        if max_batches is not None and k >= max_batches:
            break
        batches.append((None, *batch[1:3]))  # labels[, indices]: the images are not needed
    return measure(batches, index.meta["class_counts"], index.num_samples)


# --------------------------------------------------------------------------- simulation


def _batches(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


def _rank_batches(fmt: str, rank: int, shape: dict[str, Any], layout: ShardLayout | None,
                  settings: ShardSettings, epoch: int) -> list[np.ndarray]:
    world, workers, bs = shape["world_size"], shape["num_workers"], shape["batch_size"]
    n = shape["classes"] * shape["per_class"]
    if fmt != "wds":
        return _batches(rank_indices(n, settings.seed, epoch, settings.shuffle, world, rank), bs)
    assert layout is not None
    per_worker = [_batches(worker_order(layout, settings, epoch, WorkerEnv(rank, world, w, workers)), bs)
                  for w in range(workers)]
    return round_robin(per_worker)


def simulate(fmt: str, *, order: str | None = None, epoch: int = 0, seed: int = 0, pack_seed: int = 0,
             buffer_size: int = 1000, open_shards: int = 4, **shape: Any) -> ShuffleQuality:
    """Shuffle quality of format ``fmt``'s reader on a synthetic, class-sorted source of the given
    shape (defaults: :data:`IMAGENET`), packed in ``order`` (default: the format's pack default,
    ``spec.DEFAULT_ORDER``), read with the readers' default settings. Reads no data.

    The ranks' batches of each step are measured one by one, in the order (step, rank); the
    displacement is over that global delivery order.
    """
    shape = {**IMAGENET, **shape}
    n = shape["classes"] * shape["per_class"]
    source_labels = np.repeat(np.arange(shape["classes"]), shape["per_class"])
    kind = order or spec.DEFAULT_ORDER[fmt]
    labels = source_labels if kind == "source" else source_labels[spec.order_permutation(n, pack_seed)]
    layout = None
    if fmt == "wds":
        full, rest = divmod(n, shape["shard_samples"])
        layout = ShardLayout.from_sizes([shape["shard_samples"]] * full + ([rest] if rest else []))
    settings = ShardSettings(seed=seed, buffer_size=buffer_size, open_shards=open_shards)
    per_rank = [_rank_batches(fmt, r, shape, layout, settings, epoch) for r in range(shape["world_size"])]
    steps = max(len(b) for b in per_rank)
    delivered = [b[k] for k in range(steps) for b in per_rank if k < len(b)]
    counts = np.bincount(labels, minlength=shape["classes"])
    return measure([(None, labels[idx], idx) for idx in delivered], counts, n)
