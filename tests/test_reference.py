"""The oracles in tests/reference.py, checked against the examples their sources document."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from reference import expected_rgb, on_white, pil_rgb, torchvision_crop_params


def png(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", **kw)
    return buf.getvalue()


def test_alpha_on_white_is_the_documented_rule():
    # docs/bad-input.md: fully transparent -> white whatever its colour; half-transparent red -> (255, 127, 127)
    rgba = np.array([[[255, 0, 0, 128], [12, 34, 56, 0], [12, 34, 56, 255]]], np.uint8)
    assert on_white(rgba).tolist() == [[[255, 127, 127], [255, 255, 255], [12, 34, 56]]]
    assert np.array_equal(expected_rgb(png(Image.fromarray(rgba))), on_white(rgba))
    assert not np.array_equal(pil_rgb(png(Image.fromarray(rgba))), on_white(rgba))  # plain decode drops alpha


def test_palette_transparency_and_exif_rotation():
    pal = Image.new("P", (3, 1))
    pal.putpalette([10, 20, 30, 200, 100, 0] + [0] * 762)
    pal.putpixel((1, 0), 1)
    assert expected_rgb(png(pal, transparency=0)).tolist() == [[[255, 255, 255], [200, 100, 0], [255, 255, 255]]]
    im = Image.new("RGB", (4, 2), (0, 128, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    buf = io.BytesIO()
    im.save(buf, "JPEG", exif=exif.tobytes())
    assert expected_rgb(buf.getvalue()).shape == (4, 2, 3) and pil_rgb(buf.getvalue()).shape == (2, 4, 3)


class Scripted:
    """Draw functions that record each call and answer from a script."""

    def __init__(self, uniforms=(), ints=()):
        self.calls: list[tuple] = []
        self._u, self._i = list(uniforms), list(ints)

    def uniform(self, a, b):
        self.calls.append(("uniform", a, b))
        return self._u.pop(0) if self._u else a

    def randint(self, a, b):
        self.calls.append(("randint", a, b))
        return self._i.pop(0)


def test_torchvision_crop_params_draw_order():
    # 480x640 at a quarter of the area, square: w = h = round(sqrt(76800)) = 277, then top, then left
    d = Scripted(ints=[10, 20])
    assert torchvision_crop_params(480, 640, (0.25, 0.25), (1.0, 1.0), d.uniform, d.randint) == (10, 20, 277, 277)
    assert d.calls == [("uniform", 0.25, 0.25), ("uniform", 0.0, 0.0), ("randint", 0, 204), ("randint", 0, 364)]


def test_torchvision_crop_params_fallback_after_ten_tries():
    d = Scripted()
    assert torchvision_crop_params(100, 1000, (2.0, 2.0), (0.75, 4 / 3), d.uniform, d.randint) == (0, 433, 100, 133)
    assert [c[0] for c in d.calls] == ["uniform"] * 20
    d = Scripted()
    assert torchvision_crop_params(1, 1, (2.0, 2.0), (0.25, 0.25), d.uniform, d.randint) == (0, 0, 1, 0)  # 0 px wide
