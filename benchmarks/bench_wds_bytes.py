"""WebDataset bytes against our LMDB (issue 37, item 2): samples/s of ``decode=False`` batches with
``make_loader``'s defaults, 0 and 2 workers, each measurement in a fresh interpreter, wds and lmdb
interleaved round by round, and the ratio wds / lmdb of each round.

N ImageNet-like JPEGs (``dataset_bench.synth``, ~95 KB each; default 5,000) are packed with the real
packer (``--no-validate``) into wds and lmdb under ``--workdir`` (kept between runs). One measurement
(``--probe``) builds ``make_loader(open_dataset(path, decode=False), batch_size=64, num_workers=W)``
(no ``workers=``: what the library picks), draws 5 warm-up batches and times batches over as many
passes as it takes to fill ``--seconds``, as ``dataset-bench --peers`` times a read case. The page
cache is warm (the packs were just written or read). ``--trees`` measures other checkouts of the
project in the same rounds (e.g. the main checkout beside a branch: before and after). Run from the
repository root::

    python benchmarks/bench_wds_bytes.py --workdir /tmp/wdsbench --rounds 5
    python benchmarks/bench_wds_bytes.py --quick          # at most 200 images and 0.3 s windows, 1 round
    python benchmarks/bench_wds_bytes.py --workers 0 --bounds --rounds 5   # and the bound of a copying reader

``--bounds`` adds, with 0 workers, the copy alone (:func:`probe_copy`) and LMDB read by hand
(:func:`probe_lmdb_by_hand`), and prints how far any reader that copies each sample once could lead
LMDB by hand on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path and "--probe" not in sys.argv[1:]:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing (a probe: the tree it measures)

FORMATS = ("wds", "lmdb")


def _timed(one_pass: Callable[[], Iterable[int]], seconds: float) -> tuple[float, int]:
    """Samples/s and samples counted: ``one_pass()`` yields each batch's sample count; 5 warm-up batches,
    then passes until ``seconds`` have gone by (at the end of a pass)."""
    drawn, samples, start = 0, 0, None
    while True:
        for n in one_pass():
            drawn += 1
            if start is None:
                if drawn >= 5:
                    start = time.perf_counter()
                continue
            samples += n
        if start is not None and time.perf_counter() - start >= seconds and samples:
            return samples / (time.perf_counter() - start), samples


def probe(path: str, workers: int, seconds: float) -> dict[str, Any]:
    """One measurement in this process (see the module docstring)."""
    from readers import make_loader, open_dataset

    loader = make_loader(open_dataset(path, decode=False), batch_size=64, num_workers=workers, pin_memory=False)
    rate, samples = _timed(lambda: (len(batch[1]) for batch in loader), seconds)
    return {"rate": rate, "loader": type(loader).__name__, "samples": samples}


def probe_copy(path: str, seconds: float) -> dict[str, Any]:
    """The copy alone, the bound of any reader that hands over a batch's bytes in one buffer: batches of
    64 samples of the wds pack ``path`` in a random order, copied out of its shards' mappings by
    ``copy_runs`` (the loader's own copy: one call per batch) into a new buffer per batch, with no
    loader, index checks, headers or Python per sample. Timed like :func:`probe`."""
    from readers import open_dataset
    from readers.formats.batch import copy_runs
    from readers.formats.shardbatch import ShardMaps

    ds = open_dataset(path, decode=False)
    mapped = ShardMaps()  # the shards mapped as the loader maps them
    mapped.bind(ds)
    maps = [mapped.get(ds, shard).data for shard in range(len(ds.shard_sizes))]
    shards, starts = ds.sample_shards.astype(np.int64), ds.sample_offsets.astype(np.int64)
    sizes = ds.sample_sizes.astype(np.int64)
    rng = np.random.default_rng(0)
    first = rng.permutation(len(sizes))[:64]  # the bytes copied are the reader's: checked on one batch
    data = np.empty(int(sizes[first].sum()), dtype=np.uint8)
    copy_runs(data, maps, shards[first], starts[first], sizes[first])
    if data.tobytes() != b"".join(bytes(ds.get(int(i))[0]) for i in first):
        raise SystemExit(f"bench_wds_bytes: the copy alone of {path} does not give the reader's bytes")

    def one_pass() -> Iterator[int]:
        order = rng.permutation(len(sizes))
        for a in range(0, len(order), 64):
            idx = order[a:a + 64]
            data = np.empty(int(sizes[idx].sum()), dtype=np.uint8)
            copy_runs(data, maps, shards[idx], starts[idx], sizes[idx])
            yield len(idx)

    rate, samples = _timed(one_pass, seconds)
    return {"rate": rate, "loader": "copy_runs alone", "samples": samples}


def probe_lmdb_by_hand(path: str, seconds: float) -> dict[str, Any]:
    """LMDB read by hand (``dataset_bench.peerreaders.lmdb_bytes``: a ``DataLoader`` with no workers,
    ``txn.get`` per sample, ``bytes`` out), over our LMDB pack ``path``; the best peer of the
    side-by-side runs with no workers. Timed like :func:`probe`."""
    from dataset_bench.peerreaders import lmdb_bytes
    from readers import open_dataset

    labels = np.asarray(open_dataset(path, decode=False).labels)
    loader = lmdb_bytes(path, labels, 64, 0)
    rate, samples = _timed(lambda: (len(batch[1]) for batch in loader), seconds)
    return {"rate": rate, "loader": "LMDB by hand", "samples": samples}


def prepare(work: Path, n: int) -> dict[str, Path]:
    """The image folder and its wds and lmdb packs under ``work`` (made once)."""
    from dataset_bench.synth import generate_image_folder
    from packer import PackOptions, pack

    src = work / f"src-{n}"
    if not src.exists():
        generate_image_folder(src, n)
    out = {}
    for fmt in FORMATS:
        out[fmt] = work / f"{fmt}-{n}"
        if not (out[fmt] / "index.json").exists():
            pack(src, out[fmt], PackOptions(format=fmt, validate=False))
    return out


def _run_probe(tree: Path, path: Path, workers: int | str, seconds: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--probe", str(path), str(workers),
                        str(seconds)], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"bench_wds_bytes: the measurement of {path} in {tree} failed:\n{r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", nargs=3, metavar=("PATH", "WORKERS", "SECONDS"), help=argparse.SUPPRESS)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the images and packs here (default: a temp folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="timing window of one measurement")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--trees", nargs="*", type=Path, default=[ROOT], help="checkouts measured (default: this one)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="at most 200 images and 0.3 s windows, 1 round")
    ap.add_argument("--bounds", action="store_true",
                    help="with 0 workers, also measure the copy alone (copy_runs over the wds pack, the bound of "
                         "any reader that copies each sample once) and LMDB read by hand (the best peer), each "
                         "round, in the first tree")
    args = ap.parse_args(argv)
    if args.probe:
        path, workers, seconds = args.probe
        kinds = {"copy": probe_copy, "byhand": probe_lmdb_by_hand}
        got = kinds[workers](path, float(seconds)) if workers in kinds else probe(path, int(workers), float(seconds))
        print(json.dumps(got))
        return 0
    if args.quick:
        args.images, args.rounds, args.seconds = min(args.images, 200), 1, min(args.seconds, 0.3)
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-wds-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        packs = prepare(work, args.images)
        rows = []
        for r in range(args.rounds):
            for tree in args.trees:
                for w in workers:
                    got = {}
                    for fmt in FORMATS:
                        load = os.getloadavg()[0]
                        m = _run_probe(tree, packs[fmt], w, args.seconds)
                        got[fmt] = m["rate"]
                        rows.append({"round": r, "tree": str(tree), "workers": w, "format": fmt, "load": load, **m})
                        print(f"round {r} {tree} {w} workers {fmt}: {m['rate']:,.0f} samples/s ({m['loader']}, "
                              f"load {load:.1f})", flush=True)
                    print(f"round {r} {tree} {w} workers: wds / lmdb = {got['wds'] / got['lmdb']:.2f}x", flush=True)
                    if args.bounds and w == 0 and tree == args.trees[0]:
                        for kind, fmt in (("copy", "wds"), ("byhand", "lmdb")):
                            load = os.getloadavg()[0]
                            m = _run_probe(tree, packs[fmt], kind, args.seconds)
                            got[kind] = m["rate"]
                            rows.append({"round": r, "tree": str(tree), "workers": kind, "format": fmt, "load": load,
                                         **m})
                            print(f"round {r} {m['loader']} ({fmt} pack): {m['rate']:,.0f} samples/s "
                                  f"(load {load:.1f})", flush=True)
                        print(f"round {r}: wds / LMDB by hand = {got['wds'] / got['byhand']:.2f}x, the copy alone / "
                              f"LMDB by hand = {got['copy'] / got['byhand']:.2f}x, wds / the copy alone = "
                              f"{got['wds'] / got['copy']:.2f}x", flush=True)
    for tree in args.trees:
        for w in workers:
            ratios = []
            for r in range(args.rounds):
                pair = {x["format"]: x["rate"] for x in rows if x["round"] == r and x["tree"] == str(tree)
                        and x["workers"] == w}
                ratios.append(pair["wds"] / pair["lmdb"])
            med = {fmt: statistics.median(x["rate"] for x in rows if x["tree"] == str(tree) and x["workers"] == w
                                          and x["format"] == fmt) for fmt in FORMATS}
            print(f"{tree}, {w} workers: median wds {med['wds']:,.0f}, lmdb {med['lmdb']:,.0f} samples/s; "
                  f"wds / lmdb per round {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x)")
    if args.bounds and 0 in workers:
        med = {k: statistics.median(x["rate"] for x in rows if x["workers"] == k) for k in ("copy", "byhand")}
        wds0 = statistics.median(x["rate"] for x in rows if x["tree"] == str(args.trees[0]) and x["workers"] == 0
                                 and x["format"] == "wds")
        print(f"0 workers, medians: the copy alone {med['copy']:,.0f}, LMDB by hand {med['byhand']:,.0f}, wds "
              f"{wds0:,.0f} samples/s; a reader that copies each sample once reaches at most "
              f"{med['copy'] / med['byhand']:.2f}x LMDB by hand here; wds is at {wds0 / med['copy']:.2f}x the copy alone "
              f"and {wds0 / med['byhand']:.2f}x LMDB by hand")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
