"""The Ray engine against the local engine, on one machine, in one run.

1. generates an ImageNet-like folder (``dataset_bench.synth``: ``--images`` JPEGs, default 2,000, ~480x400,
   ~95 KB each) and reads it once, so the page cache is warm for every measurement;
2. ``--cycles`` times (default 3), so that load from elsewhere on the machine spreads over all
   configurations: packs with the local engine (``workers`` 1 and 2); then, for 1 and for 2 CPUs,
   starts a one-machine Ray instance with that many CPUs in this process (``ray.init``, timed),
   packs once cold (Ray's worker processes start and import the packer: what every
   ``pack-dataset --engine ray`` run pays once) and ``--repeats`` times warm, and stops it;
3. measures the per-chunk overhead: the round trip of an empty ``prepare_chunk`` task, one at a
   time and many in flight, and the time the Ray engine on 1 CPU takes beyond the local engine on
   1 worker, per chunk;
4. on 2 CPUs (last cycle), packs with other ``--ray-chunk`` sizes (``--sweep``), to show the choice.

"N CPUs" is N cores for the whole pack: this process and everything it starts (pool workers, Ray's
daemons and workers) are pinned to N cores (``sched_setaffinity``), so the driver does not get a
free core beside a 1-CPU Ray instance, and the local engine runs ``workers=N`` on the same N cores.

Validation is on (the default: every image decoded once), so packing is CPU-bound and the ratios
say how much of the CPU the engine leaves to the work. Throughput is source images (and MB) per
second of the ``pack`` call, median over all warm runs; "CPU ms/img" is the CPU time of this
process and all its descendants (pool workers; Ray's daemons and workers) per image, which other
load on the machine barely changes. Format ``--format`` (default lmdb: every
byte goes through the driver, the engine's heavier path); ``--format wds`` has tasks write the
shards (``--shard-size``, default 16MB here: 2,000 images would make a single 256 MB shard).

Usage::

    python benchmarks/bench_ray.py                      # ~3 minutes on 2 cores
    python benchmarks/bench_ray.py --format wds --json ray.json
    python benchmarks/bench_ray.py --quick              # tiny, for the smoke test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import psutil  # noqa: E402
import ray  # noqa: E402

from dataset_bench.cache import CacheControl  # noqa: E402
from dataset_bench.machine import load_average, machine_info, machine_label  # noqa: E402
from dataset_bench.synth import SynthOptions, make_imagenet_like  # noqa: E402
from packer import PackOptions, pack  # noqa: E402
from packer.engines import tasks  # noqa: E402
from packer.engines.io import LocalFiles  # noqa: E402
from packer.engines.ray import MAX_CHUNK_BYTES, prepare_chunk  # noqa: E402
from packer.prepare.images import ImageOptions  # noqa: E402
from packer.options import parse_size  # noqa: E402
from readers.contract.env import available_cpus  # noqa: E402


class ForeignCpu:
    """CPU time that processes outside this one's tree (Ray's included) took, as a share of the machine."""

    def __init__(self) -> None:
        self.cpus = available_cpus()
        self.hz = os.sysconf("SC_CLK_TCK")
        self.start = self._now()

    def _now(self) -> tuple[float, float, float]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7)) / self.hz
        return time.perf_counter(), busy, tree_cpu()

    def share(self) -> float:
        t1, busy1, own1 = self._now()
        t0, busy0, own0 = self.start
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / ((t1 - t0) * self.cpus))


def tree_cpu() -> float:
    """CPU seconds of this process and its descendants, live and reaped."""
    total = 0.0
    me = psutil.Process()
    for p in (me, *me.children(recursive=True)):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def time_pack(src: Path, out: Path, options: PackOptions, cpu: list[float] | None = None) -> float:
    """Seconds of one pack; its CPU seconds (whole process tree) appended to ``cpu``."""
    shutil.rmtree(out, ignore_errors=True)
    c0, t0 = tree_cpu(), time.perf_counter()
    [result] = pack(src, out, options)
    seconds = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(tree_cpu() - c0)
    assert result.rejected == 0 and result.images > 0, result
    shutil.rmtree(out)
    return seconds


@contextmanager
def pinned(cpus: int) -> Iterator[None]:
    """Run on ``cpus`` cores only, with every process started meanwhile (pool workers, Ray's daemons and
    workers inherit it): "N CPUs" means N cores for the whole pack, driver included."""
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(everything)[:cpus])
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


def local_runs(src: Path, out: Path, fmt_opts: dict, repeats: int, runs: dict, cpu: dict) -> None:
    for _ in range(repeats):  # 1 and 2 workers alternate: load bursts hit both
        for workers in (1, 2):
            with pinned(workers):
                runs.setdefault(workers, []).append(
                    time_pack(src, out, PackOptions(workers=workers, **fmt_opts), cpu.setdefault(workers, [])))


def task_overhead(n: int = 200) -> dict[str, float]:
    """Round trip of an empty prepare_chunk task: one at a time, and ``n`` in flight (ms per task)."""
    files, opts = LocalFiles("/nonexistent"), ImageOptions()
    ray.get(prepare_chunk.remote(files, [], opts, False))
    t0 = time.perf_counter()
    for _ in range(n):
        ray.get(prepare_chunk.remote(files, [], opts, False))
    serial = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    ray.get([prepare_chunk.remote(files, [], opts, False) for _ in range(n)])
    pipelined = (time.perf_counter() - t0) / n
    return {"serial_ms": serial * 1e3, "pipelined_ms": pipelined * 1e3}


def ray_runs(src: Path, out: Path, fmt_opts: dict, cpus: int, repeats: int, chunk: int, sweep: list[int],
             into: dict) -> None:
    """One Ray instance with ``cpus`` CPUs, on ``cpus`` cores: start-up, a cold pack, warm packs (into ``into``)."""
    with pinned(cpus):
        _ray_runs(src, out, fmt_opts, cpus, repeats, chunk, sweep, into)


def _ray_runs(src: Path, out: Path, fmt_opts: dict, cpus: int, repeats: int, chunk: int, sweep: list[int],
              into: dict) -> None:
    t0 = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        into.setdefault("init_s", []).append(time.perf_counter() - t0)
        opts = dict(fmt_opts, engine="ray", ray_chunk=chunk)
        into.setdefault("cold_s", []).append(time_pack(src, out, PackOptions(**opts)))
        cpu = into.setdefault("cpu_s", [])
        into.setdefault("warm_s", []).extend(time_pack(src, out, PackOptions(**opts), cpu) for _ in range(repeats))
        for c in sweep:
            if c != chunk:
                into.setdefault("sweep_s", {}).setdefault(c, []).extend(
                    time_pack(src, out, PackOptions(**dict(opts, ray_chunk=c))) for _ in range(repeats))
        into.setdefault("overhead", []).append(task_overhead())
    finally:
        ray.shutdown()


def report(n: int, mb: float, local: dict[int, list[float]], local_cpu: dict[int, list[float]],
           rays: dict[int, dict], chunk: int, chunks: int) -> dict:
    med = statistics.median
    rate = {("local", w): n / med(t) for w, t in local.items()}
    rate.update({("ray", c): n / med(r["warm_s"]) for c, r in rays.items()})
    cpu_ms = {("local", w): med(c) / n * 1e3 for w, c in local_cpu.items()}
    cpu_ms.update({("ray", c): med(r["cpu_s"]) / n * 1e3 for c, r in rays.items()})
    print(f"{'engine':<7} {'CPUs':>4} {'img/s':>7} {'MB/s':>6} {'CPU ms/img':>10} {'cold img/s':>10} "
          f"{'start s':>7}   runs (s)")
    for (engine, cpus), r in rate.items():
        runs = local[cpus] if engine == "local" else rays[cpus]["warm_s"]
        cold = f"{n / med(rays[cpus]['cold_s']):10.0f}" if engine == "ray" else f"{'-':>10}"
        start = f"{med(rays[cpus]['init_s']):7.1f}" if engine == "ray" else f"{'-':>7}"
        print(f"{engine:<7} {cpus:>4} {r:7.0f} {r * mb / n:6.1f} {cpu_ms[(engine, cpus)]:10.2f} {cold} {start}   "
              + " ".join(f"{t:.2f}" for t in runs))
    ratios = {
        "ray_vs_local_2cpu": rate[("ray", 2)] / rate[("local", 2)],
        "ray_vs_local_1cpu": rate[("ray", 1)] / rate[("local", 1)],
        "ray_1_to_2": rate[("ray", 2)] / rate[("ray", 1)],
        "local_1_to_2": rate[("local", 2)] / rate[("local", 1)],
    }
    print(f"\nRay engine vs local engine, 2 CPUs: {ratios['ray_vs_local_2cpu']:.2f}x (target >= 0.8x); "
          f"1 CPU: {ratios['ray_vs_local_1cpu']:.2f}x")
    print(f"Ray engine 1 -> 2 CPUs: {ratios['ray_1_to_2']:.2f}x (target >= 1.7x); "
          f"local engine 1 -> 2 workers: {ratios['local_1_to_2']:.2f}x")
    extra = (med(rays[1]["warm_s"]) - med(local[1])) / chunks
    for cpus, r in rays.items():
        serial = med(o["serial_ms"] for o in r["overhead"])
        piped = med(o["pipelined_ms"] for o in r["overhead"])
        print(f"empty task round trip ({cpus} CPU): {serial:.2f} ms one at a time, "
              f"{piped:.2f} ms each with 200 in flight")
    print(f"chunk size {chunk} images ({chunks} chunks): Ray on 1 CPU took {extra * 1e3:+.1f} ms per chunk beyond "
          f"the local engine on 1 worker ({med(local[1]) / chunks * 1e3:.0f} ms of work per chunk)")
    sweep = {c: n / med(t) for c, t in rays[2].get("sweep_s", {}).items()}
    if sweep:
        sweep[chunk] = rate[("ray", 2)]
        print("ray, 2 CPUs, by --ray-chunk: " + ", ".join(f"{c}: {sweep[c]:.0f} img/s" for c in sorted(sweep)))
    return {"rates": {f"{e}_{c}": v for (e, c), v in rate.items()}, "ratios": ratios,
            "cpu_ms_per_image": {f"{e}_{c}": v for (e, c), v in cpu_ms.items()},
            "extra_ms_per_chunk_1cpu": extra * 1e3, "sweep_img_s": sweep}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000, help="source JPEGs (default 2000)")
    p.add_argument("--format", default="lmdb", choices=("wds", "lmdb", "hdf5"), help="output format (default lmdb)")
    p.add_argument("--shard-size", type=parse_size, default=16 << 20, help="wds shard size (default 16MB)")
    p.add_argument("--cycles", type=int, default=3, help="rounds over every configuration (default 3)")
    p.add_argument("--repeats", type=int, default=2, help="warm runs per configuration and cycle (default 2)")
    p.add_argument("--chunk", type=int, default=PackOptions().ray_chunk,
                   help=f"--ray-chunk of the main runs (default {PackOptions().ray_chunk})")
    p.add_argument("--sweep", default="16,256", help="other --ray-chunk sizes to try on 2 CPUs (default 16,256)")
    p.add_argument("--tmp", type=Path, help="where to put the source and outputs (default: the system temp dir)")
    p.add_argument("--source", type=Path, help="reuse (or create) the generated source folder here")
    p.add_argument("--json", type=Path, help="write every timing to this JSON file")
    p.add_argument("--quick", action="store_true", help="tiny run (64 small images, 1 repeat), for the smoke test")
    args = p.parse_args(argv)
    args.sweep_list = [int(v) for v in args.sweep.split(",") if v]
    if args.quick:
        args.images, args.cycles, args.repeats, args.sweep_list = 64, 1, 1, [8]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-ray-", dir=args.tmp))
    try:
        src = args.source or work / "src"
        size = (160, 128) if args.quick else (480, 400)
        make_imagenet_like(src, args.images, 10, SynthOptions(size=size), threads=available_cpus())
        files = sorted(p for p in src.rglob("*") if p.is_file())
        n, mb = len(files), sum(p.stat().st_size for p in files) / 1e6
        CacheControl.warm(files)
        fmt_opts = {"format": args.format, **({"shard_size": args.shard_size} if args.format == "wds" else {})}
        chunks = len(tasks.plan_chunks([p.stat().st_size for p in files], 0, args.chunk, MAX_CHUNK_BYTES))
        print(f"source: {n} JPEGs, {mb:.1f} MB; format {args.format}; validation on; "
              f"{args.cycles} cycles x {args.repeats} warm runs")
        load0, foreign = load_average(), ForeignCpu()
        out = work / "out"
        local: dict[int, list[float]] = {}
        local_cpu: dict[int, list[float]] = {}
        rays: dict[int, dict] = {1: {}, 2: {}}
        for cycle in range(args.cycles):
            local_runs(src, out, fmt_opts, args.repeats, local, local_cpu)
            for cpus in (1, 2):
                last = cycle == args.cycles - 1
                ray_runs(src, out, fmt_opts, cpus, args.repeats, args.chunk,
                         args.sweep_list if cpus == 2 and last else [], rays[cpus])
            print(f"  cycle {cycle + 1}/{args.cycles} done, load average {load_average():.2f}", flush=True)
        print()
        summary = report(n, mb, local, local_cpu, rays, args.chunk, chunks)
        share, load1 = foreign.share(), load_average()
        print(f"machine: {machine_label(machine_info())}")  # imports torch: after the runs, so forks stay light
        print(f"load average (1 min) before/after: {load0:.2f} / {load1:.2f}; other processes used {share:.0%} "
              f"of the machine's CPU time during the run")
        if args.json:
            args.json.write_text(json.dumps({"images": n, "mb": mb, "format": args.format, "chunk": args.chunk,
                                             "chunks": chunks, "local_s": local, "local_cpu_s": local_cpu,
                                             "ray": rays, "summary": summary,
                                             "load_before_after": [load0, load1], "foreign_cpu": share},
                                            indent=1, default=str))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
