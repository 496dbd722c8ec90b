"""CPU and memory bombs among source images, and crafted samples in a dataset (issue 23 items 5, 6, 10).

* A progressive JPEG with 883 scans (1 DC + 63 bands x 14 successive-approximation
  refinements, every one of them valid) makes libjpeg pass over every block 883 times:
  ~30 ns per block per scan here, over a minute for a 13000 x 13000 image in ~0.5 MB.
  The packer rejects it and the readers refuse it, from the markers, before decoding.
* The readers decode only JPEG and PNG: EPS bytes in a dataset never reach Ghostscript
  (a fake ``gs`` on PATH proves it never runs).
* A float TIFF decodes to 4 bytes per pixel and converting it used ~30 more; a sparse
  4 GB ``.jpg`` was read whole. Under a real address-space limit (``RLIMIT_AS``) both
  aborted the pack with a MemoryError traceback; now they are one-line rejects.

The generators below write the files byte by byte (Pillow cannot write a scan script).
"""

from __future__ import annotations

import io
import json
import os
import resource
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import EpsImagePlugin, Image

from packer.prepare import images
from packer.prepare.images import ImageOptions, RejectedImage, prepare_image
from readers.decode.decoders import (
    MAX_JPEG_SCANS,
    DecodeError,
    available_decoders,
    decode_rgb,
    decode_rgb_reduced,
    jpeg_scans,
    read_header,
    too_many_scans,
)

DECODERS = ["auto", "pillow"] + (["simplejpeg"] if "simplejpeg" in available_decoders() else [])


# ---------------------------------------------------------------------------- generators
def _segment(marker: int, payload: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload


class _Bits:
    """MSB-first bit writer with JPEG byte stuffing (FF -> FF 00); pads the last byte with 1s."""

    def __init__(self) -> None:
        self.out, self.acc, self.n = bytearray(), 0, 0

    def put(self, value: int, length: int) -> None:
        for i in range(length - 1, -1, -1):
            self.acc, self.n = (self.acc << 1) | ((value >> i) & 1), self.n + 1
            if self.n == 8:
                self.out += b"\xff\x00" if self.acc == 0xFF else bytes([self.acc])
                self.acc, self.n = 0, 0

    def done(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)
        return bytes(self.out)


def scan_bomb(width: int, height: int, refinements: int = 13) -> bytes:
    """A valid grayscale progressive JPEG (flat grey 128) with 1 DC scan and 63 x (refinements + 1)
    AC scans: every coefficient band alone, first at Al=refinements, then refined one bit at a
    time. All AC coefficients are zero, so each AC scan is a few end-of-band runs of 32767 blocks:
    a few bytes that make the decoder visit every block. 883 scans with the default."""
    blocks = -(-width // 8) * -(-height // 8)
    out = [b"\xff\xd8", _segment(0xDB, b"\x00" + b"\x01" * 64),
           _segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"),
           # DC table 0: one symbol (difference category 0), code "0"; AC table 0: EOB0..EOB14, 4-bit codes
           _segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00"),
           _segment(0xC4, b"\x10" + bytes([0, 0, 0, 15] + [0] * 12) + bytes(n << 4 for n in range(15)))]

    def sos(ss: int, se: int, ah: int, al: int) -> bytes:
        return _segment(0xDA, bytes([1, 1, 0x00, ss, se, (ah << 4) | al]))

    dc = _Bits()  # one "0" bit per block (every DC difference is 0): whole zero bytes, then the rest
    dc.out += bytes(blocks // 8)
    dc.put(0, blocks % 8)
    out += [sos(0, 0, 0, 0), dc.done()]
    runs, left = _Bits(), blocks
    while left:
        run = min(left, 32767)
        size = run.bit_length() - 1
        runs.put(size, 4)
        runs.put(run - (1 << size), size)
        left -= run
    eob = runs.done()
    for k in range(1, 64):
        out += [sos(k, k, 0, refinements), eob]
        for al in range(refinements - 1, -1, -1):
            out += [sos(k, k, al + 1, al), eob]
    return b"".join(out) + b"\xff\xd9"


def tiff(width: int, height: int, rows: int | None = None, *, bits: int = 32, samples: int = 1,
         sample_format: int = 3) -> bytes:
    """A TIFF of zeros in one deflate strip (default: float32 grayscale, SampleFormat 3); ``rows``:
    compress only that many rows (a valid header for a size never decoded, without compressing
    gigabytes)."""
    z, rows = zlib.compressobj(1), height if rows is None else rows
    row_bytes = bits // 8 * samples * width
    strip = b"".join(z.compress(bytes(row_bytes * 64)) for _ in range(rows // 64))
    strip += z.compress(bytes(row_bytes * (rows % 64))) + z.flush()
    extra = struct.pack(f"<{samples}H", *[bits] * samples) if samples > 1 else b""  # BitsPerSample values
    extra_at = 8 + len(strip)
    tags = [(256, 4, 1, width), (257, 4, 1, height),
            (258, 3, samples, extra_at if samples > 1 else bits), (259, 3, 1, 8), (262, 3, 1, 2 if samples == 3 else 1),
            (273, 4, 1, 8), (277, 3, 1, samples), (278, 4, 1, height), (279, 4, 1, len(strip)),
            (339, 3, 1, sample_format)]
    ifd = struct.pack("<H", len(tags)) + b"".join(
        struct.pack("<HHI", tag, kind, count)
        + (struct.pack("<I", v) if kind == 4 or count > 1 else struct.pack("<HH", v, 0))
        for tag, kind, count, v in tags) + b"\0\0\0\0"
    return b"II*\0" + struct.pack("<I", extra_at + len(extra)) + strip + extra + ifd


def float_tiff(width: int, height: int, rows: int | None = None) -> bytes:
    return tiff(width, height, rows)


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n0 0 moveto 10 10 lineto stroke\nshowpage\n%%EOF\n"


# ---------------------------------------------------------------------------- the scan bomb
def test_scan_bomb_is_a_valid_jpeg_that_libjpeg_decodes():
    data = scan_bomb(64, 48)
    assert jpeg_scans(data, limit=10_000) == 883
    strict = simplejpeg.decode_jpeg(data, "GRAY", strict=True)  # no libjpeg warning: a valid progression
    assert strict.shape == (48, 64, 1) and np.all(strict == 128)
    with Image.open(io.BytesIO(data)) as im:
        assert (im.format, im.mode, im.size) == ("JPEG", "L", (64, 48))
        assert np.all(np.asarray(im) == 128)


@pytest.mark.parametrize("validate", [True, False], ids=["validate", "no-validate"])
def test_packer_rejects_the_scan_bomb_before_decoding(validate):
    with pytest.raises(RejectedImage, match=rf"JPEG with more than {MAX_JPEG_SCANS} scans") as exc:
        prepare_image(scan_bomb(64, 48), ImageOptions(validate=validate))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("decoder", DECODERS)
def test_readers_refuse_the_scan_bomb_before_decoding(decoder):
    data = scan_bomb(64, 48)
    with pytest.raises(DecodeError, match=rf"JPEG with more than {MAX_JPEG_SCANS} scans"):
        decode_rgb(data, decoder=decoder)
    with pytest.raises(DecodeError, match="scans"):
        decode_rgb_reduced(data, 8, 8, decoder=decoder)


def test_scan_count_of_what_encoders_write_is_kept():
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    for kwargs, scans in (({}, 1), ({"progressive": True}, 10)):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=90, **kwargs)
        data = buf.getvalue()
        assert jpeg_scans(data) == scans and not too_many_scans(data)
        assert prepare_image(data, ImageOptions()).data == data  # stored as it is
        assert decode_rgb(data).shape == (120, 160, 3)
    # at the limit is kept, one more scan is refused (refinements=0: 1 DC + 63 scans ... )
    assert jpeg_scans(scan_bomb(16, 16, refinements=0)) == 64
    assert not too_many_scans(scan_bomb(16, 16, refinements=0))
    assert too_many_scans(scan_bomb(16, 16, refinements=1))  # 1 + 126 scans


def test_scan_count_ignores_markers_inside_segments():
    """FF DA bytes inside an APP segment (an Exif thumbnail is a whole JPEG) are not scans."""
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (9, 99, 199)).save(buf, "JPEG", progressive=True)
    data = buf.getvalue()
    junk = _segment(0xE1, b"Exif\0\0" + b"\xff\xda\x00\x08" * 300)
    crafted = data[:2] + junk + data[2:]
    assert data.count(b"\xff\xda") < crafted.count(b"\xff\xda") - 250
    assert jpeg_scans(crafted) == jpeg_scans(data) < MAX_JPEG_SCANS


# ---------------------------------------------------------------------------- readers decode JPEG and PNG only
@pytest.fixture
def fake_gs(tmp_path, monkeypatch) -> Path:
    """A ``gs`` first on PATH that records that it ran; Pillow's cached lookup is reset."""
    marker = tmp_path / "gs-ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gs = bin_dir / "gs"
    gs.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\necho 10.0\n")
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)
    return marker


@pytest.mark.parametrize("decoder", DECODERS)
def test_readers_never_start_ghostscript(fake_gs, decoder):
    for call in (lambda: decode_rgb(EPS, decoder=decoder), lambda: read_header(EPS),
                 lambda: decode_rgb_reduced(EPS, 8, 8, decoder=decoder)):
        with pytest.raises(DecodeError, match=r"not a JPEG or PNG image \(starts with b'%!PS-Ado'\)") as exc:
            call()
        assert "\n" not in str(exc.value)
    assert not fake_gs.exists(), fake_gs.read_text()


def test_readers_refuse_other_formats_the_packer_never_stores():
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "GIF")
    with pytest.raises(DecodeError, match="not a JPEG or PNG image"):
        decode_rgb(buf.getvalue())


# ---------------------------------------------------------------------------- memory
def test_decoded_bytes_are_bounded_by_mode():
    """The header's size times the mode's bytes per pixel, against 3 bytes per pixel of max_pixels."""
    opts = ImageOptions(max_pixels=10_000)
    prepare_image(float_tiff(60, 100), opts)  # 6,000 pixels x 4 bytes = 24,000 <= 30,000: kept
    with pytest.raises(RejectedImage, match=r"decompression bomb \(100x90 F = 36,000 bytes decoded > 30,000"):
        prepare_image(float_tiff(100, 90), opts)  # 9,000 pixels: under max_pixels, but 36,000 bytes
    with pytest.raises(RejectedImage, match=r"file too large \(30,001 bytes > 30,000"):
        prepare_image(b"\xff\xd8\xff" + bytes(29_998), opts)


def test_float_conversion_works_in_strips():
    """Converting a float image used ~30 bytes per pixel of numpy memory (5 GB for a 1 MB float
    TIFF); in strips it is the 8-bit result plus small work arrays."""
    w, h = 1024, 1024
    arr = np.linspace(-3.0, 7.0, w * h, dtype=np.float32).reshape(h, w)
    img = Image.fromarray(arr, "F")
    tracemalloc.start()
    try:
        out = images.to_rgb(img)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * w * h, f"{peak / (w * h):.1f} bytes per pixel"  # whole-image float64: ~30
    a = np.nan_to_num(arr.astype(np.float64))  # the whole-image formula, as the docs state it
    expected = np.rint((a - a.min()) * (255 / (a.max() - a.min()))).astype(np.uint8)
    got = np.asarray(out)
    assert got.shape == (h, w, 3) and np.array_equal(got[:, :, 0], expected) and np.array_equal(got[:, :, 2], expected)


def _pack_limited(src: Path, out: Path, limit: int) -> subprocess.CompletedProcess:
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "packer.cli", str(src), "-f", "wds", "-o", str(out),
                           "--workers", "1"], capture_output=True, text=True, timeout=300, preexec_fn=limit_memory)


@pytest.mark.slow
def test_memory_bombs_are_rejects_under_an_address_space_limit(tmp_path):
    """Packed with ``RLIMIT_AS`` = 1 GiB (the packer itself takes ~0.5 GB of address space): a float
    TIFF over the byte budget and a sparse 4 GB .jpg are rejected before any allocation, an RGB TIFF
    within the budget that Pillow cannot allocate (4 bytes per pixel: 708 MB) is rejected on its
    MemoryError, and a float TIFF within the budget is converted (its conversion took ~1.1 GB).
    Before: a MemoryError traceback ended the pack. Now: one line each in rejects.jsonl, exit 3."""
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "big_float.tif").write_bytes(float_tiff(13000, 13000, rows=64))  # 676 MB decoded
    (src / "big_rgb.tif").write_bytes(tiff(13300, 13300, rows=64, bits=8, samples=3, sample_format=1))
    (src / "ok_float.tif").write_bytes(float_tiff(6000, 6000))  # 144 MB decoded
    sparse = src / "sparse.jpg"
    with open(sparse, "wb") as f:
        f.write(scan_bomb(16, 16, refinements=0)[:-2])
        f.truncate(4 << 30)
    Image.new("RGB", (32, 32), (5, 6, 7)).save(src / "plain.jpg")
    out = tmp_path / "out"
    got = _pack_limited(src.parent, out, 1 << 30)
    assert "Traceback" not in got.stderr and "MemoryError" not in got.stderr, got.stderr[-3000:]
    assert got.returncode == 3, (got.returncode, got.stderr[-2000:])
    rejects = {r["path"]: r["reason"] for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert set(rejects) == {"a/big_float.tif", "a/big_rgb.tif", "a/sparse.jpg"}, rejects
    assert rejects["a/big_float.tif"].startswith("decompression bomb (13000x13000 F = 676,000,000 bytes decoded > ")
    assert rejects["a/big_rgb.tif"].startswith("out of memory while decoding"), rejects
    assert rejects["a/sparse.jpg"].startswith("file too large (4,294,967,296 bytes > 536,870,910"), rejects
    assert all("\n" not in r for r in rejects.values())
    from readers.contract import spec

    index = spec.read_index(out)
    assert sorted(index.names()) == ["a/ok_float.tif", "a/plain.jpg"]


# ---------------------------------------------------------------------------- the scan counter on any bytes
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 150))
def test_scan_count_of_any_bytes_is_bounded_and_never_raises(tail, limit):
    """Whatever follows an SOI (garbage, cut segments, lengths past the end): a count in 0..limit+1."""
    for data in (b"\xff\xd8" + tail, b"\xff\xd8\xff\xc2\x00\x02" + tail, tail):
        n = jpeg_scans(data, limit)
        assert 0 <= n <= limit + 1
        assert too_many_scans(data, limit) == (n > limit)


def test_scan_count_stops_at_the_limit():
    bomb = scan_bomb(16, 16)
    assert [jpeg_scans(bomb, k) for k in (0, 1, 100, 882, 883, 5000)] == [1, 2, 101, 883, 883, 883]


def test_the_header_fast_path_leaves_a_scan_bomb_to_the_full_path():
    """packer.prepare.validate_fast answers a size only for a JPEG stored as it is: not for a scan bomb."""
    from packer.prepare.validate_fast import plain_jpeg_size

    assert plain_jpeg_size(scan_bomb(64, 48)) is None
    assert plain_jpeg_size(scan_bomb(64, 48, refinements=0)) == (48, 64)  # 64 scans: kept as it is


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_a_forged_eps_sample_is_an_error_naming_it_and_gs_never_runs(packed_generated, tmp_path, fake_gs, fmt):
    """A dataset whose sample 3 holds EPS bytes (same length, so every index value still fits):
    reading it names the data file and the sample, and Pillow never starts Ghostscript."""
    import shutil

    from readers import open_dataset
    from readers.contract import spec

    root = tmp_path / fmt
    shutil.copytree(packed_generated[fmt], root)
    ds = open_dataset(root, decode=False)
    stored = ds.read(3)
    name = ds.shard_path(ds.shard_of(3)).name if fmt == "wds" else spec.DATA_FILE[fmt]
    ds.close()
    forged = (EPS + b"%" * len(stored))[:len(stored)]
    blob = bytearray((root / name).read_bytes())
    at = blob.find(stored)
    blob[at:at + len(stored)] = forged
    (root / name).write_bytes(bytes(blob))
    ds = open_dataset(root)
    try:
        with pytest.raises(spec.DatasetFormatError, match=rf"{root / name} sample 3: not a JPEG or PNG image") as exc:
            if fmt == "wds":  # a stream: samples 0-2 decode, then sample 3 stops it
                for _ in ds:
                    pass
            else:
                assert ds[2][0].shape[0] == 3
                ds[3]
    finally:
        ds.close()
    assert "\n" not in str(exc.value)
    assert not fake_gs.exists(), fake_gs.read_text()
