"""Is there room in ``/dev/shm`` for what a loader's worker processes send, and what to do when not.

Worker processes hand batches to the main process through shared memory; Docker's default
``/dev/shm`` of 64 MB is too small for a prefetch queue of image batches. ``make_loader`` checks
(:func:`shm_check`, from :func:`item_bytes`) and, when short, switches to the ``file_system``
sharing strategy with a warning that says how to fix it (:func:`use_file_system_sharing`).
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ShmSpace", "shm_check", "use_file_system_sharing", "item_bytes"]


def item_bytes(dataset: Any) -> int:
    """Rough size of one item as it crosses to the main process."""
    index = getattr(dataset, "index", None)
    sizes = index.arrays.get("sizes") if index is not None else None
    mean = float(sizes.mean()) if sizes is not None and len(sizes) else 150_000.0
    if getattr(dataset, "format", "") == "mmap" or not getattr(dataset, "decode", True):
        return int(mean)
    if getattr(dataset, "transform", None) is not None:
        return 3 * 224 * 224
    return int(mean * 10)  # JPEG compresses ~10:1


@dataclass(frozen=True)
class ShmSpace:
    """Free space in a shared-memory folder against what a loader needs. True when enough."""

    path: str
    free: int | None  # None: the folder could not be examined (then assumed enough)
    needed: int

    @property
    def enough(self) -> bool:
        return self.free is None or self.free >= self.needed

    def __bool__(self) -> bool:
        return self.enough


def shm_check(need_bytes: int, path: str = "/dev/shm") -> ShmSpace:
    """How much room ``path`` has for ``need_bytes`` (changes nothing; ``bool()`` of it: enough)."""
    try:
        free: int | None = shutil.disk_usage(path).free
    except OSError:
        free = None
    return ShmSpace(path, free, int(need_bytes))


def use_file_system_sharing(space: ShmSpace, stacklevel: int = 1) -> None:
    """Switch torch.multiprocessing (process-wide) to the 'file_system' sharing strategy and
    warn, naming how short ``space`` is and how to fix it. ``make_loader`` calls this when
    :func:`shm_check` finds too little room. ``stacklevel`` as for ``warnings.warn``, counted
    from the caller (1: the warning names the line that called this)."""
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        torch.multiprocessing.set_sharing_strategy("file_system")
    warnings.warn(
        f"{space.path} has {(space.free or 0) / 2**20:.0f} MB free but the loader's prefetch queue needs about "
        f"{space.needed / 2**20:.0f} MB; switched torch.multiprocessing to the 'file_system' sharing "
        "strategy (slower, may leak files on crashes). Give the container more shared memory, "
        "e.g. `docker run --shm-size=8g`, or lower num_workers / prefetch_factor / batch_size.",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )
