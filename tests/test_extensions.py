"""Every extension torchvision's ImageFolder takes (plus .mpo), built from the bundled real photos:
the packer finds the same samples with the same labels as the ImageFolder rules (conftest's
independent re-implementation) and stores each as docs/bad-input.md says (JPEG/MPO as is, the
others as lossless PNG with exactly the pixels Pillow decodes)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REAL_IMAGES
from reference import TORCHVISION_IMG_EXTENSIONS, expected_rgb, imagefolder_reference
from packer import PackOptions, pack
from packer.sources.source import IMAGE_EXTENSIONS, scan
from readers.contract import spec

PHOTOS = {  # class -> a bundled photo (small ones: the test writes each in every format)
    "cat": REAL_IMAGES / "animals" / "chelsea.png",  # RGB PNG
    "person": REAL_IMAGES / "people" / "grace_hopper.jpg",  # RGB JPEG
    "gray": REAL_IMAGES / "science" / "microaneurysms.png",  # 8-bit grayscale
    "horse": REAL_IMAGES / "graphics" / "horse.png",  # RGBA
}


def _write(im: Image.Image, path: Path) -> None:
    """``im`` saved at ``path`` in the format its extension names (any letter case)."""
    ext = path.suffix.lower()
    if ext in (".jpg", ".jpeg"):
        im.convert("RGB").save(path, "JPEG", quality=92)
    elif ext == ".mpo":  # two pictures, as a stereo camera writes them
        rgb = im.convert("RGB")
        rgb.save(path, "MPO", save_all=True, append_images=[rgb.transpose(Image.Transpose.FLIP_LEFT_RIGHT)])
    elif ext in (".ppm", ".pgm"):
        (im.convert("L") if ext == ".pgm" else im.convert("RGB")).save(path, "PPM")
    elif ext == ".bmp":
        (im if im.mode in ("RGB", "L") else im.convert("RGB")).save(path, "BMP")
    elif ext in (".tif", ".tiff"):
        im.save(path, "TIFF", compression="tiff_lzw")
    elif ext == ".webp":
        im.save(path, "WEBP", lossless=path.stem.endswith("lossless"), quality=80)
    else:
        im.save(path, "PNG")


def _names(ext: str) -> list[str]:
    """File names for one extension: lower case, upper case, and for webp both lossy and lossless."""
    names = [f"a{ext}", f"B{ext.upper()}"]
    if ext == ".webp":
        names.append(f"c_lossless{ext}")
    return names


@pytest.fixture(scope="module")
def every_extension(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ext") / "src"
    for cls, photo in PHOTOS.items():
        with Image.open(photo) as im:
            im.load()
            for ext in IMAGE_EXTENSIONS:
                for name in _names(ext):
                    (root / cls).mkdir(parents=True, exist_ok=True)
                    _write(im, root / cls / name)
            nested = root / cls / "nested"
            nested.mkdir()
            _write(im, nested / "deep.Tif")
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / "anim.gif").write_bytes(b"GIF89a")  # torchvision takes no .gif: ignored
    _write(Image.open(PHOTOS["cat"]), root / "cat" / ".hidden.webp")  # hidden: skipped, like the others
    return root


def test_the_extension_list_is_torchvisions_plus_mpo():
    assert IMAGE_EXTENSIONS == TORCHVISION_IMG_EXTENSIONS + (".mpo",)


def test_scan_matches_the_imagefolder_rules(every_extension):
    classes, samples = imagefolder_reference(every_extension)
    src = scan(every_extension)
    assert src.classes == classes == sorted(PHOTOS)
    assert list(zip(src.paths, src.labels)) == samples
    per_class = 2 * len(IMAGE_EXTENSIONS) + 1 + 1  # two names each, one more webp, nested/deep.Tif
    assert len(samples) == len(PHOTOS) * per_class
    assert sorted(src.ignored) == ["cat/.hidden.webp", "cat/anim.gif", "cat/notes.txt"]


@pytest.fixture(scope="module")
def packed(every_extension, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ext-packed") / "wds"
    [result] = pack(every_extension, out, PackOptions(format="wds", workers=2, order="source"))
    assert result.rejected == 0
    return out


def test_every_file_is_stored_as_documented(every_extension, packed, stored_bytes):
    index = spec.read_index(packed)
    names = list(index.names())
    assert len(names) == index.num_samples == len(imagefolder_reference(every_extension)[1])
    for i, name in enumerate(names):
        source = (every_extension / name).read_bytes()
        data = stored_bytes(packed, i)
        ext = Path(name).suffix.lower()
        if ext in (".jpg", ".jpeg", ".mpo"):
            assert data == source, name  # JPEG and MPO: the file itself
            continue
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name  # everything else: a PNG ...
        with Image.open(io.BytesIO(data)) as stored:
            got = np.asarray(stored.convert("RGB"))
        assert np.array_equal(got, expected_rgb(source)), name  # ... with exactly Pillow's pixels


def test_stored_encodings_and_counts(every_extension, packed):
    meta = json.loads((packed / spec.INDEX_NAME).read_text())
    jpeg_like = sum(1 for p in scan(every_extension).paths if Path(p).suffix.lower() in (".jpg", ".jpeg", ".mpo"))
    assert meta["storage"]["encodings"] == {"jpg": jpeg_like, "png": meta["num_samples"] - jpeg_like}
    _classes, samples = imagefolder_reference(every_extension)
    assert meta["class_counts"] == [sum(1 for _, lab in samples if lab == c) for c in range(len(PHOTOS))]
    assert np.load(packed / "labels.npy").tolist() == [lab for _, lab in samples]


@pytest.mark.slow  # subprocess
def test_the_issue_example_packs_four_images(tmp_path):
    """A folder with w.jpg x.webp y.bmp z.tif: torchvision finds 4 samples, so does pack-dataset."""
    with Image.open(PHOTOS["person"]) as im:
        im.load()
        for name in ("w.jpg", "x.webp", "y.bmp", "z.tif"):
            (tmp_path / "src" / "people").mkdir(parents=True, exist_ok=True)
            _write(im, tmp_path / "src" / "people" / name)
    r = subprocess.run([sys.executable, "-m", "packer.cli", tmp_path / "src", "-f", "lmdb", "-o", tmp_path / "out",
                        "-q"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ": 4 samples, 1 class," in r.stdout and "0 non-image files ignored" in r.stdout
    assert "3 re-encoded" in r.stdout  # webp, bmp, tiff -> png
