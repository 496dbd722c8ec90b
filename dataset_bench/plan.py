"""What a ``dataset-bench`` run measures (:class:`BenchConfig`) and in which order (:func:`plan_cases`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, NamedTuple

from dataset_bench.measure import MODES
from dataset_bench.targets import NAIVE
from readers.contract.spec import FORMATS

__all__ = ["CACHES", "BenchConfig", "Case", "plan_cases"]

CACHES = ("warm", "cold")


@dataclass(frozen=True)
class BenchConfig:
    """What :func:`dataset_bench.run.run_benchmark` measures; see ``dataset-bench --help``."""

    src: str | None = None
    datasets: tuple[str, ...] = ()
    generate: int | None = None
    work_dir: str | None = None
    formats: tuple[str, ...] = FORMATS
    workers: tuple[int, ...] = (0, 2)
    modes: tuple[str, ...] = MODES
    caches: tuple[str, ...] = CACHES
    batch_size: int = 64
    repeats: int = 3
    max_samples: int | None = None
    baseline: bool = True
    limits: bool = True
    decode_files: int = 300
    pack_workers: int | None = None
    mmap_resize: int = 256
    shard_count: int | None = None
    seed: int = 0
    torch_threads: int | None = None  # torch.set_num_threads for the run (None: torch's default)
    isolate: bool = True  # each measurement in a fresh interpreter (clean PSS; ~1-2 s start-up each, not timed)
    quick: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("formats", FORMATS), ("modes", MODES), ("caches", CACHES)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ValueError(f"unknown {name} {bad}; choose from {', '.join(allowed)}")
        if any(w < 0 for w in self.workers) or not self.workers:
            raise ValueError(f"workers must be one or more counts >= 0, got {self.workers}")
        if self.repeats < 1 or self.batch_size < 1:
            raise ValueError("repeats and batch_size must be >= 1")
        if self.generate is not None and self.generate < 1:
            raise ValueError(f"generate must be >= 1, got {self.generate}")
        if not (self.src or self.datasets or self.generate):
            raise ValueError("nothing to measure: give src, datasets or generate")

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> "BenchConfig":
        """A tiny run for tests and smoke checks: 48 images, one repeat, small batches, in one process."""
        base: dict[str, Any] = {"generate": 48, "repeats": 1, "batch_size": 16, "decode_files": 24, "workers": (0, 1),
                "isolate": False, "quick": True}
        if overrides.get("src") or overrides.get("datasets"):
            base.pop("generate")
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as JSON-ready plain data (tuples as lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


class Case(NamedTuple):
    """One loader measurement: which target, which mode, how many workers, which page-cache state."""

    target: str
    mode: str
    workers: int
    cache: str

    def label(self) -> str:
        return f"{self.target} {self.mode} w={self.workers} {self.cache}"


def plan_cases(cfg: BenchConfig, targets: Iterable[str]) -> list[Case]:
    """The cases of one repeat, in run order: by cache state, then workers; the baseline first in each group.

    The baseline is measured decoded only (it has no raw mode).
    """
    names = list(targets)
    cases = []
    for cache in cfg.caches:
        for w in cfg.workers:
            if NAIVE in names:
                cases.append(Case(NAIVE, "decoded", w, cache))
            for mode in cfg.modes:
                cases.extend(Case(name, mode, w, cache) for name in names if name != NAIVE)
    return cases
