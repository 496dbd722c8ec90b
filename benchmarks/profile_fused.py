#!/usr/bin/env python
"""Where the fused transforms' time goes, per image, on one core (issue 37, item 1).

Benchmark of ``readers/decode/transforms.py`` and ``crop.py`` (run it, it is not a test; ``tests/test_profile_fused.py``
runs ``--quick`` so it cannot rot). It generates ImageNet-like JPEGs the way
``benchmarks/bench_decode.py`` does (``dataset_bench.synth``: about 480x400, quality 90, noise,
2% grayscale), runs the fused eval and train transforms once while recording each call they make
to the region decoder (``decode_rgb_region``) and to torch's resize (``F.interpolate``), then times,
on one pinned core with torch on one thread (``dataset_bench.onecore.single_core``):

* the entropy (Huffman) decoding of each whole file alone: the work no exact decoder of these
  files skips above the last row it needs (``jpegcrop.entropy_decode_only``);
* a full decode (simplejpeg, accurate IDCT, fancy upsampling);
* the region decodes and the resizes exactly as the transforms called them (same arguments);
* the whole transforms.

Passes are interleaved (step 1, 2, ... then again in reverse order) and timed in CPU seconds; the
table gives the fastest pass (least disturbed by other load) and the median. "Glue" is the whole
transform minus its region decode and its resize: the Python, the header read, the box, the
copies into the output tensor.

Usage::

    python benchmarks/profile_fused.py                 # 300 images, 8 passes: about a minute on 2 cores
    python benchmarks/profile_fused.py --quick         # seconds (what the test runs)
    python benchmarks/profile_fused.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch.nn.functional as F  # noqa: E402

from dataset_bench.machine import load_average  # noqa: E402
from dataset_bench.onecore import single_core  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from readers.decode import crop, decoders, jpegcrop, transforms  # noqa: E402


def load_images(n: int) -> list[bytes]:
    """``n`` JPEGs as ``benchmarks/bench_decode.py`` generates them, read into memory."""
    with tempfile.TemporaryDirectory(prefix="profile-fused-") as tmp:
        make_imagenet_like(tmp, n, 10, SynthOptions(noise=15.0, gray_fraction=0.02, seed=0))
        return [p.read_bytes() for p in sorted(Path(tmp).rglob("*.JPEG"))]


def record(transform: Callable, blobs: list[bytes]) -> tuple[list, list]:
    """Run ``transform`` over ``blobs``; the (args, kwargs) of each region decode and resize it made."""
    decodes: list = []
    resizes: list = []
    real_decode, real_resize = crop.decode_rgb_region, F.interpolate

    def decode(*a, **k):
        decodes.append((a, k))
        return real_decode(*a, **k)

    def resize(x, **k):
        resizes.append((x, k))
        return real_resize(x, **k)

    crop.decode_rgb_region, crop.F.interpolate = decode, resize  # type: ignore[assignment]
    try:
        for b in blobs:
            transform(b)
    finally:
        crop.decode_rgb_region, crop.F.interpolate = real_decode, real_resize  # type: ignore[assignment]
    return decodes, resizes


def steps(blobs: list[bytes]) -> dict[str, Callable[[], object]]:
    """Each step as a pass over all the images."""
    eval_tf = transforms.imagenet_eval_transform()
    eval_dec, eval_rs = record(eval_tf, blobs)
    train_dec, train_rs = record(transforms.imagenet_train_transform(seed=0), blobs)

    def train() -> None:
        tf = transforms.imagenet_train_transform(seed=0)  # fresh: the same boxes every pass
        for b in blobs:
            tf(b)

    out: dict[str, Callable[[], object]] = {}
    if jpegcrop.available():
        out["entropy decode alone (whole file)"] = lambda: [jpegcrop.entropy_decode_only(b) for b in blobs]
    out.update({
        "full decode (simplejpeg, accurate)": lambda: [decoders.decode_rgb_scaled(b, 1) for b in blobs],
        "eval: region decode (as the transform asks)": lambda: [decoders.decode_rgb_region(*a, **k)
                                                                for a, k in eval_dec],
        "eval: resize (torch, as the transform asks)": lambda: [F.interpolate(x, **k) for x, k in eval_rs],
        "eval: whole transform": lambda: [eval_tf(b) for b in blobs],
        "train: region decode (as the transform asks)": lambda: [decoders.decode_rgb_region(*a, **k)
                                                                 for a, k in train_dec],
        "train: resize (torch, as the transform asks)": lambda: [F.interpolate(x, **k) for x, k in train_rs],
        "train: whole transform": train,
    })
    return out


def profile(blobs: list[bytes], passes: int, cpu: int | None) -> list[dict]:
    """Rows ``{step, min_us, median_us, images_per_cpu_s}``, plus the glue rows."""
    with single_core(cpu):
        cases = steps(blobs)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for p in range(passes):
            order = list(cases.items())
            for name, fn in order if p % 2 else reversed(order):
                c = time.process_time()
                fn()
                times[name].append((time.process_time() - c) / len(blobs) * 1e6)
    rows = [{"step": k, "min_us": min(v), "median_us": statistics.median(v),
             "images_per_cpu_s": 1e6 / statistics.median(v)} for k, v in times.items()]
    by = {r["step"]: r for r in rows}
    for kind in ("eval", "train"):
        whole, dec, rs = (by[f"{kind}: {s}"] for s in ("whole transform", "region decode (as the transform asks)",
                                                          "resize (torch, as the transform asks)"))
        glue = {k: whole[k] - dec[k] - rs[k] for k in ("min_us", "median_us")}
        rows.append({"step": f"{kind}: glue (whole - decode - resize)", **glue, "images_per_cpu_s": None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny run (seconds): 12 images, 2 passes")
    ap.add_argument("--images", type=int, default=None, help="JPEGs to generate (default 300, quick 12)")
    ap.add_argument("--passes", type=int, default=None, help="timed passes per step (default 8, quick 2)")
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default the lowest usable)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    n, passes = args.images or (12 if args.quick else 300), args.passes or (2 if args.quick else 8)
    blobs = load_images(n)
    load_start = load_average()
    rows = profile(blobs, passes, args.cpu)
    load_end = load_average()
    print(f"# {n} images, mean {statistics.fmean(len(b) for b in blobs) / 1000:.0f} KB, {passes} interleaved passes, "
          f"one core; load average {load_start} at start, {load_end} at end (1 min; pid {os.getpid()})\n")
    print("| step (one core) | fastest pass µs/image | median µs/image | img/s (CPU, median) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        rate = "" if r["images_per_cpu_s"] is None else f"{r['images_per_cpu_s']:,.0f}"
        print(f"| {r['step']} | {r['min_us']:,.0f} | {r['median_us']:,.0f} | {rate} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"images": n, "passes": passes, "load_start": load_start,
                                         "load_end": load_end, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
