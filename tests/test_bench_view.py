"""benchmarks/bench_view.py --quick (issue 36's view benchmark) runs end to end: a row per dataset, each
with the thumbnails a page holds (the bundled photos: all 31; the pack: 100; the index-only dataset: 100
one-line errors in place, its data file holds 64 images) and the ratio line. The figures themselves
are not checked (a loaded CI machine moves them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_view.py"


@pytest.mark.slow  # subprocesses
def test_bench_view_quick(tmp_path):
    out = tmp_path / "view.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--workdir", str(tmp_path / "work"), "--procs", "1",
                        "--workers", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["dataset"]: row for row in json.loads(out.read_text())}
    assert list(rows) == ["photos (lmdb)", "pack 500 (wds)", "index-only 100,000 (lmdb), first open",
                          "index-only 100,000 (lmdb), again"]
    assert [(row["samples"], row["thumbnails"], row["errors_in_place"]) for row in rows.values()] == [
        (31, 31, 0), (500, 100, 0), (100_000, 0, 100), (100_000, 0, 100)]
    for row in rows.values():
        assert all(row[k] > 0 for k in ("open_s", "overview_s", "grid_first_s", "grid_s", "rss_mb")), row
    assert "open_s / the photos' open_s: " in r.stdout
