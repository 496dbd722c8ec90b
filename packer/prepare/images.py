"""Per-image work done in the packing worker processes: validate, normalize, resize.

Counterpart of ``readers/decode/decoders.py``: what this module stores, that one decodes.
The rules (documented for users in ``docs/bad-input.md``):

* The kind of a file is decided by its content, never by its name. Stored
  formats are JPEG and PNG. Anything else Pillow decodes (GIF, BMP, WEBP,
  TIFF, ...) is normalized and stored as a lossless PNG. EPS is never opened
  (Pillow would run Ghostscript on it).
* A file that needs no change is stored byte for byte. That includes plain
  8-bit grayscale (L) JPEG/PNG: readers' ``convert("RGB")`` replicates the
  channel exactly, so every reader gets the same RGB pixels from a 3x smaller file.
* Everything else becomes 8-bit RGB: CMYK/YCCK (Pillow's Adobe convention),
  16-bit and 32-bit (scaled, not clipped), palette, 1-bit, and alpha, which
  is composited onto white. Orientation is applied to the pixels wherever
  Pillow's ``getexif`` finds it (EXIF, a PNG eXIf chunk, ImageMagick's "Raw
  profile type exif" text, XMP ``tiff:Orientation``). Only the first frame
  of an animation is kept. Re-encoded files carry no metadata.
* A JPEG with junk between its header segments is repaired losslessly first
  (``packer.prepare.jpeg_repair``): stored as the repaired file (``Prepared.repair``
  says what was removed) unless it is re-encoded anyway.
* Rejected (:class:`RejectedImage`, one-line reason): empty, not an image,
  truncated, corrupt (JPEGs on which libjpeg-turbo reports corrupt data
  included), or too costly to decode, checked before decoding: more than
  ``max_pixels`` pixels or more decoded bytes than :func:`max_image_bytes`
  (from the header: size times the mode's bytes per pixel), a file larger than
  that budget (``check_file_size``, also used before a source file is read), a
  JPEG with more than ``readers.decode.decoders.MAX_JPEG_SCANS`` progressive scans. An
  image that still runs the worker out of memory is rejected, not fatal.
* Each image is decoded at most once: an unchanged JPEG is validated by a
  1/8-scale grayscale decode that still reads all its compressed data.
"""

from __future__ import annotations

import io
import math
import struct
import warnings
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Iterator

import numpy as np
import simplejpeg
from PIL import Image, ImageFile, ImageMode, JpegImagePlugin

from packer.prepare.jpeg_repair import repair_header
from packer.prepare.validate_fast import plain_jpeg_size
from readers.decode.decoders import MAX_JPEG_SCANS, too_many_scans
from readers.decode.geometry import resize_center_crop
from readers.contract.messages import one_line

__all__ = ["ImageOptions", "Prepared", "RejectedImage", "prepare_image", "max_image_bytes", "check_file_size",
           "DEFAULT_QUALITY", "DEFAULT_MAX_PIXELS"]

#: JPEG quality of re-encoded images (``PackOptions.quality`` and ``--quality`` default to it).
DEFAULT_QUALITY = 90
#: Decompression-bomb limit in pixels: Pillow's own error threshold (2 x its warning limit).
DEFAULT_MAX_PIXELS = 178_956_970


class RejectedImage(Exception):
    """The file cannot be packed; ``str(exc)`` is a one-line reason."""


@dataclass(frozen=True)
class ImageOptions:
    validate: bool = True  # decode every image once (unchanged JPEGs at 1/8 scale); False: trust the bytes
    max_side: int | None = None  # downscale so the longer side is at most this
    quality: int = DEFAULT_QUALITY  # JPEG quality of downscaled (max_side) re-encodes
    resize: int | None = None  # pixels mode: shorter side -> resize, center crop to resize x resize
    want_pixels: bool = False  # return decoded RGB pixels (mmap) instead of encoded bytes
    max_pixels: int = DEFAULT_MAX_PIXELS  # decompression-bomb limit (Pillow's error threshold)
    normalize_quality: int = 95  # full-size JPEG re-encodes (CMYK, EXIF) use max(quality, this)


def max_image_bytes(opts: ImageOptions) -> int:
    """The memory budget of one image: its decoded pixels (declared size times bytes per pixel of its
    mode) and its file may each take at most this: an 8-bit RGB image of ``max_pixels`` pixels."""
    return 3 * opts.max_pixels


def check_file_size(size: int, opts: ImageOptions) -> None:
    """RejectedImage (one line) when a source file of ``size`` bytes is too big to be read: more than
    :func:`max_image_bytes` (no compressed image of the allowed pixel count needs more)."""
    limit = max_image_bytes(opts)
    if size > limit:
        raise RejectedImage(f"file too large ({size:,} bytes > {limit:,}, 3 bytes per pixel of max_pixels "
                            f"{opts.max_pixels:,}); not read")


@dataclass
class Prepared:
    data: bytes  # bytes to store (original or re-encoded); empty in pixels mode
    ext: str  # "jpg" or "png" (by content); "rgb" in pixels mode
    height: int
    width: int
    changed: bool  # True when ``data`` is not the original file
    pixels: np.ndarray | None = None  # (H, W, 3) uint8 in pixels mode
    note: str = ""  # what was changed (and any decoder warning), comma-separated
    source_format: str = ""  # Pillow's name for the content: "JPEG", "PNG", "GIF", ...
    repair: str = ""  # set when the stored bytes are a lossless repair of the file (what was repaired)
    crc: int | None = None  # CRC-32 of ``data`` when the prepare stage computed it (a wds shard's CRC reuses it)

    @property
    def nbytes(self) -> int:
        """Bytes stored for this sample: the pixels in pixels mode, else ``data``."""
        return self.pixels.nbytes if self.pixels is not None else len(self.data)


_UNSAFE_FORMATS = frozenset({"EPS"})  # Pillow shells out to Ghostscript for these
_JPEG_FORMATS = ("JPEG", "MPO")  # MPO: multi-picture JPEG; its first image is a plain JPEG
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
_SJ_COLORSPACE = {"RGB": "RGB", "L": "GRAY", "CMYK": "CMYK"}  # Pillow JPEG mode -> simplejpeg
# EXIF orientation -> the transpose that makes the pixels upright (as ImageOps.exif_transpose)
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# What Pillow raises for bad data (Image.open itself catches a few more and says "cannot identify").
_PIL_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError)


_OUT_OF_MEMORY = ("out of memory while decoding (the image needs more memory than this process may use; "
                  "lower --workers or --max-pixels)")
_PIL_OUT_OF_MEMORY = ("decoder error -9", "out of memory error")  # Pillow's OSError for IMAGING_CODEC_MEMORY


@cache
def _formats() -> tuple[str, ...]:
    Image.init()
    return tuple(f for f in Image.ID if f not in _UNSAFE_FORMATS)


@contextmanager
def strict_pillow() -> Iterator[list[warnings.WarningMessage]]:
    """Pillow may not accept truncated files; its warnings are recorded, not emitted."""
    saved = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = saved


def _open(data: bytes) -> Image.Image:
    """Identify ``data`` by content and read its header (no pixel decoding)."""
    kind = "JPEG" if data[:2] == b"\xff\xd8" else "PNG" if data[:8] == _PNG_SIGNATURE else "image"
    try:
        return Image.open(io.BytesIO(data), formats=_formats())
    except Image.DecompressionBombError as exc:
        raise RejectedImage(f"decompression bomb ({one_line(exc, 200)})") from None
    except Image.UnidentifiedImageError:
        if kind == "image":
            raise RejectedImage("not an image (content matches no supported format)") from None
        raise RejectedImage(f"corrupt {kind} header (unreadable)") from None
    except _PIL_ERRORS as exc:
        raise RejectedImage(f"corrupt {kind} header ({one_line(exc, 200)})") from None


def _bytes_per_pixel(mode: str) -> int:
    """Bytes per pixel of a Pillow mode: bands times the band's size ('F' 4, 'I;16' 2, 'RGBA' 4, 'P' 1)."""
    try:
        m = ImageMode.getmode(mode)
        return max(1, len(m.bands) * np.dtype(m.typestr).itemsize)
    except (KeyError, TypeError, ValueError):  # a mode this table does not know: count the widest
        return 4


def _load(im: Image.Image) -> None:
    """Full decode with Pillow (first frame)."""
    try:
        im.load()
    except Image.DecompressionBombError as exc:
        raise RejectedImage(f"decompression bomb ({one_line(exc, 200)})") from None
    except _PIL_ERRORS as exc:
        msg = one_line(exc, 200)
        if msg in _PIL_OUT_OF_MEMORY:  # Pillow's decoders say IMAGING_CODEC_MEMORY so, not with MemoryError
            raise RejectedImage(_OUT_OF_MEMORY) from None
        kind = "truncated" if "truncated" in msg or isinstance(exc, EOFError) else "corrupt"
        raise RejectedImage(f"{kind} {im.format} ({msg})") from None


def _check_png_chunks(data: bytes) -> None:
    """Walk the PNG chunks up to IEND, checking every CRC: catches truncation and bit rot cheaply."""
    view, pos = memoryview(data), len(_PNG_SIGNATURE)
    while True:
        if pos + 12 > len(data):
            raise RejectedImage("truncated PNG (file ends before the IEND chunk)")
        length, ctype = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data):
            raise RejectedImage(f"truncated PNG (file ends inside a {ctype.decode('latin-1')!r} chunk)")
        if zlib.crc32(view[pos + 4 : end - 4]) != struct.unpack_from(">I", data, end - 4)[0]:
            raise RejectedImage(f"corrupt PNG (CRC mismatch in {ctype.decode('latin-1')!r} chunk at byte {pos})")
        if ctype == b"IEND":
            return
        pos = end


def _decode_jpeg(data: bytes, colorspace: str, min_w: int, min_h: int, strict: bool) -> np.ndarray:
    """libjpeg-turbo decode at the smallest DCT scale that is at least ``min_w`` x ``min_h``."""
    try:
        return simplejpeg.decode_jpeg(data, colorspace, min_height=min_h, min_width=min_w, strict=strict)
    except (ValueError, OSError) as exc:
        msg = one_line(exc, 200)
        kind = ("truncated JPEG" if "Premature end" in msg
                else "corrupt JPEG data" if "Corrupt JPEG" in msg else "cannot decode JPEG")
        raise RejectedImage(f"{kind} ({msg})") from None


def _jpeg_image(data: bytes, im: Image.Image, min_w: int, min_h: int, strict: bool) -> Image.Image:
    colorspace = _SJ_COLORSPACE.get(im.mode)
    if colorspace is None:
        raise RejectedImage(f"unsupported JPEG colour space {im.mode}")
    arr = _decode_jpeg(data, colorspace, min_w, min_h, strict)
    if colorspace == "CMYK":  # stored inverted (Adobe convention, as Pillow assumes)
        return Image.frombytes("CMYK", (arr.shape[1], arr.shape[0]), arr.tobytes(), "raw", "CMYK;I")
    return Image.fromarray(arr if colorspace == "RGB" else arr[:, :, 0])


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in _ALPHA_MODES or ("transparency" in im.info and im.mode in ("1", "L", "P", "RGB"))


#: Where Pillow's getexif() (and so ImageOps.exif_transpose) finds an orientation besides EXIF blocks:
#: a PNG eXIf chunk ("exif"), ImageMagick's "Raw profile type exif" text chunk, XMP (tiff:Orientation).
_ORIENTATION_INFO = ("exif", "Raw profile type exif", "XML:com.adobe.xmp", "xmp")


def _orientation(im: Image.Image, decoded: bool) -> int:
    """The orientation Pillow's ``ImageOps.exif_transpose`` would apply (1: none), from any of its sources."""
    if im.format == "PNG" and not decoded and not any(k in im.info for k in _ORIENTATION_INFO):
        return 1  # PngImageFile.getexif() would decode the whole image to look for a late eXIf chunk
    try:
        value = im.getexif().get(0x0112, 1)
    except _PIL_ERRORS:  # unreadable EXIF: keep the pixels as they are
        return 1
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


def _problems(im: Image.Image, data: bytes) -> list[str]:
    """Why the file cannot be stored as it is (empty list: it can), from the header alone."""
    fmt, mode, notes = im.format, im.mode, []
    if fmt not in _JPEG_FORMATS and fmt != "PNG":
        notes.append(f"{fmt.lower() if fmt else 'unknown format'}->png")  # Image.open always sets a format
    frames = 1 if fmt in _JPEG_FORMATS else getattr(im, "n_frames", 1)
    if frames > 1:
        notes.append(f"first of {frames} frames")
    if mode in _SIXTEEN_BIT:
        notes.append("16-bit->8-bit")
    elif mode in ("I", "F"):
        notes.append(f"{'32-bit int' if mode == 'I' else 'float'}->8-bit")
    elif fmt == "PNG" and data[24] != 8 and mode in ("RGB", "RGBA", "L", "LA"):
        notes.append(f"{data[24]}-bit->8-bit")
    if mode not in ("RGB", "L") + _SIXTEEN_BIT + ("I", "F"):
        notes.append("1-bit->rgb" if mode == "1" else "palette->rgb" if mode == "P" else f"{mode.lower()}->rgb")
    if _has_alpha(im):
        notes.append("alpha on white")
    return notes


#: Pixels converted to 8 bits per numpy step: the float64 work arrays stay ~0.5 MB whatever the image.
_STRIP_PIXELS = 1 << 16


def _strips(img: Image.Image) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, pixels) of consecutive horizontal strips of ``img``, ~``_STRIP_PIXELS`` each."""
    w, h = img.size
    rows = max(1, _STRIP_PIXELS // max(w, 1))
    for y in range(0, h, rows):
        yield y, np.asarray(img.crop((0, y, w, min(y + rows, h))))


def _to_8bit(img: Image.Image, mode: str) -> Image.Image:
    """Scale 16-bit (>> 8), 32-bit int and float images to 0..255 instead of clipping them: an L image.

    Strip by strip, so the extra memory is the 8-bit result plus a few small work arrays
    (a whole-image float64 pipeline took ~30 bytes per pixel: 5 GB for a 1 MB float TIFF).
    """
    out = np.empty((img.height, img.width), np.uint8)
    if mode in _SIXTEEN_BIT:
        for y, s in _strips(img):
            out[y:y + len(s)] = (s.astype(np.uint16) >> 8).astype(np.uint8)
        return Image.fromarray(out)
    lo, hi = math.inf, -math.inf
    for _y, s in _strips(img):
        a = np.nan_to_num(s.astype(np.float64))
        lo, hi = min(lo, float(a.min())), max(hi, float(a.max()))

    def convert(a: np.ndarray) -> np.ndarray:
        if mode == "I" and lo >= 0 and hi <= 65535:  # 16-bit data in a 32-bit mode
            return (a.astype(np.uint32) >> 8).astype(np.uint8)
        if mode == "F" and lo >= 0 and hi <= 1:
            return np.rint(a * 255).astype(np.uint8)
        span = (hi - lo) or 1.0  # anything else: stretch its range
        return np.rint((a - lo) * (255 / span)).astype(np.uint8)

    for y, s in _strips(img):
        out[y:y + len(s)] = convert(np.nan_to_num(s.astype(np.float64)))
    return Image.fromarray(out)


def to_rgb(img: Image.Image) -> Image.Image:
    mode = img.mode
    if mode in _SIXTEEN_BIT or mode in ("I", "F"):
        img, mode = _to_8bit(img, mode), "L"
    try:
        if _has_alpha(img):
            white = Image.new("RGBA", img.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, img.convert("RGBA")).convert("RGB")
        return img if mode == "RGB" else img.convert("RGB")
    except ValueError as exc:
        raise RejectedImage(f"unsupported pixel mode {mode} ({one_line(exc, 200)})") from None


def _downscaled(w: int, h: int, opts: ImageOptions) -> tuple[int, int] | None:
    """Stored size under ``max_side`` (None: no downscale)."""
    if not opts.max_side or max(w, h) <= opts.max_side or (opts.want_pixels and opts.resize):
        return None
    scale = opts.max_side / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def _resize_short_center_crop(im: Image.Image, size: int, full: tuple[int, int]) -> Image.Image:
    """Shorter side to ``size``, center crop; geometry from ``full`` (the size before any DCT reduction).

    The geometry is torchvision's ``Resize(size)`` + ``CenterCrop(size)``, shared
    with the readers' eval transform (``readers.decode.geometry``).
    """
    g = resize_center_crop(full[1], full[0], size, size)
    return im.resize((g.width, g.height), Image.Resampling.BICUBIC, reducing_gap=3.0).crop(g.box)


def prepare_image(data: bytes, opts: ImageOptions) -> Prepared:
    """Validate ``data`` and return what to store for it, or raise RejectedImage.

    Meant for worker processes: while it runs it swaps process-wide state (Pillow's
    ``LOAD_TRUNCATED_IMAGES`` and the warning filters), so do not call it from several
    threads of one process at once.
    """
    if not data:
        raise RejectedImage("empty file (0 bytes)")
    check_file_size(len(data), opts)
    try:
        plain = _plain_jpeg(data, opts)  # the common case without Pillow (packer.prepare.validate_fast)
        if plain is not None:  # (its scans are counted there when it is progressive)
            return plain
        if data[:2] == b"\xff\xd8" and too_many_scans(data):
            raise RejectedImage(f"JPEG with more than {MAX_JPEG_SCANS} scans (each scan costs a pass over the "
                                "whole image: a decode that can take minutes; encoders write at most ~10)")
        with strict_pillow() as caught:
            prep = prepare_with_pillow(data, opts)
    except MemoryError:
        raise RejectedImage(_OUT_OF_MEMORY) from None
    seen = [one_line(w.message, 200) for w in caught if not issubclass(w.category, Image.DecompressionBombWarning)]
    if seen:
        prep.note = ", ".join(filter(None, [prep.note, f"warning: {seen[0]}"]))
    return prep


def _plain_jpeg(data: bytes, opts: ImageOptions) -> Prepared | None:
    """A plain JPEG stored as it is, decided from its header alone; None: take the full path."""
    size = None if opts.want_pixels else plain_jpeg_size(data)
    if size is None:
        return None
    h, w = size
    if w * h > opts.max_pixels or _downscaled(w, h, opts):
        return None
    if opts.validate:  # reads all compressed data; 1/8 scale, luma only
        _decode_jpeg(data, "GRAY", 1, 1, strict=True)
    return Prepared(data, "jpg", h, w, False, source_format="JPEG")


def prepare_with_pillow(data: bytes, opts: ImageOptions) -> Prepared:
    """A JPEG with junk between its header segments is repaired losslessly first (``packer.prepare.jpeg_repair``)."""
    fixed = repair_header(data) if data[:2] == b"\xff\xd8" else None
    if fixed is None:
        return _prepare_file(data, opts)
    repaired, what = fixed
    prep = _prepare_file(repaired, opts)
    if not prep.changed:  # stored as the repaired file: listed in repairs.jsonl
        prep.changed, prep.repair = True, what
    prep.note = ", ".join(filter(None, [what, prep.note]))  # re-encoded anyway: the note says it
    return prep


def _prepare_file(data: bytes, opts: ImageOptions) -> Prepared:
    im = _open(data)
    fmt, (w, h) = im.format or "", im.size
    if w * h > opts.max_pixels:
        raise RejectedImage(f"decompression bomb ({w}x{h} = {w * h:,} pixels > max_pixels {opts.max_pixels:,})")
    need = w * h * _bytes_per_pixel(im.mode)
    if need > max_image_bytes(opts):
        raise RejectedImage(f"decompression bomb ({w}x{h} {im.mode} = {need:,} bytes decoded > "
                            f"{max_image_bytes(opts):,}, 3 bytes per pixel of max_pixels {opts.max_pixels:,})")
    jpeg = fmt in _JPEG_FORMATS
    notes = _problems(im, data)
    decoded = not jpeg and bool(opts.validate or notes or opts.want_pixels or _downscaled(w, h, opts))
    if decoded:
        if fmt == "PNG" and opts.validate:
            _check_png_chunks(data)
        _load(im)  # the one full decode (PNG has no reduced mode)
    orientation = _orientation(im, decoded)
    if orientation != 1:
        notes.append(f"exif-rotate (orientation {orientation})")
    if orientation >= 5:  # 5..8 swap the axes
        w, h = h, w
    target = _downscaled(w, h, opts)
    ext = "jpg" if jpeg else "png"
    if not notes and target is None and not opts.want_pixels:
        if jpeg and opts.validate:  # reads all compressed data; 1/8 scale, luma only
            _decode_jpeg(data, "GRAY", 1, 1, strict=True)
        return Prepared(data, ext, h, w, False, source_format=fmt)

    if jpeg:  # the one full decode, at a reduced DCT scale when the result is much smaller
        min_w = min_h = 0
        if target:
            min_w, min_h = 2 * target[0], 2 * target[1]
        elif opts.want_pixels and opts.resize and 2 * opts.resize < min(w, h):
            scale = 2 * opts.resize / min(w, h)
            min_w, min_h = math.ceil(w * scale), math.ceil(h * scale)
        if orientation >= 5:
            min_w, min_h = min_h, min_w
        sampling = JpegImagePlugin.get_sampling(im)  # keep 4:4:4 / 4:2:2 / 4:2:0 (-1: default)
        im = _jpeg_image(data, im, min_w, min_h, strict=opts.validate)
    rgb = to_rgb(im)
    if orientation in _TRANSPOSE:
        rgb = rgb.transpose(_TRANSPOSE[orientation])
    if opts.want_pixels and opts.resize:
        rgb = _resize_short_center_crop(rgb, opts.resize, (w, h))
    elif target:
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
        notes.append(f"downscaled {w}x{h}->{target[0]}x{target[1]}")
    note = ", ".join(notes)
    if opts.want_pixels:
        arr = np.asarray(rgb)
        return Prepared(b"", "rgb", arr.shape[0], arr.shape[1], True, arr, note, fmt)
    buf = io.BytesIO()
    if jpeg:
        quality = opts.quality if target else max(opts.quality, opts.normalize_quality)
        rgb.save(buf, "JPEG", quality=quality, subsampling=sampling)
    else:
        rgb.save(buf, "PNG")
    return Prepared(buf.getvalue(), ext, rgb.height, rgb.width, True, None, note, fmt)
