"""What every reader shares: the index, lazy per-process handles, decode and transform.

A reader is built from a dataset folder or from an already read
:class:`readers.contract.spec.Index` (``open_dataset`` reads the index once and hands
it over); either way the index is public as ``reader.index``. The
constructor keeps only the dataset path and small numpy index arrays
(labels, sizes, offsets): no open file, no per-sample Python objects. A
format's handle (tar file descriptor, LMDB environment, HDF5 file, memmap)
is a :class:`readers.contract.perprocess.PerProcess`: opened on first use in the
process that uses it, re-opened when the pid changes (a forked DataLoader
worker never uses its parent's handle), and dropped when the dataset is
pickled (spawned workers, DDP).
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from readers.contract import spec
from readers.contract.generations import generation_of
from readers.contract.checks import check_index
from readers.formats.collate import Sample, SampleDict
from readers.decode.compose import accepts_bytes, warn_if_fused_lost
from readers.decode.decoders import DecodeError, decode_rgb
from readers.contract.fields import Field, NumericType, Schema, column_file
from readers.contract.perprocess import PerProcess
from readers.formats.resolve import resolve_index

__all__ = ["PackedDataset", "MapReader", "ReadsBatches", "ReadsItems", "to_chw", "IMAGE_KINDS", "INDEX_KEY",
           "load_column"]

#: What a reader's decoded image is: a uint8 CHW tensor, or a PIL RGB image (torchvision pipelines).
IMAGE_KINDS = ("tensor", "pil")


def to_chw(arr: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 array -> (3, H, W) uint8 tensor, contiguous, never sharing read-only memory.

    A transpose is usually copied by ``ascontiguousarray``; for shapes where
    it is already contiguous (1x1 images) it would be a view of ``arr``, which
    may be a read-only memory map: writing into such a tensor kills the
    interpreter, so those are copied too.
    """
    chw = np.ascontiguousarray(arr.transpose(2, 0, 1))
    if not chw.flags.writeable or np.shares_memory(chw, arr):
        chw = chw.copy()
    return torch.from_numpy(chw)


#: In a dict sample (``fields=None`` on a dataset without ``label``) with ``return_index=True``: the
#: key of the sample index (field names never start with ``__``).
INDEX_KEY = "__index__"


@runtime_checkable
class ReadsBatches(Protocol):
    """A dataset that reads a whole batch in one call: ``get_batch(indices, alloc=None)`` gives the
    collated batch, or None where its settings have no whole-batch path (``readers.formats.batch``).
    :class:`MapReader` and ``readers.subset``'s ``Subset`` offer it; loader threads ask it first."""

    def get_batch(self, indices: list[int], alloc: Any = None) -> tuple | None: ...


@runtime_checkable
class ReadsItems(Protocol):
    """A dataset that fetches a batch's items in one call, ``__getitems__(indices)`` (torch's
    DataLoader calls it too). :class:`MapReader`, ``Subset`` and ``readers.mix``'s ``Mixture`` offer
    it; a dataset without it is read one ``dataset[i]`` at a time."""

    def __getitems__(self, indices: list[int]) -> Any: ...


def _fixed_type(field: Field) -> NumericType:
    """The type of fixed-size ``field`` (numbers and fixed-shape arrays are the fixed types), whose
    values are rows of a column; TypeError for a variable-size one."""
    if not isinstance(field.type, NumericType) or not field.type.fixed:
        raise TypeError(f"field {field.name!r} ({field.type.name}) is variable-size: it has no column")
    return field.type


def load_column(path: str, field: Field, n: int) -> np.ndarray:
    """Fixed-size field ``field``'s ``(n, *shape)`` index array at ``path``, mapped read-only (the
    page cache, shared by every worker), its dtype and shape checked against the schema."""
    typ = _fixed_type(field)
    os.close(spec.open_regular(path, f"field {field.name!r} array"))  # a regular file, never blocking
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise spec.DatasetFormatError(f"{path}: field {field.name!r} array is damaged ({exc})") from None
    want = (n, *typ.shape)
    if arr.dtype != typ.dtype or arr.shape != want:
        raise spec.DatasetFormatError(
            f"{path}: field {field.name!r} array holds {arr.dtype.str} {arr.shape}; the schema says "
            f"{typ.name} for {n} samples ({typ.dtype.str} {want})")
    return arr


class _IndexArray(NamedTuple):
    """In a pickled reader: "this attribute is the index's array ``name``" (sent once, with the index)."""

    name: str


def _remote_local(remote: Any, name: str) -> str:
    return remote.local(name)


class _Sharers:
    """The dataset objects of one process that share one reader's handles (its store's connections, mapped
    columns, pinned cache copies): a copy made with ``copy.copy`` (``with_order``, ``with_batch_reads``,
    ``with_samples``; ``make_loader`` makes two) shares them with its original. Dropping one of them
    closes the handles only when it was the last; ``close()`` closes them at once, as asked.

    Another process's copy (a spawned worker's unpickled dataset) gets a holder of its own (``fresh``);
    in a forked child, an inherited dataset closes that child's handles when it goes, as before."""

    __slots__ = ("pid", "count", "fresh", "lock")

    def __init__(self, fresh: bool = False) -> None:
        self.pid, self.count, self.fresh, self.lock = os.getpid(), 1, fresh, threading.Lock()

    def __reduce__(self) -> tuple[type, tuple[bool]]:
        return _Sharers, (True,)

    def joined(self) -> "_Sharers":
        """The holder of a copy just made of a dataset that has this one."""
        if self.fresh:  # unpickled just now: the first dataset of this process to hold it
            self.fresh = False
            return self
        if self.pid != os.getpid():  # a forked child copies a dataset it inherited
            return _Sharers()
        with self.lock:
            self.count += 1
        return self

    def left(self) -> bool:
        """One holder went; True when the handles are this process's to close now."""
        if self.pid != os.getpid():
            return True
        with self.lock:
            self.count -= 1
            return self.count <= 0


class PackedDataset:
    """Mixin for all readers: index loading, item building, pickling."""

    format: str = ""

    def __init__(
        self,
        source: str | os.PathLike | spec.Index,
        *,
        transform: Callable[[Any], Any] | None = None,
        decode: bool = True,
        return_index: bool = False,
        image: str = "tensor",
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: Any = None,
        progress: Callable[[int, int], None] | None = None,
        fields: Sequence[str] | None = None,
        sample_transform: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        """``source``: a dataset folder or URL, or its index as :func:`readers.contract.spec.read_index` returned it.

        What ``transform`` receives: the stored bytes when it is fused (``accepts_bytes``, also a
        Compose whose first step is), else the decoded RGB image as a uint8 CHW tensor
        (``image="tensor"``, default) or a PIL RGB image (``image="pil"``, for torchvision
        pipelines that start with e.g. ``Resize`` and end with ``ToTensor``).

        Remote datasets (``s3://``, ``http(s)://``): ``storage_options`` and
        ``retry`` reach the store; ``cache_dir`` / ``cache_limit`` name the
        node-local cache (see docs/remote.md); ``progress(done, total)`` follows
        a download made while opening. All five are ignored for a local folder.

        Fields (docs/fields.md): ``fields=("image", "caption")`` gives each sample as a tuple of
        those fields in that order, and reads nothing of the others; an unknown name is a
        ValueError listing the dataset's fields. ``fields=None`` gives ``(image, label)`` for a
        dataset whose samples have a ``label`` (every dataset of images in class folders), else
        a dict of every field. ``transform`` applies to the ``image`` field only;
        ``sample_transform`` receives the whole sample as a dict ``{field: value}`` (after
        ``transform``) and returns the item: a dict it returns is laid out as above (a tuple in
        ``fields=`` order, or the dict), anything else is the item as it is. ``return_index``
        appends the sample index to a tuple, or sets ``"__index__"`` in a dict.
        """
        if image not in IMAGE_KINDS:
            raise ValueError(f"image must be one of {IMAGE_KINDS}, got {image!r}")
        index = resolve_index(source, storage_options, retry)
        check_index(index)  # every value a read is computed from is bounded before any data file opens
        if index.format != self.format:
            raise spec.DatasetFormatError(
                f"{index.root} holds a {index.format!r} dataset; {type(self).__name__} reads {self.format!r} "
                "(readers.open_dataset picks the right reader)"
            )
        #: The dataset's index (metadata and per-sample arrays), read once, shared with whoever passed it in.
        self.index = index
        #: The dataset's folder (a Path), or its URL (a str) when it is remote.
        self.root: Path | str = Path(index.root) if index.store is None else index.root
        #: Remote datasets: sizes, checksums and cached local copies of the data files (None when local).
        self.remote = None
        if index.store is not None:
            from readers.remote.files import RemoteFiles

            self.remote = RemoteFiles(index.store, index.meta, cache_dir, cache_limit)
        self._progress = progress
        self.meta = index.meta
        #: Which generation of a dataset grown by appends this reader reads (0 if never appended to):
        #: save it beside a loader's state_dict, reopen it with open_dataset(..., generation=g).
        self.generation = generation_of(index.meta)
        self.classes = index.classes
        self.labels = index.labels
        self.transform = transform
        self.decode = decode
        self.return_index = return_index
        self.image = image
        self._fused = accepts_bytes(transform)
        warn_if_fused_lost(transform)
        #: The dataset's fields (readers.contract.fields.Schema; image + label for a dataset packed before fields).
        self.schema = Schema.from_index(index.meta, self.location_of(spec.INDEX_NAME))
        self.sample_transform = sample_transform
        self._select(fields)
        self._columns: PerProcess[dict[str, np.ndarray]] = PerProcess(dict)  # field -> mapped column
        self._sharers = _Sharers()  # copies share the handles above: the last one dropped closes them

    # ------------------------------------------------------------ fields
    def _select(self, fields: Sequence[str] | None) -> None:
        """Which fields each item holds: ``self.fields`` is None for today's ``(image, label)`` item
        (the fast path), else the names in order; ``self._as_dict`` when items are dicts."""
        schema, self._as_dict = self.schema, False
        if isinstance(fields, (str, bytes)):
            raise ValueError(f"fields= takes a sequence of field names, e.g. ({fields!r},); the fields are "
                             f"{', '.join(schema.names)}")
        if fields is not None:
            names = tuple(f.name for f in schema.select(fields))  # ValueError naming an unknown one
            if len(set(names)) != len(names):
                raise ValueError(f"fields= names a field twice: {', '.join(names)}")
            self.fields: tuple[str, ...] | None = names
        elif "image" in schema and "label" in schema:
            fast = self.sample_transform is None and spec.has_label(self.meta)  # the label is labels.npy
            self.fields = None if fast else ("image", "label")
        else:
            self.fields, self._as_dict = schema.names, True
        names = self.fields or ()
        variable = [n for n in names if not schema[n].type.fixed and schema[n].type.shape]
        self._variable = frozenset(variable if self._as_dict else (names.index(n) for n in variable))

    def _column(self, field: Field) -> np.ndarray:
        """Fixed field ``field``'s ``(N, *shape)`` column, mapped in this process on first use."""
        columns = self._columns.get()
        arr = columns.get(field.name)
        if arr is None:
            arr = columns[field.name] = self._open_column(field)
        return arr

    def _open_column(self, field: Field) -> np.ndarray:
        """wds, lmdb, mmap: ``field-<name>.npy`` beside the index (``label``: ``labels.npy`` when the
        dataset has no ``field-label.npy``, as every dataset packed before fields)."""
        name = column_file(field.name, self.meta)
        if field.name == "label" and not self._has_file(name):
            return self.labels
        return load_column(self.file_ref(name)(), field, len(self.labels))

    def _has_file(self, name: str) -> bool:
        if self.remote is not None:
            return name in (self.meta.get("files") or {}) or name in (self.meta.get(spec.ARRAYS_KEY) or {})
        return os.path.lexists(Path(self.root) / name)

    def _read_blobs(self, i: int, fields: Sequence[Field]) -> dict[str, Any]:
        """The stored blobs of sample ``i``'s variable-size ``fields`` (each format: its layout)."""
        raise NotImplementedError(f"{type(self).__name__} stores no variable-size fields")

    def _value(self, i: int, field: Field, data: Any) -> Any:
        """The decoded value of ``field`` from its stored blob (``image``: through ``transform``)."""
        try:
            if field.name == "image":
                return self._convert(data)
            if field.type.name == "image":  # a second image (a mask): decoded as asked, no transform
                if not self.decode:
                    return bytes(data)
                hwc = decode_rgb(data)
                if self.image == "pil":
                    from PIL import Image

                    return Image.fromarray(np.ascontiguousarray(hwc), "RGB")
                return to_chw(hwc)
            return self._decode_blob(field, data)
        except (DecodeError, ValueError) as exc:
            raise spec.DatasetFormatError(f"{self.where(i)} sample {i} field {field.name!r}: {exc}") from exc

    def _decode_blob(self, field: Field, data: Any) -> Any:
        """A stored blob's value: ``FieldType.decode`` (wds: its members, ``FieldType.from_member``)."""
        return field.type.decode(data)

    # ------------------------------------------------------------ stored fields (verify, convert)
    def field_blob(self, i: int, field: Field) -> bytes:
        """The stored blob of ``field`` of sample ``i`` (``FieldType.encode``'s bytes, what
        ``field_checksums.npy`` covers), read through this format's field layout with every check
        a read makes (column dtype and shape, offsets inside the blob, array lengths, members) and
        decoded as a read decodes it: DatasetFormatError, one line, wherever a read would fail.
        ``verify`` and ``convert`` read fields through this, so what they pass every reader reads."""
        if field.type.fixed:
            row = self._column(field)[i]
            _fixed_type(field).from_row(row)
            return np.ascontiguousarray(row, dtype=field.type.dtype).tobytes()
        data = self._read_blobs(i, [field])[field.name]
        value = self._value(i, field, data)
        return self._stored_blob(field, data, value)

    def _stored_blob(self, field: Field, data: Any, value: Any) -> bytes:
        """The stored blob of what :meth:`_read_blobs` read (wds: a member, ``FieldType.member_blob``)."""
        return bytes(data)

    def field_location(self, field: Field, i: int) -> str:
        """The file (HDF5: and dataset) holding ``field`` of sample ``i``, as messages name it."""
        if field.type.fixed:
            return self.location_of(column_file(field.name, self.meta))
        return self.where(i)

    def _field_item(self, i: int, image: Any = None, blobs: dict[str, Any] | None = None) -> Any:
        """Sample ``i`` with the selected fields. ``image``: its stored image when already read;
        ``blobs``: its variable fields' blobs when already read (else read here)."""
        schema, values, names = self.schema, {}, self.fields or ()
        if blobs is None:
            wanted = [schema[n] for n in names if n != "image" and not schema[n].type.fixed]
            blobs = self._read_blobs(i, wanted) if wanted else {}
        for name in names:
            f = schema[name]
            if name == "image":
                values[name] = self._value(i, f, self.read(i) if image is None else image)
            elif f.type.fixed:
                values[name] = _fixed_type(f).from_row(self._column(f)[i])
            else:
                values[name] = self._value(i, f, blobs[name])
        if self.sample_transform is not None:
            out = self.sample_transform(values)
            if not isinstance(out, dict):
                return (out, i) if self.return_index else out
            values = out
        if self._as_dict:
            out = SampleDict(values, **{INDEX_KEY: i}) if self.return_index else SampleDict(values)
            out.variable = self._variable
            return out
        item = tuple(values[n] for n in names)
        sample = Sample(item + (i,) if self.return_index else item)
        sample.variable = self._variable
        return sample

    def _make(self, i: int) -> Any:
        """The item of sample ``i``, read by random access."""
        if self.fields is None:
            return self._item(i, self.read(i))
        return self._field_item(i)

    # ------------------------------------------------------------ items
    def _label(self, i: int) -> int:
        return int(self.labels[i])

    def _item(self, i: int, data: Any) -> tuple:
        """Build the item from the stored bytes (or pixels) of sample ``i``."""
        try:
            image = self._convert(data)
        except DecodeError as exc:  # stored bytes that no decoder reads: name the file and sample
            raise spec.DatasetFormatError(f"{self.where(i)} sample {i}: {exc}") from exc
        return (image, self._label(i), i) if self.return_index else (image, self._label(i))

    def where(self, i: int) -> str:
        """The file that holds sample ``i``, as shown in messages (never downloads)."""
        raise NotImplementedError

    def read(self, i: int) -> Any:
        """The stored bytes (or pixel array, for mmap) of sample ``i``; each format reads its own."""
        raise NotImplementedError

    def _convert(self, data: Any) -> Any:
        if not self.decode:
            return data if isinstance(data, bytes) else bytes(data)
        if self._fused and self.transform is not None:  # fused: the transform decodes the stored bytes
            return self.transform(bytes(data))
        return self._transformed(decode_rgb(data))

    def _transformed(self, hwc: np.ndarray) -> Any:
        """The decoded (H, W, 3) pixels as ``image`` asks, through ``transform``."""
        image: Any
        if self.image == "pil":
            from PIL import Image

            image = Image.fromarray(np.ascontiguousarray(hwc), "RGB")
        else:
            image = to_chw(hwc)
        return self.transform(image) if self.transform is not None else image

    # ------------------------------------------------------------ files
    def location_of(self, name: str) -> str:
        """The path or URL of the dataset's file ``name``, as shown in messages."""
        return self.remote.url_of(name) if self.remote is not None else str(Path(self.root) / name)

    def file_ref(self, name: str) -> Callable[[], str]:
        """A picklable callable giving this process a local path of file ``name``.

        Local: the file itself. Remote: its copy in the cache, fetched if
        needed and pinned in the calling process until :meth:`close`.
        """
        if self.remote is None:
            return functools.partial(str, Path(self.root) / name)
        return functools.partial(_remote_local, self.remote, name)

    # ------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        """The attributes, with the index's arrays named rather than copied: a local index pickles
        as its folder (:meth:`readers.contract.spec.Index.__reduce__`) and the receiving process maps the
        same files again, so a spawned worker holds no private copy of them."""
        state = self.__dict__.copy()
        index = state.get("index")
        if index is not None:
            names = {id(a): name for name, a in index.arrays.items()}
            for key, value in state.items():
                if isinstance(value, np.ndarray) and id(value) in names:
                    state[key] = _IndexArray(names[id(value)])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        index: Any = state.get("index")  # an _IndexArray names one of its arrays
        sharers = state.get("_sharers")
        if isinstance(sharers, _Sharers):
            state["_sharers"] = sharers.joined()
        for key, value in state.items():
            if isinstance(value, _IndexArray):
                state[key] = index.arrays[value.name]
        self.__dict__.update(state)

    def close(self) -> None:
        """Close this process's handles (safe to call more than once)."""
        columns = getattr(self, "_columns", None)
        if columns is not None:
            columns.close()  # drops this process's mapped field columns
        remote = getattr(self, "remote", None)
        if remote is not None:
            remote.close()  # unpins this process's cached copies

    def __del__(self) -> None:
        try:
            sharers = getattr(self, "_sharers", None)
            if sharers is None or sharers.left():  # a copy still in use keeps the shared handles open
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, samples={len(self.labels)}, classes={len(self.classes)})"


class MapReader(PackedDataset, torch.utils.data.Dataset):
    """Map-style reader: ``__len__``, ``__getitem__`` and batched ``__getitems__``."""

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def data_name(self) -> str:
        """The format's one data file's name (``readers.contract.spec.DATA_FILE``)."""
        return spec.DATA_FILE[self.format]

    @property
    def data_file(self) -> Path:
        """The format's one data file, local (remote: its cached copy, fetched if needed and pinned)."""
        if self.remote is None:
            return Path(self.root) / self.data_name
        return Path(self.remote.local(self.data_name))

    @property
    def data_location(self) -> str:
        """The data file's path or URL, as shown in messages (never downloads)."""
        return self.location_of(self.data_name)

    def _fetch_data(self) -> None:
        """Remote: download the data file into the cache now, in this (the parent) process."""
        if self.remote is not None:
            self.remote.fetch(self.data_name, self._progress)

    def where(self, i: int) -> str:
        return self.data_location

    def _check(self, i: int) -> int:
        n = len(self.labels)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range for {n} samples")
        return int(i)

    def read_many(self, indices: list[int]) -> list[Any]:
        return [self.read(i) for i in indices]

    def __getitem__(self, i: int) -> Any:
        return self._make(self._check(i))

    def batchable(self) -> bool:
        """True when ``get_batch`` reads whole batches with these settings (see ``readers.formats.batch``)."""
        return False

    def get_batch(self, indices: list[int], alloc: Any = None) -> tuple | None:
        """The collated batch in one read, or None (no whole-batch path); see ``readers.formats.batch``."""
        return None

    def __getitems__(self, indices: list[int]) -> Any:
        """Fetch a whole batch in one call (the DataLoader uses this when present).

        A list of items, or, when the reader is ``batchable()``, a
        ``readers.formats.batch.GatheredItems``: the same items as a sequence, which
        ``readers.loader.collation.Collate`` turns into the batch in one read instead."""
        if self.fields is None and self.batchable():
            from readers.formats.batch import GatheredItems

            return GatheredItems(self, indices)
        indices = [self._check(i) for i in indices]
        if self.fields is not None:
            return [self._field_item(i) for i in indices]
        return [self._item(i, d) for i, d in zip(indices, self.read_many(indices))]
