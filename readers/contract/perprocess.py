"""``PerProcess``: one value per process, created on first use there.

Readers hold things that must never cross a process boundary: open file
descriptors, an LMDB environment, an HDF5 file, a memory map, a random
generator, a shared-memory segment. A DataLoader worker gets them by
``fork`` (a copy of the parent's objects, the same pid check must spot
them) or by pickling (``spawn``/``forkserver`` workers, DDP). The rules
are the same for all of them, so they live here once:

* ``get()`` creates the value with ``factory()`` the first time it is used
  in a process, and again in every process that inherits the holder (the
  pid changed): an inherited value belongs to the process that made it and
  is never used here.
* ``close()`` calls ``closer(value)`` only in the process that created the
  value; anywhere else it just forgets it (closing a forked copy of a file
  descriptor or a mapping would be harmless, but closing the parent's
  h5py/LMDB objects in a child is not).
* pickling drops the value (``factory``, ``closer`` and ``inherited`` travel,
  so they must be picklable: module-level functions or ``functools.partial``).
* ``inherited(value)``, when given, is called once with a value inherited
  through ``fork`` before the new one is created: for a library that
  refuses a second open of the same resource in one process (py-lmdb).

Nothing here imports torch or numpy.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")

# Creation is serialized, so loader threads (``make_loader(..., workers="threads")``) that
# reach an empty holder together create one value, not one each (py-lmdb refuses a second
# open of one environment). Re-entrant: a factory may fill another holder. A child forked
# while another thread held the lock gets a fresh one.
_CREATE = threading.RLock()


def _fresh_lock() -> None:
    global _CREATE
    _CREATE = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock)


class PerProcess(Generic[T]):
    """A lazily created value owned by one process (see the module docstring)."""

    def __init__(self, factory: Callable[[], T], closer: Callable[[T], None] | None = None, *,
                 inherited: Callable[[T], None] | None = None) -> None:
        self._factory, self._closer, self._inherited = factory, closer, inherited
        self._value: T | None = None
        self._owner: int | None = None

    def get(self) -> T:
        """This process's value, created now if it has none yet."""
        pid = os.getpid()
        if self._owner == pid:
            return self._value  # type: ignore[return-value]
        with _CREATE:
            if self._owner == pid:  # another thread created it meanwhile
                return self._value  # type: ignore[return-value]
            return self._create(pid)

    def _create(self, pid: int) -> T:
        old, had_old = self._value, self._owner is not None
        self._value, self._owner = None, None  # a failing factory leaves the holder empty
        if had_old and self._inherited is not None:
            self._inherited(old)  # type: ignore[arg-type]
        value = self._factory()
        self._value, self._owner = value, pid
        return value

    def peek(self) -> T | None:
        """This process's value if it has created one, else None (creates nothing)."""
        return self._value if self._owner == os.getpid() else None

    @property
    def owner(self) -> int | None:
        """Pid of the process that created the value held now (None when empty)."""
        return self._owner

    def close(self) -> None:
        """Close the value if this process created it; forget it either way (idempotent)."""
        value, mine = self._value, self._owner == os.getpid()
        self._value, self._owner = None, None
        if mine and self._closer is not None:
            self._closer(value)  # type: ignore[arg-type]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_value"], state["_owner"] = None, None
        return state

    def __repr__(self) -> str:
        held = "empty" if self._owner is None else f"held by pid {self._owner}"
        return f"PerProcess({getattr(self._factory, '__name__', self._factory)!r}, {held})"
