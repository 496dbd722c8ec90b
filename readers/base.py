"""What every reader shares: the index, lazy per-process handles, decode and transform.

A reader is built from a dataset folder or from an already read
:class:`readers.spec.Index` (``open_dataset`` reads the index once and hands
it over); either way the index is public as ``reader.index``. The
constructor keeps only the dataset path and small numpy index arrays
(labels, sizes, offsets): no open file, no per-sample Python objects. A
format's handle (tar file descriptor, LMDB environment, HDF5 file, memmap)
is a :class:`readers.perprocess.PerProcess`: opened on first use in the
process that uses it, re-opened when the pid changes (a forked DataLoader
worker never uses its parent's handle), and dropped when the dataset is
pickled (spawned workers, DDP).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from readers import spec
from readers.checks import check_index
from readers.compose import accepts_bytes, warn_if_fused_lost
from readers.decode import DecodeError, decode_rgb
from readers.resolve import resolve_index

__all__ = ["PackedDataset", "MapReader", "to_chw", "IMAGE_KINDS"]

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


class _IndexArray(NamedTuple):
    """In a pickled reader: "this attribute is the index's array ``name``" (sent once, with the index)."""

    name: str


def _remote_local(remote: Any, name: str) -> str:
    return remote.local(name)


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
    ) -> None:
        """``source``: a dataset folder or URL, or its index as :func:`readers.spec.read_index` returned it.

        What ``transform`` receives: the stored bytes when it is fused (``accepts_bytes``, also a
        Compose whose first step is), else the decoded RGB image as a uint8 CHW tensor
        (``image="tensor"``, default) or a PIL RGB image (``image="pil"``, for torchvision
        pipelines that start with e.g. ``Resize`` and end with ``ToTensor``).

        Remote datasets (``s3://``, ``http(s)://``): ``storage_options`` and
        ``retry`` reach the store; ``cache_dir`` / ``cache_limit`` name the
        node-local cache (see docs/remote.md); ``progress(done, total)`` follows
        a download made while opening. All five are ignored for a local folder.
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
        self.classes = index.classes
        self.labels = index.labels
        self.transform = transform
        self.decode = decode
        self.return_index = return_index
        self.image = image
        self._fused = accepts_bytes(transform)
        warn_if_fused_lost(transform)

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

    def _convert(self, data: Any) -> Any:
        if not self.decode:
            return data if isinstance(data, bytes) else bytes(data)
        if self._fused:
            return self.transform(bytes(data))
        return self._transformed(decode_rgb(data))

    def _transformed(self, hwc: np.ndarray) -> Any:
        """The decoded (H, W, 3) pixels as ``image`` asks, through ``transform``."""
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
        as its folder (:meth:`readers.spec.Index.__reduce__`) and the receiving process maps the
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
        index = state.get("index")
        for key, value in state.items():
            if isinstance(value, _IndexArray):
                state[key] = index.arrays[value.name]
        self.__dict__.update(state)

    def close(self) -> None:
        """Close this process's handles (safe to call more than once)."""
        remote = getattr(self, "remote", None)
        if remote is not None:
            remote.close()  # unpins this process's cached copies

    def __del__(self) -> None:
        try:
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
        """The format's one data file's name (``readers.spec.DATA_FILE``)."""
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

    def read(self, i: int) -> Any:
        """The stored bytes (or pixel array, for mmap) of sample ``i``."""
        raise NotImplementedError

    def read_many(self, indices: list[int]) -> list[Any]:
        return [self.read(i) for i in indices]

    def __getitem__(self, i: int) -> tuple:
        i = self._check(i)
        return self._item(i, self.read(i))

    def batchable(self) -> bool:
        """True when ``get_batch`` reads whole batches with these settings (see ``readers.batch``)."""
        return False

    def get_batch(self, indices: list[int], alloc: Any = None) -> tuple | None:
        """The collated batch in one read, or None (no whole-batch path); see ``readers.batch``."""
        return None

    def __getitems__(self, indices: list[int]) -> Any:
        """Fetch a whole batch in one call (the DataLoader uses this when present).

        A list of items, or, when the reader is ``batchable()``, a
        ``readers.batch.GatheredItems``: the same items as a sequence, which
        ``readers.loader.Collate`` turns into the batch in one read instead."""
        if self.batchable():
            from readers.batch import GatheredItems

            return GatheredItems(self, indices)
        indices = [self._check(i) for i in indices]
        return [self._item(i, d) for i, d in zip(indices, self.read_many(indices))]
