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
:func:`readers.decode.crop.resized_crop`), and only the crop is resized. With
``reduce=False`` and ``backend="pillow"`` the output equals torchvision's PIL
path exactly (``img.crop(box).resize(size, BILINEAR)``).

:class:`ResizeCenterCrop` (eval): torchvision's ``Resize(256)`` (shorter side
to 256, longer side ``int(256 * long / short)``) then ``CenterCrop(224)``,
computed as one resize of the source region that lands in the center crop,
from a reduced decode when the source is at least twice as large.

Both draw or compute a box here and leave the pixels to :mod:`readers.decode.crop` (the decode scale,
the region decoded, the resize: ``interpolation`` and ``backend`` are documented there).

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
from dataclasses import dataclass

import numpy as np
import torch

from readers.decode.compose import Compose, accepts_bytes, warn_if_fused_lost  # re-exported here
# One crop decoded and resized lives in its own module; its names stay importable from here (__all__).
from readers.decode.crop import (
    Box,
    CropPlan,
    ImageInput,
    check_resize_options,
    image_size,
    plan_crop,
    resized_crop,
    size_pair,
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


# --------------------------------------------------------------------------- options


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
        object.__setattr__(self, "size", size_pair(self.size, "size"))
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
        check_resize_options(self.interpolation, self.backend, self.decoder)


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
        object.__setattr__(self, "size", size_pair(self.size, "size"))
        if not isinstance(self.resize, (int, np.integer)) or self.resize < max(self.size):
            raise ValueError(f"resize must be an int >= the crop size {self.size}, got {self.resize!r}")
        check_resize_options(self.interpolation, self.backend, self.decoder)


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
        self.options = TrainOptions(size=size_pair(size, "size"), scale=scale, ratio=ratio, flip_p=flip_p,
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
        box, flip = self.draw(*image_size(image))
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
        self.options = EvalOptions(resize=resize, size=size_pair(crop, "size"), interpolation=interpolation,
                                   backend=backend, decoder=decoder, reduce=reduce, crop_decode=crop_decode)

    def box(self, height: int, width: int) -> Box:
        """Source-pixel region kept for an image of ``height`` x ``width``."""
        return resize_center_crop_box(height, width, self.options.resize, self.options.size)

    def __call__(self, image: ImageInput) -> torch.Tensor:
        o = self.options
        box = self.box(*image_size(image))
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

