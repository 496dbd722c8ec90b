"""Memory of a loader's processes, split the way the targets count it.

``/proc/<pid>/smaps_rollup`` splits a process's proportional set size into
anonymous (``Pss_Anon``: heaps, batches being built), shared memory
(``Pss_Shmem``: ``/dev/shm`` segments, torch's shared tensors) and
file-backed pages (``Pss_File``: libraries, and mapped data files). The
first two are what a loader really costs (*private* here); mapped pages of a
dataset file are the page cache seen through a mapping, reported apart
(:func:`mapped_under`), never counted against a reader.

Shared memory is counted from the machine's side (:class:`PrivatePeak`): a
``DataLoader`` worker writes each batch into a new shared-memory file, sends it
and drops its own mapping, and until the main process reads the batch's pages
no live process maps them, so no process's ``Pss_Shmem`` holds them. The growth
of ``Shmem`` in ``/proc/meminfo`` since the measurement began counts those pages
as well as slots a worker keeps mapped, each page once.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pss_parts", "system_shmem", "mapped_under", "tree_pids", "PrivatePeak"]


def pss_parts(pid: int) -> dict[str, int]:
    """``pid``'s ``Pss``, ``Pss_Anon``, ``Pss_File`` and ``Pss_Shmem`` in bytes, those the kernel gives
    (none for a process that is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def system_shmem() -> int | None:
    """Bytes of shared memory in use on the machine (``Shmem`` of ``/proc/meminfo``: tmpfs, ``/dev/shm``,
    memfd), None where the kernel does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Shmem:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def tree_pids(pid: int | None = None) -> list[int]:
    """``pid`` (default: this process) and its live descendants."""
    root = os.getpid() if pid is None else pid
    try:
        import psutil

        return [root] + [c.pid for c in psutil.Process(root).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return [root]


def mapped_under(pid: int, folder: str | os.PathLike) -> int:
    """PSS in bytes of ``pid``'s mappings of files under ``folder`` (a dataset's data files)."""
    prefix = str(Path(folder).resolve()) + os.sep
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header line
                    parts = line.split(None, 5)
                    inside = len(parts) == 6 and parts[5].strip().startswith(prefix)
                elif inside and first == "Pss:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


class PrivatePeak:
    """Peak private memory (main + workers) and peak data-file mapped PSS, sampled at most every ``interval`` s.

    Private memory is the anonymous PSS of the processes plus the growth of the machine's shared
    memory since this object was made (:func:`system_shmem`; see the module docstring), so a batch
    in flight counts whether a worker keeps its pages mapped or not. That growth is the machine's:
    measure one loader at a time. Where ``/proc/meminfo`` has no ``Shmem`` line, the processes'
    ``Pss_Shmem`` stands in for it."""

    def __init__(self, data_folder: str | os.PathLike | None, interval: float = 0.25) -> None:
        self.folder, self.interval = data_folder, interval
        self.private: int | None = None
        self.mapped = 0
        self._next = 0.0
        self._shmem0 = system_shmem()

    def sample(self, now: float, force: bool = False) -> None:
        if not force and now < self._next:
            return
        self._next = now + self.interval
        pids = tree_pids()
        rollups = [pss_parts(p) for p in pids]
        if all("Pss_Anon" in r for r in rollups):
            shmem = system_shmem()
            if shmem is not None and self._shmem0 is not None:
                shared = max(0, shmem - self._shmem0)
            else:
                shared = sum(r.get("Pss_Shmem", 0) for r in rollups)
            self.private = max(self.private or 0, sum(r["Pss_Anon"] for r in rollups) + shared)
        if self.folder is not None and force:  # smaps is long: read it at the end only
            self.mapped = max(self.mapped, sum(mapped_under(p, self.folder) for p in pids))
