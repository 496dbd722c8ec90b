"""Memory-mapped pixels: decoded RGB uint8 in one flat ``images.npy``.

Counterpart: ``readers/formats/mmap.py``. Byte layout::

    +-----------------------------+----------------------------------------+
    | .npy header, padded to      | sample 0 pixels  | sample 1 pixels | ... |
    | spec.MMAP_HEADER_BYTES (128)| H0*W0*3 (HWC)    | H1*W1*3         |     |
    +-----------------------------+----------------------------------------+
      offsets[i] = position of sample i's first byte, counted from the end of
      the header; heights[i], widths[i] give its shape.

With ``resize`` set every sample is ``resize x resize`` and the header says
shape ``(N, resize, resize, 3)``: ``numpy.load("images.npy", mmap_mode="r")``
is the whole dataset as one array. Otherwise the header says ``(total,)``
uint8 and samples are cut out with the index arrays. The header is written
at close: until then its bytes are zero and ``numpy.load`` refuses the file.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from packer.formats.base import FormatWriter
from packer.prepare.images import Prepared
from readers.contract.spec import DATA_FILE, MMAP_HEADER_BYTES

__all__ = ["MemmapWriter", "npy_header"]


def npy_header(shape: tuple[int, ...]) -> bytes:
    """A version 1.0 .npy header for C-order uint8 ``shape``, exactly MMAP_HEADER_BYTES long."""
    text = "{'descr': '|u1', 'fortran_order': False, 'shape': %r, }" % (tuple(shape),)
    body_len = MMAP_HEADER_BYTES - 10  # magic (6) + version (2) + header length (2)
    if len(text) + 1 > body_len:
        raise ValueError(f"shape {shape} does not fit a {MMAP_HEADER_BYTES}-byte .npy header")
    text = text.ljust(body_len - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + body_len.to_bytes(2, "little") + text.encode("latin1")


class MemmapWriter(FormatWriter):
    format = "mmap"
    location_fields = ("offsets",)
    pixels = True
    variable_blobs = True  # other fields: field-<name>.npy, or field-<name>.bin + field-<name>.offsets.npy

    def open(self, samples: int, state: dict[str, Any] | None) -> None:
        self.path = self.root / DATA_FILE[self.format]
        self.pos = int(state["bytes"]) if state else 0
        mode = "r+b" if state and self.path.exists() else "wb"
        self._file = open(self.path, mode)
        self._file.truncate(MMAP_HEADER_BYTES + self.pos)
        if not self.options.append:  # an append keeps the previous generation's header until finalize
            self._file.seek(0)
            self._file.write(b"\0" * MMAP_HEADER_BYTES)
        self._file.seek(MMAP_HEADER_BYTES + self.pos)
        self._since = 0
        if self.field_store is not None:
            self.field_store.open(samples)

    def append(self, sample_no: int, prepared: Prepared, label: int,
               fields: tuple[bytes, ...] | None = None) -> tuple[int]:
        px = prepared.pixels
        if px is None:
            raise ValueError(f"the {self.format} writer stores pixels: prepare the samples with "
                             "ImageOptions(want_pixels=True)")
        self.store_fields(fields)
        offset = self.pos
        self._file.write(px.data.cast("B"))  # the array's buffer, not a copy
        self.pos += px.nbytes
        self._since += px.nbytes
        return (offset,)

    def at_checkpoint_boundary(self) -> bool:
        return self._since >= self.options.checkpoint_bytes

    def checkpoint(self) -> dict[str, Any]:
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.field_store is not None:
            self.field_store.checkpoint()
        self._since = 0
        return {"bytes": self.pos}

    def finalize(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        n, size = len(arrays["labels"]), self.options.resize
        shape: tuple[int, ...] = (n, size, size, 3) if size else (self.pos,)
        self._file.flush()
        self._file.seek(0)
        self._file.write(npy_header(shape))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        files = {self.path.name: self.path.stat().st_size}
        if self.field_store is not None:
            files.update(self.field_store.finalize(n, meta=meta))
        return {
            "storage": {"fixed_shape": [size, size, 3] if size else None, "data_offset": MMAP_HEADER_BYTES},
            "files": files,
        }

    def abort(self) -> None:
        if self.field_store is not None:
            self.field_store.close()
        if not self._file.closed:
            self._file.close()
