"""benchmarks/bench_pack.py --quick runs end to end (a smoke test; the figures are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from readers.contract.spec import FORMATS

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_pack.py"


@pytest.mark.slow  # subprocess
def test_bench_pack_quick(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-W", "error", str(SCRIPT), "--quick", "--json", str(out), "--tmp",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("format ")):]
    assert any(line.startswith("raw ") for line in table)
    for fmt in FORMATS:
        rows = [line for line in table if line.split()[0] == fmt]
        assert len(rows) == 4, (fmt, rows)  # workers 1 and 2, validation on and off
    data = json.loads(out.read_text())
    assert {r["format"] for r in data["results"]} == set(FORMATS)
    assert all(r["median_s"] > 0 and r["vs_raw"] > 0 for r in data["results"])
    assert data["raw_copy"]["mb_per_s"] > 0 and data["settings"]["mmap_resize"] == 256
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the temp source and outputs are removed
