"""The machine a measurement runs on: what it is, what it holds, and who else is using it.

* :func:`machine_info` / :func:`machine_label`: the one description of the
  machine every benchmark prints and saves (host, CPU model, usable cores,
  RAM, software versions, decoders);
* :func:`pss_bytes` / :func:`process_tree_pss`: proportional set size of a
  process and of a loader's worker processes;
* :class:`CpuMonitor` and :func:`load_average`: how busy other processes kept
  the machine while we measured.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from readers.contract.env import available_cpus

__all__ = [
    "cpu_model",
    "ram_bytes",
    "machine_info",
    "machine_label",
    "pss_bytes",
    "process_tree_pss",
    "CpuMonitor",
    "load_average",
    "load_summary",
    "load_notes",
]


def cpu_model() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` reports it (else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def ram_bytes() -> int | None:
    """Total RAM (``MemTotal`` of ``/proc/meminfo``), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_info() -> dict[str, Any]:
    """Where the figures come from: host, CPU, usable cores, RAM, OS, software versions, decoders."""
    import PIL
    import torch

    from readers.decode.decoders import decoder_report

    ram = ram_bytes()
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "usable_cpus": available_cpus(),
        "os_cpu_count": os.cpu_count(),
        "ram_gb": round(ram / 2**30, 1) if ram else None,
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.cuda.is_available(),
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "decoders": decoder_report(),
    }


def machine_label(info: dict[str, Any]) -> str:
    """One line naming the machine, for tables and charts."""
    ram = f", {info['ram_gb']:g} GB RAM" if info.get("ram_gb") else ""
    return (f"{info['hostname']}: {info['cpu_model']}, {info['usable_cpus']} usable cores{ram}; "
            f"Python {info['python']}, torch {info['torch']}")


# --------------------------------------------------------------------------- memory


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of one process (``/proc/<pid>/smaps_rollup``, else psutil), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        import psutil

        return int(psutil.Process(pid).memory_full_info().pss)
    except Exception:  # noqa: BLE001 - psutil missing, process gone, no permission, no pss field
        return None


def _children() -> list[int]:
    """Pids of this process's descendants (psutil), else of its direct children (/proc)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process().children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing: fall back to /proc
        pass
    children = []
    try:
        me = str(os.getpid())
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                stat = (d / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[1] == me:
                    children.append(int(d.name))
    except OSError:
        pass
    return children


def process_tree_pss() -> tuple[int | None, int]:
    """(PSS of this process, summed PSS of its live child processes, e.g. loader workers)."""
    workers = sum(p for p in (pss_bytes(c) for c in _children()) if p)
    return pss_bytes(os.getpid()), workers


# --------------------------------------------------------------------------- other load


class CpuMonitor:
    """How much CPU time *other* processes took while we measured.

    Busy time of the whole machine (``/proc/stat``: user, nice, system, irq,
    softirq, steal) minus the CPU time of this process and its reaped
    children (``os.times``; loader workers are joined before each sample),
    as a share of ``usable cpus x wall time``. None where ``/proc/stat`` is
    missing.
    """

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._now()
        self.shares: list[float] = []
        self._first = self._last

    def _now(self) -> tuple[float, float, float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields)) / self.hz
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return time.perf_counter(), busy, own

    @staticmethod
    def _share(a: tuple | None, b: tuple | None, cpus: int) -> float | None:
        if a is None or b is None or b[0] <= a[0]:
            return None
        foreign = (b[1] - a[1]) - (b[2] - a[2])
        return min(1.0, max(0.0, foreign / ((b[0] - a[0]) * cpus)))

    def sample(self, keep: bool = True, min_s: float = 0.5) -> float | None:
        """Foreign CPU share since the previous sample; kept in ``shares`` when ``keep`` and >= ``min_s`` long."""
        now = self._now()
        share = self._share(self._last, now, self.cpus)
        if share is not None and now is not None and self._last is not None and keep and now[0] - self._last[0] >= min_s:
            self.shares.append(share)
        self._last = now
        return share

    def summary(self) -> dict[str, float] | None:
        """Foreign share over the monitor's whole life and the largest kept sample, or None."""
        overall = self._share(self._first, self._now(), self.cpus)
        if overall is None:
            return None
        return {"overall": round(overall, 3), "max_interval": round(max(self.shares, default=0.0), 3)}


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def load_summary(loads: list[float | None]) -> dict[str, float] | None:
    """min / median / max of load averages sampled during a run."""
    known = [v for v in loads if v is not None]
    if not known:
        return None
    return {"min": round(min(known), 2), "median": round(statistics.median(known), 2), "max": round(max(known), 2)}


def load_notes(machine: dict[str, Any], threads: int) -> list[str]:
    """Sentences for the report: torch's thread count, and how busy other processes kept the machine."""
    notes = [f"torch intra-op threads in the main process: {threads} (loader workers use 1); at num_workers=0 "
             "the transform runs in the main process with these threads"]
    foreign = machine.get("foreign_cpu")
    if foreign is None:
        return notes
    share, worst = foreign["overall"], foreign["max_interval"]
    if share > 0.1 or worst > 0.3:
        notes.append(f"the machine was busy: other processes used {share:.0%} of its CPU time during the run "
                     f"(up to {worst:.0%} during a single measurement); these figures understate the machine and "
                     "are noisier")
    else:
        notes.append(f"other processes used {share:.0%} of the machine's CPU time during the run "
                     f"(at most {worst:.0%} during a single measurement)")
    return notes
