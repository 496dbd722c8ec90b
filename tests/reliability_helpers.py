"""Helpers shared by the reliability tests (tests/test_reliability*.py, tests/test_fuzz.py).

They run the real ``pack-dataset`` in subprocesses, craft damaged or hostile
datasets, and drop root's power to ignore file permissions where a test
needs an unreadable folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from readers.contract import spec

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "packer.cli"]


def env() -> dict[str, str]:
    """The environment for child processes: this checkout first on the path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def cli(*args: Any, timeout: float = 180, prefix: list[str] | tuple = ()) -> subprocess.CompletedProcess:
    """Run ``pack-dataset ARGS`` and return the finished process (text output)."""
    return subprocess.run([*prefix, *CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env())


def cli_here(*args: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``pack-dataset ARGS`` through the CLI's entry point in this process, with ``env``'s variables set while it
    runs, as a finished process holds it (exit code, output). For the checks around a test's subject (a verify
    after a pack, an info of a bucket), not for the subject itself: a fresh Python costs an import of torch."""
    import contextlib
    import io

    from packer.cli import main

    saved = {k: os.environ.get(k) for k in (env or {})}
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["pack-dataset", *map(str, args)], code, out.getvalue(), err.getvalue())


def verify_here(root: Path) -> subprocess.CompletedProcess:
    """``pack-dataset verify ROOT -q`` in this process (:func:`cli_here`): the check that a pack (a resumed one,
    one after a full disk) came out whole. It is no test of the process."""
    return cli_here("verify", root, "-q")


def error_lines(stderr: str) -> list[str]:
    """The error lines a pack-dataset run printed (warnings and progress bars aside)."""
    return [line for line in stderr.splitlines()
            if line.startswith(("pack-dataset: error", "pack-dataset: failed", "pack-dataset verify: error",
                                "pack-dataset: interrupted", "pack-dataset: stopped"))]


def assert_one_line(r: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit code ``code``, no traceback, exactly one error line, containing every needle."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = error_lines(r.stderr)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def no_root_powers() -> list[str]:
    """A command prefix under which file permissions apply (root normally bypasses them)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a folder unreadable to this process")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def meta(root: Path) -> dict:
    return json.loads((root / spec.INDEX_NAME).read_text())


def set_meta(root: Path, change: Callable[[dict], Any]) -> None:
    m = meta(root)
    change(m)
    (root / spec.INDEX_NAME).write_text(json.dumps(m))


def resave_array(root: Path, name: str, values: np.ndarray, *, checksum: str = "match") -> None:
    """Replace an index array. ``checksum``: "match" (a crafted dataset: index.json updated to agree),
    "drop" (as packed before array checksums existed), "keep" (damage: index.json not updated)."""
    spec.save_array(root, name, values)
    if checksum == "match":
        data = (root / spec.array_file(name)).read_bytes()
        set_meta(root, lambda m: m[spec.ARRAYS_KEY].__setitem__(name, {"crc32": spec.checksum(data),
                                                                         "bytes": len(data)}))
    elif checksum == "drop":
        set_meta(root, lambda m: m.pop(spec.ARRAYS_KEY))


def array(root: Path, name: str) -> np.ndarray:
    return np.load(root / spec.array_file(name))


# A child process that runs code against a dataset and reports what happened as JSON, so that a crash
# (SIGBUS, SIGSEGV) or a hang is a failed test rather than a dead test run.
_PROBE = textwrap.dedent('''
    import json, sys
    from readers import open_dataset
    from readers.contract import spec
    root, mode = sys.argv[1], sys.argv[2]
    out = {}
    try:
        ds = open_dataset(root, decode=(mode == "decode"))
        n = 0
        if ds.format == "wds":
            for _ in ds:
                n += 1
        else:
            for i in range(len(ds)):
                ds[i]
                n += 1
        out = {"ok": n}
    except spec.DatasetFormatError as exc:
        out = {"error": "DatasetFormatError", "message": str(exc)}
    except Exception as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(out))
''')


def probe_read(root: Path, *, decode: bool = False, timeout: float = 60) -> dict:
    """Open ``root`` and read every sample in a child process: {"ok": n} or {"error": type, "message"}."""
    r = subprocess.run([sys.executable, "-c", _PROBE, str(root), "decode" if decode else "bytes"],
                       capture_output=True, text=True, timeout=timeout, env=env())
    assert r.returncode == 0, f"the reader process died (exit {r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


# A pack-dataset run whose write stage sleeps per sample: slow enough to act while it runs.
#: The first lines of a test's child that stands for a command typed at a terminal: Ctrl-C and SIGTERM at their
#: defaults, as a shell starts a foreground job, whatever the test process's own signal state (a child inherits
#: an ignored or blocked SIGINT: one 4-worker run's worker held SIGINT so, and its children ignored Ctrl-C).
AS_TYPED = '''
import signal as _signal
_signal.signal(_signal.SIGINT, _signal.default_int_handler)
_signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
_signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT, _signal.SIGTERM})
'''

_SLOW = AS_TYPED + textwrap.dedent('''
    import os, sys, time
    import packer.pipeline as p
    delay, hold = float(sys.argv[1]), sys.argv[2]
    take = p._WriteStage._take
    taken = [0]
    def slow(self, pos, outcome):
        taken[0] += 1
        deadline = time.monotonic() + 300
        while hold and taken[0] > 1 and not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
        return take(self, pos, outcome)
    p._WriteStage._take = slow
    from packer.cli import main
    sys.exit(main(sys.argv[3:]))
''')


def slow_pack(*args: Any, delay: float = 0.02, hold: Path | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``pack-dataset ARGS`` with a write stage slowed by ``delay`` s per sample; with ``hold``, it
    also stops after its first sample until the file ``hold`` exists (however slow the machine, the pack
    is still running while the test looks at it; the test creates ``hold`` to let it finish)."""
    return subprocess.Popen([sys.executable, "-c", _SLOW, str(delay), str(hold or ""), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), **popen)


# A pack-dataset run that dies (os._exit, like kill -9) when a chosen function is first called.
_KILL_AT = textwrap.dedent('''
    import importlib, os, sys
    module, qualname = sys.argv[1].rsplit(":", 1)
    owner = importlib.import_module(module)
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    def die(*args, **kwargs):
        os._exit(137)
    setattr(owner, parts[-1], die)
    from packer.cli import main
    sys.exit(main(sys.argv[2:]))
''')


def pack_killed_at(where: str, *args: Any) -> subprocess.CompletedProcess:
    """Run ``pack-dataset ARGS``, killed the moment ``module:Qual.name`` is first called."""
    return subprocess.run([sys.executable, "-c", _KILL_AT, where, *map(str, args)], capture_output=True, text=True,
                          timeout=180, env=env())


def wait_for(predicate: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def checkpointed(state: Path | str) -> int:
    """The samples a write journal (``spec.STATE_NAME``) vouches for; 0 while there is none."""
    try:
        return int(json.loads(Path(state).read_text()).get("done", 0))
    except (OSError, ValueError):  # not written yet, or (never, it is renamed into place) half-written
        return 0


def uploaded(state: Path | str) -> int:
    """The objects a staged write into a store has put there, as its upload journal (``uploads.jsonl``
    beside the journal at ``state``) reads them back; 0 while there is none."""
    from packer.remote_output import Uploads

    uploads = Uploads(Path(state).parent)
    try:
        return len(uploads.done)
    finally:
        uploads.close()


def kill_once_checkpointed(state: Path | str, above: int = 0, *, upload: bool = False) -> None:
    """SIGKILL this process once the write journal at ``state`` vouches for more than ``above`` samples
    (and, with ``upload``, once the staged write has put an object into its store).

    ``packer.Writer`` hands samples to its write thread in bursts, up to 64 MB ahead: on a loaded machine the
    caller can be hundreds of samples ahead of what is durable, so a kill test that wants something to resume
    from waits for a checkpoint first. A shard a checkpoint closed is uploaded by a background thread after
    the checkpoint, so a test that wants an object in the store waits for that too."""
    import signal

    wait_for(lambda: checkpointed(state) > above, 90, f"a checkpoint past {above} samples in {state}")
    if upload:
        wait_for(lambda: uploaded(state) > 0, 90, f"an upload recorded beside {state}")
    os.kill(os.getpid(), signal.SIGKILL)


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file directly in ``root`` (LMDB's lock table aside)."""
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.name != "lock.mdb"}


def content(root: Path) -> list[tuple[int, bytes]]:
    """(label, stored bytes) of every sample, through the readers."""
    from readers import open_dataset

    ds = open_dataset(root, decode=False)
    try:
        if ds.format == "wds":
            return [(int(ds.labels[i]), ds.read(i)) for i in range(len(ds.labels))]
        return [(int(ds.labels[i]), bytes(np.asarray(ds.read(i)).tobytes() if ds.format == "mmap" else ds.read(i)))
                for i in range(len(ds))]
    finally:
        ds.close()


#: Run as ``python -c HOLD_LOCK SRC_FOLDER``: a second process holding the folder's output lock the way
#: a running pack does (``packer.output.OutputLock``); prints ``held`` once it has it.
HOLD_LOCK = """
import sys, time
from pathlib import Path
from packer.output import OutputLock
with OutputLock() as lock:
    lock.acquire(Path(sys.argv[1]))
    print("held", flush=True)
    time.sleep(120)
"""


def interrupt_after(images: int):
    """A ``progress`` for ``pack`` that stops it like Ctrl-C once ``images`` source files are done."""
    def factory(split, source):
        seen = {"n": 0}

        def update(done: int, nbytes: int) -> None:
            seen["n"] += done
            if seen["n"] >= images:
                raise KeyboardInterrupt

        return update

    return factory
