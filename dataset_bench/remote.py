"""``dataset-bench --remote``: reading wds shards from a loopback S3 server, against the local disk.

One run starts its own SeaweedFS on loopback (:class:`dataset_bench.servers.SeaweedServer`),
packs a generated ImageNet-like folder into wds shards on the local disk,
uploads them, and measures in the same run, every loader with the same
workers, batch size and ``decode=False``:

* ``local disk`` -- ``ShardDataset`` on the local shards (warm page cache);
* ``webdataset (pipe:curl)`` -- the official ``webdataset`` reader streaming
  the same objects from the same server with ``pipe:curl --aws-sigv4`` URLs,
  the way its documentation streams from S3;
* ``ours, streaming`` -- ``open_dataset("s3://...")`` without a cache (epoch 1);
* ``ours, cache epoch 1`` / ``epoch 2`` -- with ``cache_dir``: the first pass
  of one loader fills the node cache, its second pass reads it (the dataset and
  loader are reused, as a training loop's later epochs reuse them; ``local
  disk`` is likewise the second pass of its loader);

plus the loopback ceilings measured in the same run (TCP over 127.0.0.1 in
this process, and one large object fetched from the server with curl), the
time to open a 1.28M-sample index over S3 (warm and in a fresh interpreter),
the machine's load average, the CPU seconds the client side (loader process,
workers and their curl processes; not the server) spent per GB, and two ratios
of epoch rates against the targets: streaming / webdataset >= 1.5 and cache
epoch 2 / local disk >= 0.9.

Every loader measurement runs in a fresh interpreter (:func:`dataset_bench.isolate.run_isolated`)
and is repeated; the median is reported.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from dataset_bench.isolate import run_isolated
from dataset_bench.machine import load_average, machine_info, machine_label
from dataset_bench.measure import measure_loader

__all__ = ["RemoteConfig", "RemoteResult", "run_remote", "remote_report", "TARGETS"]

MB = 1e6
#: name -> (numerator row, denominator row, target ratio)
TARGETS = {
    "streaming vs webdataset": ("ours, streaming", "webdataset (pipe:curl)", 1.5),
    "cache epoch 2 vs local disk": ("ours, cache epoch 2", "local disk", 0.9),
}
ROWS = ("local disk", "webdataset (pipe:curl)", "ours, streaming", "ours, cache epoch 1", "ours, cache epoch 2")


@dataclass(frozen=True)
class RemoteConfig:
    """What ``dataset-bench --remote`` measures."""

    generate: int = 6000  # ~580 MB: start-up is a small part of an epoch
    src: str | None = None
    shards: int = 16  # wds shards the images are packed into (2 workers need several each) ...
    shard_count: int | None = None  # ... or this many samples per shard
    workers: int = 2
    batch_size: int = 64
    repeats: int = 3
    work_dir: str | None = None
    index_samples: int = 1_281_167  # the synthetic index opened over S3
    isolate: bool = True

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.batch_size < 1 or self.shards < 1 or self.workers < 0:
            raise ValueError("repeats, batch_size and shards must be >= 1, workers >= 0")
        if not self.src and (self.generate or 0) < 1:
            raise ValueError("nothing to measure: give src or generate")


@dataclass
class RemoteResult:
    config: dict[str, Any]
    machine: dict[str, Any]
    dataset: dict[str, Any]
    ceilings: dict[str, float]  # MB/s
    index_open: dict[str, float]  # seconds
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> median LoaderStats fields
    runs: dict[str, list[float]] = field(default_factory=dict)  # name -> samples/s of each repeat
    load: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def ratios(self) -> dict[str, tuple[float | None, float]]:
        """Target name -> (ratio of epoch rates, target). Epoch rate = all samples / all time, start-up and
        the shuffle buffer's first fill included: a streamed epoch reads its first ``buffer_size`` samples
        before the first batch, so the steady rate after it would flatter streaming readers."""
        out = {}
        for name, (num, den, target) in TARGETS.items():
            a, b = self.rows.get(num), self.rows.get(den)
            ok = a and b and b["epoch_samples_per_s"]
            out[name] = ((a["epoch_samples_per_s"] / b["epoch_samples_per_s"]) if a and b and ok else None, target)
        return out

    def save_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        data = asdict(self)
        data["ratios"] = {k: {"ratio": r, "target": t} for k, (r, t) in self.ratios().items()}
        path.write_text(json.dumps(data, indent=1))
        return path


# --------------------------------------------------------------------------- ceilings
def tcp_loopback_mb_s(nbytes: int = 1 << 30) -> float:
    """Bytes through one TCP connection on 127.0.0.1 (sender thread, receiver here), MB/s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    block = b"\0" * (1 << 20)

    def send() -> None:
        with socket.create_connection(server.getsockname()) as s:
            for _ in range(nbytes // len(block)):
                s.sendall(block)

    sender = threading.Thread(target=send)
    t0 = time.perf_counter()
    sender.start()
    conn, _ = server.accept()
    got, buf = 0, bytearray(1 << 20)
    with conn:
        while got < nbytes:
            n = conn.recv_into(buf)
            if not n:
                break
            got += n
    seconds = time.perf_counter() - t0
    sender.join()
    server.close()
    return got / seconds / MB


def _curl_s3(server: Any) -> list[str] | None:
    """curl arguments that sign requests for ``server`` (SigV4), or None when curl is missing."""
    if shutil.which("curl") is None:
        return None
    return ["curl", "-s", "-f", "--user", f"{server.access_key}:{server.secret_key}",
            "--aws-sigv4", "aws:amz:us-east-1:s3"]


def curl_get_mb_s(server: Any, key: str, nbytes: int) -> float | None:
    """One object fetched from the server by curl into /dev/null, MB/s (the server's streaming rate)."""
    curl = _curl_s3(server)
    if curl is None:
        return None
    t0 = time.perf_counter()
    subprocess.run([*curl, "-o", "/dev/null", f"{server.endpoint_url}/{server.bucket}/{key}"], check=True)
    return nbytes / (time.perf_counter() - t0) / MB


# --------------------------------------------------------------------------- one measurement each
def _cpu_s() -> float:
    """CPU seconds of this process and its reaped descendants (loader workers, their curl processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(make: Callable[[], Any]) -> dict[str, Any]:
    """:func:`measure_loader` plus the client's CPU seconds for the pass (workers are reaped at its end)."""
    before = _cpu_s()
    stats = measure_loader(make).to_dict()
    stats["client_cpu_s"] = _cpu_s() - before
    return stats


def measure_ours(url: str, storage_options: dict[str, Any], workers: int, batch_size: int,
                 cache_dir: str | None = None, epochs: int = 1) -> list[dict[str, Any]]:
    """``open_dataset(url)`` through ``make_loader``, decode=False: ``epochs`` passes of one loader.

    Pass 1 is timed from ``open_dataset`` on (the index read over S3 included); later passes
    reuse the dataset and the loader, as a training loop's later epochs do. The client
    libraries are imported before the clock starts, as every reader module is
    (:mod:`dataset_bench.isolate`): an import is paid once per process, not per epoch.
    """
    import s3fs  # noqa: F401 - see the docstring

    from readers import make_loader, open_dataset

    built: list[Any] = []

    def make() -> Any:
        ds = open_dataset(url, storage_options=storage_options, decode=False, cache_dir=cache_dir)
        built.append(make_loader(ds, batch_size=batch_size, num_workers=workers))
        return built[0]

    out = [_timed(make)]
    for _ in range(epochs - 1):
        out.append(_timed(lambda: built[0]))
    return out


def measure_local(root: str, workers: int, batch_size: int) -> list[dict[str, Any]]:
    """The local shards, decode=False, one loader: pass 1 warms the page cache, pass 2 is reported
    (the same footing as the cache's epoch 2)."""
    from readers import make_loader, open_dataset

    loader = make_loader(open_dataset(root, decode=False), batch_size=batch_size, num_workers=workers)
    measure_loader(lambda: loader)
    return [_timed(lambda: loader)]


def measure_webdataset(urls: list[str], workers: int, batch_size: int) -> list[dict[str, Any]]:
    """The official reader over ``pipe:`` URLs, the way its README feeds a DataLoader (raw bytes out)."""
    import torch
    import webdataset as wds

    def make() -> Any:
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).shuffle(1000).to_tuple("jpg;png", "cls")
        kw: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
        return torch.utils.data.DataLoader(ds.batched(batch_size, partial=True), batch_size=None,
                                           num_workers=workers, **kw)

    return [_timed(make)]


def open_index_seconds(url: str, storage_options: dict[str, Any]) -> float:
    """Seconds for ``open_dataset(url)`` (index.json + arrays), in this process."""
    from readers import open_dataset

    t0 = time.perf_counter()
    ds = open_dataset(url, storage_options=storage_options)
    seconds = time.perf_counter() - t0
    ds.close()
    return seconds


# --------------------------------------------------------------------------- the run
def synthetic_wds_index(root: Path, n: int, shards: int = 512) -> None:
    """An index.json + arrays shaped like ImageNet's train split packed as wds (no shard data)."""
    import numpy as np

    from readers.contract import spec

    rng = np.random.default_rng(0)
    sizes = rng.integers(20_000, 200_000, n)
    per = -(-n // shards)
    shard_of = np.minimum(np.arange(n) // per, shards - 1)
    counts = np.bincount(shard_of, minlength=shards)
    first = np.searchsorted(shard_of, np.arange(shards))
    # tar layout: per sample a header, the padded image, a .cls member; readers range-check offsets
    record = spec.TAR_BLOCK + -(-sizes // spec.TAR_BLOCK) * spec.TAR_BLOCK + 2 * spec.TAR_BLOCK
    starts = np.cumsum(record) - record
    offsets = starts - starts[first[shard_of]] + spec.TAR_BLOCK
    shard_bytes = np.bincount(shard_of, weights=record, minlength=shards).astype(np.int64) + 2 * spec.TAR_BLOCK
    arrays = {"labels": np.repeat(np.arange(1000), n // 1000 + 1)[:n], "checksums": rng.integers(0, 2**32, n),
              "sizes": sizes, "shards": shard_of, "offsets": offsets}
    meta = {"format": "wds", "num_samples": n, "classes": [f"n{c:08d}" for c in range(1000)],
            "storage": {"kind": "encoded"},
            "shards": [{"name": spec.shard_name("train", s), "samples": int(counts[s]), "first": int(first[s]),
                        "bytes": int(shard_bytes[s]), "crc32": 0} for s in range(shards)]}
    root.mkdir(parents=True, exist_ok=True)
    spec.write_index(root, meta, arrays)


def _upload(store: Any, folder: Path) -> tuple[int, float]:
    t0, total = time.perf_counter(), 0
    for p in sorted(folder.iterdir()):
        if p.is_file():
            store.put(p.name, p)
            total += p.stat().st_size
    return total, time.perf_counter() - t0


def _prepare(cfg: RemoteConfig, work: Path) -> tuple[Path, dict[str, Any]]:
    from dataset_bench.synth import generate_image_folder
    from packer import PackOptions, pack
    from readers.contract import spec

    src = Path(cfg.src) if cfg.src else generate_image_folder(work / "src", cfg.generate)
    local = work / "local-wds"
    if not (local / spec.INDEX_NAME).exists():
        n = sum(1 for p in src.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        per = cfg.shard_count or max(1, -(-n // cfg.shards))
        pack(src, local, PackOptions(format="wds", shard_count=per, overwrite=True))
    meta = spec.read_index(local).meta
    info = {"samples": meta["num_samples"], "shards": len(meta["shards"]),
            "bytes": sum(s["bytes"] for s in meta["shards"])}
    return local, info


def _call(cfg: RemoteConfig, fn: Callable[..., Any], **kwargs: Any) -> Any:
    return run_isolated(fn, kwargs) if cfg.isolate else fn(**kwargs)


def run_remote(cfg: RemoteConfig, progress: Callable[[str], None] | None = None) -> RemoteResult:
    """Start SeaweedFS, pack and upload, measure every row ``cfg.repeats`` times (see the module docstring)."""
    from dataset_bench.servers import SeaweedServer
    from readers.remote import open_store

    say = progress or (lambda step: None)
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="dataset-bench-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        say("generate and pack")
        local, dataset = _prepare(cfg, work)
        say("start SeaweedFS")
        server = SeaweedServer(work / f"weed-{os.getpid()}").start()
        so = server.storage_options()
        url = server.url("bench/train-wds")
        store = open_store(url, so)
        say("upload")
        nbytes, seconds = _upload(store, local)
        dataset["upload_mb_s"] = nbytes / seconds / MB
        result = RemoteResult(config=asdict(cfg), machine=machine_info(), dataset=dataset,
                              ceilings=_ceilings(server, store, local), index_open={})
        result.index_open = _index_open(cfg, server, work, say)
        _measure_rows(cfg, result, server, url, local, work, say)
        store.close()
        return result
    finally:
        if server is not None:
            server.stop()
        if cfg.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _ceilings(server: Any, store: Any, local: Path) -> dict[str, float]:
    biggest = max((p for p in local.glob("*.tar")), key=lambda p: p.stat().st_size)
    out = {"tcp loopback": tcp_loopback_mb_s()}
    curl = curl_get_mb_s(server, f"bench/train-wds/{biggest.name}", biggest.stat().st_size)
    if curl is not None:
        out["curl GET, one shard"] = curl
    t0 = time.perf_counter()
    for _ in store.stream(biggest.name):
        pass
    out["Store.stream, one shard"] = biggest.stat().st_size / (time.perf_counter() - t0) / MB
    return out


def _index_open(cfg: RemoteConfig, server: Any, work: Path, say: Callable[[str], None]) -> dict[str, float]:
    from readers.remote import open_store

    say("1.28M-sample index")
    folder = work / "index-1.28M"
    synthetic_wds_index(folder, cfg.index_samples)
    url = server.url("bench/index-1.28M")
    store = open_store(url, server.storage_options())
    _upload(store, folder)
    store.close()
    so = server.storage_options()
    fresh = statistics.median(run_isolated(open_index_seconds, {"url": url, "storage_options": so})
                              for _ in range(cfg.repeats))
    open_index_seconds(url, so)  # imports and the first connection, once
    warm = statistics.median(open_index_seconds(url, so) for _ in range(cfg.repeats))
    return {"samples": cfg.index_samples, "bytes": sum(p.stat().st_size for p in folder.iterdir()),
            "fresh_interpreter_s": fresh, "warm_process_s": warm}


def _measure_rows(cfg: RemoteConfig, result: RemoteResult, server: Any, url: str, local: Path, work: Path,
                  say: Callable[[str], None]) -> None:
    so, w, b = server.storage_options(), cfg.workers, cfg.batch_size
    curl = _curl_s3(server)
    wds_urls = None
    if curl is not None:
        names = sorted(p.name for p in local.glob("*.tar"))
        wds_urls = ["pipe:" + " ".join(curl) + f" {server.endpoint_url}/{server.bucket}/bench/train-wds/{n}"
                    for n in names]
    else:
        result.notes.append("curl not found: the webdataset (pipe:curl) row is missing")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ROWS}
    loads = []
    for r in range(cfg.repeats):  # repeat-major: drift in the machine's load spreads over every row
        say(f"repeat {r + 1}/{cfg.repeats}: local disk")
        runs["local disk"] += _call(cfg, measure_local, root=str(local), workers=w, batch_size=b)
        if wds_urls:
            say(f"repeat {r + 1}/{cfg.repeats}: webdataset")
            runs["webdataset (pipe:curl)"] += _call(cfg, measure_webdataset, urls=wds_urls, workers=w, batch_size=b)
        say(f"repeat {r + 1}/{cfg.repeats}: ours streaming")
        runs["ours, streaming"] += _call(cfg, measure_ours, url=url, storage_options=so, workers=w, batch_size=b)
        say(f"repeat {r + 1}/{cfg.repeats}: ours with a cache")
        cache = work / f"cache-{r}"
        e1, e2 = _call(cfg, measure_ours, url=url, storage_options=so, workers=w, batch_size=b,
                       cache_dir=str(cache), epochs=2)
        runs["ours, cache epoch 1"].append(e1)
        runs["ours, cache epoch 2"].append(e2)
        shutil.rmtree(cache, ignore_errors=True)
        loads.append(load_average())
    for name, stats in runs.items():
        if stats:
            result.runs[name] = [s["epoch_samples_per_s"] for s in stats]
            mid = sorted(stats, key=lambda s: s["epoch_samples_per_s"])[len(stats) // 2]
            result.rows[name] = dict(mid, epoch_mb_per_s=mid["epoch_samples_per_s"] * result.dataset["bytes"]
                                     / result.dataset["samples"] / MB)
    known = [x for x in loads if x is not None]
    result.load = {"min": min(known), "max": max(known)} if known else {}


# --------------------------------------------------------------------------- report
def remote_report(result: RemoteResult) -> str:
    """The run as text: ceilings, index open time, one row per loader, the two ratios."""
    d, cfg = result.dataset, result.config
    lines = [f"dataset-bench --remote on {machine_label(result.machine)}",
             f"{d['samples']} images in {d['shards']} wds shards, {d['bytes'] / MB:.0f} MB; uploaded to "
             f"loopback SeaweedFS at {d['upload_mb_s']:.0f} MB/s; {cfg['workers']} workers, batch "
             f"{cfg['batch_size']}, decode=False, median of {cfg['repeats']}",
             "loopback ceilings (same run): " + ", ".join(f"{k} {v:,.0f} MB/s" for k, v in result.ceilings.items())]
    io = result.index_open
    if io:
        lines.append(f"open_dataset over S3, {io['samples']:,}-sample wds index ({io['bytes'] / 2**20:.1f} MiB): "
                     f"{io['warm_process_s'] * 1000:.0f} ms in a warm process, "
                     f"{io['fresh_interpreter_s'] * 1000:.0f} ms in a fresh interpreter (s3fs import included)")
    lines += ["", f"{'reader':<26} {'epoch samples/s':>15} {'MB/s':>7} {'first batch s':>14} "
                  f"{'steady samples/s':>17} {'client CPU s/GB':>16}   epoch runs"]
    for name in ROWS:
        row = result.rows.get(name)
        if row is None:
            continue
        runs = ", ".join(f"{x:,.0f}" for x in result.runs.get(name, []))
        cpu = row.get("client_cpu_s")
        per_gb = f"{cpu / (d['bytes'] / 1e9):.2f}" if cpu is not None else "-"
        lines.append(f"{name:<26} {row['epoch_samples_per_s']:>15,.0f} {row['epoch_mb_per_s']:>7,.0f} "
                     f"{row['first_batch_s']:>14.2f} {row['samples_per_s']:>17,.0f} {per_gb:>16}   {runs}")
    lines.append("")
    for name, (ratio, target) in result.ratios().items():
        verdict = "n/a" if ratio is None else f"{ratio:.2f}x (target >= {target}x: {'met' if ratio >= target else 'MISSED'})"
        lines.append(f"{name}: {verdict}")
    if result.load:
        lines.append(f"load average during the run: {result.load['min']:.2f} .. {result.load['max']:.2f} "
                     f"({result.machine.get('usable_cpus', '?')} usable CPUs; other jobs share them)")
    lines += result.notes
    return "\n".join(lines)


def main_remote(args: Any) -> int:
    """``dataset-bench --remote`` (called by :mod:`dataset_bench.cli`)."""
    cfg = RemoteConfig(generate=args.generate or (200 if args.quick else 6000), src=args.src,
                       shards=4 if args.quick else 16, shard_count=args.shard_count,
                       workers=(args.workers or (2,))[-1], batch_size=args.batch_size or (16 if args.quick else 64),
                       repeats=args.repeats or (1 if args.quick else 3), work_dir=args.work,
                       index_samples=100_000 if args.quick else 1_281_167,
                       isolate=args.isolate if args.isolate is not None else not args.quick)

    def say(step: str) -> None:
        if args.progress:
            print(f"dataset-bench --remote: {step}", file=sys.stderr, flush=True)

    result = run_remote(cfg, say)
    print(remote_report(result))
    if args.json:
        print(f"wrote {result.save_json(args.json)}")
    return 0
