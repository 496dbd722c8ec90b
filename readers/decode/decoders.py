"""Decoding stored image bytes to RGB uint8 arrays (HWC), with pluggable decoders.

Counterpart of ``packer/prepare/images.py``, which decides what bytes are stored.

Decoders
--------
``"simplejpeg"``
    libjpeg-turbo through the ``simplejpeg`` package. JPEG only (detected by
    the magic bytes ``FF D8 FF``, never by file name). Always run with the
    accurate integer DCT and fancy upsampling (``fastdct=False``,
    ``fastupsample=False``), which is what Pillow uses.
``"pillow"``
    The installed ``PIL`` (Pillow, or pillow-simd when that is what is
    installed: both are imported as ``PIL``), with its JPEG and PNG plugins only.
``"pillow-simd"``
    The same code path as ``"pillow"``; only available when the installed
    ``PIL`` is a pillow-simd build (its version carries a ``.postN`` suffix).

``"auto"`` decodes PNG and every other non-JPEG with PIL. For JPEG it picks
``"simplejpeg"`` when it is importable *and* a one-time probe shows that it
decodes bit-exactly like the installed PIL (both link libjpeg-turbo with the
same settings; the probe decodes a few small generated JPEGs -- 4:2:0, 4:2:2,
4:4:4, grayscale, progressive, odd sizes -- at full and reduced scale with
both and compares). Otherwise ``"auto"`` falls back to PIL, so the contract
below holds whatever is installed:

    ``decode_rgb(data)`` equals ``np.asarray(Image.open(BytesIO(data)).convert("RGB"))``

JPEGs that simplejpeg cannot turn into RGB the way Pillow does (CMYK, YCCK)
and JPEGs that libjpeg-turbo flags as corrupt (simplejpeg is strict, Pillow
is lenient) are decoded by PIL under every decoder choice. EXIF orientation
is never applied (neither by Pillow's ``convert`` nor here).

What is refused
---------------
Only what the packer stores is decoded: JPEG (MPO's first picture included)
and PNG. Pillow is asked for those two plugins alone (``Image.open(fp,
formats=["JPEG", "PNG"])``), so bytes of any other kind in a dataset (EPS,
for which Pillow would start Ghostscript; TIFF, ...) are a :class:`DecodeError`,
and no other plugin's code runs. A progressive (or arithmetic-coded) JPEG with more
than :data:`MAX_JPEG_SCANS` scans is refused before decoding (:func:`jpeg_scans`):
each of its scans makes libjpeg pass over every block of the image, so a
crafted file of a few hundred KB with ~900 scans takes over a minute to
decode. Encoders write 1 (baseline) to ~10 (progressive) scans. The pixel
limit is Pillow's (twice ``PIL.Image.MAX_IMAGE_PIXELS``), checked from the header.

Size-aware decoding
-------------------
``decode_rgb_reduced(data, min_h, min_w)`` decodes a JPEG at the largest DCT
scale 1/2, 1/4 or 1/8 whose output is still at least ``min_h`` x ``min_w``
(the same rule as Pillow's ``Image.draft``: ``H // s >= min_h`` and
``W // s >= min_w``), so the pixels never have to be upsampled afterwards.
simplejpeg and Pillow's draft mode produce the same pixels at the same scale.
Only power-of-two scales are used: libjpeg-turbo's other M/8 scales are slower
than a full decode (measured here: 5/8 to 7/8 take 1.4x to 1.9x the time of 8/8).

Region decoding
---------------
``decode_rgb_region(data, scale, rows, cols)`` decodes at least a region of the
image at DCT scale ``1/scale``. With ``decoder="auto"`` and the optional native
helper of :mod:`readers.decode.jpegcrop` built (the package build compiles it when a C
compiler and libjpeg-turbo's headers are there), a JPEG is decoded from its first
row to the region's last row only, and the rows above and the columns outside the
region are only entropy-decoded; the region's pixels are the full decode's, bit
for bit. Without the helper, or for other decoders and images, it is the full
:func:`decode_rgb_scaled`.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import re
import struct
from dataclasses import dataclass

import numpy as np
import PIL
from PIL import Image

from readers.contract.spec import is_jpeg
from readers.decode import jpegcrop

try:  # optional at import time; a declared dependency of the project
    import simplejpeg as _sj
except ImportError:  # pragma: no cover - exercised only without simplejpeg
    _sj = None

__all__ = [
    "DECODERS",
    "MAX_JPEG_SCANS",
    "STORED_FORMATS",
    "DecodeError",
    "DecoderUnavailableError",
    "ImageHeader",
    "decode_rgb",
    "decode_rgb_reduced",
    "decode_rgb_region",
    "decode_rgb_scaled",
    "available_decoders",
    "auto_decoder",
    "decoder_report",
    "is_jpeg",
    "jpeg_scans",
    "too_many_scans",
    "pillow_is_simd",
    "read_header",
    "reduction_for",
    "simplejpeg_matches_pillow",
]

log = logging.getLogger(__name__)

#: Every decoder name this module knows, whether installed or not.
DECODERS = ("simplejpeg", "pillow", "pillow-simd")
_CHOICES = ("auto",) + DECODERS
_SCALES = (8, 4, 2, 1)
# simplejpeg header colorspaces it converts to RGB exactly like Pillow does.
_SJ_COLORSPACES = frozenset({"Gray", "YCbCr", "RGB"})
#: The Pillow plugins the readers decode with: the formats the packer stores (``packer.prepare.images``).
STORED_FORMATS = ("JPEG", "PNG")
#: The most scans a JPEG may have (baseline: 1 per component at most 4; libjpeg's progressive
#: default: 10, grayscale 6). Each scan costs a pass over every block of the image.
MAX_JPEG_SCANS = 100
# A marker after the first scan's header: FF then anything but 00 (stuffing), RST0-7 or FF (fill).
_NEXT_MARKER = re.compile(rb"\xff[\x01\xc0-\xcf\xd8-\xfe]")
_NO_LENGTH = frozenset({0x01, 0xD8, 0xD9})  # TEM, SOI, EOI: no length field
_HUFFMAN_SEQUENTIAL = frozenset({0xC0, 0xC1})  # SOF0 baseline, SOF1 extended sequential (Huffman)
# What Pillow raises for unreadable data.
_PIL_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError, Image.DecompressionBombError)


def _buffer(data: bytes | bytearray | memoryview | np.ndarray) -> bytes | bytearray | memoryview:
    """``data`` as a buffer the standard library's types take, nothing copied (an array: its
    ``.data``, the memoryview of its buffer; numpy declares ``__buffer__`` only from Python 3.12)."""
    return data.data if isinstance(data, np.ndarray) else data


class DecodeError(OSError):
    """The bytes cannot be decoded as an image (subclass of ``OSError`` like Pillow's errors)."""


class DecoderUnavailableError(RuntimeError):
    """The requested decoder is not installed in this environment."""


@dataclass(frozen=True)
class ImageHeader:
    """Size and kind of an encoded image, read without decoding pixels."""

    height: int
    width: int
    is_jpeg: bool
    #: JPEG colorspace from the header ("YCbCr", "Gray", "CMYK", ...) or the PIL mode otherwise.
    colorspace: str


# --------------------------------------------------------------------------- detection


def jpeg_scans(data: bytes | bytearray | memoryview | np.ndarray, limit: int = MAX_JPEG_SCANS) -> int:
    """The number of scans (SOS markers) of a progressive or arithmetic-coded JPEG, counted up to
    ``limit + 1`` (then it stops); 1 for a Huffman-coded sequential one (baseline, extended).

    Those are the frames where a scan can cost a pass over every block of the image for
    a few bytes (end-of-band runs, refinements, arithmetic coding); a Huffman-coded
    sequential scan costs at least two bits per block, so its decode time is bounded by
    its size and its entropy data is not searched. Walks the marker segments by their
    lengths (bytes inside an Exif thumbnail or a comment are never taken for a marker)
    and, between segments, searches the entropy-coded data for the next marker (there
    ``FF`` is always followed by a stuffed ``00`` or a restart marker): one C-level
    search over the file. Data that ends early or is not a JPEG gives the count so far
    (the decoder reports what is wrong with it).
    """
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(_buffer(data))
    n, pos, scans = len(buf), 2, 0
    while pos + 2 <= n and scans <= limit:
        if buf[pos] != 0xFF or buf[pos + 1] in (0x00, 0xFF) or 0xD0 <= buf[pos + 1] <= 0xD7:
            found = _NEXT_MARKER.search(buf, pos)  # entropy-coded data (or junk) up to the next marker
            if found is None:
                break
            pos = found.start()
        marker = buf[pos + 1]
        if marker in _HUFFMAN_SEQUENTIAL:
            return 1
        if marker == 0xD9:  # EOI
            break
        if marker in _NO_LENGTH:
            pos += 2
            continue
        scans += marker == 0xDA
        if pos + 4 > n:
            break
        pos += 2 + ((buf[pos + 2] << 8) | buf[pos + 3])
    return scans


def too_many_scans(data: bytes | bytearray | memoryview | np.ndarray, limit: int = MAX_JPEG_SCANS) -> bool:
    """True when the JPEG ``data`` has more than ``limit`` costly scans (:func:`jpeg_scans`): refuse it.

    Measured here: ~5 us for a baseline JPEG (header walk only), ~50 us for an 84 KB
    progressive one (the search runs at ~1.6 GB/s).
    """
    return jpeg_scans(data, limit) > limit


def pillow_is_simd() -> bool:
    """True when the installed ``PIL`` is a pillow-simd build (version like ``9.5.0.post1``)."""
    return ".post" in PIL.__version__


def available_decoders() -> tuple[str, ...]:
    """Installed decoder names, fastest JPEG decoder first (``"auto"`` not included)."""
    names = []
    if _sj is not None:
        names.append("simplejpeg")
    if pillow_is_simd():
        names.append("pillow-simd")
    names.append("pillow")
    return tuple(names)


@functools.lru_cache(maxsize=1)
def simplejpeg_matches_pillow() -> bool:
    """One-time probe: does simplejpeg decode exactly like the installed PIL here?

    Decodes a handful of small generated JPEGs (every chroma subsampling,
    grayscale, progressive, odd sizes) at full and 1/2 scale with both and
    compares the pixels. False when simplejpeg is missing. Costs a few
    milliseconds once per process.
    """
    if _sj is None:
        return False
    rng = np.random.default_rng(12345)
    yy, xx = np.mgrid[0:45, 0:61]
    base = np.stack([(xx * 4) % 256, (yy * 5) % 256, ((xx + yy) * 3) % 256], axis=-1)
    base = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    samples = []
    for kwargs in ({"subsampling": 0}, {"subsampling": 1}, {"subsampling": 2},
                   {"subsampling": 2, "progressive": True, "quality": 70}):
        buf = io.BytesIO()
        Image.fromarray(base).save(buf, "JPEG", quality=kwargs.pop("quality", 90), **kwargs)
        samples.append(buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(base[:, :, 0]).save(buf, "JPEG", quality=90)
    samples.append(buf.getvalue())
    try:
        for data in samples:
            for scale in (1, 2):
                ours = _sj_decode(data, 45, 61, scale)
                ref = _pil_decode(data, scale)
                if ours.shape != ref.shape or not np.array_equal(ours, ref):
                    log.warning(
                        "simplejpeg %s does not decode bit-exactly like PIL %s here; "
                        "decoder='auto' uses PIL for JPEG", _sj.__version__, PIL.__version__)
                    return False
    except (ValueError, OSError) as exc:  # a broken build: say why, use PIL
        log.warning("simplejpeg probe failed (%s); decoder='auto' uses PIL for JPEG", exc)
        return False
    return True


def auto_decoder(jpeg: bool = True) -> str:
    """The decoder ``decoder="auto"`` uses for a JPEG (``jpeg=True``) or any other image."""
    if jpeg and simplejpeg_matches_pillow():
        return "simplejpeg"
    return "pillow-simd" if pillow_is_simd() else "pillow"


def decoder_report() -> dict:
    """Versions and choices, for logs and benchmark output."""
    try:
        from PIL import features

        turbo = features.version("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None
    except (ImportError, ValueError):  # pragma: no cover - very old Pillow
        turbo = None
    return {
        "pil": PIL.__version__,
        "pil_is_simd": pillow_is_simd(),
        "pil_libjpeg_turbo": turbo,
        "simplejpeg": getattr(_sj, "__version__", None),
        "simplejpeg_matches_pillow": simplejpeg_matches_pillow(),
        "available": list(available_decoders()),
        "auto_jpeg": auto_decoder(True),
        "auto_other": auto_decoder(False),
    }


def _resolve(decoder: str, jpeg: bool) -> str:
    """Map a requested decoder name to the code path actually used for this image."""
    if decoder not in _CHOICES:
        raise ValueError(f"unknown decoder {decoder!r}; choose one of {_CHOICES}")
    if decoder == "auto":
        return "simplejpeg" if auto_decoder(jpeg) == "simplejpeg" else "pil"
    if decoder == "simplejpeg":
        if _sj is None:
            raise DecoderUnavailableError("decoder 'simplejpeg' requested but simplejpeg is not installed")
        return "simplejpeg" if jpeg else "pil"  # non-JPEG always goes through PIL
    if decoder == "pillow-simd" and not pillow_is_simd():
        raise DecoderUnavailableError(
            f"decoder 'pillow-simd' requested but the installed PIL is Pillow {PIL.__version__}; "
            "see docs/decode.md to build pillow-simd")
    return "pil"


# --------------------------------------------------------------------------- headers


def read_header(data: bytes | bytearray | memoryview | np.ndarray) -> ImageHeader:
    """Height, width and colorspace of encoded bytes, without decoding the pixels."""
    jpeg = is_jpeg(data)
    if jpeg and _sj is not None:
        try:
            h, w, colorspace, _sub = _sj.decode_jpeg_header(data)
            return ImageHeader(int(h), int(w), True, str(colorspace))
        except (ValueError, KeyError):  # KeyError: a sampling simplejpeg has no name for (4:4:1 is 6)
            pass  # let PIL try (and produce the error message) below
    try:
        with Image.open(io.BytesIO(_buffer(data)), formats=STORED_FORMATS) as im:
            w, h = im.size
            return ImageHeader(h, w, jpeg, im.mode)
    except Image.UnidentifiedImageError:
        raise DecodeError(_not_stored(data)) from None
    except _PIL_ERRORS as exc:
        raise DecodeError(f"cannot read image header: {exc}") from exc


def reduction_for(height: int, width: int, min_h: int, min_w: int, *, jpeg: bool = True) -> int:
    """Largest DCT scale denominator in (8, 4, 2, 1) with ``height // s >= min_h`` and ``width // s >= min_w``.

    Always 1 for non-JPEG and for tiny images (either side under 16 pixels),
    where libjpeg's scaled sizes stop being distinguishable.
    """
    if min_h < 1 or min_w < 1:
        raise ValueError(f"minimum size must be >= 1, got {min_h}x{min_w}")
    if not jpeg or min(height, width) < 16:
        return 1
    for s in _SCALES:
        if height // s >= min_h and width // s >= min_w:
            return s
    return 1


# --------------------------------------------------------------------------- decoding


def _check_bomb(height: int, width: int) -> None:
    limit = Image.MAX_IMAGE_PIXELS
    if limit and height * width > 2 * limit:
        raise DecodeError(
            f"image of {height}x{width} pixels exceeds twice PIL.Image.MAX_IMAGE_PIXELS ({limit}); "
            "possible decompression bomb")


def _not_stored(data) -> str:
    head = bytes(memoryview(data)[:8])
    return (f"not a JPEG or PNG image (starts with {head!r}); readers decode only the formats "
            "the packer stores")


def _check_scans(data) -> None:
    if too_many_scans(data):
        raise DecodeError(f"JPEG with more than {MAX_JPEG_SCANS} scans refused before decoding "
                          "(each scan costs a pass over the whole image; encoders write at most ~10)")


def _sj_decode(data, height: int, width: int, scale: int) -> np.ndarray:
    kwargs = {}
    if scale > 1:
        kwargs = {"min_height": math.ceil(height / scale), "min_width": math.ceil(width / scale)}
    return _sj.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, **kwargs)


def _pil_decode(data, scale: int) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data), formats=STORED_FORMATS) as im:
            if scale > 1 and im.format == "JPEG":
                w, h = im.size
                # Exactly 1/scale, even where a side is under scale: Pillow picks the scale as
                # min(w // size[0], h // size[1]), which no whole size gives there. Pillow's
                # annotation says tuple[int, int]; JpegImageFile.draft takes any numbers.
                im.draft("RGB", (w / scale, h / scale))  # type: ignore[arg-type]
            return np.asarray(im.convert("RGB"))
    except Image.UnidentifiedImageError:
        raise DecodeError(_not_stored(data)) from None
    except _PIL_ERRORS as exc:
        raise DecodeError(f"cannot decode image: {exc}") from exc


def decode_rgb_scaled(data: bytes | bytearray | memoryview | np.ndarray, scale: int = 1, *,
                      decoder: str = "auto", header: ImageHeader | None = None) -> np.ndarray:
    """Decode at DCT scale ``1/scale`` (``scale`` in 1, 2, 4, 8); non-JPEG ignores ``scale``.

    The result is ``ceil(H/scale) x ceil(W/scale)`` for a JPEG (libjpeg's
    rounding), RGB uint8 HWC. It may be read-only (PIL path): copy before
    writing into it. ``header`` saves re-parsing when the caller already has it.
    """
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {sorted(_SCALES)}, got {scale!r}")
    jpeg = is_jpeg(data)
    path = _resolve(decoder, jpeg)
    if jpeg:
        _check_scans(data)
    if path == "simplejpeg":
        if header is None or not header.is_jpeg:
            try:
                header = read_header(data)
            except DecodeError:
                header = None
        if header is not None and header.colorspace in _SJ_COLORSPACES:
            _check_bomb(header.height, header.width)
            try:
                return _sj_decode(data, header.height, header.width, scale)
            except ValueError as exc:  # strict libjpeg-turbo warning or error: Pillow decides
                log.debug("simplejpeg refused the data (%s); decoding with PIL", exc)
    return _pil_decode(data, scale)


def decode_rgb(data: bytes | bytearray | memoryview | np.ndarray, *, decoder: str = "auto") -> np.ndarray:
    """Decode JPEG or PNG bytes to an RGB ``uint8`` array of shape (H, W, 3).

    Equals ``np.asarray(Image.open(BytesIO(data)).convert("RGB"))`` exactly
    for ``decoder="auto"`` and ``"pillow"``; for ``"simplejpeg"`` too wherever
    :func:`simplejpeg_matches_pillow` is true. May be read-only.
    Raises :class:`DecodeError` for data no decoder can read.
    """
    return decode_rgb_scaled(data, 1, decoder=decoder)


def decode_rgb_reduced(data: bytes | bytearray | memoryview | np.ndarray, min_h: int, min_w: int, *,
                       decoder: str = "auto") -> np.ndarray:
    """Decode at the smallest DCT scale that keeps the image at least ``min_h`` x ``min_w``.

    A JPEG of H x W is decoded at ``1/s``, ``s`` from :func:`reduction_for`
    (largest of 8, 4, 2, 1 with ``H // s >= min_h`` and ``W // s >= min_w``).
    Images already smaller than the minimum, and non-JPEGs, decode at full size.
    """
    header = read_header(data)
    scale = reduction_for(header.height, header.width, min_h, min_w, jpeg=header.is_jpeg)
    return decode_rgb_scaled(data, scale, decoder=decoder, header=header)


def _ends_with_eoi(data) -> bool:
    return bytes(memoryview(data)[-2:]) == b"\xff\xd9"


def decode_rgb_region(data: bytes | bytearray | memoryview | np.ndarray, scale: int, rows: tuple[int, int],
                      cols: tuple[int, int], *, decoder: str = "auto", header: ImageHeader | None = None,
                      canvas: bool = False) -> tuple[np.ndarray, int, int]:
    """Decode at least rows ``rows[0]:rows[1]`` and columns ``cols[0]:cols[1]`` of the image at DCT
    scale ``1/scale`` (those are coordinates in the ``ceil(H/scale) x ceil(W/scale)`` decoded image).

    Returns ``(pixels, top, left)``: ``pixels`` (RGB uint8 HWC) holds decoded rows ``top..`` and
    columns ``left..``; slice ``pixels[rows[0] - top:rows[1] - top, cols[0] - left:cols[1] - left]``.
    Those pixels equal the same slice of :func:`decode_rgb_scaled`. Only ``decoder="auto"`` with
    the :mod:`readers.decode.jpegcrop` helper decodes less than the whole image (then ``pixels`` is
    writable); otherwise it is the whole decode, ``top = left = 0``, and may be read-only.
    ``canvas=True``: ``top = left = 0`` always, and ``pixels`` runs from the image's first row and
    column to (at least) the region's last ones; only the region's pixels are defined (the region
    decode leaves the rest as allocated), C-contiguous. For a resize that needs the image's
    coordinates but reads only the region.
    A JPEG that does not end with its EOI marker (truncated) or that libjpeg warns about
    is decoded in full, so it meets the same error or leniency as with :func:`decode_rgb_scaled`.
    """
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {sorted(_SCALES)}, got {scale!r}")
    (r0, r1), (c0, c1) = rows, cols
    if not (0 <= r0 < r1 and 0 <= c0 < c1):
        raise ValueError(f"empty or negative region rows {rows}, columns {cols}")
    # Data not ending in EOI (truncated, or trailing bytes) goes the usual way: a region decode
    # stops before the end, and would accept a truncated file that the full decode refuses.
    if decoder == "auto" and is_jpeg(data) and _ends_with_eoi(data) and jpegcrop.available():
        if header is None or not header.is_jpeg:
            header = read_header(data)
        if header.colorspace in _SJ_COLORSPACES:
            _check_scans(data)
            _check_bomb(header.height, header.width)
            try:
                size = (-(-header.height // scale), -(-header.width // scale))
                region = jpegcrop.decode_region(data, scale, r0, r1, c0, c1, canvas=canvas, size=size)
            except jpegcrop.JpegCropError as exc:  # corrupt or odd: the usual path decides
                log.debug("jpegcrop refused the data (%s); decoding in full", exc)
                region = None
            if region is not None:
                return region.pixels, region.top, region.left
    return decode_rgb_scaled(data, scale, decoder=decoder, header=header), 0, 0
