"""``pack-dataset index`` (shards indexed in place) against the I/O ceiling, and reading from it.

One run: write ``--shards`` img2dataset-style shards (``key.jpg`` + ``key.txt`` + ``key.json``, the
JPEGs from ``dataset_bench.synth``; the default 64 x 160 is about 1.0 GB) in a local folder, copy
them into a SeaweedFS started on loopback (``dataset_bench.servers``), then per round (median of
``--repeats``), at two sizes, the first half of the shards and all of them:

* **local**: ``tar -xOf SHARD > /dev/null`` over every shard, ``--workers`` at once (the I/O
  ceiling: every byte read and every member walked once), against ``index_shards`` of the same
  shards (a brace pattern) with the same workers, into a new folder; both from a warm page cache.
  ``index_shards`` runs in a child process that imports only what ``pack-dataset index`` imports
  (:class:`IndexRunner`), so that its pool forks a process of the command's size, not this
  benchmark's (torch, the readers: a fork several times as costly); the child's start (the
  interpreter and its imports, once per command) is printed apart;
* **S3**: each shard streamed from the store (the store's large range requests) into ``tar -xO``,
  ``--workers`` at once, against ``index_shards`` of the same shards in the bucket;
* **read**: one pass over every sample, every field (``decode=False``), from the in-place index vs
  from ``pack-dataset SHARDS -f wds --shard-count PER`` (our own pack of the same samples: PER
  shards of SHARDS samples), samples/s.

Two tables: per run of all the shards (what a user waits for), and the steady rate, the MB the
larger size adds over the seconds it adds (a fixed cost per run -- a fork, the listing, the index's
fsyncs -- cancels out; it is printed apart as the seconds a run takes beyond size / steady rate).

Goals: index >= 0.8x the tar ceiling (local and S3); reading in place >= 0.9x reading our own pack.

    python benchmarks/bench_index.py                  # 64 shards x 160 samples (~1.0 GB), 3 rounds
    python benchmarks/bench_index.py --quick          # seconds (CI smoke test)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing

from dataset_bench.machine import machine_info, machine_label  # noqa: E402
from dataset_bench.servers import SeaweedServer, find_weed  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from packer import PackOptions, pack  # noqa: E402
from readers import open_dataset  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=64, help="shards (default 64; the first half is the smaller size)")
    p.add_argument("--per-shard", type=int, default=160, help="samples per shard (default 160: ~16 MB shards)")
    p.add_argument("--workers", type=int, default=2, help="shards read at once, tar and index alike (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="rounds, median reported (default 3)")
    p.add_argument("--no-s3", action="store_true", help="skip the S3 rows (no SeaweedFS needed)")
    p.add_argument("--tmp", type=Path, help="where to put the data (default: the system temp dir)")
    p.add_argument("--json", type=Path, help="write every timing to this JSON file")
    p.add_argument("--quick", action="store_true", help="tiny run (4 shards x 20 samples, 1 round), for CI")
    return p.parse_args(argv)


def write_shards(folder: Path, photos: list[bytes], shards: int, per: int) -> None:
    """img2dataset's layout: ``<shard>/<key>.jpg``, ``.txt`` (caption), ``.json`` (metadata)."""
    folder.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(folder / f"{s:05d}.tar", "w") as tar:
            for j in range(per):
                n = s * per + j
                key = f"{n:09d}"
                members = {"jpg": photos[n % len(photos)], "txt": f"a photo, caption number {n}".encode(),
                           "json": json.dumps({"key": key, "status": "success", "caption": f"number {n}"}).encode()}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _tar(feed: bytes | Path) -> None:
    """``tar -xO`` of one shard to /dev/null: from a file, or from bytes given on stdin."""
    args = ["tar", "-xOf", str(feed) if isinstance(feed, Path) else "-"]
    subprocess.run(args, input=feed if isinstance(feed, bytes) else None, stdout=subprocess.DEVNULL, check=True)


def _tar_stream(store, name: str) -> None:
    proc = subprocess.Popen(["tar", "-xOf", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert proc.stdin is not None
    for chunk in store.stream(name):
        proc.stdin.write(chunk)
    proc.stdin.close()
    if proc.wait() != 0:
        raise RuntimeError(f"tar failed on {name}")


_RUNNER = r"""
import json, resource, sys, time
from packer.tools.index import index_shards
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    c, t = cpu(), time.perf_counter()
    index_shards(job["sources"], job["out"], workers=job["workers"], overwrite=True,
                 storage_options=job["storage_options"])
    print(json.dumps([time.perf_counter() - t, cpu() - c]), flush=True)
"""


class IndexRunner:
    """``index_shards`` timed in a child process importing what ``pack-dataset index`` imports (not
    torch, not this benchmark's modules): its pool forks a process of the command's size."""

    def __init__(self) -> None:
        self.cpu_s = 0.0  # the last run's CPU seconds
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        t = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-c", _RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        if self._line() != "ready":
            raise RuntimeError("the index runner did not start (its error above)")
        self.startup_s = time.perf_counter() - t

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def __call__(self, sources: list[str], out: Path, workers: int, storage_options: Any = None) -> float:
        """Seconds ``index_shards(sources, out)`` took in the child (its CPU seconds, with its workers',
        in :attr:`cpu_s`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"sources": sources, "out": str(out), "workers": workers,
                                          "storage_options": storage_options}) + "\n")
        self.proc.stdin.flush()
        line = self._line()
        if not line:
            raise RuntimeError("index_shards failed in the index runner (its error above)")
        wall, self.cpu_s = json.loads(line)
        return float(wall)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def children_cpu() -> float:
    """CPU seconds of this process's ended children (the ``tar`` processes)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def read_rate(root: Path, passes: int = 3) -> float:
    """Samples per second of a pass over every sample and field (no decode), the best of ``passes``."""
    ds = open_dataset(root, decode=False)
    try:
        best = float("inf")
        for _ in range(passes):
            t = time.perf_counter()
            n = sum(1 for _ in ds)
            best = min(best, time.perf_counter() - t)
        return n / best
    finally:
        ds.close()


def _brace(base: str, n: int) -> str:
    """The first ``n`` shards as a brace pattern, as webdataset users name shards (no listing)."""
    return f"{base}/{{00000..{n - 1:05d}}}.tar"


def steady(mb: tuple[float, float], secs: tuple[float, float]) -> tuple[float, float]:
    """(MB/s of the shards the larger size adds, the seconds left over: a run's fixed cost) from the
    per-run seconds of two sizes; (nan, nan) when the larger was not slower."""
    extra = secs[1] - secs[0]
    if extra <= 0:
        return float("nan"), float("nan")
    rate = (mb[1] - mb[0]) / extra
    return rate, secs[1] - mb[1] / rate


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shards, per, repeats = (4, 20, 1) if args.quick else (args.shards, args.per_shard, args.repeats)
    sizes = (max(1, shards // 2), shards)  # two sizes: the steady rate and the fixed cost apart
    work = Path(tempfile.mkdtemp(prefix="bench-index-", dir=args.tmp))
    srv = runner = None
    rows: dict[str, list[float]] = {}
    load = [os.getloadavg()[0]]
    try:
        synth = SynthOptions(size=(160, 128)) if args.quick else SynthOptions()
        make_imagenet_like(work / "photos", 24, 1, synth)
        photos = [p.read_bytes() for p in sorted((work / "photos").rglob("*.JPEG"))]
        local = work / "shards"
        write_shards(local, photos, shards, per)
        paths = sorted(local.iterdir())
        mb = tuple(sum(p.stat().st_size for p in paths[:n]) / 1e6 for n in sizes)
        for p in paths:
            p.read_bytes()  # warm page cache for both sides
        pool = cf.ThreadPoolExecutor(max_workers=args.workers)
        store = None
        if not args.no_s3 and find_weed() is not None:
            srv = SeaweedServer(work / "s3").start()
            from readers.remote import open_store

            url = srv.url("shards")
            store = open_store(url, srv.storage_options())
            for p in paths:
                store.put(p.name, p)
        pack(local, work / "pack", PackOptions(format="wds", validate=False, workers=1, shard_count=per))
        runner = IndexRunner()
        runner([str(local)], work / "idx", args.workers)  # the index the read rows read
        fresh = work / "idx-run"  # each timed run writes a new folder, as a user's first index does

        def index(source: str, **kw: Any) -> float:
            shutil.rmtree(fresh, ignore_errors=True)  # not timed: removing the last run's index
            return runner([source], fresh, args.workers, **kw)

        s3_first = None
        if store is not None:  # a process's first S3 index imports s3fs and botocore and parses their models
            s3_first = index(_brace(url, 1), storage_options=srv.storage_options())
        for r in range(repeats):
            for n in sizes:
                c = children_cpu()
                rows.setdefault(f"tar local {n}", []).append(timed(lambda: list(pool.map(_tar, paths[:n]))))
                rows.setdefault(f"tar local cpu {n}", []).append(children_cpu() - c)
                rows.setdefault(f"index local {n}", []).append(index(_brace(str(local), n)))
                rows.setdefault(f"index local cpu {n}", []).append(runner.cpu_s)
                if store is not None:
                    rows.setdefault(f"tar s3 {n}", []).append(timed(lambda: list(pool.map(
                        lambda p: _tar_stream(store, p.name), paths[:n]))))
                    rows.setdefault(f"index s3 {n}", []).append(index(_brace(url, n),
                                                                      storage_options=srv.storage_options()))
            rows.setdefault("read pack", []).append(read_rate(work / "pack"))
            rows.setdefault("read inplace", []).append(read_rate(work / "idx"))
        pool.shutdown()
        runner.close()
        if store is not None:
            store.close()
        load.append(os.getloadavg()[0])
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"index in place: {shards} shards x {per} samples ({mb[1]:.1f} MB) and the first {sizes[0]} of them "
              f"({mb[0]:.1f} MB), {args.workers} workers, {repeats} round(s), median; load average {load[0]:.1f} "
              f"before, {load[1]:.1f} after; {machine_label(machine_info())}")
        print(f"{'per run, ' + str(shards) + ' shards':<30}{'shards/s':>10}{'MB/s':>10}{'vs ceiling':>12}")
        out: dict[str, dict[str, float]] = {}
        for where in ("local", "s3"):
            if f"tar {where} {shards}" not in med:
                continue
            tar_s, idx_s = med[f"tar {where} {shards}"], med[f"index {where} {shards}"]
            for label, secs in ((f"tar -xO ({where}, ceiling)", tar_s), (f"pack-dataset index ({where})", idx_s)):
                print(f"{label:<30}{shards / secs:>10.1f}{mb[1] / secs:>10.1f}{tar_s / secs:>12.2f}")
            out[where] = {"tar_s": tar_s, "index_s": idx_s, "vs_ceiling": tar_s / idx_s}
        print(f"{'steady: the ' + str(sizes[1] - sizes[0]) + ' shards more':<30}{'MB/s':>10}{'fixed s':>10}"
              f"{'vs ceiling':>12}")
        for where in ("local", "s3"):
            if where not in out:
                continue
            tar_rate, tar_fixed = steady(mb, (med[f"tar {where} {sizes[0]}"], out[where]["tar_s"]))
            idx_rate, idx_fixed = steady(mb, (med[f"index {where} {sizes[0]}"], out[where]["index_s"]))
            for label, rate, fixed in ((f"tar -xO ({where}, ceiling)", tar_rate, tar_fixed),
                                       (f"pack-dataset index ({where})", idx_rate, idx_fixed)):
                print(f"{label:<30}{rate:>10.1f}{fixed:>10.2f}{rate / tar_rate:>12.2f}")
            out[where].update(tar_mb_s=tar_rate, index_mb_s=idx_rate, steady_vs_ceiling=idx_rate / tar_rate,
                              tar_fixed_s=tar_fixed, index_fixed_s=idx_fixed)
        tar_cpu, idx_cpu = med[f"tar local cpu {shards}"], med[f"index local cpu {shards}"]
        print(f"CPU seconds (local, per run, workers included): tar {tar_cpu:.2f}, pack-dataset index {idx_cpu:.2f}"
              f" ({tar_cpu / idx_cpu:.2f}x); the same ratio as the wall clock's when the cores are the limit")
        out["cpu_local"] = {"tar_s": tar_cpu, "index_s": idx_cpu, "ratio": tar_cpu / idx_cpu}
        out["index_startup_s"] = {"s": runner.startup_s, "s3_first_shard_s": s3_first or 0.0}
        print(f"(not in the index rows: starting pack-dataset index, interpreter and imports, once per run: "
              f"{runner.startup_s:.2f} s" + ("" if s3_first is None else f"; and for an s3:// index, the first "
              f"in a process, importing the S3 client and making its session: one shard took {s3_first:.2f} s")
              + ")")
        ratio = med["read inplace"] / med["read pack"]
        print(f"{'read, samples/s':<30}{'pack':>10}{'in place':>10}{'ratio':>12}")
        print(f"{'every field, no decode':<30}{med['read pack']:>10.0f}{med['read inplace']:>10.0f}{ratio:>12.2f}")
        out["read"] = {"pack": med["read pack"], "inplace": med["read inplace"], "ratio": ratio}
        if args.json:
            args.json.write_text(json.dumps({"shards": shards, "per_shard": per, "sizes": sizes, "mb": mb,
                                             "load": load, "rows": rows, "summary": out}, indent=1))
        return 0
    finally:
        if runner is not None:
            runner.close()
        if srv is not None:
            srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
