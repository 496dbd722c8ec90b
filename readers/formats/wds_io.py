"""Where ``ShardDataset`` gets its bytes: local shard files, a remote store, or a node cache.

``ShardDataset`` decides the ORDER (``readers.order.epoch``: which samples each
rank and worker reads, interleaved and shuffled how, resumed where); the
classes here only fetch the bytes of the samples they are given, in the
order given, as ``(index, stored bytes)`` pairs:

* :class:`LocalShards` -- ``pread`` per sample from the shard files; any order.
* :class:`CachedShards` -- remote shards fetched whole into a
  :class:`~readers.remote.cache.NodeCache` ahead of their first use (a
  background thread, ``depth`` shards ahead), pinned from their first to
  their last use, then ``pread`` as locally; any order.
* :class:`StreamedShards` -- remote shards read without a local copy. The
  samples each shard must give are taken in file order and grouped into range
  requests of about ``chunk_size`` bytes (tar header + data of each, the gaps
  between neighbours read along); requests are issued in the order their
  first sample is needed, ``readahead`` ahead in background threads, so a
  worker never waits on a round trip between shards. When a request arrives
  its samples are cut out (and checked) at once and kept until their turn:
  with the order's interleaving and shuffle buffer that is about
  ``buffer_size`` samples plus the requests in flight.

Every sample's tar header is checked (name, size, header checksum); streamed
samples also have their CRC-32 checked as they arrive. A shard whose cached
download fails its CRC-32 is read again to name the damaged sample.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from typing import Any, Callable, Generator, Iterable

import numpy as np

from readers.contract import spec
from readers.order.epoch import as_ints

__all__ = ["LocalShards", "CachedShards", "StreamedShards", "shard_io", "check_sample", "parse_header",
           "STREAM_CHUNK", "STREAM_READAHEAD", "CACHE_DEPTH"]

BLOCK = spec.TAR_BLOCK
#: Streaming: bytes per range request, requests in flight beyond the one being consumed,
#: largest gap (tar padding + the .cls member) bridged inside one request.
STREAM_CHUNK = 16 << 20
STREAM_READAHEAD = 2
STREAM_MAX_GAP = 64 << 10
#: Cache: shards fetched ahead of the one being read.
CACHE_DEPTH = 2
#: At most this many shard files open at once (local reads in a shuffled order).
MAX_OPEN = 4


def _octal(field: bytes) -> int:
    try:
        return int(field.strip(b"\0 ") or b"0", 8)
    except ValueError:
        return -1


def parse_header(header: bytes) -> tuple[bytes, int] | None:
    """``(member name, data size)`` of a 512-byte ustar header, or None when its checksum (byte
    sum, checksum field read as spaces) or size field is damaged."""
    size = _octal(header[124:136])
    if size < 0 or _octal(header[148:156]) != sum(header[:148]) + 256 + sum(header[156:]):
        return None
    return bytes(header[:100]).rstrip(b"\0"), size


def check_sample(blob: bytes | memoryview, i: int, size: int, where: Callable[[], str], named: bool = True) -> bytes:
    """The data of sample ``i`` from ``blob`` = its 512-byte tar header + data, after checking the header.

    The member name must be this sample's key (``named``; not for shards indexed in place, whose
    keys are another tool's), the size field must match and
    the header checksum (byte sum, checksum field read as spaces) must hold.
    ``where()`` names the shard and byte for the error (called only then).
    """
    if len(blob) != BLOCK + size:
        raise spec.DatasetFormatError(f"{where()}: shard ends early (sample {i}): truncated or damaged")
    view = memoryview(blob)
    header = bytes(view[:BLOCK])  # summed below: bytes iterate several times faster than a memoryview
    key = (spec.wds_key(i) + ".").encode() if named else b""
    if ((named and header[:len(key)] != key) or _octal(header[124:136]) != size
            or _octal(header[148:156]) != sum(header[:148]) + 256 + sum(header[156:])):
        raise spec.DatasetFormatError(
            f"{where()}: tar header is not sample {i} ({size} bytes) "
            f"but {header[:100].rstrip(bytes(1))!r}: the shard is damaged or does not match its index")
    return bytes(view[BLOCK:])


def _index_array(indices: Iterable[int]) -> np.ndarray:
    """Sample indices as an int64 array (an array as it is, without a copy when it is int64)."""
    if isinstance(indices, np.ndarray):
        return np.asarray(indices, dtype=np.int64)
    return np.fromiter(indices, dtype=np.int64)


class _Arrays:
    """The index arrays every reader below uses (views, shared with the dataset)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        arrays = ds.index.arrays
        self.shard_of, self.offsets, self.sizes = arrays["shards"], arrays["offsets"], arrays["sizes"]
        self.checksums = arrays["checksums"]
        self.names: list[str] = ds.shard_names
        self.named = getattr(ds, "inplace", None) is None  # tar member names are our keys

    def where(self, shard: int, offset: int) -> Callable[[], str]:
        """For messages: the shard and the byte of sample data at ``offset`` (built only when needed)."""
        return lambda: f"{self.ds.shard_location(shard)} at byte {offset - BLOCK}"

    def pread(self, fd: int, shard: int, i: int) -> bytes:
        offset, size = int(self.offsets[i]), int(self.sizes[i])
        where = self.where(shard, offset)
        blob = spec.read_range(fd, offset - BLOCK, BLOCK + size,
                               lambda: f"{where()}: shard ends early (sample {i}): truncated or damaged")
        return check_sample(blob, i, size, where, self.named)


class LocalShards(_Arrays):
    """Shard files on a local disk: one ``pread`` per sample, any order, ``keep`` files open at most."""

    def __init__(self, ds: Any, keep: int = MAX_OPEN) -> None:
        super().__init__(ds)
        self.keep = max(1, keep)

    def samples(self, indices: Iterable[int]) -> Generator[tuple[int, bytes], None, None]:
        fds: dict[int, int] = {}  # shard -> open descriptor, least recently used first
        try:
            for i in as_ints(indices) if isinstance(indices, np.ndarray) else indices:
                shard = int(self.shard_of[i])
                fd = fds.pop(shard, None)
                if fd is None:
                    if len(fds) >= self.keep:
                        os.close(fds.pop(next(iter(fds))))
                    fd = self.ds.open_shard(shard)  # regular, inside the folder, never blocking
                fds[shard] = fd
                yield i, self.ds.read_from(fd, shard, i)  # the dataset's own read (tests count it)
        finally:
            for fd in fds.values():
                os.close(fd)


class CachedShards(_Arrays):
    """Remote shards through the node cache: fetched ahead, pinned while used, read with ``pread``."""

    def __init__(self, ds: Any, depth: int = CACHE_DEPTH) -> None:
        super().__init__(ds)
        self.files, self.depth = ds.shard_remote, max(0, depth)

    def samples(self, indices: Iterable[int]) -> Generator[tuple[int, bytes], None, None]:
        seq = _index_array(indices)
        if len(seq) == 0:
            return
        shards = self.shard_of[seq]
        uniq, first = np.unique(shards, return_index=True)
        order = [int(s) for s in uniq[np.argsort(first)]]  # shards by first use
        _, last_rev = np.unique(shards[::-1], return_index=True)
        last = dict(zip((int(s) for s in uniq), (len(seq) - 1 - last_rev).tolist()))
        rank = {s: k for k, s in enumerate(order)}
        futures: dict[int, cf.Future] = {}
        opened: dict[int, tuple[Any, int]] = {}
        pool = cf.ThreadPoolExecutor(max_workers=max(1, self.depth), thread_name_prefix="shard-prefetch")
        try:
            for p, i in enumerate(as_ints(seq)):
                s = int(shards[p])
                if s not in opened:
                    for t in order[rank[s]:rank[s] + self.depth + 1]:
                        if t not in futures:
                            futures[t] = pool.submit(self.files.fetch, self.names[t])
                    opened[s] = self._open(s, futures.pop(s))
                yield i, self.pread(opened[s][1], s, i)
                if last[s] == p:
                    pin, fd = opened.pop(s)
                    os.close(fd)
                    pin.release()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for pin, fd in opened.values():
                os.close(fd)
                pin.release()

    def _open(self, shard: int, fetched: cf.Future) -> tuple[Any, int]:
        from readers.remote.errors import RemoteIntegrityError

        name = self.names[shard]
        try:
            fetched.result()
            pin = self.files.cache().pin(self.files.store, name, size=self.files.sizes.get(name),
                                         crc32=self.files.crcs.get(name))
        except RemoteIntegrityError as exc:
            raise _diagnose(self, shard, exc) from exc
        try:
            return pin, spec.open_regular(pin.path, "shard file")
        except BaseException:
            pin.release()
            raise


def _diagnose(arrays: _Arrays, shard: int, exc: Exception) -> Exception:
    """After a shard's download failed its CRC-32: read it again by ranges to name the first bad sample."""
    from readers.remote.errors import RemoteError, RemoteIntegrityError

    first = int(np.searchsorted(arrays.shard_of, shard, side="left"))
    stop = int(np.searchsorted(arrays.shard_of, shard, side="right"))
    try:
        for _ in StreamedShards(arrays.ds).samples(range(first, stop)):
            pass
    except (RemoteIntegrityError, spec.DatasetFormatError) as found:
        return found
    except RemoteError:
        return exc
    return RemoteIntegrityError(f"{exc}; every sample's checksum matches, so the damage lies outside the "
                                "image data (tar headers or padding)")


class StreamedShards(_Arrays):
    """Remote shards streamed with large range requests, no local copy; samples' CRC-32 checked."""

    def __init__(self, ds: Any, chunk_size: int = STREAM_CHUNK, readahead: int = STREAM_READAHEAD,
                 max_gap: int = STREAM_MAX_GAP) -> None:
        super().__init__(ds)
        self.files = ds.shard_remote  # its read_range: the store's (in place: the shard's identity checked first)
        self.chunk_size, self.readahead, self.max_gap = chunk_size, max(0, readahead), max_gap

    def plan(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Group the positions of ``seq`` into range requests.

        Returns ``(req_of_pos, req_shard, req_start, req_end)``, requests
        numbered in the order their first sample is needed. Each shard's
        positions are taken in file order; a request continues while the next
        span starts at most ``max_gap`` after the previous one ends and the
        request stays under about ``chunk_size`` bytes.
        """
        shard = self.shard_of[seq].astype(np.int64)
        start = self.offsets[seq] - BLOCK
        end = self.offsets[seq] + self.sizes[seq]
        by = np.lexsort((np.arange(len(seq)), start, shard))  # by shard, then file position, then need
        sh, st, en = shard[by], start[by], end[by]
        new_run = np.ones(len(by), dtype=bool)
        # A run continues while the same shard's next span starts at most max_gap after the previous ends.
        new_run[1:] = (sh[1:] != sh[:-1]) | (st[1:] < en[:-1]) | (st[1:] > en[:-1] + self.max_gap)
        run = np.cumsum(new_run) - 1
        piece = (st - st[new_run][run]) // max(1, self.chunk_size)  # long runs: ~chunk_size requests
        new_req = new_run.copy()
        new_req[1:] |= piece[1:] != piece[:-1]
        req_sorted = np.cumsum(new_req) - 1
        n_req = int(req_sorted[-1]) + 1
        first_pos = np.full(n_req, len(seq), dtype=np.int64)
        np.minimum.at(first_pos, req_sorted, by)
        renumber = np.empty(n_req, dtype=np.int64)
        renumber[np.argsort(first_pos, kind="stable")] = np.arange(n_req)
        req_ids = renumber[req_sorted]
        req_of_pos = np.empty(len(seq), dtype=np.int64)
        req_of_pos[by] = req_ids
        req_shard = np.empty(n_req, dtype=np.int64)
        req_shard[req_ids] = sh
        req_start = np.full(n_req, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(req_start, req_ids, st)
        req_end = np.zeros(n_req, dtype=np.int64)
        np.maximum.at(req_end, req_ids, en)
        return req_of_pos, req_shard, req_start, req_end

    def samples(self, indices: Iterable[int]) -> Generator[tuple[int, bytes], None, None]:
        seq = _index_array(indices)
        if len(seq) == 0:
            return
        req_of_pos, req_shard, req_start, req_end = self.plan(seq)
        members = np.argsort(req_of_pos, kind="stable")  # positions of each request, in need order
        bounds = np.searchsorted(req_of_pos[members], np.arange(len(req_shard) + 1))
        ready: dict[int, bytes] = {}  # position -> sample bytes, cut from a request that arrived
        pending: dict[int, cf.Future] = {}
        submitted = 0
        pool = cf.ThreadPoolExecutor(max_workers=self.readahead + 1, thread_name_prefix="shard-stream")

        def fetch(r: int) -> memoryview:
            name = self.names[int(req_shard[r])]
            return memoryview(self.files.read_range(name, int(req_start[r]), int(req_end[r] - req_start[r])))

        try:
            for p, i in enumerate(as_ints(seq)):
                if p not in ready:
                    r = int(req_of_pos[p])
                    while submitted < len(req_shard) and submitted <= r + self.readahead:
                        pending[submitted] = pool.submit(fetch, submitted)
                        submitted += 1
                    data = pending.pop(r).result()
                    for q in members[bounds[r]:bounds[r + 1]].tolist():
                        ready[q] = self._cut(data, int(req_shard[r]), int(req_start[r]), int(seq[q]))
                    del data  # the request's buffer goes; its samples stay until their turn
                yield i, ready.pop(p)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _cut(self, data: memoryview, shard: int, req_start: int, i: int) -> bytes:
        offset, size = int(self.offsets[i]), int(self.sizes[i])
        rel = offset - BLOCK - req_start
        sample = check_sample(data[rel:rel + BLOCK + size], i, size, self.where(shard, offset), self.named)
        want, got = int(self.checksums[i]), spec.checksum(sample)  # ISA-L's CRC-32 when installed
        if got != want:
            from readers.remote.errors import RemoteIntegrityError

            raise RemoteIntegrityError(
                f"{self.ds.shard_location(shard)} sample {i} (bytes {offset}..{offset + size}): "
                f"checksum mismatch (CRC-32 {got:08x}, the index says {want:08x}): the shard object is damaged")
        return sample


def shard_io(ds: Any, keep: int = MAX_OPEN) -> LocalShards | CachedShards | StreamedShards:
    """The reader for ``ds``'s shards: local files (``keep`` open at most), the node cache
    (``cache_dir`` given), or streaming."""
    if ds.shard_remote is None:
        return LocalShards(ds, keep)
    if ds.shard_remote.cached:
        return CachedShards(ds)
    return StreamedShards(ds)
