"""packer.prepare.validate_fast: the header-only fast path gives exactly what the full (Pillow) path gives."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.prepare.images import ImageOptions, RejectedImage, prepare_with_pillow, strict_pillow, prepare_image
from packer.prepare.validate_fast import exif_orientation, plain_jpeg_size


def photo(w=64, h=48, mode="RGB", seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BILINEAR).convert(mode)


def jpeg(img: Image.Image, orientation: int | None = None, **kw) -> bytes:
    buf = io.BytesIO()
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


XMP = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
       b'<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/></rdf:RDF></x:xmpmeta>')


def junk_before_dqt(data: bytes) -> bytes:
    at = data.index(b"\xff\xdb")
    return data[:at] + b"\x00junk" + data[at:]


def outcome(fn, data: bytes, opts: ImageOptions):
    try:
        p = fn(data, opts)
    except RejectedImage as exc:
        return ("rejected", str(exc))
    return (p.data == data, p.ext, p.height, p.width, p.changed, p.source_format,
            None if p.data == data else len(p.data))


def full_path(data: bytes, opts: ImageOptions):
    with strict_pillow():  # as prepare_image runs it: Pillow's warnings recorded, not raised
        return prepare_with_pillow(data, opts)  # the Pillow path, no fast path in front


CASES = {
    "rgb": lambda: jpeg(photo()),
    "gray": lambda: jpeg(photo(mode="L")),
    "progressive": lambda: jpeg(photo(), progressive=True),
    "cmyk": lambda: jpeg(photo(mode="CMYK")),
    "upright exif": lambda: jpeg(photo(), orientation=1),
    "rotated exif": lambda: jpeg(photo(), orientation=6),
    "odd orientation value": lambda: jpeg(photo(), orientation=9),
    "444": lambda: jpeg(photo(), subsampling=0),
    "rotated xmp": lambda: jpeg(photo(), xmp=XMP % 6),  # Pillow applies XMP's orientation too
    "upright exif, rotated xmp": lambda: jpeg(photo(), orientation=1, xmp=XMP % 6),
    "junk before a marker": lambda: junk_before_dqt(jpeg(photo())),  # repaired (packer.prepare.jpeg_repair)
    "big": lambda: jpeg(photo(640, 480)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("opts", [ImageOptions(), ImageOptions(validate=False), ImageOptions(max_side=32)],
                         ids=["validate", "trust", "max_side"])
def test_fast_path_agrees_with_the_full_path(name, opts):
    data = CASES[name]()
    assert outcome(prepare_image, data, opts) == outcome(full_path, data, opts)


def test_fast_path_takes_only_plain_jpegs():
    assert plain_jpeg_size(CASES["rgb"]()) == (48, 64)
    assert plain_jpeg_size(CASES["gray"]()) == (48, 64)
    assert plain_jpeg_size(CASES["progressive"]()) == (48, 64)
    assert plain_jpeg_size(CASES["upright exif"]()) == (48, 64)
    for name in ("cmyk", "rotated exif", "rotated xmp", "upright exif, rotated xmp", "junk before a marker"):
        assert plain_jpeg_size(CASES[name]()) is None, name
    png = io.BytesIO()
    photo().save(png, "PNG")
    assert plain_jpeg_size(png.getvalue()) is None
    assert plain_jpeg_size(b"") is None and plain_jpeg_size(b"\xff\xd8\xff") is None


@pytest.mark.parametrize("orientation", range(0, 10))
def test_exif_orientation_reads_what_pillow_reads(orientation):
    data = jpeg(photo(), orientation=orientation)
    with Image.open(io.BytesIO(data)) as im:
        want = im.getexif().get(0x0112, 1)
        raw = im.info["exif"]
    assert exif_orientation(raw[6:]) == want


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 700), st.integers(1, 255)), min_size=1, max_size=3),
       st.sampled_from(["rgb", "upright exif", "progressive", "gray"]), st.booleans())
def test_damaged_headers_get_the_full_paths_verdict(flips, name, validate):
    """Bytes flipped anywhere in the header region: accepted or rejected exactly as Pillow's path says."""
    data = bytearray(CASES[name]())
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    data = bytes(data)
    opts = ImageOptions(validate=validate)
    fast, full = outcome(prepare_image, data, opts), outcome(full_path, data, opts)
    if fast[0] == "rejected" or full[0] == "rejected":
        # the same verdict; with validation on the messages may name the decoder's finding instead
        assert fast[0] == full[0]
        if not validate:
            assert fast == full
    else:
        assert fast == full
