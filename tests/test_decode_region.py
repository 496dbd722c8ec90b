"""readers/decode/jpegcrop.py and decode_rgb_region: region decoding equals the full decode, does less, falls back."""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from readers.decode import jpegcrop
from readers.decode.decoders import DecodeError, MAX_JPEG_SCANS, decode_rgb_region, decode_rgb_scaled
from readers.decode.transforms import imagenet_eval_transform, imagenet_train_transform, resized_crop
from test_bombs import scan_bomb

REPO = Path(__file__).resolve().parent.parent
REAL_JPEGS = sorted(p for p in (REPO / "examples" / "real-images").rglob("*.jpg"))


def textured(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([xx * 255 / w, yy * 255 / h, 128 + 100 * np.sin((xx + yy) / 9)], -1)
    return np.clip(base + rng.normal(0, 14, base.shape), 0, 255).astype(np.uint8)


def jpeg(arr: np.ndarray, mode: str = "RGB", **kwargs) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, "JPEG", **kwargs)
    return buf.getvalue()


GENERATED = {
    "444": jpeg(textured(203, 317), subsampling=0, quality=90),
    "422": jpeg(textured(203, 317, 1), subsampling=1, quality=90),
    "420": jpeg(textured(401, 491, 2), subsampling=2, quality=90),
    "420-progressive": jpeg(textured(375, 500, 3), subsampling=2, quality=85, progressive=True),
    "gray": jpeg(textured(150, 233, 4), "L", quality=90),
    "odd-tiny": jpeg(textured(17, 37, 5), subsampling=2),
    "tall-thin": jpeg(textured(300, 9, 6), subsampling=2),
}


@pytest.fixture(scope="module")
def helper():
    """The helper as the readers load it: the package build's (``pip install -e .`` builds it in place)."""
    if jpegcrop.native_path() is None:
        pytest.skip("jpegcrop helper not built: pip install -e . builds it where a C compiler and jpeglib.h exist")
    assert jpegcrop.library() is not None, f"{jpegcrop.native_path()} is not this helper (reinstall: pip install -e .)"
    assert jpegcrop.available(), "the helper is built but does not decode like a full decode"
    return jpegcrop.library()


def regions(h: int, w: int, rng: np.random.Generator, n: int):
    yield 0, h, 0, w
    yield h - 1, h, w - 1, w
    for _ in range(n):
        y0 = int(rng.integers(0, h))
        x0 = int(rng.integers(0, w))
        yield y0, int(rng.integers(y0 + 1, h + 1)), x0, int(rng.integers(x0 + 1, w + 1))


CASES = [pytest.param(p.read_bytes(), id=p.name) for p in REAL_JPEGS] + [
    pytest.param(data, id=name) for name, data in GENERATED.items()]


@pytest.mark.parametrize("data", CASES)
def test_region_pixels_equal_the_full_decode(helper, data):
    """Bit-exact: every region at every scale is the same slice of the full decode (tolerance 0)."""
    rng = np.random.default_rng(len(data))
    for scale in (1, 2, 4, 8):
        full = decode_rgb_scaled(data, scale)
        h, w = full.shape[:2]
        for y0, y1, x0, x1 in regions(h, w, rng, 4 if h * w > 1_000_000 else 10):
            pixels, top, left = decode_rgb_region(data, scale, (y0, y1), (x0, x1))
            assert pixels.flags.writeable
            got = pixels[y0 - top:y1 - top, x0 - left:x1 - left]
            assert np.array_equal(got, full[y0:y1, x0:x1]), (scale, (y0, y1, x0, x1))


def test_rows_below_the_region_are_not_decoded(helper):
    """A JPEG cut off after 60% of its data: the top rows decode (the decode stops at the region's
    last row, never reading the missing data); the whole image does not decode strictly."""
    data = GENERATED["420"]
    cut = data[: int(len(data) * 0.6)]
    top_rows = decode_rgb_scaled(data, 1)[:100]
    region = jpegcrop.decode_region(cut, 1, 0, 100, 0, 491)
    assert np.array_equal(region.pixels[:100], top_rows)
    with pytest.raises(jpegcrop.JpegCropError, match="(?i)premature end"):
        jpegcrop.decode_region(cut, 1, 0, 401, 0, 491)


def test_corrupt_data_takes_the_usual_path(helper):
    """Truncated data, or data libjpeg warns about, meets decode_rgb_scaled's verdict, wherever the region."""
    data = GENERATED["420"]
    cut = data[: len(data) // 2]
    for rows in ((0, 50), (300, 400)):
        with pytest.raises(DecodeError, match="truncated"):
            decode_rgb_region(cut, 1, rows, (0, 491))
    with pytest.raises(DecodeError, match="truncated"):
        decode_rgb_scaled(cut, 1)
    # A bit flipped in the entropy data: libjpeg warns; the region path then decodes in full as before.
    bad = bytearray(data)
    bad[len(data) // 3] ^= 0x5A
    bad = bytes(bad)
    full = decode_rgb_scaled(bad, 1)
    pixels, top, left = decode_rgb_region(bad, 1, (300, 400), (0, 491))
    assert np.array_equal(pixels[300 - top:400 - top], full[300:400])
    with pytest.raises(DecodeError):
        decode_rgb_region(b"\xff\xd8\xff\xe0 not a jpeg at all", 1, (0, 4), (0, 4))
    with pytest.raises(DecodeError, match=rf"JPEG with more than {MAX_JPEG_SCANS} scans"):
        decode_rgb_region(scan_bomb(64, 48), 1, (0, 4), (0, 4))


def test_cmyk_and_png_decode_in_full(helper):
    cmyk = jpeg(textured(40, 50), "CMYK")
    assert jpegcrop.decode_region(cmyk, 1, 0, 10, 0, 10) is None
    pixels, top, left = decode_rgb_region(cmyk, 1, (5, 10), (5, 10))
    assert (top, left) == (0, 0) and np.array_equal(pixels, decode_rgb_scaled(cmyk, 1))
    buf = io.BytesIO()
    Image.fromarray(textured(40, 50)).save(buf, "PNG")
    pixels, top, left = decode_rgb_region(buf.getvalue(), 2, (5, 10), (5, 10))
    assert (top, left) == (0, 0) and pixels.shape == (40, 50, 3)


def test_other_decoders_decode_in_full(helper):
    data = GENERATED["444"]
    for decoder in ("pillow", "simplejpeg"):
        pixels, top, left = decode_rgb_region(data, 1, (50, 60), (70, 80), decoder=decoder)
        assert (top, left) == (0, 0) and pixels.shape == (203, 317, 3)
        # the eval resize from the part of a (read-only, for Pillow) whole decode: the same output
        on, off = (imagenet_eval_transform(224, 256, decoder=decoder, crop_decode=c) for c in (True, False))
        assert torch.equal(on(GENERATED["420"]), off(GENERATED["420"]))


@pytest.mark.parametrize("data", CASES)
def test_train_transform_output_unchanged(helper, data):
    """The fused train crop gives the same tensors with and without region decoding."""
    on = imagenet_train_transform(224, seed=5)
    off = imagenet_train_transform(224, seed=5, crop_decode=False)
    for _ in range(4):
        assert torch.equal(on(data), off(data))
    small = imagenet_train_transform(16, seed=1)  # reduced (1/2 .. 1/8) decodes of the real photos
    small_off = imagenet_train_transform(16, seed=1, crop_decode=False)
    for _ in range(2):
        assert torch.equal(small(data), small_off(data))


@pytest.mark.parametrize("data", CASES)
def test_eval_transform_output_unchanged(helper, data):
    """Resize-then-crop from the rows and columns its filter reads: the same tensors as from the
    whole image (the canvas left of and above them is never written, so never read either)."""
    for resize, crop, interpolation in ((256, 224, "bilinear"), (232, 224, "bicubic"), (64, 56, "bilinear"),
                                        (300, 160, "bicubic")):
        on = imagenet_eval_transform(crop, resize, interpolation=interpolation)
        off = imagenet_eval_transform(crop, resize, interpolation=interpolation, crop_decode=False)
        assert torch.equal(on(data), off(data)), (resize, crop, interpolation)


def test_canvas_region(helper):
    data = GENERATED["420"]
    full = decode_rgb_scaled(data, 2)
    pixels, top, left = decode_rgb_region(data, 2, (50, 120), (60, 200), canvas=True)
    assert (top, left) == (0, 0) and pixels.flags.c_contiguous
    assert pixels.shape[0] >= 120 and pixels.shape[1] >= 200 and pixels.shape[:2] <= full.shape[:2]
    assert np.array_equal(pixels[50:120, 60:200], full[50:120, 60:200])
    pixels, _, _ = decode_rgb_region(data, 2, (150, 201), (0, 246), canvas=True)  # to the image's edges
    assert pixels.shape == full.shape and np.array_equal(pixels[150:], full[150:])


def test_fallback_when_the_helper_is_off(helper, monkeypatch):
    """DATASET_PACKER_JPEGCROP=off (as without the helper): whole decode, same transform output."""
    data = GENERATED["420"]
    box = (100, 120, 250, 260)
    with_helper = resized_crop(data, box, (224, 224))
    eval_with_helper = imagenet_eval_transform()(data)
    pixels, top, _ = decode_rgb_region(data, 1, (100, 350), (120, 380))
    assert top < 100 and pixels.shape[0] < 401
    monkeypatch.setenv("DATASET_PACKER_JPEGCROP", "off")
    jpegcrop.library.cache_clear()
    jpegcrop.matches_full_decode.cache_clear()
    try:
        assert not jpegcrop.available()
        pixels, top, left = decode_rgb_region(data, 1, (100, 350), (120, 380))
        assert (top, left) == (0, 0) and pixels.shape == (401, 491, 3)
        assert torch.equal(resized_crop(data, box, (224, 224)), with_helper)
        assert torch.equal(imagenet_eval_transform()(data), eval_with_helper)
    finally:
        monkeypatch.delenv("DATASET_PACKER_JPEGCROP")
        jpegcrop.library.cache_clear()
        jpegcrop.matches_full_decode.cache_clear()
    assert jpegcrop.available()


def test_a_library_that_is_not_the_helper_is_refused(helper, tmp_path, caplog):
    other = tmp_path / "other.so"
    other.write_bytes(b"not a shared library")
    assert jpegcrop.load(other) is None
    assert jpegcrop.load(tmp_path / "missing.so") is None
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc:
        with caplog.at_level(logging.WARNING, logger="readers.decode.jpegcrop"):
            assert jpegcrop.load(libc) is None
        assert "not the jpegcrop helper" in caplog.text


def test_another_helper_named_by_the_environment_is_loaded(helper, tmp_path, monkeypatch):
    """DATASET_PACKER_JPEGCROP=<path>: that library instead of the package build's."""
    other = tmp_path / "other_jpegcrop.so"
    shutil.copyfile(jpegcrop.native_path(), other)
    monkeypatch.setenv("DATASET_PACKER_JPEGCROP", str(other))
    jpegcrop.library.cache_clear()
    jpegcrop.matches_full_decode.cache_clear()
    try:
        lib = jpegcrop.library()
        assert lib is not None and lib._name == str(other) and jpegcrop.available()
        assert jpegcrop.decode_region(GENERATED["420"], 1, 100, 120, 50, 60) is not None
    finally:
        monkeypatch.delenv("DATASET_PACKER_JPEGCROP")
        jpegcrop.library.cache_clear()
        jpegcrop.matches_full_decode.cache_clear()
    assert jpegcrop.library()._name == str(jpegcrop.native_path())


def test_region_rejects_bad_arguments():
    with pytest.raises(ValueError, match="scale"):
        decode_rgb_region(GENERATED["444"], 3, (0, 1), (0, 1))
    with pytest.raises(ValueError, match="empty"):
        decode_rgb_region(GENERATED["444"], 1, (5, 5), (0, 1))
