"""The region decoder takes only the JPEGs it decodes exactly (issue 33 item 1): block-smoothed
progressive files and untested sampling factors are left to the full decode, and every region
of what it does take equals the full decode."""

from __future__ import annotations

import numpy as np
import pytest

from readers.decode import jpegcrop
from readers.decode.decoders import decode_rgb_region, decode_rgb_scaled


@pytest.fixture(scope="module")
def lib():
    if not jpegcrop.available():
        pytest.skip("the jpegcrop helper is not built here (pip install -e . builds it)")
    return jpegcrop.library()


def image(h: int = 90, w: int = 130) -> np.ndarray:
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, 128 + 100 * np.sin((xx + yy) / 5)], -1)
    return np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)


DC = ((0, 1, 2), 0, 0, 0, 0)
KINDS = {  # name: (encode arguments, taken by the region decoder)
    "progressive DC only": ({"scans": (DC,)}, False),
    "progressive AC 1..5": ({"scans": (DC, ((0,), 1, 5, 0, 0), ((1,), 1, 63, 0, 0), ((2,), 1, 63, 0, 0))}, False),
    "progressive AC 1..9": ({"scans": (DC, ((0,), 1, 9, 0, 0), ((1,), 1, 9, 0, 0), ((2,), 1, 9, 0, 0))}, True),
    "progressive": ({"progressive": True}, True),
    "luma 4x2": ({"sampling": ((4, 2), (1, 1), (1, 1))}, False),
    "luma 2x4": ({"sampling": ((2, 4), (1, 1), (1, 1))}, False),
    "4:1:1 restart 2": ({"sampling": ((4, 1), (1, 1), (1, 1)), "restart": 2}, True),
    "arithmetic": ({"arithmetic": True}, True),
}


@pytest.mark.parametrize("name", KINDS)
def test_region_is_exact_or_the_full_decode(lib, name):
    kwargs, taken = KINDS[name]
    data = jpegcrop.encode(lib, image(), **kwargs)
    rng = np.random.default_rng(1)
    for scale in (1, 2, 4, 8):
        full = decode_rgb_scaled(data, scale)
        h, w = full.shape[:2]
        boxes = [(0, h, 0, w), (h - 1, h, w - 1, w)]
        for _ in range(10):
            y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
            boxes.append((y0, int(rng.integers(y0 + 1, h + 1)), x0, int(rng.integers(x0 + 1, w + 1))))
        for y0, y1, x0, x1 in boxes:
            r = jpegcrop.decode_region(data, scale, y0, y1, x0, x1)
            assert (r is not None) == taken, (scale, (y0, y1, x0, x1))
            pixels, top, left = decode_rgb_region(data, scale, (y0, y1), (x0, x1))
            assert np.array_equal(pixels[y0 - top:y1 - top, x0 - left:x1 - left], full[y0:y1, x0:x1])


# ------------------------------------------------------------------ the differential sweep (issue 33 item 1)
#: libjpeg-turbo's jpeg_simple_progression for YCbCr: its 10 scans, to stop after each.
STANDARD_SCRIPT = (
    ((0, 1, 2), 0, 0, 0, 1), ((0,), 1, 5, 0, 2), ((2,), 1, 63, 0, 1), ((1,), 1, 63, 0, 1), ((0,), 6, 63, 0, 2),
    ((0,), 1, 63, 2, 1), ((0, 1, 2), 0, 0, 1, 0), ((2,), 1, 63, 1, 0), ((1,), 1, 63, 1, 0), ((0,), 1, 63, 1, 0),
)
CHROMA = ((1, 1), (2, 1), (1, 2), (2, 2))


def sweep_cases():
    """(name, encode arguments): every luma sampling libjpeg allows with each chroma sampling (Cb as Cr and
    a few Cb unlike Cr), the standard progressive script stopped after each scan, restart intervals,
    arithmetic coding, sequential and progressive."""
    for lh in range(1, 5):
        for lv in range(1, 5):
            for c in CHROMA:
                yield f"sampling {lh}x{lv},{c[0]}x{c[1]}", {"sampling": ((lh, lv), c, c)}
    for cb, cr in (((1, 1), (2, 1)), ((2, 2), (1, 1)), ((1, 2), (1, 1))):
        yield f"sampling 2x2,{cb},{cr}", {"sampling": ((2, 2), cb, cr)}
    for luma in ((2, 2), (1, 1), (2, 1)):
        for k in range(1, len(STANDARD_SCRIPT) + 1):
            yield f"progressive {luma} stopped after scan {k}", {"sampling": (luma, (1, 1), (1, 1)),
                                                                 "scans": STANDARD_SCRIPT[:k]}
    for restart in (1, 2, 5):
        yield f"restart {restart}", {"sampling": ((2, 2), (1, 1), (1, 1)), "restart": restart}
        yield f"progressive restart {restart}", {"sampling": ((2, 1), (1, 1), (1, 1)), "restart": restart,
                                                  "progressive": True}
    for luma in ((1, 1), (2, 2), (2, 1), (4, 1)):
        yield f"arithmetic {luma}", {"sampling": (luma, (1, 1), (1, 1)), "arithmetic": True}
        yield f"arithmetic progressive {luma}", {"sampling": (luma, (1, 1), (1, 1)), "arithmetic": True,
                                                 "progressive": True}


def regions(h: int, w: int, rng) -> list[tuple[int, int, int, int]]:
    """Three crops at each scale (4 scales: 12 in all): the whole image, a corner pixel, a random box."""
    y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
    return [(0, h, 0, w), (h - 1, h, w - 1, w), (y0, int(rng.integers(y0 + 1, h + 1)), x0, int(rng.integers(x0 + 1, w + 1)))]


def test_every_built_jpeg_region_equals_the_full_decode_or_takes_it(lib, capsys):
    """Each JPEG built for the purpose, at 4 scales x 3 crops: the region the readers return equals the
    full decode of the same library, whether the region decoder took the file or left it to the full decode.
    The counts go to the test's output (``-s``) and to the closing note of issue 33."""
    rng = np.random.default_rng(7)
    compared = taken = not_encodable = 0
    for size in ((47, 61), (90, 130)):
        pixels = image(*size)
        for name, kwargs in sweep_cases():
            try:
                data = jpegcrop.encode(lib, pixels, **kwargs)
            except jpegcrop.JpegCropError:  # libjpeg refuses the factors (more than 10 blocks in an MCU)
                not_encodable += 1
                continue
            compared += 1
            took = False
            for scale in (1, 2, 4, 8):
                full = decode_rgb_scaled(data, scale)
                for y0, y1, x0, x1 in regions(*full.shape[:2], rng):
                    took |= jpegcrop.decode_region(data, scale, y0, y1, x0, x1) is not None
                    got, top, left = decode_rgb_region(data, scale, (y0, y1), (x0, x1))
                    assert np.array_equal(got[y0 - top:y1 - top, x0 - left:x1 - left], full[y0:y1, x0:x1]), \
                        (name, size, scale, (y0, y1, x0, x1))
            taken += took
    with capsys.disabled():
        print(f"\n[region sweep] {compared} JPEGs compared at 12 scale/crop pairs each: {taken} taken by the "
              f"region decoder, {compared - taken} left to the full decode; {not_encodable} factor sets "
              "libjpeg refuses to encode")
    assert compared > 100 and 0 < taken < compared
