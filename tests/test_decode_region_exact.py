"""The region decoder takes only the JPEGs it decodes exactly (issue 33 item 1): block-smoothed
progressive files and untested sampling factors are left to the full decode, and every region
of what it does take equals the full decode."""

from __future__ import annotations

import numpy as np
import pytest

from readers import jpegcrop
from readers.decode import decode_rgb_region, decode_rgb_scaled


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
    data = jpegcrop._encode(lib, image(), **kwargs)
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
