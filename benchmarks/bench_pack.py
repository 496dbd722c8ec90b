"""Packing throughput of every format, against the raw copy rate of the same bytes.

One run on one machine:

1. generates an ImageNet-like folder in a temp dir: ``--images`` JPEGs (default 1000) of about
   480x400 pixels, quality 90, ~100 KB each, in ``--classes`` class folders (default 10), cut from
   the bundled real photos (examples/real-images: random crop, scale, flip, plus Gaussian
   sensor-like noise of std-dev 16, so they look like photos and are not trivially compressible);
2. reads every source file once, so the page cache is warm for every measurement below;
3. measures the baseline: read every file and write them concatenated into one file on the
   same filesystem as the packed outputs, fsync at the end (what any packer must at least do);
4. packs with each format, ``workers=1`` and ``workers=2``, validation on (the default) and
   ``validate=False``; every configuration ``--repeats`` times (default 3), median reported.

mmap stores decoded pixels, so it runs with ``resize=256`` (256x256x3 per image, the usual
ImageNet training-side size); the other formats store the JPEG bytes unchanged. Throughput is
counted in source images and source MB per second. The Python API (``packer.pack``) is called
directly, so the CLI's interpreter start-up, imports and progress bar (~0.3 s per run) are not
in the figures. Output folders are deleted between runs (not timed).

Usage::

    python benchmarks/bench_pack.py                    # full run, a few minutes on 2 cores
    python benchmarks/bench_pack.py --json pack.json   # also write every timing as JSON
    python benchmarks/bench_pack.py --quick            # tiny version, seconds (CI smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing

from dataset_bench.cache import CacheControl  # noqa: E402
from dataset_bench.machine import load_average, machine_info, machine_label  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from packer import PackOptions, pack  # noqa: E402
from readers.contract.env import available_cpus  # noqa: E402
from readers.contract.spec import FORMATS  # noqa: E402

MMAP_RESIZE = 256


# ---------------------------------------------------------------- the source folder


def make_source(root: Path, images: int, classes: int, size: tuple[int, int], quality: int, noise: float,
                seed: int, threads: int) -> tuple[int, int]:
    """Write ``root/n000000xx/img_xxxxxxx.JPEG`` (dataset_bench.synth); return (files, bytes)."""
    make_imagenet_like(root, images, classes, SynthOptions(size=size, quality=quality, noise=noise, seed=seed),
                       threads=threads)
    files = source_files(root)
    return len(files), sum(p.stat().st_size for p in files)


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# ---------------------------------------------------------------- measurements


def raw_copy(files: list[Path], dest: Path) -> float:
    """Read every file, write them concatenated to ``dest``, fsync: seconds."""
    t0 = time.perf_counter()
    with open(dest, "wb") as out:
        for p in files:
            with open(p, "rb") as f:
                out.write(f.read())
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - t0
    dest.unlink()
    return seconds


def time_pack(src: Path, out: Path, options: PackOptions) -> float:
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    results = pack(src, out, options)
    seconds = time.perf_counter() - t0
    assert results and results[0].rejected == 0, results
    return seconds


def out_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def measure_rounds(src: Path, outs: Path, configs: list[tuple], repeats: int) -> tuple[list[float], dict, dict]:
    """Every configuration once per round, rounds repeated: a burst of load from elsewhere on the machine
    then spreads over all configurations instead of spoiling one of them. (raw runs, runs, output sizes)."""
    files = source_files(src)
    raw_runs: list[float] = []
    runs: dict[tuple, list[float]] = {c: [] for c in configs}
    sizes: dict[tuple, int] = {}
    for rnd in range(repeats):
        raw_runs.append(raw_copy(files, outs / "raw.bin"))
        for fmt, wk, validate in configs:
            opts = PackOptions(format=fmt, workers=wk, validate=validate,
                               resize=MMAP_RESIZE if fmt == "mmap" else None)
            out = outs / f"{fmt}-w{wk}-{'v' if validate else 'nv'}"
            runs[(fmt, wk, validate)].append(time_pack(src, out, opts))
            sizes[(fmt, wk, validate)] = out_bytes(out)
            shutil.rmtree(out)
        print(f"  round {rnd + 1}/{repeats}: raw {raw_runs[-1]:.3f} s, "
              + ", ".join(f"{c[0]}/w{c[1]}/{'v' if c[2] else 'nv'} {runs[c][-1]:.2f} s" for c in configs), flush=True)
    return raw_runs, runs, sizes


def summarize(n: int, mb: float, raw_runs: list[float], runs: dict, sizes: dict) -> tuple[dict, list[dict]]:
    """Medians, rates and ratios: (raw copy, one row per configuration)."""
    raw_s = statistics.median(raw_runs)
    raw = {"runs_s": raw_runs, "median_s": raw_s, "images_per_s": n / raw_s, "mb_per_s": mb / raw_s, "mb": mb}
    rows = []
    for (fmt, wk, validate), times in runs.items():
        med = statistics.median(times)
        rows.append({"format": fmt, "workers": wk, "validate": validate, "runs_s": times,
                     "median_s": med, "images_per_s": n / med, "mb_per_s": mb / med,
                     "out_mb": sizes[(fmt, wk, validate)] / 1e6, "vs_raw": (mb / med) / raw["mb_per_s"],
                     "resize": MMAP_RESIZE if fmt == "mmap" else None})
    for r in rows:  # 1 -> N worker scaling, same format and validation
        base = next((b for b in rows if b["format"] == r["format"] and b["validate"] == r["validate"]
                     and b["workers"] == 1), None)
        if base and r["workers"] != 1:
            r["scaling_1_to_2" if r["workers"] == 2 else f"scaling_1_to_{r['workers']}"] = (
                base["median_s"] / r["median_s"])
    return raw, rows


# ---------------------------------------------------------------- report


def table(rows: list[dict], raw: dict) -> str:
    header = (f"{'format':<6} {'workers':>7} {'validate':>8} {'median s':>9} {'img/s':>8} {'MB/s in':>8} "
              f"{'MB out':>8} {'vs raw':>7} {'1->2 w':>7}")
    lines = [header, "-" * len(header)]
    lines.append(f"{'raw':<6} {'-':>7} {'-':>8} {raw['median_s']:9.3f} {raw['images_per_s']:8.0f} "
                 f"{raw['mb_per_s']:8.1f} {raw['mb']:8.1f} {1.0:7.2f} {'-':>7}")
    for r in rows:
        scaling = f"{r['scaling_1_to_2']:.2f}x" if r.get("scaling_1_to_2") else "-"
        lines.append(f"{r['format']:<6} {r['workers']:>7} {('on' if r['validate'] else 'off'):>8} "
                     f"{r['median_s']:9.3f} {r['images_per_s']:8.0f} {r['mb_per_s']:8.1f} {r['out_mb']:8.1f} "
                     f"{r['vs_raw']:7.3f} {scaling:>7}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=1000, help="source JPEGs (default 1000)")
    p.add_argument("--classes", type=int, default=10, help="class folders (default 10)")
    p.add_argument("--size", default="480x400", help="approximate WxH of the JPEGs (default 480x400, +-40 px)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of the source (default 90)")
    p.add_argument("--noise", type=float, default=16.0,
                   help="std-dev of the added Gaussian noise, 0-255 scale (default 16: ~100 KB per 480x400 JPEG)")
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration, median reported (default 3)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated (default {','.join(FORMATS)})")
    p.add_argument("--tmp", type=Path, help="where to put the source and outputs (default: the system temp dir)")
    p.add_argument("--json", type=Path, help="write every timing and the settings to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny run (32 small images, 1 repeat), for CI")
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.classes, args.size, args.repeats = 32, 4, "160x128", 1
    try:
        args.wh = tuple(int(v) for v in args.size.lower().split("x"))
        args.worker_counts = [int(v) for v in args.workers.split(",")]
    except ValueError:
        p.error(f"--size WxH and --workers N,N,... take whole numbers, got {args.size!r} and {args.workers!r}")
    args.format_list = [f for f in args.formats.split(",") if f]
    unknown = set(args.format_list) - set(FORMATS)
    if unknown:
        p.error(f"unknown formats {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    (w, h), workers, formats = args.wh, args.worker_counts, args.format_list
    work = Path(tempfile.mkdtemp(prefix="bench-pack-", dir=args.tmp))
    try:
        src, outs = work / "src", work / "out"
        outs.mkdir()
        t0 = time.perf_counter()
        n, nbytes = make_source(src, args.images, args.classes, (w, h), args.quality, args.noise, args.seed,
                                threads=1 if args.quick else max(1, available_cpus()))
        gen_s, mb, machine = time.perf_counter() - t0, nbytes / 1e6, machine_info()
        print(f"source: {n} JPEGs in {args.classes} classes, ~{w}x{h}, q{args.quality}, "
              f"{mb:.1f} MB ({nbytes / n / 1e3:.0f} KB/image), generated in {gen_s:.1f} s under {work}")
        print(f"machine: {machine_label(machine)}")
        CacheControl.warm(source_files(src))  # page cache warm for every measurement
        configs = [(fmt, wk, validate) for fmt in formats for validate in (True, False) for wk in workers]
        load_before = load_average()
        raw_runs, runs, sizes = measure_rounds(src, outs, configs, args.repeats)
        load_after = load_average()
        raw, rows = summarize(n, mb, raw_runs, runs, sizes)
        print()
        print(f"Packing {n} images ({mb:.1f} MB), median of {args.repeats}; page cache warm; "
              f"mmap with resize={MMAP_RESIZE} (decodes pixels), others store the JPEG bytes;")
        print("'vs raw' = packing MB/s / raw-copy MB/s (read all + write one file + fsync); "
              "'1->2 w' = speed-up of 2 workers over 1; Python API (no CLI start-up).")
        print(table(rows, raw))
        print(f"load average (1 min) before/after: {load_before or 0:.1f} / {load_after or 0:.1f} "
              f"on {machine['usable_cpus']} usable CPUs (other work on the machine skews the figures)")
        if args.json:
            args.json.write_text(json.dumps({
                "settings": {"images": n, "classes": args.classes, "size": [w, h], "quality": args.quality,
                             "noise": args.noise, "repeats": args.repeats, "workers": workers, "formats": formats,
                             "mmap_resize": MMAP_RESIZE, "quick": args.quick, "seed": args.seed},
                "machine": machine, "source": {"files": n, "bytes": nbytes, "generate_s": gen_s},
                "load_average_before_after": [load_before, load_after], "raw_copy": raw, "results": rows,
            }, indent=1))
            print(f"results written to {args.json}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
