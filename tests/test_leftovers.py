"""No leftovers: after a training process dies (the loop raises, Ctrl-C, SIGKILL of the main process),
no loader worker lives on, nothing of its processes stays in /dev/shm, and its output pipes close
(so ``subprocess.run(..., capture_output=True)`` around the trainer returns)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_helpers import AS_TYPED


pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("train_script.py")
#: The trainer as a typed command starts (reliability_helpers.AS_TYPED: SIGINT and SIGTERM at their defaults,
#: whatever this worker holds), then its script as ``python SCRIPT ARGS`` would run it.
TRAINER = [sys.executable, "-c", AS_TYPED + "import runpy, sys\nsys.argv = sys.argv[1:]\n"
           "runpy.run_path(sys.argv[0], run_name='__main__')\n", str(SCRIPT)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _shm_of(pids: set[int]) -> list[str]:
    """Entries in /dev/shm made by these processes (ours, and torch's file_system strategy's)."""
    if not os.path.isdir("/dev/shm"):
        return []
    out = []
    for name in os.listdir("/dev/shm"):
        parts = name.replace("_", "-").split("-")
        if any(p.isdigit() and int(p) in pids for p in parts) and (name.startswith("dataset-packer-")
                                                                   or name.startswith("torch")):
            out.append(name)
    return out


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass
        assert proc.poll() is None, f"the trainer ended early: {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError("the trainer never reached its first batch")


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
@pytest.mark.parametrize("crash", ["raise", "ctrl-c", "sigkill"])
def test_nothing_outlives_a_crashed_trainer(packed_generated, tmp_path, crash, fmt):
    cmd = [*TRAINER, str(tmp_path), str(packed_generated[fmt]), "--workers", "2", "--batch", "4", "--every", "1000"]
    if crash == "raise":
        t0 = time.monotonic()
        res = subprocess.run(cmd + ["--raise-at", "0"], capture_output=True, text=True, timeout=90)
        assert res.returncode != 0 and "training step failed" in res.stderr
        pids = json.loads((tmp_path / "pids-0.json").read_text())
    else:
        proc = subprocess.Popen(cmd + ["--sleep", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        pids = _wait_for(tmp_path / "pids-0.json", proc)
        t0 = time.monotonic()
        if crash == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the main process only: workers must not survive it
        try:
            proc.communicate(timeout=60)  # returns only once every holder of the pipes is gone
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("the trainer's output pipes stayed open: a loader worker outlived it")
        if crash == "sigkill":
            # the kernel kills the workers with the main process (PR_SET_PDEATHSIG); torch's own
            # watchdog notices only after its 5 s poll, and a worker blocked writing a full pipe never
            assert time.monotonic() - t0 < 3, "the workers outlived the killed main process for seconds"
    workers = set(pids["workers"])
    assert len(workers) == 2
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in workers if _alive(p)], f"workers outlived the main process ({crash})"
    assert _shm_of(workers | {pids["main"]}) == [], "shared memory left in /dev/shm"
    assert time.monotonic() - t0 < 30


def test_die_with_parent_in_a_grandchild(tmp_path):
    """The primitive: a process that asked for it dies when its parent is SIGKILLed."""
    code = (
        "import os, sys, time\n"
        "from readers.contract.env import die_with_parent\n"
        "parent = os.getpid()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    assert die_with_parent(parent)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    time.sleep(0.3)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_die_with_parent_after_the_parent_died_exits(tmp_path):
    """A worker whose parent was SIGKILLed before it asked (it has another parent by then) exits
    at once instead of living on."""
    marker = tmp_path / "survived"
    code = (
        "import multiprocessing, os, sys, time\n"
        "from readers.contract.env import die_with_parent\n"
        "def work(parent, marker):\n"
        "    time.sleep(1.0)\n"
        "    die_with_parent(parent)\n"
        "    open(marker, 'w').close()\n"
        "if __name__ == '__main__':\n"
        "    p = multiprocessing.get_context('fork').Process(target=work, args=(os.getpid(), sys.argv[1]))\n"
        "    p.start()\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(marker)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child) and not marker.exists()


def test_die_with_parent_is_a_no_op_for_a_process_that_is_not_our_child():
    """A forkserver's child: its parent is the forkserver, not the loader's process; nothing is set."""
    from readers.contract.env import die_with_parent

    assert die_with_parent(os.getppid() + 1_000_000) is False
