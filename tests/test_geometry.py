"""readers.decode.geometry: the one resize + center-crop geometry (eval transform, mmap --resize, naive baseline)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from readers.decode.geometry import resize_center_crop, resize_short_side

sides = st.integers(1, 5000)


def test_known_torchvision_sizes():
    # torchvision: Resize(256) on a 500x375 (WxH) image gives 341x256; CenterCrop(224) then starts at (16, 58)
    g = resize_center_crop(375, 500, 256, 224)
    assert (g.height, g.width, g.top, g.left) == (256, 341, 16, 58)
    assert g.box == (58, 16, 282, 240)
    # the longer side is truncated, not rounded: 256 * 1000 / 299 = 856.19..., 256 * 299 / 200 = 382.72
    assert resize_short_side(1000, 299, 256) == (856, 256)
    assert resize_short_side(200, 299, 256) == (256, 382)
    # an odd margin is split the way Python rounds halves (to even): (257 - 224) / 2 = 16.5 -> 16
    assert resize_center_crop(257, 256, 257, 224).left == int(round((257 - 224) / 2))


@given(h=sides, w=sides, resize=st.integers(1, 1024))
def test_shorter_side_is_resize_and_aspect_is_kept(h, w, resize):
    rh, rw = resize_short_side(h, w, resize)
    assert min(rh, rw) == resize
    long_exact = resize * max(h, w) / min(h, w)
    assert long_exact - 1 < max(rh, rw) <= long_exact  # truncated, at most one pixel short
    assert (rh <= rw) if h < w else (rw <= rh)  # the shorter side stays the shorter (or equal)


@given(h=sides, w=sides, resize=st.integers(1, 1024), data=st.data())
def test_crop_is_centred_and_inside(h, w, resize, data):
    crop = data.draw(st.integers(1, resize))
    g = resize_center_crop(h, w, resize, crop)
    for size, start in ((g.height, g.top), (g.width, g.left)):
        end_margin = size - crop - start
        assert start >= 0 and end_margin >= 0  # crop <= resize: always inside
        assert abs(start - end_margin) <= 1  # centred to the pixel
    left, top, right, bottom = g.box
    assert (right - left, bottom - top) == (crop, crop)


def test_rectangular_crop_and_bad_sizes():
    g = resize_center_crop(480, 640, 256, (200, 240))
    assert (g.crop_height, g.crop_width) == (200, 240) and g.box[2] - g.box[0] == 240
    for args in ((0, 10, 8, 8), (10, 10, 0, 8), (10, 10, 8, 0)):
        with pytest.raises(ValueError):
            resize_center_crop(*args)
