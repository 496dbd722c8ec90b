"""Run one measurement in a fresh Python interpreter, so that what it weighs is its own.

The parent pickles ``(fn, kwargs, torch_threads)`` to the child's stdin; the
child imports every reader module before it calls ``fn(**kwargs)`` (so no
import lands inside a timing), and pickles ``(ok, result or error text)``
into a file the parent names. ``python`` runs the child in another interpreter (a peer's own
venv); the child then finds this checkout's packages through ``PYTHONPATH``.

The child leads a process group of its own (its loader workers join it): if the
parent stops early (SIGTERM turned into an exception by ``dataset-bench``,
Ctrl-C, any error) the whole group is terminated, then killed, before the
exception goes on, so no measurement outlives the run.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["run_isolated", "stop_group"]

GRACE_S = 3.0  # how long a stopped measurement's group has to exit on SIGTERM before SIGKILL


def child_main() -> None:
    """Entry point of the fresh interpreter :func:`run_isolated` starts (job on stdin, result to argv[1])."""
    fn, kwargs, torch_threads = pickle.load(sys.stdin.buffer)
    try:
        import torch

        import readers.formats.registry  # noqa: F401 - every reader module imported before the clock starts

        if torch_threads:
            torch.set_num_threads(torch_threads)
        result = (True, fn(**kwargs))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        import traceback

        result = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(sys.argv[1], "wb") as f:
        pickle.dump(result, f)


def run_isolated(fn: Callable[..., Any], kwargs: dict[str, Any], *, torch_threads: int | None = None,
                 python: str | None = None) -> Any:
    """``fn(**kwargs)`` in a fresh Python interpreter (a subprocess); returns its result.

    Each measurement then starts from a clean process: its PSS is the
    loader's alone, and nothing an earlier case left behind (memory the
    generator, the packer or another reader kept, torch settings) shows in it.
    ``fn`` must be importable (a module-level function); ``kwargs`` and the
    result must pickle. The child's own output is discarded unless it fails,
    which raises RuntimeError with the child's error. ``python``: the interpreter to run (default
    this one), e.g. the python of a venv that has a peer this one lacks.
    """
    fd, out = tempfile.mkstemp(prefix="dataset-bench-", suffix=".pkl")
    os.close(fd)
    try:
        proc = subprocess.Popen([python or sys.executable, "-c",
                                 "from dataset_bench.isolate import child_main; child_main()", out],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=_child_env() if python else None, start_new_session=True)
        try:
            _, err = proc.communicate(pickle.dumps((fn, kwargs, torch_threads)))
        except BaseException:
            stop_group(proc)
            raise
        try:
            with open(out, "rb") as f:
                ok, payload = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            ok, payload = False, err.decode(errors="replace")[-2000:] or "no result"
    finally:
        os.unlink(out)
    if not ok:
        raise RuntimeError(f"measurement {getattr(fn, '__name__', fn)} failed in its process "
                           f"(exit code {proc.returncode}): {payload}")
    return payload


def stop_group(proc: subprocess.Popen, grace: float = GRACE_S) -> None:
    """End ``proc`` (a group leader: ``start_new_session=True``) and every process of its group: SIGTERM,
    up to ``grace`` seconds, then SIGKILL; returns once the leader is reaped and no member is left
    (or after another ``grace`` seconds, should a member linger unreaped)."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _group_alive(pgid):
                return
            time.sleep(0.02)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting for their reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return not os.path.isdir("/proc")


def _child_env() -> dict[str, str]:
    """This environment with the directories this process imports ``dataset_bench`` and ``readers``
    from first on ``PYTHONPATH``, so another interpreter runs this checkout's code."""
    import dataset_bench
    import readers

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__ or ""))) for m in (dataset_bench, readers)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                                if p]))
    return env
