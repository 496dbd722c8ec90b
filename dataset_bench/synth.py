"""Generate an ImageNet-like folder for benchmarks, notebooks and tests.

JPEGs of about 480x400 pixels (each side varies by up to 40 px) and, at the
defaults, ~95 KB at quality 90, like ImageNet's training images. Each is a
random crop of one of the bundled real photos (``examples/real-images``),
resized, sometimes mirrored, with Gaussian noise added so that the files are
neither identical nor unrealistically compressible. Layout:
``root/n0000000<c>/img_<i>.JPEG``. The same arguments give the same bytes.

:func:`make_imagenet_like` is the generator; :func:`generate_image_folder`
is the form ``dataset-bench`` and the notebooks call (a thread per usable CPU).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from readers.contract.env import available_cpus
from readers.contract.safeio import atomic_write

__all__ = ["BUNDLED_PHOTOS", "SynthOptions", "make_imagenet_like", "generate_image_folder"]

#: The bundled photos (``examples/real-images``): ``dataset_bench/photos`` links to them in a checkout, and a
#: built wheel carries them as package data, so generating works from an installed package too.
BUNDLED_PHOTOS = Path(__file__).resolve().parent / "photos"
_PHOTOS: dict[Path, list[Image.Image]] = {}  # per source folder, loaded once per process


@dataclass(frozen=True)
class SynthOptions:
    size: tuple[int, int] = (480, 400)  # width, height before the +-jitter px jitter
    quality: int = 90
    noise: float = 16.0  # std of the Gaussian noise in grey levels (16: ~95 KB per image)
    gray_fraction: float = 0.0  # share of grayscale JPEGs (ImageNet has a few percent)
    seed: int = 0
    jitter: int = 40  # each side varies by up to this many pixels (0: every image is exactly ``size``)


def _photos(source: Path) -> list[Image.Image]:
    if source not in _PHOTOS:
        photos = _PHOTOS[source] = []
        for p in sorted(source.rglob("*")):
            if p.suffix.lower() not in (".jpg", ".jpeg", ".png"):
                continue
            with Image.open(p) as f:
                f.draft("RGB", (1600, 1200))  # big JPEGs decode at a reduced scale: fast
                im = f.convert("RGB")
                im.thumbnail((1600, 1600))
                if min(im.size) >= 256:
                    photos.append(im)
        if not photos:
            del _PHOTOS[source]
            raise FileNotFoundError(f"{source}: no photos to cut images from")
    return _PHOTOS[source]


_SMALL: dict[int, Image.Image] = {}


def _small(photo: Image.Image) -> Image.Image:
    """``photo`` with its longer side at 96 px (made once per process)."""
    key = id(photo)
    if key not in _SMALL:
        small = photo.copy()
        small.thumbnail((96, 96))
        _SMALL[key] = small
    return _SMALL[key]


def _make_one(job: tuple[Path, int, SynthOptions, Path]) -> int:
    path, index, opts, source = job
    rng = np.random.default_rng([opts.seed, index])
    photos = _photos(source)
    photo = photos[int(rng.integers(len(photos)))]
    if max(opts.size) + opts.jitter <= 64:  # thumbnails: cut from a small copy (cropping 1600 px photos dominates)
        photo = _small(photo)
    w = opts.size[0] + int(rng.integers(-opts.jitter, opts.jitter + 1))
    h = opts.size[1] + int(rng.integers(-opts.jitter, opts.jitter + 1))
    area = photo.width * photo.height * rng.uniform(0.35, 1.0)  # crop 35-100% of the photo
    aspect = (w / h) * float(np.exp(rng.uniform(-0.15, 0.15)))
    cw = int(min(photo.width, round(np.sqrt(area * aspect))))
    ch = int(min(photo.height, round(np.sqrt(area / aspect))))
    x, y = int(rng.integers(0, photo.width - cw + 1)), int(rng.integers(0, photo.height - ch + 1))
    img = photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    arr = np.asarray(img, dtype=np.float32) + rng.normal(0.0, opts.noise, size=(h, w, 3)).astype(np.float32)
    out = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if rng.random() < opts.gray_fraction:
        out = out.convert("L")
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=opts.quality)
    with atomic_write(path, durable=False) as f:  # a generated image: a crash re-makes it
        f.write(buf.getvalue())
    return len(buf.getvalue())


def make_imagenet_like(root: str | os.PathLike, n: int = 1000, classes: int = 10,
                       options: SynthOptions | None = None, *, threads: int = 1,
                       source: str | os.PathLike = BUNDLED_PHOTOS) -> Path:
    """Write ``n`` JPEGs in ``classes`` class folders under ``root``; return ``root``.

    Files that already exist are kept, so a second call with the same
    arguments costs nothing. ``threads > 1`` generates in that many threads.
    """
    root, opts, source = Path(root), options or SynthOptions(), Path(source)
    jobs = []
    for i in range(n):
        path = root / f"n{i % classes:08d}" / f"img_{i:07d}.JPEG"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            jobs.append((path, i, opts, source))
    if not jobs:
        return root
    _photos(source)  # loaded once, shared by the threads
    if threads > 1 and len(jobs) > 16:
        # Threads, not forked processes: PIL's resize and JPEG encoder and numpy's noise and casts release
        # the GIL (400 images: 3.2-3.9 s in 2 threads, 3.2-3.3 s in 2 forked processes, 6.1 s in one).
        # A process forked from one that has threads (a test runner's, a notebook's) can start holding a
        # lock no thread of it will release; such a pool worker never ends, and its pool waits for it.
        with ThreadPool(threads) as pool:
            pool.map(_make_one, jobs, chunksize=8)
    else:
        for job in jobs:
            _make_one(job)
    return root


def generate_image_folder(root: str | os.PathLike, n: int, *, classes: int = 10, seed: int = 0,
                          threads: int | None = None, progress: Callable[[int], None] | None = None) -> Path:
    """Write an ImageNet-like ImageFolder tree of ``n`` JPEGs under ``root``; return ``root``.

    :func:`make_imagenet_like` at its defaults (about 480 x 400 pixels, noise,
    quality 90: ~95 KB each, like ImageNet's training images) with at most
    ``n`` classes, in ``threads`` threads (default: one per usable CPU).
    Deterministic for a given ``seed``. ``progress(n)`` is called once at the end.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out = make_imagenet_like(root, n, classes=max(1, min(classes, n)), options=SynthOptions(seed=seed),
                             threads=threads or available_cpus())
    if progress is not None:
        progress(n)
    return out
