"""Memory-mapped pixel reader. Counterpart: ``packer/formats/mmap.py`` (layout there).

The data file (``spec.DATA_FILE["mmap"]``, ``images.npy``) is mapped
read-only, lazily per process; sample ``i`` is the view ``flat[offsets[i] : offsets[i] + heights[i]*widths[i]*3]`` reshaped to
HWC. Pages come from the OS page cache, shared by every worker: memory
does not grow with ``num_workers``.

Remote (``s3://``, ``http(s)://``): with ``cache_dir`` the file is
downloaded into the node cache when the dataset is opened and mapped from
there; without, each sample is one range request (its CRC-32 checked), which
suits looking at a few samples, not training (see docs/remote.md).

The file must be a regular file (inside the dataset folder when local) of at
least the size index.json records before it is mapped. ``read(i)`` returns a
read-only view of the map; items (tensors, bytes) are always copies, so an
in-place operation on a returned tensor never touches the read-only map.
"""

from __future__ import annotations

import functools
import io
import math
import mmap
import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import numpy.lib.format as npformat
import torch

from readers.contract import spec
from readers.formats.base import MapReader
from readers.formats.batch import Allocator, finish_batch, index_array, new_byte_batch
from readers.contract.fields import Field, blob_file, offsets_file
from readers.contract.perprocess import PerProcess

__all__ = ["MemmapDataset"]


def _open_flat(file: Callable[[], str], size: int | None = None) -> np.ndarray:
    """Map the pixel file read-only, from a descriptor checked first (no second open)."""
    path = file()
    fd = spec.open_data_file(path, size)
    try:
        head = io.BytesIO(os.pread(fd, spec.MMAP_HEADER_BYTES, 0))
        try:
            version = npformat.read_magic(head)
            reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, fortran, dtype = reader(head)
            count = math.prod(shape)
        except Exception as exc:  # noqa: BLE001 - a crafted header raises many types (ValueError, TokenError, ...)
            raise spec.DatasetFormatError(f"{path}: not a complete .npy file ({type(exc).__name__}: {exc})") from None
        data = os.fstat(fd).st_size - spec.MMAP_HEADER_BYTES
        # count < data: an append is growing the file (its header is rewritten last); positions come from the index
        if dtype != np.uint8 or fortran or head.tell() != spec.MMAP_HEADER_BYTES or count > data:
            raise spec.DatasetFormatError(
                f"{path}: not the pixel file this reader expects ({spec.MMAP_HEADER_BYTES}-byte header, then "
                f"uint8 data filling the file; its header says {dtype} {shape} for {data} bytes)")
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if data else b""
    finally:
        os.close(fd)
    return np.frombuffer(mapped, dtype=np.uint8, count=data, offset=spec.MMAP_HEADER_BYTES if data else 0)


class MemmapDataset(MapReader):
    format = "mmap"

    def __init__(self, source: str | os.PathLike | spec.Index, **kw: Any) -> None:
        super().__init__(source, **kw)
        self._offsets = self.index.arrays["offsets"]
        self._heights = self.index.arrays["heights"]
        self._widths = self.index.arrays["widths"]
        self.fixed_shape = self.meta["storage"].get("fixed_shape")
        self._back_to_back: bool | None = None  # samples at offsets 0, S*S*3, 2*S*S*3, ... (see rows())
        #: Remote without a cache: samples are read by range requests, nothing is downloaded whole.
        self.ranged = self.remote is not None and not self.remote.cached
        if self.remote is not None and not self.ranged:
            self._fetch_data()
        if self.remote is None:  # a symlink leaving the folder is refused before anything opens it
            spec.member_path(self.root, self.data_name, "data file")
        size = (self.meta.get("files") or {}).get(self.data_name)
        self._map = PerProcess(functools.partial(_open_flat, self.file_ref(self.data_name), size))
        self._blobs: PerProcess[dict[str, tuple[np.ndarray, np.ndarray]]] = PerProcess(dict)
        self._rows_tensor: PerProcess[torch.Tensor] = PerProcess(self._rows_as_tensor)

    def _blob_file(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Variable field ``name``: ``field-<name>.bin`` mapped, and ``field-<name>.offsets.npy``
        (``<i8``, N + 1; sample i is ``bin[off[i]:off[i+1]]``), in this process on first use."""
        files = self._blobs.get()
        got = files.get(name)
        if got is None:
            blob, ends = blob_file(name), offsets_file(name)
            offsets = spec.map_npy(self.file_ref(ends)(), np.dtype("<i8"), len(self.labels) + 1,
                                   what=f"field {name!r} offsets")[0]
            fd = spec.open_regular(self.file_ref(blob)(), f"field {name!r} data")
            try:
                data = spec.map_file(fd)
            finally:
                os.close(fd)
            bad = np.flatnonzero((offsets[1:] < offsets[:-1]) | (offsets[1:] > len(data)))
            if len(bad) or (len(offsets) and offsets[0] < 0):
                k = int(bad[0]) if len(bad) else 0
                raise spec.DatasetFormatError(
                    f"{self.location_of(ends)}: sample {k}: offsets {offsets[k]}..{offsets[k + 1]} "
                    f"do not lie in {blob} ({len(data)} bytes)")
            got = files[name] = (data, offsets)
        return got

    def field_location(self, field: Any, i: int) -> str:
        if field.type.fixed:
            return super().field_location(field, i)
        return self.location_of(blob_file(field.name))

    def _read_blobs(self, i: int, fields: Sequence[Field]) -> dict[str, bytes]:
        out = {}
        for f in fields:
            data, offsets = self._blob_file(f.name)
            out[f.name] = data[int(offsets[i]):int(offsets[i + 1])].tobytes()
        return out

    def read(self, i: int) -> np.ndarray:
        h, w = int(self._heights[i]), int(self._widths[i])
        start = int(self._offsets[i])
        end = start + h * w * 3
        if self.ranged:
            return self._read_ranged(i, start, end).reshape(h, w, 3)
        flat = self._map.get()
        if end > flat.shape[0]:
            raise spec.DatasetFormatError(
                f"{self.data_location}: sample {i} ends at byte {end}, past the end of the "
                f"data ({flat.shape[0]} bytes): the file is truncated or damaged"
            )
        return flat[start:end].reshape(h, w, 3)

    def _read_ranged(self, i: int, start: int, end: int) -> np.ndarray:
        assert self.remote is not None, "ranged: remote without a cache"
        data = self.remote.read_range(self.data_name, spec.MMAP_HEADER_BYTES + start, end - start)
        want = int(self.index.arrays["checksums"][i])
        if spec.checksum(data) != want:
            from readers.remote.errors import RemoteIntegrityError

            raise RemoteIntegrityError(f"{self.data_location} sample {i}: checksum mismatch (CRC-32 "
                                       f"{spec.checksum(data):08x}, the index says {want:08x}): damaged object")
        return np.frombuffer(data, dtype=np.uint8)

    def rows(self) -> np.ndarray | None:
        """All samples as one ``(N, S, S, 3)`` array over the mapping (fixed-shape packs whose
        samples lie back to back, as ``--resize`` writes them); None otherwise (then every sample
        is read on its own, with its own checks)."""
        shape = self.fixed_shape
        if not shape or self.ranged:  # remote without a cache: one range request per sample
            return None
        stride = int(np.prod(shape))
        n = len(self.labels)
        if self._back_to_back is None:  # checked once, O(N): also that each sample is the fixed shape
            self._back_to_back = not n or bool(
                self._offsets[0] == 0 and np.all(np.diff(self._offsets) == stride)
                and np.all(self._heights == shape[0]) and np.all(self._widths == shape[1]))
        if not self._back_to_back:
            return None
        flat = self._map.get()
        if flat.shape[0] < n * stride:
            raise spec.DatasetFormatError(
                f"{self.data_location}: holds {flat.shape[0]} bytes of pixels, {n} samples of {shape} need "
                f"{n * stride}: the file is truncated or damaged")
        return flat[: n * stride].reshape(n, *shape)

    def _rows_as_tensor(self) -> torch.Tensor:
        """:meth:`rows` as a tensor over the same read-only mapping, which is only ever read from
        (torch warns that it cannot mark a tensor read-only; created once per process)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
            return torch.from_numpy(self.rows())

    def batchable(self) -> bool:
        return (self.fields is None and (not self.decode or self.transform is None or self._crop_box() is not None)
                and self.rows() is not None)

    def _crop_box(self) -> tuple[int, int, int, int] | None:
        """``(top, left, height, width)`` when the transform only crops this pack's stored pixels: the readers'
        eval transform (``ResizeCenterCrop``) whose resize is the stored shorter side, so its output is
        exactly that window of every sample (no resampling); None for any other transform or shape."""
        from readers.decode.transforms import ResizeCenterCrop

        shape, t = self.fixed_shape, self.transform
        if type(t) is not ResizeCenterCrop or not shape or min(shape[0], shape[1]) != t.options.resize:
            return None
        box = t.box(int(shape[0]), int(shape[1]))
        if any(v != int(v) for v in box) or (int(box.height), int(box.width)) != t.options.size:
            return None
        return int(box.top), int(box.left), int(box.height), int(box.width)

    def get_batch(self, indices: list[int], alloc: Allocator | None = None) -> tuple | None:
        """The whole batch in one gather (``numpy.take``) into one buffer; see ``readers.formats.batch``.

        Decoded: a uint8 ``[B, 3, S, S]`` tensor in ``channels_last`` layout (the stored HWC
        rows, not transposed). ``decode=False``: a ByteBatch of each sample's HWC bytes. With
        the eval transform on pixels stored at its resize size (``_crop_box``): the window of
        every sample copied straight into the batch, ``[B, 3, h, w]`` ``channels_last``.
        None (use ``__getitems__``) with another transform or without a fixed shape.
        """
        crop = self._crop_box() if self.decode and self.transform is not None else None
        if self.fields is not None or (self.decode and self.transform is not None and crop is None):
            return None
        rows = self.rows()
        if rows is None:
            return None
        idx = index_array(indices, len(self.labels))
        shape = rows.shape[1:] if crop is None else (crop[2], crop[3], rows.shape[3])
        nbytes = int(np.prod(shape))
        batch, flat = new_byte_batch(np.arange(len(idx) + 1, dtype=np.int64) * nbytes, alloc)
        out = flat.reshape(len(idx), *shape)
        if crop is None:
            # mode="clip": the indices are checked already, and with the default "raise" numpy writes
            # through a temporary buffer when given `out` (measured: 2.5x slower)
            np.take(rows, idx, axis=0, out=out, mode="clip")
        else:  # one gather of the strided window (np.take would first copy the whole cropped view)
            top, left, h, w = crop
            # torch's gather releases the GIL for the whole batch; a numpy copy per sample holds it,
            # so loader threads ran one at a time (measured: 2 threads 67k samples/s, one 69k)
            window = self._rows_tensor.get()[:, top:top + h, left:left + w]
            torch.index_select(window, 0, torch.from_numpy(idx), out=torch.from_numpy(out))
        if self.decode:
            images: Any = torch.from_numpy(out).permute(0, 3, 1, 2)
        else:
            images = batch
        return finish_batch(self, images, idx)

    def _convert(self, data: np.ndarray) -> Any:
        if not self.decode:
            return data.tobytes()
        return self._transformed(data)  # stored pixels: even a fused transform gets the decoded image

    def close(self) -> None:
        self._map.close()
        self._blobs.close()
        super().close()
