"""Decode only a region of a JPEG: the optional native helper ``readers/decode/_jpegcrop.c``, through ctypes.

Used by ``readers/decode/decoders.py`` (:func:`readers.decode.decoders.decode_rgb_region`), which falls back to a
full decode wherever this is missing. The helper is a plain shared library over the system
libjpeg-turbo (Debian's ``libjpeg62-turbo``, 2.1.5 here), built by the package build
(``setup.py``: the optional extension :data:`NATIVE`, ``readers/decode/_jpegcrop.<platform>.so``, in the
wheel and in place for ``pip install -e .``) where a C compiler and ``jpeglib.h`` are there
(``libjpeg62-turbo-dev``); without them the install succeeds with no helper. ctypes loads it by
its path (:func:`native_path`) and releases the GIL during the call.

For a region of rows ``[y0, y1)`` and columns ``[x0, x1)`` it decodes no row below ``y1``
(entropy decoding included), only entropy-decodes the rows above ``y0`` (libjpeg's
``jpeg_skip_scanlines``) and the columns outside ``[x0, x1)`` (``jpeg_crop_scanline``, which
moves ``x0`` left to an iMCU boundary). Pixels equal the full decode's (accurate integer IDCT,
fancy upsampling, like Pillow and simplejpeg): the region is asked for with a margin of
:data:`MARGIN` pixels, since the cropped upsampler sees an edge where the full decode sees a
neighbour.

It takes only the files where that is proven (:func:`refusal` says why another is left to the
full decode, :func:`decode_region` then returns None): gray, or YCbCr with sampling factors in
:data:`TESTED_SAMPLING` (luma 4x2 and 2x4 are not: libjpeg-turbo 2.1.5's cropped or skipped
decode of those differs at scales 1/2 and 1/4); and no progressive file where libjpeg's block
smoothing applies (``jdcoefct.c`` ``smoothing_ok``: some component's coefficients 0..9 still
not fully known after the last scan, e.g. scans stopped after the DC scan; smoothing reads the
neighbouring blocks that a cropped decode does not have): the helper sees that once the scans
are read and answers "decode in full". Huffman or arithmetic coding, restart intervals and
multi-scan files are taken. ``tests/test_decode_region_exact.py`` compares every kind that
libjpeg allows, built with ``cjpeg``, against the full decode; :func:`matches_full_decode`
checks the kinds taken here, once per process, on JPEGs this library encodes (``jc_encode``).

``DATASET_PACKER_JPEGCROP`` names another library file to load, or ``off`` to use none.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from readers.contract import env

__all__ = ["MARGIN", "NATIVE", "JpegCropError", "Region", "available", "decode_region",
           "entropy_decode_only", "library", "load", "matches_full_decode", "native_path"]

log = logging.getLogger(__name__)

#: The extension ``setup.py`` builds from ``readers/decode/_jpegcrop.c``: a plain C library (no ``PyInit``)
#: that ctypes loads by its path; it is never imported.
NATIVE = "readers.decode._jpegcrop"
#: Pixels asked for around the wanted region, cut off again before the caller sees them.
MARGIN = 2
_VERSION = 4
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
    """Where the package build put the helper (``readers/decode/_jpegcrop.<platform>.so``), or None where it
    could not compile it (no C compiler or no ``jpeglib.h`` at install time)."""
    return env.native_path(NATIVE)


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


# --------------------------------------------------------------------------- which files it takes

#: Chroma (Cb = Cr) sampling factors taken for each luma sampling, ``HxV``: every pair libjpeg
#: allows (factors 1..4, whole ratios, at most 10 blocks an MCU) but luma 4x2 and 2x4.
_TESTED = {
    "1x1": "1x1 1x2 1x3 1x4 2x1 2x2 3x1 4x1",
    "1x2": "1x1 1x2 1x4 2x1 2x2 3x1 4x1",
    "1x3": "1x1 1x3 2x1 3x1",
    "1x4": "1x1 1x2 2x1 3x1",
    "2x1": "1x1 1x2 1x3 1x4 2x1 2x2 4x1",
    "2x2": "1x1 1x2 2x1",
    "2x3": "1x1 2x1",
    "3x1": "1x1 1x2 1x3 3x1",
    "3x2": "1x1 1x2",
    "4x1": "1x1 1x2 1x3 2x1",
}


def _hv(text: str) -> tuple[int, int]:
    h, v = text.split("x")
    return int(h), int(v)


#: The sampling factors ``((h, v) of Y, (h, v) of Cb, (h, v) of Cr)`` of the YCbCr JPEGs the region
#: decoder takes: those ``tests/test_decode_region_exact.py`` finds exact at every scale and crop
#: and :func:`matches_full_decode` checks. Any other (Cb unlike Cr, luma 4x2 or 2x4) is decoded in full.
TESTED_SAMPLING = frozenset((_hv(luma), _hv(c), _hv(c)) for luma, chroma in _TESTED.items() for c in chroma.split())
_HEADER_INTS = 13
_JCS_GRAYSCALE, _JCS_YCBCR = 1, 3  # libjpeg's J_COLOR_SPACE


class Header(NamedTuple):
    """A JPEG's frame header as this library reads it (``jc_header``)."""

    height: int
    width: int
    components: int
    #: libjpeg's ``J_COLOR_SPACE`` of the file (1 gray, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK, 0 unknown).
    colorspace: int
    progressive: bool
    arithmetic: bool
    #: Restart interval in MCUs (0: none).
    restart: int
    #: ``(h, v)`` sampling factors of the first three components.
    sampling: tuple[tuple[int, int], ...]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the functions the decision and the self-check call (once per loaded helper)."""
    if lib.jc_header.argtypes is None:
        lib.jc_header.restype = ctypes.c_int
        lib.jc_header.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p]
        lib.jc_encode.restype = ctypes.c_int
        lib.jc_encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p]
    return lib


def read_header(data, lib: ctypes.CDLL | None = None) -> Header | None:
    """The frame header as libjpeg reads it; None without the helper. Raises :class:`JpegCropError`."""
    lib = lib or library()
    return None if lib is None else _read_header(lib, _buffer(data))


def _read_header(lib: ctypes.CDLL, buf: bytes) -> Header:
    info = (ctypes.c_int * _HEADER_INTS)()
    err = ctypes.create_string_buffer(_ERRLEN)
    if _bind(lib).jc_header(buf, len(buf), info, err) != 0:
        raise JpegCropError(err.value.decode("utf-8", "replace") or "jpegcrop header unreadable")
    n = info[2]
    return Header(info[0], info[1], n, info[3], bool(info[4]), bool(info[5]), info[6],
                  tuple((info[7 + 2 * c], info[8 + 2 * c]) for c in range(min(n, 3))))


def refusal(header: Header) -> str | None:
    """Why the region decoder leaves a JPEG of this header to the full decode, or None when it takes it.

    Block smoothing is not in the header: the helper answers that after reading the scans.
    """
    if header.colorspace == _JCS_GRAYSCALE and header.components == 1:
        return None
    if header.colorspace != _JCS_YCBCR or header.components != 3:
        return f"colorspace {header.colorspace} with {header.components} components"
    if header.sampling not in TESTED_SAMPLING:
        return "sampling " + ",".join(f"{h}x{v}" for h, v in header.sampling) + " not in TESTED_SAMPLING"
    return None


def decode_region(data, scale: int, y0: int, y1: int, x0: int, x1: int, *, canvas: bool = False,
                  size: tuple[int, int] | None = None, lib: ctypes.CDLL | None = None) -> Region | None:
    """Rows ``[y0, y1)`` and columns ``[x0, x1)`` (pixels at scale ``1/scale``) of a JPEG, as RGB.

    The result covers at least that region (clipped to the image), plus up to :data:`MARGIN`
    pixels around it and the columns left of ``x0`` up to libjpeg's iMCU boundary. With
    ``canvas=True`` the pixels are a canvas from the image's row 0 and column 0 to the region's
    bottom right (plus the margin), ``top = left = 0``, of which only the region (and its
    margin) is written: the rest is left as allocated. ``size``: the image's size at that scale
    when the caller knows it (the canvas then never extends past the image, and stays
    C-contiguous). Returns None when the helper is missing or the JPEG is one it leaves to the full
    decode (:func:`refusal`: CMYK, YCCK, RGB, untested sampling factors; and progressive files that
    libjpeg block-smooths); raises :class:`JpegCropError` when libjpeg reports an error or a
    warning. ``lib``: a helper from :func:`load` instead of :func:`library`'s.
    """
    lib = lib or library()
    if lib is None:
        return None
    buf = _buffer(data)
    reason = _why_full(lib, buf)
    if reason is not None:
        log.debug("region decode not taken (%s): decoding in full", reason)
        return None
    return _decode(lib, buf, scale, y0, y1, x0, x1, canvas, size)


def _why_full(lib: ctypes.CDLL, buf: bytes, vouch: bool = True) -> str | None:
    """:func:`refusal` of the header, and (``vouch``) whether the self-check vouches for its sampling here."""
    header = _read_header(lib, buf)
    reason = refusal(header)
    if reason is None and vouch and header.components == 3 and not _sampling_vouched(lib, header.sampling):
        reason = "the self-check found sampling " + ",".join(f"{h}x{v}" for h, v in header.sampling) + " inexact"
    return reason


def _decode(lib: ctypes.CDLL, buf: bytes, scale: int, y0: int, y1: int, x0: int, x1: int, canvas: bool,
            size: tuple[int, int] | None) -> Region | None:
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
    if status in (2, 3):  # 3: libjpeg would block-smooth it (progressive, coefficients 0..9 unknown)
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


def encode(lib: ctypes.CDLL, pixels: np.ndarray, *, sampling=None, scans=None, progressive=False,
            arithmetic=False, restart=0, quality=85) -> bytes:
    """A JPEG of ``pixels`` ((H, W) gray or (H, W, 3) RGB) encoded by the helper's libjpeg (``jc_encode``)."""
    pixels = np.ascontiguousarray(pixels, np.uint8)
    h, w = pixels.shape[:2]
    comps = 1 if pixels.ndim == 2 else 3
    samp = None if sampling is None else (ctypes.c_int * 6)(*[f for hv in sampling for f in hv])
    script = None if scans is None else (ctypes.c_int * (9 * len(scans)))(
        *[v for sc in scans for v in (len(sc[0]), *sc[0], *[0] * (4 - len(sc[0])), *sc[1:])])
    err = ctypes.create_string_buffer(_ERRLEN)
    size = ctypes.c_size_t(0)
    out = np.empty(h * w * comps + 65536, np.uint8)
    status = _bind(lib).jc_encode(pixels.ctypes.data, h, w, comps, quality, samp, script,
                                  0 if scans is None else len(scans), int(progressive), int(arithmetic), restart,
                                  out.ctypes.data, out.nbytes, ctypes.byref(size), err)
    if status != 0:
        raise JpegCropError(err.value.decode("utf-8", "replace") or f"jpegcrop encode status {status}")
    return out[: size.value].tobytes()


_DC = ((0, 1, 2), 0, 0, 0, 0)  # a scan: components, Ss, Se, Ah, Al
_SELF_CHECK = (  # (name, gray, sampling, scans, progressive, arithmetic, restart, taken)
    ("gray", True, None, None, False, False, 0, True),
    ("gray progressive", True, None, None, True, False, 0, True),
    ("progressive", False, ((2, 2), (1, 1), (1, 1)), None, True, False, 0, True),
    ("progressive 4:2:2, restart 2", False, ((2, 1), (1, 1), (1, 1)), None, True, False, 2, True),
    ("progressive, AC 1..9 only", False, ((2, 2), (1, 1), (1, 1)),
     (_DC, ((0,), 1, 9, 0, 0), ((1,), 1, 9, 0, 0), ((2,), 1, 9, 0, 0)), False, False, 0, True),
    ("progressive, DC only (smoothed)", False, ((2, 2), (1, 1), (1, 1)), (_DC,), False, False, 0, False),
    ("progressive, AC 1..5 (smoothed)", False, ((1, 1), (1, 1), (1, 1)),
     (_DC, ((0,), 1, 5, 0, 0), ((1,), 1, 63, 0, 0), ((2,), 1, 63, 0, 0)), False, False, 0, False),
    ("one scan a component", False, ((2, 2), (1, 1), (1, 1)),
     (((0,), 0, 63, 0, 0), ((1,), 0, 63, 0, 0), ((2,), 0, 63, 0, 0)), False, False, 0, True),
    ("arithmetic", False, ((2, 2), (1, 1), (1, 1)), None, False, True, 0, True),
    ("arithmetic progressive", False, ((2, 1), (1, 1), (1, 1)), None, True, True, 0, True),
    ("restart 1", False, ((2, 2), (1, 1), (1, 1)), None, False, False, 1, True),
    ("restart 3, 4:4:4", False, ((1, 1), (1, 1), (1, 1)), None, False, False, 3, True),
    ("luma 4x2 (untested)", False, ((4, 2), (1, 1), (1, 1)), None, False, False, 0, False),
)


def _self_check_regions(h: int, w: int, few: bool):
    """Regions of an ``h`` x ``w`` image: the interior and the bottom right; unless ``few``, also
    the whole image and a 3x1 sliver."""
    boxes = [(3, h // 2, 5, w // 2 + 1), (h // 3, h, w // 3 + 1, w)]
    if not few:
        boxes += [(0, h, 0, w), (h // 2 - 1, h // 2 + 2, 17, 18)]
    for y0, y1, x0, x1 in boxes:
        y0, x0 = min(max(y0, 0), h - 1), min(max(x0, 0), w - 1)
        yield y0, max(min(y1, h), y0 + 1), x0, max(min(x1, w), x0 + 1)


def _check(lib: ctypes.CDLL, cases) -> bool:
    """Encode each case of :data:`_SELF_CHECK`'s form, decode it in full with Pillow and in regions
    at every scale with the helper: True when every region taken equals the full decode and every
    case not to be taken is left to the full decode. Logs the first difference."""
    import io

    from PIL import Image

    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:47, 0:61]
    base = np.stack([(xx * 5) % 256, (yy * 7) % 256, ((xx + yy) * 3) % 256], axis=-1)
    base = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    name = ""
    try:
        for name, gray, sampling, scans, progressive, arith, restart, taken in cases:
            data = encode(lib, base[:, :, 1] if gray else base, sampling=sampling, scans=scans,
                           progressive=progressive, arithmetic=arith, restart=restart)
            refused = _why_full(lib, data, vouch=False) is not None
            for scale in (1, 2, 4, 8):
                with Image.open(io.BytesIO(data)) as im:
                    if scale > 1:
                        im.draft("RGB", (im.width // scale, im.height // scale))
                    full = np.asarray(im.convert("RGB"))
                h, w = full.shape[:2]
                for y0, y1, x0, x1 in _self_check_regions(h, w, name.startswith("sampling")):
                    r = None if refused else _decode(lib, data, scale, y0, y1, x0, x1, False, None)
                    if r is None and not taken:
                        continue
                    if r is None or not taken or (r.height, r.width) != (h, w) or not np.array_equal(
                            r.pixels[y0 - r.top:y1 - r.top, x0 - r.left:x1 - r.left], full[y0:y1, x0:x1]):
                        log.warning("the jpegcrop helper does not decode regions like a full decode here "
                                    "(%s, scale 1/%d, rows %d-%d, columns %d-%d); region decoding is off%s",
                                    name, scale, y0, y1, x0, x1, " for it" if name.startswith("sampling") else "")
                        return False
    except (JpegCropError, AttributeError) as exc:  # AttributeError: a helper without jc_header/jc_encode
        log.warning("jpegcrop probe failed (%s: %s); region decoding is off", name, exc)
        return False
    return True


@functools.lru_cache(maxsize=None)  # at most len(TESTED_SAMPLING) entries a helper
def _sampling_vouched(lib: ctypes.CDLL, sampling: tuple[tuple[int, int], ...]) -> bool:
    """The self-check for one of :data:`TESTED_SAMPLING`, once per process, when the first JPEG of it
    comes (about a millisecond): a baseline 47x61 JPEG of that sampling in regions at every scale."""
    return _check(lib, [("sampling " + ",".join(f"{h}x{v}" for h, v in sampling), False, sampling, None,
                         False, False, 0, True)])


@functools.lru_cache(maxsize=1)
def matches_full_decode() -> bool:
    """One-time probe: are the helper's region pixels those of a full decode with Pillow here, for
    every kind of JPEG it takes, and does it leave the others to the full decode?

    Encodes a 47x61 image with the helper's own libjpeg (``jc_encode``) as each kind
    :func:`decode_region` takes (gray; 4:2:0, 4:2:2, 4:4:4; progressive, complete or with
    coefficients 10..63 left out; one scan a component; arithmetic coding; restart intervals) and
    a few it must not (progressive files that libjpeg block-smooths, luma 4x2); decodes each in
    full with Pillow and in regions (edges and interior, every scale) with the helper, and
    compares. About 15 ms once per process; each other sampling of :data:`TESTED_SAMPLING` is
    checked the same way when its first JPEG comes. False when the helper is missing.
    """
    lib = library()
    return lib is not None and _check(lib, _SELF_CHECK)
