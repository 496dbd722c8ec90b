"""Reusable shared-memory slots for batches of encoded bytes (``decode=False``).

Sending a batch of ~100 KB samples from a loader worker costs either a
pickle through a pipe (two copies, and the main process re-parses every
``bytes``) or a fresh shared-memory tensor per batch. A fresh segment means
fresh pages, and first-touch page faults dominate: measured on this
project's 2-core VM, 14 ms to allocate and fill a 6 MB shared tensor against
0.2 ms to refill a reused buffer.

So each worker keeps one segment in ``/dev/shm`` with a few fixed slots and
reuses them::

    +--------------------------+----------------+----------------+-----+
    | header: 1 flag per slot  | slot 0         | slot 1         | ... |
    | (0 free, 1 in flight)    | capacity bytes | capacity bytes |     |
    +--------------------------+----------------+----------------+-----+

The worker writes a batch into a free slot, marks it in flight and sends
only (segment name, slot, offsets) through the loader's queue. When the
main process unpickles that message it copies the slot into an ordinary
array (heap memory that malloc reuses: no page faults), marks the slot free
and hands out the copy, so no user-visible tensor ever aliases a slot.

No name outlives its users. The segment is an anonymous ``memfd_create``
file: it never appears in ``/dev/shm``; the main process maps it through
``/proc/<worker pid>/fd/<n>`` while the worker is alive, and the kernel frees
it once both have unmapped it or died, however they die (a training loop that
raises, Ctrl-C, SIGKILL). Where ``memfd_create`` is missing, a named file in
``/dev/shm`` is used instead and unlinked as soon as the main process has
mapped it (a worker killed before that leaves it behind). The main process
unmaps the segments of workers that have exited (when it attaches a new
segment, and at the start of every epoch), so finished loaders leave no
memory behind.
"""

from __future__ import annotations

import mmap
import multiprocessing.util
import os
import time
from typing import Sequence

import numpy as np

from readers.batch import ByteBatch, new_byte_batch  # ByteBatch re-exported: it was defined here
from readers.perprocess import PerProcess

__all__ = ["ByteBatch", "ShmSlots", "available", "release_dead"]

HEADER = 64  # bytes: one flag per slot, at most 64 slots
_SHM_DIR = "/dev/shm"
#: Main process: segment name -> its mapping (the segments of live workers; see release_dead).
ATTACHED: dict[str, mmap.mmap] = {}


def available() -> bool:
    return os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK)


def _open_segment(name: str, fd: int) -> int:
    """Open the worker's segment: its memfd through /proc, or the named /dev/shm file."""
    if fd >= 0:
        return os.open(f"/proc/{pid_of(name)}/fd/{fd}", os.O_RDWR)
    path = os.path.join(_SHM_DIR, name)
    opened = os.open(path, os.O_RDWR)
    os.unlink(path)  # both sides have it open; the name is no longer needed
    return opened


def _rebuild(name: str, fd: int, slot: int, capacity: int, offsets: np.ndarray, rest: tuple) -> tuple:
    """Runs in the receiving process: copy the slot out, free it, return a plain batch."""
    mm = ATTACHED.get(name)
    if mm is None:
        for old in [n for n in ATTACHED if n.rsplit("-", 1)[0] == name.rsplit("-", 1)[0]]:
            ATTACHED.pop(old).close()  # the worker moved to a bigger segment
        release_dead()
        opened = _open_segment(name, fd)
        try:
            mm = ATTACHED[name] = mmap.mmap(opened, HEADER + capacity * _slots_of(opened, capacity))
        finally:
            os.close(opened)
    total = int(offsets[-1])
    start = HEADER + slot * capacity
    batch, data = new_byte_batch(offsets, _private)
    data[:] = np.frombuffer(mm, dtype=np.uint8, count=total, offset=start)
    mm[slot] = 0  # free the slot for the worker
    return (batch, *rest)


def _private(nbytes: int) -> np.ndarray:
    """A fresh buffer the received batch owns (the slot is reused by the worker right after)."""
    return np.empty(nbytes, dtype=np.uint8)


def pid_of(name: str) -> int:
    """The pid of the worker that owns the segment ``name``."""
    return int(name.split("-")[2])  # dataset-packer-<pid>-<id>-<generation>


def release_dead() -> int:
    """Unmap the segments of workers that have exited (a finished loader's); return how many."""
    dead = []
    for name in ATTACHED:
        try:
            os.kill(pid_of(name), 0)
        except ProcessLookupError:
            dead.append(name)
        except PermissionError:
            pass
    for name in dead:
        ATTACHED.pop(name).close()
    return len(dead)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _slots_of(fd: int, capacity: int) -> int:
    return (os.fstat(fd).st_size - HEADER) // capacity


def _create_memfd(name: str) -> int | None:
    """An anonymous shared file (no name anywhere), if this system has memfd and /proc."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except OSError:
        return None
    if not os.path.exists(f"/proc/{os.getpid()}/fd/{fd}"):  # no /proc: the main process could not open it
        os.close(fd)
        return None
    return fd


def _create_named(name: str) -> int:
    path = os.path.join(_SHM_DIR, name)
    # Normally the main process unlinks the name once it has opened it; if it never gets
    # that far, this worker removes the file when it exits normally.
    multiprocessing.util.Finalize(None, _unlink_quietly, args=(path,), exitpriority=10)
    return os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)


class _InSlot:
    """What crosses the queue: a reference to a filled slot (rebuilt by ``_rebuild``)."""

    def __init__(self, name: str, fd: int, slot: int, capacity: int, offsets: np.ndarray, rest: tuple) -> None:
        self.args = (name, fd, slot, capacity, offsets, rest)

    def __reduce__(self) -> tuple:
        return _rebuild, self.args


class _Segment:
    """One worker's segment: its mapping, name, slot capacity, next slot, generation."""

    def __init__(self) -> None:
        self.mm: mmap.mmap | None = None
        self.name, self.capacity, self.next, self.gen = "", 0, 0, 0
        self.fd = -1  # the memfd (kept open: the main process opens it through /proc), or -1
        self.retired: list = []  # (mapping, fd) of replaced segments that still had batches in flight

    def __del__(self) -> None:
        """Close this process's mapping and memfd (in a forked copy: the copy's descriptors only)."""
        for mm, fd in self.retired + [(self.mm, self.fd)]:
            if mm is not None:
                mm.close()
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


class ShmSlots:
    """Per-worker ring of ``slots`` reusable shared-memory slots. Picklable (state is per process)."""

    def __init__(self, slots: int = 4, wait_s: float = 5.0) -> None:
        if not 1 <= slots <= HEADER:
            raise ValueError(f"slots must be in 1..{HEADER}, got {slots}")
        self.slots, self.wait_s = slots, wait_s
        # A forked or unpickled copy starts without a segment (the inherited mapping is left alone).
        self._local: PerProcess[_Segment] = PerProcess(_Segment)

    def _segment(self, need: int) -> _Segment:
        seg = self._local.get()
        if seg.mm is not None and need <= seg.capacity:
            return seg
        if seg.mm is not None:
            self._retire(seg)
        seg.gen += 1
        seg.capacity = max(need * 2, 8 << 20)
        seg.name = f"dataset-packer-{os.getpid()}-{id(self):x}-{seg.gen}"
        size = HEADER + seg.capacity * self.slots
        fd, seg.fd = _create_memfd(seg.name), -1
        if fd is None:
            fd = _create_named(seg.name)
        else:
            seg.fd = fd
        try:
            os.ftruncate(fd, size)
            seg.mm = mmap.mmap(fd, size)
        finally:
            if seg.fd != fd:
                os.close(fd)
        seg.next = 0
        return seg

    def _retire(self, seg: _Segment) -> None:
        """Drop the segment a bigger one replaces, once the main process has copied out every
        batch in it (a memfd must stay open until the main process has opened it)."""
        mm, deadline = seg.mm, time.monotonic() + self.wait_s
        assert mm is not None
        while any(mm[k] for k in range(self.slots)) and time.monotonic() < deadline:
            time.sleep(0.0005)
        if any(mm[k] for k in range(self.slots)):
            seg.retired.append((mm, seg.fd))  # still in flight: kept until this worker exits
        else:
            mm.close()
            if seg.fd >= 0:
                os.close(seg.fd)
        seg.mm, seg.fd = None, -1

    def pack(self, items: Sequence[bytes], rest: tuple) -> _InSlot | None:
        """Write ``items`` into a free slot; None when no slot freed up in time."""
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in items], out=offsets[1:])
        seg = self._segment(int(offsets[-1]))
        mm, slot = seg.mm, seg.next
        deadline = time.monotonic() + self.wait_s
        while mm[slot] != 0:  # the main process has not copied this slot out yet
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0002)
        start = HEADER + slot * seg.capacity
        for k, b in enumerate(items):
            mm[start + offsets[k]:start + offsets[k + 1]] = b
        mm[slot] = 1
        seg.next = (slot + 1) % self.slots
        return _InSlot(seg.name, seg.fd, slot, seg.capacity, offsets, rest)
