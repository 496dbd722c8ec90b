"""``dataset-bench --peers`` (and ``benchmarks/bench_peers.py``): side by side with the peers, in one
interleaved run; prints every target ratio with met / not met.

Reading (naive folder, naive ``np.memmap`` Dataset, LMDB by hand, the
official webdataset reader, a plain thread pool, FFCV when installed, and
every format of ours in every mode with 0 and 2 workers, processes and
threads, and with 2 workers ``make_loader``'s defaults; the modes are
``dataset_bench.sidecases.MODES``: pixels, raw224, bytes, decoded, train,
pil), packing (ours with validation on and off against LMDB by hand,
``webdataset.ShardWriter`` and mosaicml-streaming's ``MDSWriter`` when
installed) and the loaders' private memory. See ``dataset_bench/sidebyside.py``. Usage::

    dataset-bench --peers --json side.json --chart side.png   # ~15 min on 2 cores
    dataset-bench --peers --quick                             # under a minute (CI smoke test)
    dataset-bench --peers --from-json side.json --markdown side.md --chart side.png   # re-render, no measuring
    dataset-bench --peers --quick --peer-venvs /work/peervenvs   # each 2026 peer from its own venv, <dir>/<peer>/

The 2026 peers (DALI CPU, SPDL, Grain + ArrayRecord, Lance, Megatron-Energon) are each optional; a
missing one is one line ``peer X skipped: not installed (pip install ...)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dataset_bench.peers import NEW_PEERS, peer_pythons
from dataset_bench.sidebyside import run_side_by_side
from dataset_bench.sidecases import SideConfig
from dataset_bench.sidereport import draw_side_chart, markdown, report, targets

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dataset-bench --peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SideConfig()
    p.add_argument("--images", type=int, default=d.images)
    p.add_argument("--repeats", type=int, default=d.repeats, help="passes per read case (median)")
    p.add_argument("--pack-repeats", type=int, default=d.pack_repeats, help="packs per packer (median)")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--workers", type=int, default=d.workers, help="worker count compared with 0 (default 2)")
    p.add_argument("--min-seconds", type=float, default=d.min_seconds, help="timed seconds per read case")
    p.add_argument("--no-pack", action="store_true", help="skip the packing cases")
    p.add_argument("--no-decoded", action="store_true", help="skip the decoded cases")
    p.add_argument("--no-isolate", action="store_true", help="measure in this process (memory figures mix)")
    p.add_argument("--torch-threads", type=int, default=d.torch_threads,
                   help="torch intra-op threads per measuring process (0: torch's default; default 1)")
    p.add_argument("--quick", action="store_true", help="tiny run, seconds (CI: proves the harness works)")
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--chart", type=Path, help="write a PNG chart here")
    p.add_argument("--markdown", type=Path, help="write the tables as Markdown here (for the docs)")
    p.add_argument("--work-dir", help="keep generated and packed data here (default: a temp dir, removed)")
    p.add_argument("--peer-python", action="append", default=[], metavar="PEER=PYTHON",
                   help=f"run 2026 peer PEER ({', '.join(NEW_PEERS)}) in this interpreter (its own venv); repeatable")
    p.add_argument("--peer-venvs", type=Path, metavar="DIR", help="each 2026 peer from DIR/<peer>/bin/python where "
                   "that exists (--peer-python wins)")
    p.add_argument("--from-json", type=Path, metavar="JSON", help="measure nothing: print the report of a run "
                   "saved with --json (and write --markdown / --chart from it)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_json:
        try:
            result = json.loads(args.from_json.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--from-json {args.from_json}: {exc}")
        try:
            return _outputs(result, args)
        except (KeyError, TypeError, AttributeError) as exc:
            parser.error(f"--from-json {args.from_json}: not a result of dataset-bench --peers --json "
                         f"({type(exc).__name__}: {exc})")
    pythons = peer_pythons(parser, args)
    fields = {"images": args.images, "repeats": args.repeats, "pack_repeats": args.pack_repeats,
              "batch_size": args.batch_size, "workers": args.workers, "min_seconds": args.min_seconds,
              "pack": not args.no_pack, "decoded": not args.no_decoded, "work_dir": args.work_dir,
              "torch_threads": args.torch_threads or None, "peer_pythons": pythons}
    if args.no_isolate:
        fields["isolate"] = False
    if args.quick:
        defaults = SideConfig()
        cfg = SideConfig.quick(**{k: v for k, v in fields.items()
                                  if k in ("pack", "decoded", "work_dir", "torch_threads", "peer_pythons")
                                  or v != getattr(defaults, k)})
    else:
        cfg = SideConfig(**fields)
    result = run_side_by_side(cfg, progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    return _outputs(result, args)


def _outputs(result: dict, args: argparse.Namespace) -> int:
    """Print the report of ``result`` and write the files asked for."""
    result["targets"] = targets(result)
    print(report(result))
    if args.json and args.json != args.from_json:
        args.json.write_text(json.dumps(result, indent=1, default=_plain))
        print(f"wrote {args.json}")
    if args.chart:
        print(f"wrote {draw_side_chart(result, args.chart)}")
    if args.markdown:
        args.markdown.write_text(markdown(result) + "\n")
        print(f"wrote {args.markdown}")
    return 0


def _plain(value):  # numpy arrays / numbers in the result
    try:
        return value.tolist()
    except AttributeError:
        return str(value)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
