#!/usr/bin/env python
"""The scale benchmark (issue 22): what each cost does as the number of samples N grows.

Two kinds of dataset, in ``--workdir`` (default ``/work/big/scale``):

* **packs** of tiny images: N JPEGs of 32 x 32 pixels (~1.1 KB each) in
  1,000 class folders, 10,000 distinct ones generated in parallel
  (``--procs``) and hard-linked under new names beyond that, packed with the
  real packer into each format. Measured: the scan (the fastest of three in
  a row, after an ``os.sync()``: the first may read back directory blocks
  that the pack before it evicted), pack images/s and the packer main process's peak RSS, and
  everything below.
* **index-only** datasets: what a reader opens, without the pixels. The
  index arrays are real, at N, written by :func:`readers.contract.spec.write_index`;
  the data files are sparse or tiny (wds: sparse shards the offsets point
  into; lmdb: a 64-image data.mdb, whose open check reads O(1) pages; hdf5:
  a sparse chunked ``/images`` of N samples and its chunk table; mmap: a
  sparse ``images.npy`` of N 32 x 32 images). Nothing is read from them:
  they measure open, per-worker memory, epoch order, ``state_dict`` and
  resume at 14M and 100M samples.

Per format and N (each in a fresh process, so memory figures are its own):

* ``first open``: ``open_dataset`` time the first time on this machine (every
  index array's CRC-32 and values checked), the index arrays read once
  before it so that every N starts from the page cache; ``open``: the next open, as every
  other rank and re-run makes it (the record of passed checks,
  ``readers.contract.checkcache``, skips them for unchanged files; the probe keeps its
  records in a temporary folder of its own, so no record from an earlier run
  makes the first open a later one); the process's
  private memory after the first (``Private_*`` of ``/proc/PID/smaps``, mapped
  files of the dataset counted apart: ``mapped``).
* ``random``: median latency of ``reader.read(i)`` at random i (packs only).
* ``first batch``: ``make_loader(batch_size=256, num_workers=2)`` until its
  first batch (packs only).
* ``worker``: a spawned process (as a ``spawn`` DataLoader worker is) that
  receives the pickled dataset and builds its epoch order (wds: worker 0 of
  rank 0 of 8 ranks x 8 workers; map-style readers: the worker holds only the
  dataset): its private memory above an idle worker's, mapped files apart, after
  the order (``worker private``) and at its peak while it unpickles the dataset and
  builds the order (``worker peak``: private anonymous memory, ``RssAnon``, sampled
  every millisecond, above the idle worker's).
* ``order``: the epoch order of one wds worker (8 x 8) or one map-style rank
  (8 ranks): time (best of 3, without tracemalloc) and tracemalloc peak;
  ``permutation``: ``numpy.random.Generator.permutation`` of as many samples,
  timed the same way, the machine's own cost of a shuffle of that size (both
  grow faster than N where the arrays outgrow the CPU's cache).
* ``state_dict``: bytes of a mid-epoch ``PackedLoader.state_dict()`` as JSON.
* ``resume``: an exact mid-epoch resume of 8 ranks (half an epoch delivered):
  for each rank, the time to compute what it reads next (map-style: the
  sampler's list; wds: each of its 8 workers' orders, which the workers
  compute in parallel: the slowest worker); the slowest rank.
* the **order curve**: the wds worker's epoch order on a shard layout alone
  (no files) at 14M, 100M and 1B samples (``--order``), per sample and per
  10x of N, next to numpy's permutation of as many samples.
* ``info`` / ``verify``: ``pack-dataset info`` (and for packs ``verify``):
  time and the command's peak RSS.

Each figure is printed with its ratio to the previous N of the same format
(``x``); a cost that grows linearly shows ~10x per 10x of N.

The datasets are built by ``scale_data.py`` beside this file, the tables and the checks made by
``scale_report.py``; here: the probes (each in a child process) and the run.

Usage::

    python benchmarks/bench_scale.py --quick            # 10k packs, 100k (wds only), index-only 1M: ~3 min
    python benchmarks/bench_scale.py --smoke            # 500-image packs, index-only 20k: the test suite's run
    python benchmarks/bench_scale.py                    # 10k / 100k / 1.28M packs, index-only 14M and 100M
    python benchmarks/bench_scale.py --json out.json --keep
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from scale_data import FORMATS, SHARD_SAMPLES, UNIQUE, index_only, make_images, pack_options  # beside this file
from scale_report import checks, curve_table, per_10x, ratios, tables

ROOT = Path(__file__).resolve().parent.parent
RANKS, WORKERS, BATCH = 8, 8, 256

QUICK = {"packs": [10_000, 100_000], "pack_formats": {10_000: FORMATS, 100_000: ("wds",)},
         "index": [1_000_000], "order": [100_000_000, 1_000_000_000]}
FULL = {"packs": [10_000, 100_000, 1_281_167], "pack_formats": {}, "index": [14_000_000, 100_000_000],
        "order": [14_000_000, 100_000_000, 1_000_000_000]}
# the test suite's run (tests/test_bench_scale.py): every step and every format at sizes where no figure means
# anything, so nothing is judged (exit 0 with MISSED lines); --quick and the full run are the checks
SMOKE = {"packs": [500], "pack_formats": {}, "index": [20_000], "order": [1_000_000, 10_000_000]}


# ----------------------------------------------------------------------------- memory
def smaps(pid: int, folder: str | None) -> dict[str, int]:
    """Bytes of ``pid``: ``private`` (USS: Private_Clean + Private_Dirty of every mapping except files under
    ``folder``), ``pss`` (likewise), ``mapped`` (PSS of mappings of files under ``folder``), ``rss``."""
    prefix = None if folder is None else str(Path(folder).resolve()) + os.sep
    out = {"private": 0, "pss": 0, "mapped": 0, "rss": 0}
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split(None, 5)
                inside = prefix is not None and len(parts) == 6 and parts[5].strip().startswith(prefix)
                continue
            if first in ("Private_Clean:", "Private_Dirty:"):
                if not inside:
                    out["private"] += int(line.split()[1]) * 1024
            elif first == "Pss:":
                out["mapped" if inside else "pss"] += int(line.split()[1]) * 1024
            elif first == "Rss:":
                out["rss"] += int(line.split()[1]) * 1024
    return out


def peak_rss() -> int:
    """This process's peak RSS in bytes (``VmHWM``: of this program only; ``ru_maxrss`` also counts
    what the parent held when it forked us)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ----------------------------------------------------------------------------- probes (child processes)
def _child(*args: str, timeout: float = 1800) -> dict[str, Any]:
    """Run ``python bench_scale.py --probe ARGS`` and return the JSON it prints last, plus its peak RSS."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", *args]
    return _run(cmd, timeout)


def _run(cmd: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-4:])}: exit {proc.returncode}: {(err or out).strip()[-2000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    res.setdefault("wall_s", wall)
    return res


def _anon() -> int:
    """This process's private anonymous memory now (``RssAnon``: heap, stacks, private maps), in bytes:
    RSS without the file-backed pages it maps (page cache, counted apart)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class _PeakAnon:
    """Peak of :func:`_anon` sampled every ``interval`` seconds (default 20 ms) on a thread while the
    block runs (the kernel keeps no high-water mark of it)."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval

    def __enter__(self) -> "_PeakAnon":
        import threading

        self.peak, self._stop = _anon(), threading.Event()

        def sample() -> None:
            while not self._stop.wait(self.interval):
                self.peak = max(self.peak, _anon())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _anon())


def probe_pack(src: str, out: str, fmt: str, workers: int) -> dict[str, Any]:
    """Scan, then pack (a fresh process: its own peak RSS is the packer main process's; ``pack_private``
    is its peak private memory, the file-backed pages it maps -- spilled source columns, the journal's
    records, index arrays -- apart)."""
    from packer.api import pack
    from packer.options import PackOptions
    from packer.sources.source import scan

    from dataset_bench.measure import best_time

    scan_s = best_time(lambda: scan(src), 3)  # the first may read directory blocks the pack before it evicted
    before = peak_rss()
    t0 = time.perf_counter()
    with _PeakAnon() as private:
        [result] = pack(src, out, PackOptions(**pack_options(fmt, workers)))
    pack_s = time.perf_counter() - t0
    n = json.loads((Path(out) / "index.json").read_text())["num_samples"]
    return {"scan_s": scan_s, "pack_s": pack_s, "images_per_s": n / pack_s,
            "pack_rss": peak_rss(), "pack_private": private.peak, "scan_rss": before}


def _worker_main(conn: Any, folder: str) -> None:
    """A spawned stand-in for a DataLoader worker: idle memory, then the dataset and its epoch order."""
    import pickle

    import readers.formats.hdf5  # noqa: F401 - what a worker has imported before it gets its dataset
    import readers.formats.lmdb  # noqa: F401
    import readers.formats.mmap  # noqa: F401
    import readers.formats.wds  # noqa: F401
    from readers.contract.env import WorkerEnv, release_freed_memory

    release_freed_memory()  # as the worker does after its order: both figures without the heap's freed pages
    idle = smaps(os.getpid(), folder)
    data = conn.recv_bytes()
    idle_anon = _anon()
    with _PeakAnon(interval=0.001) as during:  # the peak while it unpickles the dataset and builds its order
        ds = pickle.loads(data)
        if hasattr(ds, "sample_order"):
            order = ds.sample_order(WorkerEnv(0, RANKS, 0, WORKERS))
            first = int(order[0]) if len(order) else -1
        else:
            first = int(ds.labels[0])
    busy = smaps(os.getpid(), folder)
    conn.send({"idle": idle, "busy": busy, "first": first, "peak": during.peak - idle_anon})
    conn.close()


def _warm(folder: str) -> None:
    """Read the index arrays once, so that the first open's figure is its checks' work at any N
    (otherwise pages still cached from writing them at a small N meet pages read back from disk at
    a large one). The data files stay as they are: a reader's open does not read them."""
    import readers.contract.spec as spec

    for path in sorted(Path(folder).glob("*.npy")):
        if path.name not in spec.DATA_FILE.values():
            with path.open("rb") as f:
                while f.read(16 << 20):
                    pass


def probe_read(folder: str, packed: bool) -> dict[str, Any]:
    """Open, memory, random access, first batch, worker memory, order, state_dict, resume."""
    import tempfile

    import readers.contract.checkcache as checkcache
    import readers.formats.hdf5  # noqa: F401 - imported before the clock starts: open is not an import
    import readers.formats.lmdb  # noqa: F401
    import readers.formats.mmap  # noqa: F401
    import readers.formats.wds  # noqa: F401
    import readers.loader.dataloader  # noqa: F401

    # a record of passed checks left from an earlier run on this machine would make the "first" open a
    # later one: this process keeps its records in a folder of its own, removed at its end
    records = tempfile.mkdtemp(prefix="bench-scale-checked-")
    os.environ[checkcache.ENV_DIR] = records
    try:
        return _probe_read(folder, packed)
    finally:
        shutil.rmtree(records, ignore_errors=True)


def _probe_read(folder: str, packed: bool) -> dict[str, Any]:
    import pickle

    import readers
    import readers.contract.env as env
    from dataset_bench.measure import best_time
    from readers.contract.env import WorkerEnv
    from readers.order.sampler import EpochSampler

    _warm(folder)
    base = smaps(os.getpid(), folder)
    t0 = time.perf_counter()
    ds = readers.open_dataset(folder)
    open_s = time.perf_counter() - t0
    after = smaps(os.getpid(), folder)
    # again, as every later open on this machine (another rank, a re-run): the record of the checks that
    # passed (readers.contract.checkcache) lets it skip the O(N) CRC and value checks of unchanged files
    t0 = time.perf_counter()
    readers.open_dataset(folder).close()
    open_again_s = time.perf_counter() - t0
    res: dict[str, Any] = {"open_first_s": open_s, "open_s": open_again_s,
                           "open_private": after["private"] - base["private"], "open_mapped": after["mapped"]}
    n = len(ds.labels)
    wds = hasattr(ds, "sample_order")
    if packed:
        rng = random.Random(0)
        picks = [rng.randrange(n) for _ in range(200)]
        ds.read(picks[0])
        times = []
        for i in picks[1:]:
            t = time.perf_counter()
            ds.read(i)
            times.append(time.perf_counter() - t)
        res["random_us"] = statistics.median(times) * 1e6
        t0 = time.perf_counter()
        loader = readers.make_loader(folder, batch_size=BATCH, num_workers=2)
        it = iter(loader)
        next(it)
        res["first_batch_s"] = time.perf_counter() - t0
        del it, loader
    # a spawned worker
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_worker_main, args=(theirs, folder))
    proc.start()
    theirs.close()
    mine.send_bytes(pickle.dumps(ds))
    got = mine.recv()
    proc.join()
    mine.close()
    res["worker_private"] = got["busy"]["private"] - got["idle"]["private"]
    res["worker_peak"] = got["peak"]
    res["worker_idle_private"] = got["idle"]["private"]
    res["worker_mapped"] = got["busy"]["mapped"]
    # epoch order of one worker (wds) or one rank (map-style), time and tracemalloc peak
    hook = env.worker_env_hook
    try:
        if wds:
            def order(rank: int, worker: int = 0) -> np.ndarray:
                return ds.sample_order(WorkerEnv(rank, RANKS, worker, WORKERS), epoch=1)
        else:
            sampler = EpochSampler(n, shuffle=True, seed=0, distributed=True)
            sampler.set_epoch(1)

            def order(rank: int, worker: int = 0) -> np.ndarray:
                env.worker_env_hook = lambda: WorkerEnv(rank, RANKS, 0, 1)
                return sampler.indices()
        tracemalloc.start()
        first = order(0)
        res["order_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        res["order_s"] = best_time(lambda: order(0), 3)  # timed apart: tracemalloc slows numpy's allocations
        # the machine's own cost of shuffling that many samples (numpy's permutation, the same best of 3): beyond
        # the CPU's cache every random access costs more, so this baseline grows faster than N too
        res["order_base_s"] = best_time(lambda: np.random.default_rng(0).permutation(len(first)), 3)
        # state_dict in the middle of epoch 1, as a loader with 8 ranks x 8 workers saves it
        per_rank = len(first) * (WORKERS if wds else 1)
        delivered = max(1, per_rank // BATCH // 2)
        env.worker_env_hook = lambda: WorkerEnv(0, RANKS, 0, 1)
        loader = readers.make_loader(ds, batch_size=BATCH, num_workers=WORKERS if wds else 2,
                                     **({} if wds else {"distributed": True}))
        state = loader.state_dict()
        if wds:  # each worker delivers its share round-robin: the loader counts batches, not workers
            state.update(world_size=RANKS, num_workers=WORKERS)
        state.update(epoch=1, delivered=delivered)
        res["state_bytes"] = len(json.dumps(state))
        point = {k: v for k, v in state.items() if k not in ("version", "epoch", "finished")}
        point["exact"] = True
        worst = 0.0  # the slowest rank; a wds rank's workers compute their orders in parallel: its slowest worker
        tracemalloc.start()
        for rank in range(RANKS):
            if wds:
                ds.resume_at(point)
                for w in range(WORKERS):
                    t0 = time.perf_counter()
                    ds.sample_order(WorkerEnv(rank, RANKS, w, WORKERS), epoch=1)
                    worst = max(worst, time.perf_counter() - t0)
                ds.resume_at(None)
            else:
                t0 = time.perf_counter()
                env.worker_env_hook = lambda rank=rank: WorkerEnv(rank, RANKS, 0, 1)
                sampler.resume = point
                sampler.indices()
                sampler.resume = None
                worst = max(worst, time.perf_counter() - t0)
        res["resume_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        res["resume_s"] = worst
    finally:
        env.worker_env_hook = hook
    return res


def probe(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "pack":
        res = probe_pack(argv[1], argv[2], argv[3], int(argv[4]))
    elif kind == "read":  # read FOLDER packed|index [COMMAND...]: then pack-dataset COMMAND FOLDER in this process
        res = probe_read(argv[1], argv[2] == "packed")
        for command in argv[3:]:
            res.update(probe_cli(command, argv[1]))
    elif kind == "cli":
        res = probe_cli(argv[1], argv[2])
    else:
        raise SystemExit(f"unknown probe {kind}")
    print(json.dumps(res))
    return 0


def probe_cli(command: str, folder: str) -> dict[str, Any]:
    """``pack-dataset COMMAND FOLDER`` in this process (its output discarded): seconds and peak RSS."""
    import contextlib
    import io

    from packer.cli import main as pack_dataset

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = pack_dataset([command, folder])
    if code:
        raise SystemExit(f"pack-dataset {command} {folder}: exit {code}")
    return {f"{command}_s": time.perf_counter() - t0, f"{command}_rss": peak_rss()}


def cli(command: str, folder: Path) -> dict[str, Any]:
    """``pack-dataset COMMAND FOLDER``: seconds and peak RSS, in a fresh process."""
    res = _child("cli", command, str(folder))
    return {k: res[k] for k in (f"{command}_s", f"{command}_rss")}


def reads(args: argparse.Namespace, folder: Path, kind: str, commands: list[str]) -> dict[str, Any]:
    """The read probe, then ``pack-dataset COMMAND`` for each command, each in a fresh process; in a
    ``--smoke`` run all in one process (a fresh one costs an import of torch, and nothing is judged there:
    the commands' RSS figures then include the read's)."""
    if args.smoke:
        return _child("read", str(folder), kind, *commands)
    res = _child("read", str(folder), kind)
    for command in commands:
        res.update(cli(command, folder))
    return res


# ----------------------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    packs = args.packs if args.packs is not None else sizes["packs"]
    index_sizes = args.index if args.index is not None else sizes["index"]
    rows: list[dict[str, Any]] = []
    for n in packs:
        src = work / ("images-unique" if n == UNIQUE else f"images-{n}")
        gen = make_images(src, n, args.procs, work / "images-unique")
        os.sync()  # the new folders' dirty inodes written back now, not during the scans that follow
        print(f"# {n:,} images: {gen:.1f} s to generate", flush=True)
        for fmt in args.formats:
            if fmt not in sizes["pack_formats"].get(n, FORMATS) or (n > 100_000 and fmt not in args.large_formats):
                continue
            out = work / "packs" / f"{fmt}-{n}"
            row: dict[str, Any] = {"format": fmt, "n": n, "kind": "pack"}
            row.update(_child("pack", str(src), str(out), fmt, str(args.workers)))
            payload = sum(p.stat().st_size for p in src.rglob("*.JPEG"))
            files = json.loads((out / "index.json").read_text())["files"]  # the data files, not the index
            row["disk_ratio"] = sum(files.values()) / payload
            commands = ["info", "verify"] if n <= args.verify_max else ["info"]
            row.update(reads(args, out, "packed", commands))
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(out)
        if not args.keep and src != work / "images-unique":
            shutil.rmtree(src)
    if not args.keep:
        shutil.rmtree(work / "images-unique", ignore_errors=True)
    for n in index_sizes:
        for fmt in args.formats:
            t0 = time.perf_counter()
            folder = index_only(work, fmt, n)
            row = {"format": fmt, "n": n, "kind": "index-only", "build_s": time.perf_counter() - t0}
            row.update(reads(args, folder, "index", ["info"]))
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(folder)
    rows.sort(key=lambda r: (FORMATS.index(r["format"]), r["n"]))
    ratios(rows)
    if not args.keep:
        for name in ("template", "template-images", "packs", "index"):
            shutil.rmtree(work / name, ignore_errors=True)
    return rows


def order_curve(sizes: list[int]) -> list[dict[str, Any]]:
    """The wds epoch order of one worker (rank 0 of 8 x 8 workers) computed on a shard layout alone (shards of
    ``SHARD_SAMPLES``, no files), up to sizes no index-only dataset here reaches: best of 3 per size, and
    numpy's permutation of as many samples (the machine's own cost of a shuffle that size).

    Between sizes whose shares fit the CPU's cache and sizes whose shares do not, every cost per sample
    steps up once; past the cache it is flat again. The curve shows both."""
    from dataset_bench.measure import best_time
    from readers.contract.env import WorkerEnv
    from readers.order.epoch import ShardLayout, ShardSettings, worker_order

    rows = []
    for n in sizes:
        layout = ShardLayout.from_sizes([SHARD_SAMPLES] * (n // SHARD_SAMPLES) + [n % SHARD_SAMPLES] * bool(n % SHARD_SAMPLES))
        share = len(worker_order(layout, ShardSettings(), 1, WorkerEnv(0, RANKS, 0, WORKERS)))
        s = best_time(lambda: worker_order(layout, ShardSettings(), 1, WorkerEnv(0, RANKS, 0, WORKERS)), 3)
        base = best_time(lambda: np.random.default_rng(0).permutation(share), 3)
        rows.append({"n": n, "share": share, "order_s": s, "order_base_s": base})
        del layout
    for prev, row in zip(rows, rows[1:]):
        step = row["n"] / prev["n"]
        row["per10"] = per_10x(row["order_s"] / prev["order_s"], step)
        row["base_per10"] = per_10x(row["order_base_s"] / prev["order_base_s"], step)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        return probe(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="10k packs, a 100k wds pack, index-only 1M")
    p.add_argument("--smoke", action="store_true",
                   help="500-image packs, index-only 20k, the order to 10M: every step runs, nothing is judged")
    p.add_argument("--workdir", default="/work/big/scale", help="where data is built (default %(default)s)")
    p.add_argument("--packs", type=int, nargs="*", help="pack sizes (default: 10k 100k 1.28M; --quick: 10k 100k)")
    p.add_argument("--index", type=int, nargs="*", help="index-only sizes (default: 14M 100M; --quick: 1M)")
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--large-formats", nargs="*", default=list(FORMATS), choices=FORMATS,
                   help="formats packed at sizes over 100k (default: all; mmap re-encodes to pixels: slow)")
    p.add_argument("--procs", type=int, default=2, help="processes generating images (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="packer workers (default %(default)s)")
    p.add_argument("--verify-max", type=int,
                   help="run pack-dataset verify on packs of at most this many images (default 100,000; --quick: "
                        "10,000): it decodes every image, ~15 min at 1.28M here")
    p.add_argument("--order", type=int, nargs="*",
                   help="sizes of the epoch-order curve on shard layouts alone (default: 14M 100M 1B; --quick: 100M 1B)")
    p.add_argument("--keep", action="store_true", help="keep the images and datasets (default: deleted)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if args.verify_max is None:
        args.verify_max = 10_000 if args.quick or args.smoke else 100_000
    rows = run(args)
    curve = order_curve(args.order if args.order is not None else
                        (SMOKE if args.smoke else QUICK if args.quick else FULL)["order"])
    print(tables(rows))
    print()
    print(curve_table(curve))
    bad = checks(rows, curve)
    for line in bad:
        print("MISSED:", line)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "order_curve": curve, "missed": bad}, indent=1))
    return 1 if bad and not args.smoke else 0  # the benchmark's own check: a missed figure fails the run


if __name__ == "__main__":
    sys.exit(main())

