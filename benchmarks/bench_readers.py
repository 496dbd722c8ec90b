"""Reader throughput: every reader through make_loader vs the naive folder and the official webdataset reader.

One run on one machine measures, with the page cache warm:

* each of our readers through ``make_loader`` with 0 and 2 workers, in two
  modes: ``decode=False`` (stored bytes, as ByteBatch tensors) and decoded
  with the ImageNet eval transform (resize 256, center crop 224, uint8);
* the naive baseline (``dataset_bench.naive``): the original folder, PIL per file
  (open, RGB, resize, crop, float tensor), a plain ``DataLoader`` with its
  defaults;
* the official ``webdataset`` reader over the same shards, raw bytes out
  (its usual ``to_tuple`` pipeline) and decoded with the same transform.

Each figure is the median over ``--repeats`` passes, each a fresh loader
timed by ``dataset_bench.measure.measure_loader`` (the steady rate, from the batch
by which every worker has delivered one to the last), passes interleaved
across readers. ``dataset-bench`` measures the same readers warm and cold,
with memory; this script adds the webdataset comparison. Usage::

    python benchmarks/bench_readers.py --images 2000            # a few minutes on 2 cores
    python benchmarks/bench_readers.py --quick                  # seconds, for CI
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing

import torch  # noqa: E402

from dataset_bench.cache import CacheControl  # noqa: E402
from dataset_bench.machine import machine_info, machine_label  # noqa: E402
from dataset_bench.measure import eval_transform, measure_format, measure_loader, measure_naive  # noqa: E402
from dataset_bench.synth import generate_image_folder  # noqa: E402
from dataset_bench.targets import dataset_target, folder_target, pack_formats  # noqa: E402
from readers.contract.spec import FORMATS  # noqa: E402

READERS = ("naive-folder", "webdataset") + FORMATS
MODES = ("bytes", "decoded")


def _wds_eval(sample: tuple[bytes, Any]) -> tuple[Any, int]:
    data, label = sample
    return eval_transform()(data), int(label)


def webdataset_loader(shards: list[str], batch_size: int, workers: int, decode: bool) -> Any:
    """The official reader over our shards, the way its README feeds a DataLoader."""
    import webdataset as wds

    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).shuffle(1000).to_tuple("jpg;png", "cls")
    if decode:
        ds = ds.map(_wds_eval)
    kw = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return torch.utils.data.DataLoader(ds.batched(batch_size, partial=True), batch_size=None,
                                       num_workers=workers, **kw)


def cases(src: Path, packed: dict[str, Path], batch_size: int, workers_list: list[int]) -> dict[str, Callable]:
    """name -> a function that measures one pass (``reader/mode/wN``)."""
    shards = sorted(str(p) for p in packed["wds"].glob("*.tar"))
    out: dict[str, Callable] = {}
    for w in workers_list:
        out[f"naive-folder/decoded/w{w}"] = lambda w=w: measure_naive(src, num_workers=w, batch_size=batch_size)
        for mode in MODES:
            out[f"webdataset/{mode}/w{w}"] = lambda w=w, mode=mode: measure_loader(
                lambda: webdataset_loader(shards, batch_size, w, mode == "decoded"))
            for fmt, root in packed.items():
                out[f"{fmt}/{mode}/w{w}"] = lambda w=w, mode=mode, root=root: measure_format(
                    root, mode="raw" if mode == "bytes" else "decoded", num_workers=w, batch_size=batch_size)
    return out


def run(images: int, repeats: int, batch_size: int, workers_list: list[int], workdir: Path) -> dict[str, float]:
    """Generate, pack, warm the page cache, then the median samples/s of every case."""
    src = generate_image_folder(workdir / "src", images, classes=10)
    packed = pack_formats(src, workdir / "packed", FORMATS, workers=2, shard_size=16 << 20)
    CacheControl.warm(folder_target(src).files + [f for p in packed.values() for f in dataset_target(p).files])
    todo = cases(src, packed, batch_size, workers_list)
    rates: dict[str, list[float]] = {name: [] for name in todo}
    for rep in range(repeats):  # interleaved: load from elsewhere on the machine hits every case alike
        for name, measure in todo.items():
            rates[name].append(measure().samples_per_s)
            print(f"  [{rep + 1}/{repeats}] {name:28s} {rates[name][-1]:9.0f} samples/s", file=sys.stderr, flush=True)
    return {name: statistics.median(r) for name, r in rates.items()}


def report(results: dict[str, float], workers_list: list[int]) -> str:
    lines = [f"{'reader':12s} {'mode':8s} " + " ".join(f"{'w=' + str(w):>9s}" for w in workers_list)
             + "   vs naive (w=max)  vs webdataset (w=max)"]
    wmax = max(workers_list)
    naive = results[f"naive-folder/decoded/w{wmax}"]
    for reader in READERS:
        for mode in MODES:
            if f"{reader}/{mode}/w{wmax}" not in results:
                continue
            rates = [results[f"{reader}/{mode}/w{w}"] for w in workers_list]
            ref = results[f"webdataset/{mode}/w{wmax}"]
            lines.append(f"{reader:12s} {mode:8s} " + " ".join(f"{r:9.0f}" for r in rates)
                         + f"   {rates[-1] / naive:15.2f}x  {rates[-1] / ref:20.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="0,2")
    p.add_argument("--quick", action="store_true", help="tiny run (CI: proves the script works)")
    p.add_argument("--json", type=Path)
    p.add_argument("--workdir", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.repeats, args.batch_size = 60, 1, 16
    try:
        workers_list = [int(w) for w in args.workers.split(",")]
    except ValueError:
        p.error(f"--workers: expected comma-separated whole numbers, got {args.workers!r}")
    with tempfile.TemporaryDirectory(prefix="bench-readers-") as tmp:
        results = run(args.images, args.repeats, args.batch_size, workers_list, args.workdir or Path(tmp))
    machine = machine_info()
    print(f"reader throughput, samples/s (median of {args.repeats}, warm page cache), {args.images} images "
          f"~480x400 JPEG, batch {args.batch_size}; machine: {machine_label(machine)}")
    print(report(results, workers_list))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "images": args.images, "repeats": args.repeats,
                                         "batch_size": args.batch_size, "machine": machine}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
