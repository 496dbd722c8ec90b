"""names.jsonl: a damaged line is a one-line error naming ``names.jsonl:LINE``, ``verify`` checks
the file; ``info`` on an index with millions of classes holds no more than the index does."""

from __future__ import annotations

import gc
import json
import shutil
import tracemalloc
from pathlib import Path

import pytest

from packer.tools import info
from packer.tools.verify import verify
from readers.contract import spec
from reliability_helpers import verify_here


def _copy(packed_generated, tmp_path, fmt: str = "lmdb") -> Path:
    root = tmp_path / fmt
    shutil.copytree(packed_generated[fmt], root)
    return root


def _damage(root: Path, line: int, text: str | None) -> None:
    """Replace names.jsonl's line ``line`` (1-based) by ``text``, or drop it (None)."""
    path = root / spec.NAMES_FILE
    lines = path.read_text().splitlines()
    lines[line - 1:line] = [] if text is None else [text]
    path.write_text("".join(x + "\n" for x in lines))


@pytest.mark.parametrize("text, message", [
    ("not json", r"names.jsonl:3: not a JSON string \(Expecting value: line 1 column 1 \(char 0\)\); "),
    ("17", r"names.jsonl:3: not a JSON string \(a JSON int\)"),
    ("[" * 100_000, r"names.jsonl:3: not a JSON string \("),
    (None, r"names.jsonl: 27 lines for the 28 samples of the index"),
], ids=["not-json", "not-a-string", "deep", "short"])
def test_a_damaged_names_line_is_one_line_naming_file_and_line(packed_generated, tmp_path, text, message):
    root = _copy(packed_generated, tmp_path)
    _damage(root, 3, text)
    index = spec.read_index(root)
    with pytest.raises(spec.DatasetFormatError, match=message) as err:
        list(index.names())
    assert "\n" not in str(err.value) and str(err.value).startswith(str(root / spec.NAMES_FILE))
    report = verify(root)
    assert [p.where for p in report.problems] == [str(root / spec.NAMES_FILE) + (":3" if text else "")]
    assert report.problems[0].what in str(err.value)


def test_a_names_file_longer_than_the_index_is_damage(packed_generated, tmp_path):
    root = _copy(packed_generated, tmp_path, "wds")
    with open(root / spec.NAMES_FILE, "a") as f:
        f.write(json.dumps("extra/one.jpg") + "\n")
    report = verify(root)
    assert len(report.problems) == 1 and report.problems[0].where == f"{root / spec.NAMES_FILE}:29"
    assert "more lines than the 28 samples" in report.problems[0].what


def test_verify_cli_reports_a_damaged_names_file(packed_generated, tmp_path):
    root = _copy(packed_generated, tmp_path, "hdf5")
    _damage(root, 5, "{oops")
    run = verify_here(root)  # the CLI's entry point, in this process
    assert run.returncode == 1, run.stdout + run.stderr
    damaged = [line for line in run.stdout.splitlines() if line.startswith("DAMAGED")]
    assert damaged == [f"DAMAGED {root / spec.NAMES_FILE}:5: not a JSON string (Expecting property name enclosed "
                       "in double quotes: line 1 column 2 (char 1)); the names file is damaged"], run.stdout
    assert "Traceback" not in run.stderr


# ---------------------------------------------------------------------------- info on huge class lists
def _many_classes(src: Path, root: Path, classes: int) -> Path:
    """A copy of the dataset whose index.json lists ``classes`` classes (the first ones real)."""
    shutil.copytree(src, root)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    extra = classes - len(meta["classes"])
    meta["classes"] += [f"c{i}" for i in range(extra)]
    meta["class_counts"] += [0] * extra
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))
    return root


class _Sink:
    def write(self, text: str) -> None:
        pass


def _info_peak(root: Path, as_json: bool) -> tuple[int, int]:
    """(peak bytes reading the index, peak bytes of info: describe, then the text or the --json output)."""
    gc.collect()
    tracemalloc.start()
    try:
        spec.read_index(root)
        gc.collect()
        _, baseline = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        d = info.describe(root)
        if as_json:
            info.write_json(d, _Sink())
        else:
            text = info.render(d)
            assert text.count("\n    ") <= 32 and "more (--json lists every class)" in text
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return baseline, peak


@pytest.mark.slow  # ~5 s: tracemalloc slows reading a 4 MB index.json
@pytest.mark.parametrize("as_json, sizes", [(False, (100_000, 400_000)), (True, (10_000, 40_000))],
                         ids=["text", "json"])
def test_info_memory_beyond_the_index_does_not_grow_with_the_classes(packed_generated, tmp_path, as_json, sizes):
    """info's peak, less what reading index.json itself takes, at two class counts: the difference
    grows by well under the ~200 bytes a per-class dict would take (12 bytes/class allowed)."""
    src = Path(packed_generated["lmdb"])
    small = _info_peak(_many_classes(src, tmp_path / "small", sizes[0]), as_json)
    large = _info_peak(_many_classes(src, tmp_path / "large", sizes[1]), as_json)
    added = sizes[1] - sizes[0]
    growth = (large[1] - small[1]) - (large[0] - small[0])
    assert growth < 12 * added, (small, large, growth / added)


def test_streamed_json_is_what_json_dumps_writes(packed_generated):
    import io

    for fmt in spec.FORMATS:
        d = info.describe(packed_generated[fmt])
        out = io.StringIO()
        info.write_json(d, out)
        assert out.getvalue() == json.dumps(dict(d, classes=list(d["classes"])), indent=1, sort_keys=True) + "\n"
