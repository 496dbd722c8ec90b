"""Generate an ImageNet-like folder for benchmarks and notebooks.

JPEGs of about 480x400 pixels and ~100 KB at quality 90, like ImageNet's
training images, cut from the bundled real photos (random crop, scale,
flip and mild noise, so they are neither identical nor trivially
compressible), in ``root/<class>/<image>.JPEG`` layout.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["BUNDLED_PHOTOS", "make_imagenet_like"]

BUNDLED_PHOTOS = Path(__file__).resolve().parent.parent / "examples" / "real-images"


def _photos(source: Path) -> list[Image.Image]:
    photos = []
    for p in sorted(source.rglob("*")):
        if p.suffix.lower() in (".jpg", ".jpeg", ".png"):
            with Image.open(p) as im:
                im = im.convert("RGB")
                im.thumbnail((1600, 1600))
                if min(im.size) >= 300:
                    photos.append(im)
    if not photos:
        raise FileNotFoundError(f"{source}: no photos to cut images from")
    return photos


def make_imagenet_like(root: str | os.PathLike, n: int = 1000, classes: int = 10, seed: int = 0,
                       size: tuple[int, int] = (480, 400), quality: int = 90,
                       source: str | os.PathLike = BUNDLED_PHOTOS) -> Path:
    """Write ``n`` JPEGs in ``classes`` class folders under ``root``; return ``root``.

    Deterministic for a given seed. Existing files of the same name are kept,
    so a second call with the same arguments is cheap.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    photos = _photos(Path(source))
    w, h = size
    for i in range(n):
        cls_dir = root / f"n{i % classes:08d}"
        path = cls_dir / f"img_{i:07d}.JPEG"
        photo = photos[int(rng.integers(len(photos)))]
        scale = float(rng.uniform(0.5, 1.0))
        cw, ch = int(photo.width * scale), int(photo.height * scale)
        x, y = int(rng.integers(0, photo.width - cw + 1)), int(rng.integers(0, photo.height - ch + 1))
        jitter_w, jitter_h = int(rng.integers(-40, 41)), int(rng.integers(-40, 41))
        noise = rng.normal(0, 16, size=(h + jitter_h, w + jitter_w, 3))
        if path.exists():
            continue
        img = photo.crop((x, y, x + cw, y + ch)).resize((w + jitter_w, h + jitter_h), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        arr = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
        cls_dir.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=quality)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    return root
