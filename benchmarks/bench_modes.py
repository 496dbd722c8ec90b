"""``make_loader``'s worker modes side by side: defaults vs ``workers="threads"`` vs ``workers="processes"``.

One run on one machine, page cache warm, measures samples/s of each mode of
reading through ``make_loader`` with each worker kind:

* ``bytes``: ``decode=False`` over wds, lmdb and hdf5 (stored JPEG bytes, ByteBatch);
* ``raw``: mmap's stored 256x256 pixels as they are;
* ``raw224``: the same pixels center-cropped to 224 (``imagenet_eval_transform``:
  resize 256 + crop 224, a pure crop of stored 256x256 pixels);
* ``pil``: wds read as PIL images (``image="pil"``) through a user's own Python
  transform (PIL resize 256, center crop 224, float tensor, as torchvision's
  ``Resize, CenterCrop, ToTensor``), beside the naive folder
  (``dataset_bench.naive``: the same work per file, a plain DataLoader).

Each measurement is a fresh loader iterated over whole epochs until
``--seconds`` have passed (persistent workers), timed from the end of the
first ``2 * workers`` batches; measurements are interleaved repeat by repeat
and the median is printed, with the ratios the issue asks for
(processes / threads, raw224 / raw, pil / naive folder). Usage::

    python benchmarks/bench_modes.py --images 3000          # a few minutes on 2 cores
    python benchmarks/bench_modes.py --quick                # seconds, for CI
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dataset_bench.cache import CacheControl  # noqa: E402
from dataset_bench.machine import load_average, machine_info, machine_label  # noqa: E402
from dataset_bench.measure import batch_len, shutdown_loader  # noqa: E402
from dataset_bench.naive import naive_loader  # noqa: E402
from dataset_bench.synth import generate_image_folder  # noqa: E402
from dataset_bench.targets import dataset_target, folder_target, pack_formats  # noqa: E402

KINDS = ("default", "threads", "processes")
MODES = ("bytes/wds", "bytes/lmdb", "bytes/hdf5", "raw/mmap", "raw224/mmap", "pil/wds")


class UserPilTransform:
    """A user's own torchvision-style transform on a PIL image: shorter side to 256 (bilinear),
    center crop 224, float32 CHW in [0, 1] (what ``Resize(256), CenterCrop(224), ToTensor()`` does)."""

    def __call__(self, img: Any) -> torch.Tensor:
        from PIL import Image

        from readers.decode.geometry import resize_center_crop

        g = resize_center_crop(img.height, img.width, 256, 224)
        arr = np.array(img.resize((g.width, g.height), Image.BILINEAR).crop(g.box), dtype=np.uint8)
        return torch.from_numpy(arr).permute(2, 0, 1).contiguous().to(torch.float32).div(255)


def our_loader(packed: dict[str, Path], mode: str, kind: str, batch_size: int, workers: int) -> Any:
    from readers import make_loader, open_dataset
    from readers.decode.transforms import imagenet_eval_transform

    what, fmt = mode.split("/")
    root = packed[fmt]
    if what == "bytes":
        ds = open_dataset(root, decode=False)
    elif what == "raw":
        ds = open_dataset(root)
    elif what == "raw224":
        ds = open_dataset(root, transform=imagenet_eval_transform(224, 256))
    else:
        ds = open_dataset(root, image="pil", transform=UserPilTransform())
    kw = {} if kind == "default" else {"workers": kind}
    return make_loader(ds, batch_size=batch_size, num_workers=workers, pin_memory=False, **kw)


def rate(make: Callable[[], Any], seconds: float, warmup: int) -> float:
    """Samples/s of the loader ``make()`` builds, over whole epochs until ``seconds`` have passed,
    counted from batch ``warmup`` on."""
    loader = make()
    samples, seen, t_start, it = 0, 0, None, None
    try:
        while True:
            it = iter(loader)
            for batch in it:
                seen += 1
                if seen == warmup:
                    t_start = time.perf_counter()
                elif seen > warmup:
                    samples += batch_len(batch)
            if t_start is not None and time.perf_counter() - t_start >= seconds:
                break
    finally:
        shutdown_loader(loader, it)
    return samples / (time.perf_counter() - t_start)


def run(images: int, repeats: int, batch_size: int, workers: int, seconds: float, workdir: Path,
        modes: tuple[str, ...] = MODES) -> dict[str, float]:
    src, packed = workdir / "src", {f: workdir / "packed" / f for f in ("wds", "lmdb", "hdf5", "mmap")}
    ready = workdir / f"ready-{images}"  # a --workdir already holding this run's images and packs is reused
    if not ready.exists():
        src = generate_image_folder(src, images, classes=10)
        packed = pack_formats(src, workdir / "packed", tuple(packed), workers=2, shard_size=16 << 20)
        ready.touch()
    CacheControl.warm(folder_target(src).files + [f for p in packed.values() for f in dataset_target(p).files])
    todo: dict[str, Callable[[], Any]] = {}
    for mode in modes:
        for kind in KINDS:
            todo[f"{mode}/{kind}"] = lambda m=mode, k=kind: our_loader(packed, m, k, batch_size, workers)
    if "pil/wds" in modes:
        todo["pil/folder/naive"] = lambda: naive_loader(src, batch_size=batch_size, num_workers=workers)
    rates: dict[str, list[float]] = {name: [] for name in todo}
    for rep in range(repeats):  # interleaved: load from elsewhere on the machine hits every case alike
        for name, make in todo.items():
            rates[name].append(rate(make, seconds, 2 * max(1, workers)))
            print(f"  [{rep + 1}/{repeats}] {name:28s} {rates[name][-1]:9.0f} samples/s  load {load_average():.2f}",
                  file=sys.stderr, flush=True)
    return {name: statistics.median(r) for name, r in rates.items()}


def report(results: dict[str, float], modes: tuple[str, ...] = MODES) -> str:
    lines = [f"{'mode':12s} " + " ".join(f"{k:>10s}" for k in KINDS) + "  processes/threads  default/threads"]
    for mode in modes:
        r = [results[f"{mode}/{k}"] for k in KINDS]
        lines.append(f"{mode:12s} " + " ".join(f"{v:10.0f}" for v in r) + f"  {r[2] / r[1]:17.2f}x {r[0] / r[1]:15.2f}x")
    if "pil/wds" in modes:
        lines.append(f"{'naive folder':12s} {results['pil/folder/naive']:10.0f}")
    notes = []
    if "raw/mmap" in modes and "raw224/mmap" in modes:
        notes += [f"raw224 / raw ({k}): {results[f'raw224/mmap/{k}'] / results[f'raw/mmap/{k}']:.2f}x" for k in KINDS]
    if "pil/wds" in modes:
        naive = results["pil/folder/naive"]
        notes += [f"pil / naive folder ({k}): {results[f'pil/wds/{k}'] / naive:.2f}x" for k in KINDS]
    return "\n".join(lines + notes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0, help="time each measurement at least this long")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--quick", action="store_true", help="tiny run (CI: proves the script works)")
    p.add_argument("--json", type=Path)
    p.add_argument("--workdir", type=Path, help="keep the images and packs here and reuse them in later runs (default: a temporary folder)")
    args = p.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--modes: expected some of {', '.join(MODES)}, got {args.modes!r}")
    if args.quick:
        args.images, args.repeats, args.batch_size, args.seconds = 48, 1, 8, 0.05
    if args.workdir is not None:
        results = run(args.images, args.repeats, args.batch_size, args.workers, args.seconds, args.workdir, modes)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-modes-") as tmp:
            results = run(args.images, args.repeats, args.batch_size, args.workers, args.seconds, Path(tmp), modes)
    print(f"make_loader worker modes, samples/s (median of {args.repeats}, warm page cache), {args.images} images "
          f"~480x400 JPEG (mmap: 256x256), batch {args.batch_size}, {args.workers} workers, load "
          f"{load_average():.2f}; machine: {machine_label(machine_info())}")
    print(report(results, modes))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "images": args.images, "repeats": args.repeats,
                                         "batch_size": args.batch_size, "workers": args.workers,
                                         "machine": machine_info()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
