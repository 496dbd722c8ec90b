"""dataset-bench --fields: the previous release's readers beside this checkout's in one run, plus image+caption rows.

The figures' values are not asserted (timing), only that every row is there with numbers, and that
the old side really ran the exported release.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataset_bench.cli import main
from dataset_bench.fieldsbench import BASELINE_REV, export_readers, write_caption_manifest


def test_export_readers_is_the_previous_release(tmp_path):
    root = export_readers(BASELINE_REV, tmp_path / "old")
    assert (root / "readers" / "__init__.py").is_file()
    assert "fields" not in (root / "readers" / "base.py").read_text()  # the typed fields came after that release
    assert "fields" in (Path(__file__).resolve().parent.parent / "readers" / "formats" / "base.py").read_text()


def test_export_readers_unknown_rev_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="baseline rev 'no-such-rev-0': git archive") as info:
        export_readers("no-such-rev-0", tmp_path / "old")
    assert "\n" not in str(info.value)


def test_baseline_src_without_readers_is_one_line_error(tmp_path, capsys):
    assert main(["--fields", "--quick", "--no-progress", "--baseline-src", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dataset-bench: error: --baseline-src {tmp_path}: no readers/__init__.py there"]


def test_caption_manifest_one_row_per_image(tmp_path):
    (tmp_path / "images" / "c0").mkdir(parents=True)
    for name in ("a.JPEG", "b.jpg", "notes.txt"):
        (tmp_path / "images" / "c0" / name).write_bytes(b"x")
    assert write_caption_manifest(tmp_path / "images", tmp_path / "rows.jsonl") == 2
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["image"] for r in rows] == ["images/c0/a.JPEG", "images/c0/b.jpg"]
    assert all(isinstance(r["caption"], str) and r["caption"] for r in rows)


@pytest.mark.slow  # reader processes, both releases
def test_fields_quick_rows(tmp_path, capsys):
    out = tmp_path / "fields.json"
    assert main(["--fields", "--quick", "--no-progress", "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "image+caption" in text and "new/old" in text
    result = json.loads(out.read_text())
    assert result["baseline"] == BASELINE_REV
    rows = {(r["row"], r["format"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {(row, "wds", mode) for row in ("image+label", "image+caption") for mode in ("raw", "decoded")}
    for mode in ("raw", "decoded"):
        label, caption = rows["image+label", "wds", mode], rows["image+caption", "wds", mode]
        assert label["old"]["median"] > 0 and label["new"]["median"] > 0 and label["ratio"] > 0
        assert isinstance(label["within_noise"], bool)
        assert caption["old"] is None and caption["new"]["median"] > 0 and caption["ratio_to_label"] > 0
    assert result["loads"]
