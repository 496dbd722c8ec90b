"""``pack-dataset``: the command line, a thin layer over :func:`packer.pack` and friends.

Subcommands: ``pack`` (the default: ``pack-dataset SRC -f wds`` is
``pack-dataset pack SRC -f wds``), ``convert``, ``merge``, ``verify``, ``info``, ``view`` and ``index``.
The option flags of ``pack`` and ``convert`` come from the
:class:`packer.options.PackOptions` field metadata.

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
from typing import Any, Callable, NoReturn, Sequence

from packer.errors import PackerError, PackError, UsageError
from packer.options import GROUPS, Flag, OptionError, PackOptions, RemoteOptions, cli_fields
from packer.progress import bar as progress_bar
from packer.progress import upload_bars
from readers.contract.location import UnsupportedLocationError, parse_location
from readers.contract.spec import DatasetFormatError

__all__ = ["main", "build_parser", "build_main_parser", "COMMANDS",
           "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_REJECTS"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTS = 0, PackError.exit_code, UsageError.exit_code, 3

EXIT_CODES = """\
exit codes: 0 done, 1 failed (the message says whether --resume continues), 2 usage error (nothing written),
            3 done but some images were rejected (see rejects.jsonl beside the output),
            130 interrupted (Ctrl-C), 143 stopped by SIGTERM (both resumable with --resume)
"""

EPILOG = """\
examples:
  pack-dataset imagenet/train -f wds  -o out/train-wds
  pack-dataset imagenet/train -f lmdb -o out/train-lmdb --max-side 512
  pack-dataset imagenet/train -f mmap -o out/train-mmap --resize 256
  pack-dataset imagenet/      -f hdf5 -o out/imagenet-h5      (packs train/ and val/)
  pack-dataset shards/        -f lmdb -o out/from-shards      (WebDataset shards written by other tools)
  pack-dataset captions.csv   -f wds  -o out/captions         (image + caption + other columns as fields)
  pack-dataset annotations/instances_val2017.json --images val2017/ -f lmdb -o out/coco-val
  pack-dataset convert out/train-wds -f lmdb -o out/train-lmdb
  pack-dataset imagenet/train --format wds  -o s3://bucket/imagenet/train-wds   (uploads as it goes)
  pack-dataset verify out/train-wds
  pack-dataset verify s3://bucket/imagenet/train-wds
  pack-dataset info out/train-wds
  pack-dataset view out/train-wds            (a web page of it: http://127.0.0.1:PORT/)
  pack-dataset index laion/shard-{000000..000999}.tar -o laion-index   (shards stay where they are)

""" + EXIT_CODES

#: subcommand -> one-line description (the order of ``pack-dataset --help``)
COMMANDS = {
    "pack": "pack an image folder, a CSV/JSONL/Parquet manifest, COCO annotations, WebDataset shards or a "
            "Hugging Face dataset, with its typed fields (the default command)",
    "convert": "turn a packed dataset into another format, checking every sample's checksum",
    "merge": "join packed datasets of one format and schema into one, checking every sample's checksum",
    "verify": "recompute every checksum of a packed dataset; name each damaged sample",
    "info": "what a packed (or interrupted) dataset holds, and how to resume it",
    "view": "look at a packed dataset in a web browser: overview, thumbnails, samples with their boxes, rejects",
    "index": "index WebDataset shards where they are (a folder, glob, brace pattern or list; local or a "
             "bucket) without copying them",
}

SRC_HELP = ("what to pack (one of the kinds above; a COCO .json takes --images DIR), or an s3://bucket/prefix "
            "holding root/<class>/<image> objects")


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage error is its one useful line and where to look next::

        pack-dataset pack: error: argument -f/--format: invalid choice: 'zip' (choose from ...)
        try 'pack-dataset pack --help'

    (argparse prints its whole usage block first: 13 lines for ``pack``). Exit code 2, as argparse's.
    ``help_command`` is the command the hint names (default: ``PROG --help``).
    """

    def __init__(self, *args: Any, help_command: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_command = help_command or f"{self.prog} --help"

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\ntry '{self.help_command}'\n")


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


def _add_option(target: Any, f: dataclasses.Field, flag: Flag, required: bool | None = None) -> None:
    """Add ``f``'s flag; ``required=False`` makes a required flag optional with no default (None)."""
    kwargs: dict[str, Any] = {"dest": f.name, "help": flag.help_for(f.default)}
    if flag.action:
        kwargs["action"] = flag.action
    if flag.parse:
        kwargs["type"] = _arg_type(flag.parse)
    if flag.choices:
        kwargs["choices"] = flag.choices
    if flag.metavar:
        kwargs["metavar"] = flag.metavar
    if flag.required and required is not False:
        kwargs["required"] = True
    else:
        kwargs["default"] = None if flag.required else f.default
    target.add_argument(*flag.flags, **kwargs)


def _groups(p: argparse.ArgumentParser, command: str) -> dict[str, Any]:
    """The --help sections (packer.options.GROUPS) that ``command``'s options fall in, created in order."""
    used = {flag.group for _, flag in cli_fields(command)} | {"source", "output"} | (
        {"remote"} if command in ("pack", "convert") else set())
    return {key: p.add_argument_group(title, description) for key, (title, description) in GROUPS.items()
            if key in used}


def _add_options(p: argparse.ArgumentParser, command: str, src: Callable[[Any], None], output_help: str) -> None:
    """SRC (``src(group)`` adds it), the PackOptions flags ``command`` takes, -o and -q, in --help's sections."""
    groups = _groups(p, command)
    src(groups["source"])
    exclusive: dict[str, Any] = {}
    for f, flag in cli_fields(command):
        target = groups[flag.group]
        if flag.exclusive_group:
            if flag.exclusive_group not in exclusive:
                exclusive[flag.exclusive_group] = target.add_mutually_exclusive_group()
            target = exclusive[flag.exclusive_group]
        # -f of pack: OUT's format by default with --append (_pack asks for it otherwise)
        _add_option(target, f, flag, False if (command, f.name) == ("pack", "format") else None)
        if f.name == "format":  # listed right after --format, as --help always showed it
            target.add_argument("-o", "--output", type=output_location, metavar="OUT",
                                help=output_help.replace("output folder", "output folder, or an s3://, gs:// or "
                                                         "az:// prefix"))
    if command == "pack":  # --append OUT: SRC's images become the next generation of the dataset OUT
        groups["resume"].add_argument(
            "--append", type=_append_location, metavar="OUT",
            help="add SRC's images to the dataset OUT as its next generation, readers of the previous one "
                 "unaffected (-f: OUT's format; --resume finishes an interrupted append)")
    if command in ("pack", "convert"):
        groups["remote"].add_argument(
            "--stage-dir", type=Path, metavar="DIR",
            help="s3://, gs://, az:// output: stage files here before upload (default: $DATASET_PACKER_STAGE "
                 "or ~/.cache/dataset-packer/stage/...)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _pack_arguments(p: argparse.ArgumentParser) -> None:
    _add_options(p, "pack", lambda g: g.add_argument("src", metavar="SRC", type=output_location, help=SRC_HELP),
                 "output folder (default: SRC-FORMAT beside SRC; missing parent folders are created)")


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    _add_options(p, "convert", lambda g: g.add_argument(
        "src", metavar="SRC", type=output_location,
        help="a packed dataset folder (or a folder of split datasets), or one on object storage: s3://, gs://, "
             "az:// (abfs://) or https:// (credentials: the usual environment, docs/remote.md)"),
        "output folder (default: SRC-FORMAT beside SRC, required for a SRC on object storage; missing parent "
        "folders are created)")


def _merge_arguments(p: argparse.ArgumentParser) -> None:
    from readers.contract.spec import FORMATS

    p.add_argument("srcs", nargs="+", metavar="DATASET", type=local_location,
                   help="packed dataset folders (or folders of split datasets), joined in this order")
    p.add_argument("-o", "--output", type=local_location, metavar="OUT", required=True,
                   help="output folder (missing parent folders are created)")
    p.add_argument("-f", "--format", choices=FORMATS, metavar="FORMAT", default=None,
                   help="the output format: the datasets' own (the default; another is refused)")
    for f, flag in cli_fields("convert"):
        if f.name != "format":
            _add_option(p, f, flag)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


PACK_DESCRIPTION = """\
Pack a dataset into WebDataset shards, LMDB, HDF5 or memory-mapped uint8 arrays.
SRC is one of:
  an image folder          root/<class>/<image>, or root/<split>/<class>/<image>
  a manifest               rows.csv, rows.jsonl or rows.parquet: one row per sample, an image
                           column and typed fields (captions, boxes, tags, scores, ...)
  COCO annotations         instances_*.json: boxes, category ids, areas, segmentation
  WebDataset shards        a folder of .tar shards written by other tools
  a Hugging Face dataset   a save_to_disk folder or .parquet files
Every field is stored with its type; readers return each sample's fields."""

#: the usage line of ``pack`` and ``convert`` (argparse's own lists all 25 options: 13 lines)
USAGE = {"pack": "%(prog)s SRC -f {wds,lmdb,hdf5,mmap} [-o OUT] [options]",
         "convert": "%(prog)s SRC -f {wds,lmdb,hdf5,mmap} [-o OUT] [options]",
         "merge": "%(prog)s DATASET DATASET ... -o OUT [options]"}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``pack-dataset pack`` (also what ``pack-dataset SRC ...`` uses)."""
    p = Parser(prog="pack-dataset", usage=USAGE["pack"], description=PACK_DESCRIPTION, epilog=EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter, help_command="pack-dataset pack --help")
    _pack_arguments(p)
    return p


def _add_command(sub: Any, name: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                 description: str | None = None) -> None:
    p = sub.add_parser(name, help=COMMANDS[name], description=description or COMMANDS[name], usage=USAGE.get(name),
                       epilog=EXIT_CODES if name in ("pack", "convert", "merge") else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(command=name, command_parser=p)  # the command's parser, for its error messages


def build_main_parser() -> argparse.ArgumentParser:
    """``pack-dataset`` with its subcommands (what ``pack-dataset --help`` shows)."""
    from packer.tools import info
    from packer.tools import verify
    from packer.tools import view
    from packer.tools.index import add_arguments as index_arguments

    p = Parser(
        prog="pack-dataset",
        description="Pack datasets (image folders, CSV/JSONL/Parquet manifests, COCO annotations, WebDataset\n"
        "shards, Hugging Face datasets: images with typed fields such as captions, boxes and tags)\n"
        "into WebDataset shards, LMDB, HDF5 or memory-mapped uint8 arrays; convert, verify and\n"
        "inspect packed datasets.\n\n"
        "'pack-dataset SRC -f FORMAT ...' is short for 'pack-dataset pack SRC -f FORMAT ...'\n"
        "(a source folder named like a command: 'pack-dataset pack ./info ...').\n"
        "'pack-dataset COMMAND --help' lists a command's options.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)
    _add_command(sub, "pack", _pack_arguments, PACK_DESCRIPTION)
    _add_command(sub, "convert", _convert_arguments,
                 "Turn a packed dataset into another format without re-validating: every sample's checksum\n"
                 "is checked as it is copied. Encoded formats (wds, lmdb, hdf5) copy the stored bytes; mmap\n"
                 "decodes them (and applies --resize); from mmap, pixels are stored as lossless PNG. Every\n"
                 "field of every sample is kept. SRC may be on s3://, gs://, az:// or https://, and -o an\n"
                 "s3://, gs:// or az:// prefix (staged locally, uploaded, index.json last; --resume finishes\n"
                 "an interrupted upload); credentials from the usual environment (docs/remote.md).")
    _add_command(sub, "merge", _merge_arguments,
                 "Join packed datasets made separately (for example by parallel jobs) into one dataset with one\n"
                 "index, without re-encoding: every sample's checksum is checked as it is copied. The datasets\n"
                 "must share a format and a schema; class names are the first dataset's, then new ones in order\n"
                 "(labels renumbered). --resume finishes an interrupted merge.")
    _add_command(sub, "verify", verify.add_arguments)
    _add_command(sub, "info", info.add_arguments)
    _add_command(sub, "view", view.add_arguments, view.DESCRIPTION)
    _add_command(sub, "index", index_arguments)
    return p


def _progress_factory(quiet: bool, verb: str = "pack"):
    def factory(split, source):
        bar = progress_bar(len(source.paths), "img", f"{verb} {split}", quiet)
        if bar is None:
            return None
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


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> PackOptions:
    try:
        return PackOptions(**{f.name: getattr(args, f.name) for f, _ in cli_fields(command)})
    except OptionError as exc:  # named as typed: --max-side, not max_side
        parser.error(exc.cli_message())
        raise  # parser.error exits; this keeps type checkers informed
    except ValueError as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this keeps type checkers informed


def _format_of(out: Path) -> str | None:
    """The format of the dataset ``out`` that ``--append`` grows (None when there is none yet)."""
    from readers.contract.spec import find_splits, read_meta

    for folder in [out] + [out / s for s in find_splits(out)]:
        try:
            return str(read_meta(folder)["format"])
        except (OSError, ValueError):
            continue
    return None


def _default_name(src: Path) -> str:
    """The output's default name: the source's (a manifest or COCO json without its suffix: rows.csv -> rows)."""
    from packer.importers.manifest import MANIFEST_KINDS

    if src.suffix.lower() in (*MANIFEST_KINDS, ".json") and src.is_file():
        return src.resolve().stem
    return src.resolve().name


def _run(args: argparse.Namespace, work: Callable[[Path], list]) -> int:
    """Run ``work(out)`` and turn its outcome into summary lines and an exit code."""
    out = args.output or args.src.parent / f"{_default_name(args.src)}-{args.format}"
    try:
        results = work(out)
    except PackerError as exc:
        word = "error" if isinstance(exc, UsageError) else "failed"
        print(f"pack-dataset: {word}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        if isinstance(out, str) or os.path.lexists(out):
            print(f"pack-dataset: {_stopped(exc)}; {out} is incomplete, re-run the same command with --resume "
                  "to finish it", file=sys.stderr)
        else:
            print(f"pack-dataset: {_stopped(exc)} before anything was written", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except (OSError, DatasetFormatError) as exc:  # outside the pack's own handling: still one line
        print(f"pack-dataset: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for r in results:
        print(r.summary())
    return EXIT_REJECTS if any(r.rejected for r in results) else EXIT_OK


def _pack(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from packer.api import pack

    if args.append is not None:  # pack-dataset SRC --append OUT
        if args.output is not None:
            parser.error("--append OUT names the output: give it without -o")
        args.output = args.append
        if args.format is None:
            args.format = _format_of(args.append)
        if args.format is None:
            parser.error(f"{args.append} holds no dataset yet: give -f/--format for its first generation")
    elif args.format is None:
        parser.error("the following arguments are required: -f/--format")
    options = _options(parser, args, "pack")
    if args.append is not None:
        options = dataclasses.replace(options, append=True)
    out = args.output
    if isinstance(args.src, str) and out is None:
        parser.error(f"{args.src}: a source on object storage needs -o (a folder or an s3:// prefix)")
    remote = _remote_options(parser, args)
    return _run(args, lambda out: pack(args.src, out, options, progress=_progress_factory(args.quiet), remote=remote))


def output_location(text: str) -> Path | str:
    """``SRC`` / ``-o``: a local folder (Path; ``file:///abs`` too), or a remote URL kept as text (``Path``
    would fold ``s3://`` to ``s3:/``). Another scheme (``gs://``, ``az://``, ...) is a usage error (exit 2)
    naming it and the schemes served (readers.contract.location): it never becomes a local folder named ``gs:``."""
    try:
        return parse_location(text)
    except UnsupportedLocationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def local_only(refusal: str) -> Callable[[str], Path]:
    """An argparse type for a local folder (``file:///abs`` too); a URL is a one-line usage error,
    ``TEXT: refusal`` (exit 2)."""
    def parse(text: str) -> Path:
        location = output_location(text)
        if isinstance(location, str):
            raise argparse.ArgumentTypeError(f"{text}: {refusal}")
        return location
    return parse


#: ``merge``'s datasets and ``-o``
local_location = local_only("merge reads and writes local folders only (pack-dataset convert reads and writes "
                            "object storage)")
#: ``--append OUT``
_append_location = local_only("appending to a dataset on object storage is not supported yet (append to a local "
                              "copy of it, then upload the folder)")


def _remote_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RemoteOptions | None:
    """How pack and convert reach object storage: the usual environment for credentials and endpoints
    (docs/remote.md); ``--stage-dir`` and upload bars for an output there (a usage error otherwise)."""
    if isinstance(args.output, str):  # packer.remote_output
        return RemoteOptions(stage_dir=args.stage_dir, upload_progress=upload_bars(args.quiet))
    if args.stage_dir is not None:
        parser.error("--stage-dir applies to an s3://, gs:// or az:// output only")
    return None


def _convert(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from packer.tools.convert import convert

    options = _options(parser, args, "convert")
    if isinstance(args.src, str) and args.output is None:
        parser.error(f"{args.src}: a dataset on object storage needs -o (a folder or an s3://, gs:// or az:// prefix)")
    remote = _remote_options(parser, args)
    return _run(args, lambda out: convert(args.src, out, options, remote=remote,
                                          progress=_progress_factory(args.quiet, "convert")))


def _merge(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from packer.tools.merge import merge, merge_format

    def work(out: Path) -> list:
        fmt = args.format or merge_format(args.srcs)  # a source that is not a dataset: one line, from _run
        options = PackOptions(format=fmt, **{f.name: getattr(args, f.name) for f, _ in cli_fields("convert")
                                             if f.name != "format"})
        return merge(args.srcs, out, options, progress=_progress_factory(args.quiet, "merge"))

    return _run(args, work)


def _pack_main(argv: Sequence[str]) -> int:
    """``pack-dataset SRC ...`` (no subcommand): exactly as ``pack-dataset pack SRC ...``."""
    parser = build_parser()
    return _pack(parser, parser.parse_args(argv))


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (everything closed, resumable), with exit code 128 + 15."""

    exit_code = 128 + signal.SIGTERM


def _stopped(exc: BaseException) -> str:
    return "stopped by SIGTERM" if isinstance(exc, Terminated) else "interrupted"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM is Ctrl-C with its own exit code
    try:
        return _main(argv)
    except BrokenPipeError:  # `pack-dataset info PATH | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:  # verify, info: nothing to resume
        print(f"pack-dataset: {_stopped(exc)}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="pack-dataset: %(levelname)s: %(message)s")
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        return _pack_main(argv)
    parser = build_main_parser()
    args = parser.parse_args(argv)
    if args.command == "pack":
        return _pack(args.command_parser, args)
    if args.command == "convert":
        return _convert(args.command_parser, args)
    if args.command == "merge":
        return _merge(args.command_parser, args)
    if args.command == "index":
        from packer.tools.index import run as index_run

        return index_run(args)
    if args.command == "verify":
        from packer.tools.verify import run

        return run(args)
    if args.command == "view":
        from packer.tools.view import run as view_run

        return view_run(args)
    from packer.tools.info import run as info_run

    return info_run(args)


if __name__ == "__main__":
    sys.exit(main())
