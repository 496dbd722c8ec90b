"""``pack-dataset``: the command line, a thin layer over :func:`packer.pack`.

Exit codes: 0 done; 1 the work failed (I/O error, disk full, --strict
reject, damaged dataset found by ``verify``); 2 usage error or bad input,
nothing written; 3 done, but some images were rejected (listed in
``rejects.jsonl`` beside the output).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

from packer.options import DEFAULT_SHARD_SIZE, PackOptions, parse_size
from readers.spec import FORMATS

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_REJECTS"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTS = 0, 1, 2, 3

EPILOG = """\
examples:
  pack-dataset imagenet/train --format wds  -o out/train-wds
  pack-dataset imagenet/train --format lmdb -o out/train-lmdb --max-side 512
  pack-dataset imagenet/train --format mmap -o out/train-mmap --resize 256
  pack-dataset imagenet/      --format hdf5 -o out/imagenet-h5   (packs train/ and val/)
  pack-dataset verify out/train-wds

exit codes: 0 done, 1 failed (resumable with --resume), 2 usage error (nothing written),
            3 done but some images were rejected (see rejects.jsonl beside the output)
"""


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pack-dataset",
        description="Pack an ImageFolder tree (root/<class>/<image>) into WebDataset shards, LMDB, HDF5 "
        "or memory-mapped uint8 arrays. 'pack-dataset verify PATH' checks a packed dataset.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", type=Path, help="image folder: root/<class>/<image>, or root/<split>/<class>/<image>")
    p.add_argument("-f", "--format", required=True, choices=FORMATS, help="output format")
    p.add_argument("-o", "--output", type=Path, help="output folder (default: SRC-FORMAT beside SRC)")
    p.add_argument("-w", "--workers", type=_positive, help="worker processes (default: usable CPUs, cgroup-aware)")
    p.add_argument("--shard-size", type=_size, default=DEFAULT_SHARD_SIZE,
                   help="wds: start a new shard once a shard reaches this size (default 256MB)")
    p.add_argument("--shard-count", type=_positive, help="wds: ...or once it holds this many samples")
    p.add_argument("--max-side", type=_positive, help="downscale so the longer side is at most N pixels")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality for re-encoded images (default 90)")
    p.add_argument("--resize", type=_positive,
                   help="mmap: shorter side to N, then center crop NxN (one N x N x 3 array)")
    p.add_argument("--no-validate", dest="validate", action="store_false",
                   help="do not decode images at pack time (for data you already trust)")
    p.add_argument("--strict", action="store_true", help="stop at the first image that cannot be packed")
    p.add_argument("--max-pixels", type=_positive, default=PackOptions.max_pixels,
                   help="reject images with more pixels than this (decompression bombs)")
    p.add_argument("--follow-symlinks", action="store_true", help="follow symlinks that point outside SRC")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace an existing output")
    g.add_argument("--resume", action="store_true", help="finish an interrupted pack with the same options")
    p.add_argument("--checkpoint-bytes", type=_size, default=PackOptions.checkpoint_bytes,
                   help="lmdb/hdf5/mmap: make progress durable (resumable) every this many bytes (default 64MB)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def _progress_factory(quiet: bool):
    def factory(split, source):
        if quiet:
            return None
        from tqdm import tqdm

        bar = tqdm(total=len(source.paths), unit="img", desc=f"pack {split}", dynamic_ncols=True,
                   smoothing=0.05, mininterval=0.5)
        state = {"bytes": 0, "t0": time.perf_counter()}

        def update(images: int, nbytes: int) -> None:
            state["bytes"] += nbytes
            bar.update(images)
            if bar.n == bar.total:
                bar.close()
            elif bar.n % 64 == 0:
                elapsed = time.perf_counter() - state["t0"]
                bar.set_postfix_str(f"{state['bytes'] / 1e6 / max(elapsed, 1e-9):.1f} MB/s", refresh=False)

        return update

    return factory


def _pack_main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from packer.api import pack
    from packer.pipeline import OutputError, PackError
    from packer.source import SourceError

    out = args.output or args.src.parent / f"{args.src.resolve().name}-{args.format}"
    try:
        options = PackOptions(
            format=args.format, workers=args.workers, shard_size=args.shard_size, shard_count=args.shard_count,
            max_side=args.max_side, quality=args.quality, resize=args.resize, validate=args.validate,
            strict=args.strict, max_pixels=args.max_pixels, follow_symlinks=args.follow_symlinks,
            overwrite=args.overwrite, resume=args.resume, checkpoint_bytes=args.checkpoint_bytes,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        results = pack(args.src, out, options, progress=_progress_factory(args.quiet))
    except (SourceError, OutputError) as exc:
        print(f"pack-dataset: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PackError as exc:
        print(f"pack-dataset: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"pack-dataset: interrupted; {out} is incomplete, re-run with --resume to finish it",
              file=sys.stderr)
        return 130
    for r in results:
        print(r.summary())
    return EXIT_REJECTS if any(r.rejected for r in results) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="pack-dataset: %(levelname)s: %(message)s")
    if argv and argv[0] == "verify":
        from packer.verify import main as verify_main

        return verify_main(argv[1:])
    return _pack_main(argv)


if __name__ == "__main__":
    sys.exit(main())
