"""What a ``dataset-bench`` run measured, as plain data: rows of medians, limits, notes; JSON in and out."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from dataset_bench.measure import MIN_WINDOW_BATCHES, MIN_WINDOW_S, LoaderStats, short_window
from dataset_bench.targets import NAIVE

__all__ = ["BenchResult", "median", "summarize", "add_ratios"]

#: LoaderStats figures a row reports as the median over repeats
FIGURES = ("samples_per_s", "epoch_samples_per_s", "mb_per_s", "first_batch_s", "seconds", "pss_main_mb",
           "pss_workers_mb", "pss_total_mb", "shuffle_ratio", "displacement_ratio")


@dataclass
class BenchResult:
    """Everything one run measured. ``rows`` hold medians over repeats (and each repeat's values).

    A row is keyed by ``target`` (a format or ``"naive"``), ``mode``,
    ``workers`` and ``cache``; see :func:`summarize` and :func:`add_ratios`
    for its figures. As text or a chart: :mod:`dataset_bench.report` (which
    imports this module, never the reverse).
    """

    machine: dict[str, Any]
    config: dict[str, Any]
    targets: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    limits: dict[str, Any]
    notes: list[str]
    transform: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> "BenchResult":
        return cls(**json.loads(Path(path).read_text()))

    def row(self, target: str, mode: str, workers: int, cache: str) -> dict[str, Any] | None:
        for r in self.rows:
            if (r["target"], r["mode"], r["workers"], r["cache"]) == (target, mode, workers, cache):
                return r
        return None


def median(values: Sequence[float | None]) -> float | None:
    """Median of the known values, or None when there are none."""
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def summarize(runs: list[LoaderStats], cached_after_evict: list[float | None],
              foreign_cpu: list[float | None], *, min_window: tuple[int, float] = (MIN_WINDOW_BATCHES, MIN_WINDOW_S)
              ) -> dict[str, Any]:
    """One row's figures from the repeats of one case: medians, each repeat's rates, what stayed cached.

    ``cached_after_evict``: share of the files still cached after each cold
    eviction (the worst is kept); ``foreign_cpu``: other processes' CPU share
    during each repeat (the worst is kept). A row whose timing window (the
    fewest batches, the median seconds) is under ``min_window`` (batches,
    seconds) has no ``samples_per_s`` nor ``mb_per_s`` (None) and says why in
    ``refused``; each repeat's measured rate stays in ``repeats``.
    """
    out: dict[str, Any] = {k: median([getattr(r, k) for r in runs]) for k in FIGURES}
    out["window_batches"] = min((r.window_batches for r in runs), default=0)
    out["window_s"] = median([r.window_s for r in runs]) or 0.0
    out["refused"] = short_window(out["window_batches"], out["window_s"], *min_window)
    if out["refused"]:
        out["samples_per_s"] = out["mb_per_s"] = None
    out["samples"] = runs[0].samples if runs else 0
    out["repeats"] = {k: [getattr(r, k) for r in runs] for k in ("samples_per_s", "first_batch_s", "pss_total_mb")}
    known = [c for c in cached_after_evict if c is not None]
    out["cached_after_evict"] = max(known) if known else None
    known = [f for f in foreign_cpu if f is not None]
    out["foreign_cpu_max"] = round(max(known), 3) if known else None
    return out


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``x_naive``: decoded samples/s over the naive baseline's at the same workers and cache state."""
    base = {(r["workers"], r["cache"]): r["samples_per_s"] for r in rows if r["target"] == NAIVE}
    for r in rows:
        b = base.get((r["workers"], r["cache"]))
        r["x_naive"] = (r["samples_per_s"] / b if r["mode"] == "decoded" and b and r["samples_per_s"] is not None
                        else None)
