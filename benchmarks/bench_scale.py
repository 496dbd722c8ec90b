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
  dataset): its private memory above an idle worker's, mapped files apart.
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

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("wds", "lmdb", "hdf5", "mmap")
CLASSES = 1000
IMAGE_BYTES = 700  # index-only: stored bytes of each sample (a 32 x 32 JPEG is 0.7-1.2 KB)
RANKS, WORKERS, BATCH = 8, 8, 256
SHARD_SAMPLES = 10_000  # index-only wds: samples per shard

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


# ----------------------------------------------------------------------------- building data
UNIQUE = 10_000  # distinct JPEGs generated; larger sets hard-link them under new names (same class)


def make_images(root: Path, n: int, procs: int, base: Path | None = None) -> float:
    """``n`` 32 x 32 JPEGs in 1,000 class folders (kept between runs); seconds spent.

    At most :data:`UNIQUE` are generated (in ``base``); image ``i`` of a larger set is a hard link
    to distinct image ``i % UNIQUE``, which has the same class: the packer still lists, reads and
    writes ``n`` files (1.28M in a minute instead of an hour of JPEG encoding)."""
    from dataset_bench.synth import SynthOptions, make_imagenet_like

    t0 = time.perf_counter()
    done = root / ".complete"
    if done.exists():
        return time.perf_counter() - t0
    if n <= UNIQUE or base is None:
        make_imagenet_like(root, n, classes=min(CLASSES, n), options=SynthOptions(size=(32, 32), jitter=0, noise=4.0),
                           processes=procs)
    else:
        make_images(base, UNIQUE, procs)
        for c in range(CLASSES):
            (root / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = f"n{i % CLASSES:08d}/img_{i:07d}.JPEG"
            if not os.path.exists(root / name):
                os.link(base / f"n{i % CLASSES:08d}/img_{i % UNIQUE:07d}.JPEG", root / name)
    done.write_text(str(n))
    return time.perf_counter() - t0


def pack_options(fmt: str, workers: int) -> dict[str, Any]:
    return {"format": fmt, "workers": workers, "overwrite": True, **({"resize": 32} if fmt == "mmap" else {})}


def template(work: Path, fmt: str) -> Path:
    """A 64-image pack of ``fmt``: the metadata (and for lmdb the data file) an index-only dataset starts from."""
    out = work / "template" / fmt
    if not (out / "index.json").exists():
        from packer.api import pack
        from packer.options import PackOptions

        src = work / "template-images"
        make_images(src, 64, 1)
        pack(src, out, PackOptions(**pack_options(fmt, 1)))
    return out


def index_only(work: Path, fmt: str, n: int) -> Path:
    """An index-only dataset of ``fmt`` with ``n`` samples (see the module doc); kept between runs."""
    from readers.contract import spec

    out = work / "index" / f"{fmt}-{n}"
    if (out / spec.INDEX_NAME).exists():
        return out
    tpl = template(work, fmt)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    meta = json.loads((tpl / spec.INDEX_NAME).read_text())
    for key in ("index_arrays", "files_crc32", "spec_version", "checksum"):
        meta.pop(key, None)
    i = np.arange(n, dtype=np.int64)
    labels = (i % CLASSES).astype(np.int32)
    arrays: dict[str, np.ndarray] = {"labels": labels, "checksums": np.zeros(n, np.uint32),
                                     "sizes": np.full(n, IMAGE_BYTES, np.int64)}
    meta.update(num_samples=n, class_counts=np.bincount(labels, minlength=CLASSES).tolist(),
                classes=[f"n{c:08d}" for c in range(CLASSES)])
    if fmt == "wds":
        stride = spec.TAR_BLOCK + -(-IMAGE_BYTES // spec.TAR_BLOCK) * spec.TAR_BLOCK + 2 * spec.TAR_BLOCK
        arrays["shards"] = (i // SHARD_SAMPLES).astype(np.int32)
        arrays["offsets"] = (i % SHARD_SAMPLES) * stride + spec.TAR_BLOCK
        shards, files = [], {}
        for k, first in enumerate(range(0, n, SHARD_SAMPLES)):
            count = min(SHARD_SAMPLES, n - first)
            name = spec.shard_name("index", k)
            size = count * stride + 2 * spec.TAR_BLOCK
            _sparse(out / name, size)
            shards.append({"name": name, "samples": count, "first": first, "bytes": size, "crc32": 0})
            files[name] = size
        meta.update(shards=shards, files=files)
        meta["storage"].pop("wids_index", None)
    elif fmt == "lmdb":
        shutil.copy(tpl / "data.mdb", out / "data.mdb")
    elif fmt == "hdf5":
        arrays["offsets"] = i * IMAGE_BYTES
        _sparse_h5(out, n * IMAGE_BYTES)
        meta["files"] = {"data.h5": (out / "data.h5").stat().st_size,
                         spec.HDF5_CHUNK_TABLE: (out / spec.HDF5_CHUNK_TABLE).stat().st_size}
    else:
        from packer.formats.mmap import npy_header

        side = 32 * 32 * 3
        arrays.update(offsets=i * side, sizes=np.full(n, side, np.int64), heights=np.full(n, 32, np.int32),
                      widths=np.full(n, 32, np.int32))
        with open(out / "images.npy", "wb") as f:
            f.write(npy_header((n, 32, 32, 3)))
        os.truncate(out / "images.npy", spec.MMAP_HEADER_BYTES + n * side)
        meta["files"] = {"images.npy": spec.MMAP_HEADER_BYTES + n * side}
    del i
    spec.write_index(out, meta, arrays)
    return out


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def _sparse_h5(out: Path, nbytes: int) -> None:
    """data.h5 with a 1-D uint8 ``/images`` of ``nbytes`` in the packer's chunks, all allocated, none written."""
    import h5py

    from bench_hdf5_chunks import make  # the one sparse /images builder (this folder is on sys.path)
    from readers.contract import spec
    from readers.formats.h5layout import chunk_table

    chunk = spec.HDF5_CHUNK_BYTES
    make(str(out / "data.h5"), -(-nbytes // chunk))
    with h5py.File(out / "data.h5", "r") as f:
        table = chunk_table(f["images"], chunk)
    np.save(out / spec.HDF5_CHUNK_TABLE, np.asarray(table, dtype="<i8"))


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
    """Peak of :func:`_anon` sampled every 20 ms on a thread while the block runs (the kernel keeps
    no high-water mark of it)."""

    def __enter__(self) -> "_PeakAnon":
        import threading

        self.peak, self._stop = _anon(), threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.02):
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
    ds = pickle.loads(conn.recv_bytes())
    if hasattr(ds, "sample_order"):
        order = ds.sample_order(WorkerEnv(0, RANKS, 0, WORKERS))
        first = int(order[0]) if len(order) else -1
    else:
        first = int(ds.labels[0])
    busy = smaps(os.getpid(), folder)
    conn.send({"idle": idle, "busy": busy, "first": first})
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
    elif kind == "read":
        res = probe_read(argv[1], argv[2] == "packed")
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


# ----------------------------------------------------------------------------- the run
COLUMNS = [  # key, heading, kind (s, B, /s, us, n)
    ("scan_s", "scan", "s"), ("images_per_s", "pack img/s", "/s"), ("pack_rss", "pack RSS", "B"),
    ("pack_private", "pack private", "B"),
    ("open_first_s", "first open", "s"), ("open_s", "open", "s"), ("open_private", "open private", "B"), ("open_mapped", "open mapped", "B"),
    ("random_us", "random read", "us"), ("first_batch_s", "first batch", "s"),
    ("worker_private", "worker private", "B"), ("order_s", "order", "s"), ("order_base_s", "permutation", "s"),
    ("order_peak", "order peak", "B"),
    ("state_bytes", "state_dict", "n"), ("resume_s", "resume (8 ranks)", "s"), ("resume_peak", "resume peak", "B"),
    ("info_s", "info", "s"), ("info_rss", "info RSS", "B"), ("verify_s", "verify", "s"), ("verify_rss", "verify RSS", "B"),
    ("disk_ratio", "disk / payload", "x"),
]


def _fmt(value: float, kind: str) -> str:
    if kind == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if kind == "B":
        return f"{value / 2**20:.1f} MB"
    if kind == "/s":
        return f"{value:,.0f}"
    if kind == "us":
        return f"{value:.0f} µs"
    if kind == "x":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def per_10x(ratio: float, step: float) -> float:
    """A cost's ``ratio`` between two sizes ``step`` apart (``step`` = their ratio of N), per 10x of N."""
    return ratio ** (1 / np.log10(step)) if step > 1 else ratio


def ratios(rows: list[dict[str, Any]]) -> None:
    """Add ``ratio[key]``: each figure over the same format's previous N, and ``per10``: that ratio per 10x of N."""
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        prev = last.get(row["format"])
        row["ratio"], row["per10"] = {}, {}
        if prev is not None:
            step = row["n"] / prev["n"]
            for key, _, kind in COLUMNS:
                a, b = prev.get(key), row.get(key)
                if a and b and kind not in ("n", "x"):
                    r = b / a
                    row["ratio"][key] = r
                    row["per10"][key] = per_10x(r, step)
        last[row["format"]] = row


GROUPS = {  # the printed tables: one per stage, so that each fits a page
    "packing": ("scan_s", "images_per_s", "pack_rss", "pack_private", "disk_ratio", "verify_s", "verify_rss"),
    "opening and reading": ("open_first_s", "open_s", "open_private", "open_mapped", "random_us", "first_batch_s", "worker_private",
                            "info_s", "info_rss"),
    "epoch order and resume": ("order_s", "order_base_s", "order_peak", "state_bytes", "resume_s", "resume_peak"),
}


def tables(rows: list[dict[str, Any]]) -> str:
    """One markdown table per :data:`GROUPS` entry (rows without any of its figures left out)."""
    out = []
    for title, keys in GROUPS.items():
        part = [r for r in rows if any(k in r for k in keys)]
        if part:
            out += [f"{title}:", "", table(part, keys), ""]
    return "\n".join(out)


def table(rows: list[dict[str, Any]], only: tuple[str, ...] | None = None) -> str:
    keys = [(k, h, kind) for k, h, kind in COLUMNS if any(k in r for r in rows) and (only is None or k in only)]
    head = "| format | N | kind | " + " | ".join(h for _, h, _ in keys) + " |"
    lines = [head, "|---|---:|---|" + "---:|" * len(keys)]
    for r in rows:
        cells = []
        for k, _, kind in keys:
            if k not in r:
                cells.append("–")
                continue
            text = _fmt(r[k], kind)
            if k in r.get("ratio", {}):
                text += f" ({r['ratio'][k]:.1f}x)"
            cells.append(text)
        lines.append(f"| {r['format']} | {r['n']:,} | {r['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checks(rows: list[dict[str, Any]], curve: list[dict[str, Any]] = ()) -> list[str]:
    """The issue's Done-when figures that these rows can show, as failures (empty: all met)."""
    bad = []
    # the order past the CPU's cache: ~11x per 10x of N here (numpy's permutation 23-27x), far under a square's 100x
    if curve and "per10" in curve[-1] and curve[-1]["per10"] >= 20:
        bad.append(f"the wds worker order grows {curve[-1]['per10']:.1f}x per 10x of N at {curve[-1]['n']:,}")
    # costs that must not grow faster than N: at most 12x per 10x of N
    linear = ("scan_s", "pack_rss", "pack_private", "open_first_s", "open_s", "open_private", "worker_private", "order_s", "order_peak",
              "resume_s", "resume_peak", "info_s", "info_rss", "verify_s", "verify_rss", "state_bytes")
    kinds = {k: kd for k, _, kd in COLUMNS}
    previous: dict[str, dict[str, Any]] = {}
    for r in rows:
        prev, previous[r["format"]] = previous.get(r["format"]), r
        for key in linear:
            per10 = r.get("per10", {}).get(key)
            floor = {"s": 0.05, "B": 8 << 20}.get(kinds[key], 0)
            # judged where both figures are above the floor: a ratio of milliseconds is the machine's noise
            if per10 is not None and per10 > 12 and prev is not None and min(prev[key], r[key]) >= floor:
                bad.append(f"{r['format']} {key} grows {per10:.1f}x per 10x of N at {r['n']:,}")
        if r.get("worker_private", 0) > 64 << 20:
            bad.append(f"{r['format']} per-worker private memory {r['worker_private'] / 2**20:.0f} MB at {r['n']:,}")
        if r["n"] >= 1_000_000 and r.get("open_s", 0) > 1.0:
            bad.append(f"{r['format']} open takes {r['open_s']:.2f} s at {r['n']:,}")
        if r["n"] >= 1_000_000 and r.get("resume_s", 0) > 2.0:
            bad.append(f"{r['format']} exact resume takes {r['resume_s']:.2f} s per rank at {r['n']:,}")
    packs = {}
    for r in rows:
        if r["kind"] == "pack" and "pack_private" in r:
            packs.setdefault(r["format"], []).append(r)
    for fmt, rs in packs.items():  # private memory: the mapped files are page cache, counted apart
        if len(rs) >= 2 and rs[-1]["n"] >= 1_000_000 and rs[-1]["pack_private"] > 1.5 * rs[-2]["pack_private"]:
            bad.append(f"{fmt} packer peak private memory at {rs[-1]['n']:,} is "
                       f"{rs[-1]['pack_private'] / rs[-2]['pack_private']:.2f}x its value at {rs[-2]['n']:,}")
    return bad


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
            row.update(_child("read", str(out), "packed"))
            row.update(cli("info", out))
            if n <= args.verify_max:
                row.update(cli("verify", out))
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
            row.update(_child("read", str(folder), "index"))
            row.update(cli("info", folder))
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


def curve_table(curve: list[dict[str, Any]]) -> str:
    lines = ["wds epoch order of one worker (8 ranks x 8 workers), on the shard layout alone:", "",
             "| N | share | order | per sample | per 10x of N | permutation | per sample | per 10x of N |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in curve:
        grow = f"{r['per10']:.1f}x" if "per10" in r else "–"
        base = f"{r['base_per10']:.1f}x" if "base_per10" in r else "–"
        lines.append(f"| {r['n']:,} | {r['share']:,} | {r['order_s'] * 1e3:.1f} ms | {r['order_s'] / r['share'] * 1e9:.1f} ns "
                     f"| {grow} | {r['order_base_s'] * 1e3:.1f} ms | {r['order_base_s'] / r['share'] * 1e9:.1f} ns | {base} |")
    return "\n".join(lines)


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
