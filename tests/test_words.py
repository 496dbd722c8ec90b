"""What the command line says: --help in sections, a usage error in two lines, options named as typed."""

from __future__ import annotations

import pytest

from packer import cli
from packer.options import OptionError, PackOptions

SECTIONS = ("source:", "output and format:", "images:", "fields:", "existing output and resume:", "remote output:",
            "engine:")


def test_pack_help_lists_its_options_in_sections(capsys):
    with pytest.raises(SystemExit) as done:
        cli.build_parser().parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    at = [text.index("\n" + title + "\n") for title in SECTIONS]
    assert at == sorted(at), "the sections come in their order"
    section = {title: text[a:b] for title, a, b in zip(SECTIONS, at, at[1:] + [len(text)])}
    assert "--max-side" in section["images:"] and "--fields" in section["fields:"]
    assert "--resume" in section["existing output and resume:"] and "--stage-dir" in section["remote output:"]
    assert "--engine" in section["engine:"] and "-f FORMAT, --format FORMAT" in section["output and format:"]
    for kind in ("an image folder", "a manifest", "COCO annotations", "WebDataset shards", "a Hugging Face dataset"):
        assert kind in text  # the description names every source


@pytest.mark.parametrize("argv, message", [
    (["src", "-f", "zip"], "argument -f/--format: invalid choice: 'zip'"),
    (["src", "-f", "wds", "--resize", "5"], "--resize applies to the mmap format only; use --max-side for the others"),
    (["src", "-f", "wds", "--quality", "101"], "--quality must be in 1..100, got 101"),
])
def test_a_usage_error_is_its_line_and_a_hint(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / "src") if a == "src" else a for a in argv]
    (tmp_path / "src").mkdir()
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("pack-dataset: error: ") and message in lines[0]
    assert lines[1] == "try 'pack-dataset pack --help'"


def test_the_python_api_names_options_as_python_does():
    with pytest.raises(OptionError) as exc:
        PackOptions(format="wds", resize=5)
    assert str(exc.value) == "resize applies to the mmap format only; use max_side for the others"
    assert exc.value.cli_message() == "--resize applies to the mmap format only; use --max-side for the others"
