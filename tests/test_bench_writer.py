"""benchmarks/bench_writer.py --quick (issue 34's writer benchmark) runs end to end: a row per job, every
output read back whole, the ratios numbers > 0, the goal line; the JSON says the same. The figures
themselves are not checked (a loaded CI machine moves them)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dataset_bench.writerbench import FORMATS, PEERS, make_samples

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_writer.py"
OURS = [f"Writer {fmt}{check}" for fmt in FORMATS for check in ("", " validate=False")]
OURS += [f"pack_map wds workers={w}{check}" for w in (0, 2) for check in ("", " validate=False")]


@pytest.mark.slow  # subprocess
def test_bench_writer_quick(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out), "--tmp", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("job ")):]
    rows = {}
    for line in table[1:]:
        m = re.match(r"(\S.*?)\s{2,}(\S.*)$", line)
        if m and not line.startswith("goal "):
            rows[m.group(1)] = m.group(2)
    names = OURS + [label for _, label in PEERS.values()]
    assert sorted(rows) == sorted(names), table
    for name in names:
        cells = rows[name].split()
        if cells[0] == "skipped:":  # an optional peer: named, with its package
            assert not name.startswith("webdataset"), rows[name]  # webdataset is in the project's venv
            assert re.fullmatch(r"skipped: (\S+ not installed|\S+: .+)", rows[name]), rows[name]
            continue
        rate, ratio, count, check = cells
        assert float(rate.replace(",", "")) > 0, rows[name]
        assert ratio.endswith("x") and float(ratio[:-1]) > 0, rows[name]
        assert (count, check) == ("48", "ok"), rows[name]
    assert re.fullmatch(r"goal 1x \(Writer validate=False >= fastest peer writer, .+\): (holds|does not hold) "
                        r"\(wds [\d.]+x, lmdb [\d.]+x, hdf5 [\d.]+x\)", table[-1]), table[-1]

    data = json.loads(out.read_text())
    assert data["settings"]["samples"] == 48 and data["settings"]["isolated"] is False
    measured = [row for row in data["rows"] if not row["skipped"]]
    assert {row["job"] for row in measured} >= set(OURS) | {"webdataset ShardWriter"}
    assert all(row["read_back"] == 48 and row["check"] == "ok" and row["ratio"] > 0 for row in measured)
    fastest = max((row for row in measured if row["kind"] == "peer"), key=lambda row: row["samples_per_s"])
    assert fastest["ratio"] == 1.0 and data["goal"]["fastest_peer"] == fastest["job"]
    assert set(data["goal"]["ratios"]) == {"wds", "lmdb", "hdf5"}
    assert data["goal"]["holds"] == all(v >= 1.0 for v in data["goal"]["ratios"].values())
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the samples' source and the outputs are removed


def test_samples_are_the_same_realistic_jpegs_each_time(tmp_path):
    """The samples every job writes: JPEGs at the three sizes, labels 0-9, captions of 4-12 words; the
    same seed gives the same bytes."""
    from PIL import Image

    a, b = make_samples(6, seed=3, work=tmp_path), make_samples(6, seed=3, work=tmp_path)
    assert a == b and make_samples(6, seed=4, work=tmp_path) != a
    widths = []
    for i, s in enumerate(a):
        assert s["label"] == i % 10 and 4 <= len(s["caption"].split()) <= 12
        with Image.open(io.BytesIO(s["image"])) as im:
            assert im.format == "JPEG"
            widths.append(im.width)
    assert widths[0] < widths[1] < widths[2] and widths[3] < widths[4] < widths[5]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="n must be >= 1"):
        make_samples(0)
