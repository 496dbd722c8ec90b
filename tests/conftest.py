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


def _pack_all(src: Path, root: Path, shard_count: int, workers: int = 1) -> dict[str, Path]:
    """format -> dataset folder of ``src``, packed into every format (wds with small uneven shards)."""
    return {fmt: _pack(src, root / fmt, fmt, workers=workers, **({"shard_count": shard_count} if fmt == "wds" else {}))
            for fmt in FORMATS}


@pytest.fixture(scope="session")
def packed_generated(tmp_path_factory, generated):
    """format -> dataset folder of the generated folder."""
    return _pack_all(generated, tmp_path_factory.mktemp("packed-gen"), shard_count=5)


@pytest.fixture(scope="session")
def packed_real(tmp_path_factory, real_images):
    """format -> dataset folder of the bundled real photos."""
    return _pack_all(real_images, tmp_path_factory.mktemp("packed-real"), shard_count=7, workers=2)


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

# torchvision.datasets.folder.IMG_EXTENSIONS, copied from torchvision 0.20, plus the packer's one
# documented addition, .mpo (multi-picture JPEG)
TORCHVISION_IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGE_SUFFIXES = TORCHVISION_IMG_EXTENSIONS + (".mpo",)


def imagefolder_reference(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision.datasets.ImageFolder's (classes, samples), re-implemented (torchvision is not installed).

    torchvision: ``classes = sorted(d.name for d in os.scandir(root) if d.is_dir())``; per class,
    ``for dirpath, _, fnames in sorted(os.walk(cls_dir, followlinks=True)): for f in sorted(fnames)``,
    kept when ``f.lower().endswith(extensions)``. The packer's documented deviations are applied
    here too: .mpo is taken as well, and hidden (dot) class folders and files are skipped.
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


# --------------------------------------------------------------------------- readers tests
# Appended for tests/test_readers.py, test_loader.py, test_memory.py, test_ddp.py.


def _stored_samples(root: Path) -> list[bytes]:
    """Every sample's stored bytes, read straight from the data files (never through ``readers``).

    wds: parsed with the standard ``tarfile`` module (ignores offsets.npy); hdf5: sliced with
    the ``/offsets`` dataset inside data.h5; lmdb: read in a subprocess (py-lmdb refuses to open
    an environment twice in one process, and a reader may hold it open); mmap: the raw pixel
    bytes of ``images.npy`` at offsets.npy (HWC uint8).
    """
    import json
    import subprocess
    import sys
    import tarfile

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
        code = (
            "import lmdb, pickle, sys\n"
            "env = lmdb.open(sys.argv[1], readonly=True, lock=False, subdir=True)\n"
            "with env.begin() as txn:\n"
            "    vals = [txn.get(b'%010d' % i) for i in range(int(sys.argv[2]))]\n"
            "sys.stdout.buffer.write(pickle.dumps(vals))\n"
        )
        res = subprocess.run([sys.executable, "-c", code, str(root), str(n)], capture_output=True, check=True)
        import pickle

        return pickle.loads(res.stdout)
    if fmt == "mmap":
        flat = np.load(root / "images.npy", mmap_mode="r").reshape(-1)
        offsets, heights, widths = (np.load(root / f"{k}.npy") for k in ("offsets", "heights", "widths"))
        out_list = [flat[o:o + h * w * 3].tobytes() for o, h, w in zip(offsets, heights, widths)]
        del flat
        return out_list
    raise ValueError(fmt)


@pytest.fixture(scope="session")
def stored_bytes():
    """``stored_bytes(root, i)``: the bytes stored for sample ``i`` of the dataset folder ``root``."""
    cache: dict[Path, list[bytes]] = {}

    def get(root, i: int) -> bytes:
        root = Path(root)
        if root not in cache:
            if len(cache) >= 2:  # real-photo mmap packs are ~150 MB: keep few
                cache.pop(next(iter(cache)))
            cache[root] = _stored_samples(root)
        return cache[root][i]

    return get
