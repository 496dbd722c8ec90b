"""The real ``pack-dataset`` entry point, run in a subprocess: exit codes, the summary line,
and that bad input writes (and deletes) nothing.

Exit codes (packer/cli.py): 0 done; 1 failed; 2 usage error or bad input, nothing written;
3 done but some images were rejected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_image_folder
from readers.contract.spec import FORMATS

pytestmark = pytest.mark.slow  # every test runs the CLI in a subprocess

SUMMARY = re.compile(
    r"^(?P<split>\S+): (?P<images>\d+) samples?(?:, (?P<classes>\d+) class(?:es)?)?, "
    r"(?P<mb_in>[\d.]+) MB in -> (?P<mb_out>[\d.]+) MB out, (?P<seconds>[\d.]+) s \((?P<rate>\d+) img/s\), "
    r"(?P<rejected>\d+) rejected, (?P<reencoded>\d+) re-encoded, (?P<ignored>\d+) non-image files ignored"
    r".* -> (?P<out>.+?)(?: \(rejects listed in .*\))?$"
)


def cli(*args, cwd=None, script: bool = False) -> subprocess.CompletedProcess:
    """Run ``pack-dataset`` (the installed console script) or ``python -m packer.cli``."""
    if script:
        exe = shutil.which("pack-dataset", path=str(Path(sys.executable).parent)) or shutil.which("pack-dataset")
        assert exe, "the pack-dataset console script is not installed"
        cmd = [exe]
    else:
        cmd = [sys.executable, "-m", "packer.cli"]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=120)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its content hash and mtime: 'untouched' means equal snapshots."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            out[p.relative_to(root).as_posix()] = (digest, st.st_size if digest else None, st.st_mtime_ns)
    return out


@pytest.fixture
def src(tmp_path) -> Path:
    return make_image_folder(tmp_path / "train", classes=3, per_class=4)


def source_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg", ".png"))


# ---------------------------------------------------------------- success
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_success_prints_one_summary_line(fmt, src, tmp_path):
    out = tmp_path / f"out-{fmt}"
    r = cli(src, "--format", fmt, "-o", out, "-q", "--workers", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    m = SUMMARY.match(lines[0])
    assert m, lines[0]
    assert m["split"] == "train" and m["images"] == "12" and m["classes"] == "3"
    assert m["rejected"] == "0" and m["reencoded"] == "0" and m["ignored"] == "1"  # class_00/notes.txt
    assert m["mb_in"] == f"{source_bytes(src) / 1e6:.1f}"
    assert float(m["seconds"]) >= 0 and int(m["rate"]) >= 0
    assert m["out"] == str(out)
    meta = json.loads((out / "index.json").read_text())
    assert meta["format"] == fmt and meta["num_samples"] == 12
    assert r.stderr == ""  # -q: no progress bar, and nothing to warn about


def test_console_script_on_the_real_photos(real_images, tmp_path):
    out = tmp_path / "real-wds"
    r = cli(real_images, "-f", "wds", "-o", out, script=True)
    assert r.returncode == 0, r.stderr
    m = SUMMARY.match(r.stdout.strip())
    assert m, r.stdout
    assert (m["split"], m["images"], m["classes"], m["reencoded"], m["ignored"]) == ("real-images", "31", "6", "2", "2")
    assert m["out"] == str(out) and (out / "index.json").is_file()
    assert "pack real-images" in r.stderr  # the progress bar (not -q) goes to stderr, not stdout


def test_default_output_is_beside_the_source(src, tmp_path):
    r = cli(src, "-f", "hdf5", "-q")
    assert r.returncode == 0, r.stderr
    assert SUMMARY.match(r.stdout.strip())["out"] == str(tmp_path / "train-hdf5")
    assert (tmp_path / "train-hdf5" / "data.h5").is_file()


def test_options_reach_the_packer(src, tmp_path):
    out = tmp_path / "out"
    r = cli(src, "-f", "wds", "-o", out, "-q", "--shard-count", "5", "--max-side", "40", "--quality", "80")
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "index.json").read_text())
    assert [s["samples"] for s in meta["shards"]] == [5, 5, 2]
    assert meta["options"]["max_side"] == 40 and meta["options"]["quality"] == 80
    assert meta["stats"]["reencoded"] == 12  # every generated image is wider than 40 px


def test_rejected_images_exit_3(src, tmp_path):
    (src / "class_01" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path / "out"
    r = cli(src, "-f", "lmdb", "-o", out, "-q")
    assert r.returncode == 3, r.stderr
    assert "1 rejected" in r.stdout and "rejects listed in" in r.stdout
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [x["path"] for x in rejects] == ["class_01/broken.jpg"]
    assert json.loads((out / "index.json").read_text())["num_samples"] == 12


# ---------------------------------------------------------------- usage errors: exit 2, nothing written
def test_missing_source(tmp_path):
    before = snapshot(tmp_path)
    r = cli(tmp_path / "nope", "-f", "wds", "-o", tmp_path / "out")
    assert r.returncode == 2
    assert "no such folder" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(tmp_path) == before
    r = cli(tmp_path / "nope", "-f", "wds")  # the default output beside it is not created either
    assert r.returncode == 2 and snapshot(tmp_path) == before


def test_source_without_images(tmp_path):
    (tmp_path / "src" / "cls").mkdir(parents=True)
    (tmp_path / "src" / "cls" / "a.txt").write_text("text")
    before = snapshot(tmp_path)
    r = cli(tmp_path / "src", "-f", "lmdb", "-o", tmp_path / "out")
    assert r.returncode == 2
    assert "no images found" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(tmp_path) == before


def test_unknown_format(src, tmp_path):
    before = snapshot(tmp_path)
    r = cli(src, "-f", "zip", "-o", tmp_path / "out")
    assert r.returncode == 2
    assert "invalid choice: 'zip'" in r.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args, message", [
    (["-f", "wds", "--resize", "64"], "resize applies to the mmap format only"),
    (["-f", "wds", "--overwrite", "--resume"], "not allowed with"),
    (["-f", "wds", "--workers", "0"], "must be >= 1"),
    (["-f", "wds", "--shard-size", "lots"], "not a size"),
], ids=["resize-not-mmap", "overwrite-and-resume", "zero-workers", "bad-size"])
def test_bad_options(src, tmp_path, args, message):
    before = snapshot(tmp_path)
    r = cli(src, *args, "-o", tmp_path / "out")
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- existing output
def test_existing_output_needs_overwrite(src, tmp_path):
    out = tmp_path / "out"
    assert cli(src, "-f", "wds", "-o", out, "-q").returncode == 0
    before = snapshot(tmp_path)
    r = cli(src, "-f", "lmdb", "-o", out, "-q")
    assert r.returncode == 2
    assert "already exists" in r.stderr and "--overwrite" in r.stderr
    assert snapshot(tmp_path) == before


def test_existing_foreign_folder_without_overwrite(src, tmp_path):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "thesis.tex").write_text("important")
    before = snapshot(tmp_path)
    r = cli(src, "-f", "wds", "-o", out)
    assert r.returncode == 2 and snapshot(tmp_path) == before


def test_overwrite_replaces_a_previous_pack(src, tmp_path):
    out = tmp_path / "out"
    assert cli(src, "-f", "wds", "-o", out, "-q").returncode == 0
    r = cli(src, "-f", "lmdb", "-o", out, "-q", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "index.json").read_text())["format"] == "lmdb"
    assert not list(out.glob("*.tar")) and not (out / "shards.npy").exists()  # nothing of the old pack is left


def test_overwrite_replaces_a_previous_split_pack(tmp_path):
    make_image_folder(tmp_path / "src" / "train", classes=2, per_class=2)
    make_image_folder(tmp_path / "src" / "val", classes=2, per_class=1)
    out = tmp_path / "out"
    assert cli(tmp_path / "src", "-f", "hdf5", "-o", out, "-q").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]
    r = cli(tmp_path / "src" / "val", "-f", "wds", "-o", out, "-q", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert not (out / "train").exists() and json.loads((out / "index.json").read_text())["split"] == "val"


def test_overwrite_into_an_empty_folder(src, tmp_path):
    (tmp_path / "empty").mkdir()
    assert cli(src, "-f", "mmap", "-o", tmp_path / "empty", "-q", "--overwrite").returncode == 0
    assert (tmp_path / "empty" / "images.npy").is_file()


def test_overwrite_refuses_to_delete_a_folder_that_is_not_a_dataset(src, tmp_path):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "thesis.tex").write_text("important")
    (out / "data.h5").write_text("not ours")
    before = snapshot(tmp_path)
    r = cli(src, "-f", "hdf5", "-o", out, "--overwrite")
    assert r.returncode == 2
    assert "refusing to delete" in r.stderr
    assert snapshot(tmp_path) == before


def test_overwrite_refuses_a_folder_with_a_foreign_index_json(src, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    (out / "index.json").write_text('{"name": "my-site", "version": "1.0.0"}')
    (out / "precious.html").write_text("<html>")
    before = snapshot(tmp_path)
    r = cli(src, "-f", "wds", "-o", out, "--overwrite")
    assert r.returncode == 2
    assert snapshot(tmp_path) == before


def test_overwrite_never_deletes_the_source(tmp_path):
    data = tmp_path / "data"
    make_image_folder(data / "train", classes=2, per_class=2)
    assert cli(data / "train", "-f", "wds", "-o", data / "train-wds", "-q").returncode == 0
    before = snapshot(data / "train")
    r = cli(data / "train", "-f", "wds", "-o", data, "-q", "--overwrite")
    assert snapshot(data / "train") == before, "the source images were deleted"
    assert r.returncode == 2


def test_output_inside_the_source_is_refused(src, tmp_path):
    before = snapshot(tmp_path)
    for out in (src / "packed", src / "class_00" / "packed", src):
        r = cli(src, "-f", "wds", "-o", out, "--overwrite")
        assert r.returncode != 0
        assert "inside the source folder" in r.stderr and "Traceback" not in r.stderr
        assert snapshot(tmp_path) == before


def test_output_location_errors_are_usage_errors(src, tmp_path):
    r = cli(src, "-f", "wds", "-o", src / "packed")  # missing parent folders are created (test_cli_commands.py)
    assert r.returncode == 2, r.stderr


# ---------------------------------------------------------------- one source of truth for options and errors
def _parser_flags(parser) -> dict[str, str]:
    """long flag -> help text of every option of ``parser`` (except --help)."""
    return {a.option_strings[-1]: a.help for a in parser._actions if a.option_strings and a.dest != "help"}


def test_default_flags_give_the_default_options():
    from packer.cli import build_parser
    from packer.options import PackOptions, cli_fields

    args = build_parser().parse_args(["src", "-f", "mmap"])
    built = PackOptions(**{f.name: getattr(args, f.name) for f, _ in cli_fields()})
    assert built == PackOptions(format="mmap")


def test_every_flag_reaches_its_field():
    """Each option flag, given a non-default value, changes exactly its own PackOptions field."""
    from packer.cli import build_parser
    from packer.options import PackOptions, cli_fields

    values = {"workers": "3", "shard_size": "1GB", "shard_count": "4", "max_side": "7", "quality": "80",
              "resize": "16", "max_pixels": "5", "checkpoint_bytes": "1k",
              "order": "shuffled", "shuffle_seed": "5", "splits": "none", "engine": "ray", "ray_address": "auto",
              "ray_chunk": "8", "image_column": "img", "fields": "caption:text", "images": "val2017"}
    base = vars(build_parser().parse_args(["src", "-f", "mmap"]))
    fields = list(cli_fields())
    # append: set by --append OUT, which names the output too (packer.cli._pack; tests/test_append.py)
    assert {f.name for f, _ in fields} == {f.name for f in dataclasses.fields(PackOptions)} - {"append"}
    for f, flag in fields:
        if f.name == "format":
            continue
        argv = ["src", "-f", "mmap", flag.flags[-1]] + ([values[f.name]] if f.name in values else [])
        got = vars(build_parser().parse_args(argv))
        changed = {k for k in got if got[k] != base[k]}
        assert changed == {f.name}, (flag.flags, changed)


def test_help_and_readme_list_the_same_flags():
    """The README's command-line reference stays true to ``--help`` (flags and their help text)."""
    from packer.cli import build_parser

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    reference = readme.split("## Command-line reference", 1)[1].split("```")[1]
    documented = {m[0]: m[1] for m in re.findall(r"^  (?:-\w, )?(--[\w-]+)\s{2,}(.+)$", reference, re.M)}
    flags = _parser_flags(build_parser())
    assert set(documented) == set(flags)
    for flag, text in flags.items():
        # the README may add a note in parentheses; it never says something else
        assert documented[flag].startswith(text.split(" (")[0]), flag


def test_help_shows_the_dataclass_defaults():
    from packer.cli import build_parser
    from packer.options import PackOptions, format_size

    flags = _parser_flags(build_parser())
    defaults = PackOptions()
    assert f"(default {defaults.quality})" in flags["--quality"]
    assert f"(default {format_size(defaults.shard_size)})" in flags["--shard-size"]
    assert f"(default {format_size(defaults.checkpoint_bytes)})" in flags["--checkpoint-bytes"]


def test_image_options_carry_the_pack_options():
    from packer.prepare.images import ImageOptions
    from packer.options import PackOptions

    opts = PackOptions(format="mmap", validate=False, max_side=99, quality=70, resize=32, max_pixels=1234)
    img = opts.image_options(want_pixels=True)
    for f in dataclasses.fields(ImageOptions):
        if f.name == "want_pixels":
            assert img.want_pixels is True
        elif hasattr(opts, f.name):
            assert getattr(img, f.name) == getattr(opts, f.name), f.name
    # one set of defaults: an ImageOptions made from default PackOptions is the default ImageOptions
    assert PackOptions().image_options(want_pixels=False) == ImageOptions()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 1 << 40))
def test_format_size_reads_back(n):
    from packer.options import format_size, parse_size

    assert parse_size(format_size(n)) == n


def test_each_error_carries_its_exit_code():
    """Usage errors (exit 2) and failures (exit 1) are separate families: no except-order games."""
    import packer
    from packer.cli import EXIT_FAILED, EXIT_USAGE

    for cls in (packer.SourceError, packer.OutputError, packer.OutputExistsError):
        assert issubclass(cls, packer.UsageError) and not issubclass(cls, packer.PackError)
        assert cls("x").exit_code == EXIT_USAGE == 2
    assert not issubclass(packer.PackError, packer.UsageError)
    assert packer.PackError("x").exit_code == EXIT_FAILED == 1
    assert all(issubclass(c, packer.PackerError) for c in (packer.UsageError, packer.PackError))


def test_failure_exit_code_comes_from_the_error(src, tmp_path):
    (src / "class_01" / "broken.jpg").write_bytes(b"not an image at all")
    r = cli(src, "-f", "wds", "-o", tmp_path / "out", "-q", "--strict")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("pack-dataset: failed: rejected ") and "broken.jpg" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
