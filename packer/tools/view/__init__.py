"""``pack-dataset view PATH``: a read-only web page of a packed dataset (local, ``s3://``, ``https://``).

Modules: :mod:`~packer.tools.view.data` (what is shown, read through the readers by random access),
:mod:`~packer.tools.view.pages` (the pages and the matplotlib class histogram),
:mod:`~packer.tools.view.templates` (the jinja2 templates) and :mod:`~packer.tools.view.server`
(aiohttp.web). ``--html OUT.html`` writes the overview and a grid of samples as one self-contained
file instead of serving. See docs/view.md.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from packer.tools.info import path_or_url

__all__ = ["add_arguments", "run", "DESCRIPTION"]

DESCRIPTION = """\
Serve a read-only web page of a packed dataset: an overview (format, counts per split, the schema with
per-field statistics, a class histogram, sizes, the pack's summary), a grid of thumbnails (paged, in
index order or shuffled with --seed, filtered by class and split), a page per sample (every field, the
image with its boxes, key, source name, CRC, where it lives) and the pack's rejects grouped by reason.
It listens on 127.0.0.1 and a free port by default and prints the URL; any other --host needs the
random token printed in it. --html OUT.html writes the overview and a grid as one self-contained file.

exit codes: 0 stopped (Ctrl-C) or --html written, 2 not a dataset / bad address / OUT not writable"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``pack-dataset view``."""
    p.add_argument("path", type=path_or_url,
                   help="dataset folder, a folder of split datasets, or an s3:// / http(s):// dataset URL "
                        "(credentials and endpoint from the AWS environment variables)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs the token printed in the URL)")
    p.add_argument("--port", type=_port, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--seed", type=int, default=None,
                   help="show the grid shuffled with this seed (default: index order)")
    p.add_argument("--html", type=Path, metavar="OUT.html",
                   help="write the overview and a grid of --samples samples per split as one self-contained "
                        "file (images inlined), and exit")
    p.add_argument("--samples", type=int, default=48, metavar="N", help="samples in the --html grid (default 48)")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to 65535 (0: a free one)")
    return port


def _fail(message: str) -> int:
    print(f"pack-dataset view: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """``pack-dataset view`` with parsed arguments; serves until Ctrl-C or SIGTERM. Exit 2: not a
    dataset, a missing dependency, an address that cannot be bound, or --html not writable."""
    try:
        from packer.tools.view.data import DatasetView
        from packer.tools.view.pages import render_report
    except ImportError as exc:  # jinja2 / matplotlib / aiohttp: the `view` extra
        return _fail(f"{exc.name or exc}: not installed (pip install 'dataset-packer[view]')")
    from readers.contract import spec
    from readers.contract.safeio import atomic_write

    try:
        view = DatasetView(args.path)
    except (spec.DatasetFormatError, OSError, ValueError) as exc:  # ValueError: unsupported location
        return _fail(str(exc).splitlines()[0])
    with view:
        if args.html is not None:
            text = render_report(view, max(1, args.samples), args.seed)
            try:
                with atomic_write(args.html, "w", encoding="utf-8", unique=True) as f:
                    f.write(text)
            except OSError as exc:
                return _fail(f"{args.html}: {exc.strerror or exc}")
            shown = sum(min(s.samples, max(1, args.samples)) for s in view.splits.values())
            print(f"wrote {args.html} ({len(text) / 1e6:.1f} MB: the overview and {shown} samples)")
            return 0
        from packer.tools.view.server import Server

        try:
            server = Server(view, args.host, args.port, args.seed)
        except OSError as exc:
            return _fail(str(exc))
        print(f"pack-dataset view: serving {view.desc['path']} at {server.url} (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()  # until Ctrl-C / SIGTERM (KeyboardInterrupt)
        except KeyboardInterrupt:
            print("pack-dataset view: stopped", file=sys.stderr)
        finally:
            server.close()
    return 0
