"""Issue 33, items 2 and 13 (decode): a valid 4:4:1 JPEG reads, and a scaled Pillow decode of an image
smaller than the scale works.

cjpeg (Debian's libjpeg-turbo-progs, installed by .ci/run) writes the 4:4:1 file: Pillow cannot choose
that sampling. simplejpeg's header reader has no name for it (``KeyError: 6``): the header comes from
Pillow then, and the pixels from the full decode.
"""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from packer import PackOptions, pack
from readers import open_dataset
from readers.decode.decoders import decode_rgb_scaled, read_header


def _jpeg_441(tmp_path) -> bytes:
    if shutil.which("cjpeg") is None:
        pytest.skip("cjpeg not found: apt-get install libjpeg-turbo-progs")
    rng = np.random.default_rng(0)
    ppm = tmp_path / "a.ppm"
    Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(ppm)
    return subprocess.run(["cjpeg", "-sample", "1x4,1x1,1x1", str(ppm)], capture_output=True, check=True).stdout


def test_a_441_jpeg_header_is_read(tmp_path):
    data = _jpeg_441(tmp_path)
    header = read_header(data)
    assert (header.height, header.width, header.is_jpeg) == (96, 128, True)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_packed_441_jpeg_reads_as_its_full_decode(tmp_path, workers):
    data = _jpeg_441(tmp_path)
    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        (tmp_path / "src" / cls / "x.jpg").write_bytes(data)
    pack(tmp_path / "src", tmp_path / "out", PackOptions(format="lmdb", workers=1))
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    ds = open_dataset(tmp_path / "out")
    got = [np.asarray(ds[i][0]) for i in range(len(ds))]
    assert all(g.shape == (96, 128, 3) or g.shape == (3, 96, 128) for g in got)
    for g in got:
        hwc = g if g.shape[-1] == 3 else g.transpose(1, 2, 0)
        assert np.array_equal(hwc, expected)
    if workers:
        from readers import make_loader

        loader = make_loader(ds, batch_size=2, num_workers=workers, workers="processes", shuffle=False)
        (images, labels), = list(loader)
        assert sorted(labels.tolist()) == [0, 1]


@pytest.mark.parametrize("size", [(5, 40), (100, 7), (3, 3)])
@pytest.mark.parametrize("scale", [2, 8])
def test_a_pillow_scaled_decode_of_an_image_smaller_than_the_scale(size, scale):
    h, w = size
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG")
    got = decode_rgb_scaled(buf.getvalue(), scale, decoder="pillow")
    assert got.shape == (-(-h // scale), -(-w // scale), 3)
