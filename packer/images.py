"""Per-image work done in the packing worker processes: validate, normalize, resize.

Counterpart of ``readers/decode.py``: what this module stores, that one decodes.
This first version is deliberately simple; the trustworthy-packing issue
hardens it (CMYK, 16-bit, EXIF, bombs, reduced-scale validation).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

__all__ = ["ImageOptions", "Prepared", "RejectedImage", "prepare_image"]


class RejectedImage(Exception):
    """The file cannot be packed; ``str(exc)`` is a one-line reason."""


@dataclass(frozen=True)
class ImageOptions:
    validate: bool = True
    max_side: int | None = None  # downscale so the longer side is at most this
    quality: int = 90  # JPEG quality when an image must be re-encoded lossy
    resize: int | None = None  # pixels mode: shorter side -> resize, center crop to resize x resize
    want_pixels: bool = False  # return decoded RGB pixels (mmap) instead of encoded bytes
    max_pixels: int = 178_956_970  # decompression-bomb limit (Pillow's error threshold)


@dataclass
class Prepared:
    data: bytes  # bytes to store (original or re-encoded); empty in pixels mode
    ext: str  # "jpg" or "png" (by content); "rgb" in pixels mode
    height: int
    width: int
    changed: bool  # True when ``data`` is not the original file
    pixels: np.ndarray | None = None  # (H, W, 3) uint8 in pixels mode
    note: str = ""


_EXT = {"JPEG": "jpg", "PNG": "png"}


def _resize_short_center_crop(im: Image.Image, size: int) -> Image.Image:
    w, h = im.size
    scale = size / min(w, h)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    im = im.resize((nw, nh), Image.BICUBIC, reducing_gap=3.0)
    left, top = (nw - size) // 2, (nh - size) // 2
    return im.crop((left, top, left + size, top + size))


def prepare_image(data: bytes, opts: ImageOptions) -> Prepared:
    """Validate ``data`` and return what to store for it, or raise RejectedImage."""
    if not data:
        raise RejectedImage("empty file (0 bytes)")
    try:
        im = Image.open(io.BytesIO(data))
        fmt = im.format
        im.load()
    except Exception as exc:  # Pillow raises many types for bad data
        raise RejectedImage(f"cannot decode: {exc}") from None
    if fmt not in _EXT:
        raise RejectedImage(f"unsupported image format {fmt}")
    changed = im.mode not in ("RGB", "L")
    rgb = im.convert("RGB") if im.mode != "RGB" else im
    if opts.want_pixels:
        if opts.resize:
            rgb = _resize_short_center_crop(rgb, opts.resize)
        elif opts.max_side and max(rgb.size) > opts.max_side:
            rgb.thumbnail((opts.max_side, opts.max_side), Image.BICUBIC)
        arr = np.asarray(rgb)
        return Prepared(b"", "rgb", arr.shape[0], arr.shape[1], True, arr)
    if opts.max_side and max(rgb.size) > opts.max_side:
        rgb = rgb.copy()
        rgb.thumbnail((opts.max_side, opts.max_side), Image.BICUBIC)
        changed = True
    if not changed:
        return Prepared(data, _EXT[fmt], im.height, im.width, False)
    buf = io.BytesIO()
    if fmt == "JPEG":
        rgb.save(buf, "JPEG", quality=opts.quality)
    else:
        rgb.save(buf, "PNG")
    return Prepared(buf.getvalue(), _EXT[fmt], rgb.height, rgb.width, True)
