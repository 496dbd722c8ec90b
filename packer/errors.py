"""Every error ``pack`` raises on purpose, each carrying the exit code ``pack-dataset`` returns for it.

Two families, so no caller depends on the order of its ``except`` clauses:

* :class:`UsageError` (exit 2): the request cannot be carried out as given
  (bad source, unusable output path). Raised before anything is written.
* :class:`PackError` (exit 1): the work failed part-way (I/O error, disk
  full, ``--strict`` reject). The output is left resumable with ``--resume``.

Both also subclass the builtin a caller would naturally catch for them
(``ValueError`` for bad input, ``RuntimeError`` for a failed run), as they
did before this module existed.
"""

from __future__ import annotations

__all__ = ["PackerError", "UsageError", "SourceError", "OutputError", "OutputExistsError", "PackError"]


class PackerError(Exception):
    """Base of the packer's errors; ``str(exc)`` is one line naming the file and what to do."""

    exit_code: int = 1


class UsageError(PackerError, ValueError):
    """The request cannot be carried out as given; nothing was written."""

    exit_code = 2


class SourceError(UsageError):
    """The source folder cannot be packed (missing, empty, unreadable)."""


class OutputError(UsageError):
    """The output path cannot be used."""


class OutputExistsError(OutputError):
    """The output exists and neither overwrite nor resume was asked for."""


class PackError(PackerError, RuntimeError):
    """Packing failed part-way; the message names the cause and what to do."""

    exit_code = 1
