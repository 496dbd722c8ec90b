"""``pack-dataset``: the command line, a thin layer over :func:`packer.pack`.

Exit codes: 0 done; 1 the work failed (I/O error, disk full, --strict
reject, damaged dataset found by ``verify``); 2 usage error or bad input,
nothing written; 3 done, but some images were rejected (listed in
``rejects.jsonl`` beside the output); 130 interrupted by Ctrl-C (SIGINT),
143 stopped by SIGTERM (both resumable with ``--resume``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from packer.errors import PackerError, PackError, UsageError
from packer.options import Flag, PackOptions, cli_fields
from readers.spec import DatasetFormatError

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_REJECTS"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTS = 0, PackError.exit_code, UsageError.exit_code, 3

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
            p.add_argument("-o", "--output", type=Path, help="output folder (default: SRC-FORMAT beside SRC)")
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

    out = args.output or args.src.parent / f"{args.src.resolve().name}-{args.format}"
    try:
        options = PackOptions(**{f.name: getattr(args, f.name) for f, _ in cli_fields()})
    except ValueError as exc:
        parser.error(str(exc))
    try:
        results = pack(args.src, out, options, progress=_progress_factory(args.quiet))
    except PackerError as exc:
        word = "error" if isinstance(exc, UsageError) else "failed"
        print(f"pack-dataset: {word}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        code = getattr(exc, "exit_code", 130)
        if os.path.lexists(out):
            print(f"pack-dataset: {_stopped(exc)}; {out} is incomplete, re-run the same command with --resume "
                  "to finish it", file=sys.stderr)
        else:
            print(f"pack-dataset: {_stopped(exc)} before anything was written", file=sys.stderr)
        return code
    except (OSError, DatasetFormatError) as exc:  # outside the pack's own handling: still one line
        print(f"pack-dataset: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for r in results:
        print(r.summary())
    return EXIT_REJECTS if any(r.rejected for r in results) else EXIT_OK


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (everything closed, resumable), with exit code 128 + 15."""

    exit_code = 128 + signal.SIGTERM


def _stopped(exc: BaseException) -> str:
    return "stopped by SIGTERM" if isinstance(exc, Terminated) else "interrupted"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="pack-dataset: %(levelname)s: %(message)s")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if argv and argv[0] == "verify":
            from packer.verify import main as verify_main

            try:
                return verify_main(argv[1:])
            except KeyboardInterrupt as exc:
                print(f"pack-dataset verify: {_stopped(exc)}", file=sys.stderr)
                return getattr(exc, "exit_code", 130)
        return _pack_main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
