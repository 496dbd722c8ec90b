#!/usr/bin/env python
"""Decode/transform throughput: plain Pillow vs simplejpeg vs size-aware (reduced DCT) decode.

Benchmark of ``readers/decode/decoders.py`` and ``readers/decode/transforms.py`` (run it, it is not a test;
``tests/test_decode.py`` runs ``--quick`` so it cannot rot).

In one run it:

1. generates an ImageNet-like ImageFolder in a temp dir: JPEGs of about 480x400
   (quality 90, 4:2:0) cut and resized from the bundled real photos
   (``examples/real-images``) with added noise so they do not compress trivially;
2. on ONE core (process pinned to one CPU, ``torch.set_num_threads(1)``),
   measures images/s of each decode(+resize) path over the in-memory bytes,
   ``--repeats`` interleaved times, and reports the median per CPU-second
   (robust to other load on the machine) and per wall-second, and the ratio
   to the plain Pillow baseline (full decode + resize shorter side to 224);
3. measures a torch DataLoader (``--workers`` processes, all CPUs) over a
   map-style dataset of the file bytes with the train recipe, before (Pillow
   full decode + torchvision-like crop/resize in Pillow) and after (fused),
   each pass a fresh loader timed by ``dataset_bench.measure.measure_loader``;
4. re-encodes the folder at pack-time ``--max-side`` values (None, 512, 384,
   256) with the packer's own ``prepare_image`` (what ``pack-dataset
   --max-side`` stores) and reports total bytes and the single-core
   train-transform rate;
5. profiles the fused eval and train transforms on one core, step by step
   (entropy decode alone, full decode, the train crop's region decode through
   ``readers/decode/jpegcrop.py``, the resizes), and compares today's fused path
   (``crop_decode=False``) with the region decode, and, where a DALI venv is
   given (``--peer-venvs DIR`` with ``DIR/dali/bin/python``, or
   ``--dali-python``), DALI's CPU decoder + resize on 1 thread, pinned to the
   same core, over the same bytes.

The timing (``dataset_bench.onecore``), the machine description (``dataset_bench.machine``),
the generator (``dataset_bench.synth``) and the resize geometry (``readers.decode.geometry``)
are the project's shared ones; this script only chooses what to compare.

Usage::

    python benchmarks/bench_decode.py                 # full run, about a minute on 2 cores
    python benchmarks/bench_decode.py --quick         # tiny, seconds (what the test runs)
    python benchmarks/bench_decode.py --json out.json
    python benchmarks/bench_decode.py --peer-venvs /work/peervenvs   # with DALI CPU beside ours
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import simplejpeg
import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dataset_bench.machine import load_average, machine_info  # noqa: E402
from dataset_bench.measure import measure_loader  # noqa: E402
from dataset_bench.onecore import per_image_rates, single_core  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from packer.prepare.images import ImageOptions, prepare_image  # noqa: E402
from readers.decode import jpegcrop  # noqa: E402
from readers.decode.decoders import decode_rgb, decode_rgb_reduced, decode_rgb_region, decode_rgb_scaled, read_header  # noqa: E402
from readers.decode.geometry import resize_center_crop, resize_short_side  # noqa: E402
from readers.decode.transforms import (  # noqa: E402
    imagenet_eval_transform,
    imagenet_train_transform,
    plan_crop,
    sample_crop_box,
)

OUT = 224


# --------------------------------------------------------------------------- data


def make_folder(root: Path, n: int, seed: int = 0, classes: int = 10) -> list[tuple[Path, int]]:
    """An ImageFolder of ``n`` noisy ~480x400 JPEGs (quality 90, 2% grayscale), from dataset_bench.synth."""
    make_imagenet_like(root, n, classes, SynthOptions(noise=15.0, gray_fraction=0.02, seed=seed))
    classes_found = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(p, label) for label, c in enumerate(classes_found) for p in sorted((root / c).iterdir())]


def reencode(blobs: list[bytes], max_side: int | None) -> list[bytes]:
    """What ``pack-dataset --max-side`` stores for each file (the packer's own ``prepare_image``). None keeps the bytes."""
    if max_side is None:
        return list(blobs)
    return [prepare_image(data, ImageOptions(max_side=max_side)).data for data in blobs]


# --------------------------------------------------------------------------- pipelines


def _pil_to_chw(im: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(im.convert("RGB")).transpose(2, 0, 1)))


def _arr_resize_pillow(arr: np.ndarray) -> torch.Tensor:
    h, w = resize_short_side(arr.shape[0], arr.shape[1], OUT)
    return _pil_to_chw(Image.fromarray(arr).resize((w, h), Image.BILINEAR))


def _arr_resize_torch(arr: np.ndarray) -> torch.Tensor:
    h, w = resize_short_side(arr.shape[0], arr.shape[1], OUT)
    if not arr.flags.writeable:
        arr = arr.copy()
    x = torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0)
    return torch.nn.functional.interpolate(x, size=(h, w), mode="bilinear", antialias=True)[0].contiguous()


def pillow_baseline(data: bytes) -> torch.Tensor:
    """Plain Pillow: full decode, resize shorter side to 224 (bilinear, antialiased)."""
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        h, w = resize_short_side(im.height, im.width, OUT)
        return _pil_to_chw(im.resize((w, h), Image.BILINEAR))


class PillowTrain:
    """The "before" train pipeline: Pillow full decode, torchvision-like crop+resize+flip in Pillow."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def __call__(self, data: bytes) -> torch.Tensor:
        with Image.open(io.BytesIO(data)) as im:
            im = im.convert("RGB")
            top, left, h, w = sample_crop_box(im.height, im.width, (0.08, 1.0), (3 / 4, 4 / 3), self.rng)
            im = im.crop((left, top, left + w, top + h)).resize((OUT, OUT), Image.BILINEAR)
            if self.rng.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return _pil_to_chw(im)


def pillow_eval(data: bytes) -> torch.Tensor:
    """The "before" eval pipeline: Pillow full decode, Resize(256) + CenterCrop(224) in Pillow."""
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        g = resize_center_crop(im.height, im.width, 256, OUT)
        return _pil_to_chw(im.resize((g.width, g.height), Image.BILINEAR).crop(g.box))


def methods() -> list[tuple[str, str, object]]:
    """(name, recipe group, factory) -- the factory returns a fresh bytes -> tensor callable."""
    return [
        ("pillow full decode + pillow resize (baseline)", "resize", lambda: pillow_baseline),
        ("simplejpeg full decode + pillow resize", "resize",
         lambda: lambda d: _arr_resize_pillow(decode_rgb(d, decoder="simplejpeg"))),
        ("simplejpeg full decode + torch resize", "resize",
         lambda: lambda d: _arr_resize_torch(decode_rgb(d, decoder="simplejpeg"))),
        ("reduced decode (pillow draft) + pillow resize", "resize",
         lambda: lambda d: _arr_resize_pillow(decode_rgb_reduced(d, OUT, OUT, decoder="pillow"))),
        ("reduced decode (simplejpeg) + pillow resize", "resize",
         lambda: lambda d: _arr_resize_pillow(decode_rgb_reduced(d, OUT, OUT, decoder="simplejpeg"))),
        ("reduced decode (simplejpeg) + torch resize", "resize",
         lambda: lambda d: _arr_resize_torch(decode_rgb_reduced(d, OUT, OUT, decoder="simplejpeg"))),
        ("train before: pillow decode + crop/resize (pillow)", "train", lambda: PillowTrain(0)),
        ("train fused: auto decoder + pillow resize", "train",
         lambda: imagenet_train_transform(OUT, seed=0, backend="pillow")),
        ("train fused: auto decoder + torch resize (default)", "train",
         lambda: imagenet_train_transform(OUT, seed=0)),
        ("eval before: pillow decode + Resize(256)+CenterCrop", "eval", lambda: pillow_eval),
        ("eval fused: auto decoder + pillow resize", "eval",
         lambda: imagenet_eval_transform(OUT, 256, backend="pillow")),
        ("eval fused: auto decoder + torch resize (default)", "eval", lambda: imagenet_eval_transform(OUT, 256)),
    ]


# --------------------------------------------------------------------------- the three parts


class BytesDataset(torch.utils.data.Dataset):
    """Map-style dataset over in-memory file bytes: (transform(bytes), label)."""

    def __init__(self, blobs: list[bytes], labels: list[int], transform) -> None:
        self.blobs, self.labels, self.transform = blobs, labels, transform

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        return self.transform(self.blobs[i]), self.labels[i]


def single_core_part(blobs: list[bytes], repeats: int, max_sides: tuple, cpu: int | None) -> tuple:
    """Every method, then the train transform on each ``--max-side`` re-encode, on one pinned core."""
    packed = [(ms, reencode(blobs, ms)) for ms in max_sides]  # not timed
    with single_core(cpu) as pinned:
        table = methods()
        measured = per_image_rates([(factory, blobs) for _name, _group, factory in table], repeats)
        by_side = per_image_rates([(lambda: imagenet_train_transform(OUT, seed=0), re) for _ms, re in packed], repeats)
    base = measured[0]["images_per_cpu_s"]
    group_base: dict[str, float] = {}
    rows = []
    for (name, group, _factory), m in zip(table, measured):
        group_base.setdefault(group, m["images_per_cpu_s"])
        rows.append({"method": name, "group": group, **m, "vs_baseline": m["images_per_cpu_s"] / base,
                     "vs_group_first": m["images_per_cpu_s"] / group_base[group]})
    ms_rows = [{"max_side": ms, "total_bytes": sum(len(b) for b in re),
                "mean_bytes": int(statistics.fmean(len(b) for b in re)),
                "train_images_per_cpu_s": m["images_per_cpu_s"], "train_images_per_s": m["images_per_s"],
                "runs_cpu": m["runs_cpu"], "runs_wall": m["runs_wall"]} for (ms, re), m in zip(packed, by_side)]
    return rows, ms_rows, pinned


def loader_part(blobs: list[bytes], labels: list[int], workers: int, batch: int, repeats: int) -> list[dict]:
    """The train recipe through a DataLoader, before and after; passes interleaved
    (dataset_bench.measure.measure_loader)."""
    recipes = [("before: pillow decode + pillow crop/resize", lambda: PillowTrain(0)),
               ("after: fused train transform", lambda: imagenet_train_transform(OUT))]
    runs: list[list[float]] = [[] for _ in recipes]
    for _ in range(repeats):
        for i, (_name, make) in enumerate(recipes):
            stats = measure_loader(lambda: torch.utils.data.DataLoader(
                BytesDataset(blobs, labels, make()), batch_size=batch, shuffle=True, num_workers=workers))
            runs[i].append(stats.samples_per_s)
    return [{"pipeline": name, "workers": workers, "images_per_s": statistics.median(r), "runs": r}
            for (name, _make), r in zip(recipes, runs)]


# --------------------------------------------------------------------------- profile and region decode


class TrainCrop(NamedTuple):
    """One train crop as the fused transform plans it: the decoded rows/columns it resamples."""

    data: bytes
    scale: int
    rows: tuple[int, int]
    cols: tuple[int, int]


def train_crops(blobs: list[bytes], seed: int = 0) -> list[TrainCrop]:
    """The crops ``imagenet_train_transform(seed=seed)`` draws for ``blobs`` (same stream, same plan)."""
    t = imagenet_train_transform(OUT, seed=seed)
    crops = []
    for data in blobs:
        h = read_header(data)
        box, _flip = t.draw(h.height, h.width)
        plan = plan_crop(h.height, h.width, box, (OUT, OUT), jpeg=h.is_jpeg)
        s, (top, left, bh, bw) = plan.scale, plan.box
        crops.append(TrainCrop(data, s, (int(top) // s, -(-int(top + bh) // s)),
                               (int(left) // s, -(-int(left + bw) // s))))
    return crops


def _torch_resize(arr: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).unsqueeze(0)
    return torch.nn.functional.interpolate(x, size=size, mode="bilinear", antialias=True)[0].contiguous()


def profile_cases(blobs: list[bytes]) -> list[tuple[str, str, object, list]]:
    """(step, group, factory, items): each step of the fused transforms on its own, then the whole transforms."""
    crops = train_crops(blobs)
    full = [np.array(decode_rgb_scaled(b, 1)) for b in blobs]
    eval_sizes = [resize_center_crop(a.shape[0], a.shape[1], 256, OUT) for a in full]
    train_subs = [np.ascontiguousarray(decode_rgb_scaled(c.data, c.scale)[c.rows[0]:c.rows[1], c.cols[0]:c.cols[1]])
                  for c in crops]
    cases = [("full decode (simplejpeg, today's path)", "decode", lambda: lambda d: decode_rgb_scaled(d, 1), blobs)]
    if jpegcrop.available():
        cases += [
            ("  of which entropy decode alone (whole file)", "decode", lambda: jpegcrop.entropy_decode_only, blobs),
            ("region decode of the train crop (jpegcrop)", "decode",
             lambda: lambda c: decode_rgb_region(c.data, c.scale, c.rows, c.cols), crops)]
    cases += [
        ("candidate: smallest M/8 DCT scale with shorter side >= 256", "candidate",
         lambda: lambda d: simplejpeg.decode_jpeg(d, "RGB", False, False, 256, 256), blobs),
        ("candidate: full decode, fast upsampling (not bit-exact)", "candidate",
         lambda: lambda d: simplejpeg.decode_jpeg(d, "RGB", False, True), blobs),
        ("candidate: full decode, fast integer IDCT (not bit-exact)", "candidate",
         lambda: lambda d: simplejpeg.decode_jpeg(d, "RGB", True, False), blobs),
        ("candidate: train resize with Pillow resize(box=...)", "candidate",
         lambda: lambda a: Image.fromarray(a).resize((OUT, OUT), Image.BILINEAR, box=(0.5, 0.5, a.shape[1] - 0.5,
                                                                                      a.shape[0] - 0.5)),
         train_subs),
        ("eval resize: whole image to shorter side 256 (torch)", "resize",
         lambda: lambda ag: _torch_resize(ag[0], (ag[1].height, ag[1].width)), list(zip(full, eval_sizes))),
        ("train resize: the crop to 224 (torch)", "resize", lambda: lambda a: _torch_resize(a, (OUT, OUT)), train_subs),
        ("eval fused, today's path (crop_decode=False)", "eval",
         lambda: imagenet_eval_transform(OUT, 256, crop_decode=False), blobs),
        ("eval fused, region decode (default)", "eval", lambda: imagenet_eval_transform(OUT, 256), blobs),
        ("train fused, today's path (crop_decode=False)", "train",
         lambda: imagenet_train_transform(OUT, seed=0, crop_decode=False), blobs),
        ("train fused, region decode (default)", "train", lambda: imagenet_train_transform(OUT, seed=0), blobs),
    ]
    return cases


DALI_SCRIPT = r"""
import glob, json, os, statistics, sys, time
import numpy as np
cpu, repeats, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
import nvidia.dali
from nvidia.dali import fn, pipeline_def, types
blobs = [np.fromfile(p, np.uint8) for p in sorted(glob.glob(os.path.join(root, "*.jpg")))]
B = min(32, len(blobs))
def build(kind):
    @pipeline_def(batch_size=B, num_threads=1, device_id=None, seed=0, prefetch_queue_depth=1,
                  exec_async=False, exec_pipelined=False)
    def pipe():
        enc = fn.external_source(name="enc", dtype=types.UINT8)
        if kind == "eval":
            img = fn.decoders.image(enc, device="cpu", output_type=types.RGB)
            img = fn.resize(img, resize_shorter=256, interp_type=types.INTERP_LINEAR, antialias=True)
            return fn.crop(img, crop=(224, 224))
        img = fn.decoders.image_random_crop(enc, device="cpu", output_type=types.RGB,
                                            random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        img = fn.resize(img, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR, antialias=True)
        return fn.flip(img, horizontal=fn.random.coin_flip())
    p = pipe()
    p.build()
    return p
out = {"version": nvidia.dali.__version__}
pipes = {kind: build(kind) for kind in ("eval", "train")}
def one_pass(p):
    c = time.process_time()
    for i in range(0, len(blobs) - B + 1, B):
        p.feed_input("enc", blobs[i:i + B])
        p.run()
    return (len(blobs) // B * B) / max(time.process_time() - c, 1e-9)
for p in pipes.values():
    one_pass(p)  # warm-up
runs = {k: [] for k in pipes}
for _ in range(repeats):
    for k, p in pipes.items():
        runs[k].append(one_pass(p))
out.update({k: statistics.median(v) for k, v in runs.items()})
out["runs"] = runs
print(json.dumps(out))
"""


def dali_python(args: argparse.Namespace) -> str | None:
    """The interpreter of a DALI venv (--dali-python, or --peer-venvs DIR/dali/bin/python), or None."""
    if args.dali_python:
        return str(args.dali_python)
    if args.peer_venvs and (args.peer_venvs / "dali" / "bin" / "python").exists():
        return str(args.peer_venvs / "dali" / "bin" / "python")
    return None


def dali_part(python: str | None, blobs: list[bytes], repeats: int, cpu: int | None) -> dict:
    """DALI's CPU decoder + resize (+ crop / random-crop decode + flip) on 1 thread over the same bytes."""
    if python is None:
        return {"skipped": "no DALI venv given (--peer-venvs DIR or --dali-python; pip install nvidia-dali-cuda120)"}
    with tempfile.TemporaryDirectory(prefix="bench-decode-dali-") as tmp:
        for i, data in enumerate(blobs):
            Path(tmp, f"{i:06d}.jpg").write_bytes(data)
        proc = subprocess.run([python, "-c", DALI_SCRIPT, str(-1 if cpu is None else cpu), str(repeats), tmp],
                              capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"DALI run failed: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_part(blobs: list[bytes], repeats: int, cpu: int | None) -> tuple[list[dict], int | None]:
    """Each step and each transform on one pinned core, interleaved passes."""
    cases = profile_cases(blobs)
    with single_core(cpu) as pinned:
        measured = per_image_rates([(factory, items) for _name, _group, factory, items in cases], repeats)
    rows = [{"step": name, "group": group, "us_per_image": 1e6 / m["images_per_cpu_s"],
             "images_per_cpu_s": m["images_per_cpu_s"], "runs_cpu": m["runs_cpu"]}
            for (name, group, _f, _i), m in zip(cases, measured)]
    return rows, pinned


def print_profile(rows: list[dict], dali: dict, cpu: int | None) -> None:
    print(f"\n## Where the fused transforms' time goes (one core, CPU {cpu}): CPU microseconds per image\n")
    print(_table(["step", "us/image", "img/s (CPU)"],
                 [[r["step"], f"{r['us_per_image']:.0f}", f"{r['images_per_cpu_s']:.0f}"] for r in rows]))
    by = {r["step"]: r["images_per_cpu_s"] for r in rows}
    today_train = by["train fused, today's path (crop_decode=False)"]
    today_eval = by["eval fused, today's path (crop_decode=False)"]
    table = [["eval: ours, today's path (crop_decode=False)", f"{today_eval:.0f}", "1.00x"],
             ["eval: ours, region decode (default)", f"{by['eval fused, region decode (default)']:.0f}",
              f"{by['eval fused, region decode (default)'] / today_eval:.2f}x"],
             ["train: ours, today's path (crop_decode=False)", f"{today_train:.0f}", "1.00x"],
             ["train: ours, region decode (default)", f"{by['train fused, region decode (default)']:.0f}",
              f"{by['train fused, region decode (default)'] / today_train:.2f}x"]]
    if "skipped" in dali:
        note = f"DALI CPU: skipped ({dali['skipped']})"
    else:
        note = f"DALI {dali['version']}, CPU operators, num_threads=1, batches of 32, same core"
        table += [["eval: DALI decoders.image + resize(shorter 256) + crop 224", f"{dali['eval']:.0f}",
                   f"{dali['eval'] / today_eval:.2f}x"],
                  ["train: DALI decoders.image_random_crop + resize 224 + flip", f"{dali['train']:.0f}",
                   f"{dali['train'] / today_train:.2f}x"]]
    print("\n## Fused transforms, today vs region decode, and DALI CPU: images per CPU-second on one core\n")
    print(_table(["pipeline", "img/s (CPU)", "vs ours today"], table))
    print(f"\n# {note}; FFCV: not run here (no FFCV install on this machine)")


# --------------------------------------------------------------------------- report


def _table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])  # noqa: E731
                                        for i, c in enumerate(r)) + " |"
    sep = "|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in cells])


def print_header(info: dict) -> None:
    m, dec = info["machine"], info["machine"]["decoders"]
    print(f"# {m['arch']} {m['os']}, {m['cpu_model']}, {m['usable_cpus']} usable CPUs, cuda={'yes' if m['cuda'] else 'no'}; "
          f"python {m['python']}, torch {m['torch']} ({m['torch_cpu_capability']}), Pillow {dec['pil']} "
          f"(libjpeg-turbo {dec['pil_libjpeg_turbo']}), simplejpeg {dec['simplejpeg']}")
    print(f"# auto decoder: {dec['auto_jpeg']} for JPEG (bit-exact vs Pillow: "
          f"{dec['simplejpeg_matches_pillow']}), {dec['auto_other']} otherwise")
    print(f"# {info['images']} JPEGs, mean {info['mean_bytes'] / 1000:.0f} KB, mean {info['mean_size_wh'][0]}x"
          f"{info['mean_size_wh'][1]} (WxH), quality 90; {info['repeats']} interleaved repeats, median shown")


def print_tables(rows: list[dict], loader_rows: list[dict], ms_rows: list[dict], cpu: int | None, workers: int,
                 batch: int) -> None:
    print(f"\n## One core (pinned to CPU {cpu}, torch threads 1): images per CPU-second (and per wall-second)\n")
    print(_table(["method", "img/s (CPU)", "img/s (wall)", "vs baseline", "vs recipe 'before'"],
                 [[r["method"], f"{r['images_per_cpu_s']:.0f}", f"{r['images_per_s']:.0f}",
                   f"{r['vs_baseline']:.2f}x", f"{r['vs_group_first']:.2f}x" if r["group"] != "resize" else ""]
                  for r in rows]))
    print(f"\n## DataLoader, train recipe, {workers} workers, batch {batch}: images/s\n")
    print(_table(["pipeline", "images/s", "speed-up"],
                 [[r["pipeline"], f"{r['images_per_s']:.0f}",
                   f"{r['images_per_s'] / loader_rows[0]['images_per_s']:.2f}x"] for r in loader_rows]))
    print("\n## Pack-time --max-side (pack-dataset's own re-encode): size vs train-transform rate (one core)\n")
    print(_table(["max-side", "total MB", "KB/image", "train img/s (CPU)", "train img/s (wall)"],
                 [["none (as generated)" if r["max_side"] is None else str(r["max_side"]),
                   f"{r['total_bytes'] / 1e6:.1f}", f"{r['mean_bytes'] / 1000:.0f}",
                   f"{r['train_images_per_cpu_s']:.0f}", f"{r['train_images_per_s']:.0f}"] for r in ms_rows]))


def load_images(n: int, keep: Path | None) -> tuple[list[bytes], list[int]]:
    """Generate the folder (in ``keep``, else a temporary one) and read every file into memory."""
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        items = make_folder(root / "train", n)
        return [p.read_bytes() for p, _ in items], [lab for _, lab in items]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny run (seconds): 16 images, 1 repeat")
    ap.add_argument("--images", type=int, default=None, help="JPEGs to generate (default 500, quick 16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes per method (default 3, quick 1)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers for the loader part")
    ap.add_argument("--batch", type=int, default=None, help="DataLoader batch size (default 64, quick 8)")
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin the single-core part to")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", type=Path, default=None, help="generate the folder here and keep it")
    ap.add_argument("--peer-venvs", type=Path, default=None, metavar="DIR",
                    help="run DALI CPU from DIR/dali/bin/python beside ours (as dataset-bench --peers --peer-venvs)")
    ap.add_argument("--dali-python", type=Path, default=None, help="the python of a venv with nvidia-dali")
    args = ap.parse_args(argv)
    n = args.images or (16 if args.quick else 500)
    repeats = args.repeats or (1 if args.quick else 3)
    batch = args.batch or (8 if args.quick else 64)
    max_sides = (None, 256) if args.quick else (None, 512, 384, 256)
    started = time.perf_counter()
    blobs, labels = load_images(n, args.keep)
    sizes = [Image.open(io.BytesIO(b)).size for b in blobs]
    info = {"machine": machine_info(), "images": n, "mean_bytes": int(statistics.fmean(len(b) for b in blobs)),
            "mean_size_wh": [int(statistics.fmean(s[0] for s in sizes)), int(statistics.fmean(s[1] for s in sizes))],
            "repeats": repeats, "loadavg_start": load_average(),
            "command": "python benchmarks/bench_decode.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    print_header(info)
    rows, ms_rows, cpu = single_core_part(blobs, repeats, max_sides, args.cpu)
    loader_rows = loader_part(blobs, labels, args.workers, batch, repeats)
    profile_rows, _ = profile_part(blobs, repeats, cpu)
    dali = dali_part(dali_python(args), blobs, repeats, cpu)
    print_tables(rows, loader_rows, ms_rows, cpu, args.workers, batch)
    print_profile(profile_rows, dali, cpu)
    elapsed = time.perf_counter() - started
    info["loadavg_end"] = load_average()
    print(f"\n# total {elapsed:.0f} s; load average at start {info['loadavg_start']:.2f}, "
          f"at end {info['loadavg_end']:.2f} (1 min; above ~0.3 other work shared the CPUs)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"info": info, "single_core": rows, "loader": loader_rows,
                                         "max_side": ms_rows, "profile": profile_rows, "dali": dali,
                                         "elapsed_s": elapsed}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
