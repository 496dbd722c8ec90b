"""benchmarks/bench_writer.py --quick (issue 34's writer benchmark) runs end to end: a row per job, every
output read back whole, the ratios numbers > 0, the goal line; the JSON says the same. The figures
themselves are not checked (a loaded CI machine moves them)."""

from __future__ import annotations

import importlib.metadata
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
        rate, ratio, synced, count, check = cells
        assert float(rate.replace(",", "")) > 0, rows[name]
        assert ratio.endswith("x") and float(ratio[:-1]) > 0, rows[name]
        ours = not any(name == label for _, label in PEERS.values())
        assert synced == "-" if ours else float(synced.replace(",", "")) > 0, rows[name]  # a peer's write + fsync
        assert (count, check) == ("48", "ok"), rows[name]
    assert re.fullmatch(r"goal 1x \(Writer validate=False >= fastest peer writer, .+\): (holds|does not hold) "
                        r"\(wds [\d.]+x, lmdb [\d.]+x, hdf5 [\d.]+x\)", table[-1]), table[-1]

    data = json.loads(out.read_text())
    assert data["settings"]["samples"] == 48 and data["settings"]["isolated"] is False
    measured = [row for row in data["rows"] if not row["skipped"]]
    assert {row["job"] for row in measured} >= set(OURS) | {"webdataset ShardWriter"}
    assert all(row["read_back"] == 48 and row["check"] == "ok" and row["ratio"] > 0 for row in measured)
    assert all(row["samples_per_s_fsynced"] <= row["samples_per_s"] for row in measured if row["kind"] == "peer")
    assert {row["version"] for row in measured if row["peer"] == "shardwriter"} == {importlib.metadata.version("webdataset")}
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


@pytest.mark.slow  # subprocesses
def test_a_peer_runs_in_the_python_named_for_it(tmp_path):
    """--peer-python webdataset=PYTHON: ShardWriter's measurement runs in that interpreter (here a venv
    made off this one, which sees this one's packages through a .pth line, as the docs' peer venvs do)
    and reads back whole; a peer whose python does not exist is one skipped row; a bad option is a
    usage error naming the packages."""
    import venv

    venv.create(tmp_path / "peer", with_pip=False)
    site = next((tmp_path / "peer" / "lib").glob("python3*/site-packages"))
    here = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz-project.pth").write_text("\n".join(here) + "\n")
    python = tmp_path / "peer" / "bin" / "python"
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out), "--tmp", str(tmp_path),
                        "--peer-python", f"webdataset={python}", "--peer-python", f"ffcv={tmp_path / 'none'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["peer"]: row for row in json.loads(out.read_text())["rows"] if row["kind"] == "peer"}
    assert rows["shardwriter"]["python"] == str(python) and rows["shardwriter"]["read_back"] == 48
    assert rows["shardwriter"]["check"] == "ok" and rows["shardwriter"]["samples_per_s"] > 0
    assert rows["ffcv"]["skipped"] == f"skipped: ffcv: {tmp_path / 'none'} is not an executable Python"
    assert f"webdataset {importlib.metadata.version('webdataset')} ({python})" in r.stdout

    bad = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--peer-python", "nope=/usr/bin/python3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "PACKAGE one of webdataset, streaming, litdata, ffcv" in bad.stderr
