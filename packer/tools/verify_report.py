"""What ``pack-dataset verify`` reports, and the checks that local and remote verification share.

:mod:`packer.tools.verify` (local folders) and :mod:`packer.tools.verify_remote`
(``s3://``, ``http(s)://``) both import this module and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from readers.contract import spec

__all__ = ["Problem", "VerifyReport", "check_sample", "reason"]


@dataclass(frozen=True)
class Problem:
    where: str  # file (and sample) that is damaged
    what: str  # one-line reason


@dataclass
class VerifyReport:
    root: Path | str
    samples: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not damage: facts worth saying (no array checksums)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, where: Any, what: str) -> None:
        """Record one damaged file or sample."""
        self.problems.append(Problem(str(where), what))


def reason(exc: Exception, path: Any) -> str:
    """The error's message without the leading path (the report line names it already)."""
    text = str(exc)
    prefix = f"{path}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def check_sample(report: VerifyReport, where: str, read: Callable[[], bytes | memoryview | np.ndarray],
                 expected: int) -> None:
    """Read one sample (its stored bytes, or an mmap sample's pixels) and compare its CRC-32 with the index's."""
    report.samples += 1
    try:
        data = read()
    except (spec.DatasetFormatError, OSError) as exc:
        report.problem(where, f"unreadable: {exc}")
        return
    buf = np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data
    if spec.checksum(buf) != int(expected):
        report.problem(where, "checksum mismatch: stored bytes changed since packing")
