"""The one process pool of every prepare stage: folder packs, ``s3://`` sources, imports, convert.

:func:`ordered_map` runs ``fn(item)`` for each item in forked worker
processes and yields the results **in item order**, so the output does not
depend on the worker count. Nothing is pickled but items and results: the
workers are forked with ``fn`` (a closure is fine).

Bounded window. Items are taken from the source only while the window has
room: at most ``max_items`` taken and not yet consumed, and at most
about ``max_bytes`` of them (the items' own weight while they are out, the
results' once back, and for results still out the mean size of those seen so
far). The producer waits for its consumer, whatever the core count.

Stopping. Workers ignore SIGINT (Ctrl-C is the main process's), die quietly
on SIGTERM and SIGPIPE, and are SIGKILLed by the kernel when the main process
dies (Linux). When the consumer stops early -- an error, Ctrl-C, SIGTERM, a
closed iterator -- the workers are SIGKILLed and reaped at once: they only
read sources and compute, they never write output, so nothing is left
half-written (the pack's journal keeps it resumable).

Dead workers. A worker that ends while the stage still needs it (SIGKILL from
the out-of-memory killer, a crash in a C library) raises :class:`WorkerDied`
at once, naming the item it was preparing (``describe``) and how it ended.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, Generic, Iterable, Iterator, NoReturn, TypeVar

from packer.errors import PackError

__all__ = ["ordered_map", "WorkerPool", "WorkerDied", "init_worker", "CHUNK", "MAX_BYTES", "MAX_ITEMS"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

CHUNK = 16  #: items per message to a worker (one message per image costs more than preparing a small one)
MAX_BYTES = 256 << 20  #: the window's byte bound, whatever the core count
MAX_ITEMS = 8192  #: the window's count bound (each item also costs Python objects)
_DEPTH = 2  # chunks at a worker at once: one being prepared, the next waiting in its queue
_STOP_S = 10.0  # a finished stage waits this long for idle workers to exit before killing them
_STOPPING = {signal.SIGINT, signal.SIGTERM}
_GRACE_S = 0.5  # a worker killed by SIGTERM/SIGINT: the time the main process's own handler has to fire


class WorkerDied(PackError):
    """A worker process ended while the stage still needed it."""


def init_worker(parent: int | None) -> None:
    """The initializer of every pool worker: signals, and death with the parent (``parent``: its pid)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a process-group SIGTERM: quietly, no traceback
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # parent gone: die quietly, no BrokenPipeError traceback
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPPING)  # blocked by the parent while it forked us
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the kernel kills us when the parent dies
    except (OSError, AttributeError):  # not Linux: the closed pipe from the parent still ends the worker
        return
    if parent is not None and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _serve(fn: Callable[[Any], Any], tasks: Any, results: Any, slot: memoryview, number: int,
           parent: int, inherited: list[Any]) -> None:
    """A worker's life: take chunks ``(numbers, items)``, send back ``(numbers[0], [(ok, result), ...])``.

    A thread drains the task pipe into a local queue, so the main process never blocks
    sending a chunk while this process blocks sending a result. Before each item, its
    number goes into ``slot[number]``: the main process names it if this process dies.
    """
    init_worker(parent)
    for conn in inherited:  # the main process's ends (ours and the other workers'): EOF must mean EOF
        conn.close()
    todo: queue.SimpleQueue = queue.SimpleQueue()

    def drain() -> None:
        try:
            while (msg := tasks.recv()) is not None:
                todo.put(msg)
        except (EOFError, OSError):
            pass
        todo.put(None)

    threading.Thread(target=drain, name="pool-tasks", daemon=True).start()
    while (msg := todo.get()) is not None:
        numbers, items = msg
        out = []
        for k, item in zip(numbers, items):
            slot[number] = k
            try:
                out.append((True, fn(item)))
            except Exception as exc:  # noqa: BLE001 - raised in the main process, at this item's turn
                out.append((False, exc))
        slot[number] = -1  # dying from here on, it dies holding the chunk, not one item
        try:
            results.send((numbers[0], out))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # an unpicklable error
            results.send((numbers[0], [(ok, value if ok else RuntimeError(f"{type(value).__name__}: {value}"))
                                  for ok, value in out]))
            log.debug("an unpicklable result was replaced: %s", exc)


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[[Any], Any], slot: memoryview, number: int,
                 inherited: list[Any]) -> None:
        tasks_r, self.tasks = ctx.Pipe(duplex=False)
        self.results, results_w = ctx.Pipe(duplex=False)
        self.number = number
        self.out: deque[list[int]] = deque()  # the item numbers of each chunk sent and not answered
        self.proc = ctx.Process(target=_serve, name=f"pack-worker-{number}", daemon=True,
                                args=(fn, tasks_r, results_w, slot, number, os.getpid(),
                                      [*inherited, self.tasks, self.results]))
        self.proc.start()
        tasks_r.close()
        results_w.close()

    def conns(self) -> list[Any]:
        return [self.tasks, self.results]


class WorkerPool(Generic[T, R]):
    """``workers`` forked processes running ``fn``; :meth:`map` yields results in order. A context
    manager: leaving it stops the workers (SIGKILL unless every result was taken)."""

    def __init__(self, fn: Callable[[T], R], workers: int, *, chunk: int = CHUNK, max_items: int | None = None,
                 max_bytes: int = MAX_BYTES, weight: Callable[[T], int] | None = None,
                 result_weight: Callable[[R], int] | None = None,
                 describe: Callable[[int], str] | None = None) -> None:
        if workers < 1 or chunk < 1:
            raise ValueError(f"a pool needs workers >= 1 and chunk >= 1 (got {workers}, {chunk})")
        self.chunk = chunk
        self.max_items = max(chunk, max_items if max_items is not None else min(MAX_ITEMS, 4 * chunk * workers))
        self.max_bytes = max_bytes
        self.weight, self.result_weight = weight, result_weight
        self.describe = describe or (lambda n: f"item {n} of this stage")
        self.in_flight = 0  # items taken from the source and not yet yielded
        self.in_flight_bytes = 0  # their weight, as the window counts it
        self.peak_in_flight = 0
        self.peak_in_flight_bytes = 0
        self._completed = False
        self._slots = mmap.mmap(-1, 8 * workers)  # shared with the forked workers: what each one prepares
        self._slot = memoryview(self._slots).cast("q")
        for k in range(workers):
            self._slot[k] = -1
        self._workers: list[_Worker] = []
        ctx = multiprocessing.get_context("fork")
        # Ctrl-C or SIGTERM while forking would raise in the fork's at-fork hooks, which swallow it:
        # held back until the workers are started, then handled as anywhere else.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)
        try:
            for k in range(workers):
                self._workers.append(_Worker(ctx, fn, self._slot, k,
                                             [c for w in self._workers for c in w.conns()]))
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self._by_conn = {w.results: w for w in self._workers}
        self._by_sentinel = {w.proc.sentinel: w for w in self._workers}
        self._waitables = [*self._by_conn, *self._by_sentinel]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the ordered map
    def map(self, items: Iterable[T], inline: Callable[[T], R | None] | None = None) -> Iterator[R]:
        """``fn(item)`` for each item, in order. ``inline(item)`` may give a result here (no worker
        needed) or None. An exception ``fn`` raised is raised here at its item's turn."""
        source = iter(items)
        self._done: dict[int, tuple[bool, Any, int]] = {}  # number -> (ok, result or error, weight)
        self._weights: dict[int, int] = {}  # number -> weight of an item not answered yet
        self._out_bytes = self._done_bytes = 0  # sum of the weights in _weights, in _done
        self._seen_bytes = self._seen = 0  # results answered so far: their total weight and count
        self._chunk: list[T] = []
        self._numbers: list[int] = []  # the chunk's item numbers (not contiguous when some were inline)
        taken = head = 0
        exhausted = False
        while True:
            while not exhausted and self._room(taken - head):
                if len(self._chunk) >= self.chunk and not self._send():
                    break
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                done = inline(item) if inline is not None else None
                if done is not None:
                    self._add_done(taken, True, done)
                else:
                    self._chunk.append(item)
                    self._numbers.append(taken)
                    weight = self.weight(item) if self.weight is not None else 0
                    self._weights[taken] = weight
                    self._out_bytes += weight
                taken += 1
                self._count(taken - head)
            if self._chunk:
                self._send()
            if head not in self._done or head % self.chunk == 0:
                self._receive(timeout=0)  # keep the workers busy while the consumer takes results
            if head in self._done:
                ok, value, weight = self._done.pop(head)
                self._done_bytes -= weight
                head += 1
                self._count(taken - head)
                if not ok:
                    raise value
                yield value
                continue
            if exhausted and head == taken:
                break
            self._receive(timeout=None)
        self._completed = True

    def _add_done(self, number: int, ok: bool, value: Any) -> None:
        weight = self.result_weight(value) if ok and self.result_weight is not None else 0
        self._done[number] = (ok, value, weight)
        self._done_bytes += weight

    def _count(self, in_flight: int) -> None:
        """The window's state after an item was taken or yielded: ``in_flight`` items out."""
        mean = self._seen_bytes / self._seen if self._seen else 0.0
        weight = self._out_bytes + int(mean * len(self._weights)) + self._done_bytes
        self.in_flight, self.in_flight_bytes = in_flight, weight
        self.peak_in_flight = max(self.peak_in_flight, in_flight)
        self.peak_in_flight_bytes = max(self.peak_in_flight_bytes, weight)

    def _room(self, in_flight: int) -> bool:
        return in_flight == 0 or (in_flight < self.max_items and self.in_flight_bytes < self.max_bytes)

    def _send(self) -> bool:
        """Send the gathered chunk to the least busy worker with room; False when none has room."""
        worker = min(self._workers, key=lambda w: len(w.out))
        if len(worker.out) >= _DEPTH:
            return False
        worker.out.append(self._numbers)
        try:
            worker.tasks.send((self._numbers, self._chunk))
        except OSError:  # its end of the pipe is gone: it died
            self._died(worker)
        self._chunk, self._numbers = [], []
        return True

    def _receive(self, timeout: float | None) -> None:
        """Take the answers that are in (waiting up to ``timeout``); a worker that ended raises."""
        for ready in wait(self._waitables, timeout):
            worker = self._by_conn.get(ready)
            if worker is None:
                self._died(self._by_sentinel[ready])
            try:
                first, out = worker.results.recv()
            except (EOFError, OSError):
                self._died(worker)
            numbers = worker.out.popleft()
            if (numbers[0], len(numbers)) != (first, len(out)):
                raise PackError(f"internal error: worker {worker.number} answered items {first}+{len(out)}, "
                                f"expected {numbers[0]}+{len(numbers)}")
            for number, (ok, value) in zip(numbers, out):
                self._out_bytes -= self._weights.pop(number)
                self._add_done(number, ok, value)
                self._seen_bytes += self._done[number][2]
                self._seen += 1
            self._count(self.in_flight)

    def _died(self, worker: _Worker) -> NoReturn:
        proc = worker.proc
        proc.join(_GRACE_S)
        code = proc.exitcode
        if code is not None and -code in (signal.SIGTERM, signal.SIGINT):
            time.sleep(_GRACE_S)  # a process-group signal: this process's own handler stops the pack
        if code is None or code >= 0:
            how = f"exited with code {code}" if code is not None else "closed its pipe"
        else:
            how = f"was killed by {signal.Signals(-code).name}"
            if -code == signal.SIGKILL:
                how += " (the out-of-memory killer does this)"
        current = self._slot[worker.number]
        if current < 0 and worker.out:
            current = worker.out[0][0]  # between two items: the next one it had
        what = f"while preparing {self.describe(current)}" if current >= 0 else "while idle"
        raise WorkerDied(f"worker process {proc.pid} {how} {what}; re-run with --resume")

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stop the workers and release everything; idempotent. Workers still needed are SIGKILLed."""
        workers, self._workers = self._workers, []
        if self._completed:
            for w in workers:
                try:
                    w.tasks.send(None)
                except OSError:
                    pass
        else:
            for w in workers:
                _kill(w.proc)
        deadline = time.monotonic() + (_STOP_S if self._completed else 5.0)
        for w in workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.exitcode is None:
                log.warning("pool worker %d did not exit; killing it", w.proc.pid)
                _kill(w.proc)
                w.proc.join()
            w.proc.close()
            w.tasks.close()
            w.results.close()
        if getattr(self, "_slot", None) is not None:
            self._slot.release()
            self._slot = None  # type: ignore[assignment]
            self._slots.close()


def _kill(proc: Any) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except (OSError, TypeError):  # gone already (or never started)
        pass


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int, *,
                inline: Callable[[T], R | None] | None = None, **window: Any) -> Iterator[R]:
    """``fn(item)`` for each item, in order, in a :class:`WorkerPool` of ``workers`` (in this process,
    lazily, when ``workers <= 1``). ``window``: :class:`WorkerPool`'s keywords (chunk, max_items,
    max_bytes, weight, result_weight, describe). Closing the iterator stops the workers at once."""
    if workers <= 1:
        for item in items:
            done = inline(item) if inline is not None else None
            yield done if done is not None else fn(item)
        return
    with WorkerPool(fn, workers, **window) as pool:
        yield from pool.map(items, inline)
