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

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from readers import spec
from readers.compose import accepts_bytes, warn_if_fused_lost
from readers.decode import decode_rgb
from readers.perprocess import PerProcess

__all__ = ["PackedDataset", "MapReader", "LazyHandle", "to_chw", "IMAGE_KINDS"]

#: What a reader's decoded image is: a uint8 CHW tensor, or a PIL RGB image (torchvision pipelines).
IMAGE_KINDS = ("tensor", "pil")


def to_chw(arr: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 array -> (3, H, W) uint8 tensor (a copy, contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


#: A reader's lazily opened, per-process file handle (the one per-process idiom, readers.perprocess).
LazyHandle = PerProcess


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
    ) -> None:
        """``source``: a dataset folder, or its index as :func:`readers.spec.read_index` returned it.

        What ``transform`` receives: the stored bytes when it is fused (``accepts_bytes``, also a
        Compose whose first step is), else the decoded RGB image as a uint8 CHW tensor
        (``image="tensor"``, default) or a PIL RGB image (``image="pil"``, for torchvision
        pipelines that start with e.g. ``Resize`` and end with ``ToTensor``)."""
        if image not in IMAGE_KINDS:
            raise ValueError(f"image must be one of {IMAGE_KINDS}, got {image!r}")
        index = source if isinstance(source, spec.Index) else spec.read_index(source)
        if index.format != self.format:
            raise spec.DatasetFormatError(
                f"{index.root} holds a {index.format!r} dataset; {type(self).__name__} reads {self.format!r} "
                "(readers.open_dataset picks the right reader)"
            )
        #: The dataset's index (metadata and per-sample arrays), read once, shared with whoever passed it in.
        self.index = index
        self.root = Path(index.root)
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
        image = self._convert(data)
        return (image, self._label(i), i) if self.return_index else (image, self._label(i))

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

    @property
    def data_file(self) -> Path:
        """The format's one data file (``readers.spec.DATA_FILE``)."""
        return self.root / spec.DATA_FILE[self.format]

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
