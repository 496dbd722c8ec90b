"""Memory-mapped pixel reader. Counterpart: ``packer/formats/mmap.py`` (layout there).

The data file (``spec.DATA_FILE["mmap"]``, ``images.npy``) is mapped
read-only, lazily per process; sample ``i`` is the view ``flat[offsets[i] : offsets[i] + heights[i]*widths[i]*3]`` reshaped to
HWC. Pages come from the OS page cache, shared by every worker: memory
does not grow with ``num_workers``.

The file must be a regular file inside the dataset folder of the size
index.json records before it is mapped. ``read(i)`` returns a read-only
view of the map; items (tensors, bytes) are always copies, so an in-place
operation on a returned tensor never touches the read-only map.
"""

from __future__ import annotations

import functools
import io
import math
import mmap
import os
from typing import Any

import numpy as np
import numpy.lib.format as npformat

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
        size = (self.meta.get("files") or {}).get(spec.DATA_FILE["mmap"])
        self._map = LazyHandle(functools.partial(MemmapDataset._open, str(self.root), size))

    @staticmethod
    def _open(root: str, size: int | None = None) -> np.ndarray:
        """Map the pixel file read-only, from a descriptor checked first (no second open)."""
        name = spec.DATA_FILE["mmap"]
        fd = spec.open_member(root, name, "data file", size)
        file = os.path.join(root, name)
        try:
            head = io.BytesIO(os.pread(fd, spec.MMAP_HEADER_BYTES, 0))
            try:
                version = npformat.read_magic(head)
                reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                shape, fortran, dtype = reader(head)
                count = math.prod(shape)
            except Exception as exc:  # noqa: BLE001 - a crafted header raises many types (ValueError, TokenError, ...)
                raise spec.DatasetFormatError(f"{file}: not a complete .npy file ({type(exc).__name__}: {exc})") from None
            data = os.fstat(fd).st_size - spec.MMAP_HEADER_BYTES
            if dtype != np.uint8 or fortran or head.tell() != spec.MMAP_HEADER_BYTES or count != data:
                raise spec.DatasetFormatError(
                    f"{file}: not the pixel file this reader expects ({spec.MMAP_HEADER_BYTES}-byte header, then "
                    f"uint8 data filling the file; its header says {dtype} {shape} for {data} bytes)")
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if data else b""
        finally:
            os.close(fd)
        return np.frombuffer(mapped, dtype=np.uint8, count=data, offset=spec.MMAP_HEADER_BYTES if data else 0)

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
        return self._transformed(data)  # stored pixels, copied (to_chw): never a tensor over the map

    def close(self) -> None:
        self._map.close()
