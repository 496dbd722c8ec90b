"""benchmarks/bench_readers.py --quick runs end to end (a smoke test; the figures are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from readers.contract.spec import FORMATS

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_readers.py"


@pytest.mark.slow
def test_bench_readers_quick(tmp_path):
    out = tmp_path / "readers.json"
    r = subprocess.run([sys.executable, "-W", "error", str(SCRIPT), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.split()[:2] == ["reader", "mode"]) + 1:]
    rows = {tuple(line.split()[:2]) for line in table}
    expected = {("naive-folder", "decoded")} | {(reader, mode) for reader in ("webdataset",) + FORMATS
                                                for mode in ("bytes", "decoded")}
    assert rows == expected
    data = json.loads(out.read_text())
    # every reader x mode x workers (0 and 2), each a positive rate; the naive baseline has no bytes mode
    assert len(data["results"]) == len(expected) * 2
    assert all(rate > 0 for rate in data["results"].values())
    assert data["machine"]["usable_cpus"] >= 1 and data["images"] == 60
    assert [p.name for p in tmp_path.iterdir()] == ["readers.json"]  # nothing else left behind
