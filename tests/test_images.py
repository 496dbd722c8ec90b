"""packer.prepare.images against hostile and odd input, built here (in memory or under tmp_path).

Every case asserts the exact outcome: rejected (and why) or accepted, with
the stored extension, whether the bytes were changed, the stored size and,
where it means something, the pixels a reader gets back.
"""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageFile, ImageOps

from packer.prepare.images import ImageOptions, Prepared, RejectedImage, prepare_image

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "examples" / "real-images"
DEFAULT = ImageOptions()


# ----------------------------------------------------------------------------- helpers


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def decode(data: bytes) -> np.ndarray:
    """What a reader gets: Pillow's RGB conversion, no EXIF applied."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def photo(size=(160, 120)) -> Image.Image:
    """A real photograph, resized: realistic entropy-coded data to cut and corrupt."""
    with Image.open(REAL / "objects_scenes" / "china.jpg") as im:
        return im.convert("RGB").resize(size, Image.LANCZOS)


def blocks(w: int = 48, h: int = 32) -> Image.Image:
    """Four flat quadrants (red, green / blue, white): survives JPEG, shows any rotation."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2 :] = (0, 255, 0)
    a[h // 2 :, : w // 2] = (0, 0, 255)
    a[h // 2 :, w // 2 :] = (255, 255, 255)
    return Image.fromarray(a)


def chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def raw_png(width: int, height: int, depth: int, color_type: int, raw: bytes) -> bytes:
    """A PNG assembled by hand (IHDR may claim anything; ``raw`` is the filtered scanlines)."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def with_orientation(im: Image.Image, fmt: str, orientation: int, **kw) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(im, fmt, exif=exif.tobytes(), **kw)


def rejected(data: bytes, opts: ImageOptions = DEFAULT) -> str:
    with pytest.raises(RejectedImage) as info:
        prepare_image(data, opts)
    reason = str(info.value)
    assert reason and "\n" not in reason and len(reason) < 250, reason
    return reason


def untouched(data: bytes, ext: str, size: tuple[int, int], opts: ImageOptions = DEFAULT) -> Prepared:
    prep = prepare_image(data, opts)
    assert (prep.ext, prep.changed, prep.note) == (ext, False, "")
    assert prep.data is data
    assert (prep.width, prep.height) == size
    return prep


def converted(data: bytes, ext: str, size: tuple[int, int], note: str, opts: ImageOptions = DEFAULT) -> np.ndarray:
    """Accepted but re-encoded: checks ext/size/note and returns the stored RGB pixels."""
    prep = prepare_image(data, opts)
    assert (prep.ext, prep.changed) == (ext, True)
    assert note in prep.note, prep.note
    with Image.open(io.BytesIO(prep.data)) as im:
        assert im.format == {"jpg": "JPEG", "png": "PNG"}[ext]
        assert im.mode == "RGB"  # every re-encoded image is RGB
        assert im.size == (prep.width, prep.height) == size
        assert "exif" not in im.info  # no metadata carried over (no orientation left to re-apply)
    return decode(prep.data)


# ----------------------------------------------------------------------------- not images


def test_zero_byte_file():
    assert rejected(b"") == "empty file (0 bytes)"


def test_text_file_named_jpg(tmp_path):
    path = tmp_path / "cat.jpg"
    path.write_text("this is not a picture of a cat\n")
    assert rejected(path.read_bytes()) == "not an image (content matches no supported format)"


def test_postscript_is_never_opened():
    # Pillow would hand EPS to Ghostscript: not on untrusted files
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    assert rejected(eps) == "not an image (content matches no supported format)"


def test_png_named_jpg_is_a_png(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(encode(photo(), "PNG"))
    prep = untouched(path.read_bytes(), "png", (160, 120))
    assert prep.source_format == "PNG"


# ----------------------------------------------------------------------------- truncated / corrupt

JPEG_OPTS = [DEFAULT, ImageOptions(want_pixels=True), ImageOptions(max_side=64),
             ImageOptions(want_pixels=True, resize=32)]


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("cut", [0.5, 0.95])
@pytest.mark.parametrize("opts", JPEG_OPTS, ids=["store", "pixels", "max_side", "resize"])
def test_truncated_jpeg(cut, progressive, opts):
    data = encode(photo(), "JPEG", quality=90, progressive=progressive)
    reason = rejected(data[: int(len(data) * cut)], opts)
    assert reason == "truncated JPEG (Premature end of JPEG file)"


@pytest.mark.parametrize("cut", [0.5, 0.95])
def test_truncated_jpeg_needing_a_change(cut):
    data = with_orientation(photo(), "JPEG", 6, quality=90)
    assert rejected(data[: int(len(data) * cut)]).startswith("truncated JPEG")
    cmyk = encode(photo().convert("CMYK"), "JPEG", quality=90)
    assert rejected(cmyk[: int(len(cmyk) * cut)]).startswith("truncated JPEG")


def test_jpeg_missing_only_its_end_marker():
    data = encode(photo(), "JPEG", quality=90)
    assert data.endswith(b"\xff\xd9")
    assert rejected(data[:-2]).startswith("truncated JPEG")


@pytest.mark.parametrize("cut", [0.5, 0.95])
def test_truncated_png(cut):
    data = encode(photo(), "PNG")
    assert rejected(data[: int(len(data) * cut)]).startswith("truncated PNG (file ends inside")


def test_png_missing_iend():
    data = encode(photo(), "PNG")
    assert rejected(data[:-12]) == "truncated PNG (file ends before the IEND chunk)"


def test_truncated_other_format_even_if_someone_set_load_truncated(monkeypatch):
    bmp = encode(photo(), "BMP")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # a careless library elsewhere
    assert rejected(bmp[: len(bmp) // 2]).startswith("truncated BMP")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # restored


@pytest.mark.parametrize("offset", [3])  # offset 2 (APP0's FF flipped) is repaired: test_repair.py
def test_jpeg_header_bytes_flipped(offset):
    data = bytearray(encode(photo(), "JPEG"))
    data[offset] ^= 0xFF
    assert rejected(bytes(data)) == "corrupt JPEG header (unreadable)"


def test_jpeg_magic_then_garbage():
    garbage = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    assert rejected(b"\xff\xd8\xff\xe0" + garbage).startswith("corrupt JPEG header (")


def test_jpeg_garbage_in_entropy_data_is_rejected():
    # lenient decoders show a partly garbled picture; libjpeg-turbo reports corrupt data: reject
    data = bytearray(encode(photo(), "JPEG", quality=90))
    mid = len(data) // 2
    data[mid : mid + 64] = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    assert rejected(bytes(data)).startswith("corrupt JPEG data (Corrupt JPEG data:")
    # validate=False trusts the bytes: stored as they are, nothing decoded
    untouched(bytes(data), "jpg", (160, 120), ImageOptions(validate=False))


def test_png_header_crc_flipped():
    data = bytearray(encode(photo(), "PNG"))
    data[29] ^= 0xFF  # IHDR CRC
    assert rejected(bytes(data)) == "corrupt PNG header (unreadable)"


def test_png_bit_flip_in_pixel_data():
    data = bytearray(encode(photo(), "PNG"))
    data[len(data) // 2] ^= 0x01
    assert rejected(bytes(data)).startswith("corrupt PNG (CRC mismatch in 'IDAT' chunk")


def test_jpeg_trailing_bytes_after_end_marker_are_kept():
    data = encode(photo(), "JPEG") + b"trailing junk from some camera"
    untouched(data, "jpg", (160, 120))


# ----------------------------------------------------------------------------- decompression bombs


def test_bomb_by_header_is_rejected_before_decoding():
    # 100000 x 100000 claimed by a 60-byte PNG: Pillow's own limit fires at open
    bomb = raw_png(100_000, 100_000, 8, 2, b"\x00" * 10)
    assert rejected(bomb).startswith("decompression bomb (")


def test_bomb_over_max_pixels_is_rejected_from_the_header():
    # 10000 x 10000 = 1e8 pixels: over Pillow's warning threshold, under its error; our limit decides.
    # The IDAT is far too short: had it been decoded, the reason would say so.
    big = raw_png(10_000, 10_000, 8, 2, b"\x00" * 10)
    assert rejected(big, ImageOptions(max_pixels=50_000_000)) == (
        "decompression bomb (10000x10000 = 100,000,000 pixels > max_pixels 50,000,000)")
    small = encode(photo((100, 80)), "PNG")
    assert "max_pixels 5,000" in rejected(small, ImageOptions(max_pixels=5_000))


def test_pillow_bomb_warning_does_not_leak(monkeypatch):
    small, big = encode(photo((40, 40)), "PNG"), encode(photo((50, 50)), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # warn over 1000 pixels, error over 2000
    untouched(small, "png", (40, 40))  # pytest turns a leaked warning into an error
    assert rejected(big).startswith("decompression bomb (Image size (2500 pixels) exceeds limit")


# ----------------------------------------------------------------------------- odd but good


def test_grayscale_jpeg_and_png_stored_untouched():
    gray = photo().convert("L")
    untouched(encode(gray, "JPEG"), "jpg", (160, 120))
    untouched(encode(gray, "PNG"), "png", (160, 120))


def test_rgb_jpeg_and_png_stored_untouched():
    untouched(encode(photo(), "JPEG", progressive=True), "jpg", (160, 120))
    untouched(encode(photo(), "PNG"), "png", (160, 120))


CMYK_PATCHES = {  # CMYK ink -> RGB a viewer shows (naive conversion, as Pillow)
    (0, 0, 0, 0): (255, 255, 255),
    (255, 0, 0, 0): (0, 255, 255),
    (0, 255, 0, 0): (255, 0, 255),
    (0, 0, 255, 0): (255, 255, 0),
    (0, 0, 0, 255): (0, 0, 0),
}


def cmyk_patches() -> np.ndarray:
    return np.concatenate([np.full((16, 16, 4), ink, np.uint8) for ink in CMYK_PATCHES], axis=1)


def check_patches(rgb: np.ndarray) -> None:
    for i, want in enumerate(CMYK_PATCHES.values()):
        got = rgb[4:12, 16 * i + 4 : 16 * i + 12].reshape(-1, 3).mean(axis=0)
        assert np.abs(got - want).max() < 8, (want, got)


def test_cmyk_jpeg_becomes_rgb():
    data = encode(Image.frombytes("CMYK", (80, 16), cmyk_patches().tobytes()), "JPEG", quality=95)
    with Image.open(io.BytesIO(data)) as im:
        assert (im.mode, im.info.get("adobe_transform")) == ("CMYK", 0)  # plain CMYK, Adobe-inverted
    rgb = converted(data, "jpg", (80, 16), "cmyk->rgb")
    check_patches(rgb)
    pixels = prepare_image(data, ImageOptions(want_pixels=True)).pixels
    assert np.abs(pixels.astype(int) - decode(data)).max() <= 1  # exactly what Pillow itself shows


def test_ycck_jpeg_becomes_rgb():
    # libjpeg-turbo stores CMYK input as YCCK; Photoshop-style files hold inverted ink values
    data = simplejpeg.encode_jpeg(255 - cmyk_patches(), quality=95, colorspace="CMYK", colorsubsampling="444")
    with Image.open(io.BytesIO(data)) as im:
        assert (im.mode, im.info.get("adobe_transform")) == ("CMYK", 2)
    check_patches(converted(data, "jpg", (80, 16), "cmyk->rgb"))
    pixels = prepare_image(data, ImageOptions(want_pixels=True)).pixels
    assert np.abs(pixels.astype(int) - decode(data)).max() <= 1


def test_sixteen_bit_gray_png_is_scaled_not_clipped():
    values = np.array([[0, 256, 32768, 65535]], np.uint16).repeat(4, axis=0)
    data = encode(Image.fromarray(values), "PNG")
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "I;16"
    rgb = converted(data, "png", (4, 4), "16-bit->8-bit")
    assert rgb[0, :, 0].tolist() == [0, 1, 128, 255]  # >> 8: mid-gray stays mid-gray, not white
    assert (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 0] == rgb[..., 2]).all()


def test_sixteen_bit_rgb_png_becomes_8_bit():
    row = struct.pack(">6H", 0x1234, 0x8000, 0xFFFF, 0x00FF, 0x0100, 0x7FFF)  # two pixels
    data = raw_png(2, 1, 16, 2, b"\x00" + row)
    rgb = converted(data, "png", (2, 1), "16-bit->8-bit")
    assert rgb[0].tolist() == [[0x12, 0x80, 0xFF], [0x00, 0x01, 0x7F]]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_to_the_pixels(orientation):
    im = blocks(48, 32)
    data = with_orientation(im, "PNG", orientation)  # PNG: exact pixel comparison
    with Image.open(io.BytesIO(data)) as src:
        want = np.asarray(ImageOps.exif_transpose(src).convert("RGB")).astype(int)
    if orientation == 1:
        untouched(data, "png", (48, 32))
        return
    size = (32, 48) if orientation >= 5 else (48, 32)
    rgb = converted(data, "png", size, f"exif-rotate (orientation {orientation})")
    assert np.array_equal(rgb, want)


def test_exif_rotated_jpeg():
    data = with_orientation(blocks(48, 32), "JPEG", 6, quality=95)
    rgb = converted(data, "jpg", (32, 48), "exif-rotate (orientation 6)")
    # orientation 6: turn 90 degrees clockwise; the red top-left quadrant ends up top-right
    assert np.abs(rgb[4:20, 20:28].mean(axis=(0, 1)) - (255, 0, 0)).max() < 10
    assert np.abs(rgb[4:20, 4:12].mean(axis=(0, 1)) - (0, 0, 255)).max() < 10
    gray = with_orientation(blocks(48, 32).convert("L"), "JPEG", 8)
    converted(gray, "jpg", (32, 48), "exif-rotate (orientation 8)")


def test_palette_png_with_transparency():
    im = Image.new("P", (4, 2))
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    im.putpixel((0, 0), 1)
    rgb = converted(encode(im, "PNG", transparency=0), "png", (4, 2), "palette->rgb, alpha on white")
    assert rgb[0, 0].tolist() == [0, 0, 255]  # opaque palette entry
    assert rgb[1, 3].tolist() == [255, 255, 255]  # transparent entry: white, not red


def test_palette_png_without_transparency():
    im = Image.new("P", (4, 2))
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    rgb = converted(encode(im, "PNG"), "png", (4, 2), "palette->rgb")
    assert rgb[1, 3].tolist() == [255, 0, 0]


def test_rgba_png_alpha_on_white():
    a = np.array([[[0, 0, 0, 0], [255, 0, 0, 255], [255, 0, 0, 128], [10, 20, 30, 0]]], np.uint8)
    rgb = converted(encode(Image.fromarray(a), "PNG"), "png", (4, 1), "rgba->rgb, alpha on white")
    assert rgb[0].tolist() == [[255, 255, 255], [255, 0, 0], [255, 127, 127], [255, 255, 255]]


def test_rgb_png_with_colour_key_transparency():
    a = np.array([[[7, 7, 7], [1, 2, 3]]], np.uint8)
    data = encode(Image.fromarray(a), "PNG", transparency=(7, 7, 7))
    rgb = converted(data, "png", (2, 1), "alpha on white")
    assert rgb[0].tolist() == [[255, 255, 255], [1, 2, 3]]


def test_la_png():
    a = np.array([[[100, 0], [100, 255]]], np.uint8)
    rgb = converted(encode(Image.fromarray(a), "PNG"), "png", (2, 1), "la->rgb, alpha on white")
    assert rgb[0].tolist() == [[255, 255, 255], [100, 100, 100]]


def test_one_bit_png():
    im = Image.new("1", (8, 2), 0)
    im.putpixel((3, 1), 1)
    rgb = converted(encode(im, "PNG"), "png", (8, 2), "1-bit->rgb")
    assert rgb[1, 3].tolist() == [255, 255, 255] and rgb[0, 0].tolist() == [0, 0, 0]


def test_multi_frame_gif_keeps_the_first_frame():
    frames = [Image.new("RGB", (8, 6), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    rgb = converted(data, "png", (8, 6), "gif->png, first of 3 frames")
    assert (rgb == (255, 0, 0)).all()


def test_animated_png_keeps_the_first_frame():
    frames = [Image.new("RGB", (8, 6), c) for c in ((0, 255, 0), (0, 0, 255))]
    data = encode(frames[0], "PNG", save_all=True, append_images=frames[1:])
    assert (converted(data, "png", (8, 6), "first of 2 frames") == (0, 255, 0)).all()


def test_mpo_is_a_jpeg_stored_as_is():
    data = encode(photo(), "MPO", save_all=True, append_images=[photo()])
    assert untouched(data, "jpg", (160, 120)).source_format == "MPO"


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF"])
def test_other_formats_become_lossless_png(fmt):
    kw = {"lossless": True} if fmt == "WEBP" else {}
    data = encode(photo(), fmt, **kw)
    rgb = converted(data, "png", (160, 120), f"{fmt.lower()}->png")
    assert np.array_equal(rgb, np.asarray(photo()))  # bit-exact: no loss added


# ----------------------------------------------------------------------------- options


def test_validate_false_reads_only_the_header():
    data = encode(photo(), "JPEG")
    cut = data[: len(data) // 2]
    untouched(cut, "jpg", (160, 120), ImageOptions(validate=False))  # trusted, not decoded
    assert rejected(b"hello", ImageOptions(validate=False)).startswith("not an image")
    # a file that must change is still decoded (and checked) once
    cmyk = encode(photo().convert("CMYK"), "JPEG")
    converted(cmyk, "jpg", (160, 120), "cmyk->rgb", ImageOptions(validate=False))


def test_max_side_downscales_jpeg_and_png():
    data = (REAL / "animals" / "domestic_dog.jpg").read_bytes()  # 2048 x 1536
    converted(data, "jpg", (512, 384), "downscaled 2048x1536->512x384", ImageOptions(max_side=512))
    with Image.open(io.BytesIO(data)) as im:
        ref = np.asarray(im.convert("RGB").resize((512, 384), Image.BICUBIC)).astype(int)
    pixels = prepare_image(data, ImageOptions(max_side=512, want_pixels=True)).pixels
    assert pixels.shape == (384, 512, 3)
    assert np.abs(pixels - ref).mean() < 1.5  # 1/2-scale DCT decode + resize ~ full decode + resize
    png = encode(photo(), "PNG")
    converted(png, "png", (80, 60), "downscaled", ImageOptions(max_side=80))
    untouched(png, "png", (160, 120), ImageOptions(max_side=160))  # already small enough


def test_max_side_with_exif_rotation():
    data = with_orientation(photo(), "JPEG", 6)
    converted(data, "jpg", (45, 60), "exif-rotate (orientation 6), downscaled 120x160->45x60",
              ImageOptions(max_side=60))


def test_want_pixels():
    data = encode(photo(), "JPEG", quality=90)
    prep = prepare_image(data, ImageOptions(want_pixels=True))
    assert (prep.data, prep.ext, prep.height, prep.width) == (b"", "rgb", 120, 160)
    assert prep.pixels.dtype == np.uint8 and prep.pixels.shape == (120, 160, 3)
    assert np.abs(prep.pixels.astype(int) - decode(data)).max() <= 1
    prep = prepare_image(data, ImageOptions(want_pixels=True, resize=32))
    assert prep.pixels.shape == (32, 32, 3) and (prep.height, prep.width) == (32, 32)
    gray = prepare_image(encode(photo().convert("L"), "PNG"), ImageOptions(want_pixels=True))
    assert gray.pixels.shape == (120, 160, 3) and (gray.pixels[..., 0] == gray.pixels[..., 2]).all()
    rgba = prepare_image(encode(Image.new("RGBA", (5, 4)), "PNG"), ImageOptions(want_pixels=True))
    assert (rgba.pixels == 255).all() and rgba.note == "rgba->rgb, alpha on white"


# ----------------------------------------------------------------------------- real photos


def real_images() -> list[Path]:
    return sorted(p for p in REAL.rglob("*") if p.suffix in (".jpg", ".png"))


@pytest.mark.parametrize("path", real_images(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_photos(path):
    data = path.read_bytes()
    with Image.open(path) as im:
        mode, size = im.mode, im.size
    prep = prepare_image(data, DEFAULT)
    if mode == "RGBA":  # graphics/horse.png, graphics/logo.png
        assert (prep.ext, prep.changed, prep.note) == ("png", True, "rgba->rgb, alpha on white")
        assert (prep.width, prep.height) == size
    else:  # JPEG RGB, PNG RGB and PNG L: byte for byte
        assert mode in ("RGB", "L")
        untouched(data, path.suffix[1:], size)


def test_real_photos_cover_the_modes_we_claim():
    modes = {}
    for p in real_images():
        with Image.open(p) as im:
            modes.setdefault((im.format, im.mode), []).append(p.name)
    assert {k: len(v) for k, v in modes.items()} == {
        ("JPEG", "RGB"): 16, ("PNG", "L"): 9, ("PNG", "RGB"): 4, ("PNG", "RGBA"): 2}


# ----------------------------------------------------------------------------- benchmark


@pytest.mark.slow  # subprocess
def test_benchmark_script_runs_quick():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_validate.py"), "--quick"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "validate=True" in out and "naive full decode" in out and "images/s" in out
