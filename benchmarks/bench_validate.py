"""How much does pack-time validation cost? ``prepare_image`` throughput on one core.

Generates an ImageNet-like folder in a temporary directory (class folders of
~480x400 JPEGs around 100 KB, cut from the photos in ``examples/real-images``
with mild noise added), reads every file into memory, then times, on one CPU
core, three ways of handling each file:

* ``validate=False``: ``prepare_image`` reads the header only and keeps the bytes;
* ``validate=True``: ``prepare_image`` as the packer runs it by default (an
  unchanged JPEG is checked by a 1/8-scale, luma-only libjpeg-turbo decode
  that still reads all of its compressed data);
* naive full decode: ``Image.open(...).load()``, what a simple packer does to validate.

Each is run 3 times (interleaved, ``dataset_bench.onecore``); the median is printed,
with ratios. File reading is not timed. Run from the repository root::

    python benchmarks/bench_validate.py            # 400 images
    python benchmarks/bench_validate.py --quick    # a few images, seconds
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import PIL  # noqa: E402
import simplejpeg  # noqa: E402
from PIL import Image  # noqa: E402

from dataset_bench.machine import machine_info, machine_label  # noqa: E402
from dataset_bench.onecore import per_image_rates, single_core  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from packer.prepare.images import ImageOptions, prepare_image  # noqa: E402

SIZE = (480, 400)  # width, height


def make_folder(dst: Path, n: int, seed: int = 0) -> list[Path]:
    """Write ``n`` ImageNet-like JPEGs under ``dst/<class>/`` (dataset_bench.synth) and return their paths."""
    make_imagenet_like(dst, n, 10, SynthOptions(quality=95, noise=4.0, seed=seed))
    return sorted(dst.rglob("*.JPEG"))


def naive_full_decode(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as im:
        im.load()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (12 images) to check the script works")
    parser.add_argument("--n", type=int, default=400, help="number of images (default 400)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n = 12 if args.quick else args.n

    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        datas = [p.read_bytes() for p in make_folder(Path(tmp), n)]
    validate_off, validate_on = ImageOptions(validate=False), ImageOptions(validate=True)
    for data in datas:  # all must be accepted and stored untouched, or the comparison is moot
        prep = prepare_image(data, validate_on)
        assert not prep.changed and prep.data is data, prep.note
    cases: dict[str, Callable[[bytes], Any]] = {
        "validate=False (header only)": lambda d: prepare_image(d, validate_off),
        "validate=True (1/8-scale DCT decode)": lambda d: prepare_image(d, validate_on),
        "naive full decode (PIL open+load)": naive_full_decode,
    }
    with single_core():  # one core, like one packing worker
        measured = per_image_rates([((lambda fn=fn: fn), datas) for fn in cases.values()], args.repeats)
    rate = {name: m["images_per_s"] for name, m in zip(cases, measured)}
    naive = rate["naive full decode (PIL open+load)"]
    print(f"bench_validate: {n} JPEGs {SIZE[0]}x{SIZE[1]}, mean {sum(map(len, datas)) / n / 1024:.0f} KB, "
          f"one core, median of {args.repeats}; Pillow {PIL.__version__}, simplejpeg {simplejpeg.__version__}")
    print(f"machine: {machine_label(machine_info())}")
    print(f"{'case':40s} {'images/s':>10s} {'ms/image':>9s} {'vs naive':>9s}")
    for name, r in rate.items():
        print(f"{name:40s} {r:10.0f} {1000 / r:9.3f} {r / naive:8.2f}x")


if __name__ == "__main__":
    main()
