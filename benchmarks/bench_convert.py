"""``pack-dataset convert`` throughput against the raw copy rate, measured in the same run.

One run: generate ``--images`` ImageNet-like JPEGs (``dataset_bench.synth``: ~480x400, ~95 KB), pack them
once into wds, lmdb and hdf5 (``--no-validate``: the packing is not what is measured), read every
data file once (warm page cache), then in each of ``--repeats`` rounds: copy each source format's
data files raw (read all, write one file, fsync) and run every conversion through the Python API.
Medians are reported; ``vs raw`` = conversion MB/s (stored sample bytes) / raw copy MB/s of the same
source (target: >= 0.8 for encoded -> encoded). ``--mmap`` adds wds -> mmap (decode + resize 256)
for reference; it is CPU-bound, not a copy.

    python benchmarks/bench_convert.py                  # 2000 images, 3 rounds
    python benchmarks/bench_convert.py --quick          # seconds (CI smoke test)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing

from dataset_bench.cache import CacheControl  # noqa: E402
from dataset_bench.convert import ENCODED_PAIRS, data_files, format_table, measure_conversions  # noqa: E402
from dataset_bench.machine import load_average, machine_info, machine_label  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from packer import PackOptions, pack  # noqa: E402
from readers.contract.env import available_cpus  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000, help="source JPEGs (default 2000)")
    p.add_argument("--repeats", type=int, default=3, help="rounds, median reported (default 3)")
    p.add_argument("--mmap", action="store_true", help="also wds -> mmap --resize 256 (decodes; for reference)")
    p.add_argument("--tmp", type=Path, help="where to put the data (default: the system temp dir)")
    p.add_argument("--json", type=Path, help="write every timing to this JSON file")
    p.add_argument("--quick", action="store_true", help="tiny run (48 small images, 1 round), for CI")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.tmp))
    try:
        synth = SynthOptions(size=(160, 128)) if args.quick else SynthOptions()
        n = 48 if args.quick else args.images
        repeats = 1 if args.quick else args.repeats
        make_imagenet_like(work / "src", n, 10, synth, threads=1 if args.quick else available_cpus())
        sources = {}
        for fmt in ("wds", "lmdb", "hdf5"):
            sources[fmt] = work / fmt
            pack(work / "src", sources[fmt], PackOptions(format=fmt, validate=False, workers=1))
        shutil.rmtree(work / "src")
        CacheControl.warm([p for root in sources.values() for p in data_files(root)])
        pairs = list(ENCODED_PAIRS) + ([("wds", "mmap")] if args.mmap else [])
        machine = machine_info()
        print(f"machine: {machine_label(machine)}")
        load_before = load_average()
        result = measure_conversions(sources, pairs, work, repeats, options={"mmap": {"resize": 256}},
                                     progress=lambda line: print("  " + line, flush=True))
        load_after = load_average()
        print(f"\nConverting {n} samples ({result['rows'][0]['mb']:.1f} MB stored), median of {repeats}, "
              "warm page cache, Python API, 1 process (encoded -> encoded copies need no workers):")
        print(format_table(result))
        print(f"load average (1 min) before/after: {load_before or 0:.1f} / {load_after or 0:.1f} "
              f"on {machine['usable_cpus']} usable CPUs (other work on the machine skews the figures)")
        if args.json:
            args.json.write_text(json.dumps({"images": n, "repeats": repeats, "machine": machine,
                                             "load_average_before_after": [load_before, load_after],
                                             "finished": time.time(), **result}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
