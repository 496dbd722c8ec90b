"""benchmarks/bench_convert.py --quick runs end to end and prints the convert rate beside the raw copy
rate of the same run (a smoke test: the figures are not checked); dataset-bench refuses --chart
without matplotlib before measuring anything."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_convert.py"


@pytest.mark.slow  # subprocess
def test_bench_convert_quick(tmp_path):
    out = tmp_path / "convert.json"
    r = subprocess.run([sys.executable, "-W", "error", str(SCRIPT), "--quick", "--mmap", "--json", str(out),
                        "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("conversion ")):]
    assert {line.split()[1] for line in table if line.startswith("raw ")} == {"wds", "lmdb", "hdf5"}
    for pair in ("wds -> lmdb", "wds -> hdf5", "lmdb -> wds", "hdf5 -> wds", "wds -> mmap"):
        assert any(line.startswith(pair) for line in table), pair
    data = json.loads(out.read_text())
    assert all(r["vs_raw"] > 0 and r["samples"] == 48 for r in data["rows"])
    assert set(data["raw"]) == {"wds", "lmdb", "hdf5"}
    assert [p.name for p in tmp_path.iterdir()] == ["convert.json"]  # the data is removed


def test_chart_without_matplotlib_fails_before_measuring(monkeypatch, capsys):
    import dataset_bench.cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured although the chart could not be drawn")

    monkeypatch.setattr(dataset_bench.cli, "run_benchmark", no_measuring)
    assert dataset_bench.cli.main(["--generate", "10", "--chart", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "--chart needs matplotlib" in err and "pip install 'dataset-packer[bench]'" in err
