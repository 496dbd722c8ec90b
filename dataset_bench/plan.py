"""What a ``dataset-bench`` run measures (:class:`BenchConfig`), in which order (:func:`plan_cases`), and
what it will run and about how long that takes, said before it starts (:func:`describe_plan`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, NamedTuple

from dataset_bench.measure import MIN_WINDOW_BATCHES, MIN_WINDOW_S, MODES
from dataset_bench.targets import NAIVE
from readers.contract.spec import FORMATS

__all__ = ["CACHES", "BenchConfig", "Case", "plan_cases", "planned_targets", "total_steps", "estimate_seconds",
           "describe_plan"]

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
    caches: tuple[str, ...] = ("warm",)  # a few minutes; full_defaults(): warm and cold, 3 repeats
    batch_size: int = 64
    repeats: int = 1
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
    min_window_batches: int = MIN_WINDOW_BATCHES  # a samples/s figure timed over less is refused
    min_window_s: float = MIN_WINDOW_S
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
        if self.min_window_batches < 1 or self.min_window_s < 0:
            raise ValueError(f"the minimum timing window must be >= 1 batch and >= 0 s, got "
                             f"{self.min_window_batches} batches, {self.min_window_s} s")
        if self.generate is not None and self.generate < 1:
            raise ValueError(f"generate must be >= 1, got {self.generate}")
        if not (self.src or self.datasets or self.generate):
            raise ValueError("nothing to measure: give src, datasets or generate")

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> "BenchConfig":
        """A tiny run for tests and smoke checks: 48 images, one repeat, small batches, warm and cold, in one
        process; its passes are too short to time, so every samples/s figure is refused (the run still
        goes through every step)."""
        base: dict[str, Any] = {"generate": 48, "repeats": 1, "batch_size": 16, "decode_files": 24, "workers": (0, 1),
                "caches": CACHES, "isolate": False, "quick": True}
        if overrides.get("src") or overrides.get("datasets"):
            base.pop("generate")
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    @classmethod
    def full_defaults(cls, **overrides: Any) -> "BenchConfig":
        """The full run (``dataset-bench --full``): warm and cold page cache, 3 repeats, each in a fresh process."""
        base: dict[str, Any] = {"caches": CACHES, "repeats": 3}
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


def planned_targets(cfg: BenchConfig) -> tuple[int | None, list[str]]:
    """(samples a pass reads, the targets a run of ``cfg`` will time), known before it starts: from the
    datasets' indexes, the source folder or ``generate``; samples is None when they cannot be read."""
    from dataset_bench.targets import dataset_target, folder_target

    names = list(cfg.formats)
    samples: int | None = cfg.generate
    try:
        if cfg.datasets:
            found = {t.name: t.samples for t in map(dataset_target, cfg.datasets)}
            names, samples = [f for f in FORMATS if f in found], max(found.values())
        elif not cfg.generate and cfg.src:
            samples = folder_target(cfg.src).samples
    except (OSError, ValueError, KeyError):
        samples = None
    return samples, ([NAIVE] if cfg.baseline else []) + names


def total_steps(cfg: BenchConfig, cases: int, targets: int) -> int:
    """Counted steps of a run: its loader cases and (with ``limits``) one sequential read per target and
    cache state plus one decode step, all ``repeats`` times (what the progress bar counts)."""
    return (cases + ((targets * 2 + 1) if cfg.limits else 0)) * cfg.repeats


# Rough costs on an idle 2-core machine (this project's VM), for the estimate said up front only.
_START_S = {True: 3.0, False: 0.3}  # a measurement's start: a fresh interpreter (torch, readers), or none
_PER_CORE = {NAIVE: 220.0, "decoded": 450.0, "raw": 8_000.0}  # samples/s a core reads
_GENERATE_PER_CORE = 45.0  # ImageNet-like JPEGs made per second per core
_PACK = {"mmap": 130.0}  # images/s per core packing (the others: _PACK_OTHER); 0.5 s start each
_PACK_OTHER = 500.0
_LIMITS_PER_IMAGE_S = 0.013  # the decode step's five single-core passes over one image
_READ_S = 0.3  # one sequential read of a small dataset


def estimate_seconds(cfg: BenchConfig, samples: int, targets: list[str], *, cpus: int = 2,
                     load: float | None = None) -> float:
    """About how long a run of ``cfg`` over ``samples`` samples and ``targets`` takes here, in seconds.

    A model, not a measurement: fixed per-step costs and per-core rates of an
    idle 2-core machine, scaled by how busy this one is (``load``: the load
    average before the run; others' work slows every step, at most 2x here).
    """
    cpus = max(1, cpus)
    read = min(samples, cfg.max_samples or samples)
    seconds = 0.0
    if cfg.generate:
        seconds += cfg.generate / (_GENERATE_PER_CORE * cpus)
    if cfg.generate or (cfg.src and not cfg.datasets):
        seconds += sum(0.5 + samples / (_PACK.get(f, _PACK_OTHER) * cpus) for f in cfg.formats)
    for case in plan_cases(cfg, targets):
        cores = max(1, min(case.workers, cpus))
        rate = _PER_CORE[NAIVE if case.target == NAIVE else case.mode] * cores
        seconds += (_START_S[cfg.isolate] + read / rate) * cfg.repeats
    if cfg.limits:
        seconds += (len(targets) * 2 * _READ_S + min(cfg.decode_files, samples) * _LIMITS_PER_IMAGE_S) * cfg.repeats
    # others' work slows each step, but less than the load average says (it lags, and counts waiting on I/O):
    # the square root of the share, at most 2x (a run of 90 s at load 6.5 on 2 cores was estimated at 2.3 min)
    return seconds * min(2.0, max(1.0, ((load or 0.0) + cpus) / cpus) ** 0.5)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def describe_plan(cfg: BenchConfig, samples: int | None, targets: list[str], *, cpus: int = 2,
                  load: float | None = None) -> list[str]:
    """What a run of ``cfg`` will do and about how long it takes, in a few lines, said before it starts;
    and, when its passes are too short to time, which figures it will refuse and what would time them."""
    cases = plan_cases(cfg, targets)
    steps = total_steps(cfg, len(cases), len(targets))
    what = []
    if cfg.generate:
        what.append(f"generate {cfg.generate} images")
    if cfg.generate or (cfg.src and not cfg.datasets):
        what.append(f"pack them as {', '.join(cfg.formats)}")
    modes = ", ".join(cfg.modes)
    what.append(f"time {len(cases)} loader passes ({', '.join(targets)}; {modes}; workers "
                f"{','.join(map(str, cfg.workers))}; {' and '.join(cfg.caches)} cache) x {cfg.repeats} repeat"
                f"{'s' if cfg.repeats != 1 else ''}{', each in a fresh process' if cfg.isolate else ''}")
    if cfg.limits:
        what.append("measure the machine's raw read and decode limits")
    lines = [f"plan: {'; '.join(what)}: {steps} steps"]
    if samples is not None:
        lines[0] += (f", about {_minutes(estimate_seconds(cfg, samples, targets, cpus=cpus, load=load))} here "
                     f"({cpus} cores, load {load or 0:.1f})")
        full = replace(cfg, caches=CACHES, repeats=3)
        if not cfg.quick and (cfg.caches, cfg.repeats) != (full.caches, full.repeats):
            full_steps = total_steps(full, len(plan_cases(full, targets)), len(targets))
            lines.append(f"  (--full: warm and cold cache, 3 repeats: {full_steps} steps, about "
                         f"{_minutes(estimate_seconds(full, samples, targets, cpus=cpus, load=load))})")
        lines.extend(_window_warning(cfg, samples))
    return lines


def _window_warning(cfg: BenchConfig, samples: int) -> list[str]:
    """A line when a pass of ``samples`` is too short for the minimum timing window (figures refused)."""
    read = min(samples, cfg.max_samples or samples)
    warmup = max(1, max(cfg.workers))
    batches = -(-read // cfg.batch_size)
    if batches - warmup >= cfg.min_window_batches:
        return []
    need = cfg.min_window_batches + warmup
    return [f"  warning: {read} samples at batch {cfg.batch_size} is {batches} batches a pass; a samples/s figure "
            f"needs {cfg.min_window_batches} timed batches after the first {warmup} (and {cfg.min_window_s:g} s), "
            f"so the short ones will be refused: give {need * cfg.batch_size} samples or more, or --batch-size "
            f"{max(1, read // need)} or less"]
