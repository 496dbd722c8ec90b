"""The peers of a side-by-side run: which ones this interpreter (or a peer's own venv) can use.

The peers themselves, each built the way its docs show:

* :mod:`dataset_bench.peerreaders` -- what a user writes by hand or installs (the naive folder, a naive
  ``np.memmap``, LMDB by hand, the official ``webdataset`` reader, a thread pool over LMDB, FFCV);
* :mod:`dataset_bench.peerwriters` -- their writers (LMDB by hand, ``webdataset.ShardWriter``,
  mosaicml-streaming's ``MDSWriter``, FFCV's files);
* :mod:`dataset_bench.newpeers` -- the 2026 peers (:data:`NEW_PEERS`: DALI CPU, SPDL, Grain over
  ArrayRecord, Lance, Megatron-Energon), loaders and writers.

Here: :data:`NEW_PEERS` (each 2026 peer's modules, pip line, modes and workers' kind),
:func:`installed` (is a 2026 peer there, in this interpreter or in another venv's),
:func:`available` (can the optional older peers ``ffcv`` and ``streaming`` be used) and
:func:`import_streaming` (mosaicml-streaming where torchvision cannot load).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Collection, NamedTuple

__all__ = ["available", "import_streaming", "NEW_PEERS", "NewPeer", "installed"]


def import_streaming() -> types.ModuleType:
    """``import streaming`` (mosaicml-streaming). Its package imports ``torchvision`` for its vision
    datasets at import time; where torchvision cannot load beside the installed torch (PyPI's
    torchvision against a CPU build of torch), stand-ins for the two names it imports are put in
    its place. MDSWriter, the only part used here, never touches them."""
    try:
        return importlib.import_module("streaming")
    except (ImportError, RuntimeError):
        pass
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]

    def stub(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    class VisionDataset:  # never instantiated here
        pass

    def to_tensor(*_a: Any, **_k: Any) -> Any:
        raise NotImplementedError("torchvision is not usable in this environment")

    functional = stub("torchvision.transforms.functional", to_tensor=to_tensor)
    stub("torchvision", datasets=stub("torchvision.datasets", VisionDataset=VisionDataset, CIFAR10=VisionDataset),
         transforms=stub("torchvision.transforms", functional=functional))
    return importlib.import_module("streaming")


def available(name: str) -> str | None:
    """None when the optional peer ``name`` ("ffcv", "streaming") can be used here, else why not."""
    try:
        if name == "streaming":
            import_streaming()
        else:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable here", said in the report
        from readers.contract.messages import one_line

        return one_line(exc, 160, kind=True, first=True)
    return None


# --------------------------------------------------------------------------- the 2026 peers
#
# Each is optional and may live in its own venv (numpy pins): ``installed`` answers for any
# interpreter, and the bench runs the peer's preparation and measurements in that interpreter
# (``dataset_bench.isolate.run_isolated(..., python=...)``). Their loaders and writers:
# ``dataset_bench.newpeers``.


class NewPeer(NamedTuple):
    """One 2026 peer: the modules that must import, its pip install line, its modes, its workers' kind."""

    modules: tuple[str, ...]
    pip: str
    modes: tuple[str, ...]
    kind: str  # threads | processes


NEW_PEERS: dict[str, NewPeer] = {
    "dali": NewPeer(("nvidia.dali",), "nvidia-dali-cuda120", ("bytes", "decoded"), "threads"),
    "spdl": NewPeer(("spdl.pipeline", "spdl.io"), "spdl", ("bytes", "decoded"), "threads"),
    "grain": NewPeer(("grain", "array_record"), "grain array-record", ("bytes", "decoded"), "processes"),
    "lance": NewPeer(("lance",), "pylance", ("bytes", "decoded"), "processes"),
    "energon": NewPeer(("megatron.energon",), "megatron-energon", ("bytes", "decoded"), "processes"),
}

_FIND = ("import importlib.util, sys\n"
         "def found(m):\n"
         "    try:\n"
         "        return importlib.util.find_spec(m) is not None\n"
         "    except ImportError:\n"
         "        return False\n"
         "sys.exit(0 if all(found(m) for m in sys.argv[1:]) else 3)\n")


def installed(name: str, python: str | None = None) -> str | None:
    """None when the 2026 peer ``name`` is installed for ``python`` (default: this interpreter), else
    the one line the run prints in its place."""
    peer = NEW_PEERS[name]
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):  # a venv python is a symlink
        if not os.access(python, os.X_OK):
            return f"peer {name} skipped: {python} is not an executable Python"
        import subprocess

        ok = subprocess.run([python, "-c", _FIND, *peer.modules], capture_output=True, check=False).returncode == 0
    else:
        ok = all(_found(m) for m in peer.modules)
    return None if ok else f"peer {name} skipped: not installed (pip install {peer.pip})"


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing
        return False


def peer_pythons(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Collection[str] = NEW_PEERS,
                 word: str = "PEER") -> tuple[tuple[str, str], ...]:
    """``(peer, python)`` pairs from --peer-venvs and --peer-python, for the peers ``names`` (called ``word``
    in the usage error that names a bad one)."""
    pythons: dict[str, str] = {}
    if args.peer_venvs:
        if not args.peer_venvs.is_dir():
            parser.error(f"--peer-venvs {args.peer_venvs}: not a directory")
        pythons = {n: str(args.peer_venvs / n / "bin" / "python") for n in names
                   if (args.peer_venvs / n / "bin" / "python").exists()}
    for item in args.peer_python:
        name, sep, python = item.partition("=")
        if not sep or name not in names or not python:
            parser.error(f"--peer-python {item!r}: expected {word}=PYTHON with {word} one of {', '.join(names)}")
        pythons[name] = python
    return tuple(sorted(pythons.items()))
