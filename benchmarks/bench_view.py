"""``pack-dataset view``: the time to open a dataset and to serve a page of 100 thumbnails, and the time to
open and show the overview of a huge index-only dataset (issue 36).

Three datasets, each measured in a fresh process (``--probe``; ``--quick``: in this one), through the real
server over HTTP:

* **photos**: the bundled photos (examples/real-images, 31 of them) packed into lmdb;
* **pack**: N tiny JPEGs (32 x 32, 1,000 classes; default 1.28M) packed into wds with the real packer
  (built by ``benchmarks/scale_data.py``, kept in ``--workdir`` between runs);
* **index**: an index-only lmdb dataset of N samples (default 100M; ``scale_data.index_only``: the index
  arrays real at N, the data file a 64-image one), opened twice: the first open on a machine checks
  every index array once (the readers' check, ``readers.contract.checkcache``), later ones do not.

Per dataset: ``import_s`` (packer, readers, torch, aiohttp, jinja2: once per process), ``open_s``
(:class:`packer.tools.view.data.DatasetView`: index.json and the mapped index arrays, no sample read),
``overview_s`` (GET / with its class histogram), ``grid_first_s`` (GET of the first page of 100
thumbnails) and ``grid_s`` (the median of GETs of 3 more pages, shuffled with seeds 1, 2, 3) and the
process's RSS after opening. A ratio line compares each ``open_s`` with the photos' (same run,
same machine). The page cache is not dropped (other work shares the machine): a file read before is
warm. Run from the repository root::

    python benchmarks/bench_view.py                       # photos, a 1.28M pack, a 100M index
    python benchmarks/bench_view.py --pack-size 100000    # a smaller pack where 1.28M takes too long
    python benchmarks/bench_view.py --quick               # photos, a 500 pack, a 100k index, in this process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for p in (ROOT, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))  # run from a checkout without installing; scale_data beside this file

PER_PAGE = 100


def _get(url: str) -> tuple[float, bytes]:
    from urllib.request import urlopen

    t0 = time.perf_counter()
    with urlopen(url, timeout=600) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def probe(path: str) -> dict[str, Any]:
    """Open ``path`` in this (fresh) process, serve it, and time the pages."""
    t0 = time.perf_counter()
    from packer.tools.view.data import DatasetView
    from packer.tools.view.server import Server
    import matplotlib.figure  # noqa: F401 - what opening and the first overview import: counted in import_s
    import readers.formats.registry  # noqa: F401 - torch
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    view = DatasetView(path)
    open_s = time.perf_counter() - t0
    rss = _rss()
    with view, Server(view) as server:
        overview_s, page = _get(server.url)
        assert b'class="samples"' in page
        first_s, grid = _get(f"{server.url}grid?per={PER_PAGE}")
        shown, errors = grid.count(b'<img class="thumb"'), grid.count(b'<div class="err">')
        more = [_get(f"{server.url}grid?per={PER_PAGE}&seed={seed}")[0] for seed in (1, 2, 3)]
    return {"samples": sum(s.samples for s in view.splits.values()), "import_s": import_s, "open_s": open_s,
            "rss_mb": rss / 1e6, "overview_s": overview_s, "grid_first_s": first_s, "grid_s": statistics.median(more),
            "thumbnails": shown, "errors_in_place": errors, "page_kb": len(grid) / 1e3}


def _child(path: Path, in_process: bool = False) -> dict[str, Any]:
    if in_process:  # --quick: no fresh interpreter (import_s is then paid by the first probe only)
        return probe(str(path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--probe", str(path)], capture_output=True,
                       text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"probe of {path} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def build_photos(work: Path) -> Path:
    out = work / "view" / "photos-lmdb"
    if not (out / "index.json").exists():
        from packer.api import pack
        from packer.options import PackOptions

        pack(ROOT / "examples" / "real-images", out, PackOptions(format="lmdb", workers=1, overwrite=True))
    return out


def build_pack(work: Path, n: int, procs: int, workers: int) -> tuple[Path, float]:
    """A wds pack of ``n`` 32 x 32 JPEGs (scale_data's images and options); seconds spent building it."""
    from scale_data import make_images, pack_options

    out = work / "packs" / f"wds-{n}"
    t0 = time.perf_counter()
    if not (out / "index.json").exists():
        from packer.api import pack
        from packer.options import PackOptions

        src = work / f"images-{n}"
        make_images(src, n, procs, work / "images-unique")
        pack(src, out, PackOptions(**pack_options("wds", workers)))
    return out, time.perf_counter() - t0


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from scale_data import index_only

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    photos = build_photos(work)
    here = args.quick
    rows.append({"dataset": "photos (lmdb)", **_child(photos, here)})
    pack_dir, built = build_pack(work, args.pack_size, args.procs, args.workers)
    rows.append({"dataset": f"pack {args.pack_size:,} (wds)", "build_s": built, **_child(pack_dir, here)})
    t0 = time.perf_counter()
    index = index_only(work, "lmdb", args.index_size)
    built = time.perf_counter() - t0
    rows.append({"dataset": f"index-only {args.index_size:,} (lmdb), first open", "build_s": built,
                 **_child(index, here)})
    rows.append({"dataset": f"index-only {args.index_size:,} (lmdb), again", **_child(index, here)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["open_s", "overview_s", "grid_first_s", "grid_s", "thumbnails", "errors_in_place", "import_s", "rss_mb"]
    width = max(len(r["dataset"]) for r in rows)
    lines = [f"{'dataset':<{width}}  {'samples':>11}  " + "  ".join(f"{c:>15}" for c in cols)]
    for r in rows:
        cells = [f"{r[c]:15.3f}" if isinstance(r[c], float) else f"{r[c]:>15}" for c in cols]
        lines.append(f"{r['dataset']:<{width}}  {r['samples']:>11,}  " + "  ".join(cells))
    base = rows[0]["open_s"]
    lines.append("open_s / the photos' open_s: " + ", ".join(
        f"{r['dataset']} {r['open_s'] / base:.2f}x" for r in rows[1:]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="a 500-image pack and a 100k index, measured in this process (the CI smoke test)")
    p.add_argument("--workdir", default="/work/big/scale", help="where data is built and kept (default %(default)s)")
    p.add_argument("--pack-size", type=int, default=None, help="images in the pack (default 1.28M; --quick 500)")
    p.add_argument("--index-size", type=int, default=None, help="samples of the index (default 100M; --quick 100k)")
    p.add_argument("--procs", type=int, default=2, help="processes generating images (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="packer workers (default %(default)s)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return 0
    if args.pack_size is None:
        args.pack_size = 500 if args.quick else 1_280_000
    if args.index_size is None:
        args.index_size = 100_000 if args.quick else 100_000_000
    rows = run(args)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
