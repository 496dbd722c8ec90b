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
