"""Decode only a region of a JPEG: the optional native helper ``readers/_jpegcrop.c``, through ctypes.

Used by ``readers/decode.py`` (:func:`readers.decode.decode_rgb_region`), which falls back to a
full decode wherever this is missing. The helper is a plain shared library over the system
libjpeg-turbo (Debian's ``libjpeg62-turbo``, 2.1.5 here), built by the package build
(``setup.py``: the optional extension :data:`NATIVE`, ``readers/_jpegcrop.<platform>.so``, in the
wheel and in place for ``pip install -e .``) where a C compiler and ``jpeglib.h`` are there
(``libjpeg62-turbo-dev``); without them the install succeeds with no helper. ctypes loads it by
its path (:func:`native_path`) and releases the GIL during the call.

For a region of rows ``[y0, y1)`` and columns ``[x0, x1)`` it decodes no row below ``y1``
(entropy decoding included), only entropy-decodes the rows above ``y0`` (libjpeg's
``jpeg_skip_scanlines``) and the columns outside ``[x0, x1)`` (``jpeg_crop_scanline``, which
moves ``x0`` left to an iMCU boundary). Pixels equal the full decode's (accurate integer IDCT,
fancy upsampling, like Pillow and simplejpeg): the region is asked for with a margin of
:data:`MARGIN` pixels, since the cropped upsampler sees an edge where the full decode sees a
neighbour. :func:`matches_full_decode` checks that once per process.

``DATASET_PACKER_JPEGCROP`` names another library file to load, or ``off`` to use none.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["MARGIN", "NATIVE", "JpegCropError", "Region", "available", "decode_region",
           "entropy_decode_only", "library", "load", "matches_full_decode", "native_path"]

log = logging.getLogger(__name__)

#: The extension ``setup.py`` builds from ``readers/_jpegcrop.c``: a plain C library (no ``PyInit``)
#: that ctypes loads by its path; it is never imported.
NATIVE = "readers._jpegcrop"
#: Pixels asked for around the wanted region, cut off again before the caller sees them.
MARGIN = 2
_VERSION = 3
_ERRLEN = 200
_ENV = "DATASET_PACKER_JPEGCROP"


class Region(NamedTuple):
    """Decoded pixels of rows ``top..top+H`` and columns ``left..left+W`` of the image at that scale."""

    pixels: np.ndarray  # (H, W, 3) uint8, writable, C-contiguous
    top: int
    left: int
    #: Size of the whole image at that scale (libjpeg's ``ceil(size / scale)``).
    height: int
    width: int


class JpegCropError(ValueError):
    """libjpeg refused the data (an error, or a warning about corrupt data): decode it another way."""


def native_path() -> Path | None:
    """Where the package build put the helper (``readers/_jpegcrop.<platform>.so``), or None where it
    could not compile it (no C compiler or no ``jpeglib.h`` at install time)."""
    spec = importlib.util.find_spec(NATIVE)  # finds the file without importing it
    return Path(spec.origin) if spec is not None and spec.origin else None


def load(path: str | os.PathLike) -> ctypes.CDLL | None:
    """Load the helper from ``path``; None (and a log line) when it is missing or not this helper."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        log.debug("jpegcrop helper %s not loaded: %s", path, exc)
        return None
    try:
        lib.jc_version.restype = ctypes.c_int
        version = lib.jc_version()
        fn = lib.jc_decode
    except AttributeError:
        log.warning("%s is not the jpegcrop helper; region decoding is off", path)
        return None
    if version != _VERSION:
        log.warning("jpegcrop helper %s has interface %d, this code wants %d: rebuild it by reinstalling "
                    "the package (pip install -e .); region decoding is off", path, version, _VERSION)
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int),
                   ctypes.c_char_p]
    lib.jc_entropy_only.restype = ctypes.c_int
    lib.jc_entropy_only.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return lib


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The loaded helper, or None (not built, ``DATASET_PACKER_JPEGCROP=off``, or the wrong version)."""
    override = os.environ.get(_ENV, "")
    if override.lower() == "off":
        return None
    path = Path(override) if override else native_path()
    if path is None:
        log.debug("jpegcrop helper %s not built (the install found no C compiler or jpeglib.h)", NATIVE)
        return None
    return load(path)


def available() -> bool:
    """True when the helper is loaded and decodes like a full decode here (:func:`matches_full_decode`)."""
    return library() is not None and matches_full_decode()


def _buffer(data) -> bytes:
    if isinstance(data, bytes):
        return data
    return bytes(memoryview(data))


def decode_region(data, scale: int, y0: int, y1: int, x0: int, x1: int, *, canvas: bool = False,
                  size: tuple[int, int] | None = None, lib: ctypes.CDLL | None = None) -> Region | None:
    """Rows ``[y0, y1)`` and columns ``[x0, x1)`` (pixels at scale ``1/scale``) of a JPEG, as RGB.

    The result covers at least that region (clipped to the image), plus up to :data:`MARGIN`
    pixels around it and the columns left of ``x0`` up to libjpeg's iMCU boundary. With
    ``canvas=True`` the pixels are a canvas from the image's row 0 and column 0 to the region's
    bottom right (plus the margin), ``top = left = 0``, of which only the region (and its
    margin) is written: the rest is left as allocated. ``size``: the image's size at that scale
    when the caller knows it (the canvas then never extends past the image, and stays
    C-contiguous). Returns None when the helper is missing
    or the JPEG is of a kind it does not decode (CMYK, YCCK); raises :class:`JpegCropError` when
    libjpeg reports an error or a warning. ``lib``: a helper from :func:`load` instead of
    :func:`library`'s.
    """
    lib = lib or library()
    if lib is None:
        return None
    buf = _buffer(data)
    ty0, tx0 = max(y0 - MARGIN, 0), max(x0 - MARGIN, 0)
    ty1, tx1 = y1 + MARGIN, x1 + MARGIN
    if size is not None:
        ty1, tx1 = min(ty1, size[0]), min(tx1, size[1])
    info = (ctypes.c_int * 6)()
    err = ctypes.create_string_buffer(_ERRLEN)
    if canvas:
        rows, cols, stride = ty1, tx1, tx1 * 3
        out = np.empty(rows * stride, np.uint8)
        start = out.ctypes.data + ty0 * stride
        status = lib.jc_decode(buf, len(buf), scale, ty0, ty1, tx0, tx1, start, out.nbytes - ty0 * stride,
                               stride, info, err)
    else:
        # Columns: the request, its margin and up to one iMCU (at most 32 pixels) of alignment on the left.
        cols = tx1 - tx0 + 32
        out = np.empty((ty1 - ty0) * cols * 3, np.uint8)
        status = lib.jc_decode(buf, len(buf), scale, ty0, ty1, tx0, tx1, out.ctypes.data, out.nbytes, 0, info, err)
        if status == 1:  # the region was clipped differently than foreseen: allocate what it said
            out = np.empty((min(ty1, info[0]) - ty0) * info[3] * 3, np.uint8)
            status = lib.jc_decode(buf, len(buf), scale, ty0, ty1, tx0, tx1, out.ctypes.data, out.nbytes, 0,
                                   info, err)
    if status == 2:
        return None
    if status != 0:
        raise JpegCropError(err.value.decode("utf-8", "replace") or f"jpegcrop status {status}")
    height, width, left, ncols, _comps, nrows = info
    if canvas:
        rows, cols = min(ty1, height), min(tx1, width)
        pixels = out.reshape(ty1, tx1, 3)[:rows, :cols]
        return Region(pixels, 0, 0, height, width)
    pixels = out[: nrows * ncols * 3].reshape(nrows, ncols, 3)
    return Region(pixels, ty0, left, height, width)


def entropy_decode_only(data) -> None:
    """Entropy-decode the whole JPEG and nothing more (for profiles: the work no region decode skips
    above its last row). Raises :class:`JpegCropError`, or ``RuntimeError`` without the helper."""
    lib = library()
    if lib is None:
        raise RuntimeError("the jpegcrop helper is not built (pip install builds it where a C compiler and "
                           "jpeglib.h exist)")
    buf = _buffer(data)
    err = ctypes.create_string_buffer(_ERRLEN)
    if lib.jc_entropy_only(buf, len(buf), err) != 0:
        raise JpegCropError(err.value.decode("utf-8", "replace"))


@functools.lru_cache(maxsize=1)
def matches_full_decode() -> bool:
    """One-time probe: are the helper's region pixels those of a full decode with Pillow here?

    Decodes generated JPEGs (4:4:4, 4:2:2, 4:2:0, progressive, grayscale, odd sizes) in full
    with Pillow and in regions (edges and interior, every scale) with the helper, and compares.
    A few milliseconds, once per process. False when the helper is missing.
    """
    if library() is None:
        return False
    import io

    from PIL import Image

    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:75, 0:93]
    base = np.stack([(xx * 5) % 256, (yy * 7) % 256, ((xx + yy) * 3) % 256], axis=-1)
    base = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    cases = []
    for kwargs in ({"subsampling": 0}, {"subsampling": 1}, {"subsampling": 2},
                   {"subsampling": 2, "progressive": True}):
        buf = io.BytesIO()
        Image.fromarray(base).save(buf, "JPEG", quality=85, **kwargs)
        cases.append(buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(base[:, :, 1]).save(buf, "JPEG", quality=85)
    cases.append(buf.getvalue())
    try:
        for data in cases:
            for scale in (1, 2, 4):
                with Image.open(io.BytesIO(data)) as im:
                    if scale > 1:
                        im.draft("RGB", (im.width // scale, im.height // scale))
                    full = np.asarray(im.convert("RGB"))
                h, w = full.shape[:2]
                for y0, y1, x0, x1 in ((0, h, 0, w), (3, h // 2, 5, w // 2 + 1), (h // 3, h, w // 3 + 1, w),
                                       (h // 2 - 1, h // 2 + 2, 17, 18)):
                    r = decode_region(data, scale, y0, y1, x0, x1)
                    got = None if r is None else r.pixels[y0 - r.top:y1 - r.top, x0 - r.left:x1 - r.left]
                    if got is None or (r.height, r.width) != (h, w) or not np.array_equal(got, full[y0:y1, x0:x1]):
                        log.warning("the jpegcrop helper does not decode regions like a full decode here; "
                                    "region decoding is off")
                        return False
    except JpegCropError as exc:
        log.warning("jpegcrop probe failed (%s); region decoding is off", exc)
        return False
    return True
