"""benchmarks/bench_train.py --quick: every row trains, on the same samples, and the bad order shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from readers.contract.spec import FORMATS

pytest.importorskip("sklearn")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_train.py"
ROWS = ["folder", *FORMATS, "folder, class-sorted"]


@pytest.mark.slow
def test_bench_train_quick(tmp_path):
    out = tmp_path / "train.json"
    r = subprocess.run([sys.executable, "-W", "error", str(SCRIPT), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| row |")) + 2
    table = [line.split("|")[1:-1] for line in lines[start:start + len(ROWS) + 1] if line.startswith("|")]
    assert [cells[0].strip() for cells in table] == ROWS  # every row, nothing else
    for cells in table:
        mean = float(cells[3].split("±")[0])
        assert 0 <= mean <= 100

    data = json.loads(out.read_text())
    summary = {s["row"]: s for s in data["summary"]}
    assert list(summary) == ROWS
    assert data["train_images"] + data["val_images"] == 1797
    for s in summary.values():
        assert 0 <= s["accuracy_min"] <= s["accuracy_mean"] <= s["accuracy_max"] <= 1
        # rows differ only by order: each delivered exactly the folder's training samples
        assert s["samples_per_epoch"] == data["train_images"] and s["same_samples"], s
    assert all(0 <= a <= 1 for run in data["runs"] for a in run["accuracy"])
    assert len(data["runs"]) == len(ROWS)  # --quick: one seed

    base, bad = summary["folder"], summary["folder, class-sorted"]
    # the shuffle-quality metric separates them: near a uniform shuffle vs about one class per batch
    assert base["distinct_ratio"] > 0.9 and all(summary[f]["distinct_ratio"] > 0.9 for f in FORMATS)
    assert bad["distinct_ratio"] < 0.3
    # and so does the model: class-sorted batches leave it predicting the last classes it saw
    assert base["accuracy_mean"] > 0.6
    assert bad["accuracy_mean"] < base["accuracy_mean"] - 0.3
    assert [p.name for p in tmp_path.iterdir()] == ["train.json"]  # nothing else left behind
