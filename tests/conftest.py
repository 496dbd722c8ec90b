"""Shared fixtures: the bundled real photos, a generated ImageNet-like folder, packed datasets."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import PackOptions, pack
from readers.spec import FORMATS

REPO = Path(__file__).resolve().parent.parent
REAL_IMAGES = REPO / "examples" / "real-images"


def make_image_folder(root: Path, classes: int = 3, per_class: int = 5, size=(96, 80), seed: int = 0,
                      png_every: int = 4) -> Path:
    """An ImageFolder tree of small random-content JPEGs (and some PNGs), deterministic."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = size[0] + int(rng.integers(0, 24)), size[1] + int(rng.integers(0, 24))
            base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
            if png_every and i % png_every == png_every - 1:
                img.save(d / f"img_{i:03d}.png", "PNG")
            else:
                img.save(d / f"img_{i:03d}.JPEG", "JPEG", quality=85)
    (root / "class_00" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="session")
def real_images() -> Path:
    return REAL_IMAGES


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("gen") / "train", classes=4, per_class=7)


def _pack(src: Path, out: Path, fmt: str, **kw) -> Path:
    opts = PackOptions(format=fmt, workers=kw.pop("workers", 1), **kw)
    pack(src, out, opts)
    return out


@pytest.fixture(scope="session")
def packed_generated(tmp_path_factory, generated):
    """format -> dataset folder of the generated folder (wds with uneven small shards)."""
    root = tmp_path_factory.mktemp("packed-gen")
    out = {}
    for fmt in FORMATS:
        kw = {"shard_count": 5} if fmt == "wds" else {}
        out[fmt] = _pack(generated, root / fmt, fmt, **kw)
    return out


@pytest.fixture(scope="session")
def packed_real(tmp_path_factory, real_images):
    """format -> dataset folder of the bundled real photos."""
    root = tmp_path_factory.mktemp("packed-real")
    out = {}
    for fmt in FORMATS:
        kw = {"shard_count": 7} if fmt == "wds" else {}
        out[fmt] = _pack(real_images, root / fmt, fmt, workers=2, **kw)
    return out


def pil_rgb(path_or_bytes) -> np.ndarray:
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else path_or_bytes
    with Image.open(src) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture(autouse=True)
def thread_police():
    """Fail a test that leaves non-daemon threads running."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    assert not leaked, f"test left threads running: {leaked}"


# ---------------------------------------------------------------- reference rules (appended)
# Independent re-implementations used by test_pack_formats.py / test_source.py:
# they must not import anything from packer.*.

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def imagefolder_reference(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision.datasets.ImageFolder's (classes, samples), re-implemented (torchvision is not installed).

    torchvision: ``classes = sorted(d.name for d in os.scandir(root) if d.is_dir())``; per class,
    ``for dirpath, _, fnames in sorted(os.walk(cls_dir, followlinks=True)): for f in sorted(fnames)``,
    kept when ``f.lower().endswith(extensions)``. The packer's documented deviations are applied
    here too: only .jpg/.jpeg/.png, and hidden (dot) class folders and files are skipped.
    Samples are ``(path relative to root as posix, label)``.
    """
    import os

    root = Path(root)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    samples: list[tuple[str, int]] = []
    for label, cls in enumerate(classes):
        for dirpath, _dirs, fnames in sorted(os.walk(root / cls, followlinks=True)):
            for f in sorted(fnames):
                if f.lower().endswith(IMAGE_SUFFIXES) and not f.startswith("."):
                    samples.append(((Path(dirpath) / f).relative_to(root).as_posix(), label))
    return classes, samples


def expected_rgb(path_or_bytes) -> np.ndarray:
    """The RGB pixels packer/images.py documents for a source image, computed with PIL + numpy:
    EXIF orientation applied, alpha composited onto white, everything else ``convert("RGB")``."""
    from PIL import ImageOps

    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else path_or_bytes
    with Image.open(src) as im:
        im = ImageOps.exif_transpose(im)
        if "A" in im.mode or "transparency" in im.info:
            rgba = np.asarray(im.convert("RGBA")).astype(np.float64)
            alpha = rgba[..., 3:] / 255.0
            return np.rint(rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
        return np.asarray(im.convert("RGB"))


def needs_change(path: Path) -> bool:
    """True when a JPEG/PNG source cannot be stored byte for byte (not plain 8-bit RGB/L, alpha, EXIF rotation)."""
    with Image.open(path) as im:
        orientation = im.getexif().get(0x0112, 1) if im.format == "JPEG" else 1
        return im.mode not in ("RGB", "L") or "transparency" in im.info or orientation not in (1, None)
