"""benchmarks/bench_index.py --quick runs end to end and prints its table: indexing in place against
``tar`` reading the same shards (locally and, when SeaweedFS is installed, from S3) and reading the
in-place index against our own wds pack (a smoke test: the figures are not checked, only that each
row is there and the data is removed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_index.py"


@pytest.mark.slow  # subprocess
def test_bench_index_quick(tmp_path):
    out = tmp_path / "index.json"
    r = subprocess.run([sys.executable, "-W", "error", str(SCRIPT), "--quick", "--json", str(out), "--tmp", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tar -xO (local, ceiling)" in r.stdout and "pack-dataset index (local)" in r.stdout
    assert "every field, no decode" in r.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["local"]["vs_ceiling"] > 0 and data["summary"]["read"]["ratio"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]  # the data is removed
