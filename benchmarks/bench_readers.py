"""Reader throughput: every reader through make_loader vs a naive folder pass and webdataset.

One run on one machine measures, with the page cache warm:

* each of our readers through ``make_loader`` with 0 and 2 workers, in two
  modes: ``decode=False`` (stored bytes, as ByteBatch tensors) and decoded
  with the ImageNet eval transform (resize 256, center crop 224);
* the naive baseline: the original folder, PIL per file (open, RGB, resize,
  crop), a plain ``DataLoader`` with default settings;
* the official ``webdataset`` reader over the same shards, raw bytes out
  (its usual ``to_tuple`` pipeline) and decoded with the same transform.

Each figure is the median of ``--repeats`` full epochs. Usage::

    python benchmarks/bench_readers.py --images 2000            # ~3-4 min on 2 cores
    python benchmarks/bench_readers.py --quick                  # seconds, for CI
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from packer import PackOptions, pack
from packer.synth import make_imagenet_like
from readers import make_loader, open_dataset
from readers.transforms import imagenet_eval_transform


class NaiveFolder(torch.utils.data.Dataset):
    """What a first training script does: one PIL open per file, per sample."""

    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(p, c) for c, name in enumerate(classes) for p in sorted((root / name).iterdir())]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = 256 / min(w, h)
            im = im.resize((max(256, round(w * s)), max(256, round(h * s))), Image.BILINEAR)
            left, top = (im.width - 224) // 2, (im.height - 224) // 2
            im = im.crop((left, top, left + 224, top + 224))
            return torch.from_numpy(np.asarray(im).transpose(2, 0, 1).copy()), label


def _wds_eval(sample):
    data, label = sample
    return imagenet_eval_transform()(data), int(label)


def webdataset_loader(shards: list[str], batch_size: int, workers: int, decode: bool):
    import webdataset as wds

    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).shuffle(1000).to_tuple("jpg;png", "cls")
    if decode:
        ds = ds.map(_wds_eval)
    kw = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return torch.utils.data.DataLoader(ds.batched(batch_size, partial=True), batch_size=None,
                                       num_workers=workers, **kw)


def epoch(loader) -> int:
    n = 0
    for batch in loader:
        n += len(batch[1])
    return n


def measure(make, repeats: int) -> float:
    """Median samples/s over ``repeats`` epochs (one warm-up epoch first, not counted)."""
    loader = make()
    epoch(loader)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = epoch(loader)
        rates.append(n / (time.perf_counter() - t0))
    del loader
    return statistics.median(rates)


def run(images: int, repeats: int, batch_size: int, workers_list: list[int], workdir: Path) -> dict:
    src = make_imagenet_like(workdir / "src", n=images, classes=10)
    packed = {}
    for fmt in ("wds", "lmdb", "hdf5", "mmap"):
        opts = PackOptions(format=fmt, workers=2, shard_size=16 << 20,
                           resize=256 if fmt == "mmap" else None)
        pack(src, workdir / fmt, opts)
        packed[fmt] = workdir / fmt
    shards = sorted(str(p) for p in packed["wds"].glob("*.tar"))
    results: dict[str, float] = {}

    def add(name: str, make) -> None:
        rate = measure(make, repeats)
        results[name] = rate
        print(f"  {name:34s} {rate:9.0f} samples/s", file=sys.stderr, flush=True)

    for w in workers_list:
        add(f"naive-folder/decoded/w{w}", lambda: torch.utils.data.DataLoader(
            NaiveFolder(src), batch_size=batch_size, shuffle=True, num_workers=w))
        add(f"webdataset/bytes/w{w}", lambda: webdataset_loader(shards, batch_size, w, False))
        add(f"webdataset/decoded/w{w}", lambda: webdataset_loader(shards, batch_size, w, True))
        for fmt, root in packed.items():
            add(f"{fmt}/bytes/w{w}", lambda: make_loader(open_dataset(root, decode=False), batch_size, num_workers=w))
            transform = None if fmt == "mmap" else imagenet_eval_transform()
            add(f"{fmt}/decoded/w{w}", lambda: make_loader(open_dataset(root, transform=transform), batch_size,
                                                            num_workers=w))
    return results


def report(results: dict[str, float], workers_list: list[int]) -> str:
    lines = [f"{'reader':10s} {'mode':8s} " + " ".join(f"{'w=' + str(w):>9s}" for w in workers_list)
             + "   vs naive (w=max)  vs webdataset (w=max)"]
    wmax = max(workers_list)
    for reader in ("naive-folder", "webdataset", "wds", "lmdb", "hdf5", "mmap"):
        for mode in ("bytes", "decoded"):
            if f"{reader}/{mode}/w{wmax}" not in results:
                continue
            rates = [results[f"{reader}/{mode}/w{w}"] for w in workers_list]
            naive = results[f"naive-folder/decoded/w{wmax}"]
            ref = results[f"webdataset/{mode}/w{wmax}"]
            lines.append(f"{reader:10s} {mode:8s} " + " ".join(f"{r:9.0f}" for r in rates)
                         + f"   {rates[-1] / naive:15.2f}x  {rates[-1] / ref:20.2f}x")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="0,2")
    p.add_argument("--quick", action="store_true", help="tiny run (CI: proves the script works)")
    p.add_argument("--json", type=Path)
    p.add_argument("--workdir", type=Path)
    args = p.parse_args()
    if args.quick:
        args.images, args.repeats, args.batch_size = 60, 1, 16
    workers_list = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        results = run(args.images, args.repeats, args.batch_size, workers_list, workdir)
    machine = f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip()
    print(f"reader throughput, samples/s (median of {args.repeats} warm epochs), {args.images} images "
          f"~480x400 JPEG, batch {args.batch_size}; machine: {machine}, torch {torch.__version__}")
    print(report(results, workers_list))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "images": args.images, "machine": machine}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
