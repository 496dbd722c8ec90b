"""Per-file columns without a Python object per file: what ``packer.sources.source.Source`` holds.

A list of 1.28M paths, labels and sizes costs 190-380 bytes a file in Python objects (issue 22);
these columns cost the data itself:

* :class:`StringColumn`: strings as one UTF-8 blob and an int64 offsets array;
* :class:`IntColumn`: a numpy integer array read as Python ints.

Both read like sequences (``column[i]``, slices that are views, iteration a chunk at a time,
``==`` against a list) and both take a permutation lazily (:meth:`take`: one int64 a position,
not a second copy). The builders (:class:`StringBuilder`, :class:`IntBuilder`) keep a column in
memory while it is small; past :data:`SPILL_BYTES` it moves to an unlinked temporary file
(``tempfile``'s folder, ``$TMPDIR``) that is memory-mapped read-only once built: file-backed page
cache the kernel can drop and reread, not private memory of the packer. A mapped column holds
one file descriptor until it is garbage collected; nothing is left on disk.
"""

from __future__ import annotations

import array
import mmap
import tempfile
from typing import Any, BinaryIO, Iterable, Iterator, Sequence, overload

import numpy as np

__all__ = ["StringColumn", "StringBuilder", "IntColumn", "IntBuilder", "SPILL_BYTES", "spilled"]

#: entries decoded or gathered per step: bounds the Python objects alive at once
CHUNK = 1 << 14
#: a column being built moves to a temporary file past this many bytes
SPILL_BYTES = 1 << 20


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # a name os.scandir decoded so round-trips


def _mapped(f: BinaryIO) -> np.ndarray:
    """The whole of ``f``, mapped read-only (``f`` is closed: the mapping keeps its own descriptor)."""
    f.flush()
    try:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    finally:
        f.close()
    return np.frombuffer(m, dtype=np.uint8)


class _Spill:
    """Append-only bytes: in memory up to SPILL_BYTES, then in an unlinked temporary file."""

    def __init__(self, typecode: str = "B") -> None:
        self.mem = array.array(typecode)
        self._file: BinaryIO | None = None

    def check(self) -> None:
        if self.mem.itemsize * len(self.mem) >= SPILL_BYTES:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="packer-column-")
            self._file.write(self.mem)
            del self.mem[:]

    def build(self, dtype: Any) -> np.ndarray:
        if self._file is None:
            return np.frombuffer(self.mem, dtype=dtype) if len(self.mem) else np.zeros(0, dtype=dtype)
        self._file.write(self.mem)
        del self.mem[:]
        f, self._file = self._file, None
        return _mapped(f).view(dtype)


def spilled(values: np.ndarray) -> np.ndarray:
    """``values`` (1-D) moved to a mapped temporary file when it is past SPILL_BYTES, else as it is."""
    if values.nbytes < SPILL_BYTES:
        return values
    f = tempfile.TemporaryFile(prefix="packer-column-")
    try:
        for a in range(0, len(values), 1 << 20):
            f.write(np.ascontiguousarray(values[a:a + (1 << 20)]).tobytes())
    except BaseException:
        f.close()
        raise
    return _mapped(f).view(values.dtype)


class StringBuilder:
    """Appends strings to a growing blob and offsets (8 + len(UTF-8) bytes a string)."""

    def __init__(self) -> None:
        self._blob = _Spill("B")
        self._offsets = _Spill("q")
        self._offsets.mem.append(0)
        self._end = 0
        self._count = 0

    def append(self, text: str) -> None:
        self.append_encoded(_encode(text))

    def append_encoded(self, raw: bytes) -> None:
        self._blob.mem.frombytes(raw)
        self._end += len(raw)
        self._offsets.mem.append(self._end)
        self._count += 1
        if not self._count & 1023:
            self._blob.check()
            self._offsets.check()

    def __len__(self) -> int:
        return self._count

    def build(self) -> StringColumn:
        return StringColumn(self._blob.build(np.uint8), self._offsets.build(np.int64))


class IntBuilder:
    """Appends integers of one numpy dtype (``"i"``, ``"q"``: the ``array`` typecode)."""

    _DTYPES = {"h": np.int16, "i": np.int32, "q": np.int64}

    def __init__(self, typecode: str = "q") -> None:
        self._spill = _Spill(typecode)
        self._dtype = self._DTYPES[typecode]

    def append(self, value: int) -> None:
        mem = self._spill.mem
        mem.append(value)
        if not len(mem) & 1023:
            self._spill.check()

    def build(self) -> IntColumn:
        return IntColumn(self._spill.build(self._dtype))


class StringColumn(Sequence[str]):
    """Strings as one UTF-8 blob and an offsets array (a few bytes a string, no Python object each).

    ``column[i]`` decodes one string, ``column[a:b]`` is a view (no copy), iteration decodes a
    chunk at a time. ``order`` (optional) maps each position to a string of the blob: a permuted
    view (:meth:`take`) costs one int64 a string, not a second blob.
    """

    __slots__ = ("_blob", "_offsets", "_order", "_start", "_stop")

    def __init__(self, blob: Any, offsets: np.ndarray, order: np.ndarray | None = None,
                 start: int = 0, stop: int | None = None) -> None:
        self._blob = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob
        self._offsets = offsets  # len(strings of the blob) + 1, starting at 0
        self._order = order
        n = len(offsets) - 1 if order is None else len(order)
        self._start, self._stop = start, n if stop is None else stop

    @classmethod
    def of(cls, strings: Iterable[str]) -> StringColumn:
        builder = StringBuilder()
        for s in strings:
            builder.append(s)
        return builder.build()

    def __len__(self) -> int:
        return self._stop - self._start

    def _base(self, pos: int) -> int:
        """The blob's string number of absolute position ``pos``."""
        return pos if self._order is None else int(self._order[pos])

    def _bytes(self, j: int) -> bytes:
        return self._blob[self._offsets[j]:self._offsets[j + 1]].tobytes()

    @overload
    def __getitem__(self, key: int) -> str: ...

    @overload
    def __getitem__(self, key: slice) -> StringColumn: ...

    def __getitem__(self, key: int | slice) -> str | StringColumn:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self.take(np.arange(start, stop, step))
            return StringColumn(self._blob, self._offsets, self._order, self._start + start,
                                self._start + max(start, stop))
        pos = key + len(self) if key < 0 else key
        if not 0 <= pos < len(self):
            raise IndexError(key)
        return self._bytes(self._base(self._start + pos)).decode("utf-8", "surrogateescape")

    def encoded_chunks(self) -> Iterator[list[bytes]]:
        """The strings' UTF-8 bytes, a list of up to CHUNK of them at a time."""
        offsets = self._offsets
        for a in range(self._start, self._stop, CHUNK):
            b = min(a + CHUNK, self._stop)
            if self._order is None:
                lo, hi = int(offsets[a]), int(offsets[b])
                data, ends = self._blob[lo:hi].tobytes(), (offsets[a:b + 1] - lo).tolist()
                yield [data[ends[k]:ends[k + 1]] for k in range(b - a)]
            else:
                yield [self._bytes(j) for j in self._order[a:b].tolist()]

    def __iter__(self) -> Iterator[str]:
        for chunk in self.encoded_chunks():
            for raw in chunk:
                yield raw.decode("utf-8", "surrogateescape")

    def take(self, indices: Any) -> StringColumn:
        """The strings at ``indices`` (positions of this column), as a view of the same blob."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError("take(): index out of range")
        if self._order is not None:
            base = self._order[self._start:self._stop][idx]
        else:
            base = idx + self._start if self._start else idx  # the caller's (mapped) array, not a copy
        return StringColumn(self._blob, self._offsets, base)

    def compact(self) -> StringColumn:
        """This view as a column of its own (only its strings' bytes): what pickles and travels."""
        if self._order is None and self._start == 0 and self._stop == len(self._offsets) - 1:
            return self
        builder = StringBuilder()
        for chunk in self.encoded_chunks():
            for raw in chunk:
                builder.append_encoded(raw)
        return builder.build()

    def __reduce__(self) -> tuple:
        c = self.compact()
        return StringColumn, (c._blob.tobytes(), np.ascontiguousarray(c._offsets))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringColumn([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"


class IntColumn(Sequence[int]):
    """A numpy integer array read as a sequence of Python ints (``column[i]`` is an ``int``, a slice a
    view). ``order`` (optional): the positions of ``values`` to read, a permuted view (:meth:`take`)."""

    __slots__ = ("_values", "_order")

    def __init__(self, values: Any, dtype: Any = np.int64, order: np.ndarray | None = None) -> None:
        self._values = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=dtype)
        if self._values.ndim != 1:
            raise ValueError(f"IntColumn: a 1-D array, not {self._values.ndim}-D")
        self._order = order

    @property
    def array(self) -> np.ndarray:
        """The values in this column's order, as a numpy array (a copy for a permuted view)."""
        return self._values if self._order is None else self._values[self._order]

    def values(self, a: int, b: int) -> np.ndarray:
        """Positions ``a`` to ``b`` as a numpy array (what is hashed or summed, a chunk at a time)."""
        return self._values[a:b] if self._order is None else self._values[self._order[a:b]]

    def __len__(self) -> int:
        return len(self._values) if self._order is None else len(self._order)

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> IntColumn: ...

    def __getitem__(self, key: int | slice) -> int | IntColumn:
        if isinstance(key, slice):
            if self._order is None:
                return IntColumn(self._values[key])
            return IntColumn(self._values, order=self._order[key])
        return int(self._values[key] if self._order is None else self._values[self._order[key]])

    def __iter__(self) -> Iterator[int]:
        for a in range(0, len(self), CHUNK):
            yield from self.values(a, a + CHUNK).tolist()

    def take(self, indices: Any) -> IntColumn:
        """The values at ``indices`` (positions of this column), as a view of the same values."""
        idx = np.asarray(indices, dtype=np.int64)
        return IntColumn(self._values, order=idx if self._order is None else self._order[idx])

    def sum(self) -> int:
        return sum(int(self.values(a, a + (1 << 20)).sum(dtype=np.int64)) for a in range(0, len(self), 1 << 20))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)

    def __reduce__(self) -> tuple:
        return IntColumn, (np.ascontiguousarray(self.array),)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IntColumn):
            other = other.array
        elif not isinstance(other, (Sequence, np.ndarray)) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and bool(np.array_equal(self.array, np.asarray(other)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IntColumn({self.array!r})"
