"""benchmarks/bench_wds_bytes.py --quick (issue 37 item 2: wds bytes against our lmdb) runs end to end:
a measurement per format and worker count, each in a fresh interpreter through ``make_loader``'s
defaults, and the ratio lines; with ``--bounds``, the copy alone and LMDB read by hand too. The figures themselves are not checked (a loaded CI machine moves them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_wds_bytes.py"


@pytest.mark.slow  # subprocesses
def test_bench_wds_bytes_quick(tmp_path):
    out = tmp_path / "wds.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--images", "40", "--seconds", "0.05",
                        "--workdir", str(tmp_path / "work"), "--json", str(out), "--bounds"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    assert sorted((str(x["workers"]), x["format"]) for x in rows) == [
        ("0", "lmdb"), ("0", "wds"), ("2", "lmdb"), ("2", "wds"), ("byhand", "lmdb"), ("copy", "wds")]
    assert all(x["rate"] > 0 and x["samples"] > 0 for x in rows)
    assert {x["loader"] for x in rows if x["workers"] == 2} == {"ThreadLoader"}  # make_loader's pick, recorded
    assert r.stdout.count("wds / lmdb per round") == 2
    # --bounds: the copy alone (its bytes checked against the reader's) and LMDB by hand, with 0 workers
    assert {x["loader"] for x in rows if x["workers"] in ("copy", "byhand")} == {"copy_runs alone", "LMDB by hand"}
    assert "a reader that copies each sample once reaches at most" in r.stdout
