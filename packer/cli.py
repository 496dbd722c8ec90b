"""``pack-dataset``: the command line, a thin layer over :func:`packer.pack`.

Exit codes: 0 done; 1 the work failed (I/O error, disk full, --strict
reject, damaged dataset found by ``verify``); 2 usage error or bad input,
nothing written; 3 done, but some images were rejected (listed in
``rejects.jsonl`` beside the output).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from packer.errors import PackerError, PackError, UsageError
from packer.options import Flag, PackOptions, cli_fields

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_REJECTS"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTS = 0, PackError.exit_code, UsageError.exit_code, 3

EPILOG = """\
examples:
  pack-dataset imagenet/train --format wds  -o out/train-wds
  pack-dataset imagenet/train --format lmdb -o out/train-lmdb --max-side 512
  pack-dataset imagenet/train --format mmap -o out/train-mmap --resize 256
  pack-dataset imagenet/      --format hdf5 -o out/imagenet-h5   (packs train/ and val/)
  pack-dataset imagenet/train --format wds  -o s3://bucket/imagenet/train-wds   (uploads as it goes)
  pack-dataset verify out/train-wds
  pack-dataset verify s3://bucket/imagenet/train-wds

exit codes: 0 done, 1 failed (resumable with --resume), 2 usage error (nothing written),
            3 done but some images were rejected (see rejects.jsonl beside the output)
"""


def _arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse ``type=`` for a parser that raises ValueError with a one-line reason."""
    if isinstance(parse, type):
        return parse  # a builtin such as int: argparse's own message ("invalid int value: 'x'")

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _add_option(target: Any, f: dataclasses.Field, flag: Flag) -> None:
    kwargs: dict[str, Any] = {"dest": f.name, "help": flag.help_for(f.default)}
    if flag.action:
        kwargs["action"] = flag.action
    if flag.parse:
        kwargs["type"] = _arg_type(flag.parse)
    if flag.choices:
        kwargs["choices"] = flag.choices
    if flag.required:
        kwargs["required"] = True
    else:
        kwargs["default"] = f.default
    target.add_argument(*flag.flags, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pack-dataset",
        description="Pack an ImageFolder tree (root/<class>/<image>) into WebDataset shards, LMDB, HDF5 "
        "or memory-mapped uint8 arrays. 'pack-dataset verify PATH' checks a packed dataset.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", type=Path, help="image folder: root/<class>/<image>, or root/<split>/<class>/<image>")
    groups: dict[str, Any] = {}
    for f, flag in cli_fields():
        target = p
        if flag.exclusive_group:
            if flag.exclusive_group not in groups:
                groups[flag.exclusive_group] = p.add_mutually_exclusive_group()
            target = groups[flag.exclusive_group]
        _add_option(target, f, flag)
        if f.name == "format":  # listed right after --format, as --help always showed it
            p.add_argument("-o", "--output", type=output_location,
                           help="output folder, or s3://bucket/prefix (default: SRC-FORMAT beside SRC)")
    p.add_argument("--stage-dir", type=Path, metavar="DIR",
                   help="s3:// output: stage files here before upload (default: $DATASET_PACKER_STAGE or "
                        "~/.cache/dataset-packer/stage/...)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def output_location(text: str) -> Path | str:
    """``-o``: a local folder (Path), or a remote URL kept as text (``Path`` would fold ``s3://`` to ``s3:/``)."""
    from readers.spec import is_remote

    return text if is_remote(text) else Path(text)


def _upload_bar_factory(quiet: bool):
    def factory(split):
        if quiet:
            return None
        from tqdm import tqdm

        bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=f"upload {split}", dynamic_ncols=True,
                   mininterval=0.5)
        return bar.update

    return factory


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

    out = args.output or args.src.parent / f"{args.src.resolve().name}-{args.format}"
    try:
        options = PackOptions(**{f.name: getattr(args, f.name) for f, _ in cli_fields()})
    except ValueError as exc:
        parser.error(str(exc))
    remote = {}
    if isinstance(out, str):
        remote = {"stage_dir": args.stage_dir, "upload_progress": _upload_bar_factory(args.quiet)}
    elif args.stage_dir is not None:
        parser.error("--stage-dir applies to an s3:// output only")
    try:
        results = pack(args.src, out, options, progress=_progress_factory(args.quiet), **remote)
    except PackerError as exc:
        word = "error" if isinstance(exc, UsageError) else "failed"
        print(f"pack-dataset: {word}: {exc}", file=sys.stderr)
        return exc.exit_code
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
