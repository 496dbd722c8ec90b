"""Writing from Python: samples/s of ``packer.Writer`` and ``packer.pack_map`` beside the peers' writers.

The same in-memory samples (ImageNet-like JPEGs at 160x120, 320x256 and 480x400, ~10-95 KB; an int
label; a caption of 4-12 words) are written by:

* ``packer.Writer`` into wds, lmdb, hdf5 and mmap, validation on (the default) and ``validate=False``;
* ``packer.pack_map`` (an identity ``fn``) into wds with 0 and 2 workers, validation on and off;
* ``webdataset.ShardWriter``, mosaicml-streaming's ``MDSWriter``, LitData's ``optimize`` and FFCV's
  ``DatasetWriter``, each only where it imports (else a row ``skipped: <package> not installed``).

Each job is timed after an untimed warm-up run in the same process, in a fresh interpreter per
measurement (``--quick``: in this process), repeats interleaved, median reported; every output is read
back and must hold every sample (labels and captions in order where the reader gives them). Prints a
table (job, samples/s, ratio to the fastest peer writer of the run) and whether the 1.0x goal holds
(the Writer with ``validate=False`` into wds, lmdb and hdf5 >= the fastest peer). The measuring code
is :mod:`dataset_bench.writerbench`. Run from the repository root::

    python benchmarks/bench_writer.py                     # 2000 samples, median of 3, fresh processes
    python benchmarks/bench_writer.py --json writer.json  # also write every figure as JSON
    python benchmarks/bench_writer.py --quick             # 48 samples, 1 repeat, in-process (CI smoke test)
    python benchmarks/bench_writer.py --peer-venvs /work/peers   # each peer from /work/peers/<package>/bin/python

The peers (only webdataset is in the project's venv). Each may live in a venv of its own,
``--peer-python PACKAGE=PYTHON`` (repeatable) or ``--peer-venvs DIR`` (``DIR/<package>/bin/python``
where that exists: ``streaming``, ``litdata``, ``ffcv``, ``webdataset``); its measurements then run
in that interpreter, this checkout on ``PYTHONPATH``. mosaicml-streaming imports ``transformers``
and ``torchvision`` when it is imported, and PyPI's torchvision needs PyPI's (CUDA) torch, not the
project's CPU build; FFCV is compiled and needs numba. So, outside the repository::

    python3.11 -m venv /work/peers/streaming          # PyPI's torch 2.13.0 (CUDA build) + torchvision 0.28
    PIP_FIND_LINKS= /work/peers/streaming/bin/pip install torch==2.13.0 torchvision==0.28.0 \
        mosaicml-streaming==0.13.0 litdata
    ln -s streaming /work/peers/litdata               # LitData in the same venv (it wants torchvision too)
    apt-get install -y libturbojpeg0-dev libopencv-dev pkg-config
    python3.11 -m venv /work/peers/ffcv
    /work/peers/ffcv/bin/pip install -c <(echo torch==2.13.0) ffcv   # builds it; numba, opencv-python
    for v in streaming ffcv; do    # then the project's own packages (numpy, Pillow, h5py, ...) after the venv's
      echo /work/main/.venv/lib/python3.11/site-packages > /work/peers/$v/lib/python3.11/site-packages/zz-project.pth
    done

(``PIP_FIND_LINKS=`` keeps pip from taking the CPU torch wheel a machine may keep in its find-links.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from dataset_bench.machine import machine_info, machine_label  # noqa: E402
from dataset_bench.peers import peer_pythons  # noqa: E402
from dataset_bench.writerbench import DISTRIBUTIONS, PEERS, format_table, run, to_json  # noqa: E402

PACKAGES = tuple(package for package, _ in PEERS.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="48 samples, 1 repeat, every job in this process (seconds; what the tests run)")
    parser.add_argument("--samples", type=int, default=2000, help="samples per job (default 2000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per job, median reported (default 3)")
    parser.add_argument("--in-process", action="store_true",
                        help="run every measurement in this process (after its warm-up), not in a fresh one")
    parser.add_argument("--tmp", type=Path, help="where to put the samples' source and the outputs "
                                                 "(default: the system temp dir)")
    parser.add_argument("--json", type=Path, help="write the settings, every row and the goal to this JSON file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print each measurement as it is made")
    parser.add_argument("--peer-python", action="append", default=[], metavar="PACKAGE=PYTHON",
                        help=f"run that peer's writer in this interpreter (a venv that has it); PACKAGE one of "
                             f"{', '.join(PACKAGES)}; repeatable")
    parser.add_argument("--peer-venvs", type=Path, metavar="DIR",
                        help="each peer from DIR/<package>/bin/python where that exists (--peer-python wins)")
    args = parser.parse_args(argv)
    pythons = dict(peer_pythons(parser, args, PACKAGES, "PACKAGE"))
    n, repeats = (48, 1) if args.quick else (args.samples, args.repeats)
    if n < 1 or repeats < 1:
        parser.error("--samples and --repeats must be >= 1")

    result = run(n, repeats, isolated=not (args.quick or args.in_process), seed=args.seed, work=args.tmp,
                 pythons=pythons, say=print if args.verbose else lambda _line: None)
    s, load = result["settings"], result["load"]
    where = "a fresh interpreter per measurement" if s["isolated"] else "in one process"
    print(f"bench_writer: {n} in-memory samples (JPEG {', '.join('x'.join(map(str, z)) for z in s['sizes'])}, "
          f"mean {s['mean_image_kb']:.0f} KB; label; caption), median of {repeats}, each after a warm-up, {where}")
    info = machine_info()
    print(f"machine: {machine_label(info)}")
    foreign = load["foreign_cpu"]
    print(f"load: 1-min load average {load['load_average']}; other processes' CPU share "
          f"{foreign['overall']:.0%} overall, {foreign['max_interval']:.0%} at most in one measurement"
          if foreign else f"load: 1-min load average {load['load_average']}")
    peers = [f"{DISTRIBUTIONS[row['peer']]} {row['version']}" + (f" ({row['python']})" if row["python"] else "")
             for row in result["rows"] if row["kind"] == "peer" and row["version"]]
    print(f"peers: {'; '.join(peers) if peers else 'none installed'}")
    for line in format_table(result):
        print(line)
    if args.json:
        result["machine"] = info
        args.json.write_text(to_json(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
