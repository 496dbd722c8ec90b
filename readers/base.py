"""What every reader shares: the index, lazy per-process handles, decode and transform.

The constructor keeps only the dataset path and small numpy index arrays
(labels, sizes, offsets): no open file, no per-sample Python objects. A
format's handle (tar file descriptor, LMDB environment, HDF5 file, memmap)
is opened on first use in the process that uses it, re-opened when the pid
changes (a forked DataLoader worker never uses its parent's handle), and
dropped when the dataset is pickled (spawned workers, DDP).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from readers import spec
from readers.decode import decode_rgb

__all__ = ["PackedDataset", "LazyHandle", "to_chw"]


def to_chw(arr: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 array -> (3, H, W) uint8 tensor (a copy, contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


class LazyHandle:
    """Opens ``opener()`` on first use per process; ``closer(handle)`` on close."""

    def __init__(self, opener: Callable[[], Any], closer: Callable[[Any], None] | None = None) -> None:
        self._opener, self._closer = opener, closer
        self._handle: Any = None
        self._pid: int | None = None

    def get(self) -> Any:
        pid = os.getpid()
        if self._handle is None or self._pid != pid:
            # An inherited handle belongs to the parent: never use or close it here.
            self._handle, self._pid = self._opener(), pid
        return self._handle

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid() and self._closer is not None:
            self._closer(self._handle)
        self._handle, self._pid = None, None

    def __getstate__(self) -> dict[str, Any]:
        return {"_opener": self._opener, "_closer": self._closer, "_handle": None, "_pid": None}


class PackedDataset:
    """Mixin for all readers: index loading, item building, pickling."""

    format: str = ""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        transform: Callable[[Any], Any] | None = None,
        decode: bool = True,
        return_index: bool = False,
    ) -> None:
        index = spec.read_index(path)
        if index.format != self.format:
            raise spec.DatasetFormatError(
                f"{path} holds a {index.format!r} dataset; {type(self).__name__} reads {self.format!r} "
                "(readers.open_dataset picks the right reader)"
            )
        self.root = Path(path)
        self.meta = index.meta
        self.classes = index.classes
        self.labels = index.labels
        self._arrays = index.arrays
        self.transform = transform
        self.decode = decode
        self.return_index = return_index

    # ------------------------------------------------------------ items
    def _label(self, i: int) -> int:
        return int(self.labels[i])

    def _item(self, i: int, data: Any) -> tuple:
        """Build the item from the stored bytes (or pixels) of sample ``i``."""
        image = self._convert(data)
        return (image, self._label(i), i) if self.return_index else (image, self._label(i))

    def _convert(self, data: Any) -> Any:
        if not self.decode:
            return data if isinstance(data, bytes) else bytes(data)
        if self.transform is not None and getattr(self.transform, "accepts_bytes", False):
            return self.transform(bytes(data))
        image = to_chw(decode_rgb(data))
        return self.transform(image) if self.transform is not None else image

    # ------------------------------------------------------------ pickling
    def close(self) -> None:
        """Close this process's handles (safe to call more than once)."""

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

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        """Fetch a whole batch in one call (the DataLoader uses this when present)."""
        indices = [self._check(i) for i in indices]
        return [self._item(i, d) for i, d in zip(indices, self.read_many(indices))]
