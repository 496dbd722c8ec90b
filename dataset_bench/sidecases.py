"""What a side-by-side run measures: its configuration, its modes and its read cases.

:class:`SideConfig` (the run's knobs), :data:`MODES` (what a read case's loader delivers),
:data:`FORMATS` / :data:`PACKERS` (ours and the peers' writers), :class:`ReadCase` (one read
measurement) and :func:`read_cases` (every read case of one repeat). The run itself:
:mod:`dataset_bench.sidebyside`; one measurement: :mod:`dataset_bench.sidemeasure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from dataset_bench.peers import NEW_PEERS

__all__ = ["SideConfig", "ReadCase", "read_cases", "FORMATS", "PACKERS", "MODES", "DEFAULTS", "CROP"]

FORMATS = ("wds", "lmdb", "hdf5")  # JPEG formats; mmap is measured as pixels
CROP = 224  # the output side of raw224, decoded, train and pil
DEFAULTS = "defaults"  # a ReadCase kind: make_loader without workers=, whatever the library picks
#: What a read case's loader delivers (ours; a peer does the same work its own way).
MODES = {
    "pixels": "mmap's stored pixels as they are (the naive np.memmap peer reads the same file)",
    "raw224": "mmap's stored pixels center-cropped to 224 by the readers' eval transform with resize = the "
              "stored size (ResizeCenterCrop(stored, 224): a center crop); the naive np.memmap peer slices "
              "the same crop in numpy",
    "bytes": "decode=False: the stored JPEG bytes",
    "decoded": "the readers' fused eval transform (resize 256, center crop 224, uint8 CHW); the peers their "
               "own eval recipe",
    "train": "the readers' fused train transform (RandomResizedCrop 224 + flip, uint8 CHW)",
    "pil": "a user's own PIL transform (naive.PilEvalTransform: resize 256, center crop 224, to float "
           "tensor) on decoded PIL images (image='pil'); its reference is the naive folder (decoded), the "
           "same per-image work after PIL opens the file",
}
PACKERS = ("ours:wds", "ours:lmdb", "ours:hdf5", "peer:lmdb", "peer:shardwriter", "peer:mds")


@dataclass(frozen=True)
class SideConfig:
    images: int = 5000
    repeats: int = 3
    # Packs are short (0.3-2 s) and single warm packs of the same writer vary by up to 2x from run to
    # run on the project's VM (LMDB by hand: 6.3k-12.5k images/s), so they get more repeats than reads.
    pack_repeats: int = 5
    batch_size: int = 64
    workers: int = 2  # the worker count compared (with 0)
    # mmap packed at this size (at least CROP: raw224 center-crops it); the naive memmap peer reads the same file
    mmap_size: int = 256
    min_seconds: float = 2.0  # timed part of each read case
    warmup: int = 4  # batches drawn before timing (worker start-up, JIT, first touches)
    pack: bool = True
    decoded: bool = True
    isolate: bool = True  # each measurement in a fresh interpreter
    # torch intra-op threads in each measuring process (None: torch's default, one per core). 1 by
    # default: with more, a 0-worker loader's torch ops (default_collate's stack, ToTensor) spin
    # against everything else on a busy machine and the peers' figures say more about the load
    # than about them (measured here at load 6: the naive memmap peer 101 vs 36,000 samples/s)
    torch_threads: int | None = 1
    seed: int = 0
    work_dir: str | None = None
    peers: tuple[str, ...] = ("ffcv", "streaming", *NEW_PEERS)  # optional peers to use when installed
    # (peer, python): run that 2026 peer in this interpreter (its own venv); others run in this one
    peer_pythons: tuple[tuple[str, str], ...] = ()

    @classmethod
    def quick(cls, **kw: Any) -> "SideConfig":
        """Seconds, for CI: a few images, one repeat, in-process; of the optional peers only the 2026
        ones, each where installed (a peer in another venv still runs in its own process)."""
        base: dict[str, Any] = dict(images=96, repeats=1, pack_repeats=1, batch_size=16, min_seconds=0.05, warmup=1, isolate=False,
                    peers=tuple(NEW_PEERS))
        base.update(kw)
        return cls(**base)

    def __post_init__(self) -> None:
        if self.mmap_size < CROP:
            raise ValueError(f"mmap_size {self.mmap_size}: raw224 center-crops the stored pixels to {CROP}, "
                             f"so they must be at least {CROP} a side")


class ReadCase(NamedTuple):
    """One read measurement: ``who`` (peer/ours), ``name``, ``mode`` (one of :data:`MODES`), worker
    count and kind."""

    who: str
    name: str
    mode: str
    workers: int
    kind: str = "processes"  # processes | threads | defaults (ours: make_loader picks)

    def label(self) -> str:
        kind = f" {self.kind}" if self.who == "ours" or self.workers else ""
        return f"{self.who}:{self.name} {self.mode} w={self.workers}{kind}"


def _new_peer_cases(have: dict[str, bool], mode: str, workers: int) -> list[ReadCase]:
    """The 2026 peers' cases of one mode: those whose check passed (``have["<peer>:<mode>"]``), with
    ``workers`` workers of their own kind (DALI / SPDL threads, the others processes)."""
    return [ReadCase("peer", name, mode, workers, peer.kind) for name, peer in NEW_PEERS.items()
            if have.get(f"{name}:{mode}")]


def read_cases(cfg: SideConfig, have: dict[str, bool]) -> list[ReadCase]:
    """Every read case of one repeat, peers first in each group. Ours with ``cfg.workers`` also run with
    ``make_loader``'s defaults (kind :data:`DEFAULTS`); raw224, train and pil with ``cfg.workers`` only,
    pil with the defaults only (what a user who brings a transform gets)."""
    w, kinds = cfg.workers, ("processes", "threads")  # with 0 workers: DataLoader vs ThreadLoader in this thread
    every = kinds + (DEFAULTS,)
    cases = []
    for n in (0, w):
        ours_kinds = every if n else kinds
        cases += [ReadCase("peer", "memmap", "pixels", n)]
        cases += [ReadCase("ours", "mmap", "pixels", n, k) for k in ours_kinds]
        cases += [ReadCase("peer", "folder", "bytes", n), ReadCase("peer", "lmdb", "bytes", n),
                  ReadCase("peer", "webdataset", "bytes", n)]
        if have.get("ffcv"):  # FFCV has no loader without threads: at 0 it runs its least, one thread
            cases.append(ReadCase("peer", "ffcv", "bytes", n, "threads"))
        if n:
            cases.append(ReadCase("peer", "threadpool", "bytes", n, "threads"))
            cases += _new_peer_cases(have, "bytes", n)
        for fmt in FORMATS:
            cases += [ReadCase("ours", fmt, "bytes", n, k) for k in ours_kinds]
    cases += [ReadCase("peer", "memmap", "raw224", w)] + [ReadCase("ours", "mmap", "raw224", w, k) for k in every]
    if cfg.decoded:
        for n in (0, w):
            cases += [ReadCase("peer", "folder", "decoded", n), ReadCase("peer", "webdataset", "decoded", n)]
            if n and have.get("ffcv"):
                cases.append(ReadCase("peer", "ffcv", "decoded", n, "threads"))
            if n:
                cases += _new_peer_cases(have, "decoded", n)
            for fmt in FORMATS:
                cases += [ReadCase("ours", fmt, "decoded", n, k) for k in (every if n else ("processes",))]
        cases += [ReadCase("ours", fmt, "train", w, k) for fmt in FORMATS for k in every]
        cases += [ReadCase("ours", fmt, "pil", w, DEFAULTS) for fmt in FORMATS]
    return cases
