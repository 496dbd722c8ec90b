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

from readers import spec
from readers.base import LazyHandle, MapReader

__all__ = ["MemmapDataset"]


class MemmapDataset(MapReader):
    format = "mmap"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._offsets = self.index.arrays["offsets"]
        self._heights = self.index.arrays["heights"]
        self._widths = self.index.arrays["widths"]
        self.fixed_shape = self.meta["storage"].get("fixed_shape")
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

    def _convert(self, data: np.ndarray) -> Any:
        if not self.decode:
            return data.tobytes()
        return self._transformed(data)  # stored pixels: even a fused transform gets the decoded image

    def close(self) -> None:
        self._map.close()
