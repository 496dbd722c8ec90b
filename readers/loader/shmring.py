"""Reusable shared-memory slots for whole batches sent by loader worker processes.

Sending a batch of several megabytes from a loader worker costs either a
pickle through a pipe (two copies, and the main process re-parses every
``bytes``) or a fresh shared-memory tensor per batch (what torch does with a
tensor a worker returns). A fresh segment means fresh pages, and first-touch
page faults dominate: measured on this project's 2-core VM, 14 ms to
allocate and fill a 6 MB shared tensor against 0.2 ms to refill a reused
buffer.

So each worker keeps one segment with a few fixed slots and reuses them::

    +--------------------------+----------------+----------------+-----+
    | header: 1 flag per slot  | slot 0         | slot 1         | ... |
    | (0 free, 1 in flight)    | capacity bytes | capacity bytes |     |
    +--------------------------+----------------+----------------+-----+

The worker writes a batch into a free slot -- a batch of encoded bytes
(:meth:`ShmSlots.pack`), or a whole-batch read (``get_batch``) written there
directly (:meth:`ShmSlots.slot`, then :meth:`ShmSlots.send`): ByteBatches,
pixel tensors, decoded images stacked there -- marks it in flight and sends only (segment name,
slot, the layout of the batch's tensors, its small arrays) through the
loader's queue. The main process rebuilds the batch's tensors as views of
the slot (nothing is copied) and the slot is free again once every tensor
over it is gone (a numpy base array's ``__del__``): a training loop that
drops each batch as it takes the next frees its slots as it goes. A
worker that finds no free slot within ``wait_s`` (the caller holds on to
its batches) sends that batch the ordinary way.

No name outlives its users. The segment is an anonymous ``memfd_create``
file: it never appears in ``/dev/shm``; the main process maps it through
``/proc/<worker pid>/fd/<n>`` while the worker is alive, and the kernel frees
it once both have unmapped it or died, however they die (a training loop that
raises, Ctrl-C, SIGKILL). Where ``memfd_create`` is missing, a named file in
``/dev/shm`` is used instead and unlinked as soon as the main process has
mapped it (a worker killed before that leaves it behind). The main process
drops the segments of workers that have exited (when it attaches a new
segment, and at the start of every epoch); a mapping stays until the last
batch over it is gone, so finished loaders leave no memory behind.
"""

from __future__ import annotations

import mmap
import multiprocessing.util
import os
import time
from typing import Any, Sequence

import numpy as np
import torch

from readers.formats.batch import ByteBatch, new_byte_batch  # ByteBatch re-exported: it was defined here
from readers.contract.perprocess import PerProcess

__all__ = ["ByteBatch", "ShmSlots", "Slot", "available", "release_dead"]

HEADER = 64  # bytes: one flag per slot, at most 64 slots
#: Slots at least this big give their pages back while they are free (see :meth:`ShmSlots.slot`).
RELEASE_BYTES = 16 << 20
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


def _close_quietly(mm: mmap.mmap) -> None:
    """Unmap now, or -- while batches handed out are views of it -- when the last of them is gone."""
    try:
        mm.close()
    except BufferError:
        pass  # exported: the views keep the mapping alive and unmap it with their last reference


class _SlotMemory(np.ndarray):
    """The main process's view of one slot: frees the slot when it (and so every tensor over it) is gone."""

    _frees: tuple[mmap.mmap, int]  # set by _rebuild on the base view only (its views read None)

    def __array_finalize__(self, obj: Any) -> None:
        pass  # views of it do not free the slot; they keep this base alive instead

    def __del__(self) -> None:
        freed = getattr(self, "_frees", None)
        if freed is not None:
            mm, slot = freed
            try:
                mm[slot] = 0  # free the slot for the worker
            except ValueError:
                pass  # the mapping was closed: the worker is gone


def _attach(name: str, fd: int, capacity: int) -> mmap.mmap:
    mm = ATTACHED.get(name)
    if mm is None:
        for old in [n for n in ATTACHED if n.rsplit("-", 1)[0] == name.rsplit("-", 1)[0]]:
            _close_quietly(ATTACHED.pop(old))  # the worker moved to a bigger segment
        release_dead()
        opened = _open_segment(name, fd)
        try:
            mm = ATTACHED[name] = mmap.mmap(opened, HEADER + capacity * _slots_of(opened, capacity))
        finally:
            os.close(opened)
    return mm


def _rebuild(name: str, fd: int, slot: int, capacity: int, layout: tuple) -> tuple:
    """Runs in the receiving process: the batch, its tensors views of the slot (freed when they are gone)."""
    mm = _attach(name, fd, capacity)
    memory = np.frombuffer(mm, dtype=np.uint8, count=capacity, offset=HEADER + slot * capacity).view(_SlotMemory)
    memory._frees = (mm, slot)
    base = torch.from_numpy(memory)
    return tuple(_build(base, part) for part in layout)


def _build(base: torch.Tensor, part: tuple) -> Any:
    kind = part[0]
    if kind == "slot":  # a tensor in the slot: its size, stride (elements), byte offset there and dtype
        _, size, stride, offset, dtype = part
        typed = base.view(getattr(torch, dtype))  # the slot's capacity is a multiple of every element size
        return torch.as_strided(typed, size, stride, offset // typed.element_size())
    if kind == "bytes":
        data = _build(base, part[1])  # the bytes, already in the slot: the batch is built over them
        return new_byte_batch(part[2], lambda n: data)[0]
    return torch.from_numpy(part[1])  # "array": a small array sent by value (labels, indices)


def pid_of(name: str) -> int:
    """The pid of the worker that owns the segment ``name``."""
    return int(name.split("-")[2])  # dataset-packer-<pid>-<id>-<generation>


def release_dead() -> int:
    """Drop the segments of workers that have exited (a finished loader's); return how many.
    A mapping that batches still use is unmapped when the last of them is gone."""
    dead = []
    for name in ATTACHED:
        try:
            os.kill(pid_of(name), 0)
        except ProcessLookupError:
            dead.append(name)
        except PermissionError:
            pass
    for name in dead:
        _close_quietly(ATTACHED.pop(name))
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
    """What crosses the queue: a reference to a filled slot and its batch's layout (rebuilt by ``_rebuild``)."""

    def __init__(self, name: str, fd: int, slot: int, capacity: int, layout: tuple) -> None:
        self.args = (name, fd, slot, capacity, layout)

    def __reduce__(self) -> tuple:
        return _rebuild, self.args


class _Segment:
    """One worker's segment: its mapping (and a numpy view of it), name, slot capacity, generation."""

    def __init__(self) -> None:
        self.mm: mmap.mmap | None = None
        self.view: np.ndarray | None = None
        self.name, self.capacity, self.gen = "", 0, 0
        self.fd = -1  # the memfd (kept open: the main process opens it through /proc), or -1
        self.retired: list = []  # (mapping, fd) of replaced segments that still had batches in flight
        self.written: set[int] = set()  # slots this worker wrote whose pages it has not given back

    def __del__(self, _close: Any = os.close) -> None:  # (os.close bound now: this may run at interpreter exit)
        """Close this process's mapping and memfd (in a forked copy: the copy's descriptors only)."""
        self.view = None
        for mm, fd in self.retired + [(self.mm, self.fd)]:
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass  # batches over it keep the mapping alive
            if fd >= 0:
                try:
                    _close(fd)
                except OSError:
                    pass


class Slot:
    """A free slot a batch is written into (from :meth:`ShmSlots.slot`); ``array``: its uint8 memory."""

    def __init__(self, seg: _Segment, index: int, nbytes: int) -> None:
        self.seg, self.index = seg, index
        start = HEADER + index * seg.capacity
        assert seg.view is not None
        self.array = seg.view[start:start + nbytes]
        self.address = seg.view.ctypes.data + start
        self.nbytes = nbytes

    def describe(self, t: torch.Tensor) -> tuple | None:
        """How the main process rebuilds ``t`` from this slot, or None when ``t`` is not a CPU tensor in it."""
        if t.device.type != "cpu" or t.dtype in (torch.bool, torch.complex32) or t.is_quantized:
            return None
        dtype, esize = str(t.dtype).removeprefix("torch."), t.element_size()
        if t.numel() == 0:
            return ("slot", tuple(t.shape), tuple(t.stride()), 0, dtype)
        offset = t.data_ptr() - self.address
        end = offset + esize * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
        if offset < 0 or offset % esize or end > self.nbytes or min(t.stride(), default=1) < 0:
            return None
        return ("slot", tuple(t.shape), tuple(t.stride()), offset, dtype)


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
        seg.capacity = max(need + need // 4, 8 << 20) + 4095 & ~4095  # whole pages: every dtype's alignment
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
        seg.view = np.frombuffer(seg.mm, dtype=np.uint8)
        seg.written = set()
        return seg

    def _retire(self, seg: _Segment) -> None:
        """Drop the segment a bigger one replaces, once the main process is done with every batch
        in it (a memfd must stay open until the main process has opened it)."""
        mm, deadline = seg.mm, time.monotonic() + self.wait_s
        assert mm is not None
        seg.view = None
        while any(mm[k] for k in range(self.slots)) and time.monotonic() < deadline:
            time.sleep(0.0005)
        if any(mm[k] for k in range(self.slots)):
            seg.retired.append((mm, seg.fd))  # still in flight: kept until this worker exits
        else:
            _close_quietly(mm)
            if seg.fd >= 0:
                os.close(seg.fd)
        seg.mm, seg.fd = None, -1

    def slot(self, nbytes: int) -> Slot | None:
        """The first free slot of at least ``nbytes``; None when none freed up within ``wait_s``. Write
        the batch into ``slot.array``, then :meth:`send` it. (The first free one: a slot's pages are
        memory once written, so a worker uses as few slots as batches it has in flight at once.)

        Slots of :data:`RELEASE_BYTES` or more give their pages back while they are free: taking a
        slot gives back those of every other free slot this worker wrote. Its memory then follows the
        batches it has in flight now, as a ``DataLoader`` worker's does, not the most it ever had
        (one batch of 64 float images of 224 x 224 is 38.5 MB). A small slot keeps its pages, which
        the next batch reuses without faulting them in again."""
        seg = self._segment(nbytes)
        mm = seg.mm
        assert mm is not None
        deadline = time.monotonic() + self.wait_s
        while True:
            for index in range(self.slots):
                if mm[index] == 0:  # the main process is done with this slot
                    if seg.capacity >= RELEASE_BYTES:
                        self._give_back(seg, index)
                    seg.written.add(index)
                    return Slot(seg, index, nbytes)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0002)

    @staticmethod
    def _give_back(seg: _Segment, taken: int) -> None:
        """Free the pages of the slots other than ``taken`` that this worker wrote and the main process
        is done with (whole pages inside each: the first page of a slot is shared with what precedes it)."""
        mm = seg.mm
        assert mm is not None
        for index in [k for k in seg.written if k != taken and mm[k] == 0]:
            start = -(-(HEADER + index * seg.capacity) // mmap.PAGESIZE) * mmap.PAGESIZE
            end = (HEADER + (index + 1) * seg.capacity) // mmap.PAGESIZE * mmap.PAGESIZE
            if end > start:
                try:
                    mm.madvise(mmap.MADV_REMOVE, start, end - start)
                except (AttributeError, OSError):  # no MADV_REMOVE here: the pages stay, as before
                    return
            seg.written.discard(index)

    def send(self, slot: Slot, batch: Sequence[Any]) -> _InSlot | None:
        """Mark ``slot`` in flight and describe ``batch`` (a tuple of ByteBatches and tensors in the
        slot, and small tensors or arrays sent by value) for the main process; None (slot left free) when
        a part of it is anything else."""
        layout: list[tuple] = []
        for part in batch:
            if isinstance(part, ByteBatch):
                data = slot.describe(part.data)
                if data is None:
                    return None
                layout.append(("bytes", data, part.offsets.numpy()))
            elif isinstance(part, torch.Tensor) and part.device.type == "cpu":
                inside = slot.describe(part)
                if inside is None and part.numel() * part.element_size() > (1 << 16):
                    return None  # a big tensor outside the slot: sent the ordinary way
                layout.append(inside if inside is not None else ("array", part.numpy().copy()))
            elif isinstance(part, np.ndarray) and part.nbytes <= (1 << 16):
                layout.append(("array", part.copy()))
            else:
                return None
        seg = slot.seg
        assert seg.mm is not None
        seg.mm[slot.index] = 1
        return _InSlot(seg.name, seg.fd, slot.index, seg.capacity, tuple(layout))

    def pack(self, items: Sequence[bytes], rest: tuple) -> _InSlot | None:
        """Write ``items`` into a free slot as a ByteBatch, followed by ``rest`` (small tensors);
        None when no slot freed up in time."""
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in items], out=offsets[1:])
        slot = self.slot(int(offsets[-1]))
        if slot is None:
            return None
        batch, data = new_byte_batch(offsets, lambda n: slot.array[:n])
        out, bounds = data.data, offsets.tolist()  # ndarray.data: its memoryview
        for b, lo, hi in zip(items, bounds, bounds[1:]):
            out[lo:hi] = b
        return self.send(slot, (batch, *rest))
