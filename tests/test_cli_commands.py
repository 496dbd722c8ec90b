"""``pack-dataset`` subcommands (pack, convert, verify, info), the no-subcommand short form,
missing output parents, and ``pack-dataset info`` on complete, interrupted and split datasets."""

from __future__ import annotations

import errno
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_image_folder
from reference import imagefolder_reference
from packer import PackError, PackOptions, pack
from readers.contract import spec

CLI = [sys.executable, "-m", "packer.cli"]
pytestmark = pytest.mark.slow  # the CLI runs in a subprocess (tests/conftest.py's slow rule)


def run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=cwd)


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def src(tmp_path) -> Path:
    return make_image_folder(tmp_path / "train", classes=3, per_class=4)


def test_help_lists_every_command():
    r = run("--help")
    assert r.returncode == 0
    for command in ("pack", "convert", "verify", "info"):
        assert f"\n    {command} " in r.stdout, command
    assert "pack-dataset SRC -f FORMAT" in r.stdout  # the short form is explained
    for command in ("pack", "convert", "verify", "info"):
        sub = run(command, "--help")
        assert sub.returncode == 0 and f"usage: pack-dataset {command}" in sub.stdout, command


def test_no_arguments_is_a_usage_error():
    r = run()
    assert r.returncode == 2 and "COMMAND" in r.stderr and "Traceback" not in r.stderr


def test_pack_subcommand_equals_the_short_form(src, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(src, "-f", "wds", "-o", a, "-q", "--shard-count", "5").returncode == 0
    r = run("pack", src, "-f", "wds", "-o", b, "-q", "--shard-count", "5")
    assert r.returncode == 0, r.stderr
    fa, fb = files_of(a), files_of(b)
    assert fa.keys() == fb.keys()
    assert all(fa[k] == fb[k] for k in fa if k != "index.json")
    ia, ib = json.loads(fa["index.json"]), json.loads(fb["index.json"])
    assert ia == ib  # the same sources, options and outputs: the same index


def test_subcommands_keep_exit_codes(src, tmp_path):
    (src / "class_01" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    assert run("pack", src, "-f", "lmdb", "-o", tmp_path / "o", "-q").returncode == 3
    assert run("pack", tmp_path / "nope", "-f", "lmdb", "-o", tmp_path / "p").returncode == 2
    assert run("pack", src, "-f", "lmdb", "-o", tmp_path / "q", "-q", "--strict").returncode == 1
    assert run("verify", tmp_path / "o", "-q").returncode == 0
    assert run("info", tmp_path / "nope").returncode == 2


def test_missing_output_parents_are_created(src, tmp_path):
    out = tmp_path / "out" / "deeper" / "train-wds"
    r = run(src, "-f", "wds", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert (out / spec.INDEX_NAME).is_file()
    out2 = tmp_path / "api" / "nested" / "train-lmdb"
    pack(src, out2, PackOptions(format="lmdb", workers=1))
    assert (out2 / spec.INDEX_NAME).is_file()


def test_nothing_is_created_when_the_source_is_missing(tmp_path):
    r = run(tmp_path / "nope", "-f", "wds", "-o", tmp_path / "out" / "x")
    assert r.returncode == 2 and not (tmp_path / "out").exists()


def test_a_parent_that_is_a_file_is_a_usage_error(src, tmp_path):
    (tmp_path / "afile").write_text("x")
    r = run(src, "-f", "wds", "-o", tmp_path / "afile" / "out", "-q")
    assert r.returncode == 2 and "parent folder" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------- info
def test_info_on_a_complete_dataset(real_images, tmp_path):
    out = tmp_path / "wds"
    assert run(real_images, "-f", "wds", "-o", out, "-q", "--shard-count", "8").returncode == 0
    r = run("info", out, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    meta = json.loads((out / spec.INDEX_NAME).read_text())
    assert d["state"] == "complete" and d["format"] == "wds" and d["samples"] == meta["num_samples"]
    classes, samples = imagefolder_reference(real_images)
    assert [(c["label"], c["name"]) for c in d["classes"]] == list(enumerate(classes))
    assert [c["samples"] for c in d["classes"]] == [sum(lab == i for _, lab in samples) for i in range(len(classes))]
    assert d["bytes_on_disk"] == sum(p.stat().st_size for p in out.iterdir())
    assert d["spec_version"] == spec.SPEC_VERSION and d["checksum"] == "crc32"
    assert d["rejected"] == 0 and d["repaired"] == 0 and d["reencoded"] == meta["stats"]["reencoded"]
    assert d["options"]["shard_count"] == 8 and d["shards"] == len(meta["shards"])
    text = run("info", out)
    assert text.returncode == 0
    for needle in ("state        complete", "format       wds", f"samples      {meta['num_samples']}",
                   "objects_scenes", "crc32", "shard_count=8", "order"):
        assert needle in text.stdout, needle


def test_info_shows_an_order_record_when_present(src, tmp_path):
    out = tmp_path / "o"
    pack(src, out, PackOptions(format="hdf5", workers=1))
    meta = json.loads((out / spec.INDEX_NAME).read_text())
    meta["order"] = {"kind": "shuffled", "seed": 7}
    (out / spec.INDEX_NAME).write_text(json.dumps(meta))
    r = run("info", out)
    assert "order        shuffled (seed 7)" in r.stdout
    assert json.loads(run("info", out, "--json").stdout)["order"] == {"kind": "shuffled", "seed": 7}


def _interrupted(src: Path, out: Path, fmt: str, after: int, **options) -> None:
    """Pack ``src`` into ``out`` with a prepare stage that fails with an I/O error after ``after`` images."""
    from packer.api import WRITERS, plan
    from packer.pipeline import pack_split
    from packer.prepare.workers import prepare

    opts = PackOptions(format=fmt, workers=1, **options)
    [(split, source, dest)] = plan(src, out, opts)

    def failing(source, start, image_opts, workers):
        for k, outcome in enumerate(prepare(source, start, image_opts, workers)):
            if k == after:
                raise OSError(errno.EIO, "simulated read error")
            yield outcome

    with pytest.raises(PackError):
        pack_split(source, dest, split, opts, WRITERS[fmt], 1, prepare=failing)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_info_on_an_interrupted_pack_says_how_to_resume(src, tmp_path, fmt):
    out = tmp_path / "out dir" / "train"  # a space: the command must be quoted
    (out.parent).mkdir()
    _interrupted(src, out, fmt, after=7, shard_count=3, max_side=64, checkpoint_bytes=1)
    r = run("info", out, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["state"] == "incomplete" and d["format"] == fmt and d["source_images"] == 12
    assert 0 < d["source_done"] <= 7 and d["samples"] == d["source_done"]
    words = shlex.split(d["resume"])
    assert words[:2] == ["pack-dataset", str(src.resolve())] and "--resume" in words
    assert words[words.index("-o") + 1] == str(out)
    assert words[words.index("--max-side") + 1] == "64" and words[words.index("--shard-count") + 1] == "3"
    text = run("info", out).stdout
    assert "state        incomplete" in text and "resume with  " + d["resume"] in text
    # the printed command finishes the pack
    done = subprocess.run(CLI + words[1:] + ["-q"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    d2 = json.loads(run("info", out, "--json").stdout)
    assert d2["state"] == "complete" and d2["samples"] == 12
    ref = tmp_path / "ref"
    pack(src, ref, PackOptions(format=fmt, workers=1, shard_count=3, max_side=64, checkpoint_bytes=1))
    assert spec.read_index(ref).arrays["checksums"].tolist() == spec.read_index(out).arrays["checksums"].tolist()


def test_info_on_a_folder_of_splits(tmp_path):
    make_image_folder(tmp_path / "src" / "train", classes=2, per_class=3)
    make_image_folder(tmp_path / "src" / "val", classes=2, per_class=1)
    out = tmp_path / "out"
    pack(tmp_path / "src", out, PackOptions(format="wds", workers=1))
    d = json.loads(run("info", out, "--json").stdout)
    assert d["state"] == "complete" and [s["split"] for s in d["splits"]] == ["train", "val"]
    assert [s["samples"] for s in d["splits"]] == [6, 2]
    assert "2 splits" in run("info", out).stdout


def test_info_on_something_else(tmp_path):
    (tmp_path / "x").mkdir()
    r = run("info", tmp_path / "x")
    assert r.returncode == 2 and "not a packed dataset" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------- locations and exit codes
@pytest.mark.parametrize("scheme", ["oci", "wasb"])
def test_pack_to_an_unsupported_scheme_is_a_usage_error_and_writes_nothing(src, tmp_path, scheme):
    work = tmp_path / "cwd"
    work.mkdir()
    r = run(src, "-f", "wds", "-o", f"{scheme}://b/x", "-q", cwd=work)
    assert r.returncode == 2, r.stderr
    error, hint = r.stderr.strip().splitlines()  # the one useful line and where to look next
    assert f"{scheme}://b/x: the {scheme}:// scheme is not supported" in error
    assert "s3://" in error and "file://" in error and "Traceback" not in r.stderr
    assert hint == "try 'pack-dataset pack --help'"
    assert list(work.iterdir()) == [], "nothing may be written (it used to write ./gs:/b/x/ before gs:// was served)"


def test_pack_to_a_file_url_writes_that_absolute_folder(src, tmp_path):
    work, out = tmp_path / "cwd", tmp_path / "out" / "wds"
    work.mkdir()
    r = run(src, "-f", "wds", "-o", f"file://{out}", "-q", cwd=work)
    assert r.returncode == 0, r.stderr
    assert spec.read_index(out).num_samples == 12
    assert list(work.iterdir()) == [], "it used to write ./file:/abs/path"
    assert run("verify", f"file://{out}", "-q").returncode == 0
    assert json.loads(run("info", f"file://{out}", "--json").stdout)["samples"] == 12


@pytest.mark.parametrize("command,url", [("verify", "oci://b/x"), ("info", "wasb://c/x"), ("verify", "hf://d/x"),
                                         ("info", "hf://d/x"), ("convert", "oci://b/x"), ("pack", "oci://b/src")])
def test_reading_an_unsupported_scheme_is_a_usage_error(command, url, tmp_path):
    args = [command, url] + (["-f", "lmdb", "-o", tmp_path / "o"] if command in ("convert", "pack") else [])
    r = run(*args, cwd=tmp_path)
    scheme = url.split("://")[0]
    assert r.returncode == 2, r.stderr
    assert f"the {scheme}:// scheme is not supported" in r.stderr and "no such dataset folder" not in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_verify_of_a_missing_path_is_exit_2_like_info_convert_and_pack(tmp_path):
    missing = tmp_path / "nothing-here"
    codes = {
        "verify": run("verify", missing),
        "info": run("info", missing),
        "convert": run("convert", missing, "-f", "lmdb", "-o", tmp_path / "o"),
        "pack": run("pack", missing, "-f", "lmdb", "-o", tmp_path / "p"),
    }
    assert {k: r.returncode for k, r in codes.items()} == dict.fromkeys(codes, 2), {k: r.stderr for k, r in codes.items()}
    assert f"{missing}: no such dataset folder" in codes["verify"].stderr
    assert all("Traceback" not in r.stderr for r in codes.values())
