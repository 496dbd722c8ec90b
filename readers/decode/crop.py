"""One crop of an image, decoded and resized: what :func:`plan_crop` decides (the JPEG decode scale
and the exact region resampled) and what :func:`resized_crop` computes from encoded bytes or decoded
pixels (a ``uint8`` tensor ``(3, H, W)``).

The transforms of :mod:`readers.decode.transforms` choose the boxes (random-resized for train,
resize-then-center-crop for eval) and call :func:`resized_crop`; nothing here draws a random
number. The decodes are :mod:`readers.decode.decoders`' (whole, reduced by the JPEG's DCT scale, or
only the rows and columns a crop needs through :mod:`readers.decode.jpegcrop`).

Resizing
--------
``interpolation`` is ``"bilinear"`` (default, as torchvision's recipes) or
``"bicubic"``, always antialiased (Pillow's filters). ``backend="torch"``
(default) uses torch's uint8 antialiased ``interpolate`` kernel (AVX2), about
4x faster than Pillow's resize on one core and within 1 grey level of it;
``backend="pillow"`` uses ``PIL.Image.resize`` (or pillow-simd's when
installed) and honours sub-pixel crop boxes. With ``backend="torch"`` a box
that falls between pixels of a reduced decode is rounded to that grid (at most
``scale/2`` source pixels).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import NamedTuple, TypeGuard, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from readers.decode.decoders import (
    DECODERS,
    ImageHeader,
    decode_rgb_region,
    decode_rgb_scaled,
    read_header,
    reduction_for,
)

__all__ = [
    "Box",
    "CropPlan",
    "plan_crop",
    "resized_crop",
    "image_size",
    "size_pair",
    "check_resize_options",
    "ImageInput",
    "Encoded",
]

ImageInput = Union[bytes, bytearray, memoryview, np.ndarray, torch.Tensor]
Encoded = bytes | bytearray | memoryview | np.ndarray  # stored bytes (an array of them: 1-D)

_INTERP = ("bilinear", "bicubic")
_PIL_FILTER = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
_BACKENDS = ("torch", "pillow")


class Box(NamedTuple):
    """A crop box in source-pixel coordinates, torchvision's ``(i, j, h, w)`` order."""

    top: float
    left: float
    height: float
    width: float


# --------------------------------------------------------------------------- options


def size_pair(size: int | tuple[int, int], name: str) -> tuple[int, int]:
    """``size`` (an int, or a (height, width) pair of positive ints) as (height, width); ``name`` is the option's."""
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in size):
        raise ValueError(f"{name} must be a positive int or (height, width) pair, got {size!r}")
    return int(size[0]), int(size[1])


def check_resize_options(interpolation: str, backend: str, decoder: str) -> None:
    """A ValueError naming the option unless each is one this module knows (the transforms' options too)."""
    if interpolation not in _INTERP:
        raise ValueError(f"interpolation must be one of {_INTERP}, got {interpolation!r}")
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if decoder != "auto" and decoder not in DECODERS:
        raise ValueError(f"decoder must be 'auto' or one of {DECODERS}, got {decoder!r}")


# --------------------------------------------------------------------------- pixels


def image_size(image: ImageInput) -> tuple[int, int]:
    """(height, width) of encoded bytes (from the header only), a decoded array or a CHW tensor."""
    if _is_encoded(image):
        header = read_header(image)
        return header.height, header.width
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    if not isinstance(image, np.ndarray):
        raise TypeError(f"expected a uint8 image array or tensor, got {type(image).__name__}")
    return int(image.shape[0]), int(image.shape[1])


def _as_hwc(image: ImageInput) -> np.ndarray:
    """A decoded image (array or tensor; :func:`_is_encoded` is false) as a uint8 (H, W, 3) array."""
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] not in (1, 3):
            raise ValueError(f"expected a uint8 (3, H, W) tensor, got {image.dtype} {tuple(image.shape)}")
        image = image.permute(1, 2, 0).cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise TypeError(f"expected a uint8 image array or tensor, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image array, got {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3):
        raise ValueError(f"expected an (H, W, 3) or (H, W) array, got shape {image.shape}")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return image


def _is_encoded(image: object) -> TypeGuard[Encoded]:
    return isinstance(image, (bytes, bytearray, memoryview)) or (
        isinstance(image, np.ndarray) and image.ndim == 1)


def _resize_pillow(arr: np.ndarray, y0: float, x0: float, y1: float, x1: float, size: tuple[int, int],
                   interpolation: str, margin: bool) -> np.ndarray:
    """Resize the region [y0, y1) x [x0, x1) of ``arr`` to ``size`` with Pillow.

    ``margin=False`` crops first (torchvision's crop-then-resize: the filter
    sees only the crop); ``margin=True`` lets the filter read the pixels
    around the region (resize-then-crop semantics).
    """
    oh, ow = size
    H, W = arr.shape[:2]
    pad = 0
    if margin:
        scale = max((y1 - y0) / oh, (x1 - x0) / ow, 1.0)
        pad = int(math.ceil(_SUPPORT[interpolation] * scale)) + 1
    cy0, cx0 = max(int(math.floor(y0)) - pad, 0), max(int(math.floor(x0)) - pad, 0)
    cy1, cx1 = min(int(math.ceil(y1)) + pad, H), min(int(math.ceil(x1)) + pad, W)
    sub = Image.fromarray(np.ascontiguousarray(arr[cy0:cy1, cx0:cx1]))
    box = (x0 - cx0, y0 - cy0, x1 - cx0, y1 - cy0)
    out = sub.resize((ow, oh), _PIL_FILTER[interpolation], box=box)
    return np.asarray(out)


def _resize_torch(arr: np.ndarray, ry0: int, rx0: int, ry1: int, rx1: int, size: tuple[int, int],
                  interpolation: str) -> torch.Tensor:
    """Crop the integer region and resize it with torch's uint8 antialiased kernel (CHW out)."""
    oh, ow = size
    sub = arr[ry0:ry1, rx0:rx1]
    if not sub.flags.writeable:  # PIL-decoded arrays are read-only; torch wants writable memory
        sub = sub.copy()
    elif min(sub.strides) < 0:  # and no negative strides (a caller's flipped array)
        sub = np.ascontiguousarray(sub)
    # Any other strided view (rows of a wider decode) goes to torch as it is: the kernel reads it as fast
    # as a compact copy and gives the same pixels, and numpy's copy of it cost ~200 us a train crop.
    hwc = torch.from_numpy(sub)
    if hwc.shape[0] == oh and hwc.shape[1] == ow:
        return hwc.permute(2, 0, 1).contiguous()
    x = hwc.permute(2, 0, 1).unsqueeze(0)  # a channels_last view: torch's fast uint8 path
    out = F.interpolate(x, size=(oh, ow), mode=interpolation, antialias=True, align_corners=False)
    return out[0].contiguous()


@contextmanager
def _on_this_thread():
    """Run torch ops on the calling thread only, restoring its intra-op thread count after (the
    OpenMP count is per thread). Intra-op threads for one crop spin against loader workers and
    threads on a busy machine: measured here under load, 6.9 ms per image against 1.2 ms."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


class CropPlan(NamedTuple):
    """How :func:`resized_crop` will produce a crop: decode scale and the region resampled."""

    #: JPEG DCT reduction denominator the image is decoded at (1, 2, 4 or 8).
    scale: int
    #: Region actually resampled, in source pixels. Equal to the requested box,
    #: except with ``backend="torch"``, where it is snapped to the decoded grid
    #: (whole decoded pixels: multiples of ``scale`` source pixels, the last
    #: one clipped to the image).
    box: Box


def plan_crop(height: int, width: int, box: Box | tuple[float, float, float, float], size: tuple[int, int], *,
              jpeg: bool, reduce: bool = True, backend: str = "torch", margin: bool = False) -> CropPlan:
    """Decide the decode scale and the exact region for cropping ``box`` of an ``height`` x ``width`` image.

    The scale is the largest ``s`` in (8, 4, 2, 1) with ``box.height // s >=
    size[0]`` and ``box.width // s >= size[1]`` (JPEG and ``reduce`` only), so
    the crop is never upsampled because of the reduction. The box is snapped
    to whole decoded pixels for ``backend="torch"`` with crop-then-resize
    semantics (``margin=False``); otherwise it is kept as given.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    oh, ow = size_pair(size, "size")
    top, left, bh, bw = (float(v) for v in box)
    eps = 1e-6 * max(height, width)
    if not (bh > 0 and bw > 0 and top >= 0 and left >= 0 and top + bh <= height + eps
            and left + bw <= width + eps):
        raise ValueError(f"crop box {tuple(box)} is not inside the {height}x{width} image")
    bottom, right = min(top + bh, height), min(left + bw, width)
    scale = 1
    if reduce and bh >= 1 and bw >= 1:
        scale = reduction_for(int(bh), int(bw), oh, ow, jpeg=jpeg)
    if backend == "torch" and not margin:
        rows, cols = -(-height // scale), -(-width // scale)
        ry0, rx0 = min(int(round(top / scale)), rows - 1), min(int(round(left / scale)), cols - 1)
        ry1 = max(min(int(round(bottom / scale)), rows), ry0 + 1)
        rx1 = max(min(int(round(right / scale)), cols), rx0 + 1)
        top, left = ry0 * scale, rx0 * scale
        bottom, right = min(ry1 * scale, height), min(rx1 * scale, width)
    return CropPlan(scale, Box(top, left, bottom - top, right - left))


def resized_crop(image: ImageInput, box: Box | tuple[float, float, float, float], size: tuple[int, int], *,
                 interpolation: str = "bilinear", backend: str = "torch", decoder: str = "auto",
                 reduce: bool = True, flip: bool = False, margin: bool = False,
                 crop_decode: bool = True) -> torch.Tensor:
    """Crop ``box`` (source pixels) out of ``image``, resize to ``size``, optionally flip: uint8 (3, H, W).

    Encoded JPEG input is decoded at the reduction :func:`plan_crop` picks;
    the region resampled is ``plan_crop(...).box``. ``margin`` selects
    resize-then-crop semantics (the filter also reads pixels around the box:
    Pillow resizes the box with a margin, torch resizes the whole image and
    slices) instead of torchvision's crop-then-resize.

    ``crop_decode`` (``backend="torch"``, ``decoder="auto"``) decodes only the
    rows and columns of the crop (``margin=False``) or those the resize filter
    reads for it (``margin=True``) where :mod:`readers.decode.jpegcrop` is built
    (:func:`readers.decode.decoders.decode_rgb_region`): the same pixels as the full
    decode, resampled with the same weights, so the same output, for less work.
    """
    check_resize_options(interpolation, backend, decoder)
    size = size_pair(size, "size")
    encoded: Encoded | None = None
    header: ImageHeader | None = None
    if _is_encoded(image):
        encoded, header = image, read_header(image)
        height, width, jpeg = header.height, header.width, header.is_jpeg
    else:
        arr = _as_hwc(image)
        height, width = arr.shape[:2]
        jpeg, reduce = False, False
    plan = plan_crop(height, width, box, size, jpeg=jpeg, reduce=reduce, backend=backend, margin=margin)
    s = plan.scale
    top, left, bh, bw = plan.box
    region = header is not None and header.is_jpeg and crop_decode and backend == "torch"
    if region and not margin and encoded is not None:
        ry0, rx0 = int(top) // s, int(left) // s
        ry1, rx1 = -(-int(top + bh) // s), -(-int(left + bw) // s)
        pixels, oy, ox = decode_rgb_region(encoded, s, (ry0, ry1), (rx0, rx1), decoder=decoder, header=header)
        sub = pixels[ry0 - oy:ry1 - oy, rx0 - ox:rx1 - ox]
        if sub.shape[:2] != (ry1 - ry0, rx1 - rx0):
            raise RuntimeError(f"decoded {sub.shape[:2]} for rows {ry0}-{ry1}, columns {rx0}-{rx1} of a "
                               f"{height}x{width} image at scale 1/{s}")
        with _on_this_thread():
            chw = _resize_torch(sub, 0, 0, ry1 - ry0, rx1 - rx0, size, interpolation)
            return torch.flip(chw, dims=(2,)) if flip else chw
    if region and margin and encoded is not None and header is not None:
        fused = _resized_crop_of_region(encoded, header, s, plan.box, size, interpolation, decoder)
        if fused is not None:
            return fused
    if encoded is not None:
        arr = decode_rgb_scaled(encoded, s, decoder=decoder, header=header)
        if arr.shape[:2] != (-(-height // s), -(-width // s)):
            raise RuntimeError(f"decoded {arr.shape[:2]} from a {height}x{width} image at scale 1/{s}")
    if backend == "pillow":
        y1, x1 = min((top + bh) / s, arr.shape[0]), min((left + bw) / s, arr.shape[1])
        out = _resize_pillow(arr, top / s, left / s, y1, x1, size, interpolation, margin)
        if flip:
            out = out[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))
    with _on_this_thread():
        if margin:
            # Resize-then-crop: resize the whole decoded image to the size the box
            # implies, then slice (exactly the Pillow result up to +-1).
            oh, ow = size
            fh, fw, ty, tx = _resize_then_crop_geometry(height, width, plan.box, size)
            chw = _resize_torch(arr, 0, 0, arr.shape[0], arr.shape[1], (fh, fw), interpolation)
            chw = chw[:, ty:ty + oh, tx:tx + ow].contiguous()
        else:
            ry0, rx0 = int(top) // s, int(left) // s
            ry1, rx1 = -(-int(top + bh) // s), -(-int(left + bw) // s)
            chw = _resize_torch(arr, ry0, rx0, ry1, rx1, size, interpolation)
        return torch.flip(chw, dims=(2,)) if flip else chw


def _resize_then_crop_geometry(height: int, width: int, box: Box, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(fh, fw, ty, tx)``: the whole image is resized to ``fh x fw``, the crop starts at ``(ty, tx)``."""
    oh, ow = size
    top, left, bh, bw = box
    fh, fw = max(int(round(height * oh / bh)), oh), max(int(round(width * ow / bw)), ow)
    return fh, fw, min(int(round(top * oh / bh)), fh - oh), min(int(round(left * ow / bw)), fw - ow)


def _resized_crop_of_region(image: Encoded, header: ImageHeader, s: int, box: Box, size: tuple[int, int],
                            interpolation: str, decoder: str) -> torch.Tensor | None:
    """Resize-then-crop (torch) computed from the decoded rows and columns the crop's filter reads.

    The resize of the whole ``dh x dw`` decoded image to ``fh x fw`` is computed on its top-left
    part ``[0, r1) x [0, c1)`` with the same scale factors (``scale_factor=fh/dh``,
    ``recompute_scale_factor=False``): each output pixel reads the same source pixels with the
    same weights, and the pixels it reads lie inside the region decoded (``decode_rgb_region``
    with ``canvas=True``: rows and columns above and left of the region are never read for the
    crop). None when the region is the whole image (nothing to save), there is no resize, or
    the part's output would not reach the crop; the caller then resizes the whole image.
    """
    oh, ow = size
    dh, dw = -(-header.height // s), -(-header.width // s)
    fh, fw, ty, tx = _resize_then_crop_geometry(header.height, header.width, box, size)
    sy, sx = dh / fh, dw / fw
    sup_y, sup_x = _SUPPORT[interpolation] * max(sy, 1.0), _SUPPORT[interpolation] * max(sx, 1.0)
    r0, c0 = max(int(math.floor(ty * sy - sup_y)) - 2, 0), max(int(math.floor(tx * sx - sup_x)) - 2, 0)
    r1 = min(int(math.ceil((ty + oh) * sy + sup_y)) + 2, dh)
    c1 = min(int(math.ceil((tx + ow) * sx + sup_x)) + 2, dw)
    if (r0, c0, r1, c1) == (0, 0, dh, dw) or (fh, fw) == (dh, dw):
        return None
    fy, fx = fh / dh, fw / dw
    if math.floor(r1 * fy) < ty + oh or math.floor(c1 * fx) < tx + ow:
        return None
    pixels, _top, _left = decode_rgb_region(image, s, (r0, r1), (c0, c1), decoder=decoder, header=header,
                                            canvas=True)
    sub = pixels[:r1, :c1]
    if not sub.flags.writeable:  # a read-only full decode (PIL): torch wants writable memory
        sub = sub.copy()
    with _on_this_thread():
        x = torch.from_numpy(sub).permute(2, 0, 1).unsqueeze(0)  # channels_last: torch's fast uint8 path
        out = F.interpolate(x, scale_factor=(fy, fx), mode=interpolation, antialias=True, align_corners=False,
                            recompute_scale_factor=False)
        return out[0, :, ty:ty + oh, tx:tx + ow].contiguous()
