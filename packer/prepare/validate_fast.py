"""The common case, fast: a plain JPEG that is stored exactly as it is.

Most of an ImageNet-style folder is baseline or progressive 8-bit JPEG, RGB
(YCbCr) or grayscale, upright, without an alpha channel or a second picture:
files :func:`packer.prepare.images.prepare_image` keeps byte for byte. For those,
opening the file with Pillow (marker parsing, quantization tables, EXIF
dictionary) costs more than everything else the packer does per image
without validation (measured here: ~65 us of ~100 us per image).

:func:`plain_jpeg_size` walks the JPEG markers up to the first scan in plain
Python over the bytes: frame header (precision, size, components), the first
Exif block's orientation, an XMP orientation, Adobe and multi-picture markers,
and junk between segments (which ``packer.prepare.jpeg_repair`` removes on the full path). It answers
``(height, width)`` only when the file is such a plain JPEG, and None for
anything else (other formats, CMYK, 12-bit, Adobe colour transforms, MPO,
an orientation that must be applied, a header it cannot read, a progressive
JPEG with more scans than ``readers.decode.decoders.MAX_JPEG_SCANS``); then the full
path decides, so nothing the full path would change or reject is let through
on the header's word. With validation on, the entropy-coded data is still
checked in full by the caller (libjpeg-turbo's decode at 1/8 scale, luma
only: every coefficient is Huffman-decoded, almost no inverse DCT or colour
conversion runs; the cheapest complete check measured here, see
``docs/throughput.md``).
"""

from __future__ import annotations

import struct

from readers.decode.decoders import too_many_scans

__all__ = ["plain_jpeg_size", "exif_orientation"]

# Start-of-frame markers (not DHT C4, JPG C8, DAC CC); C2/C6/CA/CE are progressive.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_HUFFMAN_SEQUENTIAL = frozenset({0xC0, 0xC1})  # every other frame's scans are counted (readers.decode.decoders.jpeg_scans)
_RST = frozenset(range(0xD0, 0xD8))  # RST0-7: no length field
_SOS, _EOI, _DQT, _APP1, _APP2, _APP14 = 0xDA, 0xD9, 0xDB, 0xE1, 0xE2, 0xEE
_ORIENTATION = 0x0112


def exif_orientation(exif: bytes) -> int | None:
    """The orientation tag of an Exif block's first IFD (TIFF data after ``Exif\\0\\0``): its
    value, 1 when the IFD has none, None when the block cannot be read."""
    if len(exif) < 8 or exif[:4] not in (b"II*\0", b"MM\0*"):
        return None
    end = "<" if exif[:2] == b"II" else ">"
    try:
        (ifd,) = struct.unpack_from(end + "I", exif, 4)
        (count,) = struct.unpack_from(end + "H", exif, ifd)
        if ifd + 2 + 12 * count > len(exif):
            return None
        for k in range(count):
            tag, kind, n = struct.unpack_from(end + "HHI", exif, ifd + 2 + 12 * k)
            if tag == _ORIENTATION:
                if n != 1 or kind not in (3, 4):  # SHORT or LONG, one value
                    return None
                return struct.unpack_from(end + ("H" if kind == 3 else "I"), exif, ifd + 10 + 12 * k)[0]
    except struct.error:
        return None
    return 1


def _tables_fit(data: bytes, start: int, end: int) -> bool:
    """A DQT segment holds whole quantization tables (64 entries of 1 or 2 bytes each), as
    Pillow requires before it accepts the header."""
    pos = start
    while pos < end:
        size = 1 + 64 * (1 if data[pos] >> 4 == 0 else 2)
        if pos + size > end:
            return False
        pos += size
    return True


def plain_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` when ``data`` is a plain JPEG kept as it is (see module docstring), else None.

    The marker segments before the first scan are walked in one loop (no generator: this runs once per
    image on a pack's fast path); anything that is not a well-formed header answers None."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    size = None
    orientation = 1
    seen_exif = False
    frame = 0
    pos, n = 2, len(data)
    while True:
        if pos + 2 > n or data[pos] != 0xFF:
            return None  # not at a marker
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _RST:
            pos += 2
            continue
        if marker < 0xC0 or marker in (0xD8, _EOI):  # not a marker Pillow knows, or misplaced
            return None
        if pos + 4 > n:
            return None  # truncated
        length = (data[pos + 2] << 8) | data[pos + 3]
        start, end = pos + 4, pos + 2 + length
        if length < 2 or end > n:
            return None  # bad length
        if marker in _SOF:
            if size is not None or end - start < 6:
                return None
            precision, height, width, components = struct.unpack_from(">BHHB", data, start)
            if precision != 8 or components not in (1, 3) or height == 0 or width == 0:
                return None
            size, frame = (height, width), marker
        elif marker == _DQT:
            if not _tables_fit(data, start, end):
                return None
        elif marker == _APP1:
            if data[start:start + 6] == b"Exif\0\0":
                if not seen_exif:
                    seen_exif = True  # the first Exif block is the one that counts (as Pillow reads it)
                    value = exif_orientation(data[start + 6:end])
                    if value is None:
                        return None
                    orientation = value
            elif data.find(b"Orientation", start, end) >= 0:
                return None  # XMP's tiff:Orientation, which Pillow applies when Exif has none
        elif (marker == _APP2 and data[start:start + 4] == b"MPF\0") or (
                marker == _APP14 and data[start:start + 5] == b"Adobe"):
            return None
        elif marker == _SOS:
            if size is None:
                return None
            break
        pos = end
    if orientation in (2, 3, 4, 5, 6, 7, 8):  # must be applied: the full path re-encodes
        return None
    if frame not in _HUFFMAN_SEQUENTIAL and too_many_scans(data):  # a scan bomb: the full path rejects it
        return None
    return size
