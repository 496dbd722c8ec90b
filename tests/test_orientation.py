"""Every orientation Pillow's ImageOps.exif_transpose honours is made upright, whatever carries it:
EXIF in JPEG/WebP/TIFF, a PNG eXIf chunk (before or after the image data), ImageMagick's
"Raw profile type exif" PNG text chunk, and XMP's tiff:Orientation (JPEG, PNG, WebP).

Built from a real photo; the expected pixels are conftest.expected_rgb (ImageOps.exif_transpose)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from conftest import REAL_IMAGES
from reference import expected_rgb
from packer.prepare.images import ImageOptions, prepare_image

ORIENTATIONS = range(2, 9)


def photo() -> Image.Image:
    with Image.open(REAL_IMAGES / "animals" / "chelsea.png") as im:
        return im.convert("RGB").resize((60, 40), Image.LANCZOS)  # not square: 5..8 swap the axes


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()  # starts with b"Exif\0\0"


def xmp(orientation: int) -> bytes:
    return (b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description rdf:about="" '
            b'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/></rdf:RDF></x:xmpmeta>'
            b'<?xpacket end="w"?>' % orientation)


def _chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def _png_with_chunk_after_idat(im: Image.Image, ctype: bytes, body: bytes) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    data = buf.getvalue()
    iend = data.rindex(b"IEND") - 4
    return data[:iend] + _chunk(ctype, body) + data[iend:]


def imagemagick_raw_profile(orientation: int) -> str:
    """The text of ImageMagick's "Raw profile type exif" chunk: name, length, hex in 72-column lines."""
    raw = exif_bytes(orientation)
    hexed = raw.hex()
    lines = [hexed[i:i + 72] for i in range(0, len(hexed), 72)]
    return "\nexif\n" + f"{len(raw):8d}\n" + "\n".join(lines) + "\n"


def carriers() -> dict[str, callable]:
    def save(fmt, **kw):
        def make(im, o):
            buf = io.BytesIO()
            im.save(buf, fmt, **{k: (v(o) if callable(v) else v) for k, v in kw.items()})
            return buf.getvalue()
        return make

    def png_text(key, value):
        def make(im, o):
            info = PngImagePlugin.PngInfo()
            info.add_itxt(key, value(o)) if key.startswith("XML") else info.add_text(key, value(o), zip=True)
            buf = io.BytesIO()
            im.save(buf, "PNG", pnginfo=info)
            return buf.getvalue()
        return make

    return {
        "jpeg-exif": save("JPEG", quality=95, exif=exif_bytes),
        "jpeg-xmp": save("JPEG", quality=95, xmp=xmp),
        "png-exif-chunk": save("PNG", exif=exif_bytes),
        "png-exif-chunk-after-idat": lambda im, o: _png_with_chunk_after_idat(im, b"eXIf", exif_bytes(o)[6:]),
        "png-imagemagick-raw-profile": png_text("Raw profile type exif", imagemagick_raw_profile),
        "png-xmp": png_text("XML:com.adobe.xmp", lambda o: xmp(o).decode()),
        "webp-exif": save("WEBP", lossless=True, exif=exif_bytes),
        "webp-xmp": save("WEBP", lossless=True, xmp=xmp),
        "tiff-tag": save("TIFF", tiffinfo=lambda o: {0x0112: o}),
    }


CARRIERS = carriers()


def stored_rgb(data: bytes, opts: ImageOptions) -> np.ndarray:
    prep = prepare_image(data, opts)
    if prep.pixels is not None:
        return prep.pixels
    with Image.open(io.BytesIO(prep.data)) as im:
        assert im.getexif().get(0x0112, 1) == 1 and "xmp" not in im.info  # nothing left to apply twice
        return np.asarray(im.convert("RGB"))


@pytest.mark.parametrize("orientation", ORIENTATIONS)
@pytest.mark.parametrize("carrier", CARRIERS, ids=str)
def test_orientation_is_applied(carrier, orientation):
    data = CARRIERS[carrier](photo(), orientation)
    want = expected_rgb(data)
    unrotated = expected_rgb(CARRIERS[carrier](photo(), 1))
    assert want.shape != unrotated.shape or not np.array_equal(want, unrotated)  # Pillow honours it
    for opts in (ImageOptions(), ImageOptions(want_pixels=True), ImageOptions(validate=False)):
        if "after-idat" in carrier and not opts.validate:
            continue  # only a full decode reaches a chunk after the image data (docs/bad-input.md)
        assert_upright(stored_rgb(data, opts), want, carrier, exact=opts.want_pixels)


def assert_upright(got: np.ndarray, want: np.ndarray, carrier: str, exact: bool) -> None:
    assert got.shape == want.shape
    if carrier.startswith("jpeg"):  # re-encoded at quality 95 (pixels mode: the exact decode)
        assert np.abs(got.astype(int) - want).mean() < (0.01 if exact else 3)
    else:
        assert np.array_equal(got, want)


def test_tiff_orientation_is_applied_once():
    """Pillow turns an oriented TIFF upright as it decodes it (and drops the tag): not rotated twice."""
    prep = prepare_image(CARRIERS["tiff-tag"](photo(), 6), ImageOptions())
    assert (prep.width, prep.height) == (40, 60)


@pytest.mark.parametrize("carrier", CARRIERS, ids=str)
def test_orientation_one_changes_nothing(carrier):
    data = CARRIERS[carrier](photo(), 1)
    prep = prepare_image(data, ImageOptions())
    assert "orientation" not in prep.note
    if carrier.startswith(("jpeg", "png")):
        assert not prep.changed and prep.data == data
