"""Loose ends of the refactor (issues 21-23): the Python API reads locations as the CLI does, and
recorded file CRC-32s are read one way (spec.recorded_files)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from packer import PackOptions, pack
from packer.api import plan
from packer.errors import OutputError, SourceError
from readers import open_dataset
from readers.contract import spec

REPO = Path(__file__).resolve().parent.parent


def test_pack_writes_a_file_url_to_its_local_folder(generated, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a stray relative ./file:/... folder would land here
    out = tmp_path / "out" / "train-lmdb"
    pack(f"file://{generated}", f"file://{out}", PackOptions(format="lmdb", workers=1))
    assert (out / spec.INDEX_NAME).is_file()
    assert not (tmp_path / "file:").exists()
    a, b = open_dataset(out), open_dataset(f"file://{out}")
    assert len(a) == len(b) > 0
    a.close(), b.close()


@pytest.mark.parametrize("which", ["src", "out"])
def test_pack_and_plan_refuse_an_unsupported_scheme_as_the_cli_does(generated, tmp_path, monkeypatch, which):
    monkeypatch.chdir(tmp_path)
    src, out = (("oci://bucket/train", tmp_path / "o") if which == "src" else (generated, "oci://bucket/out"))
    error = SourceError if which == "src" else OutputError
    for call in (lambda: pack(src, out, PackOptions(format="lmdb", workers=1)),
                 lambda: plan(src, out, PackOptions(format="lmdb"))):
        with pytest.raises(error, match=r"oci://bucket/\w+: the oci:// scheme is not supported \(served: file://"):
            call()
    assert os.listdir(tmp_path) == []  # nothing written, no folder named oci:


def _reads_files_crc(tree: ast.AST) -> list[int]:
    """Lines that read ``index.json``'s ``files_crc32`` (by the constant or its spelling)."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "FILES_CRC_KEY" and isinstance(n.ctx, ast.Load):
            lines.append(n.lineno)
        elif isinstance(n, ast.Constant) and n.value == "files_crc32":
            lines.append(n.lineno)
    return lines


def test_recorded_file_crcs_are_read_through_spec_recorded_files():
    """Only the contract (spec: recorded_files), the index check (checks) and the writers (pipeline; the
    in-place index of shards, packer/tools/index.py, records its shards' CRC-32s) touch files_crc32;
    every other reader of recorded CRC-32s goes through spec.recorded_files."""
    allowed = {"readers/contract/spec.py", "readers/contract/checks.py", "packer/pipeline.py",
               "packer/tools/index.py"}
    found = {}
    for package in ("packer", "readers"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            lines = _reads_files_crc(ast.parse(path.read_text(encoding="utf-8")))
            if lines and rel not in allowed:
                found[rel] = lines
    assert not found, found
