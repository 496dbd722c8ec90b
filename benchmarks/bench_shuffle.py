#!/usr/bin/env python
"""Shuffle quality of each reader on ImageNet's shape, simulated from the index alone.

Runs ``readers.order.quality.simulate`` (the readers' real order code on a synthetic
index: 1000 classes x 1,281 images, 8 ranks x 8 workers, batch 256, wds shards
of 256 MB at ~110 KB per image; no data is read) for every format with its
defaults, then for wds packed in source (class-sorted) order with 1 and 4 open
shards per worker, and prints a markdown table. Takes a few seconds.

Usage::

    python benchmarks/bench_shuffle.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

from readers.order.quality import IMAGENET, simulate
from readers.contract.spec import DEFAULT_ORDER, FORMATS

CASES = [(fmt, {}) for fmt in FORMATS] + [
    ("wds", {"order": "source", "open_shards": 1}),
    ("wds", {"order": "source", "open_shards": 4}),
    ("wds", {"order": "source", "open_shards": 16}),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    print(f"shape: {IMAGENET}")
    print("| reader | pack order | open shards | distinct classes / batch | uniform | ratio | displacement ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    out = []
    for fmt, kw in CASES:
        t0 = time.perf_counter()
        q = simulate(fmt, **kw)
        order = kw.get("order", DEFAULT_ORDER[fmt])
        shards = str(kw.get("open_shards", 4)) if fmt == "wds" else "-"
        print(f"| {fmt} | {order} | {shards} | {q.distinct:.1f} | {q.expected_distinct:.1f} | "
              f"{q.distinct_ratio:.2f}x | {q.displacement_ratio:.2f}x |  ({time.perf_counter() - t0:.1f} s)")
        out.append({"format": fmt, **kw, **q.as_dict()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
