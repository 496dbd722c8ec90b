"""Safe I/O of a dataset's files: the one place that opens, sizes, reads and maps them.

Every reader, ``verify``, ``info`` and ``convert`` go through these:

* :func:`member_path` -- a name the index gives, as a path that stays inside
  the dataset folder (no ``..``, no symlink out);
* :func:`open_regular` / :func:`open_data_file` / :func:`open_member` -- a
  descriptor of a regular file (never blocking on a FIFO or a device), and
  for data files at least as long as ``index.json`` records (a truncated
  file is refused before anything maps it);
* :func:`read_range` -- one checked range read (a short read names the
  file and byte, never returns fewer bytes silently);
* :func:`map_file` -- a read-only mapping (page cache, shared by every
  process) of a descriptor opened as above;
* :func:`map_npy` -- a ``.npy`` index array mapped read-only, its CRC-32
  streamed over the mapping in chunks (no private copy), then parsed
  strictly (:func:`parse_npy`).

The on-disk contract itself (file names, dtypes, ``index.json``) is
:mod:`readers.contract.spec`, which re-exports these names. Nothing here imports torch
or any other module of ``readers``.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import contextlib
import ctypes
import errno
import math
import mmap
import os
import resource
import stat
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import numpy as np

__all__ = [
    "INDEX_NAME",
    "DatasetFormatError",
    "IncompleteDatasetError",
    "checksum",
    "checksum_combine",
    "checksum_then",
    "fsync_files",
    "file_checksum",
    "check_member_name",
    "member_path",
    "open_regular",
    "open_data_file",
    "open_member",
    "read_regular",
    "read_range",
    "map_file",
    "map_npy",
    "mapped_checksum",
    "file_identity",
    "FileChanged",
    "map_pages",
    "parse_npy",
    "npy_header",
    "NpyHeader",
    "NPY_HEADER_LIMIT",
    "atomic_write",
    "fsync_dir",
    "publish",
]

#: The metadata record of a dataset folder (named in messages; readers.contract.spec re-exports it).
INDEX_NAME = "index.json"
#: CRC-32 over a mapping runs over this many bytes at a time.
CRC_CHUNK = 8 << 20


class DatasetFormatError(ValueError):
    """The folder is not a dataset this version can read."""


class IncompleteDatasetError(DatasetFormatError):
    """The folder holds a pack that never finished (no ``index.json``)."""


_crc32: Callable[[Any, int], int]
_crc32_combine: Callable[[int, int, int], int] | None  # (crc of a, crc of b, len(b)) -> crc of a + b
try:  # ISA-L's CRC-32 (carry-less multiply): the same function as zlib's, ~30x faster here
    from isal.isal_zlib import crc32 as _crc32
    from isal.isal_zlib import crc32_combine as _crc32_combine
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    _crc32, _crc32_combine = zlib.crc32, None


def checksum(data: bytes | bytearray | memoryview | np.ndarray, value: int = 0) -> int:
    """CRC-32 (zlib's polynomial) of ``data``; chain calls by passing the previous value."""
    return _crc32(data, value) & 0xFFFFFFFF


def checksum_combine(crc_a: int, crc_b: int, len_b: int) -> int | None:
    """CRC-32 of ``a + b`` from the CRC-32s of ``a`` and ``b`` and ``len(b)`` (no byte read again);
    None without ISA-L (Python's zlib has no such call): then chain :func:`checksum` instead."""
    return None if _crc32_combine is None else _crc32_combine(crc_a, crc_b, len_b) & 0xFFFFFFFF


def checksum_then(value: int, data: bytes | bytearray | memoryview, data_crc: int | None) -> int:
    """``checksum(data, value)``, from ``data_crc`` (``data``'s own CRC-32, when known) without reading
    ``data`` again where :func:`checksum_combine` can: the same value either way."""
    joined = None if data_crc is None else checksum_combine(value, data_crc, len(data))
    return checksum(data, value) if joined is None else joined


def file_checksum(path: str | os.PathLike, block: int = 8 << 20, *, mapped: bool = False) -> int:
    """CRC-32 of a whole file (what ``index.json`` records under ``files_crc32``).

    ``mapped``: read the file through a memory map rather than copies into a buffer, for a file this
    process has just written and nothing else changes while it is read (a writer's own output under
    its lock): a file cut while mapped would end the process (SIGBUS), not raise. From the page cache
    it takes 6 ms for a 104 MB LMDB file here, against 9-14 ms read in 8 MB blocks."""
    crc = 0
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if mapped and size >= block:
            try:
                with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mapping:
                    view = memoryview(mapping)
                    try:
                        return checksum(view)
                    finally:
                        view.release()
            except (OSError, ValueError):  # a file system that cannot map it: read it in blocks
                pass
        buf = bytearray(max(1, min(block, size)))  # a small file: no 8 MB to zero
        while n := f.readinto(buf):
            crc = checksum(memoryview(buf)[:n], crc)  # ISA-L's CRC-32 when installed: ~9x zlib's speed
    return crc


# ---------------------------------------------------------------- writing a file whole or not at all
def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or file creation inside folder ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_FSYNC_THREADS = 16


def fsync_files(paths: Iterable[str | os.PathLike]) -> None:
    """Make files written with ``atomic_write(durable=False)`` durable, together: the files (fsynced
    at once, from threads), then each folder once. Done after the last write, the file system commits
    them in one journal commit, not one per file and folder as ``durable=True`` gives."""
    paths = list(paths)
    folders = dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in paths)
    if len(paths) > 1:  # at once, each in a thread: the file system commits them together (10 files: ~5 ms, not ~40)
        with cf.ThreadPoolExecutor(max_workers=min(len(paths), _FSYNC_THREADS), thread_name_prefix="fsync") as pool:
            list(pool.map(fsync_dir, paths))  # an fsync through a read-only descriptor: files and folders alike
    else:
        for path in paths:
            fsync_dir(path)
    for folder in folders:
        fsync_dir(folder)


def publish(tmp: str | os.PathLike, path: str | os.PathLike, *, durable: bool = True) -> None:
    """Rename the complete file ``tmp`` over ``path`` (same folder: atomic); ``durable``: and fsync
    the folder, so the new name survives a crash. The caller has fsynced ``tmp`` itself."""
    os.replace(tmp, path)
    if durable:
        fsync_dir(Path(path).parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", *, durable: bool = True, unique: bool = False,
                 perm: int = 0o666, encoding: str | None = None) -> Iterator[IO[Any]]:
    """Write ``path`` whole or not at all: a file object on a temp file beside it, renamed over
    ``path`` when the block ends without an exception, and unlinked when it raises (Ctrl-C too).

    ``durable``: the temp file is fsynced before the rename and the folder after it (a crash leaves
    the old file or the new one, never a torn one); without it the rename is still atomic for
    readers, only not crash-proof (caches, records). The temp name is ``<name>.tmp`` (the packer's
    output lock makes a dataset's writer the only one) or, with ``unique``, ``.<name>.<pid>-<random>.tmp``
    for files that several processes may write at once. ``perm``: the mode it is created with
    (less the umask). The open file's ``name`` is the temp path (to checksum it before the rename).
    """
    path = Path(path)
    name = f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp" if unique else f"{path.name}.tmp"
    tmp = path.with_name(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | (os.O_EXCL if unique else 0)
    try:
        with open(tmp, mode, encoding=encoding, opener=lambda p, _flags: os.open(p, flags, perm)) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        publish(tmp, path, durable=durable)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------- which files a dataset may read
# One rule for every reader and for verify: a dataset names only files inside
# its own folder. Names are relative paths without "..", "." or empty parts
# (remote datasets apply check_member_name to keys under their prefix); on a
# local disk the resolved path must stay inside the resolved folder (no
# symlink leaves it), and only regular files are opened, without blocking.

def check_member_name(name: Any, what: str = "file") -> str:
    """``name`` if a dataset may use it for one of its files; DatasetFormatError otherwise."""
    if not isinstance(name, str) or not name:
        raise DatasetFormatError(f"{what} name {name!r} is not a file name")
    if name.startswith("/") or "\\" in name or "\0" in name or any(
            part in ("", ".", "..") for part in name.split("/")):
        raise DatasetFormatError(
            f"{what} name {name!r} is not a plain relative path inside the dataset folder "
            "(absolute paths, '..', '.' and empty parts are refused)")
    return name


def member_path(root: str | os.PathLike, name: Any, what: str = "file") -> Path:
    """``root / name`` after checking that it names a file inside ``root`` (symlinks resolved)."""
    path = Path(root) / check_member_name(name, f"{root}: {what}")
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
        raise DatasetFormatError(f"{path}: {what} leads outside the dataset folder (to {real}); refusing to read it")
    return path


def too_many_open_files(path: str | os.PathLike, what: str, exc: OSError) -> OSError:
    """The OSError for an open refused by the descriptor limit (EMFILE / ENFILE): it names the file,
    the limit and what to do, and is no DatasetFormatError (nothing is wrong with the dataset)."""
    if exc.errno == errno.EMFILE:
        limit = f"this process may open {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} (`ulimit -n`)"
    else:
        limit = "the system's limit is reached"
    return OSError(exc.errno, f"{path}: cannot open {what}: too many open files ({limit}); raise the limit, "
                              "or use fewer loader workers or open shards")


def open_regular(path: str | os.PathLike, what: str = "file") -> int:
    """A read-only descriptor of ``path``, which must be a regular file.

    Opened with ``O_NONBLOCK`` so that a FIFO or a device in its place can
    never block, then ``fstat`` must say regular file. Raises
    DatasetFormatError naming ``path`` otherwise (missing, unreadable, special).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: {what} is missing") from None
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):  # the process's limit, not the dataset's fault
            raise too_many_open_files(path, what, exc) from None
        raise DatasetFormatError(f"{path}: cannot open {what} ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
            "not a regular file"
        raise DatasetFormatError(f"{path}: {what} is {kind}, not a regular file")
    os.set_blocking(fd, True)  # no effect on a regular file's reads; plain descriptor from here on
    return fd


def read_regular(path: str | os.PathLike, what: str = "file", *, limit: int | None = None) -> bytearray:
    """The whole content of the regular file ``path`` (see :func:`open_regular`), at most ``limit`` bytes."""
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise DatasetFormatError(f"{path}: {what} is {size} bytes, more than the {limit} it can be")
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            k = os.readv(fd, [view[got:]])
            if k == 0:
                raise DatasetFormatError(f"{path}: {what} shrank while it was read")
            got += k
        return buf
    except OSError as exc:
        raise DatasetFormatError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def open_member(root: str | os.PathLike, name: str, what: str = "data file", size: int | None = None) -> int:
    """Descriptor of the dataset file ``root/name``: inside the folder (:func:`member_path`), then
    :func:`open_data_file` (regular, at least ``size`` bytes when given)."""
    return open_data_file(member_path(root, name, what), size, what)


_NPY_MAGIC = b"\x93NUMPY"
#: The most bytes a .npy header may take (numpy writes ~128).
NPY_HEADER_LIMIT = 1 << 16


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header declares (:func:`npy_header`), checked against the bytes present."""

    dtype: np.dtype
    fortran: bool
    shape: tuple[int, ...]
    offset: int  # where the data starts

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def npy_header(buf: Any, size: int | None = None) -> NpyHeader:
    """The header of the ``.npy`` bytes ``buf`` (the whole file, or at least its header when ``size``,
    the whole file's length, is given), checked before anything is allocated from it: the one
    ``.npy`` header check of the readers, ``verify``, ``convert`` and the WebDataset importer.

    The data after the header must be exactly ``prod(shape) * itemsize`` bytes (a 100-byte member
    claiming 2**40 elements is refused here, never allocated); the dtype must hold no Python
    objects. ValueError with the reason (no path: the caller names the file or member).
    """
    size = len(buf) if size is None else size
    if bytes(buf[:6]) != _NPY_MAGIC or len(buf) < 10:
        raise ValueError("not a .npy file")
    major = buf[6]
    if major == 1:
        hlen, start = int.from_bytes(bytes(buf[8:10]), "little"), 10
    elif major in (2, 3):
        hlen, start = int.from_bytes(bytes(buf[8:12]), "little"), 12
    else:
        raise ValueError(f".npy format version {major}")
    if hlen > NPY_HEADER_LIMIT or start + hlen > min(len(buf), size):
        raise ValueError("header runs past the end of the file")
    try:
        header = ast.literal_eval(bytes(buf[start:start + hlen]).decode("utf-8" if major == 3 else "latin1"))
        shape, fortran, descr = header["shape"], header["fortran_order"], np.dtype(header["descr"])
    except Exception as exc:  # noqa: BLE001 - any malformed header (SyntaxError, KeyError, TypeError, ...)
        raise ValueError(f"unreadable header: {type(exc).__name__}") from None
    if not (isinstance(shape, tuple) and len(shape) <= 32 and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"shape {shape!r} is not a shape")
    if descr.hasobject:
        raise ValueError("it holds Python objects (dtype object), not numbers")
    if type(fortran) is not bool:
        raise ValueError(f"fortran_order {fortran!r} is not a bool")
    head = NpyHeader(descr, fortran, shape, start + hlen)
    if size - head.offset != head.count * descr.itemsize:
        raise ValueError(f"{size - head.offset} data bytes for {head.count} entries of {descr.itemsize}")
    return head


def parse_npy(path: str | os.PathLike, buf: Any, dtype: np.dtype, length: int | None = None, *,
              what: str = "array") -> np.ndarray:
    """The 1-D array of ``dtype`` that the .npy bytes ``buf`` hold (a view, no copy: read-only for a mapping).

    Stricter than ``numpy.load``: the header (:func:`npy_header`) must say exactly ``dtype``, C
    order and a 1-D shape (of ``length`` entries when given), and the file must hold exactly that
    many bytes after it; nothing is allocated from what the header claims.
    """
    try:
        head = npy_header(buf)
    except ValueError as exc:
        raise DatasetFormatError(f"{path}: {what} is damaged ({exc})") from None
    if head.dtype != dtype or head.fortran:
        raise DatasetFormatError(f"{path}: {what} has dtype {head.dtype}, expected {dtype}")
    if len(head.shape) != 1:
        raise DatasetFormatError(f"{path}: {what} is damaged (shape {head.shape!r} is not one dimension)")
    if length is not None and head.shape[0] != length:
        raise DatasetFormatError(f"{path}: {what} holds {head.shape[0]} entries, {INDEX_NAME} says {length} samples")
    return np.frombuffer(buf, dtype=dtype, count=head.shape[0], offset=head.offset)


def open_data_file(path: str | os.PathLike, size: int | None = None, what: str = "data file") -> int:
    """A descriptor of the regular file ``path`` (:func:`open_regular`), at least ``size`` bytes long
    when ``size`` is given (as ``index.json`` records it): a truncated file is refused before anything
    maps it (a longer one is for ``verify`` to report). The one "data file shorter than the index" check."""
    fd = open_regular(path, what)
    actual = os.fstat(fd).st_size
    if size is not None and actual < size:
        os.close(fd)
        raise DatasetFormatError(f"{path}: {what} is {actual} bytes, {INDEX_NAME} says {size}: "
                                 "it is truncated or damaged")
    return fd


def read_range(fd: int, offset: int, length: int, short: Callable[[], str]) -> bytes:
    """Exactly ``length`` bytes at ``offset`` of the open file ``fd``; ``DatasetFormatError(short())``
    when the file ends first (``short`` builds the message, naming the file and byte, only then)."""
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts, got = [data], len(data)
    while got < length:  # a short pread that is not the end of the file (rare: signals, NFS)
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise DatasetFormatError(short())
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def map_file(fd: int) -> np.ndarray:
    """The whole file ``fd`` mapped read-only as uint8 (page cache, shared; empty file: empty array).
    The caller keeps ``fd`` and closes it (the mapping holds its own reference)."""
    if os.fstat(fd).st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), dtype=np.uint8)


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return libc


_LIBC: list[Any] = []  # loaded on first use


def map_pages(fd: int, size: int) -> Any:
    """The first ``size`` bytes of ``fd`` mapped (a buffer; unmapped when the last view of it goes).

    Unlike :class:`mmap.mmap`, the mapping holds no descriptor (CPython's mmap keeps a ``dup`` of
    ``fd`` for its lifetime: five per wds index, per process). Pages are the page cache's, shared by
    every process that maps the file; ``MAP_PRIVATE`` so that a write through a view (numpy lets a
    caller set ``writeable`` back) copies that page for the writer instead of crashing it or
    changing the file. Falls back to :class:`mmap.mmap` where libc's ``mmap`` cannot be called.
    """
    try:
        if not _LIBC:
            _LIBC.append(_libc())
        libc = _LIBC[0]
    except (OSError, AttributeError):  # pragma: no cover - no C library to call (not Linux/macOS)
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    buf = (ctypes.c_ubyte * size).from_address(addr)
    # Not at interpreter exit: a thread still running then may read the array (the OS unmaps it anyway).
    weakref.finalize(buf, libc.munmap, addr, size).atexit = False
    return buf


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns): the same tuple later means the same, unchanged file."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class FileChanged(Exception):
    """:func:`map_npy` was given the identity the file had, and it has another now."""


def map_npy(path: str | os.PathLike, dtype: np.dtype, length: int | None = None, *, crc32: int | None = None,
            what: str = "array", limit: int | None = None,
            identity: tuple[int, int, int, int] | None = None,
            threads: int = 1) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The 1-D ``.npy`` array at ``path``, mapped read-only (shared page cache, no private copy),
    and the file's :func:`file_identity`.

    When ``crc32`` is given the whole file's CRC-32 must equal it (streamed over the
    mapping, :data:`CRC_CHUNK` bytes at a time, on ``threads`` threads: :func:`mapped_checksum`);
    then the strict parse of :func:`parse_npy`.
    ``identity``: the file must still be that one (:class:`FileChanged` otherwise), as when a
    process maps again what another one mapped and checked.
    """
    fd = open_regular(path, what)
    try:
        st = os.fstat(fd)
        if identity is not None and file_identity(st) != tuple(identity):
            raise FileChanged(str(path))
        size = st.st_size
        if limit is not None and size > limit:
            raise DatasetFormatError(f"{path}: {what} is {size} bytes, more than the {limit} it can be")
        if size == 0:
            raise DatasetFormatError(f"{path}: {what} is damaged (not a .npy file)")
        try:
            mapped = map_pages(fd, size)
        except OSError as exc:
            raise DatasetFormatError(f"{path}: cannot map {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if crc32 is not None and crc32 != mapped_checksum(mapped, threads=threads):
        raise DatasetFormatError(
            f"{path}: checksum differs from the one {INDEX_NAME} records: the array is damaged or was edited")
    array = parse_npy(path, memoryview(mapped).cast("B"), dtype, length, what=what)
    array.flags.writeable = False
    return array, file_identity(st)


def mapped_checksum(buf: Any, chunk: int = CRC_CHUNK, threads: int = 1) -> int:
    """CRC-32 of a buffer (a mapping), ``chunk`` bytes at a time through zero-copy views.

    ``threads`` > 1: a buffer of at least two chunks per thread is cut into that many parts, each
    summed on its own thread (ISA-L's CRC-32 releases the GIL, and so does the page fault that maps
    a page in) and the parts' CRCs joined with ``crc32_combine``: the same value as one pass.
    """
    view = memoryview(buf)
    try:
        size = len(view)
        combine = _crc32_combine
        threads = min(threads, size // (2 * chunk)) if combine is not None else 1
        if threads <= 1 or combine is None:
            return _checksum_range(view, 0, size, chunk)
        step = -(-size // threads // chunk) * chunk  # parts start on a chunk boundary
        starts = list(range(0, size, step))
        with cf.ThreadPoolExecutor(max_workers=len(starts), thread_name_prefix="crc32") as pool:
            parts = list(pool.map(lambda lo: _checksum_range(view, lo, min(size, lo + step), chunk), starts))
        crc = parts[0]
        for lo, part in zip(starts[1:], parts[1:]):
            crc = combine(crc, part, min(size, lo + step) - lo) & 0xFFFFFFFF
        return crc
    finally:
        view.release()


def _checksum_range(view: memoryview, lo: int, hi: int, chunk: int) -> int:
    crc = 0
    for start in range(lo, hi, chunk):
        crc = checksum(view[start:min(hi, start + chunk)], crc)
    return crc
