"""``dataset-bench``: measure the packed formats against a naive PIL ImageFolder, side by side.

The command line over :func:`dataset_bench.run.run_benchmark`: it parses the
arguments, draws the progress bar, prints the report and writes the JSON and
the chart. The only place in ``dataset_bench`` with argparse and tqdm.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading
from typing import Any, Callable, Sequence

from dataset_bench.measure import MODES
from dataset_bench.plan import CACHES, BenchConfig, describe_plan, planned_targets
from dataset_bench.report import draw_chart, report_text
from dataset_bench.run import BenchProgress, Stopped, clear_stop, request_stop, run_benchmark
from packer import PackError, SourceError
from readers.contract.spec import FORMATS

__all__ = ["build_parser", "build_fields_parser", "config_from_args", "main"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected counts >= 0, got {text!r}")
    return values


def _choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}; got {text!r}")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dataset-bench",
        description="Measure packed datasets (wds, lmdb, hdf5, mmap) against a naive PIL ImageFolder "
        "on this machine: samples/s, MB/s, time to first batch, PSS, warm and cold page cache, plus the "
        "machine's raw read and decode rates.",
        epilog="examples:\n"
        "  dataset-bench --generate 2000 --json bench.json --chart bench.png\n"
        "  dataset-bench --src imagenet/val --workers 0,4,8 --repeats 3\n"
        "  dataset-bench --src imagenet/val --datasets out/val-wds out/val-mmap --cache warm\n"
        "  dataset-bench --quick\n"
        "  dataset-bench --remote --generate 2000 --json remote.json\n"
        "  dataset-bench --peers [--quick]   side by side with the peers, every target ratio (see --peers --help)\n"
        "  dataset-bench --fields [--quick]  image+label vs the previous release, image+caption (see --fields --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--src", help="image folder (root/<class>/<image>): the naive baseline; packed into every "
                   "format when --datasets is not given")
    p.add_argument("--datasets", nargs="+", default=(), metavar="PATH", help="packed dataset folders to measure")
    p.add_argument("--generate", type=int, metavar="N", help="generate N ImageNet-like JPEGs and pack them "
                   "into all formats (mmap with resize=256)")
    p.add_argument("--work", metavar="DIR", help="keep generated and packed data here (default: a temporary "
                   "folder, removed afterwards)")
    p.add_argument("--formats", type=_choices(FORMATS), default=FORMATS, help="formats to pack/measure "
                   "(default: all)")
    p.add_argument("--workers", type=_int_list, default=None, help="num_workers values (default 0,2)")
    p.add_argument("--modes", type=_choices(MODES), default=MODES, help="raw (decode=False) and/or decoded")
    p.add_argument("--cache", type=_choices(CACHES), default=None, help="warm and/or cold page cache "
                   "(default warm; --full both)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default 64; --quick 16)")
    p.add_argument("--repeats", type=int, default=None, help="runs per figure; the median is reported "
                   "(default 1; --full 3)")
    p.add_argument("--full", action="store_true", help="the full run: warm and cold page cache, 3 repeats, "
                   "each measurement in a fresh process (about 5x the default's time; the plan says how long)")
    p.add_argument("--min-window-batches", type=int, default=None, help="a samples/s figure timed over fewer "
                   "batches is refused (default 10)")
    p.add_argument("--min-window-s", type=float, default=None, help="... or over fewer seconds (default 0.1)")
    p.add_argument("--max-samples", type=int, help="stop each pass after this many samples")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the naive baseline")
    p.add_argument("--no-limits", dest="limits", action="store_false", help="skip raw read/decode limits")
    p.add_argument("--shard-count", type=int, help="wds: samples per shard when packing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-isolate", dest="isolate", action="store_false", default=None,
                   help="measure in this process instead of a fresh process per measurement (faster start, "
                   "but PSS then includes whatever earlier cases left behind; --quick does this)")
    p.add_argument("--torch-threads", type=int, help="torch.set_num_threads for the run (default: torch's); "
                   "matters at --workers 0, where the transform runs in the main process")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON")
    p.add_argument("--chart", metavar="FILE", help="draw a PNG bar chart")
    p.add_argument("--quick", action="store_true", help="tiny run for smoke tests (48 images, one repeat)")
    p.add_argument("--remote", action="store_true", help="measure reading wds from a loopback S3 server "
                   "(SeaweedFS, started for the run): streaming, node cache epochs 1 and 2, the official "
                   "webdataset reader over the same server, the local disk (dataset_bench.remote)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    fields = {
        "src": args.src, "datasets": tuple(args.datasets), "generate": args.generate, "work_dir": args.work,
        "formats": tuple(args.formats), "workers": args.workers, "modes": tuple(args.modes),
        "caches": tuple(args.cache) if args.cache else None, "batch_size": args.batch_size, "repeats": args.repeats,
        "max_samples": args.max_samples, "baseline": args.baseline, "limits": args.limits,
        "shard_count": args.shard_count, "seed": args.seed, "torch_threads": args.torch_threads,
        "isolate": args.isolate, "min_window_batches": args.min_window_batches, "min_window_s": args.min_window_s,
    }
    if args.quick and args.full:
        raise ValueError("--quick and --full ask for opposite runs; give one")
    if args.quick:
        return BenchConfig.quick_defaults(**fields)
    if args.full:
        return BenchConfig.full_defaults(**fields)
    return BenchConfig(**{k: v for k, v in fields.items() if v is not None})


class _Bar:
    """A tqdm bar on stderr driven by :class:`dataset_bench.run.BenchProgress` reports."""

    def __init__(self) -> None:
        from tqdm import tqdm

        tqdm.monitor_interval = 0  # no monitor thread in a process that forks loader workers
        self.bar = tqdm(total=0, file=sys.stderr, unit="step", dynamic_ncols=True)

    def __call__(self, p: BenchProgress) -> None:
        if p.total and self.bar.total != p.total:
            self.bar.reset(total=p.total)
        self.bar.n = p.done
        self.bar.set_description(p.step, refresh=True)

    def close(self) -> None:
        self.bar.close()


def _missing_for(args: argparse.Namespace) -> str | None:
    """What optional package the asked-for outputs need and is not installed (None: nothing)."""
    import importlib.util

    if args.chart and importlib.util.find_spec("matplotlib") is None:
        return ("--chart needs matplotlib, which is not installed: pip install 'dataset-packer[bench]' "
                "(or pip install matplotlib), or leave out --chart")
    return None


def build_fields_parser() -> argparse.ArgumentParser:
    from dataset_bench.fieldsbench import BASELINE_REV, FORMATS as FIELDS_FORMATS, MODES as FIELDS_MODES

    p = argparse.ArgumentParser(
        prog="dataset-bench --fields",
        description="Image+label reading of the previous release beside this checkout in the same run (each "
        "case in a fresh interpreter, interleaved, median and min-max of the repeats), plus image+caption rows "
        "(a JSONL manifest of the same images with a caption per row, read with fields=('image', 'caption')).",
        epilog="examples:\n"
        "  dataset-bench --fields --generate 2000 --json fields.json\n"
        "  dataset-bench --fields --baseline-rev v0.9 --formats wds,mmap --repeats 5\n"
        "  dataset-bench --fields --quick",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    old = p.add_mutually_exclusive_group()
    old.add_argument("--baseline-rev", default=None, metavar="REV", help="git commit of the previous release; "
                     f"its readers/ is exported with git archive (default {BASELINE_REV})")
    old.add_argument("--baseline-src", metavar="DIR", help="a folder holding the previous release's readers/ "
                     "package, instead of --baseline-rev")
    p.add_argument("--generate", type=int, metavar="N", help="ImageNet-like JPEGs to generate (default 2000; "
                   "--quick 48)")
    p.add_argument("--work", metavar="DIR", help="keep generated and packed data here (default: a temporary "
                   "folder, removed afterwards; an existing DIR/images is reused)")
    p.add_argument("--formats", type=_choices(FIELDS_FORMATS), default=None, help="formats (default: all; --quick wds)")
    p.add_argument("--modes", type=_choices(FIELDS_MODES), default=None, help="raw (decode=False) and/or decoded")
    p.add_argument("--workers", type=_int_list, default=None, help="num_workers with workers='processes' "
                   "(default 0,2; --quick 0)")
    p.add_argument("--defaults-workers", type=_int_list, default=None, help="num_workers also read with "
                   "make_loader's default worker kind (no workers=; default 2; --quick none)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved runs per case (default 3; --quick 1)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default 64; --quick 16)")
    p.add_argument("--max-samples", type=int, help="stop each pass after this many samples")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON")
    p.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    return p


def _fields_main(argv: Sequence[str]) -> int:
    from dataset_bench.fieldsbench import FieldsConfig, fields_report, run_fields_bench

    parser = build_fields_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    given = {"generate": args.generate, "formats": args.formats, "modes": args.modes, "workers": args.workers,
             "defaults_workers": args.defaults_workers, "repeats": args.repeats, "batch_size": args.batch_size,
             "max_samples": args.max_samples, "baseline_rev": args.baseline_rev, "baseline_src": args.baseline_src,
             "work_dir": args.work}
    for name in ("generate", "repeats", "batch_size", "max_samples"):
        if given[name] is not None and given[name] < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {given[name]}")
    config = (FieldsConfig.quick_defaults(**given) if args.quick
              else FieldsConfig(**{k: v for k, v in given.items() if v is not None}))
    result = _measure(args.progress, lambda bar: run_fields_bench(config, progress=None if bar is None else (
        lambda step, done, total: bar(BenchProgress(step=step, done=done, total=total)))))
    if result is None:
        return 1
    print(fields_report(result))
    if args.json:
        print(f"wrote {result.save_json(args.json)}")
    return 0


def _measure(progress: bool, work: Callable[[Any], Any]) -> Any:
    """``work(bar)`` with a progress bar when asked (None otherwise), closed however it ends; a
    failure is one ``dataset-bench: error:`` line on stderr and None."""
    bar: Any = _Bar() if progress else None
    try:
        return work(bar)
    except (ValueError, OSError, RuntimeError, PackError, SourceError) as exc:
        print(f"dataset-bench: error: {exc}", file=sys.stderr)
        return None
    finally:
        if bar is not None:
            bar.close()


def _say_plan(config: BenchConfig) -> None:
    """What the run will do and about how long it takes, on stderr, before it starts."""
    from dataset_bench.machine import load_average
    from readers.contract.env import available_cpus

    samples, targets = planned_targets(config)
    for line in describe_plan(config, samples, targets, cpus=available_cpus(), load=load_average()):
        print(f"dataset-bench: {line}", file=sys.stderr)


def _on_sigterm(owner: int, raised: list[bool], signum: int, _frame: Any) -> None:
    """SIGTERM raised as :class:`dataset_bench.run.Stopped` where the run is, so that every ``finally``
    on the way out runs: measurement processes stopped (:func:`dataset_bench.isolate.stop_group`),
    temporary folders removed; the run's next step raises it again should something swallow it."""
    if os.getpid() != owner:  # a forked child (a loader worker, a pool process) inherited the handler: die as asked
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if not raised:  # once: a second SIGTERM does not cut the clean-up short (and no SIG_IGN, which the
        raised.append(True)  # processes a pool's thread forks during the clean-up would inherit)
        request_stop(128 + signum)
        raise Stopped(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """``dataset-bench``; SIGTERM stops it cleanly: no measurement process left running, no temporary
    folder left behind, exit code 143."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, os.getpid(), []))
    try:
        return _main(argv)
    except Stopped as exc:
        print("dataset-bench: stopped by SIGTERM; measurement processes ended, temporary files removed",
              file=sys.stderr)
        return int(exc.code or 143)
    finally:
        clear_stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "--fields" in args_list:  # image+label vs the previous release, image+caption (--fields --help)
        args_list.remove("--fields")
        return _fields_main(args_list)
    if "--peers" in args_list:  # the side-by-side run with the peers (its own options: --peers --help)
        from dataset_bench.sidecli import main as peers_main

        args_list.remove("--peers")
        return peers_main(args_list)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.remote:
        from dataset_bench.remote import main_remote

        try:
            return main_remote(args)
        except (ValueError, OSError, RuntimeError, PackError, SourceError) as exc:
            print(f"dataset-bench: error: {exc}", file=sys.stderr)
            return 1
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    missing = _missing_for(args)
    if missing:  # before measuring: minutes of work would end in an ImportError
        print(f"dataset-bench: error: {missing}", file=sys.stderr)
        return 2
    _say_plan(config)
    result = _measure(args.progress, lambda bar: run_benchmark(config, progress=bar))
    if result is None:
        return 1
    print(report_text(result))
    if args.json:
        print(f"wrote {result.save_json(args.json)}")
    if args.chart:
        print(f"wrote {draw_chart(result, args.chart)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
