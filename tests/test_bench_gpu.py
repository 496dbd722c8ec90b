"""benchmarks/bench_gpu.py: on a machine without CUDA it says so in one line and exits 0;
with CUDA (--batches 10, a short step) it prints every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu.py"


@pytest.mark.slow  # subprocess
def test_bench_gpu_runs_or_says_it_skipped(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-W", "error", str(SCRIPT), "--batches", "10", "--step-ms", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    if not torch.cuda.is_available():
        assert r.stdout.strip() == "no CUDA device: skipped" and not out.exists()
        return
    for what in ("host->device: pinned", "ToCUDA", "prefetched", "GPU utilization"):
        assert what in r.stdout, r.stdout
    data = json.loads(out.read_text())
    assert data["pinned_gb_s"] > 0 and data["pageable_gb_s"] > 0 and data["tocuda_ms_median"] > 0
