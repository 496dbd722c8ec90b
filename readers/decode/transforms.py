"""ImageNet train/eval transforms fused with size-aware JPEG decoding, without torchvision.

Counterpart of ``readers/decode/decoders.py`` (the decoders these transforms call) and
of ``readers/loader/prefetch.py`` (which turns the uint8 batches these produce into
normalized float tensors on the device).

Every transform is callable on encoded bytes (``bytes``, ``bytearray``,
``memoryview`` or a 1-D uint8 array), on a decoded ``uint8`` HWC (or HW
grayscale) ``numpy`` array, or on a ``uint8`` CHW tensor, and returns a
contiguous ``torch.uint8`` tensor of shape ``(3, H, W)`` -- the readers'
default item. Normalization happens later, on the device. The transforms set
``accepts_bytes = True``, which tells the datasets in ``readers`` to pass the
stored bytes rather than a decoded image, so the decode can be fused.

Recipes
-------
:class:`RandomResizedCrop` (train): the crop box is sampled with the algorithm
of torchvision's ``RandomResizedCrop.get_params`` (10 tries of area in
``scale`` x image area and log-uniform aspect in ``ratio``, then the central
fallback), drawn from a ``numpy.random.Generator``; then a horizontal flip
with probability ``flip_p``. Given JPEG bytes, the box is computed from the
header size only, the JPEG is decoded at the largest DCT scale (1/2, 1/4,
1/8) that keeps the crop at least the output size, only down to the crop's
last row and, above and beside the crop, only entropy-decoded (where the
native helper :mod:`readers.decode.jpegcrop` is built; bit-exact, see
:func:`resized_crop`), and only the crop is resized. With ``reduce=False`` and ``backend="pillow"`` the output equals
torchvision's PIL path exactly (``img.crop(box).resize(size, BILINEAR)``).

:class:`ResizeCenterCrop` (eval): torchvision's ``Resize(256)`` (shorter side
to 256, longer side ``int(256 * long / short)``) then ``CenterCrop(224)``,
computed as one resize of the source region that lands in the center crop,
from a reduced decode when the source is at least twice as large.

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

Seeding and workers
-------------------
Randomness comes from a ``numpy.random.Generator`` owned by the transform,
created lazily, and re-created whenever the process id changes, i.e. once in
each DataLoader worker (fork or spawn):

* ``seed=None``: the generator is seeded from ``torch.initial_seed()``. In a
  DataLoader worker that is ``base_seed + worker_id`` (distinct per worker and
  per epoch, reproducible when the main process seeds torch or passes
  ``generator=`` to the DataLoader), in the main process torch's seed.
* ``seed=S``: in the main process the stream is ``SeedSequence(S)`` (same seed,
  same crops); in a worker it is ``SeedSequence([S, torch.initial_seed()])``.

Pickling drops the generator (it is rebuilt from the seed), so transforms
travel to spawn workers; an unpickled copy restarts its stream.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, TypeGuard, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from readers.decode.compose import Compose, accepts_bytes, warn_if_fused_lost  # re-exported here
from readers.decode.decoders import (
    DECODERS,
    ImageHeader,
    decode_rgb_region,
    decode_rgb_scaled,
    read_header,
    reduction_for,
)
from readers.decode.geometry import resize_center_crop
from readers.contract.env import thread_worker, worker_seed
from readers.contract.perprocess import PerProcess

__all__ = [
    "Box",
    "TrainOptions",
    "EvalOptions",
    "sample_crop_box",
    "resize_center_crop_box",
    "resized_crop",
    "CropPlan",
    "plan_crop",
    "RandomResizedCrop",
    "ResizeCenterCrop",
    "imagenet_train_transform",
    "imagenet_eval_transform",
    "Compose",
    "accepts_bytes",
    "warn_if_fused_lost",
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


def _pair(size: int | tuple[int, int], name: str) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in size):
        raise ValueError(f"{name} must be a positive int or (height, width) pair, got {size!r}")
    return int(size[0]), int(size[1])


def _check_common(interpolation: str, backend: str, decoder: str) -> None:
    if interpolation not in _INTERP:
        raise ValueError(f"interpolation must be one of {_INTERP}, got {interpolation!r}")
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if decoder != "auto" and decoder not in DECODERS:
        raise ValueError(f"decoder must be 'auto' or one of {DECODERS}, got {decoder!r}")


@dataclass(frozen=True)
class TrainOptions:
    """Options of :class:`RandomResizedCrop` (sizes are (height, width))."""

    size: tuple[int, int] = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    interpolation: str = "bilinear"
    backend: str = "torch"
    decoder: str = "auto"
    reduce: bool = True
    #: Decode only the rows and columns the crop needs (``readers.decode.jpegcrop``; torch backend, JPEG).
    crop_decode: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        lo, hi = (float(v) for v in self.scale)
        if not 0 < lo <= hi:
            raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale!r}")
        rlo, rhi = (float(v) for v in self.ratio)
        if not 0 < rlo <= rhi:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio!r}")
        object.__setattr__(self, "scale", (lo, hi))
        object.__setattr__(self, "ratio", (rlo, rhi))
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {self.flip_p!r}")
        _check_common(self.interpolation, self.backend, self.decoder)


@dataclass(frozen=True)
class EvalOptions:
    """Options of :class:`ResizeCenterCrop`: shorter side to ``resize``, center crop ``size``."""

    resize: int = 256
    size: tuple[int, int] = (224, 224)
    interpolation: str = "bilinear"
    backend: str = "torch"
    decoder: str = "auto"
    reduce: bool = True
    #: Decode only the rows and columns the crop's filter reads (``readers.decode.jpegcrop``; torch backend, JPEG).
    crop_decode: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        if not isinstance(self.resize, (int, np.integer)) or self.resize < max(self.size):
            raise ValueError(f"resize must be an int >= the crop size {self.size}, got {self.resize!r}")
        _check_common(self.interpolation, self.backend, self.decoder)


# --------------------------------------------------------------------------- geometry


def sample_crop_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                    rng: np.random.Generator) -> Box:
    """torchvision's ``RandomResizedCrop.get_params`` algorithm, drawing from ``rng``.

    Returns integer ``Box(top, left, h, w)`` inside the image. Not the same
    numbers as torchvision for a given seed (numpy, not torch, generator).
    One deliberate difference: the fallback box is never narrower than 1 pixel
    (torchvision's rounds to 0 for e.g. a 1x1 image with ratio (0.5, 0.5)).
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return Box(top, left, h, w)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    # torchvision can round a side to 0 on tiny images with extreme ratios; keep >= 1 pixel.
    h, w = max(h, 1), max(w, 1)
    return Box((height - h) // 2, (width - w) // 2, h, w)


def resize_center_crop_box(height: int, width: int, resize: int, size: tuple[int, int]) -> Box:
    """Source region that torchvision's ``Resize(resize)`` + ``CenterCrop(size)`` keeps (float box)."""
    g = resize_center_crop(height, width, resize, size)  # the geometry shared with packer and bench
    sy, sx = height / g.height, width / g.width
    return Box(g.top * sy, g.left * sx, g.crop_height * sy, g.crop_width * sx)


# --------------------------------------------------------------------------- pixels


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
    oh, ow = _pair(size, "size")
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
    _check_common(interpolation, backend, decoder)
    size = _pair(size, "size")
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


# --------------------------------------------------------------------------- transforms


class _Seeded:
    """Owns a lazily created, per-process ``numpy.random.Generator`` (see module docstring)."""

    def __init__(self, seed: int | None) -> None:
        if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        self.seed = None if seed is None else int(seed)
        # Per process, dropped on pickling: rebuilt from the seed where it is next used.
        self._rng: PerProcess[np.random.Generator] = PerProcess(self._new_rng)

    def _new_rng(self) -> np.random.Generator:
        worker = worker_seed()  # a loader worker's (process or thread) seed; None in the main process
        entropy = [] if self.seed is None else [self.seed]
        if self.seed is None or worker is not None:
            entropy.append(int(torch.initial_seed()) if worker is None else worker)
        return np.random.default_rng(np.random.SeedSequence(entropy))

    @property
    def rng(self) -> np.random.Generator:
        tw = thread_worker()
        if tw is not None:  # loader threads share this transform: one generator per thread
            rng = tw.state.get(id(self))
            if rng is None:
                rng = tw.state[id(self)] = self._new_rng()
            return rng
        return self._rng.get()


def _image_size(image: ImageInput) -> tuple[int, int]:
    if _is_encoded(image):
        header = read_header(image)
        return header.height, header.width
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    if not isinstance(image, np.ndarray):
        raise TypeError(f"expected a uint8 image array or tensor, got {type(image).__name__}")
    return int(image.shape[0]), int(image.shape[1])


class RandomResizedCrop(_Seeded):
    """Train transform: random-resized crop + horizontal flip, fused with reduced JPEG decode.

    ``__call__(image) -> torch.uint8 tensor (3, size[0], size[1])``. ``image``
    is encoded bytes, a uint8 HWC/HW array or a uint8 CHW tensor. Draws the
    box then the flip from the transform's generator (see module docstring).
    """

    #: Readers hand this transform the stored bytes (not a decoded image) so it can fuse the decode.
    accepts_bytes = True

    def __init__(self, size: int | tuple[int, int] = 224, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), *, flip_p: float = 0.5,
                 interpolation: str = "bilinear", backend: str = "torch", decoder: str = "auto",
                 reduce: bool = True, crop_decode: bool = True, seed: int | None = None) -> None:
        super().__init__(seed)
        self.options = TrainOptions(size=_pair(size, "size"), scale=scale, ratio=ratio, flip_p=flip_p,
                                    interpolation=interpolation, backend=backend, decoder=decoder,
                                    reduce=reduce, crop_decode=crop_decode)

    def draw(self, height: int, width: int) -> tuple[Box, bool]:
        """Draw the next (box, flip) for an image of ``height`` x ``width`` from this transform's stream."""
        o = self.options
        box = sample_crop_box(height, width, o.scale, o.ratio, self.rng)
        flip = bool(o.flip_p > 0 and self.rng.random() < o.flip_p)
        return box, flip

    def apply(self, image: ImageInput, box: Box, flip: bool) -> torch.Tensor:
        """Apply a given (box, flip) to ``image`` -- no randomness."""
        o = self.options
        return resized_crop(image, box, o.size, interpolation=o.interpolation, backend=o.backend,
                            decoder=o.decoder, reduce=o.reduce, flip=flip, margin=False,
                            crop_decode=o.crop_decode)

    def __call__(self, image: ImageInput) -> torch.Tensor:
        box, flip = self.draw(*_image_size(image))
        return self.apply(image, box, flip)

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.options}, seed={self.seed})"


class ResizeCenterCrop:
    """Eval transform: shorter side to ``resize``, center crop ``size``, fused with reduced JPEG decode.

    ``__call__(image) -> torch.uint8 tensor (3, size[0], size[1])``. With
    ``backend="pillow"`` it equals Pillow's ``resize`` to the full
    ``Resize(resize)`` size followed by the center crop (resize-then-crop),
    computed over the kept region only.
    """

    #: Readers hand this transform the stored bytes (not a decoded image) so it can fuse the decode.
    accepts_bytes = True

    def __init__(self, resize: int = 256, crop: int | tuple[int, int] = 224, *, interpolation: str = "bilinear",
                 backend: str = "torch", decoder: str = "auto", reduce: bool = True, crop_decode: bool = True) -> None:
        self.options = EvalOptions(resize=resize, size=_pair(crop, "size"), interpolation=interpolation, backend=backend,
                                   decoder=decoder, reduce=reduce, crop_decode=crop_decode)

    def box(self, height: int, width: int) -> Box:
        """Source-pixel region kept for an image of ``height`` x ``width``."""
        return resize_center_crop_box(height, width, self.options.resize, self.options.size)

    def __call__(self, image: ImageInput) -> torch.Tensor:
        o = self.options
        box = self.box(*_image_size(image))
        return resized_crop(image, box, o.size, interpolation=o.interpolation, backend=o.backend,
                            decoder=o.decoder, reduce=o.reduce, flip=False, margin=True,
                            crop_decode=o.crop_decode)

    def __repr__(self) -> str:
        return f"ResizeCenterCrop({self.options})"


def imagenet_train_transform(size: int = 224, seed: int | None = None, **kwargs) -> RandomResizedCrop:
    """The standard ImageNet train recipe: ``RandomResizedCrop(size)`` + flip(p=0.5), bilinear.

    ``kwargs`` go to :class:`RandomResizedCrop` (``scale``, ``ratio``,
    ``flip_p``, ``interpolation``, ``backend``, ``decoder``, ``reduce``, ``crop_decode``).
    """
    return RandomResizedCrop(size, seed=seed, **kwargs)


def imagenet_eval_transform(size: int = 224, resize: int = 256, **kwargs) -> ResizeCenterCrop:
    """The standard ImageNet eval recipe: ``Resize(resize)`` + ``CenterCrop(size)``, bilinear."""
    return ResizeCenterCrop(resize, size, **kwargs)

