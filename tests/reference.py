"""The tests' oracles: independent re-implementations of what the code promises.

Each function here computes an expected result from a published rule (torchvision's
algorithms, the normalization documented in docs/bad-input.md, the on-disk layout in
README.md) with PIL, numpy and the standard library only. Nothing here imports
``packer`` or ``readers``: an oracle that called the code under test would agree with
it whatever it did. ``tests/test_reference.py`` checks these oracles against the
documented examples.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageOps

# torchvision.datasets.folder.IMG_EXTENSIONS, as torchvision 0.20 spells it, plus the packer's one
# documented addition, .mpo (multi-picture JPEG from cameras)
TORCHVISION_IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGE_SUFFIXES = TORCHVISION_IMG_EXTENSIONS + (".mpo",)
WHITE = 255.0

# --------------------------------------------------------------------------- source folders


def imagefolder_reference(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision.datasets.ImageFolder's (classes, samples), re-implemented (torchvision is not installed).

    torchvision: ``classes = sorted(d.name for d in os.scandir(root) if d.is_dir())``; per class,
    ``for dirpath, _, fnames in sorted(os.walk(cls_dir, followlinks=True)): for f in sorted(fnames)``,
    kept when ``f.lower().endswith(extensions)``. The packer's documented deviations are applied
    here too: .mpo is taken as well, and hidden (dot) class folders and files are skipped.
    Samples are ``(path relative to root as posix, label)``.
    """
    root = Path(root)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    samples: list[tuple[str, int]] = []
    for label, cls in enumerate(classes):
        for dirpath, _dirs, fnames in sorted(os.walk(root / cls, followlinks=True)):
            for f in sorted(fnames):
                if f.lower().endswith(IMAGE_SUFFIXES) and not f.startswith("."):
                    samples.append(((Path(dirpath) / f).relative_to(root).as_posix(), label))
    return classes, samples


# --------------------------------------------------------------------------- pixels


def _open(path_or_bytes):
    return io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else path_or_bytes


def pil_rgb(path_or_bytes) -> np.ndarray:
    """Plain Pillow decode to RGB (no EXIF rotation, alpha dropped): what "decode these bytes" means."""
    with Image.open(_open(path_or_bytes)) as im:
        return np.asarray(im.convert("RGB"))


def on_white(rgba: np.ndarray) -> np.ndarray:
    """docs/bad-input.md: "composited onto white (255, 255, 255)", i.e. ``c * a + 255 * (1 - a)``
    per channel with ``a = alpha / 255``, rounded to the nearest integer."""
    rgba = np.asarray(rgba, dtype=np.float64)
    alpha = rgba[..., 3:] / 255.0
    return np.rint(rgba[..., :3] * alpha + WHITE * (1.0 - alpha)).astype(np.uint8)


def expected_rgb(path_or_bytes) -> np.ndarray:
    """The RGB pixels docs/bad-input.md documents for a source image: EXIF orientation applied,
    alpha (an alpha channel or palette/colour-key transparency) composited onto white with
    :func:`on_white`, everything else Pillow's ``convert("RGB")``.

    Pillow's own compositing rounds differently in places, so code that uses it may be 1 grey
    level off this oracle on partly transparent pixels.
    """
    with Image.open(_open(path_or_bytes)) as im:
        im = ImageOps.exif_transpose(im)
        if "A" in im.mode or "transparency" in im.info:
            return on_white(np.asarray(im.convert("RGBA")))
        return np.asarray(im.convert("RGB"))


def needs_change(path: Path) -> bool:
    """True when a JPEG/PNG source cannot be stored byte for byte (not plain 8-bit RGB/L, alpha, EXIF rotation)."""
    with Image.open(path) as im:
        orientation = im.getexif().get(0x0112, 1) if im.format == "JPEG" else 1
        return im.mode not in ("RGB", "L") or "transparency" in im.info or orientation not in (1, None)


# --------------------------------------------------------------------------- torchvision transforms


def torchvision_crop_params(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                            uniform: Callable[[float, float], float],
                            randint: Callable[[int, int], int]) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (torchvision/transforms/transforms.py), as
    ``(top, left, h, w)``, with its random draws supplied by the caller.

    torchvision draws ``torch.empty(1).uniform_(a, b)`` and ``torch.randint(lo, hi, (1,))``;
    here ``uniform(a, b)`` and ``randint(lo, hi)`` (``hi`` exclusive) stand for them, in the
    same order and with the same bounds. The rule: up to 10 tries, each drawing the area
    fraction from ``scale`` and then the log of the aspect ratio from ``log(ratio)``; a try
    whose rounded box fits draws the top row and then the left column and returns. After 10
    failed tries: the central box of the whole image, with its aspect ratio clamped to
    ``ratio`` (a side may round to 0 on tiny images; torchvision returns it as is).
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * uniform(scale[0], scale[1])
        aspect = math.exp(uniform(log_lo, log_hi))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = randint(0, height - h + 1)
            left = randint(0, width - w + 1)
            return int(top), int(left), h, w
    if width / height < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif width / height > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pil_crop_resize(full: np.ndarray, box, size=(224, 224), resample=Image.BILINEAR) -> np.ndarray:
    """torchvision's PIL path of ``RandomResizedCrop``: ``img.crop(box).resize(size)``."""
    top, left, h, w = (int(v) for v in box)
    im = Image.fromarray(full).crop((left, top, left + w, top + h))
    return np.asarray(im.resize((size[1], size[0]), resample))


def pil_resize_center_crop(full: np.ndarray, resize=256, crop=224) -> np.ndarray:
    """torchvision's PIL path: ``Resize(resize)`` (shorter side, longer side truncated) then ``CenterCrop(crop)``."""
    h, w = full.shape[:2]
    rh, rw = (int(resize * h / w), resize) if w <= h else (resize, int(resize * w / h))
    im = Image.fromarray(full).resize((rw, rh), Image.BILINEAR)
    top, left = int(round((rh - crop) / 2.0)), int(round((rw - crop) / 2.0))
    return np.asarray(im.crop((left, top, left + crop, top + crop)))


# --------------------------------------------------------------------------- stored datasets


def lmdb_items(root: Path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the LMDB environment in the folder ``root``, in key order, read with
    the lmdb binding from a private copy of data.mdb: py-lmdb refuses to open an environment that
    is already open in this process, and a reader under test may hold ``root`` open."""
    import lmdb

    with tempfile.TemporaryDirectory(prefix="lmdb-reference-") as tmp:
        shutil.copyfile(Path(root) / "data.mdb", Path(tmp) / "data.mdb")
        env = lmdb.open(tmp, readonly=True, lock=False, subdir=True)
        try:
            with env.begin() as txn:
                return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        finally:
            env.close()


def stored_samples(root: Path) -> list[bytes]:
    """Every sample's stored bytes, read straight from the data files (never through ``readers``).

    wds: parsed with the standard ``tarfile`` module (ignores offsets.npy); hdf5: sliced with
    the ``/offsets`` dataset inside data.h5; lmdb: the values under the zero-padded keys, with
    :func:`lmdb_items`; mmap: the raw pixel bytes of ``images.npy`` at offsets.npy (HWC uint8).
    """
    root = Path(root)
    meta = json.loads((root / "index.json").read_text())
    n, fmt = int(meta["num_samples"]), meta["format"]
    if fmt == "wds":
        out: dict[int, bytes] = {}
        for shard in meta["shards"]:
            with tarfile.open(root / shard["name"]) as tar:
                for m in tar.getmembers():
                    key, ext = m.name.split(".", 1)
                    if ext != "cls":
                        out[int(key)] = tar.extractfile(m).read()
        return [out[i] for i in range(n)]
    if fmt == "hdf5":
        import h5py

        with h5py.File(root / "data.h5", "r") as f:
            images, offsets = f["images"][:], f["offsets"][:]
        return [images[offsets[i]:offsets[i + 1]].tobytes() for i in range(n)]
    if fmt == "lmdb":
        values = dict(lmdb_items(root))
        return [values[b"%010d" % i] for i in range(n)]
    if fmt == "mmap":
        flat = np.load(root / "images.npy", mmap_mode="r").reshape(-1)
        offsets, heights, widths = (np.load(root / f"{k}.npy") for k in ("offsets", "heights", "widths"))
        out_list = [flat[o:o + h * w * 3].tobytes() for o, h, w in zip(offsets, heights, widths)]
        del flat
        return out_list
    raise ValueError(fmt)
