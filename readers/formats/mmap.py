"""Memory-mapped pixel reader. Counterpart: ``packer/formats/mmap.py`` (layout there).

The data file (``spec.DATA_FILE["mmap"]``, ``images.npy``) is mapped
read-only, lazily per process; sample ``i`` is the view ``flat[offsets[i] : offsets[i] + heights[i]*widths[i]*3]`` reshaped to
HWC. Pages come from the OS page cache, shared by every worker: memory
does not grow with ``num_workers``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import torch

from readers import spec
from readers.base import LazyHandle, MapReader
from readers.batch import Allocator, batch_buffer, finish_batch, index_array
from readers.shmring import ByteBatch

__all__ = ["MemmapDataset"]


class MemmapDataset(MapReader):
    format = "mmap"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._offsets = self.index.arrays["offsets"]
        self._heights = self.index.arrays["heights"]
        self._widths = self.index.arrays["widths"]
        self.fixed_shape = self.meta["storage"].get("fixed_shape")
        self._back_to_back: bool | None = None  # samples at offsets 0, S*S*3, 2*S*S*3, ... (see rows())
        self._map = LazyHandle(functools.partial(MemmapDataset._open, self.data_file))

    @staticmethod
    def _open(file: os.PathLike) -> np.ndarray:
        try:
            arr = np.load(file, mmap_mode="r")
        except ValueError as exc:
            raise spec.DatasetFormatError(f"{file}: not a complete .npy file ({exc})") from exc
        return arr.reshape(-1)

    def read(self, i: int) -> np.ndarray:
        flat = self._map.get()
        h, w = int(self._heights[i]), int(self._widths[i])
        start = int(self._offsets[i])
        end = start + h * w * 3
        if end > flat.shape[0]:
            raise spec.DatasetFormatError(
                f"{self.data_file}: sample {i} ends at byte {end}, past the end of the "
                f"data ({flat.shape[0]} bytes): the file is truncated or damaged"
            )
        return flat[start:end].reshape(h, w, 3)

    def rows(self) -> np.ndarray | None:
        """All samples as one ``(N, S, S, 3)`` array over the mapping (fixed-shape packs whose
        samples lie back to back, as ``--resize`` writes them); None otherwise."""
        shape = self.fixed_shape
        if not shape:
            return None
        stride = int(np.prod(shape))
        n = len(self.labels)
        if self._back_to_back is None:  # checked once: O(N)
            self._back_to_back = not n or bool(self._offsets[0] == 0 and np.all(np.diff(self._offsets) == stride))
        if not self._back_to_back:
            return None
        flat = self._map.get()
        if flat.shape[0] < n * stride:
            raise spec.DatasetFormatError(
                f"{self.data_file}: holds {flat.shape[0]} bytes of pixels, {n} samples of {shape} need "
                f"{n * stride}: the file is truncated or damaged")
        return flat[: n * stride].reshape(n, *shape)

    def batchable(self) -> bool:
        return self.transform is None and self.rows() is not None

    def get_batch(self, indices: list[int], alloc: Allocator | None = None) -> tuple | None:
        """The whole batch in one gather (``numpy.take``) into one buffer; see ``readers.batch``.

        Decoded: a uint8 ``[B, 3, S, S]`` tensor in ``channels_last`` layout (the stored HWC
        rows, not transposed). ``decode=False``: a ByteBatch of each sample's HWC bytes.
        None (use ``__getitems__``) with a transform or without a fixed shape.
        """
        if self.transform is not None:
            return None
        rows = self.rows()
        if rows is None:
            return None
        idx = index_array(indices, len(self.labels))
        shape = rows.shape[1:]
        nbytes = int(np.prod(shape))
        out = batch_buffer(len(idx) * nbytes, alloc).reshape(len(idx), *shape)
        # mode="clip": the indices are checked already, and with the default "raise" numpy writes
        # through a temporary buffer when given `out` (measured: 2.5x slower)
        np.take(rows, idx, axis=0, out=out, mode="clip")
        if self.decode:
            images: Any = torch.from_numpy(out).permute(0, 3, 1, 2)
        else:
            images = ByteBatch(torch.from_numpy(out.reshape(-1)),
                               torch.arange(len(idx) + 1, dtype=torch.int64) * nbytes)
        return finish_batch(self, images, idx)

    def _convert(self, data: np.ndarray) -> Any:
        if not self.decode:
            return data.tobytes()
        return self._transformed(data)  # stored pixels: even a fused transform gets the decoded image

    def close(self) -> None:
        self._map.close()
